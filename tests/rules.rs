//! Path rules and the management allowlist, case by case.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::config::Config;
use ewma_lb::rules::{normalize, PathClass, Rules};

fn rules(json: &str) -> Rules {
    Config::from_json(json.as_bytes()).map(|c| c.rules().clone()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn paths_are_compared_normalised() {
    let cases = [
        ("/", "/"),
        ("", "/"),
        ("/a/b?x=/actuator", "/a/b"),
        ("//actuator///env", "/actuator/env"),
        ("/Actuator/ENV", "/actuator/env"),
        ("/%61ctuator/env", "/actuator/env"),
        ("/%2561ctuator/env", "/actuator/env"),
        ("/%25252561ctuator/env", "/actuator/env"),
        ("/actuator%3Fx/env", "/actuator%3fx/env"),
        ("/%3f", "/%3f"),
        ("/x/../actuator/./env", "/actuator/env"),
        ("/../../actuator", "/actuator"),
        ("/actuator;jsessionid=1/env", "/actuator/env"),
        ("\\actuator\\env", "/actuator/env"),
        ("/actuator/", "/actuator/"),
        ("/bad%zzescape", "/bad%zzescape"),
        ("/%ff%fe", "/%ff%fe"),
        ("//", "/"),
        ("/a/", "/a/"),
        ("/a//", "/a/"),
        ("/a/.", "/a"),
        ("/a/b.json", "/a/b.json"),
        ("/.well-known/x", "/.well-known/x"),
        ("relative/path", "/relative/path"),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize(raw), want, "{raw:?}");
        assert_eq!(normalize(want), want, "normalising twice changes nothing: {want:?}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn default_rules_classify_the_seed_paths() {
    let r = rules("{}");
    let cases = [
        ("/actuator/health", PathClass::Health),
        ("/actuator/health/readiness", PathClass::Health),
        ("/health", PathClass::Health),
        ("/status?verbose=1", PathClass::Health),
        ("/ready", PathClass::Health),
        ("/actuator/metrics", PathClass::Management),
        ("/actuator/prometheus", PathClass::Management),
        ("/actuator", PathClass::Management),
        ("/ACTUATOR/env", PathClass::Management),
        ("/actuator/health/../env", PathClass::Management),
        ("/actuator/%2e%2e/actuator/env", PathClass::Management),
        ("/healthy-orders", PathClass::Business),
        ("/api/status/1", PathClass::Business),
        ("/", PathClass::Business),
    ];
    for (path, want) in cases {
        assert_eq!(r.classify(path), want, "{path}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_allowlist_checks_envoys_client_address() {
    let r = rules("{}");
    let cases = [
        (Some("127.0.0.1:50000"), true),
        (Some("10.2.3.4:1"), true),
        (Some("172.31.255.255:1"), true),
        (Some("172.32.0.1:1"), false),
        (Some("[::1]:8080"), true),
        (Some("[fd00::1]:8080"), true),
        (Some("[::ffff:192.168.1.9]:80"), true),
        (Some("203.0.113.7:443"), false),
        (Some("[2001:db8::1]:443"), false),
        (Some("/var/run/envoy.sock"), false),
        (Some("garbage"), false),
        (None, false),
    ];
    for (source, want) in cases {
        assert_eq!(r.management_allowed(source), want, "{source:?}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn custom_rules_and_their_errors() {
    let r = rules(r#"{"health_paths": {"exact": ["/ping"]}, "excluded_paths": {"prefix": ["/upload"]},
                     "management": {"paths": {"prefix": ["/admin/"]}, "allowed_cidrs": ["192.0.2.10"]}}"#);
    assert_eq!(r.classify("/ping"), PathClass::Health);
    assert_eq!(r.classify("/health"), PathClass::Business, "replacing the list drops the defaults");
    assert_eq!(r.classify("/upload/big"), PathClass::Excluded);
    assert_eq!(r.classify("/admin/users"), PathClass::Management);
    assert!(r.management_allowed(Some("192.0.2.10:1")));
    assert!(!r.management_allowed(Some("192.0.2.11:1")));
    let cases = [
        (r#"{"management": {"allowed_cidrs": ["10.0.0/8"]}}"#, "management.allowed_cidrs[0]: must be a CIDR such as 10.0.0.0/8 or an IP address, got \"10.0.0/8\""),
        (r#"{"health_paths": {"exact": ["health"]}}"#, "health_paths.exact[0]: must start with '/' and be at most 1024 bytes, got \"health\""),
        (r#"{"excluded_paths": {"prefix": ["/ok", "nope"]}}"#, "excluded_paths.prefix[1]: must start with '/' and be at most 1024 bytes, got \"nope\""),
        (r#"{"management": {"paths": {"regex": ".*"}}}"#, "management.paths.regex: unknown field `regex`, expected `exact` or `prefix`"),
        (r#"{"management": {"trusted_hops": 1}}"#, "management.trusted_hops: unknown field `trusted_hops`, expected `paths` or `allowed_cidrs`"),
    ];
    for (json, want) in cases {
        assert_eq!(Config::from_json(json.as_bytes()).map(|_| ()).map_err(|e| e.to_string()), Err(want.to_string()), "{json}");
    }
}

#[cfg(not(target_arch = "wasm32"))]
proptest::proptest! {
    #[test]
    fn normalising_is_idempotent(raw in "[/a-zA-Z0-9%.;\\\\?#_~-]{0,40}") {
        let once = normalize(&raw).into_owned();
        proptest::prop_assert_eq!(normalize(&once), once.as_str());
        proptest::prop_assert!(once.starts_with('/'));
    }
}
