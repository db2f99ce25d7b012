//! Placeholder substitution for config templates: `{{NAME}}` is replaced by its value.

use anyhow::{bail, Result};

/// Replaces each `{{KEY}}` with its value; fails if a `{{...}}` placeholder is left, naming it,
/// so a forgotten port never reaches Envoy as literal text.
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String> {
    let mut out = template.to_string();
    for (key, value) in vars {
        out = out.replace(&format!("{{{{{key}}}}}"), value);
    }
    if let Some(start) = out.find("{{") {
        let rest = out.get(start..).unwrap_or_default();
        let end = rest.find("}}").map(|e| e + 2).unwrap_or(rest.len().min(40));
        bail!("template placeholder {} has no value", rest.get(..end).unwrap_or(rest));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_every_occurrence() {
        let out = render("a: {{P}}\nb: {{P}}\nc: {{Q}}", &[("P", "1".into()), ("Q", "x".into())]).unwrap();
        assert_eq!(out, "a: 1\nb: 1\nc: x");
    }

    #[test]
    fn names_a_placeholder_left_without_value() {
        let err = render("port: {{ADMIN_PORT}}", &[("LISTEN_PORT", "1".into())]).unwrap_err();
        assert!(err.to_string().contains("{{ADMIN_PORT}}"), "{err}");
    }
}
