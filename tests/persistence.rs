//! Persistence: the estimate follows a rise only once it has lasted; a pause is the pick's to
//! handle. And uncertainty: equal hosts' chance differences do not move the table.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::config::Config;
use ewma_lb::record::state::{Accumulator, ClusterBatch, ClusterState, Policy};

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const HOST: &str = "10.0.0.1:80";

fn policy(json: &str) -> Policy {
    Config::from_json(json.as_bytes()).unwrap().policy().clone()
}

/// How the requests of a batch ended.
#[derive(Clone, Copy)]
enum End {
    Answered,
    Failed,
    /// The client left before the host answered.
    Abandoned,
}

fn batch(latencies: &[f64], end: End) -> ClusterBatch {
    let mut acc = Accumulator::default();
    for l in latencies {
        match end {
            End::Answered => acc.record(*l, false, 1000.0),
            End::Failed => acc.record(*l, true, 1000.0),
            End::Abandoned => acc.record_abandoned(*l),
        }
    }
    ClusterBatch {
        hosts: [(HOST.to_string(), acc)].into_iter().collect(),
        ..ClusterBatch::default()
    }
}

/// A steady 50 ms host for 10 s (a batch of two samples every 100 ms), then `phase` for
/// `length`, then 50 ms again; the estimate at every 100 ms.
fn run(policy: &Policy, phase: (f64, End), length_ms: u64) -> Vec<f64> {
    let mut state = ClusterState::default();
    let mut out = Vec::new();
    for step in 1..=200u64 {
        let now = step * 100 * MS;
        let in_phase = now > 10 * SEC && now <= 10 * SEC + length_ms * MS;
        let b = if in_phase {
            batch(&[phase.0, phase.0], phase.1)
        } else {
            batch(&[49.0, 51.0], End::Answered)
        };
        state.merge(&b, now, policy);
        out.push(state.host(HOST).unwrap().latency.value_ms().unwrap());
    }
    out
}

fn max_after(estimates: &[f64], from_step: usize) -> f64 {
    estimates[from_step..].iter().copied().fold(0.0, f64::max)
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_rise_moves_the_estimate_only_once_it_has_lasted() {
    let defaults = policy("{}");
    use End::{Abandoned, Answered, Failed};
    // (what happens, for how long, the least and the most the estimate reaches afterwards)
    type Case<'a> = (&'a str, (f64, End), u64, f64, f64);
    let cases: [Case; 6] = [
        ("a 250 ms pause of 0.9 s", (250.0, Answered), 900, 0.0, 60.0),
        (
            "a 5 s stall at 250 ms",
            (250.0, Answered),
            5_000,
            200.0,
            f64::MAX,
        ),
        (
            "a 30 % rise, within the usual",
            (65.0, Answered),
            900,
            60.0,
            66.0,
        ),
        // Failures are never held: a failing host is not pausing.
        ("0.9 s of failures", (5.0, Failed), 900, 500.0, f64::MAX),
        (
            "0.3 s of 10 s answers",
            (10_000.0, Answered),
            300,
            0.0,
            60.0,
        ),
        // Nor are waits their clients cut short: those requests left the pick's count in flight,
        // so it no longer keeps traffic off a host that may still be stuck.
        (
            "0.3 s of 1 s waits abandoned by their clients",
            (1_000.0, Abandoned),
            300,
            500.0,
            f64::MAX,
        ),
    ];
    for (what, phase, length_ms, at_least, at_most) in cases {
        let estimates = run(&defaults, phase, length_ms);
        let peak = max_after(&estimates, 100);
        assert!(
            peak >= at_least && peak <= at_most,
            "{what}: the estimate reached {peak:.1} ms, want [{at_least}, {at_most}]"
        );
    }
    // Without persistence the pause is taken in: what the rule changes.
    let pause = run(&policy(r#"{"persistence_ms": 0}"#), (250.0, Answered), 900);
    assert!(max_after(&pause, 100) > 200.0, "{pause:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_whose_batches_vary_by_nature_is_followed_as_it_is() {
    // A route where a fifth of the requests cost ten times more, four samples a batch: the
    // batches' means vary widely by nature. The spread comes to know it and they are taken in:
    // the estimate is the route's mean (28 ms), not the cheap requests' 10 ms.
    let p = policy(r#"{"smoothing": {"algorithm": "decay_ewma", "tau_ms": 1000}}"#);
    let mut state = ClusterState::default();
    let mut seed = 12_345u64;
    let mut dear = || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % 5 == 0
    };
    let mut estimates = Vec::new();
    for step in 1..=600u64 {
        let samples: Vec<f64> = (0..4).map(|_| if dear() { 100.0 } else { 10.0 }).collect();
        state.merge(&batch(&samples, End::Answered), step * 100 * MS, &p);
        estimates.push(state.host(HOST).unwrap().latency.value_ms().unwrap());
    }
    let late = &estimates[300..];
    let mean = late.iter().sum::<f64>() / late.len() as f64;
    assert!((20.0..=36.0).contains(&mean), "mean estimate {mean:.1} ms");
}

/// A host seen once in seconds (a proxy of a large fleet): a slower answer after a silence longer
/// than the persistence is taken in at once; held, every change would wait for a second sample.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_rise_after_a_silence_is_taken_in_at_once() {
    let p = policy("{}");
    let mut state = ClusterState::default();
    for step in 1..=5u64 {
        state.merge(&batch(&[20.0], End::Answered), step * 9 * SEC, &p);
    }
    state.merge(&batch(&[120.0], End::Answered), 54 * SEC, &p);
    let v = state.host(HOST).unwrap().latency.value_ms().unwrap();
    assert!(
        v > 60.0,
        "estimate {v:.1} ms after a 120 ms answer 9 s after the last"
    );
}
