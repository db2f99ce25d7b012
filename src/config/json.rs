//! Reading the operator's JSON into typed fields, with the path of the field in every error.
//!
//! The configuration is parsed once into a `serde_json::Value` and then read field by field:
//! each struct names its fields once (unknown ones are refused, absent ones keep their default)
//! and each leaf type says how it reads a value. This does what serde's derived deserializers
//! wrapped in `serde_path_to_error` did, with the same messages, in a fraction of the module:
//! those instantiate a visitor per type and a path-tracking wrapper around each, and replacing
//! them made the module markedly smaller (bench/README.md, "Module size", has the figures).

use serde_json::Value;

use super::ConfigError;
use crate::map;

/// A value that can be read from JSON at `path`.
pub trait FromJson: Sized {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError>;
}

/// The fields of a JSON object at `path`, checked against the names a struct knows.
pub struct Fields<'a> {
    map: &'a serde_json::Map<String, Value>,
    path: &'a str,
}

impl<'a> Fields<'a> {
    /// The object at `path`, whose known fields are `names` (in their documented order, for the
    /// error that lists them). A field it does not know is an error: a typo must not silently
    /// become a default.
    pub fn of(value: &'a Value, path: &'a str, names: &[&str]) -> Result<Fields<'a>, ConfigError> {
        let Value::Object(map) = value else {
            return Err(invalid_type(path, value, "a JSON object"));
        };
        if let Some(unknown) = map.keys().find(|k| !names.contains(&k.as_str())) {
            return Err(error(
                join(path, unknown),
                format!("unknown field `{unknown}`, expected {}", one_of(names)),
            ));
        }
        Ok(Fields { map, path })
    }

    /// Reads field `name` into `slot` when the object has it; an absent field keeps `slot`.
    pub fn read<T: FromJson>(&self, name: &str, slot: &mut T) -> Result<(), ConfigError> {
        if let Some(value) = self.map.get(name) {
            *slot = T::from_json(value, &join(self.path, name))?;
        }
        Ok(())
    }

    /// Field `name`, if the object has it.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name)
    }

    /// The path of field `name`.
    pub(crate) fn path_of(&self, name: &str) -> String {
        join(self.path, name)
    }
}

/// `parent.child`, or `child` at the top.
pub fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_owned()
    } else {
        format!("{parent}.{child}")
    }
}

/// What serde says was expected: `` `a` ``, `` `a` or `b` ``, `` one of `a`, `b`, `c` ``.
pub(crate) fn one_of(names: &[&str]) -> String {
    match names {
        [] => "nothing".to_owned(),
        [one] => format!("`{one}`"),
        [a, b] => format!("`{a}` or `{b}`"),
        _ => format!("one of {}", ticked(names)),
    }
}

/// `` `a`, `b`, `c` ``: names as a message lists them.
pub(crate) fn ticked(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn error(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    let path = path.into();
    ConfigError {
        field: if path.is_empty() {
            "config".to_owned()
        } else {
            path
        },
        message: message.into(),
    }
}

/// "invalid type: string "two", expected f64", as serde words it.
pub(crate) fn invalid_type(path: &str, value: &Value, expected: &str) -> ConfigError {
    error(
        path,
        format!("invalid type: {}, expected {expected}", describe(value)),
    )
}

/// How serde names an unexpected value.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_f64() => format!("floating point `{n}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {}", quoted(s)),
        Value::Array(_) => "sequence".to_owned(),
        Value::Object(_) => "map".to_owned(),
    }
}

/// `s` between double quotes, with quotes, backslashes and control characters escaped, as a
/// message shows a value the operator wrote.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// === Leaf types ===

impl FromJson for bool {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        value
            .as_bool()
            .ok_or_else(|| invalid_type(path, value, "a boolean"))
    }
}

impl FromJson for String {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| invalid_type(path, value, "a string"))
    }
}

impl FromJson for f64 {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        value
            .as_f64()
            .ok_or_else(|| invalid_type(path, value, "f64"))
    }
}

/// Unsigned integers: a negative or too large one is an invalid value, a fraction an invalid type.
macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl FromJson for $t {
            fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
                let expected = stringify!($t);
                match value {
                    Value::Number(n) if n.is_u64() || n.is_i64() => n
                        .as_u64()
                        .and_then(|v| <$t>::try_from(v).ok())
                        .ok_or_else(|| error(path, format!("invalid value: integer `{n}`, expected {expected}"))),
                    _ => Err(invalid_type(path, value, expected)),
                }
            }
        }
    )*};
}

unsigned!(u32, u64, usize);

/// `null` is absent, as serde reads an `Option`.
impl<T: FromJson> FromJson for Option<T> {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        if value.is_null() {
            Ok(None)
        } else {
            T::from_json(value, path).map(Some)
        }
    }
}

impl<T: FromJson> FromJson for Vec<T> {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        let Value::Array(items) = value else {
            return Err(invalid_type(path, value, "a sequence"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| T::from_json(item, &format!("{path}[{i}]")))
            .collect()
    }
}

impl<T: FromJson> FromJson for map::Map<String, T> {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        let Value::Object(map) = value else {
            return Err(invalid_type(path, value, "a map"));
        };
        map.iter()
            .map(|(k, v)| Ok((k.clone(), T::from_json(v, &join(path, k))?)))
            .collect()
    }
}

/// A string naming one of `variants`, as serde reads a unit enum.
pub fn variant<T: Copy>(
    value: &Value,
    path: &str,
    variants: &[(&str, T)],
) -> Result<T, ConfigError> {
    let Value::String(name) = value else {
        return Err(invalid_type(path, value, "a string"));
    };
    match variants.iter().find(|(n, _)| n == name) {
        Some((_, v)) => Ok(*v),
        None => {
            let names: Vec<&str> = variants.iter().map(|(n, _)| *n).collect();
            Err(error(
                path,
                format!("unknown variant `{name}`, expected {}", one_of(&names)),
            ))
        }
    }
}

/// Implements [`FromJson`] for a struct with `Default` from its named fields: an absent field
/// keeps its default, an unknown one is an error, and the field list is the struct's own
/// (a name that is not a field does not compile).
macro_rules! json_struct {
    ($ty:ty { $($field:ident),* $(,)? }) => {
        impl $crate::config::json::FromJson for $ty {
            fn from_json(
                value: &serde_json::Value,
                path: &str,
            ) -> Result<Self, $crate::config::ConfigError> {
                let names = [$(stringify!($field)),*];
                let fields = $crate::config::json::Fields::of(value, path, &names)?;
                let mut out = <$ty>::default();
                $( fields.read(stringify!($field), &mut out.$field)?; )*
                Ok(out)
            }
        }
    };
}
