//! End to end: Envoy refuses a bad plugin configuration and says which field; every shipped
//! Envoy config passes `envoy --mode validate` and removes a client's override header with a
//! native filter before the plugin runs.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use std::path::PathBuf;

use ewma_lb::config::Config;
use harness::{plugin_wasm, repo_root, Envoy, EnvoyConfig, EnvoyOptions};
use serde_json::Value;

#[test]
fn an_invalid_configuration_stops_envoy_and_names_the_field() {
    let cases = [
        (r#"{"weights": {"min_share": 0.9}}"#, "weights.min_share: must be in [0, 0.5], got 0.9"),
        (r#"{"smoothing": {"algorithm": "peak_ewma", "tau": 10}}"#, "smoothing.tau: unknown field `tau`, expected one of `algorithm`, `alpha`, `tau_ms`, `peak_samples`, `window`, `beta`, `short_tau_ms`, `long_tau_ms`"),
    ];
    for (plugin_config, message) in cases {
        let mut config = EnvoyConfig::local(0, &plugin_wasm().unwrap()).unwrap();
        config
            .plugin()
            .unwrap()
            .set_plugin_config(plugin_config)
            .unwrap();
        let (code, log) = Envoy::start_expect_failure(EnvoyOptions::new(config.to_yaml().unwrap()))
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_ne!(code, 0);
        assert!(
            log.contains(&format!("ewma-lb: invalid plugin configuration: {message}")),
            "{plugin_config}: log:\n{log}"
        );
    }
}

/// Every Envoy bootstrap under envoy-config/ (files with `static_resources`).
fn shipped_bootstraps() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![repo_root().join("envoy-config")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if path.extension().is_some_and(|e| e == "yaml") && text.contains("static_resources:") {
                found.push(path);
            }
        }
    }
    assert!(
        !found.is_empty(),
        "no Envoy config found under envoy-config/"
    );
    found
}

/// Each one as shipped, with only the plugin path made absolute (the repository root is where
/// they are run from).
#[test]
fn every_shipped_envoy_config_validates() {
    plugin_wasm().unwrap(); // the configs load it
    for path in shipped_bootstraps() {
        let mut config = EnvoyConfig::load(&path).unwrap();
        config.resolve_module_paths(&repo_root());
        Envoy::validate(&config.to_yaml().unwrap())
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    }
}

/// Wherever a shipped config runs the plugin, the HTTP filter right before it is the native
/// header_mutation filter removing the plugin's override header (the one its configuration
/// names), so a client's copy never reaches the load balancer even when the plugin does not run.
/// `without_the_plugin_a_forged_header_decides_nothing` (e2e_hostile.rs) shows it working.
#[test]
fn every_shipped_config_strips_the_override_header_before_the_plugin() {
    let mut checked = 0;
    for path in shipped_bootstraps() {
        let config = EnvoyConfig::load(&path).unwrap();
        let mut chains = Vec::new();
        http_filter_chains(config.value(), &mut chains);
        for chain in chains {
            let Some(at) = chain
                .iter()
                .position(|f| f["name"] == "envoy.filters.http.wasm")
            else {
                continue;
            };
            let json = chain[at]["typed_config"]["config"]["configuration"]["value"]
                .as_str()
                .unwrap_or_default();
            let header = Config::from_json(json.as_bytes())
                .unwrap()
                .override_header()
                .to_string();
            let before = at.checked_sub(1).map(|i| &chain[i]).unwrap_or(&Value::Null);
            assert_eq!(
                before["name"],
                "envoy.filters.http.header_mutation",
                "{}: the filter before the plugin",
                path.display()
            );
            let removed: Vec<&str> = before["typed_config"]["mutations"]["request_mutations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["remove"].as_str())
                .collect();
            assert!(
                removed.contains(&header.as_str()),
                "{}: header_mutation removes {removed:?}, not {header}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no shipped config runs the plugin");
}

/// Every `http_filters` list in a config.
fn http_filter_chains(v: &Value, out: &mut Vec<Vec<Value>>) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(filters)) = map.get("http_filters") {
                out.push(filters.clone());
            }
            map.values().for_each(|c| http_filter_chains(c, out));
        }
        Value::Array(items) => items.iter().for_each(|c| http_filter_chains(c, out)),
        _ => {}
    }
}

/// What docs/troubleshooting.md tells users: `envoy --mode validate` is a dry run of the plugin
/// configuration (it loads the module and stops with the plugin's reason), and envoy.yaml's
/// relative module path is resolved against Envoy's working directory, not the config's.
#[test]
fn the_dry_run_names_the_plugins_reason_and_the_module_path_follows_the_working_directory() {
    plugin_wasm().unwrap(); // envoy.yaml loads it
    let bin =
        harness::envoy::envoy_binary().unwrap_or_else(|| panic!("no envoy binary: see test.sh"));
    let dir = tempfile::tempdir().unwrap();
    let validate = |config: &std::path::Path, cwd: &std::path::Path| {
        let out = std::process::Command::new(&bin)
            .args(["--mode", "validate", "-c"])
            .arg(config)
            .current_dir(cwd)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let shipped = repo_root().join("envoy-config/envoy.yaml");
    let (ok, log) = validate(&shipped, &repo_root());
    assert!(ok && log.contains("OK"), "from the repository root:\n{log}");
    let (ok, log) = validate(&shipped, dir.path());
    assert!(
        !ok,
        "from elsewhere the relative module path must not resolve:\n{log}"
    );
    assert!(log.contains("Invalid path: dist/ewma_lb.wasm"), "{log}");

    let mut bad = EnvoyConfig::shipped().unwrap();
    bad.plugin()
        .unwrap()
        .set_plugin_config(r#"{"weights": {"min_share": 0.9}}"#)
        .unwrap();
    let bad_file = dir.path().join("bad.yaml");
    std::fs::write(&bad_file, bad.to_yaml().unwrap()).unwrap();
    let (ok, log) = validate(&bad_file, &repo_root());
    assert!(
        !ok,
        "the dry run accepted a configuration the plugin refuses:\n{log}"
    );
    assert!(
        log.contains(
            "ewma-lb: invalid plugin configuration: weights.min_share: must be in [0, 0.5], got 0.9"
        ),
        "{log}"
    );
}
