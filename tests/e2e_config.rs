//! End to end: Envoy refuses a bad plugin configuration and says which field; every shipped
//! Envoy config passes `envoy --mode validate`.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use harness::{plugin_wasm, repo_root, Envoy, EnvoyConfig, EnvoyOptions};

#[test]
fn an_invalid_configuration_stops_envoy_and_names_the_field() {
    let cases = [
        (r#"{"weights": {"min_share": 0.9}}"#, "weights.min_share: must be in [0, 0.5], got 0.9"),
        (r#"{"smoothing": {"algorithm": "peak_ewma", "tau": 10}}"#, "smoothing.tau: unknown field `tau`, expected one of `algorithm`, `alpha`, `tau_ms`, `peak_samples`, `window`, `beta`, `short_tau_ms`, `long_tau_ms`"),
    ];
    for (plugin_config, message) in cases {
        let mut config = EnvoyConfig::local(0, &plugin_wasm().unwrap()).unwrap();
        config.plugin().unwrap().set_plugin_config(plugin_config).unwrap();
        let (code, log) = Envoy::start_expect_failure(EnvoyOptions::new(config.to_yaml().unwrap())).unwrap_or_else(|e| panic!("{e:#}"));
        assert_ne!(code, 0);
        assert!(log.contains(&format!("ewma-lb: invalid plugin configuration: {message}")), "{plugin_config}: log:\n{log}");
    }
}

/// Every Envoy bootstrap under envoy-config/ (files with `static_resources`), as shipped, with
/// only the plugin path made absolute (the repository root is where they are run from).
#[test]
fn every_shipped_envoy_config_validates() {
    plugin_wasm().unwrap(); // the configs load it
    let mut checked = Vec::new();
    let mut dirs = vec![repo_root().join("envoy-config")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if path.extension().is_some_and(|e| e == "yaml") && text.contains("static_resources:") {
                let mut config = EnvoyConfig::load(&path).unwrap();
                config.resolve_module_paths(&repo_root());
                Envoy::validate(&config.to_yaml().unwrap()).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                checked.push(path);
            }
        }
    }
    assert!(!checked.is_empty(), "no Envoy config found under envoy-config/");
    eprintln!("validated: {checked:?}");
}
