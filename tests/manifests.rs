//! Every Kubernetes manifest shipped (envoy-config/istio/, envoy-config/envoy-gateway/) is valid
//! against the real CRD of its kind and version: the `openAPIV3Schema` of
//! ../shared/crds/ (copied unchanged from istio/istio and envoyproxy/gateway), checked by the
//! `jsonschema` crate, with the API server's strict field validation (an undeclared field is an
//! error). An unknown kind or version fails.
//!
//! Two kinds we ship have no CRD in ../shared/crds: Istio's VirtualService and Envoy Gateway's
//! ClientTrafficPolicy. They are validated against the CRDs in the istio/istio and
//! envoyproxy/gateway snapshots when those are on this machine (under /work/.mirror, where the
//! research fetched them; nothing from them is committed); without them, the test says on its
//! output that it checked only their kind and version.
//!
//! What no schema here checks: the CEL rules (`x-kubernetes-validations`, which only the API
//! server evaluates) and the free-form `EnvoyFilter.spec.configPatches[].patch.value` (a
//! `Struct` to the CRD). tests/istio.rs runs the latter through Envoy instead, as istiod would
//! hand it over.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))]

mod shipped;

use std::path::Path;
use std::process::Command;

use harness::repo_root;
use serde_json::Value;
use shipped::{manifests, yaml_text_docs, Manifest};

/// A CRD: its group, kind, and each served version's schema.
struct Crd {
    origin: String,
    group: String,
    kind: String,
    versions: Vec<(String, Value)>,
}

fn crds_of(origin: &str, text: &str) -> Vec<Crd> {
    yaml_text_docs(origin, text)
        .into_iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| Crd {
            origin: origin.to_string(),
            group: d["spec"]["group"].as_str().unwrap().to_string(),
            kind: d["spec"]["names"]["kind"].as_str().unwrap().to_string(),
            versions: d["spec"]["versions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| v["served"] != false)
                .map(|v| {
                    (
                        v["name"].as_str().unwrap().to_string(),
                        v["schema"]["openAPIV3Schema"].clone(),
                    )
                })
                .collect(),
        })
        .collect()
}

/// ../shared/crds: the project's copies.
fn shared_crds() -> Vec<Crd> {
    let dir = repo_root().join("../shared/crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the CRDs beside the repository)", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .flat_map(|p| {
            crds_of(
                &p.display().to_string(),
                &std::fs::read_to_string(p).unwrap(),
            )
        })
        .collect()
}

/// The kinds ../shared/crds lacks, from a repository snapshot when one is here: `(kind, repo
/// snapshot, path in it)`.
const SNAPSHOT_CRDS: &[(&str, &str, &str)] = &[
    ("VirtualService", "/work/.mirror/istio+istio/repo", "manifests/charts/base/files/crd-all.gen.yaml"),
    (
        "ClientTrafficPolicy",
        "/work/.mirror/envoyproxy+gateway/repo",
        "charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_clienttrafficpolicies.yaml",
    ),
];

/// The group/version each of those kinds exists in (istio/istio crd-all.gen.yaml;
/// envoyproxy/gateway's generated CRD), for the check that remains without a snapshot.
const KNOWN_WITHOUT_SCHEMA: &[(&str, &[&str])] = &[
    (
        "VirtualService",
        &[
            "networking.istio.io/v1",
            "networking.istio.io/v1beta1",
            "networking.istio.io/v1alpha3",
        ],
    ),
    ("ClientTrafficPolicy", &["gateway.envoyproxy.io/v1alpha1"]),
];

fn snapshot_crds(kind: &str) -> Option<Vec<Crd>> {
    let (_, repo, path) = SNAPSHOT_CRDS.iter().find(|(k, ..)| *k == kind)?;
    if !Path::new(repo).exists() {
        return None;
    }
    let out = Command::new("git")
        .args(["--git-dir", repo, "show", &format!("HEAD:{path}")])
        .output()
        .ok()?;
    out.status.success().then(|| {
        crds_of(
            &format!("{repo}:{path}"),
            &String::from_utf8_lossy(&out.stdout),
        )
    })
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
    let shared = shared_crds();
    assert!(
        shared.len() >= 5,
        "expected the five CRDs of ../shared/crds, found {}",
        shared.len()
    );
    let all: Vec<Manifest> = manifests("envoy-config/istio")
        .into_iter()
        .chain(manifests("envoy-config/envoy-gateway"))
        .collect();
    assert!(all.len() >= 12, "found only {} manifests", all.len());
    let mut problems = Vec::new();
    let mut unchecked = Vec::new();
    for m in &all {
        let from_shared = shared.iter().any(|c| c.kind == m.kind());
        let result = if from_shared {
            check(m, &shared)
        } else if let Some(crds) = snapshot_crds(m.kind()) {
            check(m, &crds)
        } else {
            let known = KNOWN_WITHOUT_SCHEMA.iter().find(|(k, _)| *k == m.kind());
            match known {
                Some((_, versions))
                    if versions.contains(&m.doc["apiVersion"].as_str().unwrap_or_default()) =>
                {
                    unchecked.push(format!("{} ({})", m.file, m.kind()));
                    Ok(Vec::new())
                }
                Some(_) => Err(format!("unknown version {}", m.doc["apiVersion"])),
                None => Err(format!("unknown kind {}", m.kind())),
            }
        };
        match result {
            Ok(errors) if errors.is_empty() => {}
            Ok(errors) => problems.push(format!(
                "{}: {}:\n  {}",
                m.file,
                m.kind(),
                errors.join("\n  ")
            )),
            Err(why) => problems.push(format!("{}: {why}", m.file)),
        }
    }
    if !unchecked.is_empty() {
        eprintln!("not validated against a schema (no CRD snapshot on this machine; kind and version checked): {unchecked:?}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check fails where it should: an unknown kind, an unknown version, and a field the CRD
/// does not have or a value it does not allow.
#[test]
fn the_check_rejects_what_the_crds_reject() {
    let shared = shared_crds();
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
        if let Ok(errors) = check(&m, &shared) {
            assert!(!errors.is_empty(), "{what}: accepted");
        }
    }
    assert_eq!(check(&wasm, &shared), Ok(Vec::new()));
}
