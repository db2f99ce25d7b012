//! The decision each request carries to the access log (`Decision::write_log_value`, the filter
//! state `wasm.ewma_lb_decision`): a pick says whether it was drawn by weight or due a probe, the
//! host and the table's version; everything else says why the plugin left it alone.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

mod store;

use ewma_lb::worker::{Decision, FallbackReason, Request, Worker};
use store::{config, defaults, finish_pick, Shared, CLUSTER, MS};

fn log_value(d: &Decision, version: Option<u64>) -> String {
    let mut out = String::from("stale");
    d.write_log_value(version, &mut out);
    out
}

fn request(path: &[u8], now_ns: u64) -> Request<'_> {
    Request {
        path,
        cluster: Some(CLUSTER),
        now_ns,
        body_pending: false,
    }
}

/// A host a hundred times slower than the other sits at the floor: only probes reach it, and
/// the log says so; the fast host's picks are drawn by weight. Both name the table they came
/// from.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn picks_say_steered_or_probe_with_the_host_and_the_table_version() {
    let cfg = r#"{"exploration_share": 0, "persistence_ms": 0, "weights": {"slow_start_ms": 0}, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let store = Shared::default();
    let mut w = Worker::new(config(cfg), 7);
    let (mut probes, mut steered) = (0, 0);
    for tick in 1..=300u64 {
        let t0 = tick * 100 * MS;
        for r in 0..50u64 {
            let now = w.clock(t0 + r * MS);
            let d = w.route(&request(b"/", now), || None);
            let Decision::Override(pick) = &d else {
                continue;
            };
            let slow = &*pick.host == "10.0.0.2:80";
            let version = w.table_version(CLUSTER).unwrap();
            assert_eq!(pick.table_version, version);
            let value = log_value(&d, None);
            if tick > 100 {
                // The table has long put the slow host at the floor: it is only probed.
                assert_eq!(pick.probe, slow, "{value}");
                let expected = match slow {
                    true => format!("probe 10.0.0.2:80 {version}"),
                    false => format!("steered 10.0.0.1:80 {version}"),
                };
                assert_eq!(value, expected);
                probes += usize::from(slow);
                steered += usize::from(!slow);
            }
            finish_pick(&mut w, &pick.host, if slow { 400.0 } else { 4.0 });
        }
        w.tick(t0 + 100 * MS, &mut store.clone());
    }
    assert!(probes >= 2, "probes {probes}, steered {steered}");
    assert!(steered > 9_000, "probes {probes}, steered {steered}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn what_the_plugin_leaves_alone_says_why() {
    let mut w = Worker::new(defaults(), 1);
    let mut route = |path: &[u8], source: &str| {
        let source = source.to_owned();
        w.route(&request(path, MS), move || Some(source))
    };
    let first = route(b"/work", "127.0.0.1");
    assert_eq!(first, Decision::Fallback(FallbackReason::TableNotReady));
    assert_eq!(log_value(&first, None), "fallback:table_not_ready - -");
    assert_eq!(
        log_value(&route(b"/healthz", "10.1.1.1"), Some(3)),
        "health_path - -"
    );
    assert_eq!(
        log_value(&route(b"/actuator/env", "127.0.0.1"), Some(3)),
        "management - -"
    );
    assert_eq!(
        log_value(&route(b"/actuator/env", "203.0.113.9"), None),
        "denied - -"
    );
    assert_eq!(
        log_value(&route(b"/ewma-lb/status", "127.0.0.1"), None),
        "status - -"
    );
    // A fallback with a table names the table it had.
    assert_eq!(
        log_value(&Decision::Fallback(FallbackReason::Exploring), Some(12)),
        "fallback:exploring - 12"
    );
}
