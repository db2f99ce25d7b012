//! Packaging: what ships around the plugin agrees with the plugin.
//!
//! - schema/ewma-lb.schema.json documents exactly the fields `Config` has, with the real defaults,
//!   and rejects what the parser rejects;
//! - every plugin configuration shipped (envoy.yaml, the Istio WasmPlugins, the Envoy Gateway
//!   EnvoyExtensionPolicy) passes both the schema and the plugin's own parser;
//! - the docker-compose stack runs the very envoy.yaml and plugin the end-to-end tests run, on the
//!   Envoy release the tests use, and `docker-compose config` accepts it;
//! - the Grafana dashboard refers to what exists;
//! - docs/configuration.md lists every field with its default, as the schema and the parser have
//!   them;
//! - docs/observability.md's metrics table is the plugin's, the only one, and its dashboard table
//!   is the dashboard's.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

mod shipped;
mod variants;

use ewma_lb::balance::pick::PickAlgorithm;
use ewma_lb::config::{ClusterConfig, Config, PluginConfig};
use ewma_lb::worker::telemetry::{Metric, MetricKind};
use ewma_lb::worker::FallbackReason;
use harness::repo_root;
use serde_json::{json, Value};
use shipped::{manifests, read, repo_files, yaml};
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
        PickAlgorithm::WeightedP2cUnlessEqual,
        PickAlgorithm::LowestLatency,
    ];
    for p in &all {
        match p {
            PickAlgorithm::WeightedRandom
            | PickAlgorithm::WeightedP2c
            | PickAlgorithm::WeightedP2cUnlessEqual
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

/// The smoother the parser makes of `{"algorithm": name}` alone, as JSON: its parameters' defaults.
fn smoother_defaults(name: &Value) -> Value {
    let config = Config::from_json(
        json!({ "smoothing": { "algorithm": name } })
            .to_string()
            .as_bytes(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::to_value(config.policy().smoother).unwrap()
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
        let name = &branch["properties"]["algorithm"]["const"];
        let parsed = smoother_defaults(name);
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
// (a') docs/configuration.md agrees with the schema and the parser

/// The cells of a markdown table row (`\|` is a pipe inside a cell).
fn cells(row: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = row.trim().trim_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                out.last_mut().unwrap().push('|');
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out.iter().map(|c| c.trim().to_string()).collect()
}

/// The body rows of the first table under the heading `heading` of `file`. A missing heading or
/// table fails: a check must not pass on a section that moved away.
fn doc_table(file: &str, heading: &str) -> Vec<Vec<String>> {
    let text = read(file);
    let (_, section) = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{file} has no section {heading:?}"));
    let section = section.split("\n#").next().unwrap_or_default();
    let rows: Vec<Vec<String>> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(cells)
        .collect();
    assert!(!rows.is_empty(), "{file}, {heading:?}: no table");
    rows
}

/// The text between backticks of a cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The same JSON value; numbers compared as numbers (`2` and `2.0` are one default).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// The scalars inside a value, as a configuration table writes them (strings without quotes).
fn scalars(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| scalars(x, out)),
        Value::Object(m) => m.values().for_each(|x| scalars(x, out)),
        Value::String(s) => out.push(s.clone()),
        other => out.push(other.to_string()),
    }
}

/// docs/configuration.md, "Every field": one row per field the parser has, at the level the
/// table describes it (`weights.exponent`, or `smoothing` as a whole), none for a field that does
/// not exist, each described by the schema, and each default as the parser fills it in: a
/// scalar written as its JSON; a list or object as its JSON, or as prose naming each value in it.
#[test]
fn the_configuration_doc_lists_every_field_with_its_default() {
    let file = "docs/configuration.md";
    let rows = doc_table(file, "## Every field");
    let root = schema();
    // The defaults, and a cluster entry so that `clusters.<name>` has fields to cover.
    let mut rich = PluginConfig::default();
    rich.clusters.insert(
        "backend".into(),
        ClusterConfig {
            endpoints: vec!["127.0.0.1:8081".into()],
        },
    );
    let rich = serde_json::to_value(&rich).unwrap();
    let defaults = default_json();
    let fields: Vec<String> = rows
        .iter()
        .map(|r| {
            let spans = code_spans(&r[0]);
            assert_eq!(
                spans.len(),
                1,
                "{file}: a field cell is one `name`: {:?}",
                r[0]
            );
            spans[0].to_string()
        })
        .collect();
    let covers = |field: &str, leaf: &str| {
        let (f, l): (Vec<&str>, Vec<&str>) =
            (field.split('.').collect(), leaf.split('.').collect());
        f.len() <= l.len() && f.iter().zip(&l).all(|(f, l)| f == l || *f == "<name>")
    };
    for (leaf, _) in leaves(&rich) {
        let n = fields.iter().filter(|f| covers(f, &leaf)).count();
        assert_eq!(n, 1, "{file}: {leaf} is described by {n} rows, not one");
    }
    for (field, row) in fields.iter().zip(&rows) {
        assert!(
            leaves(&rich).iter().any(|(leaf, _)| covers(field, leaf)),
            "{file} lists {field}, which the configuration does not have"
        );
        // The schema describes it: properties, and `additionalProperties` for `<name>`.
        let mut node = &root;
        for part in field.split('.') {
            let here = resolve(&root, node);
            node = if part == "<name>" {
                &here["additionalProperties"]
            } else {
                &here["properties"][part]
            };
            assert!(!node.is_null(), "{file}: the schema has no {field}");
        }
        assert!(
            node.get("description").is_some() || resolve(&root, node).get("description").is_some(),
            "{file}: the schema does not describe {field}"
        );
        // The default, where the field has one of its own (not below a `<name>`).
        if field.contains("<name>") {
            continue;
        }
        let default = at(&defaults, field).unwrap_or_else(|| panic!("no default for {field}"));
        let cell = &row[1];
        let spans = code_spans(cell);
        let written = spans
            .first()
            .and_then(|s| serde_json::from_str::<Value>(s).ok());
        match written {
            Some(w) => assert!(
                same_json(&w, default),
                "{file}: {field}'s default is {default}, the table says {cell}"
            ),
            None => {
                assert!(
                    default.is_array() || default.is_object(),
                    "{file}: {field}'s default {default} is not written as JSON: {cell}"
                );
                let mut values = Vec::new();
                scalars(default, &mut values);
                for v in values {
                    assert!(
                        spans.contains(&v.as_str()),
                        "{file}: {field}'s default holds {v}, the table says {cell}"
                    );
                }
            }
        }
    }
}

/// docs/configuration.md, "Smoothing algorithms": a row per algorithm the parser knows, naming
/// each of its parameters with the default the parser fills in.
#[test]
fn the_configuration_doc_lists_every_smoothing_algorithm_with_its_parameters() {
    let file = "docs/configuration.md";
    let rows = doc_table(file, "## Smoothing algorithms");
    let names: BTreeSet<String> = rows
        .iter()
        .map(|r| r[0].trim_matches('`').to_string())
        .collect();
    let parser: BTreeSet<String> = all_smoothers()
        .iter()
        .map(|s| s.name().to_string())
        .collect();
    assert_eq!(
        names, parser,
        "{file}: the algorithms (left) are not the parser's (right)"
    );
    for row in &rows {
        let name = row[0].trim_matches('`');
        let parsed = smoother_defaults(&json!(name));
        let params: Vec<(&String, &Value)> = parsed
            .as_object()
            .unwrap()
            .iter()
            .filter(|(p, _)| *p != "algorithm")
            .collect();
        assert!(!params.is_empty(), "{name} has no parameters: {parsed}");
        for (param, default) in params {
            let written = format!("`{param}` ({default}");
            assert!(
                row[1].contains(&written),
                "{file}: {name}'s parameters should say {written}...), say {:?}",
                row[1]
            );
        }
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
    let missing: Vec<String> = leaves(&default_json())
        .into_iter()
        .map(|(path, _)| path)
        .filter(|path| at(full, path).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "the OCI WasmPlugin's pluginConfig should spell out every field; it lacks {missing:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// (b') every shipped plugin configuration, field by field: the parser's default, or an override
// stated here

/// What each shipped plugin configuration sets on purpose, by dotted field path: every other
/// field a file spells out must be what the parser fills in by itself, so a default that moves
/// in src/config/ shows up here as a file to update, never as a stale example.
const OVERRIDES: &[(&str, &[&str])] = &[
    // Steers the one static cluster of the file; nothing else.
    // Steers the one static cluster of the file, and follows Envoy's health checks through its
    // admin cluster.
    (
        "envoy-config/envoy.yaml",
        &["steered_clusters", "envoy_health.admin_cluster"],
    ),
    // The compose stack's Envoy: the same, plus the compose network, from which the host's
    // curl reaches the status page through a published port.
    (
        "envoy-config/compose/envoy.yaml",
        &[
            "steered_clusters",
            "envoy_health.admin_cluster",
            "management.allowed_cidrs",
        ],
    ),
    // Istio sidecars: only the subset's cluster is steered, and the status page is queried from
    // the client pod itself, whose IP is not loopback.
    (
        "envoy-config/istio/wasmplugin.yaml",
        &["steered_clusters", "management.allowed_cidrs"],
    ),
    (
        "envoy-config/istio/wasmplugin-file.yaml",
        &["steered_clusters", "management.allowed_cidrs"],
    ),
    // The ingress gateway: its subset's cluster; clients are outside, loopback is enough.
    (
        "envoy-config/istio/gateway/wasmplugin.yaml",
        &["steered_clusters"],
    ),
    // Envoy Gateway: the route's clusters.
    (
        "envoy-config/envoy-gateway/envoyextensionpolicy.yaml",
        &["steered_clusters"],
    ),
];

/// `(path, value)` of every leaf of a configuration: objects are walked, arrays and scalars are
/// values (a list is set as a whole).
fn leaves(v: &Value) -> Vec<(String, Value)> {
    fn walk(v: &Value, path: &str, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, c) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(c, &p, out);
                }
            }
            other => out.push((path.to_string(), other.clone())),
        }
    }
    let mut out = Vec::new();
    walk(v, "", &mut out);
    out
}

fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

fn set(v: &mut Value, path: &str, value: Value) {
    let mut node = v;
    for k in path.split('.') {
        if !node.is_object() {
            *node = json!({});
        }
        node = node
            .as_object_mut()
            .unwrap()
            .entry(k.to_string())
            .or_insert(Value::Null);
    }
    *node = value;
}

/// The configuration the parser makes of `config`, every field filled in, as JSON.
fn effective(what: &str, config: &Value) -> Value {
    let parsed = PluginConfig::from_json(config.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{what}: the parser rejects {config}: {e}"));
    serde_json::to_value(parsed).unwrap()
}

/// Every plugin configuration shipped: envoy.yaml's wasm filters, the compose stack's, and the
/// manifests'.
fn shipped_plugin_configs() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for file in ["envoy-config/envoy.yaml", "envoy-config/compose/envoy.yaml"] {
        let mut filters = Vec::new();
        wasm_filters(&yaml(file), &mut filters);
        assert!(!filters.is_empty(), "{file}: no wasm filter");
        for f in filters {
            let text = f["config"]["configuration"]["value"]
                .as_str()
                .unwrap_or_default();
            let config = if text.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"))
            };
            out.push((file.to_string(), config));
        }
    }
    out.extend(manifest_plugin_configs());
    out
}

/// The problems of one shipped configuration against the parser's defaults and its stated
/// overrides; empty when it agrees.
fn drift(file: &str, config: &Value, overrides: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let defaults = effective("defaults", &json!({}));
    // What the file should amount to: the parser's defaults with only the stated overrides
    // taken from it (an override of smoothing.algorithm brings that algorithm's own defaults).
    let mut only = json!({});
    // A smoothing parameter exists only under its algorithm: the file's comes along.
    if overrides.iter().any(|p| p.starts_with("smoothing.")) {
        if let Some(algorithm) = at(config, "smoothing.algorithm") {
            set(&mut only, "smoothing.algorithm", algorithm.clone());
        }
    }
    for path in overrides {
        match at(config, path) {
            Some(v) => set(&mut only, path, v.clone()),
            None => problems.push(format!(
                "{file}: {path} is stated as an override but the file does not set it"
            )),
        }
    }
    let expected = effective(file, &only);
    for path in overrides {
        if at(&expected, path) == at(&defaults, path) {
            problems.push(format!(
                "{file}: {path} is stated as an override but is the parser's default {}: drop it",
                at(&defaults, path).unwrap_or(&Value::Null)
            ));
        }
    }
    let actual = effective(file, config);
    for (path, value) in leaves(&actual) {
        let want = at(&expected, &path).cloned().unwrap_or(Value::Null);
        if value != want {
            problems.push(format!(
                "{file}: {path} is {value}, the parser's default is {want}: update the file, or \
                 state the override in tests/packaging.rs OVERRIDES"
            ));
        }
    }
    problems
}

#[test]
fn every_shipped_plugin_configuration_is_the_defaults_plus_stated_overrides() {
    let configs = shipped_plugin_configs();
    let mut problems = Vec::new();
    for (file, config) in &configs {
        let overrides = OVERRIDES
            .iter()
            .find(|(f, _)| f == file)
            .map(|(_, o)| *o)
            .unwrap_or_else(|| {
                panic!("{file}: a shipped plugin configuration without an entry in OVERRIDES")
            });
        problems.extend(drift(file, config, overrides));
    }
    for (file, _) in OVERRIDES {
        assert!(
            configs.iter().any(|(f, _)| f == file),
            "OVERRIDES names {file}, which ships no plugin configuration"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check finds what it should: a spelled-out default that moved, an unstated override, an
/// override that is the default, and one the file does not set.
#[test]
fn the_drift_check_finds_stale_fields() {
    let defaults = default_json();
    let tau = defaults["smoothing"]["tau_ms"].as_u64().unwrap();
    let stale = json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": tau + 1}});
    assert_eq!(
        drift("t", &stale, &[]).len(),
        1,
        "{:?}",
        drift("t", &stale, &[])
    );
    assert!(drift(
        "t",
        &json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": tau}}),
        &[]
    )
    .is_empty());
    assert!(drift("t", &stale, &["smoothing.tau_ms"]).is_empty());
    let unstated = json!({"shadow": true});
    assert_eq!(drift("t", &unstated, &[]).len(), 1);
    assert!(drift("t", &unstated, &["shadow"]).is_empty());
    assert_eq!(drift("t", &json!({"shadow": false}), &["shadow"]).len(), 1);
    assert_eq!(drift("t", &json!({}), &["shadow"]).len(), 2);
    // Another algorithm brings its own parameter defaults, not peak_ewma's.
    let sma = json!({"smoothing": {"algorithm": "sma"}});
    assert!(drift("t", &sma, &["smoothing.algorithm"]).is_empty());
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
/// against the compose file's directory; named volumes are left out ([`named_volumes`]).
fn mounts(service: &Value) -> Vec<(PathBuf, String)> {
    volumes(service)
        .into_iter()
        .filter(|(host, _)| host.starts_with('.') || host.starts_with('/'))
        .map(|(host, container)| {
            (
                normalize(&repo_root().join("envoy-config").join(host)),
                container,
            )
        })
        .collect()
}

/// `(volume name, container path)` of each named volume a compose service mounts.
fn named_volumes(service: &Value) -> Vec<(String, String)> {
    volumes(service)
        .into_iter()
        .filter(|(host, _)| !(host.starts_with('.') || host.starts_with('/')))
        .collect()
}

fn volumes(service: &Value) -> Vec<(String, String)> {
    service["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|v| {
            let mut parts = v.split(':');
            let host = parts.next().unwrap_or_default().to_string();
            let container = parts.next().unwrap_or_default().to_string();
            (host, container)
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

/// `(path, left, right)` of every leaf where two trees differ.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<(String, Value, Value)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                differences(l, r, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(l, r, &format!("{path}[{i}]"), out);
            }
        }
        (l, r) if l != r => out.push((path.to_string(), l.clone(), r.clone())),
        _ => {}
    }
}

/// The plugin configuration of a bootstrap's one wasm filter, parsed.
fn plugin_config_of(bootstrap: &Value) -> Value {
    let mut filters = Vec::new();
    wasm_filters(bootstrap, &mut filters);
    assert_eq!(filters.len(), 1);
    serde_json::from_str(
        filters[0]["config"]["configuration"]["value"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

/// The compose stack's Envoy config is envoy.yaml but for where it binds and the management
/// allowlist, which names the compose network.
#[test]
fn the_compose_envoy_config_is_envoy_yaml_bound_for_published_ports() {
    let (shipped, compose) = (
        yaml("envoy-config/envoy.yaml"),
        yaml("envoy-config/compose/envoy.yaml"),
    );
    let mut diffs = Vec::new();
    differences(&shipped, &compose, "", &mut diffs);
    let paths: Vec<&str> = diffs.iter().map(|(p, _, _)| p.as_str()).collect();
    let value_path = ".static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[1].typed_config.config.configuration.value";
    assert_eq!(
        paths,
        [
            ".admin.address.socket_address.address",
            ".static_resources.listeners[0].address.socket_address.address",
            value_path,
            ".static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[2].typed_config.rules.policies.management-outside-allowlist.principals[0].not_id.or_ids.ids",
        ],
        "compose/envoy.yaml differs from envoy.yaml elsewhere: {diffs:?}"
    );
    for (path, _, bound) in &diffs[..2] {
        assert_eq!(bound, "0.0.0.0", "{path}");
    }
    let (ours, theirs) = (plugin_config_of(&shipped), plugin_config_of(&compose));
    let mut plugin_diffs = Vec::new();
    differences(&ours, &theirs, "", &mut plugin_diffs);
    assert_eq!(
        plugin_diffs
            .iter()
            .map(|(p, _, _)| p.as_str())
            .collect::<Vec<_>>(),
        [".management"],
        "{plugin_diffs:?}"
    );
    let subnet = yaml("envoy-config/docker-compose.yml")["networks"]["demo"]["ipam"]["config"][0]
        ["subnet"]
        .clone();
    let allowed = theirs["management"]["allowed_cidrs"].as_array().unwrap();
    assert!(
        allowed.contains(&subnet),
        "compose/envoy.yaml's management allowlist {allowed:?} lacks the compose network {subnet}"
    );
    let defaults = default_json()["management"]["allowed_cidrs"].clone();
    for cidr in defaults.as_array().unwrap() {
        assert!(allowed.contains(cidr), "the loopback default {cidr} stays");
    }
}

/// The compose stack's Envoy config, run by a real Envoy with the real plugin: only the
/// addresses are the harness's (free loopback ports, its backends), as compose's are the
/// container's. Requests are served and steered, and the status page answers from loopback.
#[test]
fn the_compose_envoy_config_runs_in_a_real_envoy() {
    use harness::{BackendSpec, EnvoyConfig, Latency, Stack};
    let stack = Stack::start_with(
        vec![
            BackendSpec::new("fast", Latency::Fixed(2)),
            BackendSpec::new("slow", Latency::Fixed(60)),
        ],
        |local| {
            let mut compose =
                EnvoyConfig::load(&repo_root().join("envoy-config/compose/envoy.yaml"))?;
            compose.resolve_module_paths(&repo_root());
            for path in [
                "admin.address.socket_address",
                "static_resources.listeners[0].address.socket_address",
                "static_resources.clusters[name=backend].load_assignment",
            ] {
                let here = local.get(path)?.clone();
                compose.set(path, here)?;
            }
            *local = compose;
            Ok(())
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let records = stack.load(100.0, 4).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(!records.is_empty());
    let failed = records.iter().filter(|r| r.status != 200).count();
    assert_eq!(failed, 0, "{failed} of {} requests failed", records.len());
    // The status page is the answering worker VM's: one whose connections carried none of the
    // load knows no cluster yet. Each fetch is a new connection, which Envoy may give another.
    let mut status = Value::Null;
    let shown = harness::poll::within(std::time::Duration::from_secs(10), || {
        status = stack.status().unwrap_or_else(|e| panic!("{e:#}"));
        status["clusters"][0]["cluster"] == "backend"
    });
    assert!(shown.is_some(), "no worker VM showed the cluster: {status}");
    let steered = stack
        .prometheus("ewma_lb_steered_requests_total{cluster_name=\"backend\"}")
        .unwrap_or(0.0);
    assert!(
        steered > 0.0,
        "the plugin steered nothing:\n{}",
        stack.envoy.log()
    );
    let served = stack.served();
    let (fast, slow) = (
        served.iter().find(|(n, _)| n == "fast").unwrap().1,
        served.iter().find(|(n, _)| n == "slow").unwrap().1,
    );
    assert!(fast > slow, "fast {fast} slow {slow}");
}

#[test]
fn docker_compose_builds_the_plugin_and_runs_the_tested_envoy_config() {
    let compose = yaml("envoy-config/docker-compose.yml");
    let services = compose["services"].as_object().unwrap();

    // One bridge network, no host networking: `backends` owns the namespace, the others join it
    // (envoy.yaml's 127.0.0.1 then means the same in every container), and only 127.0.0.1 of the
    // host gets published ports.
    let owner = "backends";
    for (name, service) in services {
        assert_ne!(
            service["network_mode"], "host",
            "service {name}: host networking exists only on Linux"
        );
        match name.as_str() {
            "backends" => {
                assert!(service["network_mode"].is_null());
                assert_eq!(service["networks"], json!(["demo"]));
            }
            "plugin" => assert_eq!(
                service["network_mode"], "none",
                "the build needs no network"
            ),
            _ => assert_eq!(
                service["network_mode"],
                format!("service:{owner}"),
                "service {name} must share {owner}'s network namespace"
            ),
        }
        if name != owner {
            assert!(
                service["ports"].is_null(),
                "{name}: ports are published by {owner}"
            );
        }
    }
    let published: BTreeSet<u16> = compose["services"][owner]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let p = p.as_str().unwrap();
            let (host, rest) = p.split_once(':').unwrap();
            assert_eq!(
                host, "127.0.0.1",
                "{p}: publish on the host's loopback only"
            );
            let (outside, inside) = rest.split_once(':').unwrap();
            assert_eq!(outside, inside, "{p}");
            inside.parse().unwrap()
        })
        .collect();

    let envoy = &compose["services"]["envoy"];
    assert_eq!(
        envoy["image"],
        format!("envoyproxy/envoy:v{}", local_envoy_version()),
        "the compose Envoy must be the release the tests run"
    );
    let envoy_mounts = mounts(envoy);
    let config_in_container = envoy_mounts
        .iter()
        .find(|(h, _)| *h == repo_root().join("envoy-config/compose/envoy.yaml"))
        .map(|(_, c)| c.clone())
        .unwrap_or_else(|| panic!("envoy does not mount compose/envoy.yaml: {envoy_mounts:?}"));
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
        "envoy must run the mounted compose/envoy.yaml"
    );

    // The module: built by the Dockerfile's build stage (./wasm-build.sh, which leaves it at
    // /src/dist/ewma_lb.wasm), copied into a volume, which Envoy mounts where compose/envoy.yaml's
    // relative path, from Envoy's working directory, points.
    let plugin = &compose["services"]["plugin"];
    assert_eq!(plugin["build"]["dockerfile"], "Dockerfile");
    assert_eq!(plugin["build"]["context"], "..");
    let stages = read("Dockerfile");
    let target = plugin["build"]["target"].as_str().unwrap();
    assert!(
        stages
            .lines()
            .any(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {target}"))),
        "the Dockerfile has no stage {target}"
    );
    assert!(
        stages.contains("WORKDIR /src") && read("wasm-build.sh").contains("out=dist/ewma_lb.wasm")
    );
    let copy: Vec<&str> = plugin["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(copy[..2], ["cp", "/src/dist/ewma_lb.wasm"]);
    let (volume, built_at) = named_volumes(plugin)
        .pop()
        .unwrap_or_else(|| panic!("plugin mounts no volume"));
    let module_in_volume = copy[2]
        .strip_prefix(&format!("{built_at}/"))
        .unwrap_or_else(|| panic!("{} is not in the volume at {built_at}", copy[2]));
    let (_, envoy_sees_it_at) = named_volumes(envoy)
        .into_iter()
        .find(|(v, _)| *v == volume)
        .unwrap_or_else(|| panic!("envoy does not mount the volume {volume}"));
    assert!(compose["volumes"].get(&volume).is_some());
    assert_eq!(
        envoy["depends_on"]["plugin"]["condition"], "service_completed_successfully",
        "Envoy starts once the module is in the volume"
    );
    let compose_envoy = yaml("envoy-config/compose/envoy.yaml");
    let mut filters = Vec::new();
    wasm_filters(&compose_envoy, &mut filters);
    let filename = filters[0]["config"]["vm_config"]["code"]["local"]["filename"]
        .as_str()
        .unwrap();
    let working_dir = envoy["working_dir"].as_str().unwrap_or("/");
    assert_eq!(
        normalize(&Path::new(working_dir).join(filename)),
        Path::new(&envoy_sees_it_at).join(module_in_volume),
        "working_dir + {filename} must be the module in the volume"
    );

    // The backends listen where the balanced cluster sends traffic (the admin cluster, through
    // which the plugin reads Envoy's health, points at Envoy itself).
    let mut endpoints = BTreeSet::new();
    for cluster in compose_envoy["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "backend")
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
        "backends (left) must be the Envoy config's endpoints (right)"
    );

    // The listener and admin are published; Prometheus scrapes the admin in the shared namespace.
    let admin = &compose_envoy["admin"]["address"]["socket_address"];
    let listener = &compose_envoy["static_resources"]["listeners"][0]["address"]["socket_address"];
    for port in [&admin["port_value"], &listener["port_value"]] {
        let port = port.as_u64().unwrap() as u16;
        assert!(
            published.contains(&port),
            "port {port} is not published: {published:?}"
        );
    }
    let prometheus = yaml("envoy-config/prometheus.yml");
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(job["metrics_path"], "/stats/prometheus");
    assert_eq!(
        job["static_configs"][0]["targets"][0],
        format!("127.0.0.1:{}", admin["port_value"]).as_str(),
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
    for port in [9090, 3000] {
        assert!(published.contains(&port), "port {port} is not published");
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

/// A metrics table's labels cell: `` `cluster_name`, `host` ``.
fn labels_cell(metric: Metric) -> String {
    metric
        .labels()
        .iter()
        .map(|l| format!("`{l}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The panels of the dashboard, by title, with the metrics each one's queries select.
fn dashboard_panels() -> Vec<(String, BTreeSet<String>)> {
    let dashboard: Value =
        serde_json::from_str(&read("envoy-config/grafana/ewma-lb-dashboard.json")).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let mut metrics = BTreeSet::new();
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            // A selector is a metric name followed by its matchers.
            for (i, _) in expr.match_indices('{') {
                let name: String = expr[..i]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                if !name.is_empty() {
                    metrics.insert(name);
                }
            }
        }
        out.push((panel["title"].as_str().unwrap().to_string(), metrics));
    }
    out
}

/// docs/observability.md's table of the dashboard's panels is the dashboard's: the same panels,
/// each with the metrics its queries read (whose names the test above checks against the plugin).
#[test]
fn the_observability_doc_describes_the_dashboard_as_it_is() {
    let file = "docs/observability.md";
    let rows = doc_table(file, "## The Grafana dashboard");
    let panels = dashboard_panels();
    let titles: BTreeSet<&str> = panels.iter().map(|(t, _)| t.as_str()).collect();
    let documented: BTreeSet<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(
        documented, titles,
        "{file}: the panels documented (left) are not the dashboard's (right)"
    );
    for row in &rows {
        let (_, metrics) = panels.iter().find(|(t, _)| *t == row[1]).unwrap();
        let named: BTreeSet<String> = code_spans(&row[2])
            .into_iter()
            .filter(|s| s.starts_with("ewma_lb_") || s.starts_with("envoy_"))
            .map(str::to_string)
            .collect();
        assert_eq!(
            &named, metrics,
            "{file}: the panel {:?} reads other metrics (right) than the doc says (left)",
            row[1]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The management guard that holds while the plugin is not running

/// The RBAC `rules` that refuse what the plugin's `management` and `status_path` guard, from
/// outside its allowlist: management paths by whole segments (not the health paths among them),
/// the status page, and encoded separators or a backslash anywhere.
fn guard_rules(plugin: &Value) -> Value {
    let config = PluginConfig::from_json(plugin.to_string().as_bytes()).unwrap();
    let path = |kind: &str, p: &str| json!({"url_path": {"path": {kind: p, "ignore_case": true}}});
    let segments = |exact: &[String], prefix: &[String]| -> Vec<Value> {
        exact
            .iter()
            .map(|e| path("exact", e))
            .chain(
                prefix
                    .iter()
                    .flat_map(|p| [path("exact", p), path("prefix", &format!("{p}/"))]),
            )
            .collect()
    };
    let m = &config.management.paths;
    let mut management = segments(&m.exact, &m.prefix);
    management.push(path("exact", &config.status_path));
    let under_management = |p: &&String| {
        m.prefix
            .iter()
            .any(|mp| p.as_str() == mp || p.starts_with(&format!("{mp}/")))
            || m.exact.contains(p)
    };
    let h = &config.health_paths;
    let health = segments(
        &h.exact
            .iter()
            .filter(under_management)
            .cloned()
            .collect::<Vec<_>>(),
        &h.prefix
            .iter()
            .filter(under_management)
            .cloned()
            .collect::<Vec<_>>(),
    );
    let ids: Vec<Value> = config
        .management
        .allowed_cidrs
        .iter()
        .map(|c| {
            let (addr, len) = c.split_once('/').unwrap_or_else(|| {
                (c.as_str(), if c.contains(':') { "128" } else { "32" })
            });
            json!({"remote_ip": {"address_prefix": addr, "prefix_len": len.parse::<u32>().unwrap()}})
        })
        .collect();
    json!({
        "action": "DENY",
        "policies": {"management-outside-allowlist": {
            "permissions": [
                {"and_rules": {"rules": [
                    {"or_rules": {"rules": management}},
                    {"not_rule": {"or_rules": {"rules": health}}},
                ]}},
                {"url_path": {"path": {"safe_regex": {"regex": r"(?i).*(%(25)*(2f|5c)|\\).*"}}}},
            ],
            "principals": [{"not_id": {"or_ids": {"ids": ids}}}],
        }},
    })
}

/// Every shipped configuration that runs the plugin also carries a native RBAC filter that
/// refuses exactly what the plugin's configuration guards, from outside exactly its allowlist
/// (tests/e2e_failure.rs and tests/istio.rs show the filter holding with the plugin down): a
/// change to one without the other fails here.
#[test]
fn every_shipped_management_guard_matches_its_plugin_configuration() {
    let rbac = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
    for file in ["envoy-config/envoy.yaml", "envoy-config/compose/envoy.yaml"] {
        let bootstrap = yaml(file);
        let filters = &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"]["http_filters"];
        let names: Vec<&str> = filters
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "envoy.filters.http.header_mutation",
                "envoy.filters.http.wasm",
                "envoy.filters.http.rbac",
                "envoy.filters.http.router"
            ],
            "{file}: the guard runs after the plugin, before the router"
        );
        assert_eq!(filters[2]["typed_config"]["@type"], rbac);
        assert_eq!(
            filters[2]["typed_config"]["rules"],
            guard_rules(&plugin_config_of(&bootstrap)),
            "{file}"
        );
    }
    for dir in ["envoy-config/istio", "envoy-config/istio/gateway"] {
        let all: Vec<_> = manifests(dir)
            .into_iter()
            .filter(|m| m.dir() == dir)
            .collect();
        let ef = all.iter().find(|m| m.kind() == "EnvoyFilter").unwrap();
        let guards: Vec<&Value> = ef.spec()["configPatches"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["patch"]["value"]["name"] == "ewma-lb.management-guard")
            .collect();
        assert_eq!(guards.len(), 1, "{dir}: one management guard");
        assert_eq!(guards[0]["patch"]["value"]["typed_config"]["@type"], rbac);
        for wp in all.iter().filter(|m| m.kind() == "WasmPlugin") {
            assert_eq!(
                guards[0]["patch"]["value"]["typed_config"]["rules"],
                guard_rules(&wp.spec()["pluginConfig"]),
                "{}",
                wp.file
            );
        }
    }
}

/// docs/observability.md's metrics table is the plugin's metric table (`Metric::ALL`): a row per
/// metric with its type (counter or gauge) and labels, and no row for a metric that does not exist.
#[test]
fn the_observability_doc_documents_every_metric_with_its_kind_and_labels() {
    let doc = read("docs/observability.md");
    let rows: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("| `ewma_lb_"))
        .collect();
    for metric in Metric::ALL {
        let kind = match metric.kind() {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
        };
        let labels = labels_cell(metric);
        let row = format!("| `{}` | {kind} | {labels} |", metric.name());
        assert!(
            rows.iter().any(|r| r.starts_with(&row)),
            "docs/observability.md's metrics table lacks the row starting {row:?}"
        );
    }
    let defined: BTreeSet<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
    for row in rows {
        let name = row.split('`').nth(1).unwrap_or_default();
        assert!(
            defined.contains(name),
            "docs/observability.md documents {name}, which the plugin does not define"
        );
    }
}

/// The metrics table names every `reason` of the fallback counter.
#[test]
fn the_metrics_table_names_every_fallback_reason() {
    let file = "docs/observability.md";
    let text = read(file);
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("| `{}` |", Metric::FallbackRequests.name())))
        .unwrap_or_else(|| panic!("{file} has no row for the fallback counter"));
    for reason in FallbackReason::ALL {
        assert!(
            row.contains(&format!("`{}`", reason.label())),
            "{file}'s fallback row does not name the reason {:?}",
            reason.label()
        );
    }
}

/// docs/observability.md holds the one metrics table, checked above: any other Markdown file of
/// the repository with a row for one of the plugin's metrics would be a copy no test keeps true,
/// so it links there instead.
#[test]
fn no_other_document_keeps_a_metrics_table() {
    let root = repo_root();
    let files = repo_files(".md");
    let rows: Vec<String> = Metric::ALL
        .iter()
        .map(|m| format!("| `{}` |", m.name()))
        .collect();
    let mut with_rows = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        if text.lines().any(|l| rows.iter().any(|r| l.starts_with(r))) {
            with_rows.push(file.strip_prefix(&root).unwrap().display().to_string());
        }
    }
    assert_eq!(
        with_rows,
        ["docs/observability.md"],
        "metric tables outside docs/observability.md (link there instead)"
    );
}

/// The admin cluster the plugin reads Envoy's health from points at Envoy's admin address: no
/// route of a shipped Envoy config may lead a client there, and no steered cluster may be it.
#[test]
fn no_route_leads_a_client_to_the_admin_cluster() {
    fn clusters_routed(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(route) = m.get("route") {
                    for key in ["cluster", "cluster_header"] {
                        if let Some(c) = route.get(key).and_then(Value::as_str) {
                            out.push(c.to_owned());
                        }
                    }
                    if let Some(ws) = route["weighted_clusters"]["clusters"].as_array() {
                        out.extend(
                            ws.iter()
                                .filter_map(|w| w["name"].as_str().map(str::to_owned)),
                        );
                    }
                }
                m.values().for_each(|x| clusters_routed(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| clusters_routed(x, out)),
            _ => {}
        }
    }
    for file in ["envoy-config/envoy.yaml", "envoy-config/compose/envoy.yaml"] {
        let config = yaml(file);
        let text = read(file);
        let admin = text
            .split("\"admin_cluster\": \"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{file}: no envoy_health.admin_cluster"));
        let mut routed = Vec::new();
        clusters_routed(&config["static_resources"]["listeners"], &mut routed);
        assert!(!routed.is_empty(), "{file}: no route found");
        assert!(
            !routed.iter().any(|c| c == admin),
            "{file}: a route leads to the admin cluster {admin}: {routed:?}"
        );
        assert!(
            !text.contains(&format!("\"steered_clusters\": [\"{admin}\"")),
            "{file}: the admin cluster is steered"
        );
    }
}
