//! A structural extract of Kubernetes CRDs: what a manifest check needs (field names, types,
//! enums, required fields, patterns and bounds), without descriptions, defaults, examples or CEL
//! rules. The extract is committed under tests/crds/, so the manifest tests need nothing beside
//! the repository; `crd-extract` writes it from the full CRDs, and tests/manifests.rs checks it
//! is still what the full CRDs give when they are on the machine (`EWMA_LB_FULL_CRDS`).

use anyhow::{anyhow, Context, Result};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Schema keywords kept, and how to walk what they hold.
enum Keep {
    /// A plain value: type, enum, pattern, bounds, list and map types...
    Value,
    /// A schema.
    Schema,
    /// A map of property names to schemas.
    Properties,
    /// A list of schemas.
    Schemas,
    /// A schema or a boolean.
    SchemaOrBool,
}

fn keep(keyword: &str) -> Option<Keep> {
    Some(match keyword {
        "type"
        | "enum"
        | "required"
        | "format"
        | "pattern"
        | "nullable"
        | "minimum"
        | "maximum"
        | "exclusiveMinimum"
        | "exclusiveMaximum"
        | "multipleOf"
        | "minLength"
        | "maxLength"
        | "minItems"
        | "maxItems"
        | "uniqueItems"
        | "minProperties"
        | "maxProperties"
        | "x-kubernetes-preserve-unknown-fields"
        | "x-kubernetes-int-or-string"
        | "x-kubernetes-embedded-resource"
        | "x-kubernetes-list-type"
        | "x-kubernetes-list-map-keys"
        | "x-kubernetes-map-type" => Keep::Value,
        "items" | "not" => Keep::Schema,
        "properties" | "patternProperties" => Keep::Properties,
        "oneOf" | "anyOf" | "allOf" => Keep::Schemas,
        "additionalProperties" => Keep::SchemaOrBool,
        _ => return None,
    })
}

/// `schema` with only the structural keywords, recursively.
pub fn prune(schema: &Value) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in map {
        let kept = match keep(key) {
            None => continue,
            Some(Keep::Value) => value.clone(),
            Some(Keep::Schema) => prune(value),
            Some(Keep::SchemaOrBool) if value.is_boolean() => value.clone(),
            Some(Keep::SchemaOrBool) => prune(value),
            Some(Keep::Properties) => match value {
                Value::Object(props) => Value::Object(
                    props
                        .iter()
                        .map(|(name, s)| (name.clone(), prune(s)))
                        .collect(),
                ),
                other => other.clone(),
            },
            Some(Keep::Schemas) => match value {
                Value::Array(items) => Value::Array(items.iter().map(prune).collect()),
                other => other.clone(),
            },
        };
        out.insert(key.clone(), kept);
    }
    Value::Object(out)
}

/// The extract of every CustomResourceDefinition in a YAML text: `[{group, kind, versions:
/// [{name, served, schema}]}]`, in the text's order.
pub fn extract(origin: &str, yaml: &str) -> Result<Value> {
    let mut crds = Vec::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let doc = Value::deserialize(doc).with_context(|| format!("{origin}: not YAML"))?;
        if doc["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let spec = &doc["spec"];
        let versions = spec["versions"]
            .as_array()
            .ok_or_else(|| anyhow!("{origin}: a CRD without spec.versions"))?;
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| {
                serde_json::json!({
                    "name": v["name"],
                    "served": v["served"],
                    "schema": prune(&v["schema"]["openAPIV3Schema"]),
                })
            })
            .collect();
        crds.push(serde_json::json!({
            "group": spec["group"],
            "kind": spec["names"]["kind"],
            "versions": versions,
        }));
    }
    if crds.is_empty() {
        return Err(anyhow!("{origin}: no CustomResourceDefinition"));
    }
    Ok(Value::Array(crds))
}

/// The extract's file name for a CRD file: `NAME.yaml` -> `NAME.json`.
pub fn extract_name(yaml_file: &str) -> String {
    format!(
        "{}.json",
        yaml_file.strip_suffix(".yaml").unwrap_or(yaml_file)
    )
}

/// The extract as it is committed: pretty JSON with a trailing newline, so a diff of a CRD
/// update reads field by field.
pub fn render(extract: &Value) -> String {
    let mut text = serde_json::to_string_pretty(extract).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_structure_and_property_names_drops_prose() {
        let schema = serde_json::json!({
            "type": "object",
            "description": "prose",
            "x-kubernetes-validations": [{"rule": "self.a > 0"}],
            "required": ["description"],
            "properties": {
                "description": {"type": "string", "description": "a field named description", "default": "x"},
                "mode": {"type": "string", "enum": ["A", "B"]},
                "list": {"type": "array", "items": {"type": "string", "pattern": "^a", "example": "a"}},
                "any": {"oneOf": [{"required": ["x"]}], "additionalProperties": {"type": "string", "description": "d"}}
            }
        });
        let want = serde_json::json!({
            "type": "object",
            "required": ["description"],
            "properties": {
                "description": {"type": "string"},
                "mode": {"type": "string", "enum": ["A", "B"]},
                "list": {"type": "array", "items": {"type": "string", "pattern": "^a"}},
                "any": {"oneOf": [{"required": ["x"]}], "additionalProperties": {"type": "string"}}
            }
        });
        assert_eq!(prune(&schema), want);
    }
}
