//! Weights: from each host's smoothed score to its share of the traffic.
//!
//! A share is `score^-exponent`, normalised, then shaped by four rules that keep the table calm:
//! - cold start: a host without samples is scored at the cluster's median, not 0 (it would be
//!   flooded) nor infinity (it would starve); seed 000;
//! - slow start: a new or returning host's share ramps up linearly over `slow_start`;
//! - damping: a share moves at most by a factor `max_step_ratio` per refresh (the anti-flap bound);
//! - floor: every live host keeps at least `min_share`, so a slow host keeps being probed and can
//!   earn its traffic back.
//! Ejected hosts get nothing; they are excluded before any of the rules apply.

use serde::{Deserialize, Serialize};

/// The tunables of [`shares`]; `config.weights` in the plugin configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WeightParams {
    /// Share ∝ score^-exponent. 1 is "inverse latency"; 2 makes a 10x slower host 100x less loaded.
    pub exponent: f64,
    /// Least share of every live host.
    pub min_share: f64,
    /// Largest factor by which one refresh may raise or lower a host's share.
    pub max_step_ratio: f64,
    /// Ramp-up time of a new or returning host, in ms; 0 turns slow start off.
    pub slow_start_ms: u64,
    /// Share factor a host starts its ramp at.
    pub slow_start_min_factor: f64,
}

impl Default for WeightParams {
    fn default() -> Self {
        WeightParams {
            exponent: 2.0,
            min_share: 0.005,
            max_step_ratio: 2.0,
            slow_start_ms: 5_000,
            slow_start_min_factor: 0.1,
        }
    }
}

/// What the weight computation needs to know of one host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostInput {
    /// Smoothed latency (failures included as penalty latency); `None` before any sample.
    pub score_ms: Option<f64>,
    /// Time since the host joined or came back from ejection.
    pub active_for_ns: u64,
    pub ejected: bool,
    /// The host's share in the table in force; `None` when it had none.
    pub previous_share: Option<f64>,
}

/// Computes the new shares, in the order of `hosts`. They sum to 1 unless every host is ejected
/// (then all are 0) or `hosts` is empty.
pub fn shares(hosts: &[HostInput], params: &WeightParams) -> Vec<f64> {
    let median = median(hosts.iter().filter(|h| !h.ejected).filter_map(|h| h.score_ms));
    let mut out: Vec<f64> = hosts
        .iter()
        .map(|h| {
            if h.ejected {
                return 0.0;
            }
            let score = h.score_ms.or(median).unwrap_or(1.0).max(MIN_SCORE_MS);
            score.powf(-params.exponent) * ramp(h.active_for_ns, params)
        })
        .collect();
    normalize(&mut out);
    for (share, host) in out.iter_mut().zip(hosts) {
        if let Some(prev) = host.previous_share.filter(|p| *p > 0.0 && !host.ejected) {
            let ratio = params.max_step_ratio.max(1.0);
            *share = share.clamp(prev / ratio, prev * ratio);
        }
    }
    normalize(&mut out);
    apply_floor(&mut out, params.min_share);
    out
}

/// Scores below this are treated as equal: no host is infinitely better than another.
const MIN_SCORE_MS: f64 = 0.1;

fn ramp(active_for_ns: u64, params: &WeightParams) -> f64 {
    if params.slow_start_ms == 0 {
        return 1.0;
    }
    let progress = active_for_ns as f64 / (params.slow_start_ms as f64 * 1e6);
    progress.clamp(params.slow_start_min_factor.clamp(0.0, 1.0), 1.0)
}

fn median(scores: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = scores.filter(|s| s.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let upper = v.get(mid).copied()?;
    if v.len() % 2 == 1 {
        return Some(upper);
    }
    v.get(mid - 1).map(|lower| (lower + upper) / 2.0)
}

fn normalize(shares: &mut [f64]) {
    let total: f64 = shares.iter().filter(|s| s.is_finite()).sum();
    for s in shares.iter_mut() {
        *s = if total > 0.0 && s.is_finite() { *s / total } else { 0.0 };
    }
}

/// Raises every positive share below `min` to `min`, taking the mass proportionally from the
/// others (water filling). Exact: afterwards the shares sum to 1 and none is below `min`, or all
/// are equal when `min` is too large for that.
fn apply_floor(shares: &mut [f64], min: f64) {
    let live = shares.iter().filter(|s| **s > 0.0).count();
    if live == 0 || min <= 0.0 {
        return;
    }
    if min * live as f64 >= 1.0 {
        for s in shares.iter_mut().filter(|s| **s > 0.0) {
            *s = 1.0 / live as f64;
        }
        return;
    }
    let mut pinned = vec![false; shares.len()];
    // Each pass pins at least one more host, so `live` passes always suffice.
    for _ in 0..live {
        let pinned_count = pinned.iter().filter(|p| **p).count();
        let free_mass: f64 = shares.iter().zip(&pinned).filter(|(_, p)| !**p).map(|(s, _)| *s).sum();
        let target_mass = 1.0 - min * pinned_count as f64;
        let scale = if free_mass > 0.0 { target_mass / free_mass } else { 0.0 };
        let mut newly_pinned = false;
        for (s, p) in shares.iter_mut().zip(pinned.iter_mut()) {
            if *p || *s <= 0.0 {
                continue;
            }
            if *s * scale < min {
                *s = min;
                *p = true;
                newly_pinned = true;
            }
        }
        if !newly_pinned {
            for (s, p) in shares.iter_mut().zip(&pinned) {
                if !*p {
                    *s *= scale;
                }
            }
            return;
        }
    }
}
