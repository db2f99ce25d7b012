//! Smoothers against the seeds' own numbers, and the laws they must keep.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::smoothing::{Batch, Estimate, Smoother};

const SEC: u64 = 1_000_000_000;

/// Feeds one sample per second and returns the estimate after each.
fn run(smoother: Smoother, samples: &[f64]) -> Vec<f64> {
    let mut est = Estimate::default();
    samples
        .iter()
        .enumerate()
        .map(|(i, x)| {
            smoother.observe(&mut est, &Batch::one(*x), (i as u64 + 1) * SEC);
            est.value_ms().unwrap_or(f64::NAN)
        })
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance,
            "step {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn ewma_matches_seed_000() {
    // Seed 000: host A at 50, 50, 250 (a GC pause), 50, 50 with α = 0.3.
    let got = run(
        Smoother::Ewma { alpha: 0.3 },
        &[50.0, 50.0, 250.0, 50.0, 50.0],
    );
    assert_close(&got, &[50.0, 50.0, 110.0, 92.0, 79.4], 1e-9);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn sma_matches_seed_000() {
    // Seed 000: samples 10, 12, 100 (a spike), 11, 13, 12 with a window of 3.
    let got = run(
        Smoother::Sma { window: 3 },
        &[10.0, 12.0, 100.0, 11.0, 13.0, 12.0],
    );
    assert_close(&got[2..], &[40.7, 41.0, 41.3, 12.0], 0.05);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn tcp_srtt_is_an_ewma_with_one_eighth() {
    // RFC 6298: SRTT = 7/8·SRTT + 1/8·R.
    let got = run(Smoother::Ewma { alpha: 0.125 }, &[100.0, 200.0]);
    assert_close(&got, &[100.0, 112.5], 1e-9);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn bias_correction_removes_the_start_from_zero() {
    // Without correction β = 0.9 would report 0.1·x after the first sample.
    let got = run(
        Smoother::BiasCorrectedEwma { beta: 0.9 },
        &[80.0, 80.0, 80.0],
    );
    assert_close(&got, &[80.0, 80.0, 80.0], 1e-9);
    // Two samples 100 then 200: v = 0.9·10 + 20 = 29; corrected 29 / 0.19.
    let got = run(Smoother::BiasCorrectedEwma { beta: 0.9 }, &[100.0, 200.0]);
    assert_close(&got, &[100.0, 29.0 / 0.19], 1e-9);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn peak_ewma_jumps_to_a_peak_and_decays_with_time() {
    let tau_ms = 1_000;
    let s = Smoother::PeakEwma {
        tau_ms,
        peak_samples: 1,
    };
    let mut est = Estimate::default();
    s.observe(&mut est, &Batch::one(50.0), SEC);
    s.observe(&mut est, &Batch::one(500.0), 2 * SEC);
    assert_eq!(
        est.value_ms(),
        Some(500.0),
        "a peak replaces the estimate at once"
    );
    // One τ later a 50 ms sample keeps e^-1 of the old value.
    s.observe(&mut est, &Batch::one(50.0), 3 * SEC);
    let want = 500.0 * (-1f64).exp() + 50.0 * (1.0 - (-1f64).exp());
    assert_close(&[est.value_ms().unwrap_or(0.0)], &[want], 1e-9);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn peak_ewma_reads_a_batch_by_its_mean() {
    let s = Smoother::PeakEwma {
        tau_ms: 1_000,
        peak_samples: 1,
    };
    let mut est = Estimate::default();
    s.observe(&mut est, &Batch::one(50.0), SEC);
    // One slow answer among fast ones is the tail, not a slow host: no jump.
    let mut batch = Batch::default();
    for x in [40.0, 45.0, 95.0, 50.0] {
        batch.add(x);
    }
    s.observe(&mut est, &batch, 2 * SEC);
    assert_eq!(
        est.value_ms(),
        Some(57.5),
        "a batch mean above the estimate replaces it"
    );
    let mut slow = Batch::default();
    for x in [400.0, 500.0] {
        slow.add(x);
    }
    s.observe(&mut est, &slow, 2 * SEC + SEC / 10);
    assert_eq!(est.value_ms(), Some(450.0), "a slow batch is fled at once");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn peak_ewma_lifts_the_estimate_by_the_evidence_of_a_batch() {
    let s = Smoother::PeakEwma {
        tau_ms: 1_000,
        peak_samples: 4,
    };
    let start = |s: &Smoother| {
        let mut est = Estimate::default();
        s.observe(&mut est, &Batch::one(20.0), SEC);
        est
    };
    // One sample above the estimate moves it a quarter of the way, two half of it, four or
    // more all of it.
    for (samples, want) in [
        (1u32, 20.0 + 80.0 / 4.0),
        (2, 20.0 + 80.0 / 2.0),
        (4, 100.0),
        (9, 100.0),
    ] {
        let mut est = start(&s);
        let batch = Batch {
            count: samples,
            sum_ms: 100.0 * f64::from(samples),
        };
        s.observe(&mut est, &batch, SEC + SEC / 10);
        assert_close(&[est.value_ms().unwrap_or(0.0)], &[want], 1e-9);
    }
    // An estimate last updated long ago (5 τ) says little: one slow answer replaces it.
    let mut est = start(&s);
    s.observe(&mut est, &Batch::one(100.0), 6 * SEC);
    let want = 20.0 + 80.0 * (1.0 - (-5f64).exp());
    assert_close(&[est.value_ms().unwrap_or(0.0)], &[want], 1e-9);
    // Below the estimate, the count does not matter: time decides.
    let mut est = start(&s);
    s.observe(
        &mut est,
        &Batch {
            count: 4,
            sum_ms: 400.0,
        },
        SEC + SEC / 10,
    );
    s.observe(&mut est, &Batch::one(20.0), 2 * SEC + SEC / 10);
    let want = 100.0 * (-1f64).exp() + 20.0 * (1.0 - (-1f64).exp());
    assert_close(&[est.value_ms().unwrap_or(0.0)], &[want], 1e-9);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_with_fewer_samples_per_batch_is_not_scored_slower() {
    // Two hosts with the same latencies: one answers 8 requests per batch, the other 1. With
    // the classic peak (1) the sparse host's noisier batch means lift its estimate well above
    // the busy one's; weighing each batch by its samples keeps them close.
    let gap = |peak_samples: u32| {
        let s = Smoother::PeakEwma {
            tau_ms: 1_000,
            peak_samples,
        };
        let mut rng = fastrand::Rng::with_seed(11);
        let (mut busy, mut sparse) = (Estimate::default(), Estimate::default());
        let (mut sum_busy, mut sum_sparse) = (0.0, 0.0);
        let sample = |rng: &mut fastrand::Rng| 20.0 * (0.3 * (rng.f64() - 0.5) * 3.46).exp();
        for tick in 1..=2_000u64 {
            let now = tick * SEC / 10;
            let mut b = Batch::default();
            for _ in 0..8 {
                b.add(sample(&mut rng));
            }
            s.observe(&mut busy, &b, now);
            s.observe(&mut sparse, &Batch::one(sample(&mut rng)), now);
            if tick > 100 {
                sum_busy += busy.value_ms().unwrap_or(0.0);
                sum_sparse += sparse.value_ms().unwrap_or(0.0);
            }
        }
        sum_sparse / sum_busy
    };
    let (classic, weighed) = (gap(1), gap(4));
    assert!(
        classic > 1.12,
        "the classic peak scores the sparse host slower: {classic}"
    );
    assert!(
        weighed < 1.08,
        "weighed by samples, the two stay within a few percent: {weighed}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn decay_ewma_forgets_by_time_not_by_sample_count() {
    // Constant input split into batches of different sizes and spacing ends at the same value:
    // e^-a · e^-b = e^-(a+b), whatever the request rate.
    let s = Smoother::DecayEwma { tau_ms: 2_000 };
    let mut sparse = Estimate::default();
    let mut dense = Estimate::default();
    s.observe(&mut sparse, &Batch::one(1000.0), 0);
    s.observe(&mut dense, &Batch::one(1000.0), 0);
    s.observe(&mut sparse, &Batch::one(100.0), 4 * SEC);
    for i in 1..=40 {
        let mut batch = Batch::default();
        for _ in 0..(i % 7 + 1) {
            batch.add(100.0);
        }
        s.observe(&mut dense, &batch, i * SEC / 10);
    }
    let (a, b) = (
        sparse.value_ms().unwrap_or(0.0),
        dense.value_ms().unwrap_or(0.0),
    );
    assert!((a - b).abs() < 1e-6, "sparse {a} vs dense {b}");
    let want = 100.0 + 900.0 * (-2f64).exp();
    assert!((a - want).abs() < 1e-6, "{a} vs {want}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn dual_ewma_scores_the_worse_of_short_and_long() {
    let s = Smoother::DualEwma {
        short_tau_ms: 500,
        long_tau_ms: 10_000,
    };
    let got = run(s, &[100.0, 100.0, 1000.0, 100.0, 100.0, 100.0]);
    // One second is two short time constants: the spike lifts the short EWMA nearly all the way.
    let short_after_spike = 100.0 * (-2f64).exp() + 1000.0 * (1.0 - (-2f64).exp());
    assert!((got[2] - short_after_spike).abs() < 1e-9, "{got:?}");
    // Afterwards the long EWMA still remembers it while the short one has forgotten.
    assert!(got[5] > 150.0 && got[5] < got[2], "{got:?}");
    // Slowly improving hosts are held back by the long horizon.
    let improving = run(s, &[1000.0, 100.0]);
    assert!(improving[1] > 800.0, "{improving:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn every_smoother_converges_to_a_constant_input() {
    let smoothers = [
        Smoother::Ewma { alpha: 0.25 },
        Smoother::DecayEwma { tau_ms: 1_000 },
        Smoother::PeakEwma {
            tau_ms: 1_000,
            peak_samples: 4,
        },
        Smoother::Sma { window: 8 },
        Smoother::BiasCorrectedEwma { beta: 0.8 },
        Smoother::DualEwma {
            short_tau_ms: 500,
            long_tau_ms: 2_000,
        },
    ];
    for s in smoothers {
        let mut samples = vec![900.0];
        samples.extend(std::iter::repeat_n(60.0, 60));
        let last = *run(s, &samples).last().unwrap_or(&f64::NAN);
        assert!((last - 60.0).abs() < 0.5, "{s:?} ended at {last}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_empty_batch_changes_nothing() {
    let s = Smoother::Ewma { alpha: 0.3 };
    let mut est = Estimate::default();
    s.observe(&mut est, &Batch::one(70.0), SEC);
    let before = est.clone();
    s.observe(&mut est, &Batch::default(), 2 * SEC);
    assert_eq!(est, before);
}
