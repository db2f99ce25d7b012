//! The Grafana dashboard works under plain Envoy and under Istio: every panel query names only
//! metrics and labels that the series of each configuration really carry.
//!
//! The label sets come from real Envoys running the real plugin with traffic, scraped at
//! `/stats/prometheus`:
//! - plain: envoy-config/envoy.yaml as shipped (its `stats_tags`, and Envoy's default tags);
//! - Istio: the same listener and cluster with Istio's stats configuration instead, as its
//!   bootstrap has it (istio/istio tools/packaging/common/envoy_bootstrap.json:
//!   `use_all_default_tags: false`, `cluster_name` cut from `cluster.NAME;.` since pilot gives
//!   each cluster the `alt_stat_name` `NAME;`) plus one rule per `extraStatTags` entry of
//!   docs/istio.md, in the form Istio derives (`(TAG=\.=(.*?);\.;)`, pkg/bootstrap/config.go).
//!
//! A query is read for its selectors (`metric{label=~"..."}`) and its grouping clauses (`by`,
//! `ignoring`, `on`): each selector's metric must be a series of the configuration, each of its
//! matcher labels one of that series' labels, and each grouping label a label of some series
//! the query reads.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))]

mod shipped;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use harness::config::{CLUSTER, LISTENER};
use harness::{BackendSpec, Latency, Stack};
use serde_json::{json, Value};
use shipped::read;

/// Metric name -> every label its series carry.
type LabelSets = BTreeMap<String, BTreeSet<String>>;

/// The label sets of a scrape, plus the plugin's metrics that did not move during it (an
/// ejection, say, is not certain to happen in a short run): those get the labels the plugin
/// declares (`Metric::labels`), provided the configuration was seen cutting each of them out of
/// another plugin metric's name.
fn with_declared(mut sets: LabelSets) -> LabelSets {
    let extracted: BTreeSet<String> = sets
        .iter()
        .filter(|(n, _)| n.starts_with("ewma_lb_"))
        .flat_map(|(_, l)| l.iter().cloned())
        .collect();
    for metric in ewma_lb::worker::telemetry::Metric::ALL {
        let labels: BTreeSet<String> = metric.labels().iter().map(|l| l.to_string()).collect();
        if !sets.contains_key(metric.name()) && labels.is_subset(&extracted) {
            sets.insert(metric.name().to_string(), labels);
        }
    }
    sets
}

fn label_sets(prometheus: &str) -> LabelSets {
    let mut out = LabelSets::new();
    for line in prometheus
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, rest) = line
            .split_once('{')
            .unwrap_or((line.split(' ').next().unwrap_or_default(), ""));
        let labels = out.entry(name.to_string()).or_default();
        let mut inside = rest.rsplit_once('}').map_or("", |(l, _)| l);
        // label="value",label="value" (values may hold commas and escaped quotes)
        while let Some((label, after)) = inside.split_once("=\"") {
            labels.insert(label.trim_start_matches(',').to_string());
            let mut end = 0;
            let bytes = after.as_bytes();
            while end < bytes.len()
                && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\'))
            {
                end += 1;
            }
            inside = after.get(end + 1..).unwrap_or_default();
        }
    }
    out
}

/// The extraStatTags list of docs/istio.md (the YAML block after `extraStatTags:`).
fn istio_extra_stat_tags() -> Vec<String> {
    let docs = read("docs/istio.md");
    let after = docs
        .split("extraStatTags:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("docs/istio.md has no extraStatTags block"));
    after
        .lines()
        .map_while(|l| l.trim().strip_prefix("- ").map(str::to_string))
        .collect()
}

/// Backends whose traffic moves most metrics: two that answer, one that fails.
fn backends() -> Vec<BackendSpec> {
    vec![
        BackendSpec::new("a", Latency::Fixed(1)),
        BackendSpec::new("b", Latency::Fixed(2)),
        BackendSpec::new("c", Latency::Fixed(1)).fail_rate(1.0),
    ]
}

/// The shipped plugin configuration, with an allowlist that leaves the test client out, so a
/// management request is denied and counted.
fn plugin_config() -> String {
    let shipped = harness::EnvoyConfig::shipped()
        .unwrap()
        .clone()
        .plugin()
        .unwrap()
        .plugin_config()
        .unwrap()
        .to_string();
    let mut config: Value = serde_json::from_str(&shipped).unwrap();
    config["management"] = json!({"allowed_cidrs": ["192.0.2.0/24"]});
    config.to_string()
}

/// Traffic through the plugin on a stack, then its `/stats/prometheus`.
fn scrape(stack: &Stack) -> String {
    let records = stack.load(50.0, 3).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(records.len() > 100);
    let _ = harness::http::get(&format!("{}/health", stack.url), &[]);
    let denied = harness::http::get(&format!("{}/actuator/env", stack.url), &[]).unwrap();
    assert_eq!(denied.status, 403);
    std::thread::sleep(Duration::from_millis(400));
    stack.envoy.admin_get("/stats/prometheus").unwrap()
}

fn plain() -> LabelSets {
    let stack =
        Stack::with_plugin_config(backends(), &plugin_config()).unwrap_or_else(|e| panic!("{e:#}"));
    with_declared(label_sets(&scrape(&stack)))
}

fn istio() -> LabelSets {
    let tags = istio_extra_stat_tags();
    let plugin = plugin_config();
    let stack = Stack::start_with(backends(), |config| {
        config.plugin()?.set_plugin_config(&plugin)?;
        let mut stats_tags =
            vec![json!({"tag_name": "cluster_name", "regex": "^cluster(\\.(.+);)"})];
        stats_tags.extend(
            tags.iter()
                .map(|t| json!({"tag_name": t, "regex": format!("({t}=\\.=(.*?);\\.;)")})),
        );
        config.set(
            "stats_config",
            json!({"use_all_default_tags": false, "stats_tags": stats_tags}),
        )?;
        config
            .cluster(CLUSTER)?
            .insert("alt_stat_name", format!("{CLUSTER};"))?;
        let _ = LISTENER;
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    with_declared(label_sets(&scrape(&stack)))
}

/// `(metric, matcher labels)` of every selector, and every grouping label, of a query.
fn read_query(expr: &str) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let mut selectors = Vec::new();
    let mut grouping = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < bytes.len()
                && ((bytes[i] as char).is_ascii_alphanumeric() || bytes[i] == b'_')
            {
                i += 1;
            }
            let word = &expr[start..i];
            let rest = expr[i..].trim_start();
            if [
                "by",
                "without",
                "ignoring",
                "on",
                "group_left",
                "group_right",
            ]
            .contains(&word)
                && rest.starts_with('(')
            {
                let close = rest.find(')').unwrap();
                grouping.extend(
                    rest[1..close]
                        .split(',')
                        .map(|l| l.trim().to_string())
                        .filter(|l| !l.is_empty()),
                );
                i = expr.len() - rest.len() + close + 1;
            } else if word.starts_with("ewma_lb_") || word.starts_with("envoy_") {
                let mut labels = Vec::new();
                if let Some(inner) = rest.strip_prefix('{') {
                    // Matchers up to the closing brace outside quotes.
                    let mut in_quotes = false;
                    let close = inner.char_indices().find(|(_, c)| {
                        if *c == '"' {
                            in_quotes = !in_quotes;
                        }
                        *c == '}' && !in_quotes
                    });
                    let close = close.map(|(at, _)| at).unwrap();
                    let mut matchers = &inner[..close];
                    while !matchers.is_empty() {
                        let label: String = matchers
                            .trim_start_matches([',', ' '])
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        labels.push(label);
                        // Skip `op "value"` (a value may hold commas).
                        let Some(open) = matchers.find('"') else {
                            break;
                        };
                        let Some(end) = matchers[open + 1..].find('"') else {
                            break;
                        };
                        matchers = &matchers[open + 1 + end + 1..];
                    }
                    i = expr.len() - inner.len() + close + 1;
                }
                selectors.push((word.to_string(), labels));
            }
        } else if c == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += 1;
            }
            i += 1;
        } else {
            i += 1;
        }
    }
    (selectors, grouping)
}

/// The Prometheus series a histogram query reads come from `NAME_bucket`; label sets are per
/// series name, with `le` on buckets only.
fn check(config: &str, sets: &LabelSets, title: &str, expr: &str, problems: &mut Vec<String>) {
    let (selectors, grouping) = read_query(expr);
    assert!(!selectors.is_empty(), "{title}: no metric in {expr}");
    let mut seen = BTreeSet::new();
    for (metric, labels) in &selectors {
        let Some(have) = sets.get(metric) else {
            problems.push(format!("{config}: {title}: no series {metric}"));
            continue;
        };
        seen.extend(have.iter().cloned());
        for l in labels {
            if !have.contains(l) {
                problems.push(format!(
                    "{config}: {title}: {metric} has no label {l} (has {have:?})"
                ));
            }
        }
    }
    for l in &grouping {
        if !seen.contains(l) {
            problems.push(format!(
                "{config}: {title}: groups by {l}, which none of its series has ({seen:?})"
            ));
        }
    }
}

fn panel_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&read("envoy-config/grafana/ewma-lb-dashboard.json")).unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                panel["title"].as_str().unwrap_or_default().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
    {
        out.push((
            format!("variable {}", var["name"]),
            var["definition"]
                .as_str()
                .unwrap()
                .replace("label_values(", "by (")
                .replacen(", ", ") ", 1),
        ));
    }
    out
}

#[test]
fn every_panel_reads_series_both_configurations_produce() {
    let queries = panel_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let mut problems = Vec::new();
    for (config, sets) in [("plain Envoy", plain()), ("Istio", istio())] {
        for (title, expr) in &queries {
            // label_values(metric, label) reads as `by (metric) label` here: turn it into a
            // selector and a grouping.
            let expr = if let Some(rest) = expr.strip_prefix("by (") {
                let (metric, label) = rest.split_once(") ").unwrap();
                format!("sum by ({label}) ({metric})")
            } else {
                expr.clone()
            };
            check(config, &sets, title, &expr, &mut problems);
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_query_reader_sees_selectors_and_groupings() {
    let (selectors, grouping) = read_query(
        r#"sum by (le, cluster_name) (rate(envoy_cluster_upstream_rq_time_bucket{cluster_name=~"$cluster", x="a,b}"}[1m])) / ignoring (reason) group_left sum by (cluster_name) (ewma_lb_steered_requests_total)"#,
    );
    assert_eq!(
        selectors,
        vec![
            (
                "envoy_cluster_upstream_rq_time_bucket".to_string(),
                vec!["cluster_name".to_string(), "x".to_string()]
            ),
            ("ewma_lb_steered_requests_total".to_string(), vec![])
        ]
    );
    assert_eq!(
        grouping,
        vec!["le", "cluster_name", "reason", "cluster_name"]
    );
    let sets = label_sets("# TYPE x counter\nenvoy_x{a=\"1,\\\"b\",c=\"\"} 1\newma_lb_y 2\n");
    assert_eq!(
        sets["envoy_x"],
        BTreeSet::from(["a".to_string(), "c".to_string()])
    );
    assert!(sets["ewma_lb_y"].is_empty());
}
