//! Packaging: what ships around the plugin agrees with the plugin.
//!
//! - schema/ewma-lb.schema.json documents exactly the fields `Config` has, with the real defaults,
//!   and rejects what the parser rejects;
//! - every plugin configuration shipped (envoy.yaml, the Istio WasmPlugins, the Envoy Gateway
//!   EnvoyExtensionPolicy) passes both the schema and the plugin's own parser;
//! - the docker-compose stack runs the very envoy.yaml and plugin the end-to-end tests run, on the
//!   Envoy release the tests use, and `docker-compose config` accepts it;
//! - the Grafana dashboard refers to what exists.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

mod shipped;
mod variants;

use ewma_lb::config::{ClusterConfig, Config, PluginConfig};
use ewma_lb::pick::PickAlgorithm;
use ewma_lb::telemetry::Metric;
use harness::repo_root;
use serde_json::{json, Value};
use shipped::{manifests, read, yaml};
use variants::all_smoothers;

fn schema() -> Value {
    serde_json::from_str(&read("schema/ewma-lb.schema.json"))
        .unwrap_or_else(|e| panic!("schema: {e}"))
}

/// The schema's complaints about `instance`; empty when it is valid.
fn schema_errors(instance: &Value) -> Vec<String> {
    let schema = schema();
    let validator = jsonschema::draft202012::new(&schema)
        .unwrap_or_else(|e| panic!("schema does not compile: {e}"));
    validator
        .iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Both judges of a plugin configuration must accept it.
fn assert_accepted(what: &str, config: &Value) {
    let errors = schema_errors(config);
    assert!(
        errors.is_empty(),
        "{what}: the schema rejects {config}: {errors:?}"
    );
    if let Err(e) = Config::from_json(config.to_string().as_bytes()) {
        panic!("{what}: the plugin rejects {config}: {e}");
    }
}

fn default_json() -> Value {
    serde_json::to_value(PluginConfig::default()).unwrap()
}

/// Every pick algorithm, once; the `match` plays the same role as in [`all_smoothers`].
fn all_picks() -> Vec<PickAlgorithm> {
    let all = vec![
        PickAlgorithm::WeightedRandom,
        PickAlgorithm::WeightedP2c,
        PickAlgorithm::LowestLatency,
    ];
    for p in &all {
        match p {
            PickAlgorithm::WeightedRandom
            | PickAlgorithm::WeightedP2c
            | PickAlgorithm::LowestLatency => {}
        }
    }
    all
}

/// Follows a local `$ref` (`#/$defs/NAME`).
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r
                .strip_prefix("#/$defs/")
                .unwrap_or_else(|| panic!("unsupported $ref {r}"));
            let target = &root["$defs"][name];
            assert!(!target.is_null(), "dangling $ref {r}");
            resolve(root, target)
        }
        None => node,
    }
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// Walks `value` (a serialized configuration) and the schema side by side: wherever the schema
/// lists properties, they must be exactly the keys the serializer writes.
fn compare_fields(
    root: &Value,
    node: &Value,
    value: &Value,
    path: &str,
    visited: &mut BTreeSet<String>,
) {
    let node = resolve(root, node);
    if let Some(branches) = node.get("oneOf").and_then(Value::as_array) {
        let algorithm = &value["algorithm"];
        let branch = branches
            .iter()
            .find(|b| b["properties"]["algorithm"]["const"] == *algorithm)
            .unwrap_or_else(|| {
                panic!("{path}: no oneOf branch of the schema for algorithm {algorithm}")
            });
        compare_fields(
            root,
            branch,
            value,
            &format!("{path}[{algorithm}]"),
            visited,
        );
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(props) = node.get("properties") {
                assert_eq!(
                    keys(props),
                    keys(value),
                    "{path}: the schema's properties (left) differ from the configuration's fields (right)"
                );
                assert_eq!(
                    node["additionalProperties"],
                    json!(false),
                    "{path}: must set additionalProperties: false"
                );
                visited.insert(path.to_string());
                for (k, v) in map {
                    let child = &props[k];
                    assert!(
                        child.get("description").is_some()
                            || resolve(root, child).get("description").is_some(),
                        "{path}.{k}: no description"
                    );
                    compare_fields(root, child, v, &format!("{path}.{k}"), visited);
                }
            } else if let Some(each) = node.get("additionalProperties").filter(|a| a.is_object()) {
                for (k, v) in map {
                    compare_fields(root, each, v, &format!("{path}.{k}"), visited);
                }
            } else {
                panic!(
                    "{path}: the configuration has an object here, the schema describes no fields"
                );
            }
        }
        Value::Array(items) => {
            let each = node
                .get("items")
                .unwrap_or_else(|| panic!("{path}: array without items in the schema"));
            for (i, v) in items.iter().enumerate() {
                compare_fields(root, each, v, &format!("{path}[{i}]"), visited);
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// (a) the schema agrees with the parser

#[test]
fn the_schema_is_a_valid_draft_2020_12_schema() {
    let schema = schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(
        jsonschema::draft202012::meta::is_valid(&schema),
        "schema/ewma-lb.schema.json is not a valid 2020-12 schema"
    );
}

#[test]
fn the_schema_documents_exactly_the_fields_of_the_config() {
    let root = schema();
    let mut visited = BTreeSet::new();
    // The defaults, plus what the defaults leave empty: a cluster with endpoints, and every
    // smoothing algorithm with its parameters.
    compare_fields(&root, &root, &default_json(), "config", &mut visited);
    let mut rich = PluginConfig::default();
    rich.clusters.insert(
        "backend".into(),
        ClusterConfig {
            endpoints: vec!["127.0.0.1:8081".into(), "[::1]:8082".into()],
        },
    );
    compare_fields(
        &root,
        &root,
        &serde_json::to_value(&rich).unwrap(),
        "config",
        &mut visited,
    );
    for smoother in all_smoothers() {
        let config = PluginConfig {
            smoothing: smoother,
            ..PluginConfig::default()
        };
        compare_fields(
            &root,
            &root,
            &serde_json::to_value(&config).unwrap(),
            "config",
            &mut visited,
        );
    }
    assert!(
        visited.contains("config.clusters.backend"),
        "the cluster entry was not compared: {visited:?}"
    );

    // The algorithm names: the schema's oneOf constants and pick enum are exactly the parser's.
    let branches: BTreeSet<String> = root["properties"]["smoothing"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            b["properties"]["algorithm"]["const"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let names: BTreeSet<String> = all_smoothers()
        .iter()
        .map(|s| s.name().to_string())
        .collect();
    assert_eq!(
        branches, names,
        "smoothing.oneOf (left) differs from the parser's algorithms (right)"
    );
    let picks: BTreeSet<String> = root["properties"]["pick"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    let parser_picks: BTreeSet<String> = all_picks()
        .iter()
        .map(|p| {
            serde_json::to_value(p)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        picks, parser_picks,
        "pick.enum (left) differs from the parser's pick algorithms (right)"
    );
}

#[test]
fn the_defaults_in_the_schema_are_the_real_defaults() {
    let root = schema();
    let defaults = default_json();
    assert!(
        schema_errors(&defaults).is_empty(),
        "PluginConfig::default() fails the schema: {:?}",
        schema_errors(&defaults)
    );
    for (field, value) in defaults.as_object().unwrap() {
        let node = &root["properties"][field];
        assert_eq!(&node["default"], value, "default of {field}");
        // One level down, for objects described in place (weights, outlier_detection,
        // management); a shared definition ($ref) carries its default where it is used.
        if let (Some(props), Some(obj)) = (node.get("properties"), value.as_object()) {
            for (k, v) in obj {
                let d = &props[k]["default"];
                let d = if d.is_null() {
                    &resolve(&root, &props[k])["default"]
                } else {
                    d
                };
                assert_eq!(d, v, "default of {field}.{k}");
            }
        }
    }
    // Each algorithm's parameter defaults: what the parser fills in when only the name is given.
    for branch in root["properties"]["smoothing"]["oneOf"].as_array().unwrap() {
        let name = branch["properties"]["algorithm"]["const"].clone();
        let config = Config::from_json(
            json!({ "smoothing": { "algorithm": name } })
                .to_string()
                .as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let parsed = serde_json::to_value(config.policy().smoother).unwrap();
        for (param, spec) in branch["properties"].as_object().unwrap() {
            if param != "algorithm" {
                assert_eq!(
                    spec["default"], parsed[param],
                    "default of smoothing {name}.{param}"
                );
            }
        }
    }
}

#[test]
fn invalid_configs_are_rejected_by_both_the_schema_and_the_parser() {
    let invalid = [
        json!([]),
        json!({"unknown_field": 1}),
        json!({"override_header": "X-Ewma-Host"}),
        json!({"override_header": ""}),
        json!({"tick_period_ms": 5}),
        json!({"tick_period_ms": 70_000}),
        json!({"tick_period_ms": 200.5}),
        json!({"refresh_interval_ms": 700_000}),
        json!({"smoothing": {"algorithm": "median"}}),
        json!({"smoothing": {"tau_ms": 100}}),
        json!({"smoothing": {"algorithm": "ewma", "alpha": 0}}),
        json!({"smoothing": {"algorithm": "ewma", "alpha": 1.5}}),
        json!({"smoothing": {"algorithm": "peak_ewma", "alpha": 0.3}}),
        json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 0}}),
        json!({"smoothing": {"algorithm": "decay_ewma", "tau_ms": 600_001}}),
        json!({"smoothing": {"algorithm": "peak_ewma", "peak_samples": 0}}),
        json!({"smoothing": {"algorithm": "decay_ewma", "peak_samples": 4}}),
        json!({"smoothing": {"algorithm": "sma", "window": 65}}),
        json!({"smoothing": {"algorithm": "bias_corrected_ewma", "beta": 1.0}}),
        json!({"smoothing": {"algorithm": "dual_ewma", "short_tau_ms": 0}}),
        json!({"smoothing": {"algorithm": "dual_ewma", "tau_ms": 10}}),
        json!({"weights": {"exponent": 0.05}}),
        json!({"weights": {"min_share": 0.9}}),
        json!({"weights": {"max_step_ratio": 0.5}}),
        json!({"weights": {"noise_band": 0.9}}),
        json!({"weights": {"min_fair_share": 1.5}}),
        json!({"weights": {"noise_gain": 0}}),
        json!({"weights": {"noise_gain": 1.5}}),
        json!({"weights": {"slow_start_ms": 600_001}}),
        json!({"weights": {"slow_start_min_factor": 0}}),
        json!({"weights": {"exponnent": 2}}),
        json!({"failure_penalty_ms": -1}),
        json!({"failure_penalty_ms": 0}),
        json!({"override_header": "authorization"}),
        json!({"override_header": "x-envoy-original-dst-host"}),
        json!({"override_header": "x-forwarded-for"}),
        json!({"status_path": "/"}),
        json!({"grpc_failure_status_codes": ["CANCELLED"]}),
        json!({"grpc_failure_status_codes": ["OK"]}),
        json!({"grpc_failure_status_codes": ["unavailable"]}),
        json!({"grpc_failure_status_codes": [14]}),
        json!({"grpc_failure_status_codes": "UNAVAILABLE"}),
        json!({"pick": "round_robin"}),
        json!({"exploration_share": 0.6}),
        json!({"host_ttl_ms": 86_400_001}),
        json!({"max_hosts_per_cluster": 0}),
        json!({"max_hosts_per_cluster": 20_000}),
        json!({"locality": {"spillover_latency_ratio": 0.9}}),
        json!({"locality": {"zone": "a"}}),
        json!({"outlier_detection": {"consecutive_failures": 10_001}}),
        json!({"outlier_detection": {"base_ejection_ms": 0}}),
        json!({"outlier_detection": {"max_ejection_share": 1.5}}),
        json!({"clusters": {"backend": {"endpoints": ["not-an-address"]}}}),
        json!({"clusters": {"backend": {"endpoints": ["10.0.0.1"]}}}),
        json!({"clusters": {"backend": {"hosts": []}}}),
        json!({"clusters": {"": {"endpoints": []}}}),
        json!({"health_paths": {"exact": ["health"]}}),
        json!({"health_paths": {"regex": ["/health"]}}),
        json!({"management": {"allowed_cidrs": ["example.com"]}}),
        json!({"management": {"paths": {"prefix": ["actuator"]}}}),
        json!({"excluded_paths": {"prefix": ["stream"]}}),
        json!({"status_path": "ewma-lb/status"}),
        json!({"shadow": "yes"}),
    ];
    for config in invalid {
        assert!(
            !schema_errors(&config).is_empty(),
            "the schema accepts {config}"
        );
        assert!(
            Config::from_json(config.to_string().as_bytes()).is_err(),
            "the parser accepts {config}"
        );
    }
    // And some that are fine but not the defaults: both accept them.
    let valid = [
        json!({}),
        json!({"smoothing": {"algorithm": "ewma", "alpha": 1}}),
        json!({"smoothing": {"algorithm": "sma", "window": 64}}),
        json!({"smoothing": {"algorithm": "bias_corrected_ewma"}}),
        json!({"smoothing": {"algorithm": "dual_ewma", "short_tau_ms": 200, "long_tau_ms": 20_000}}),
        json!({"pick": "weighted_p2c", "shadow": true, "exploration_share": 0}),
        json!({"weights": {"exponent": 1, "slow_start_ms": 0}}),
        json!({"weights": {"noise_gain": 1, "noise_band": 1}}),
        json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 2000, "peak_samples": 1}}),
        json!({"clusters": {"outbound|9080||reviews.default.svc.cluster.local": {"endpoints": ["10.1.2.3:9080", "[fd00::1]:9080"]}}}),
        json!({"management": {"allowed_cidrs": ["10.0.0.0/8", "192.168.1.10", "::1"]}}),
        json!({"outlier_detection": {"consecutive_failures": 0}}),
        json!({"grpc_failure_status_codes": []}),
        json!({"grpc_failure_status_codes": ["UNAVAILABLE", "UNIMPLEMENTED"]}),
        json!({"excluded_paths": {"exact": ["/pkg.Service/Watch"], "prefix": ["/pkg.Streams/"]}}),
    ];
    for config in valid {
        assert_accepted("valid table", &config);
    }
}

// ---------------------------------------------------------------------------------------------
// (b) every shipped plugin configuration is valid

/// Every object under `v` whose `@type` is the Envoy wasm HTTP filter.
fn wasm_filters(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(map) => {
            if map.get("@type").and_then(Value::as_str)
                == Some("type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")
            {
                out.push(v.clone());
            }
            map.values().for_each(|c| wasm_filters(c, out));
        }
        Value::Array(items) => items.iter().for_each(|c| wasm_filters(c, out)),
        _ => {}
    }
}

#[test]
fn the_plugin_configuration_in_envoy_yaml_is_valid() {
    let mut filters = Vec::new();
    wasm_filters(&yaml("envoy-config/envoy.yaml"), &mut filters);
    assert!(
        !filters.is_empty(),
        "no wasm filter in envoy-config/envoy.yaml"
    );
    for filter in filters {
        let configuration = &filter["config"]["configuration"];
        assert_eq!(
            configuration["@type"], "type.googleapis.com/google.protobuf.StringValue",
            "the plugin wants its JSON as a StringValue"
        );
        let text = configuration["value"].as_str().unwrap_or_default();
        let config: Value = if text.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(text).unwrap_or_else(|e| panic!("envoy.yaml plugin config: {e}"))
        };
        assert_accepted("envoy-config/envoy.yaml", &config);
    }
}

/// Every plugin configuration of the Kubernetes manifests: `(file, configuration)`. A WasmPlugin
/// carries it as `pluginConfig` (YAML Istio turns into JSON), an EnvoyExtensionPolicy as
/// `wasm[].config`.
fn manifest_plugin_configs() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for m in manifests("envoy-config/istio")
        .into_iter()
        .chain(manifests("envoy-config/envoy-gateway"))
    {
        match m.kind() {
            "WasmPlugin" => out.push((
                m.file.clone(),
                m.spec()
                    .get("pluginConfig")
                    .cloned()
                    .unwrap_or_else(|| json!({})),
            )),
            "EnvoyExtensionPolicy" => {
                for wasm in m.spec()["wasm"].as_array().into_iter().flatten() {
                    out.push((
                        m.file.clone(),
                        wasm.get("config").cloned().unwrap_or_else(|| json!({})),
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_plugin_configuration_in_the_manifests_is_valid() {
    let configs = manifest_plugin_configs();
    let files: BTreeSet<&str> = configs.iter().map(|(f, _)| f.as_str()).collect();
    assert!(files.len() >= 4, "expected the Istio WasmPlugins (OCI, file://, gateway) and the Envoy Gateway policy, found {files:?}");
    for (file, config) in &configs {
        assert_accepted(file, config);
    }
    // The complete example really is complete: every field of the configuration is spelled out.
    let (_, full) = configs
        .iter()
        .find(|(f, _)| f == "envoy-config/istio/wasmplugin.yaml")
        .unwrap_or_else(|| panic!("no envoy-config/istio/wasmplugin.yaml"));
    assert_eq!(
        keys(full),
        keys(&default_json()),
        "the OCI WasmPlugin's pluginConfig should list every field"
    );
}

// ---------------------------------------------------------------------------------------------
// (c) docker-compose runs what the tests run

/// `a/b/../c` -> `a/c`, without touching the filesystem.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `(host path, container path)` of each bind mount of a compose service, host paths resolved
/// against the compose file's directory.
fn mounts(service: &Value) -> Vec<(PathBuf, String)> {
    service["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|v| {
            let mut parts = v.split(':');
            let host = parts.next().unwrap_or_default();
            let container = parts.next().unwrap_or_default().to_string();
            (
                normalize(&repo_root().join("envoy-config").join(host)),
                container,
            )
        })
        .collect()
}

fn local_envoy_version() -> String {
    let shim = repo_root().join(".venv/bin/envoy");
    let bin = if shim.exists() {
        shim
    } else {
        harness::envoy::envoy_binary().unwrap_or_else(|| panic!("no envoy binary: see test.sh"))
    };
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // "PATH  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    let after = text.split("version:").nth(1).unwrap_or_default();
    after
        .split('/')
        .nth(1)
        .filter(|v| v.split('.').count() == 3)
        .unwrap_or_else(|| panic!("unexpected envoy --version: {text}"))
        .to_string()
}

#[test]
fn docker_compose_runs_the_tested_envoy_config_and_plugin() {
    let compose = yaml("envoy-config/docker-compose.yml");
    let services = compose["services"].as_object().unwrap();
    for (name, service) in services {
        assert_eq!(
            service["network_mode"], "host",
            "service {name}: envoy.yaml's 127.0.0.1 addresses need the host network"
        );
    }
    let envoy = &compose["services"]["envoy"];
    assert_eq!(
        envoy["image"],
        format!("envoyproxy/envoy:v{}", local_envoy_version()),
        "the compose Envoy must be the release the tests run"
    );

    let envoy_mounts = mounts(envoy);
    let find = |host: &str| {
        let want = repo_root().join(host);
        envoy_mounts
            .iter()
            .find(|(h, _)| *h == want)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("envoy does not mount {host}: {envoy_mounts:?}"))
    };
    let config_in_container = find("envoy-config/envoy.yaml");
    let plugin_in_container = find("dist/ewma_lb.wasm");
    let command: Vec<&str> = envoy["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let c = command
        .iter()
        .position(|a| *a == "-c" || *a == "--config-path")
        .unwrap_or_else(|| panic!("no -c in {command:?}"));
    assert_eq!(
        command[c + 1],
        config_in_container,
        "envoy must run the mounted envoy.yaml"
    );

    // envoy.yaml's relative plugin path, from the container's working directory, is the mount.
    let mut filters = Vec::new();
    let envoy_yaml = yaml("envoy-config/envoy.yaml");
    wasm_filters(&envoy_yaml, &mut filters);
    let filename = filters[0]["config"]["vm_config"]["code"]["local"]["filename"]
        .as_str()
        .unwrap();
    let working_dir = envoy["working_dir"].as_str().unwrap_or("/");
    assert_eq!(
        normalize(&Path::new(working_dir).join(filename)),
        PathBuf::from(&plugin_in_container),
        "working_dir + {filename} must be the mounted plugin"
    );

    // The backends listen where envoy.yaml's cluster sends traffic.
    let mut endpoints = BTreeSet::new();
    for cluster in envoy_yaml["static_resources"]["clusters"]
        .as_array()
        .unwrap()
    {
        for group in cluster["load_assignment"]["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for e in group["lb_endpoints"].as_array().into_iter().flatten() {
                let a = &e["endpoint"]["address"]["socket_address"];
                endpoints.insert(format!(
                    "{}:{}",
                    a["address"].as_str().unwrap(),
                    a["port_value"]
                ));
            }
        }
    }
    let backends: BTreeSet<String> = compose["services"]["backends"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .flat_map(|arg| arg.split(','))
        .filter_map(|kv| kv.strip_prefix("addr=").map(str::to_string))
        .collect();
    assert_eq!(
        backends, endpoints,
        "backends (left) must be envoy.yaml's endpoints (right)"
    );

    // Prometheus scrapes envoy.yaml's admin address.
    let admin = &envoy_yaml["admin"]["address"]["socket_address"];
    let admin = format!(
        "{}:{}",
        admin["address"].as_str().unwrap(),
        admin["port_value"]
    );
    let prometheus = yaml("envoy-config/prometheus.yml");
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(job["metrics_path"], "/stats/prometheus");
    assert_eq!(
        job["static_configs"][0]["targets"][0],
        admin.as_str(),
        "Prometheus must scrape Envoy's admin"
    );
    let prom_mounts = mounts(&compose["services"]["prometheus"]);
    assert!(
        prom_mounts
            .iter()
            .any(|(h, _)| *h == repo_root().join("envoy-config/prometheus.yml")),
        "prometheus must mount prometheus.yml"
    );
    for (host, _) in mounts(&compose["services"]["grafana"]) {
        assert!(
            host.exists(),
            "grafana mounts {} which does not exist",
            host.display()
        );
    }

    // The compose tool itself accepts the file.
    let tool = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("docker-compose")).find(|p| p.is_file()))
        .unwrap_or_else(|| panic!("docker-compose is not installed; install it with: apt-get install -y docker-compose (./test.sh does)"));
    let out = Command::new(tool)
        .args(["-f", "envoy-config/docker-compose.yml", "config", "-q"])
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("docker-compose: {e}"));
    assert!(
        out.status.success(),
        "docker-compose config rejects envoy-config/docker-compose.yml:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// the dashboard

#[test]
fn the_dashboard_queries_metrics_the_plugin_defines() {
    let dashboard: Value =
        serde_json::from_str(&read("envoy-config/grafana/ewma-lb-dashboard.json")).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    let mut used = BTreeSet::new();
    for expr in &exprs {
        for (i, _) in expr.match_indices("ewma_lb_") {
            let name: String = expr[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            used.insert(name);
        }
    }
    assert!(
        used.len() >= 6,
        "the dashboard should chart the plugin's metrics, uses {used:?}"
    );
    let defined: BTreeSet<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
    for name in &used {
        assert!(
            defined.contains(name.as_str()),
            "the dashboard queries {name}, which the plugin does not define ({defined:?})"
        );
    }
    let provisioned = yaml("envoy-config/grafana/provisioning/datasources/prometheus.yml");
    assert_eq!(
        provisioned["datasources"][0]["url"],
        "http://127.0.0.1:9090"
    );
}

#[test]
fn the_readme_documents_every_metric_with_its_labels() {
    let readme = read("README.md");
    for metric in Metric::ALL {
        let labels = metric
            .labels()
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let row = format!("| `{}` | {labels} |", metric.name());
        assert!(
            readme.contains(&row),
            "README's metrics table lacks the row starting {row:?}"
        );
    }
}
