//! End to end, issue 18: the shipped config writes one JSON access log line per request, and each
//! line says what the backends saw: the host that served the request, and the plugin's decision
//! for it (filter state `wasm.ewma_lb_decision`), checked against which backend counted the
//! request's path.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use harness::{http, within, BackendSpec, Stack};
use serde_json::Value;

/// The access log lines Envoy wrote so far (the shipped config logs to stdout), by path.
fn log_lines(stack: &Stack) -> HashMap<String, Value> {
    let text = std::fs::read_to_string(stack.envoy.dir().join("stdout.txt")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| Some((v["path"].as_str()?.to_owned(), v)))
        .collect()
}

/// The access log's lines once every path of `expected` has one, by path. Waits by path: other
/// lines (a warm-up's) count toward none of them, and Envoy flushes its log in its own time, so
/// waiting for a number of lines could stop short of the last ones.
fn logged(stack: &Stack, expected: &[&str]) -> HashMap<String, Value> {
    let mut lines = HashMap::new();
    let found = within(Duration::from_secs(10), || {
        lines = log_lines(stack);
        expected.iter().all(|p| lines.contains_key(*p))
    });
    let missing: Vec<&&str> = expected
        .iter()
        .filter(|p| !lines.contains_key(**p))
        .collect();
    assert!(found.is_some(), "not logged within 10 s: {missing:?}");
    lines
}

/// 400 requests, each on its own path (`/TAG/N`), four at a time: the backend that counted a
/// path is the one that served that request. Returns the paths.
fn send_each(tag: &str, stack: &Stack) -> Vec<String> {
    let paths: Vec<String> = (0..400).map(|i| format!("/{tag}/{i}")).collect();
    std::thread::scope(|s| {
        for chunk in paths.chunks(100) {
            let url = &stack.url;
            s.spawn(move || {
                for p in chunk {
                    let r = http::get(&format!("{url}{p}"), &[]).unwrap();
                    assert_eq!(r.status, 200, "{p}");
                }
            });
        }
    });
    paths
}

#[test]
fn every_request_logs_the_host_that_served_it_and_why_the_plugin_sent_it_there() {
    let stack = Stack::start(vec![
        BackendSpec::new("fast1", "uniform:5-15".parse().unwrap()),
        BackendSpec::new("fast2", "uniform:5-15".parse().unwrap()),
        BackendSpec::new("slow", "uniform:150-250".parse().unwrap()),
    ])
    .unwrap();
    stack.load(100.0, 4).unwrap(); // the table forms
    stack.reset_counts();
    let paths = send_each("req", &stack);
    assert_eq!(
        http::get(&format!("{}/healthz", stack.url), &[])
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        http::get(&format!("{}/actuator/env", stack.url), &[])
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        http::get(&format!("{}/ewma-lb/status", stack.url), &[])
            .unwrap()
            .status,
        200
    );
    let mut served_by: HashMap<String, String> = HashMap::new();
    for b in &stack.backends {
        for (path, n) in b.path_counts() {
            assert_eq!(n, 1, "{path} served {n} times by {}", b.name());
            if let Some(other) = served_by.insert(path.clone(), b.addr().to_string()) {
                panic!("{path} served by {other} and {}", b.addr());
            }
        }
    }
    let special = ["/healthz", "/actuator/env", "/ewma-lb/status"];
    let expected: Vec<&str> = paths.iter().map(String::as_str).chain(special).collect();
    let lines = logged(&stack, &expected);

    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut versions = Vec::new();
    for p in &paths {
        let line = &lines[p];
        let upstream = line["upstream_host"].as_str().unwrap();
        assert_eq!(
            Some(upstream),
            served_by.get(p).map(String::as_str),
            "{line}"
        );
        assert_eq!(line["upstream_cluster"], "backend", "{line}");
        assert_eq!(line["response_code"], 200, "{line}");
        assert!(line["duration"].as_u64().is_some(), "{line}");
        assert!(line["response_duration"].as_u64().is_some(), "{line}");
        assert!(line["start_time"].as_str().is_some(), "{line}");
        let decision: Vec<&str> = line["ewma_lb"].as_str().unwrap().split(' ').collect();
        let [reason, host, version] = decision[..] else {
            panic!("{line}")
        };
        *reasons.entry(reason.to_owned()).or_default() += 1;
        match reason {
            // A pick names the host, and that host served the request.
            "steered" | "probe" => {
                assert_eq!(host, upstream, "{line}");
                versions.push(version.parse::<u64>().unwrap());
            }
            r if r.starts_with("fallback:") => assert_eq!(host, "-", "{line}"),
            _ => panic!("unexpected decision: {line}"),
        }
    }
    // After the warm-up the table steers nearly everything (exploration, 0.2 %, is the rest).
    assert!(
        reasons.get("steered").copied().unwrap_or(0) >= 380,
        "{reasons:?}"
    );
    assert!(versions.iter().all(|v| *v > 0), "{versions:?}");
    // The slow host gets no steered request: the floor, probes only.
    let slow = stack.backend("slow").unwrap().addr().to_string();
    let steered_slow = paths
        .iter()
        .filter(|p| {
            lines[*p]["ewma_lb"]
                .as_str()
                .unwrap()
                .starts_with(&format!("steered {slow} "))
        })
        .count();
    assert!(steered_slow <= 4, "{steered_slow} steered to the slow host");

    let health = &lines["/healthz"];
    assert_eq!(health["ewma_lb"], "health_path - -", "{health}");
    assert!(
        served_by.contains_key("/healthz"),
        "the probe reached a backend"
    );
    let management = &lines["/actuator/env"];
    assert_eq!(management["ewma_lb"], "management - -", "{management}");
    // The status page is the plugin's own answer: no upstream.
    let status = &lines["/ewma-lb/status"];
    assert_eq!(status["ewma_lb"], "status - -", "{status}");
    assert!(!served_by.contains_key("/ewma-lb/status"));
}

/// Issue 16, `pick: weighted_p2c_unless_equal`: hosts the table cannot tell apart are left to
/// Envoy's least request, which sees the requests in flight of all of Envoy's workers; and a host
/// that turns slow is told apart and steered away from again. Read off the access log and checked
/// against the backends that counted each path.
#[test]
fn equal_hosts_are_left_to_least_request_until_one_turns_slow() {
    let stack = Stack::with_plugin_config(
        vec![
            BackendSpec::new("a", "uniform:10-14".parse().unwrap()),
            BackendSpec::new("b", "uniform:10-14".parse().unwrap()),
        ],
        r#"{"pick": "weighted_p2c_unless_equal"}"#,
    )
    .unwrap();
    stack.load(100.0, 4).unwrap(); // the table forms
    let run = |tag: &str| -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
        stack.reset_counts();
        let paths = send_each(tag, &stack);
        let expected: Vec<&str> = paths.iter().map(String::as_str).collect();
        let lines = logged(&stack, &expected);
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for p in &paths {
            let decision = lines[p]["ewma_lb"].as_str().unwrap();
            let reason = decision.split(' ').next().unwrap().to_owned();
            *reasons.entry(reason).or_default() += 1;
        }
        let served = stack
            .backends
            .iter()
            .map(|b| {
                let prefix = format!("/{tag}/");
                let n = b
                    .path_counts()
                    .keys()
                    .filter(|p| p.starts_with(&prefix))
                    .count();
                (b.name().to_owned(), n)
            })
            .collect();
        eprintln!("{tag}: decisions {reasons:?}, served {served:?}");
        (reasons, served)
    };
    // The load above keeps its connections, which Envoy may have given to one worker only; a
    // connection per request, as below, reaches both. A worker VM's first requests come before
    // its first tick has taken in the table: warm every worker the way the run below reaches it.
    send_each("warmup", &stack);
    let (reasons, served) = run("equal");
    // Most of them, not all: once in 18 runs, 232 of 400 were left and the rest steered, the
    // table having told the hosts apart mid-run (one score out of its uncertainty; probably a
    // scheduling stall of this shared machine, not verified). Without the rule none is left.
    let left = reasons.get("fallback:hosts_equal").copied().unwrap_or(0);
    assert!(left > 200, "equal hosts: {reasons:?}");
    // Least request splits them: each well within its half (400 requests, either way 150 is
    // more than six standard deviations of a fair coin).
    assert!(served.values().all(|n| *n >= 150), "{served:?}");

    // b turns ten times slower: the table tells it apart and steers away from it.
    stack
        .backend("b")
        .unwrap()
        .set_latency("uniform:100-140".parse().unwrap());
    stack.load(100.0, 4).unwrap();
    let (reasons, served) = run("slow");
    let left = reasons.get("fallback:hosts_equal").copied().unwrap_or(0);
    assert!(left <= 20, "a slow host: {reasons:?}");
    assert!(served["a"] >= 300, "{served:?} {reasons:?}");
}
