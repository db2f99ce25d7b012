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

use harness::crds;
use serde_json::Value;
use shipped::crds::{check, committed_crds as committed_extract, extract_dir, Crd};
use shipped::{manifests, Manifest};

/// The kinds the shipped manifests use, each of which must have a CRD in the extract.
const KINDS: [&str; 8] = [
    "WasmPlugin",
    "EnvoyFilter",
    "DestinationRule",
    "VirtualService",
    "EnvoyExtensionPolicy",
    "BackendTrafficPolicy",
    "ClientTrafficPolicy",
    "EnvoyProxy",
];

/// The committed extract, which must have a CRD for every kind the manifests use.
fn committed_crds() -> Vec<Crd> {
    let out = committed_extract();
    let missing: Vec<&str> = KINDS
        .iter()
        .copied()
        .filter(|k| !out.iter().any(|c| c.kind == *k))
        .collect();
    assert!(
        missing.is_empty(),
        "{}: no CRD for {missing:?}",
        extract_dir().display()
    );
    out
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
    // Extracts written from a file that is not in that folder: tests/crds/README.md names their
    // source, and only those listed there may be here without one.
    let readme = std::fs::read_to_string(extract_dir().join("README.md")).unwrap_or_default();
    for line in readme.lines() {
        if let Some(name) = line
            .strip_prefix("| `")
            .and_then(|l| l.split_once('`'))
            .map(|(n, _)| n)
            .filter(|n| n.ends_with(".json"))
        {
            assert!(
                !expected.iter().any(|e| e == name),
                "{name} is in tests/crds/README.md as having another source, but {} has one",
                full.display()
            );
            expected.push(name.to_string());
        }
    }
    committed.sort();
    expected.sort();
    assert_eq!(
        committed, expected,
        "tests/crds holds extracts without a source (full CRDs or tests/crds/README.md), or lacks some"
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
