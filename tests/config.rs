//! Configuration: defaults, and the exact message for each kind of mistake.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::outcome::GrpcCode;
use ewma_lb::balance::pick::PickAlgorithm;
use ewma_lb::balance::smoothing::Smoother;
use ewma_lb::config::{Config, PluginConfig};

mod variants;
use variants::all_smoothers;

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn empty_and_braces_mean_all_defaults() {
    let defaults = PluginConfig::default()
        .compile()
        .unwrap_or_else(|e| panic!("the defaults must compile: {e}"));
    assert_eq!(Config::from_json(b""), Ok(defaults.clone()));
    assert_eq!(Config::from_json(b" {} "), Ok(defaults.clone()));
    let failures: Vec<&str> = defaults
        .grpc_failures()
        .iter()
        .map(GrpcCode::name)
        .collect();
    assert_eq!(
        failures,
        [
            "UNKNOWN",
            "DEADLINE_EXCEEDED",
            "RESOURCE_EXHAUSTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS"
        ]
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_full_configuration_parses() {
    let json = br#"{
        "override_header": "x-lb-host",
        "tick_period_ms": 100,
        "refresh_interval_ms": 2000,
        "smoothing": {"algorithm": "ewma", "alpha": 0.3},
        "weights": {"exponent": 1.5, "min_share": 0.02, "max_step_ratio": 1.5, "slow_start_ms": 0, "slow_start_min_factor": 0.2},
        "failure_penalty_ms": 2000,
        "grpc_failure_status_codes": ["UNAVAILABLE", "UNIMPLEMENTED"],
        "pick": "weighted_p2c",
        "exploration_share": 0.01,
        "host_ttl_ms": 30000,
        "max_hosts_per_cluster": 64,
        "outlier_detection": {"consecutive_failures": 5, "base_ejection_ms": 10000, "max_ejection_ms": 60000, "max_ejection_share": 0.3},
        "clusters": {"backend": {"endpoints": ["127.0.0.1:8081", "[::1]:8082"]}}
    }"#;
    let c = Config::from_json(json).unwrap_or_else(|e| panic!("{e}"));
    // Compiled into the core's units: durations in ns, latency in ms.
    assert_eq!(c.policy().smoother, Smoother::Ewma { alpha: 0.3 });
    assert_eq!(c.pick(), PickAlgorithm::WeightedP2c);
    assert_eq!(c.static_endpoints("backend").len(), 2);
    assert_eq!(c.policy().refresh_interval_ns, 2_000_000_000);
    assert_eq!(c.policy().host_ttl_ns, 30_000_000_000);
    assert_eq!(c.policy().weights.slow_start_ns, 0);
    assert_eq!(c.policy().outlier.base_ejection_ns, 10_000_000_000);
    assert_eq!(c.failure_penalty_ms(), 2000.0);
    assert_eq!(
        c.grpc_failures().iter().collect::<Vec<_>>(),
        [GrpcCode::Unimplemented, GrpcCode::Unavailable]
    );
    assert_eq!(c.tick_period().as_millis(), 100);
}

/// What the configuration's JSON form writes, it reads back as the same configuration: every
/// field the serializer knows (the schema tests compare those with the schema) is one the reader
/// knows, with the same names.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn every_field_written_reads_back() {
    let mut rich = PluginConfig::default();
    rich.clusters.insert(
        "backend".into(),
        ewma_lb::config::ClusterConfig {
            endpoints: vec!["127.0.0.1:8081".into()],
        },
    );
    rich.pick = PickAlgorithm::WeightedRandom;
    rich.shadow = true;
    for smoothing in all_smoothers() {
        let config = PluginConfig {
            smoothing,
            ..rich.clone()
        };
        let json = serde_json::to_vec(&config).unwrap();
        assert_eq!(
            PluginConfig::from_json(&json),
            Ok(config),
            "{}",
            String::from_utf8_lossy(&json)
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn invalid_configurations_name_the_field_and_the_value() {
    let cases: &[(&str, &str)] = &[
        (r#"{"weights": {"min_share": 0.9}}"#, "weights.min_share: must be in [0, 0.5], got 0.9"),
        (r#"{"weights": {"min_shares": 0.1}}"#, "weights.min_shares: unknown field `min_shares`, expected one of `exponent`, `min_share`, `min_fair_share`, `max_step_ratio`, `noise_band`, `noise_gain`, `slow_start_ms`, `slow_start_min_factor`"),
        (r#"{"refresh_interval": 5}"#, "refresh_interval: unknown field `refresh_interval`, expected one of `override_header`, `tick_period_ms`, `refresh_interval_ms`, `smoothing`, `weights`, `failure_penalty_ms`, `latency_ceiling_ms`, `persistence_ms`, `probe_interval_ms`, `probe_timeout_factor`, `pick`, `exploration_share`, `host_ttl_ms`, `max_hosts_per_cluster`, `outlier_detection`, `score`, `envoy_health`, `locality`, `steered_clusters`, `grpc_failure_status_codes`, `clusters`, `health_paths`, `management`, `excluded_paths`, `status_path`, `shadow`"),
        (r#"{"weights": {"exponent": "two"}}"#, "weights.exponent: invalid type: string \"two\", expected f64"),
        (r#"{"smoothing": {"algorithm": "ewma", "alpha": 1.5}}"#, "smoothing.alpha: must be in (0, 1], got 1.5"),
        (r#"{"smoothing": {"algorithm": "peak_ewma", "tau_ms": 0}}"#, "smoothing.tau_ms: must be in [1, 600000], got 0"),
        (r#"{"smoothing": {"algorithm": "sma", "window": 1000}}"#, "smoothing.window: must be in [1, 64], got 1000"),
        (r#"{"smoothing": {"algorithm": "dual_ewma", "short_tau_ms": 5000, "long_tau_ms": 1000}}"#, "smoothing.long_tau_ms: must be in [5000, 600000], got 1000"),
        (r#"{"smoothing": {"algorithm": "median"}}"#, "smoothing.algorithm: unknown variant `median`, expected one of `ewma`, `decay_ewma`, `peak_ewma`, `sma`, `bias_corrected_ewma`, `dual_ewma`"),
        (r#"{"smoothing": {"algorithm": "ewma", "alpha": 0.2, "beta": 1}}"#, "smoothing: `beta` is not a parameter of `ewma`, which takes `alpha`"),
        (r#"{"pick": "fastest"}"#, "pick: unknown variant `fastest`, expected one of `weighted_random`, `weighted_p2c`, `weighted_p2c_unless_equal`, `lowest_latency`"),
        (r#"{"override_header": "X-Host"}"#, "override_header: must be a lowercase HTTP header name, got \"X-Host\""),
        (r#"{"override_header": ""}"#, "override_header: must be a lowercase HTTP header name, got \"\""),
        (r#"{"override_header": ":authority"}"#, "override_header: must be a lowercase HTTP header name, got \":authority\""),
        // Headers HTTP or Envoy gives a meaning to: the plugin strips the client's copy of it.
        (r#"{"override_header": "authorization"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"authorization\""),
        (r#"{"override_header": "host"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"host\""),
        (r#"{"override_header": "content-length"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"content-length\""),
        (r#"{"override_header": "transfer-encoding"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"transfer-encoding\""),
        (r#"{"override_header": "cookie"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"cookie\""),
        (r#"{"override_header": "x-forwarded-for"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"x-forwarded-for\""),
        (r#"{"override_header": "x-envoy-original-dst-host"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"x-envoy-original-dst-host\""),
        (r#"{"override_header": "grpc-timeout"}"#, "override_header: must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got \"grpc-timeout\""),
        (r#"{"failure_penalty_ms": 0}"#, "failure_penalty_ms: must be in [1, 600000], got 0"),
        (r#"{"tick_period_ms": 5}"#, "tick_period_ms: must be in [10, 60000], got 5"),
        (r#"{"persistence_ms": 70000}"#, "persistence_ms: must be in [0, 60000], got 70000"),
        (r#"{"probe_interval_ms": 5}"#, "probe_interval_ms: must be in [10, 60000], got 5"),
        (r#"{"probe_timeout_factor": 0.5}"#, "probe_timeout_factor: must be in [1, 100], got 0.5 (or 0: off)"),
        (r#"{"probe_timeout_factor": -1}"#, "probe_timeout_factor: must be in [1, 100], got -1 (or 0: off)"),
        (r#"{"failure_penalty_ms": 2000, "latency_ceiling_ms": 1500}"#, "latency_ceiling_ms: must be in [2000, 3600000], got 1500"),
        (r#"{"tick_period_ms": 500, "refresh_interval_ms": 100}"#, "refresh_interval_ms: must be in [500, 600000], got 100"),
        (r#"{"exploration_share": 0.6}"#, "exploration_share: must be in [0, 0.5], got 0.6"),
        (r#"{"host_ttl_ms": 10}"#, "host_ttl_ms: must be in [250, 86400000], got 10"),
        (r#"{"max_hosts_per_cluster": 0}"#, "max_hosts_per_cluster: must be in [1, 16384], got 0"),
        (r#"{"outlier_detection": {"max_ejection_share": 2}}"#, "outlier_detection.max_ejection_share: must be in [0, 1], got 2"),
        (r#"{"outlier_detection": {"base_ejection_ms": 0}}"#, "outlier_detection.base_ejection_ms: must be in [1, 3600000], got 0"),
        (r#"{"locality": {"spillover_latency_ratio": 0.5}}"#, "locality.spillover_latency_ratio: must be in [1, 100], got 0.5"),
        (r#"{"locality": {"min_local_hosts": 0}}"#, "locality.min_local_hosts: must be in [1, 1000], got 0"),
        (r#"{"score": {"load_metric": "memory"}}"#, "score.load_metric: must be `auto`, `cpu_utilization`, `application_utilization`, `named_metrics.<name>` or `none`, got \"memory\""),
        (r#"{"score": {"load_metric": "named_metrics."}}"#, "score.load_metric: must be `auto`, `cpu_utilization`, `application_utilization`, `named_metrics.<name>` or `none`, got \"named_metrics.\""),
        (r#"{"score": {"max_utilization": 1}}"#, "score.max_utilization: must be in [0.5, 0.99], got 1"),
        (r#"{"score": {"load_weight": -1}}"#, "score.load_weight: must be in [0, 10], got -1"),
        (r#"{"score": {"error_weight": 11}}"#, "score.error_weight: must be in [0, 10], got 11"),
        (r#"{"score": {"cpu": 1}}"#, "score.cpu: unknown field `cpu`, expected one of `error_weight`, `load_weight`, `max_utilization`, `load_metric`"),
        (r#"{"envoy_health": {"admin_cluster": "envoy admin"}}"#, "envoy_health.admin_cluster: cluster names have no white space, got \"envoy admin\""),
        (r#"{"envoy_health": {"poll_interval_ms": 50}}"#, "envoy_health.poll_interval_ms: must be in [100, 60000], got 50"),
        (r#"{"locality": {"zone": "a"}}"#, "locality.zone: unknown field `zone`, expected one of `enabled`, `spillover_latency_ratio`, `min_local_hosts`"),
        (r#"{"clusters": {"backend": {"endpoints": ["localhost:80"]}}}"#, "clusters.backend.endpoints[0]: must be IP:port, got \"localhost:80\""),
        (r#"{"clusters": {"backend": {"endpoints": ["[0:0::1]:80"]}}}"#, "clusters.backend.endpoints[0]: must be written as Envoy writes the address, \"[::1]:80\", got \"[0:0::1]:80\""),
        (r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80", "[2001:DB8::1]:80"]}}}"#, "clusters.backend.endpoints[1]: must be written as Envoy writes the address, \"[2001:db8::1]:80\", got \"[2001:DB8::1]:80\""),
        (r#"{"clusters": {"backend": {"hosts": []}}}"#, "clusters.backend.hosts: unknown field `hosts`, expected `endpoints`"),
        (r#"{"steered_clusters": ["outbound|*|reviews"]}"#, "steered_clusters[0]: `*` may only end a prefix, got \"outbound|*|reviews\""),
        (r#"{"steered_clusters": ["a", ""]}"#, "steered_clusters[1]: must be a cluster name or a prefix ending in `*`, got \"\""),
        (r#"{"steered_clusters": ["backend "]}"#, "steered_clusters[0]: cluster names have no white space, got \"backend \""),
        (r#"{"steered_clusters": "backend"}"#, "steered_clusters: invalid type: string \"backend\", expected a sequence"),
        (r#"{"steered_clusters": ["other"], "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#, "clusters.backend: has static endpoints but is not in steered_clusters: the plugin would never steer it"),
        (r#"{"status_path": "status"}"#, "status_path: must be a normalised absolute path such as /ewma-lb/status, got \"status\""),
        (r#"{"status_path": "/Status//x"}"#, "status_path: must be a normalised absolute path such as /ewma-lb/status, got \"/Status//x\""),
        (r#"{"status_path": "/"}"#, "status_path: must not be the root: every request for / from outside the allowlist would get a 403, got \"/\""),
        (r#"{"status_path": "/ewma%2Fstatus"}"#, "status_path: must be a normalised absolute path such as /ewma-lb/status, got \"/ewma%2Fstatus\""),
        // Under a health path, the page could never be served: probes pass to the backend.
        (r#"{"status_path": "/actuator/health/lb"}"#, "status_path: must not be a health path: health_paths.prefix[0] \"/actuator/health\" matches it, and probes pass to the backend, so the page would be unreachable, got \"/actuator/health/lb\""),
        (r#"{"status_path": "/healthz/"}"#, "status_path: must not be a health path: health_paths.exact[1] \"/healthz\" matches it, and probes pass to the backend, so the page would be unreachable, got \"/healthz/\""),
        (r#"{"status_path": "/lb/status", "health_paths": {"prefix": ["/LB"]}}"#, "status_path: must not be a health path: health_paths.prefix[0] \"/LB\" matches it, and probes pass to the backend, so the page would be unreachable, got \"/lb/status\""),
        (r#"{"management": {"paths": {"prefix": ["/actuator/"]}}}"#, "management.paths.prefix[0]: must not end in '/', which would leave \"/actuator\" itself unguarded (write \"/actuator\": a prefix matches whole segments, so it covers everything under it), got \"/actuator/\""),
        (r#"{"grpc_failure_status_codes": ["resource-exhausted"]}"#, "grpc_failure_status_codes[0]: must be a gRPC status code name (write it as RESOURCE_EXHAUSTED), got \"resource-exhausted\""),
        (r#"{"grpc_failure_status_codes": ["UNAVAILABLE", "BROKEN"]}"#, "grpc_failure_status_codes[1]: must be a gRPC status code name (one of OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED), got \"BROKEN\""),
        (r#"{"grpc_failure_status_codes": ["CANCELLED"]}"#, "grpc_failure_status_codes[0]: CANCELLED is never a sample: the call was abandoned, most often by the client"),
        (r#"{"grpc_failure_status_codes": ["OK"]}"#, "grpc_failure_status_codes[0]: OK is a success, not a failure"),
        (r#"{"grpc_failure_status_codes": [14]}"#, "grpc_failure_status_codes[0]: invalid type: integer `14`, expected a string"),
        (r#"{"shadow": "yes"}"#, "shadow: invalid type: string \"yes\", expected a boolean"),
        (r#"[1, 2]"#, "config: must be a JSON object"),
        // Not JSON at all: where the parser stopped.
        (r#"{"weights": "#, "config: EOF while parsing a value at line 1 column 12"),
        (r#"{"weights": {"slow_start_ms": -5}}"#, "weights.slow_start_ms: invalid value: integer `-5`, expected u64"),
        (r#"{"weights": {"slow_start_ms": 1.5}}"#, "weights.slow_start_ms: invalid type: floating point `1.5`, expected u64"),
        (r#"{"steered_clusters": "backend"}"#, "steered_clusters: invalid type: string \"backend\", expected a sequence"),
        (r#"{"clusters": {"backend": {"endpoints": [1]}}}"#, "clusters.backend.endpoints[0]: invalid type: integer `1`, expected a string"),
        (r#"{"smoothing": {"tau_ms": 100}}"#, "smoothing: missing field `algorithm`"),
        (r#"{"management": {"paths": {"prefix": "/x"}}}"#, "management.paths.prefix: invalid type: string \"/x\", expected a sequence"),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter_map(|(json, want)| match Config::from_json(json.as_bytes()) {
            Ok(_) => Some(format!("accepted {json}")),
            Err(e) if e.to_string() != *want => Some(format!("{json}\n  got  {e}\n  want {want}")),
            Err(_) => None,
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The neighbours of the configurations refused above: each is fine and accepted.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_neighbours_of_refused_configurations_are_accepted() {
    for json in [
        r#"{"override_header": "x-lb-host"}"#,
        r#"{"override_header": "x-envoy"}"#,
        r#"{"override_header": "hosts"}"#,
        r#"{"failure_penalty_ms": 1}"#,
        r#"{"score": {"load_metric": "named_metrics.queue_depth", "load_weight": 0, "error_weight": 0, "max_utilization": 0.99}}"#,
        r#"{"score": {"load_metric": "none"}}"#,
        r#"{"envoy_health": {"admin_cluster": "envoy_admin", "poll_interval_ms": 100}}"#,
        r#"{"status_path": "/actuator/healthdump"}"#,
        r#"{"status_path": "/healthz/lb"}"#,
        r#"{"status_path": "/a"}"#,
        r#"{"management": {"paths": {"prefix": ["/"]}}}"#,
        r#"{"management": {"paths": {"prefix": ["/actuator"], "exact": ["/debug/vars"]}}}"#,
        r#"{"excluded_paths": {"prefix": ["/events.v1.Stream/"]}}"#,
        r#"{"health_paths": {"prefix": ["/actuator/health/"]}}"#,
    ] {
        assert!(
            Config::from_json(json.as_bytes()).is_ok(),
            "{json}: {:?}",
            Config::from_json(json.as_bytes()).err()
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn steered_clusters_match_exact_names_and_prefixes() {
    let reviews = "outbound|9080|ewma-lb|reviews.default.svc.cluster.local";
    let steers = |json: &str, cluster: &str| {
        Config::from_json(json.as_bytes())
            .unwrap_or_else(|e| panic!("{json}: {e}"))
            .steers(cluster)
    };
    let cases: &[(&str, &str, bool)] = &[
        // The default steers every cluster, as before the option existed.
        ("{}", "backend", true),
        ("{}", reviews, true),
        (r#"{"steered_clusters": ["*"]}"#, "anything", true),
        // An empty list steers nothing, as an empty allowlist allows nothing.
        (r#"{"steered_clusters": []}"#, "backend", false),
        (
            r#"{"steered_clusters": ["outbound|9080|ewma-lb|reviews.default.svc.cluster.local"]}"#,
            reviews,
            true,
        ),
        (
            r#"{"steered_clusters": ["outbound|9080|ewma-lb|reviews.default.svc.cluster.local"]}"#,
            "outbound|9080||reviews.default.svc.cluster.local",
            false,
        ),
        (
            r#"{"steered_clusters": ["outbound|9080|ewma-lb|reviews.default.svc.cluster.local"]}"#,
            "outbound|9080|ewma-lb|reviews.default.svc.cluster.local.",
            false,
        ),
        (
            r#"{"steered_clusters": ["httproute/default/reviews/*"]}"#,
            "httproute/default/reviews/rule/0",
            true,
        ),
        (
            r#"{"steered_clusters": ["httproute/default/reviews/*"]}"#,
            "httproute/default/reviewsx/rule/0",
            false,
        ),
        (
            r#"{"steered_clusters": ["httproute/default/reviews/*"]}"#,
            "httproute/default/reviews/",
            true,
        ),
        (r#"{"steered_clusters": ["a", "b*"]}"#, "bee", true),
        (r#"{"steered_clusters": ["a", "b*"]}"#, "ab", false),
    ];
    for (json, cluster, want) in cases {
        assert_eq!(steers(json, cluster), *want, "{json} steers {cluster:?}");
    }
}

/// An allowlist beyond loopback gets a start-up warning naming the field and what it admits
/// beyond loopback; the default, or loopback listed again, gets none.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_allowlist_beyond_loopback_is_warned_of() {
    let warning = |json: &str| {
        Config::from_json(json.as_bytes())
            .unwrap()
            .guard_warning()
            .map(str::to_owned)
    };
    assert_eq!(warning("{}"), None);
    assert_eq!(
        warning(r#"{"management": {"allowed_cidrs": ["::1/128", "127.0.0.0/8"]}}"#),
        None
    );
    let w = warning(r#"{"management": {"allowed_cidrs": ["127.0.0.0/8", "10.0.0.0/8"]}}"#).unwrap();
    assert!(
        w.starts_with("management.allowed_cidrs admits \"10.0.0.0/8\":")
            && w.contains("use_remote_address"),
        "{w}"
    );
}
