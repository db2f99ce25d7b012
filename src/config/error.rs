//! The configuration's one error type, and the bound checks every section shares.

use std::fmt;

/// A configuration error: which field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

pub(crate) fn in_range<T: PartialOrd + Shown>(
    field: &str,
    value: T,
    lo: T,
    hi: T,
) -> Result<T, ConfigError> {
    if value >= lo && value <= hi {
        Ok(value)
    } else {
        Err(out_of_range(field, lo.shown(), hi.shown(), value.shown()))
    }
}

/// Kept out of line: every bound checked would otherwise carry its own copy of the formatting.
#[cold]
#[inline(never)]
fn out_of_range(field: &str, lo: String, hi: String, got: String) -> ConfigError {
    err(field, format!("must be in [{lo}, {hi}], got {got}"))
}

/// A bound or value as an error message shows it: integers as Rust writes them, numbers with a
/// fraction as JSON does (serde_json's float writer, already in the module for the status page:
/// core's own float formatting would bring its whole float printer into the module for these
/// messages alone; bench/README.md, "Module size").
pub(crate) trait Shown {
    fn shown(&self) -> String;
}

macro_rules! shown_as_integer {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

shown_as_integer!(u32, u64, usize);

impl Shown for f64 {
    fn shown(&self) -> String {
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: whole numbers below are exact
        if self.fract() == 0.0 && self.abs() < EXACT {
            (*self as i64).to_string()
        } else {
            serde_json::Number::from_f64(*self).map_or_else(|| "NaN".to_owned(), |n| n.to_string())
        }
    }
}
