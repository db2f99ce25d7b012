//! Smoothers: turn a host's noisy latency samples into one steady estimate.
//!
//! Balancing on raw, instantaneous latency sends traffic back and forth between hosts. Three gates
//! stop that, and each alone is not enough: smooth every host's samples (this module), recompute
//! the weight table on a timer rather than per request (`state`, `weights`), and pick by weighted
//! random rather than "always the fastest" (`pick`).
//!
//! Samples reach a smoother in batches: each worker VM collects the samples of one tick and merges
//! them into shared state at once. A batch is summarised by its count and mean, and every
//! smoother here is defined on that summary so that merging is cheap and never needs the raw
//! samples. Where a formula is exact only for equal samples it says so.
//!
//! Time is a parameter (`now_ns`), so the same code runs in the VM, natively and in the bench.

use std::collections::VecDeque;

use crate::units::ms_to_ns_f64;
use serde::{Deserialize, Serialize};

/// Upper bound on `sma.window`: the window lives in shared state, once per host.
pub(crate) const MAX_SMA_WINDOW: usize = 64;

/// The samples one worker saw for one host since its last merge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub count: u32,
    pub sum_ms: f64,
}

impl Batch {
    pub fn one(sample_ms: f64) -> Self {
        Batch {
            count: 1,
            sum_ms: sample_ms,
        }
    }

    pub fn add(&mut self, sample_ms: f64) {
        self.count = self.count.saturating_add(1);
        self.sum_ms += sample_ms;
    }

    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ms / f64::from(self.count))
    }
}

/// Which smoother, with its parameters. Chosen in the plugin configuration as `smoothing`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Smoother {
    /// Per-sample EWMA `v = α·x + (1−α)·v` (α 0.2-0.3 is typical; TCP's SRTT is α = 1/8).
    Ewma { alpha: f64 },
    /// Continuous-time EWMA: a sample's weight grows with the time since the last update, so the
    /// estimate forgets at the same speed whatever the request rate.
    DecayEwma { tau_ms: u64 },
    /// Peak EWMA (Finagle, tower, Linkerd): a sample above the estimate replaces it at once, lower
    /// samples pull it down with time decay. Quick to flee a slow host, slow to trust it again.
    /// Here the "sample" is a tick's batch mean: the tail of a healthy host's latencies would
    /// otherwise lift its estimate at random and swing the table between equal hosts. A batch of
    /// fewer than `peak_samples` samples lifts the estimate by only `count / peak_samples` of the
    /// way (or by the estimate's age, `1 − e^(−Δt/τ)`, when that is more): the mean of one or two
    /// samples is noisier than the mean of ten, and a peak taken over noisy means would score a
    /// host that gets less traffic slower by chance alone, and so give it still less (a
    /// recovering host stuck below its fair share). 1 is the classic peak.
    PeakEwma { tau_ms: u64, peak_samples: u32 },
    /// Sliding-window average over the last `window` samples, kept with a running sum.
    Sma { window: usize },
    /// The β form `v = β·v + (1−β)·x`, read as `v / (1 − β^t)` so early values are not biased to 0.
    BiasCorrectedEwma { beta: f64 },
    /// Two decay EWMAs, short and long; the score is their maximum, so a host must look good on
    /// both horizons before it is trusted.
    DualEwma { short_tau_ms: u64, long_tau_ms: u64 },
}

impl Smoother {
    /// The name `smoothing.algorithm` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Smoother::Ewma { .. } => "ewma",
            Smoother::DecayEwma { .. } => "decay_ewma",
            Smoother::PeakEwma { .. } => "peak_ewma",
            Smoother::Sma { .. } => "sma",
            Smoother::BiasCorrectedEwma { .. } => "bias_corrected_ewma",
            Smoother::DualEwma { .. } => "dual_ewma",
        }
    }
}

/// A host's smoothed latency and what its smoother needs to carry on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The smoothed latency in ms; `None` until the first sample.
    value_ms: Option<f64>,
    samples: u64,
    updated_ns: u64,
    registers: Registers,
}

/// State beyond the value itself, for the smoothers that need it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
enum Registers {
    #[default]
    None,
    Window {
        samples_ms: VecDeque<f64>,
        sum_ms: f64,
    },
    Biased {
        value_ms: f64,
    },
    Dual {
        short_ms: f64,
        long_ms: f64,
    },
}

impl Estimate {
    pub fn value_ms(&self) -> Option<f64> {
        self.value_ms
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub(crate) fn updated_ns(&self) -> u64 {
        self.updated_ns
    }
}

/// `exp(-Δt/τ)`: the weight the old value keeps after `dt_ns`.
fn decay(dt_ns: u64, tau_ms: u64) -> f64 {
    if tau_ms == 0 {
        return 0.0;
    }
    (-(dt_ns as f64) / ms_to_ns_f64(tau_ms as f64)).exp()
}

/// `keep·old + (1−keep)·new`.
fn blend(old: f64, new: f64, keep: f64) -> f64 {
    keep * old + (1.0 - keep) * new
}

impl Smoother {
    /// How far back the estimate remembers, for the weight of the evidence behind it
    /// (`persistence::Evidence`): the time constant of the time-decayed smoothers, the short one
    /// of the dual, and one second for the per-sample ones (whose memory is counted in samples).
    pub(crate) fn memory_ns(&self) -> u64 {
        let ms = match *self {
            Smoother::DecayEwma { tau_ms } | Smoother::PeakEwma { tau_ms, .. } => tau_ms,
            Smoother::DualEwma { short_tau_ms, .. } => short_tau_ms,
            Smoother::Ewma { .. } | Smoother::Sma { .. } | Smoother::BiasCorrectedEwma { .. } => {
                1_000
            }
        };
        ms_to_ns_f64(ms as f64) as u64
    }

    /// Folds one batch, observed up to `now_ns`, into `est`.
    pub fn observe(&self, est: &mut Estimate, batch: &Batch, now_ns: u64) {
        let Some(mean) = batch.mean_ms() else { return };
        let dt_ns = now_ns.saturating_sub(est.updated_ns);
        let n = i32::try_from(batch.count).unwrap_or(i32::MAX);
        let value = match (*self, est.value_ms) {
            // The classic form starts from the first sample.
            (Smoother::Ewma { .. } | Smoother::DecayEwma { .. }, None) => mean,
            // n steps of α; exact when the batch's samples are equal.
            (Smoother::Ewma { alpha }, Some(v)) => blend(v, mean, (1.0 - alpha).powi(n)),
            (Smoother::DecayEwma { tau_ms }, Some(v)) => blend(v, mean, decay(dt_ns, tau_ms)),
            (Smoother::PeakEwma { tau_ms, .. }, Some(v)) if mean <= v => {
                blend(v, mean, decay(dt_ns, tau_ms))
            }
            (
                Smoother::PeakEwma {
                    tau_ms,
                    peak_samples,
                },
                Some(v),
            ) => {
                // The evidence of the batch, or the age of the estimate, whichever is more: after
                // a silence of several τ (a proxy that sees a host once in seconds) the old value
                // says little, and one slow answer replaces it as the classic peak would.
                let evidence = (f64::from(batch.count) / f64::from(peak_samples.max(1))).min(1.0);
                let staleness = 1.0 - decay(dt_ns, tau_ms);
                v + (mean - v) * evidence.max(staleness)
            }
            (Smoother::PeakEwma { .. }, None) => mean,
            (Smoother::Sma { window }, _) => est.registers.push_window(mean, batch.count, window),
            (Smoother::BiasCorrectedEwma { beta }, _) => {
                let total = est.samples.saturating_add(u64::from(batch.count));
                est.registers.push_biased(mean, beta, n, total)
            }
            (
                Smoother::DualEwma {
                    short_tau_ms,
                    long_tau_ms,
                },
                _,
            ) => {
                est.registers
                    .push_dual(mean, decay(dt_ns, short_tau_ms), decay(dt_ns, long_tau_ms))
            }
        };
        est.value_ms = Some(value);
        est.samples = est.samples.saturating_add(u64::from(batch.count));
        est.updated_ns = now_ns;
    }
}

impl Registers {
    /// Pushes `count` copies of `mean` (at most a window's worth) and returns the window average.
    fn push_window(&mut self, mean: f64, count: u32, window: usize) -> f64 {
        let window = window.clamp(1, MAX_SMA_WINDOW);
        if !matches!(self, Registers::Window { .. }) {
            *self = Registers::Window {
                samples_ms: VecDeque::with_capacity(window),
                sum_ms: 0.0,
            };
        }
        let Registers::Window { samples_ms, sum_ms } = self else {
            return mean;
        };
        for _ in 0..(count as usize).min(window) {
            samples_ms.push_back(mean);
            *sum_ms += mean;
            while samples_ms.len() > window {
                *sum_ms -= samples_ms.pop_front().unwrap_or(0.0);
            }
        }
        *sum_ms / samples_ms.len().max(1) as f64
    }

    /// Advances the biased β register by `n` samples and returns it bias-corrected.
    fn push_biased(&mut self, mean: f64, beta: f64, n: i32, total_samples: u64) -> f64 {
        let old = match self {
            Registers::Biased { value_ms } => *value_ms,
            _ => 0.0,
        };
        let biased = blend(old, mean, beta.powi(n));
        *self = Registers::Biased { value_ms: biased };
        let t = i32::try_from(total_samples).unwrap_or(i32::MAX);
        let correction = 1.0 - beta.powi(t);
        if correction > f64::EPSILON {
            biased / correction
        } else {
            mean
        }
    }

    /// Advances both EWMAs of the dual smoother and returns their maximum.
    fn push_dual(&mut self, mean: f64, keep_short: f64, keep_long: f64) -> f64 {
        let (short_ms, long_ms) = match self {
            Registers::Dual { short_ms, long_ms } => (
                blend(*short_ms, mean, keep_short),
                blend(*long_ms, mean, keep_long),
            ),
            _ => (mean, mean),
        };
        *self = Registers::Dual { short_ms, long_ms };
        short_ms.max(long_ms)
    }
}

impl Default for Smoother {
    fn default() -> Self {
        Smoother::PeakEwma {
            tau_ms: DEFAULT_TAU_MS,
            peak_samples: DEFAULT_PEAK_SAMPLES,
        }
    }
}

/// Default time constant. Linkerd, Finagle and ingress-nginx use 10 s; ours is shorter so a host
/// that recovers earns its share back within seconds: a host's estimate comes back down from a
/// slow phase at this pace, and its share follows. So short a memory swings equal hosts' shares
/// when the weights follow every refresh; the noise band of `weights` keeps it calm
/// (bench/README.md, "Defaults").
pub(crate) const DEFAULT_TAU_MS: u64 = 1_000;

/// Default `peak_samples`: at 200 requests a second over four hosts and two workers, a tick's
/// batch holds two or three samples of a host; four lets a batch move the estimate most of the
/// way while a single slow answer moves it a quarter of it (bench/README.md, "Defaults").
pub(crate) const DEFAULT_PEAK_SAMPLES: u32 = 4;

/// Upper bound on `peak_samples`.
pub(crate) const MAX_PEAK_SAMPLES: u32 = 1_000;
