//! Paths into a config tree, `static_resources.clusters[name=backend].load_assignment`, and the
//! checked walk along them: every failure names the path and what was found instead.

use std::fmt;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

/// One step of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    /// A field of an object.
    Key(String),
    /// An item of a list by position.
    Index(usize),
    /// The one item of a list whose field `key` is the string `value` (`[name=backend]`).
    Named { key: String, value: String },
}

/// A path: `a.b[0].c[name=x]`. Keys may hold any character but `.` and `[`; a bracket holds a
/// position or `field=value` (the value may hold dots: `[name=envoy.filters.http.wasm]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyPath(Vec<Seg>);

impl KeyPath {
    pub fn parse(text: &str) -> Result<KeyPath> {
        let mut segs = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            if let Some(inner) = rest.strip_prefix('[') {
                let end = inner
                    .find(']')
                    .ok_or_else(|| anyhow!("path {text:?}: `[` without `]`"))?;
                let (body, after) = inner.split_at(end);
                segs.push(match body.split_once('=') {
                    Some((key, value)) => Seg::Named {
                        key: key.to_string(),
                        value: value.to_string(),
                    },
                    None => Seg::Index(body.parse().map_err(|_| {
                        anyhow!("path {text:?}: [{body}] is neither a position nor field=value")
                    })?),
                });
                rest = &after[1..];
            } else {
                let end = rest.find(['.', '[']).unwrap_or(rest.len());
                let (key, after) = rest.split_at(end);
                if key.is_empty() {
                    bail!("path {text:?}: empty field name");
                }
                segs.push(Seg::Key(key.to_string()));
                rest = after;
            }
            if let Some(after) = rest.strip_prefix('.') {
                if after.is_empty() || after.starts_with(['.', '[']) {
                    bail!("path {text:?}: empty field name");
                }
                rest = after;
            }
        }
        Ok(KeyPath(segs))
    }

    /// This path followed by `more`.
    pub fn join(&self, more: &KeyPath) -> KeyPath {
        KeyPath(self.0.iter().chain(&more.0).cloned().collect())
    }

    /// All but the last step, and the last; `None` for the empty path.
    pub fn split_last(&self) -> Option<(KeyPath, &Seg)> {
        let (last, parent) = self.0.split_last()?;
        Some((KeyPath(parent.to_vec()), last))
    }

    pub fn segs(&self) -> &[Seg] {
        &self.0
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(root)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
                Seg::Named { key, value } => write!(f, "[{key}={value}]")?,
            }
        }
        Ok(())
    }
}

/// Where one step leads inside its parent.
enum Child<'s> {
    Key(&'s str),
    Index(usize),
}

/// Finds `seg` in `parent`, or says why it is not there.
fn locate<'s>(parent: &Value, seg: &'s Seg) -> Result<Child<'s>, String> {
    match (seg, parent) {
        (Seg::Key(k), Value::Object(map)) if map.contains_key(k) => Ok(Child::Key(k)),
        (Seg::Key(k), Value::Object(map)) => Err(format!(
            "no field `{k}` (fields: {})",
            map.keys().cloned().collect::<Vec<_>>().join(", ")
        )),
        (Seg::Index(i), Value::Array(items)) if *i < items.len() => Ok(Child::Index(*i)),
        (Seg::Index(i), Value::Array(items)) => {
            Err(format!("no item [{i}] in a list of {}", items.len()))
        }
        (Seg::Named { key, value }, Value::Array(items)) => {
            let matching: Vec<usize> = items
                .iter()
                .enumerate()
                .filter(|(_, it)| it.get(key).and_then(Value::as_str) == Some(value))
                .map(|(i, _)| i)
                .collect();
            match matching.as_slice() {
                [one] => Ok(Child::Index(*one)),
                [] => {
                    let have: Vec<&str> = items
                        .iter()
                        .filter_map(|it| it.get(key).and_then(Value::as_str))
                        .collect();
                    Err(format!(
                        "no item with {key} = {value:?} (have: {})",
                        have.join(", ")
                    ))
                }
                many => Err(format!("{} items with {key} = {value:?}", many.len())),
            }
        }
        (_, other) => Err(format!("expected {}, found {}", expected(seg), kind(other))),
    }
}

fn expected(seg: &Seg) -> &'static str {
    match seg {
        Seg::Key(_) => "an object",
        Seg::Index(_) | Seg::Named { .. } => "a list",
    }
}

/// What a value is, for error messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn child<'v>(parent: &'v Value, c: &Child<'_>) -> Option<&'v Value> {
    match c {
        Child::Key(k) => parent.get(k),
        Child::Index(i) => parent.get(i),
    }
}

fn child_mut<'v>(parent: &'v mut Value, c: &Child<'_>) -> Option<&'v mut Value> {
    match c {
        Child::Key(k) => parent.get_mut(k),
        Child::Index(i) => parent.get_mut(i),
    }
}

/// The first step of `path` that fails, with the part of the path that led there.
fn failure(path: &KeyPath, at: usize, why: String) -> (KeyPath, String) {
    (KeyPath(path.0[..=at].to_vec()), why)
}

/// Follows `path` from `root`; on failure, the prefix that failed and why.
pub fn walk<'v>(root: &'v Value, path: &KeyPath) -> Result<&'v Value, (KeyPath, String)> {
    let mut cur = root;
    for (i, seg) in path.0.iter().enumerate() {
        let c = locate(cur, seg).map_err(|why| failure(path, i, why))?;
        cur = child(cur, &c).ok_or_else(|| failure(path, i, "vanished".into()))?;
    }
    Ok(cur)
}

/// [`walk`], for changing what is found.
pub fn walk_mut<'v>(
    root: &'v mut Value,
    path: &KeyPath,
) -> Result<&'v mut Value, (KeyPath, String)> {
    let mut cur = root;
    for (i, seg) in path.0.iter().enumerate() {
        let c = locate(cur, seg).map_err(|why| failure(path, i, why))?;
        cur = child_mut(cur, &c).ok_or_else(|| failure(path, i, "vanished".into()))?;
    }
    Ok(cur)
}

/// Replaces what `last` names inside `parent`; it must exist.
pub fn replace(parent: &mut Value, last: &Seg, value: Value) -> Result<Value, String> {
    let c = locate(parent, last)?;
    let slot = child_mut(parent, &c).ok_or("vanished")?;
    Ok(std::mem::replace(slot, value))
}

/// Adds field `last` to the object `parent`; it must not exist yet.
pub fn insert(parent: &mut Value, last: &Seg, value: Value) -> Result<(), String> {
    let (Seg::Key(k), Value::Object(map)) = (last, &mut *parent) else {
        return Err(format!(
            "can only add a field to an object, found {} and step {last:?}",
            kind(parent)
        ));
    };
    if map.contains_key(k) {
        return Err(format!("field `{k}` exists already (set it instead)"));
    }
    map.insert(k.clone(), value);
    Ok(())
}

/// Takes what `last` names out of `parent`; it must exist.
pub fn remove(parent: &mut Value, last: &Seg) -> Result<Value, String> {
    match (locate(parent, last)?, parent) {
        (Child::Key(k), Value::Object(map)) => map.remove(k).ok_or_else(|| "vanished".into()),
        (Child::Index(i), Value::Array(items)) => Ok(items.remove(i)),
        _ => Err("vanished".into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_and_prints_paths() {
        for text in [
            "a",
            "a.b",
            "a[0].b",
            "a[name=envoy.filters.http.wasm].typed_config",
            "a[1][2]",
            "@type",
        ] {
            assert_eq!(KeyPath::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            KeyPath::parse("x[name=a.b].y").unwrap().segs(),
            &[
                Seg::Key("x".into()),
                Seg::Named {
                    key: "name".into(),
                    value: "a.b".into()
                },
                Seg::Key("y".into())
            ]
        );
        for bad in ["a..b", "a.", ".a", "a[", "a[x]", "a.[0]"] {
            assert!(KeyPath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn walks_by_key_position_and_name_and_says_where_it_stopped() {
        let v = json!({"l": [{"name": "a", "x": 1}, {"name": "b", "x": 2}]});
        let at = |p: &str| walk(&v, &KeyPath::parse(p).unwrap()).cloned();
        assert_eq!(at("l[name=b].x"), Ok(json!(2)));
        assert_eq!(at("l[0].x"), Ok(json!(1)));
        let (where_, why) = at("l[name=c].x").unwrap_err();
        assert_eq!(
            (where_.to_string(), why.as_str()),
            (
                "l[name=c]".to_string(),
                "no item with name = \"c\" (have: a, b)"
            )
        );
        let (where_, why) = at("l.x").unwrap_err();
        assert_eq!(
            (where_.to_string(), why.as_str()),
            ("l.x".to_string(), "expected an object, found a list")
        );
        assert_eq!(at("m").unwrap_err().1, "no field `m` (fields: l)");
    }

    #[test]
    fn replace_insert_and_remove_are_checked() {
        let mut v = json!({"o": {"k": 1}, "l": [{"name": "a"}, {"name": "b"}]});
        assert_eq!(
            replace(&mut v["o"], &Seg::Key("k".into()), json!(2)),
            Ok(json!(1))
        );
        assert!(replace(&mut v["o"], &Seg::Key("nope".into()), json!(2)).is_err());
        assert!(insert(&mut v["o"], &Seg::Key("k".into()), json!(3)).is_err());
        assert_eq!(insert(&mut v["o"], &Seg::Key("n".into()), json!(3)), Ok(()));
        assert_eq!(
            remove(
                &mut v["l"],
                &Seg::Named {
                    key: "name".into(),
                    value: "a".into()
                }
            ),
            Ok(json!({"name": "a"}))
        );
        assert_eq!(v, json!({"o": {"k": 2, "n": 3}, "l": [{"name": "b"}]}));
    }
}
