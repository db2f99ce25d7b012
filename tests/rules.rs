//! Path rules and the management allowlist, case by case.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use std::borrow::Cow;

use ewma_lb::config::Config;
use ewma_lb::rules::{normalize, normalize_bytes, PathClass, Rules};

fn rules(json: &str) -> Rules {
    Config::from_json(json.as_bytes())
        .map(|c| c.rules().clone())
        .unwrap_or_else(|e| panic!("{e}"))
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
        ("/actuator/", "/actuator/"),
        ("/bad%zzescape", "/bad%zzescape"),
        ("/%", "/%"),
        ("/%%41", "/%a"),
        ("/100%25", "/100%"),
        ("/%253F/x", "/%3f/x"),
        ("/%2523", "/%23"),
        ("/a%3Bv=1/b", "/a/b"),
        ("/a%2Eb/c.%2e", "/a.b/c.."),
        ("/a/.../b", "/a/.../b"),
        ("/a;x/..", "/"),
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
        assert!(!normalize(raw).is_ambiguous(), "{raw:?}");
        assert_eq!(
            normalize(want),
            want,
            "normalising twice changes nothing: {want:?}"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn paths_are_decoded_as_bytes_and_the_ambiguous_ones_flagged() {
    let cases: [(&[u8], &[u8], bool); 37] = [
        // One escape that is not UTF-8 no longer keeps the others encoded.
        (b"/%ff%fe", b"/\xff\xfe", false),
        (b"/%2561ctuator/env%FF", b"/actuator/env\xff", false),
        (b"/actuator/health%FF/..%2Fenv", b"/actuator/env", true),
        // A separator that came from decoding, at any level, or any backslash: nginx and Go read
        // a segment break where Tomcat and Express read a byte.
        (b"/a%2Fb", b"/a/b", true),
        (b"/a%2fb", b"/a/b", true),
        (b"/a%5Cb", b"/a/b", true),
        (b"/a%5cb", b"/a/b", true),
        (b"/a%252Fb", b"/a/b", true),
        (b"/a%25252fb", b"/a/b", true),
        (b"/a%252525252F", b"/a%2f", true),
        (b"/a%2Fb/..%5Cc", b"/a/c", true),
        (b"\\actuator\\env", b"/actuator/env", true),
        (b"/a\\", b"/a/", true),
        // A dot segment spelt with an escape, or one only once its parameters are dropped.
        (b"/a/%2e%2e/b", b"/b", true),
        (b"/a/.%2E/b", b"/b", true),
        (b"/a/%2e/b", b"/a/b", true),
        (b"/a/%252e%252e/b", b"/b", true),
        (b"/a/..;/b", b"/b", true),
        (b"/a/..;x=1/b", b"/b", true),
        (b"/a/.;/b", b"/a/b", true),
        (b"/a/..%3B/b", b"/b", true),
        (b"/x/\xff/y?\xff", b"/x/\xff/y", false),
        (b"/caf%C3%A9", "/caf\u{e9}".as_bytes(), false),
        // MAX_DECODINGS levels decode; one more is left encoded, and flagged.
        (b"/%25252561", b"/a", false),
        (b"/%2525252561", b"/%61", true),
        (b"/%25252525252e%25252525252e/x", b"/%252e%252e/x", true),
        // A NUL, CR, LF or DEL may end or split the path for the backend.
        (b"/actuator/env%00/../../health", b"/health", true),
        (b"/api/orders%0a", b"/api/orders\n", true),
        (b"/a%0D", b"/a\r", true),
        (b"/a%7f", b"/a\x7f", true),
        (b"/a\x00", b"/a\x00", true),
        (b"/a%2500", b"/a\x00", true),
        // Overlong UTF-8: `.`, `/` and `\` to lenient decoders.
        (
            b"/actuator/health/%c0%ae%c0%ae/env",
            b"/actuator/health/\xc0\xae\xc0\xae/env",
            true,
        ),
        (b"/%e0%80%af", b"/\xe0\x80\xaf", true),
        (b"/%f0%80%80%ae", b"/\xf0\x80\x80\xae", true),
        (b"/%c1%9c", b"/\xc1\x9c", true),
        // Latin-1 and other non-UTF-8 bytes are compared as they are.
        (b"/%e9t%e9", b"/\xe9t\xe9", false),
    ];
    for (raw, want, ambiguous) in cases {
        let got = normalize_bytes(raw);
        assert_eq!(
            (got.as_bytes(), got.is_ambiguous()),
            (want, ambiguous),
            "{}",
            raw.escape_ascii()
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_normal_path_is_borrowed_not_copied() {
    for raw in [
        "/",
        "/api/orders/42",
        "/api/orders/42?sort=Desc#Top",
        "/a/b.json",
        "/.well-known/x",
        "/a/",
    ] {
        assert!(
            matches!(normalize(raw).into_bytes(), Cow::Borrowed(_)),
            "{raw}"
        );
    }
    for raw in [
        "", "/API", "/a//b", "/a/./b", "/a/../b", "/a%41", "/a;b", "/a\\b", "//",
    ] {
        assert!(
            matches!(normalize(raw).into_bytes(), Cow::Owned(_)),
            "{raw}"
        );
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
        // Finding 3 of issue 8: an escape that was not UTF-8 kept the whole path encoded.
        ("/%2561ctuator/env%FF", PathClass::Management),
        ("/actuator/health%FF/..%2Fenv", PathClass::Management),
        ("/actuator/health/%c0%ae%c0%ae/env", PathClass::Management),
        ("/actuator/env%00/../../health", PathClass::Management),
        ("/%25252561ctuator/health", PathClass::Health),
        ("/%2525252561ctuator/health", PathClass::Management),
        ("/%2525252561pi/orders", PathClass::Management),
        // An encoded dot segment is read as one by some backends only: guarded.
        ("/api/%2e%2e/health", PathClass::Management),
        ("/api/../health", PathClass::Health),
        ("/api/orders/%E2%82%AC", PathClass::Business),
        ("/api/orders/%ff", PathClass::Business),
        ("/healthy-orders", PathClass::Business),
        ("/api/status/1", PathClass::Business),
        ("/", PathClass::Business),
    ];
    for (path, want) in cases {
        assert_eq!(r.classify(path), want, "{path}");
        assert_eq!(r.classify_bytes(path.as_bytes()), want, "{path}");
    }
    // Finding 1 of issue 8: 20 000 nested %25 held an Envoy worker 13 s.
    let nested = format!("/%{}61", "25".repeat(20_000));
    assert_eq!(r.classify(&nested), PathClass::Management);
    assert_eq!(r.classify_bytes(b"/api/\xff/orders"), PathClass::Business);
}

/// Issue 22: with the shipped rules (management prefix `/actuator`, health prefix
/// `/actuator/health`) each of these reached a backend that reads it as a management path
/// (Spring's `/actuator/env/{name}`, a handler for everything under `/actuator`), because the
/// rules read an encoded separator or dot as structure, or matched a health prefix inside a
/// segment. Each family beside its benign neighbours, which keep their class.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn encoded_separators_and_partial_segments_do_not_bypass_the_guard() {
    use PathClass::{Business, Health, Management};
    let r = rules("{}");
    let cases = [
        // `..` across an encoded slash: `/health` to nginx or Go, under `/actuator` to Tomcat.
        ("/actuator/..%2Fhealth", Management),
        ("/actuator/env/..%2F..%2Fhealth", Management),
        ("/actuator/env%2F..%2F..%2Fhealth", Management),
        ("/actuator/env/..%2f..%2fhealth", Management),
        ("/actuator/health/..%2F..%2Fenv", Management),
        // Encoded backslashes, and plain ones (Windows backends split on them).
        ("/actuator/env/..%5C..%5Chealth", Management),
        ("/actuator/env/..%5c..%5chealth", Management),
        ("/actuator/env\\..\\..\\health", Management),
        ("\\health", Management),
        // Encoded more than once: Envoy leaves `%25`, each layer behind it may decode once more.
        ("/actuator/env/..%252F..%252Fhealth", Management),
        ("/actuator/env%252f..%252f..%252fhealth", Management),
        ("/actuator/env/..%25252F..%25252Fhealth", Management),
        ("/actuator/env/..%25255C..%25255Chealth", Management),
        (
            "/actuator/env/..%2525252525252F..%2525252525252Fhealth",
            Management,
        ),
        // Dot segments a backend reads as data, or that only Tomcat resolves.
        ("/actuator/env/%2e%2e/%2e%2e/health", Management),
        ("/actuator/env/%252e%252e/%252e%252e/health", Management),
        ("/actuator/env/.%2E/.%2e/health", Management),
        ("/actuator/env/..;/..;/health", Management),
        ("/actuator/env/..;x=1/..%3B/health", Management),
        // A separator anywhere is ambiguous, so a business path holding one is guarded too.
        ("/api/projects/group%2Fproject", Management),
        ("/api/files/a%5Cb", Management),
        // Prefixes match whole segments.
        ("/actuator/healthdump", Management),
        ("/actuator/health-dump", Management),
        ("/actuator/healthz", Management),
        ("/actuator/health.json", Management),
        ("/actuator", Management),
        ("/actuator/", Management),
        ("/actuator/env/", Management),
        ("/actuatorx", Business),
        ("/actuator-ui/index.html", Business),
        ("/actuator.json", Business),
        // Exact paths match with or without a trailing slash, nothing longer.
        ("/status/", Health),
        ("/statusx", Business),
        ("/status/x", Business),
        ("/healthz", Health),
        ("/healthz/", Health),
        ("/healthzz", Business),
        // Benign neighbours: the encoding is in the query, or is not a separator or dot segment.
        ("/api/orders?next=%2Fapi%2Forders%3Fpage%3D2", Business),
        ("/search?q=a%5Cb&r=..%2F..%2F", Business),
        ("/actuator/health?probe=..%2F..%2Fenv", Health),
        ("/actuator/health/liveness", Health),
        ("/actuator/health/readiness/", Health),
        ("/actuator/health", Health),
        ("/api/v1/../v2/orders", Business),
        ("/api/report%2Ev2.pdf", Business),
        ("/api/a/.../b", Business),
        ("/api;v=1/orders", Business),
        ("/api/caf%C3%A9", Business),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(path, want)| r.classify(path) != *want)
        .map(|(path, want)| format!("{path}: {:?}, want {want:?}", r.classify(path)))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Segment matching with rules of the operator's own, health inside management as in the
/// default.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn prefixes_match_whole_segments() {
    use PathClass::{Business, Excluded, Health, Management};
    let r = rules(
        r#"{"health_paths": {"exact": ["/admin/ping"], "prefix": ["/admin/health"]},
            "management": {"paths": {"exact": ["/debug"], "prefix": ["/admin", "/internal/x"]}},
            "excluded_paths": {"prefix": ["/stream", "/events.v1.Stream/"]}}"#,
    );
    let cases = [
        ("/admin", Management),
        ("/admin/", Management),
        ("/admin/users", Management),
        ("/administrator", Business),
        ("/admin/ping", Health),
        ("/admin/ping/", Health),
        ("/admin/ping/x", Management),
        ("/admin/pingx", Management),
        ("/admin/health", Health),
        ("/admin/health/db", Health),
        ("/admin/healthy", Management),
        ("/debug", Management),
        ("/debug/", Management),
        ("/debug/x", Business),
        ("/internal/x", Management),
        ("/internal/x/y", Management),
        ("/internal/xy", Business),
        ("/internal", Business),
        ("/stream", Excluded),
        ("/stream/1", Excluded),
        ("/streams", Business),
        ("/events.v1.Stream/Watch", Excluded),
        ("/events.v1.Stream", Business),
    ];
    for (path, want) in cases {
        assert_eq!(r.classify(path), want, "{path}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_allowlist_checks_envoys_client_address() {
    // The default is loopback only: behind a load balancer or NAT with a private address every
    // client would look internal. Operators list their ranges, as in docs/configuration.md's
    // example.
    let by_default = rules("{}");
    let listed = rules(
        r#"{"management": {"allowed_cidrs": ["127.0.0.0/8", "::1/128", "10.20.0.0/16", "fd00:20::/48", "192.0.2.10"]}}"#,
    );
    // (client, allowed by default, allowed with docs/configuration.md's list)
    let cases = [
        (Some("127.0.0.1:50000"), true, true),
        (Some("127.9.9.9:1"), true, true),
        (Some("[::1]:8080"), true, true),
        (Some("[::ffff:127.0.0.1]:80"), true, true),
        (Some("10.20.3.4:1"), false, true),
        (Some("10.21.3.4:1"), false, false),
        (Some("172.31.255.255:1"), false, false),
        (Some("192.168.1.9:80"), false, false),
        (Some("[::ffff:192.168.1.9]:80"), false, false),
        (Some("[fd00:20::7]:8080"), false, true),
        (Some("[fd00::1]:8080"), false, false),
        (Some("192.0.2.10:1"), false, true),
        (Some("192.0.2.11:1"), false, false),
        (Some("203.0.113.7:443"), false, false),
        (Some("[2001:db8::1]:443"), false, false),
        (Some("/var/run/envoy.sock"), false, false),
        (Some("garbage"), false, false),
        (None, false, false),
    ];
    for (source, default_allows, list_allows) in cases {
        let got = (
            by_default.management_allowed(source),
            listed.management_allowed(source),
        );
        assert_eq!(got, (default_allows, list_allows), "{source:?}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn custom_rules_and_their_errors() {
    let r = rules(
        r#"{"health_paths": {"exact": ["/ping"]}, "excluded_paths": {"prefix": ["/upload"]},
                     "management": {"paths": {"prefix": ["/admin"]}, "allowed_cidrs": ["192.0.2.10"]}}"#,
    );
    assert_eq!(r.classify("/ping"), PathClass::Health);
    assert_eq!(
        r.classify("/health"),
        PathClass::Business,
        "replacing the list drops the defaults"
    );
    assert_eq!(r.classify("/upload/big"), PathClass::Excluded);
    assert_eq!(r.classify("/admin/users"), PathClass::Management);
    assert!(r.management_allowed(Some("192.0.2.10:1")));
    assert!(!r.management_allowed(Some("192.0.2.11:1")));
    let cases = [
        (r#"{"management": {"allowed_cidrs": ["10.0.0/8"]}}"#, "management.allowed_cidrs[0]: must be a CIDR such as 10.0.0.0/8 or an IP address, got \"10.0.0/8\""),
        (r#"{"health_paths": {"exact": ["health"]}}"#, "health_paths.exact[0]: must start with '/' and be at most 1024 bytes, got \"health\""),
        (r#"{"excluded_paths": {"prefix": ["/ok", "nope"]}}"#, "excluded_paths.prefix[1]: must start with '/' and be at most 1024 bytes, got \"nope\""),
        (r#"{"health_paths": {"exact": ["/ok%00"]}}"#, "health_paths.exact[0]: must not hold a backslash, an encoded separator or dot segment, a control byte, or an escape left after 4 decodings, got \"/ok%00\""),
        (r#"{"management": {"paths": {"prefix": ["/%2525252561"]}}}"#, "management.paths.prefix[0]: must not hold a backslash, an encoded separator or dot segment, a control byte, or an escape left after 4 decodings, got \"/%2525252561\""),
        (r#"{"excluded_paths": {"prefix": ["/files/a%2Fb"]}}"#, "excluded_paths.prefix[0]: must not hold a backslash, an encoded separator or dot segment, a control byte, or an escape left after 4 decodings, got \"/files/a%2Fb\""),
        (r#"{"health_paths": {"prefix": ["/a\\b"]}}"#, "health_paths.prefix[0]: must not hold a backslash, an encoded separator or dot segment, a control byte, or an escape left after 4 decodings, got \"/a\\\\b\""),
        // A guarded path ending in a slash leaves the path itself open.
        (r#"{"management": {"paths": {"prefix": ["/actuator/"]}}}"#, "management.paths.prefix[0]: must not end in '/', which would leave \"/actuator\" itself unguarded (write \"/actuator\": a prefix matches whole segments, so it covers everything under it), got \"/actuator/\""),
        (r#"{"management": {"paths": {"prefix": ["/x", "/Admin//"]}}}"#, "management.paths.prefix[1]: must not end in '/', which would leave \"/admin\" itself unguarded (write \"/admin\": a prefix matches whole segments, so it covers everything under it), got \"/Admin//\""),
        (r#"{"management": {"paths": {"exact": ["/actuator/env/"]}}}"#, "management.paths.exact[0]: must not end in '/', which would leave \"/actuator/env\" itself unguarded (write \"/actuator/env\": an exact path matches with or without a trailing slash), got \"/actuator/env/\""),
        (r#"{"management": {"paths": {"regex": ".*"}}}"#, "management.paths.regex: unknown field `regex`, expected `exact` or `prefix`"),
        (r#"{"management": {"trusted_hops": 1}}"#, "management.trusted_hops: unknown field `trusted_hops`, expected `paths` or `allowed_cidrs`"),
    ];
    for (json, want) in cases {
        assert_eq!(
            Config::from_json(json.as_bytes())
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(want.to_string()),
            "{json}"
        );
    }
}

// === Properties: bounded work, idempotence, deep nesting guarded ===

#[cfg(not(target_arch = "wasm32"))]
mod properties {
    use ewma_lb::config::{compile_rules, ManagementConfig, PathSet};
    use ewma_lb::rules::{
        normalize_bytes, normalize_counting, PathClass, Rules, MAX_DECODINGS, MAX_SCANNED_PER_BYTE,
    };
    use proptest::prelude::*;

    /// The longest path the properties try: above Envoy's default header limit (60 KiB).
    const MAX_PATH: usize = 64 * 1024;

    /// Pieces an attacker repeats: nested `%25`, runs of `%`, dot segments plain and encoded,
    /// separators, parameters, control and overlong bytes.
    const PIECES: &[&[u8]] = &[
        b"%25",
        b"%",
        b"%%",
        b"%2",
        b"25",
        b"61",
        b"/..",
        b"/.",
        b"/a/..",
        b"%2e%2e%2f",
        b"..%2f",
        b"..\\",
        b"//",
        b";",
        b";x=/..",
        b"%252e%252e/",
        b"%2525",
        b"%00",
        b"%c0%ae",
        b"\xff",
        b"/actuator",
        b"/health",
        b"?",
        b"#",
        b"%3f",
        b"a",
        b"A/",
    ];

    /// Health everywhere: a path classified otherwise was guarded before any rule. Compiled
    /// without a `Config`, which refuses rules that leave its status page unreachable.
    fn everything_is_health() -> Rules {
        let health = PathSet {
            exact: vec![],
            prefix: vec!["/".into()],
        };
        let management = ManagementConfig {
            paths: PathSet::default(),
            allowed_cidrs: vec![],
        };
        compile_rules(&health, &management, &PathSet::default()).unwrap()
    }

    /// `pieces` (index, repeats) concatenated in turn until `len` bytes.
    fn adversarial(pieces: &[(usize, usize)], len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 64);
        out.push(b'/');
        'fill: loop {
            for &(piece, repeats) in pieces {
                for _ in 0..repeats {
                    if out.len() >= len {
                        break 'fill;
                    }
                    out.extend_from_slice(PIECES[piece % PIECES.len()]);
                }
            }
        }
        out.truncate(len.max(1));
        out
    }

    /// `path` percent-encoded `levels` times: level one encodes the bytes `mask` picks and the
    /// first one it may (so something is encoded), every later level encodes each `%` again.
    /// Decoding it `levels` times gives back `path`. Unless `structure`, separators and dots
    /// stay as they are: encoded, they make the path ambiguous.
    fn encode(path: &[u8], levels: usize, mask: &[bool], structure: bool) -> Vec<u8> {
        let may = |b: u8| structure || !matches!(b, b'/' | b'\\' | b'.');
        let first = path.iter().position(|&b| may(b));
        let mut current = path.to_vec();
        for level in 0..levels {
            let mut next = Vec::with_capacity(current.len() * 3);
            for (i, &b) in current.iter().enumerate() {
                let picked = level == 0
                    && may(b)
                    && (Some(i) == first
                        || mask.get(i % mask.len().max(1)).copied().unwrap_or(false));
                if b == b'%' || picked {
                    next.extend_from_slice(format!("%{b:02X}").as_bytes());
                } else {
                    next.push(b);
                }
            }
            current = next;
        }
        current
    }

    fn check_bounded(raw: &[u8]) -> Result<(), TestCaseError> {
        let (normal, scanned) = normalize_counting(raw);
        prop_assert!(
            scanned <= MAX_SCANNED_PER_BYTE * raw.len(),
            "{scanned} bytes scanned for a path of {} ({} per byte allowed)",
            raw.len(),
            MAX_SCANNED_PER_BYTE
        );
        prop_assert!(normal.as_bytes().starts_with(b"/"));
        if normal.is_ambiguous() {
            prop_assert_eq!(
                everything_is_health().classify_bytes(raw),
                PathClass::Management
            );
        } else {
            let again = normalize_bytes(normal.as_bytes());
            prop_assert_eq!(
                again.as_bytes(),
                normal.as_bytes(),
                "normalising twice changes nothing"
            );
            prop_assert!(!again.is_ambiguous());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        #[test]
        fn nested_percent_chains_cost_a_constant_per_byte(depth in 0usize..(MAX_PATH - 4) / 2, last in "[0-9a-fA-F]{2}") {
            let raw = format!("/%{}{last}", "25".repeat(depth));
            check_bounded(raw.as_bytes())?;
            if depth >= MAX_DECODINGS {
                prop_assert_eq!(everything_is_health().classify(&raw), PathClass::Management);
            }
        }

        #[test]
        fn adversarial_paths_cost_a_constant_per_byte(
            pieces in prop::collection::vec((0usize..64, 1usize..20_000), 1..6),
            len in 1usize..=MAX_PATH,
        ) {
            check_bounded(&adversarial(&pieces, len))?;
        }
    }

    proptest! {
        #[test]
        fn any_bytes_cost_a_constant_per_byte(raw in prop::collection::vec(any::<u8>(), 0..2048)) {
            check_bounded(&raw)?;
        }

        #[test]
        fn paths_of_escapes_cost_a_constant_per_byte(
            raw in prop::collection::vec(prop::sample::select(b"/%%%2255.;\\?#aAfF0\x00\xc0\xae".to_vec()), 0..2048),
        ) {
            check_bounded(&raw)?;
        }

        #[test]
        fn normalising_is_idempotent(raw in "[/a-zA-Z0-9%.;\\\\?#_~-]{0,40}") {
            check_bounded(raw.as_bytes())?;
        }

        #[test]
        fn paths_within_the_decoding_rounds_decode_fully(
            path in "/[/a-zA-Z0-9._;~\\\\-]{0,40}",
            levels in 1usize..=MAX_DECODINGS,
            mask in prop::collection::vec(any::<bool>(), 1..8),
        ) {
            let encoded = encode(path.as_bytes(), levels, &mask, false);
            let normal = normalize_bytes(&encoded);
            let plain = normalize_bytes(path.as_bytes());
            prop_assert_eq!(normal.as_bytes(), plain.as_bytes());
            prop_assert_eq!(normal.is_ambiguous(), plain.is_ambiguous(), "{}", encoded.escape_ascii());
            check_bounded(&encoded)?;
        }

        #[test]
        fn an_encoded_separator_is_always_guarded(
            before in "[/a-zA-Z0-9._;~-]{0,20}",
            after in "[/a-zA-Z0-9._;~-]{0,20}",
            separator in prop::sample::select(vec!["2F", "2f", "5C", "5c"]),
            nesting in 0usize..=MAX_DECODINGS + 2,
            query in prop::sample::select(vec!["", "?a=%2F", "#%5C"]),
        ) {
            let raw = format!("/{before}%{}{separator}{after}{query}", "25".repeat(nesting));
            prop_assert!(normalize_bytes(raw.as_bytes()).is_ambiguous(), "{}", raw);
            prop_assert_eq!(everything_is_health().classify(&raw), PathClass::Management);
            check_bounded(raw.as_bytes())?;
        }

        #[test]
        fn an_encoded_separator_in_the_query_changes_nothing(
            path in "/[/a-zA-Z0-9_~-]{0,30}",
            query in "[a-zA-Z0-9=&]{0,10}(%2F|%5C|%252F|\\.\\.%2F){1,3}[a-zA-Z0-9=&]{0,10}",
        ) {
            let with_query = format!("{path}?{query}");
            let (normal, plain) = (normalize_bytes(with_query.as_bytes()), normalize_bytes(path.as_bytes()));
            prop_assert_eq!(normal.as_bytes(), plain.as_bytes());
            prop_assert_eq!(normal.is_ambiguous(), plain.is_ambiguous());
        }

        #[test]
        fn deeper_paths_are_always_guarded(
            path in "/[/a-zA-Z0-9._;~\\\\-]{0,40}",
            extra in 1usize..=8,
            mask in prop::collection::vec(any::<bool>(), 1..8),
        ) {
            let encoded = encode(path.as_bytes(), MAX_DECODINGS + extra, &mask, true);
            prop_assert!(normalize_bytes(&encoded).is_ambiguous());
            prop_assert_eq!(everything_is_health().classify_bytes(&encoded), PathClass::Management);
            prop_assert_eq!(super::rules("{}").classify_bytes(&encoded), PathClass::Management);
            check_bounded(&encoded)?;
        }
    }
}
