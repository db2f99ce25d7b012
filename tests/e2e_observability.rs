//! End to end, issue 5: the metrics in Envoy's `/stats/prometheus` add up to the traffic sent,
//! and shadow mode computes the table without ever steering.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // real processes: native only

use std::time::Duration;

use harness::{http, within, BackendSpec, Stack};

fn backends() -> Vec<BackendSpec> {
    vec![
        BackendSpec::new("a", "uniform:10-20".parse().unwrap()),
        BackendSpec::new("b", "uniform:10-20".parse().unwrap()),
        BackendSpec::new("c", "uniform:200-300".parse().unwrap()),
    ]
}

/// The value of one series, once the plugin's next tick has handed it to Envoy.
fn settled(stack: &Stack, series: &str, want: impl Fn(f64) -> bool) -> f64 {
    let ok = within(Duration::from_secs(3), || {
        stack.prometheus(series).is_some_and(&want)
    });
    let value = stack.prometheus(series).unwrap_or(f64::NAN);
    assert!(ok.is_some(), "{series} = {value}");
    value
}

#[test]
fn the_metrics_add_up_to_the_traffic_sent() {
    let stack = Stack::start(backends()).unwrap();
    let records = stack.load(100.0, 6).unwrap();
    let sent = records.iter().filter(|r| !r.dropped).count() as f64;
    assert!(records.iter().all(|r| r.status == 200));
    let probes = 7;
    for _ in 0..probes {
        assert_eq!(
            http::get(&format!("{}/health", stack.url), &[])
                .unwrap()
                .status,
            200
        );
    }
    let served: u64 = stack.backends.iter().map(|b| b.served()).sum();
    assert_eq!(
        served as f64, sent,
        "every business request reached a backend once"
    );

    let cluster = r#"cluster_name="backend""#;
    let fallback = |reason: &str| {
        stack.prometheus(&format!(
            r#"ewma_lb_fallback_requests_total{{{cluster},reason="{reason}"}}"#
        ))
    };
    let steered = settled(
        &stack,
        &format!("ewma_lb_steered_requests_total{{{cluster}}}"),
        |v| v > 0.0,
    );
    let settled_total = within(Duration::from_secs(3), || {
        let total = stack
            .prometheus(&format!("ewma_lb_steered_requests_total{{{cluster}}}"))
            .unwrap_or(0.0)
            + fallback("exploring").unwrap_or(0.0)
            + fallback("hosts_equal").unwrap_or(0.0)
            + fallback("table_not_ready").unwrap_or(0.0);
        total == sent
    });
    assert!(
        settled_total.is_some(),
        "steered {steered} + exploring {:?} + hosts_equal {:?} + table_not_ready {:?} != {sent} sent",
        fallback("exploring"),
        fallback("hosts_equal"),
        fallback("table_not_ready")
    );
    // c is slower than the others by far: the table tells the hosts apart and steers them all.
    assert!(
        steered > 0.9 * sent,
        "most requests are steered once the table exists: {steered} of {sent}"
    );
    settled(
        &stack,
        &format!(r#"ewma_lb_fallback_requests_total{{{cluster},reason="health_path"}}"#),
        |v| v == probes as f64,
    );

    // Per host: weights sum to one, the slow host has the least, nothing stays in flight. Every
    // VM sets the weights when it adopts a table, a tick apart at most, so the weights are read
    // in one scrape, once they come from one table (a refresh may still land just after the load).
    let weight_of = |text: &str, b: &harness::Backend| {
        let series = format!(
            r#"ewma_lb_host_weight_ppm{{{cluster},host="{}"}}"#,
            b.addr()
        );
        text.lines().find_map(|l| {
            l.strip_prefix(series.as_str())?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    let mut weights: Vec<(&str, f64)> = Vec::new();
    let one_table = within(Duration::from_secs(3), || {
        let text = stack
            .envoy
            .admin_get("/stats/prometheus")
            .unwrap_or_default();
        weights = stack
            .backends
            .iter()
            .filter_map(|b| Some((b.name(), weight_of(&text, b)?)))
            .collect();
        weights.len() == stack.backends.len()
            && (weights.iter().map(|(_, w)| w).sum::<f64>() - 1e6).abs() <= 3.0
    });
    for b in &stack.backends {
        let host = format!(r#"{cluster},host="{}""#, b.addr());
        // Absent for a host never steered to; otherwise back at zero once the load is done.
        let in_flight = format!("ewma_lb_host_in_flight_requests{{{host}}}");
        let drained = within(Duration::from_secs(3), || {
            stack.prometheus(&in_flight).unwrap_or(0.0) == 0.0
        });
        assert!(
            drained.is_some(),
            "{in_flight} = {:?}",
            stack.prometheus(&in_flight)
        );
        assert_eq!(
            stack.prometheus(&format!("ewma_lb_host_ejected{{{host}}}")),
            Some(0.0)
        );
        let latency_us = settled(
            &stack,
            &format!("ewma_lb_host_latency_microseconds{{{host}}}"),
            |v| v > 0.0,
        );
        let (lo, hi) = if b.name() == "c" {
            (200e3, 320e3)
        } else {
            (10e3, 40e3)
        };
        assert!(
            (lo..hi).contains(&latency_us),
            "{}: smoothed latency {latency_us} us",
            b.name()
        );
    }
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    assert!(
        one_table.is_some(),
        "weights sum to {total} ppm: {weights:?}"
    );
    let slow = weights
        .iter()
        .find(|(n, _)| *n == "c")
        .map_or(f64::NAN, |(_, w)| *w);
    assert!(weights.iter().all(|(_, w)| *w >= slow), "{weights:?}");
}

#[test]
fn shadow_mode_computes_the_table_but_never_steers() {
    let stack = Stack::with_plugin_config(backends(), r#"{"shadow": true}"#).unwrap();
    let records = stack.load(100.0, 5).unwrap();
    let sent = records.iter().filter(|r| !r.dropped).count() as f64;
    let seen_override = (0..20)
        .filter_map(|_| http::get(&format!("{}/work", stack.url), &[]).ok())
        .filter(|r| r.header("x-seen-override").is_some())
        .count();
    assert_eq!(
        seen_override, 0,
        "a backend received the override header in shadow mode"
    );
    let series = r#"ewma_lb_fallback_requests_total{cluster_name="backend",reason="shadow"}"#;
    settled(&stack, series, |v| v == sent + 20.0);
    assert_eq!(
        stack.prometheus(r#"ewma_lb_steered_requests_total{cluster_name="backend"}"#),
        None
    );
    let status = stack.status().unwrap();
    assert_eq!(status["shadow"], true);
    let hosts = status["clusters"][0]["hosts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(hosts.len(), 3, "the table knows every host: {status}");
    let c = stack.host_status("c").unwrap();
    let a = stack.host_status("a").unwrap();
    assert!(
        c["weight"].as_f64() < a["weight"].as_f64(),
        "the slow host weighs least: {status}"
    );
}
