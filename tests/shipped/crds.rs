//! The shipped manifests checked against the CRDs of their kinds: the committed structural
//! extract in tests/crds/ (see tests/manifests.rs), applied with the API server's strict field
//! validation.

use std::path::PathBuf;

use harness::repo_root;
use serde_json::Value;

use super::Manifest;

/// A CRD: its group, kind, and each served version's schema.
pub struct Crd {
    pub origin: String,
    pub group: String,
    pub kind: String,
    pub versions: Vec<(String, Value)>,
}

pub fn extract_dir() -> PathBuf {
    repo_root().join("tests/crds")
}

/// The committed extract, every file of tests/crds.
pub fn committed_crds() -> Vec<Crd> {
    let dir = extract_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: the CRD extract is missing (crd-extract writes it)",
                dir.display()
            )
        })
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let origin = path.display().to_string();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{origin}: {e}"));
        for crd in doc
            .as_array()
            .unwrap_or_else(|| panic!("{origin}: not a list of CRDs"))
        {
            out.push(Crd {
                origin: origin.clone(),
                group: crd["group"].as_str().unwrap().to_string(),
                kind: crd["kind"].as_str().unwrap().to_string(),
                versions: crd["versions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|v| v["served"] != false)
                    .map(|v| (v["name"].as_str().unwrap().to_string(), v["schema"].clone()))
                    .collect(),
            });
        }
    }
    out
}

/// The schema as the API server applies it under strict field validation (kubectl's default
/// since Kubernetes 1.27): a field the schema does not declare is an error, except where it
/// preserves unknown fields. JSON Schema leaves undeclared properties open, so each object that
/// declares properties is closed here.
pub fn strict(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out: serde_json::Map<String, Value> =
                map.iter().map(|(k, v)| (k.clone(), strict(v))).collect();
            let open = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties") && !map.contains_key("additionalProperties") && !open
            {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(strict).collect()),
        other => other.clone(),
    }
}

/// The schema's complaints about `m`, or why it could not be judged.
pub fn check(m: &Manifest, crds: &[Crd]) -> Result<Vec<String>, String> {
    let api_version = m.doc["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version
        .split_once('/')
        .ok_or_else(|| format!("apiVersion {api_version:?} has no group"))?;
    let crd = crds
        .iter()
        .find(|c| c.kind == m.kind() && c.group == group)
        .ok_or_else(|| format!("no CRD for kind {} in group {group}", m.kind()))?;
    let (_, schema) = crd
        .versions
        .iter()
        .find(|(v, _)| v == version)
        .ok_or_else(|| {
            format!(
                "{} {} has no served version {version} (have {:?})",
                crd.origin,
                crd.kind,
                crd.versions.iter().map(|(v, _)| v).collect::<Vec<_>>()
            )
        })?;
    // Every object has these, whether its CRD's schema lists them (Envoy Gateway's) or not (Istio's).
    let mut schema = schema.clone();
    for (field, kind) in [
        ("apiVersion", "string"),
        ("kind", "string"),
        ("metadata", "object"),
    ] {
        if schema["properties"].get(field).is_none() {
            schema["properties"][field] = serde_json::json!({"type": kind});
        }
    }
    let validator = jsonschema::draft4::new(&strict(&schema)).map_err(|e| {
        format!(
            "{}: the schema of {} does not compile: {e}",
            crd.origin, crd.kind
        )
    })?;
    Ok(validator
        .iter_errors(&m.doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect())
}
