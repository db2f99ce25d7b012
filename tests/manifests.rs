//! Every Kubernetes manifest shipped (envoy-config/istio/, envoy-config/envoy-gateway/) is valid
//! against the real CRD of its kind and version, with the API server's strict field validation
//! (an undeclared field is an error), checked by the `jsonschema` crate. An unknown kind or
//! version fails.
//!
//! The CRDs are the committed structural extract in tests/crds/ (field names, types, enums,
//! required fields, patterns and bounds of the upstream `openAPIV3Schema`s; no descriptions),
//! written by `cargo run -p ewma-harness --bin crd-extract -- FULL_CRDS_DIR` from the CRDs of
//! istio/istio and envoyproxy/gateway. With `EWMA_LB_FULL_CRDS=DIR` set, a test also checks the
//! extract is what those full CRDs give now.
//!
//! What no schema here checks: the CEL rules (`x-kubernetes-validations`, which only the API
//! server evaluates) and the free-form `EnvoyFilter.spec.configPatches[].patch.value` (a
//! `Struct` to the CRD). tests/istio.rs runs the latter through Envoy instead, as istiod would
//! hand it over.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))]

mod shipped;

use std::path::PathBuf;

use harness::{crds, repo_root};
use serde_json::Value;
use shipped::{manifests, Manifest};

/// A CRD: its group, kind, and each served version's schema.
struct Crd {
    origin: String,
    group: String,
    kind: String,
    versions: Vec<(String, Value)>,
}

/// The kinds the shipped manifests use, each of which must have a CRD in the extract.
const KINDS: [&str; 7] = [
    "WasmPlugin",
    "EnvoyFilter",
    "DestinationRule",
    "VirtualService",
    "EnvoyExtensionPolicy",
    "BackendTrafficPolicy",
    "ClientTrafficPolicy",
];

fn extract_dir() -> PathBuf {
    repo_root().join("tests/crds")
}

/// The committed extract, every file of tests/crds.
fn committed_crds() -> Vec<Crd> {
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
    let missing: Vec<&str> = KINDS
        .iter()
        .copied()
        .filter(|k| !out.iter().any(|c| c.kind == *k))
        .collect();
    assert!(
        missing.is_empty(),
        "{}: no CRD for {missing:?}",
        dir.display()
    );
    out
}

/// The schema as the API server applies it under strict field validation (kubectl's default
/// since Kubernetes 1.27): a field the schema does not declare is an error, except where it
/// preserves unknown fields. JSON Schema leaves undeclared properties open, so each object that
/// declares properties is closed here.
fn strict(schema: &Value) -> Value {
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
fn check(m: &Manifest, crds: &[Crd]) -> Result<Vec<String>, String> {
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

#[test]
fn every_shipped_manifest_is_valid_against_its_crd() {
    let crds = committed_crds();
    let all: Vec<Manifest> = manifests("envoy-config/istio")
        .into_iter()
        .chain(manifests("envoy-config/envoy-gateway"))
        .collect();
    assert!(all.len() >= 12, "found only {} manifests", all.len());
    let problems: Vec<String> = all
        .iter()
        .filter_map(|m| match check(m, &crds) {
            Ok(errors) if errors.is_empty() => None,
            Ok(errors) => Some(format!(
                "{}: {}:\n  {}",
                m.file,
                m.kind(),
                errors.join("\n  ")
            )),
            Err(why) => Some(format!("{}: {why}", m.file)),
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The committed extract is what the full CRDs give, file for file, when they are here.
#[test]
fn the_extract_matches_the_full_crds_when_they_are_here() {
    let Some(full) = std::env::var_os("EWMA_LB_FULL_CRDS") else {
        eprintln!("EWMA_LB_FULL_CRDS not set: the extract's freshness is not checked");
        return;
    };
    let full = PathBuf::from(full);
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&full)
        .unwrap_or_else(|e| panic!("{}: {e}", full.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "{}: no CRD files", full.display());
    let mut expected: Vec<String> = Vec::new();
    for source in &sources {
        let name = crds::extract_name(&source.file_name().unwrap().to_string_lossy());
        let text = std::fs::read_to_string(source).unwrap();
        let want = crds::render(&crds::extract(&source.display().to_string(), &text).unwrap());
        let committed = extract_dir().join(&name);
        let have = std::fs::read_to_string(&committed).unwrap_or_default();
        assert!(
            have == want,
            "{} is stale against {}: run `cargo run -p ewma-harness --bin crd-extract -- {}`",
            committed.display(),
            source.display(),
            full.display()
        );
        expected.push(name);
    }
    let mut committed: Vec<String> = std::fs::read_dir(extract_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    committed.sort();
    expected.sort();
    assert_eq!(
        committed, expected,
        "tests/crds holds extracts without a source, or lacks some"
    );
}

/// The check fails where it should: an unknown kind, an unknown version, and a field the CRD
/// does not have or a value it does not allow.
#[test]
fn the_check_rejects_what_the_crds_reject() {
    let crds = committed_crds();
    let wasm = manifests("envoy-config/istio")
        .into_iter()
        .find(|m| m.kind() == "WasmPlugin")
        .unwrap();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut m = wasm.clone();
        edit(&mut m.doc);
        m
    };
    let bad: Vec<(&str, Manifest)> = vec![
        ("unknown kind", with(&|d| d["kind"] = "WasmPlugins".into())),
        (
            "unknown version",
            with(&|d| d["apiVersion"] = "extensions.istio.io/v1".into()),
        ),
        (
            "unknown field",
            with(&|d| d["spec"]["failStrategyy"] = "FAIL_OPEN".into()),
        ),
        (
            "bad enum",
            with(&|d| d["spec"]["failStrategy"] = "FAIL_SOMETIMES".into()),
        ),
        ("bad sha256", with(&|d| d["spec"]["sha256"] = "abc".into())),
    ];
    for (what, m) in bad {
        if let Ok(errors) = check(&m, &crds) {
            assert!(!errors.is_empty(), "{what}: accepted");
        }
    }
    assert_eq!(check(&wasm, &crds), Ok(Vec::new()));
}
