//! Every variant of the configuration's enums, once, for the tests that must cover them all.

#![allow(dead_code)] // each test binary uses its own part

use ewma_lb::balance::smoothing::Smoother;

/// Every smoother, once. The `match` makes a new algorithm a compile error here until it is
/// added to this list (and so to the schema and the round-trip tests that read it).
pub fn all_smoothers() -> Vec<Smoother> {
    let all = vec![
        Smoother::Ewma { alpha: 0.25 },
        Smoother::DecayEwma { tau_ms: 2_000 },
        Smoother::PeakEwma {
            tau_ms: 3_000,
            peak_samples: 2,
        },
        Smoother::Sma { window: 8 },
        Smoother::BiasCorrectedEwma { beta: 0.8 },
        Smoother::DualEwma {
            short_tau_ms: 500,
            long_tau_ms: 5_000,
        },
    ];
    for s in &all {
        match s {
            Smoother::Ewma { .. }
            | Smoother::DecayEwma { .. }
            | Smoother::PeakEwma { .. }
            | Smoother::Sma { .. }
            | Smoother::BiasCorrectedEwma { .. }
            | Smoother::DualEwma { .. } => {}
        }
    }
    all
}
