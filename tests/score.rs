//! The score's three terms (latency, error rate, reported load) and the ORCA reader, as tables.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::score::{
    parse_load_report, ErrorRate, Load, LoadMetric, LoadReportError, LoadReportWatch, ScoreParams,
    Terms, LOAD_REPORT_RECHECK_NS, LOAD_TTL_NS, MAX_REPORT_BYTES,
};

mod store;

use ewma_lb::balance::outcome::Outcome;
use ewma_lb::worker::telemetry::{Change, Metric};
use ewma_lb::worker::{Finished, Worker};
use store::{config, defaults, Shared, CLUSTER, MS, SEC};

fn named(name: &str) -> LoadMetric {
    LoadMetric::parse(&format!("named_metrics.{name}")).unwrap()
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn well_formed_reports_give_the_chosen_metric() {
    use LoadMetric::*;
    let cases: &[(&str, LoadMetric, Option<f64>)] = &[
        (
            "TEXT cpu_utilization=0.3, rps_fractional=10",
            Auto,
            Some(0.3),
        ),
        ("TEXT cpu_utilization=0.3,rps_fractional=10", Cpu, Some(0.3)),
        // application_utilization wins in `auto` when positive ...
        (
            "TEXT cpu_utilization=0.3, application_utilization=0.8",
            Auto,
            Some(0.8),
        ),
        // ... and a zero one is "not set", as proto3 and gRPC read it.
        (
            "TEXT cpu_utilization=0.3, application_utilization=0",
            Auto,
            Some(0.3),
        ),
        ("TEXT application_utilization=0", Auto, Some(0.0)),
        (
            "TEXT cpu_utilization=0.3, application_utilization=0.8",
            Cpu,
            Some(0.3),
        ),
        ("TEXT cpu_utilization=0.3", Application, None),
        (
            "TEXT cpu_utilization=0.3, named_metrics.foo=0.2",
            named("foo"),
            Some(0.2),
        ),
        (
            "TEXT cpu_utilization=0.3, named_metrics.foo=0.2",
            named("bar"),
            None,
        ),
        // Over 1 is allowed: ORCA's hosts may report past their soft limit.
        ("TEXT cpu_utilization=1.5", Auto, Some(1.5)),
        ("TEXT rps_fractional=10, eps=2", Auto, None),
        ("  text cpu_utilization = 2e-1 ", Auto, Some(0.2)),
        (
            r#"JSON {"cpu_utilization": 0.3, "rps_fractional": 10}"#,
            Auto,
            Some(0.3),
        ),
        (
            r#"JSON {"application_utilization": 0.6, "cpu_utilization": 0.3}"#,
            Auto,
            Some(0.6),
        ),
        (
            r#"JSON {"cpu_utilization": 0.3, "named_metrics": {"foo": 0.2}}"#,
            named("foo"),
            Some(0.2),
        ),
        // A named metric called like a standard field is still only the named one.
        (
            r#"JSON {"named_metrics": {"cpu_utilization": 0.9}}"#,
            Cpu,
            None,
        ),
        (r#"JSON {"request_cost": {"db": 3}}"#, Auto, None),
        ("TEXT cpu_utilization=0.3", Off, None),
    ];
    for (report, metric, want) in cases {
        assert_eq!(
            parse_load_report(report.as_bytes(), metric),
            Ok(*want),
            "{report} with {metric:?}"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hostile_reports_are_refused_never_trusted() {
    use LoadReportError::*;
    let long = format!(
        "TEXT cpu_utilization=0.5, {}",
        "x=1, ".repeat(MAX_REPORT_BYTES)
    );
    let cases: Vec<(Vec<u8>, LoadReportError)> = vec![
        (b"cpu_utilization=0.3".to_vec(), UnknownFormat),
        (b"BIN CgkJmpmZmZmZ2T8=".to_vec(), UnknownFormat),
        (b"".to_vec(), UnknownFormat),
        (b"TEXT".to_vec(), UnknownFormat),
        (b"TEXT ".to_vec(), UnknownFormat),
        (b"TEXT  ,".to_vec(), Malformed),
        (b"TEXT cpu_utilization".to_vec(), Malformed),
        (b"TEXT cpu_utilization=".to_vec(), Malformed),
        (b"TEXT =0.3".to_vec(), Malformed),
        (b"TEXT cpu_utilization=0.3,".to_vec(), Malformed),
        (b"TEXT cpu_utilization=0.3;rps=1".to_vec(), Malformed),
        (b"TEXT cpu_utilization=abc".to_vec(), Malformed),
        (b"TEXT cpu_utilization=NaN".to_vec(), Malformed),
        (b"TEXT cpu_utilization=inf".to_vec(), Malformed),
        (b"TEXT cpu_utilization=0x10".to_vec(), Malformed),
        (b"TEXT cpu_utilization=1..2".to_vec(), Malformed),
        (b"TEXT cpu_utilization=\xff\xfe".to_vec(), Malformed),
        (b"TEXT cpu_utilization=-0.5".to_vec(), OutOfRange),
        (b"TEXT cpu_utilization=11".to_vec(), OutOfRange),
        (b"TEXT cpu_utilization=1e400".to_vec(), OutOfRange),
        (b"TEXT cpu_utilization=1e308".to_vec(), OutOfRange),
        (b"JSON {\"cpu_utilization\": -1}".to_vec(), OutOfRange),
        (b"JSON {\"cpu_utilization\": 1e300}".to_vec(), OutOfRange),
        (b"JSON {\"cpu_utilization\": \"0.3\"}".to_vec(), Malformed),
        (b"JSON {\"cpu_utilization\": null}".to_vec(), Malformed),
        (b"JSON [0.3]".to_vec(), Malformed),
        (b"JSON {\"cpu_utilization\": 0.3".to_vec(), Malformed),
        (b"JSON {\"named_metrics\": 3}".to_vec(), Malformed),
        (
            format!("JSON {}0.3{}", "[".repeat(3000), "]".repeat(3000)).into_bytes(),
            TooLong,
        ),
        (
            format!("JSON {}1{}", "[".repeat(1000), "]".repeat(1000)).into_bytes(),
            Malformed,
        ),
        (long.into_bytes(), TooLong),
    ];
    for (report, want) in cases {
        assert_eq!(
            parse_load_report(&report, &LoadMetric::Auto),
            Err(want),
            "{}",
            report.escape_ascii()
        );
    }
}

/// Every prefix of every report above, and random bytes after a valid prefix: an answer, never a
/// panic.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn no_bytes_make_the_reader_panic() {
    let mut rng = fastrand::Rng::with_seed(17);
    let metrics = [LoadMetric::Auto, LoadMetric::Cpu, named("foo")];
    for _ in 0..20_000 {
        let prefix: &[u8] = if rng.bool() { b"TEXT " } else { b"JSON " };
        let mut report = prefix.to_vec();
        let alphabet = b"{}[]\":,=.-+eE0123456789 named_metrics.foo cpu_utilization\xff";
        for _ in 0..rng.usize(0..64) {
            report.push(alphabet[rng.usize(..alphabet.len())]);
        }
        for metric in &metrics {
            if let Ok(Some(u)) = parse_load_report(&report, metric) {
                assert!((0.0..=10.0).contains(&u), "{}", report.escape_ascii());
            }
        }
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn metric_names_parse_as_configured() {
    let cases: &[(&str, Option<LoadMetric>)] = &[
        ("auto", Some(LoadMetric::Auto)),
        ("cpu_utilization", Some(LoadMetric::Cpu)),
        ("application_utilization", Some(LoadMetric::Application)),
        ("none", Some(LoadMetric::Off)),
        (
            "named_metrics.queue",
            Some(LoadMetric::Named("queue".into())),
        ),
        ("named_metrics.", None),
        ("named_metrics.a b", None),
        ("mem_utilization", None),
        ("", None),
    ];
    for (name, want) in cases {
        assert_eq!(LoadMetric::parse(name), *want, "{name:?}");
        if let Some(metric) = want {
            assert_eq!(String::from(metric.clone()), *name);
        }
    }
}

/// The error rate is the decayed failed fraction, drawn towards 0 while few requests stand
/// behind it: (requests, failures) per second, and the rate after each second.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_error_rate_follows_the_failed_fraction() {
    let run = |batches: &[(u32, u32)]| -> Vec<f64> {
        let mut e = ErrorRate::default();
        batches
            .iter()
            .enumerate()
            .map(|(i, (n, f))| {
                e.observe(*n, *f, (i as u64 + 1) * SEC);
                e.value()
            })
            .collect()
    };
    // One failure in a host's first two requests: 1 / (2 + 4), not 50 %.
    assert!((run(&[(2, 1)])[0] - 1.0 / 6.0).abs() < 1e-9);
    // 100 requests a second, a fifth failing: close to 20 % within a few seconds' worth of
    // requests; the prior's weight fades as the requests add up.
    let steady = run(&[(100, 20); 30]);
    assert!((steady[29] - 0.2).abs() < 0.002, "{steady:?}");
    assert!(
        steady.windows(2).all(|w| w[1] >= w[0] - 1e-12),
        "{steady:?}"
    );
    // The failures stop: the rate halves in about 7 s (τ = 10 s), and is near 0 after 40 s.
    let mut batches = vec![(100, 20); 30];
    batches.extend([(100, 0); 40]);
    let after = run(&batches);
    assert!(after[36] < 0.11 && after[36] > 0.09, "{:?}", &after[30..]);
    assert!(after[69] < 0.01, "{:?}", &after[30..]);
    // Failures beyond the requests (a malformed batch) count as the requests.
    assert!(run(&[(10, 50)])[0] <= 1.0);
    // Nothing observed, nothing changes.
    assert_eq!(run(&[(0, 0)])[0], 0.0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_load_is_averaged_over_a_second_and_forgotten_after_a_silence() {
    let mut load = Load::default();
    assert_eq!(load.value(0), None);
    load.observe(0.9, 3, SEC);
    assert_eq!(
        load.value(SEC),
        Some(0.9),
        "the first report is taken whole"
    );
    load.observe(0.1, 3, 2 * SEC);
    let v = load.value(2 * SEC).unwrap();
    // One τ later the new reading has 1 − 1/e of the weight.
    assert!((v - (0.9 * (-1.0f64).exp() + 0.1 * (1.0 - (-1.0f64).exp()))).abs() < 1e-9);
    assert_eq!(
        load.value(2 * SEC + LOAD_TTL_NS),
        None,
        "no report for 10 s: no term"
    );
    load.observe(0.4, 1, 2 * SEC + LOAD_TTL_NS + 1);
    assert_eq!(
        load.value(2 * SEC + LOAD_TTL_NS + 1),
        Some(0.4),
        "after a silence the new report is taken whole"
    );
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        let before = load.clone();
        load.observe(bad, 1, 30 * SEC);
        assert_eq!(load, before, "{bad} is never folded in");
    }
}

/// score = latency · (1/(1−e))^error_weight · (1/(1−min(u, max_utilization)))^load_weight.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_score_is_the_cost_of_a_success() {
    let p = ScoreParams::default();
    let no_load = ScoreParams {
        load_weight: 0.0,
        ..ScoreParams::default()
    };
    let squared = ScoreParams {
        load_weight: 2.0,
        ..ScoreParams::default()
    };
    let t = |latency: Option<f64>, e: f64, u: Option<f64>| Terms {
        latency_ms: latency,
        error_rate: e,
        utilization: u,
    };
    let cases: &[(Terms, &ScoreParams, Option<f64>)] = &[
        (t(None, 0.5, Some(0.5)), &p, None),
        (t(Some(50.0), 0.0, None), &p, Some(50.0)),
        // A fifth failing: 1.25 attempts per success.
        (t(Some(50.0), 0.2, None), &p, Some(62.5)),
        // Capped at 90 %: the factor is at most 10.
        (t(Some(50.0), 1.0, None), &p, Some(500.0)),
        // Half busy: a queue doubles the time; 90 % busy, ten times.
        (t(Some(50.0), 0.0, Some(0.5)), &p, Some(100.0)),
        (t(Some(50.0), 0.0, Some(0.9)), &p, Some(500.0)),
        // Full or past its soft limit: capped at max_utilization (factor 20).
        (t(Some(50.0), 0.0, Some(1.0)), &p, Some(1000.0)),
        (t(Some(50.0), 0.0, Some(3.0)), &p, Some(1000.0)),
        (t(Some(50.0), 0.0, Some(0.0)), &p, Some(50.0)),
        (t(Some(50.0), 0.2, Some(0.5)), &p, Some(125.0)),
        (t(Some(50.0), 0.0, Some(0.9)), &no_load, Some(50.0)),
        (t(Some(50.0), 0.0, Some(0.5)), &squared, Some(200.0)),
        (t(Some(50.0), f64::NAN, Some(f64::NAN)), &p, Some(50.0)),
    ];
    for (terms, params, want) in cases {
        let got = terms.score_ms(params);
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{terms:?}: {g} != {w}"),
            _ => assert_eq!(got, *want, "{terms:?}"),
        }
    }
}

/// One request `host` answered in 50 ms, with `report` in its response headers.
fn served_in_50ms(w: &mut Worker, host: &str, report: Option<&[u8]>) {
    w.finish(
        CLUSTER,
        &Finished {
            served_by: Some(host),
            attempts: 1,
            latency_ms: 50.0,
            outcome: Some(Outcome::Success),
            load_report: report,
            ..Finished::default()
        },
    );
}

/// Three equally fast hosts through the worker and the shared record: the one whose responses
/// report 90 % utilisation drops to a small share although its latency is the others'; a
/// malformed report is counted and changes nothing; with `load_weight` 0 reports change nothing.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_reporting_a_high_load_loses_its_share_at_equal_latency() {
    let run = |cfg: Option<&str>, busy_report: Option<&[u8]>| -> (Vec<f64>, u64) {
        let store = Shared::default();
        let mut w = Worker::new(cfg.map_or_else(defaults, config), 1);
        let hosts = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
        let mut errors = 0;
        for tick in 1..=60u64 {
            for _ in 0..10 {
                for (i, host) in hosts.iter().enumerate() {
                    let report: Option<&[u8]> = if i == 0 {
                        busy_report
                    } else {
                        Some(b"TEXT cpu_utilization=0.1")
                    };
                    served_in_50ms(&mut w, host, report);
                }
            }
            let report = w.tick(tick * 100 * MS, &mut store.clone());
            errors += report
                .metrics
                .iter()
                .filter(|u| u.metric == Metric::LoadReportErrors)
                .map(|u| match u.change {
                    Change::Add(n) => n as u64,
                    Change::Set(n) => n,
                })
                .sum::<u64>();
        }
        let state = store.record_of(CLUSTER);
        let shares = hosts
            .iter()
            .map(|h| state.host(h).map_or(0.0, |h| h.share))
            .collect();
        (shares, errors)
    };
    let (busy, errors) = run(None, Some(b"TEXT cpu_utilization=0.9, rps_fractional=100"));
    assert_eq!(errors, 0);
    assert!(busy[0] < 0.05, "90 % busy at equal latency: {busy:?}");
    assert!(busy[1] > 0.4 && busy[2] > 0.4, "{busy:?}");
    // A malformed report is as good as none: the same table to the last digit.
    let (silent, errors) = run(None, None);
    assert_eq!(errors, 0);
    let (malformed, errors) = run(None, Some(b"TEXT cpu_utilization=NaN"));
    assert_eq!(errors, 600, "every malformed report is counted");
    assert_eq!(malformed, silent);
    let (ignored, errors) = run(
        Some(r#"{"score": {"load_weight": 0}}"#),
        Some(b"TEXT cpu_utilization=0.9"),
    );
    assert_eq!(errors, 0);
    assert!(
        ignored.iter().all(|s| (s - 1.0 / 3.0).abs() < 0.05),
        "{ignored:?}"
    );
}

/// A fifth of a host's requests failing fast (1 ms) costs it share through the error term,
/// beyond what the penalty latency alone does, and the status page shows each term.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_failing_a_fifth_of_its_requests_is_penalised_in_proportion() {
    let run = |cfg: &str| -> (f64, serde_json::Value) {
        let store = Shared::default();
        let mut w = Worker::new(config(cfg), 1);
        let hosts = ["10.0.0.1:80", "10.0.0.2:80"];
        for tick in 1..=100u64 {
            for n in 0..20 {
                for (i, host) in hosts.iter().enumerate() {
                    let failed = i == 0 && n % 5 == 0;
                    w.finish(
                        CLUSTER,
                        &Finished {
                            served_by: Some(host),
                            attempts: 1,
                            latency_ms: if failed { 1.0 } else { 50.0 },
                            outcome: Some(if failed {
                                Outcome::ServerError
                            } else {
                                Outcome::Success
                            }),
                            ..Finished::default()
                        },
                    );
                }
            }
            w.tick(tick * 100 * MS, &mut store.clone());
        }
        let share = store
            .record_of(CLUSTER)
            .host(hosts[0])
            .map_or(0.0, |h| h.share);
        let status: serde_json::Value =
            serde_json::from_str(&w.status_json(&store.clone())).unwrap();
        (share, status["clusters"][0]["hosts"][0].clone())
    };
    // Small penalty so the error term shows: the penalty latency alone makes the failing host
    // (0.8·50 + 0.2·60 = 52 ms) nearly as good as the other.
    let (with_errors, status) =
        run(r#"{"failure_penalty_ms": 60, "outlier_detection": {"consecutive_failures": 0}}"#);
    let (penalty_only, _) = run(
        r#"{"failure_penalty_ms": 60, "outlier_detection": {"consecutive_failures": 0}, "score": {"error_weight": 0}}"#,
    );
    let error_rate = status["error_rate"].as_f64().unwrap();
    assert!((error_rate - 0.2).abs() < 0.01, "{status}");
    let latency = status["latency_ms"].as_f64().unwrap();
    let score = status["score_ms"].as_f64().unwrap();
    assert!(
        (score / latency - 1.0 / (1.0 - error_rate)).abs() < 1e-9,
        "{status}"
    );
    assert!(
        status["utilization"].is_null(),
        "no report, no load term: {status}"
    );
    // 1.25^-2.5 ≈ 0.57 of the other's weight: a share near 0.36 instead of near 0.5.
    assert!(penalty_only > 0.45, "{penalty_only}");
    assert!(with_errors < 0.42 && with_errors > 0.3, "{with_errors}");
}

/// `/clusters` as Envoy 1.40 prints it (lines abridged), read for the steered clusters.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn envoys_health_flags_are_read_from_its_clusters_page() {
    let text = b"backend::observability_name::backend
backend::default_priority::max_connections::1024
backend::127.0.0.1:8081::cx_active::2
backend::127.0.0.1:8081::health_flags::healthy
backend::127.0.0.1:8082::health_flags::/failed_active_hc
backend::127.0.0.1:8083::health_flags::/failed_active_hc/active_hc_timeout
backend::[::1]:8084::health_flags::/failed_outlier_check
backend::[::1]:8085::health_flags::/degraded_active_hc
backend::10.0.0.9:80::health_flags::/pending_active_hc
backend::10.0.0.10:80::health_flags::/failed_active_hc/pending_active_hc
other::127.0.0.1:9000::health_flags::/failed_eds_health
envoy_admin::127.0.0.1:9901::health_flags::healthy
::127.0.0.1:1::health_flags::/failed_active_hc
garbage \xff\xfe::health_flags::
";
    let text = String::from_utf8_lossy(text);
    let got = ewma_lb::worker::health::listed_hosts(&text, |c| c == "backend" || c == "other");
    let mut backend: Vec<&str> = got["backend"]
        .unhealthy
        .iter()
        .map(String::as_str)
        .collect();
    backend.sort_unstable();
    assert_eq!(
        backend,
        ["127.0.0.1:8082", "127.0.0.1:8083", "[::1]:8084"],
        "degraded hosts still take traffic in Envoy's own balancers; hosts not checked yet are new, not failing"
    );
    assert_eq!(
        got["backend"].serving,
        [
            "127.0.0.1:8081",
            "[::1]:8085",
            "10.0.0.9:80",
            "10.0.0.10:80"
        ],
        "every host listed and not unhealthy serves"
    );
    assert_eq!(got["backend"].count(), 7, "one health line per host");
    assert_eq!(got["other"].unhealthy.len(), 1);
    assert!(got["other"].serving.is_empty());
    assert!(!got.contains_key("envoy_admin"), "not a steered cluster");
    assert!(ewma_lb::worker::health::listed_hosts("", |_| true).is_empty());
}

/// A host Envoy reports unhealthy leaves this worker's picks at once and comes back when Envoy
/// reports it healthy; with no answer for five intervals the table decides alone again.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_envoy_marks_unhealthy_leave_the_picks() {
    use ewma_lb::worker::{Decision, Request};
    let store = Shared::default();
    let mut w = Worker::new(
        config(r#"{"envoy_health": {"admin_cluster": "envoy_admin"}}"#),
        1,
    );
    let hosts = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
    let mut t = 0;
    let mut run = |w: &mut Worker, ticks: u64| {
        for _ in 0..ticks {
            t += 100 * MS;
            for host in hosts {
                served_in_50ms(w, host, None);
            }
            w.tick(t, &mut store.clone());
        }
        t
    };
    let picked = |w: &mut Worker, now: u64| -> Vec<String> {
        (0..600)
            .filter_map(|_| {
                match w.route(
                    &Request {
                        path: b"/work",
                        cluster: Some(CLUSTER),
                        now_ns: now,
                        body_pending: false,
                    },
                    || None,
                ) {
                    Decision::Override(p) => Some(p.host.to_string()),
                    _ => None,
                }
            })
            .collect()
    };
    let now = run(&mut w, 20);
    assert!(w.envoy_health_due(now), "a VM with a table asks");
    assert!(!w.envoy_health_due(now + 10 * MS), "once per interval");
    w.envoy_health(
        now,
        b"backend::10.0.0.2:80::health_flags::/failed_active_hc\nbackend::10.0.0.1:80::health_flags::healthy\nbackend::10.0.0.3:80::health_flags::healthy\n",
    );
    let picks = picked(&mut w, now);
    assert!(picks.len() > 500, "{}", picks.len());
    assert!(
        !picks.iter().any(|h| h == "10.0.0.2:80"),
        "an unhealthy host is never picked"
    );
    let status: serde_json::Value = serde_json::from_str(&w.status_json(&store.clone())).unwrap();
    assert!(status["clusters"][0]["hosts"][1]["envoy_unhealthy"]
        .as_bool()
        .unwrap());
    // Healthy again: back in the picks at once.
    w.envoy_health(
        now + SEC,
        b"backend::10.0.0.2:80::health_flags::healthy\nbackend::10.0.0.1:80::health_flags::healthy\nbackend::10.0.0.3:80::health_flags::healthy\n",
    );
    assert!(picked(&mut w, now + SEC).iter().any(|h| h == "10.0.0.2:80"));
    // Unhealthy, then Envoy stops answering: after 5 intervals the table decides alone.
    w.envoy_health(
        now + SEC,
        b"backend::10.0.0.2:80::health_flags::/failed_active_hc\nbackend::10.0.0.1:80::health_flags::healthy\nbackend::10.0.0.3:80::health_flags::healthy\n",
    );
    let later = run(&mut w, 70);
    assert!(later - (now + SEC) >= 5 * SEC);
    assert!(picked(&mut w, later).iter().any(|h| h == "10.0.0.2:80"));
}

/// When Envoy reports every host unhealthy the plugin names none of them: each request is left
/// to Envoy (whose panic threshold then serves them all), and the picks come back as soon as
/// Envoy reports a host healthy again.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn every_host_unhealthy_leaves_every_request_to_envoy() {
    use ewma_lb::worker::{Decision, Request};
    let store = Shared::default();
    let mut w = Worker::new(
        config(r#"{"envoy_health": {"admin_cluster": "envoy_admin"}}"#),
        1,
    );
    let hosts = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
    let mut now = 0;
    for _ in 0..20 {
        now += 100 * MS;
        for host in hosts {
            served_in_50ms(&mut w, host, None);
        }
        w.tick(now, &mut store.clone());
    }
    let decisions = |w: &mut Worker, now: u64| -> (usize, usize) {
        let (mut picks, mut fallbacks) = (0, 0);
        for _ in 0..600 {
            match w.route(
                &Request {
                    path: b"/work",
                    cluster: Some(CLUSTER),
                    now_ns: now,
                    body_pending: false,
                },
                || None,
            ) {
                Decision::Override(_) => picks += 1,
                Decision::Fallback(_) => fallbacks += 1,
                d => panic!("unexpected decision {d}"),
            }
        }
        (picks, fallbacks)
    };
    assert!(decisions(&mut w, now).0 > 500, "the table steers first");
    let page = |flags: [&str; 3]| -> Vec<u8> {
        hosts
            .iter()
            .zip(flags)
            .map(|(h, f)| format!("backend::{h}::health_flags::{f}\n"))
            .collect::<String>()
            .into_bytes()
    };
    w.envoy_health(now, &page(["/failed_active_hc"; 3]));
    assert_eq!(
        decisions(&mut w, now),
        (0, 600),
        "no unhealthy host is named"
    );
    w.envoy_health(
        now + 10 * MS,
        &page(["/failed_active_hc", "healthy", "/failed_active_hc"]),
    );
    assert!(
        decisions(&mut w, now + 10 * MS).0 > 500,
        "the healthy host is picked again"
    );
}

/// A host `/clusters` lists that no request met yet (a scale-out's newcomer) enters the record
/// through the VM's batch: every VM of the process has it in its table after a tick, the page's
/// host count becomes the cluster's endpoint count, and nothing is left unknown to the fallback.
/// A host marked unhealthy there does not enter. A host the page stops listing leaves.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_envoy_lists_enter_the_table_and_hosts_it_stops_listing_leave() {
    let store = Shared::default();
    let cfg = r#"{"envoy_health": {"admin_cluster": "envoy_admin"}}"#;
    let mut w = Worker::new(config(cfg), 1);
    let mut other = Worker::new(config(cfg), 2);
    let mut t = 0;
    for _ in 0..20 {
        t += 100 * MS;
        for host in ["10.0.0.1:80", "10.0.0.2:80"] {
            served_in_50ms(&mut w, host, None);
            served_in_50ms(&mut other, host, None);
        }
        w.tick(t, &mut store.clone());
        other.tick(t, &mut store.clone());
    }
    let known = |w: &Worker| -> Vec<String> {
        let status: serde_json::Value =
            serde_json::from_str(&w.status_json(&store.clone())).unwrap();
        status["clusters"][0]["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["host"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(known(&w), ["10.0.0.1:80", "10.0.0.2:80"]);
    // Two ticks of both VMs: one to hand the page's hosts to the record, one to adopt the table.
    let tick_both = |w: &mut Worker, other: &mut Worker, mut t: u64| {
        for _ in 0..2 {
            t += 100 * MS;
            w.tick(t, &mut store.clone());
            other.tick(t, &mut store.clone());
        }
        t
    };
    w.envoy_health(
        t,
        b"backend::10.0.0.1:80::health_flags::healthy
backend::10.0.0.2:80::health_flags::healthy
backend::10.0.0.3:80::health_flags::/failed_active_hc/pending_active_hc
backend::10.0.0.4:80::health_flags::/failed_active_hc
",
    );
    t = tick_both(&mut w, &mut other, t);
    for vm in [&w, &other] {
        assert_eq!(
            known(vm),
            ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"],
            "the listed newcomer is in every VM's table; the unhealthy host is not"
        );
        let status: serde_json::Value =
            serde_json::from_str(&vm.status_json(&store.clone())).unwrap();
        assert_eq!(status["clusters"][0]["endpoints"], 4, "{status}");
        assert_eq!(
            status["clusters"][0]["unknown_endpoints"], 1,
            "the unhealthy host, which Envoy's own balancers skip too"
        );
    }
    // 10.0.0.1 leaves the cluster: the page no longer lists it, and no request has said so.
    w.envoy_health(
        t,
        b"backend::10.0.0.2:80::health_flags::healthy
backend::10.0.0.3:80::health_flags::healthy
",
    );
    tick_both(&mut w, &mut other, t);
    for vm in [&w, &other] {
        assert_eq!(
            known(vm),
            ["10.0.0.2:80", "10.0.0.3:80"],
            "a host the page no longer lists leaves every VM's table"
        );
    }
}

/// A cluster's load report header is read on every response once one carried a report, and
/// before that on the first response of each recheck interval only.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_load_report_header_is_read_where_reports_come() {
    let mut watch = LoadReportWatch::default();
    // The first response is looked at; the next ones within the interval are not.
    assert!(watch.wants(5 * SEC));
    watch.looked(false);
    assert!(!watch.wants(5 * SEC + 1));
    assert!(!watch.wants(5 * SEC + LOAD_REPORT_RECHECK_NS - 1));
    // One look per interval while none comes.
    assert!(watch.wants(5 * SEC + LOAD_REPORT_RECHECK_NS));
    watch.looked(false);
    assert!(!watch.wants(5 * SEC + LOAD_REPORT_RECHECK_NS + MS));
    assert!(watch.wants(9 * SEC));
    // A report (well formed or not): every response from then on.
    watch.looked(true);
    for t in 0..1_000 {
        assert!(watch.wants(9 * SEC + t));
        watch.looked(false);
    }
}
