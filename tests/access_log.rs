//! The access log ships the same everywhere: envoy.yaml, the compose config and the Istio provider
//! of docs/istio.md print the same fields with the same Envoy commands, so `ewma-lb-tune` reads
//! all of them. (What Envoy writes with them is checked end to end in tests/e2e_access_log.rs.)

#![allow(
    clippy::panic,
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used
)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeMap;

use harness::config::LISTENER;
use harness::EnvoyConfig;
use serde_json::Value;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `json_format` of the listener's access log in an Envoy config file.
fn json_format(file: &str) -> BTreeMap<String, String> {
    let mut config = EnvoyConfig::load(&root().join(file)).unwrap();
    let manager = config.listener(LISTENER).unwrap().http().unwrap();
    let format = manager
        .get("access_log[0].typed_config.log_format.json_format")
        .unwrap()
        .clone();
    let Value::Object(map) = format else {
        panic!("{file}: json_format is not a map")
    };
    map.into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn compose_logs_what_envoy_yaml_logs() {
    let shipped = json_format("envoy-config/envoy.yaml");
    assert!(
        shipped.get("ewma_lb").map(String::as_str)
            == Some("%FILTER_STATE(wasm.ewma_lb_decision:PLAIN)%"),
        "{shipped:?}"
    );
    assert_eq!(json_format("envoy-config/compose/envoy.yaml"), shipped);
}

#[test]
fn the_istio_provider_of_the_docs_logs_what_envoy_yaml_logs() {
    let doc = std::fs::read_to_string(root().join("docs/istio.md")).unwrap();
    let block = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("envoyFileAccessLog"))
        .expect("docs/istio.md: a yaml block with the envoyFileAccessLog provider");
    let yaml: Value = serde_norway::from_str(block).unwrap();
    let labels =
        &yaml["meshConfig"]["extensionProviders"][0]["envoyFileAccessLog"]["logFormat"]["labels"];
    let labels: BTreeMap<String, String> = labels
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(labels, json_format("envoy-config/envoy.yaml"));
}
