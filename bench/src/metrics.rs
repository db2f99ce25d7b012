//! Metrics of a comparison beyond latency percentiles: the flapping index, its sampling-noise
//! floor, and how long a slowed host takes to get its traffic back. Definitions in
//! bench/README.md, "Flapping index".

use serde::Serialize;

use harness::summary::SecondShares;

use crate::figures::{Recovery, RoundFigures};

/// Flapping index and its noise floor, in percentage points.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Flapping {
    /// Mean over consecutive-second pairs and backends of |share(t) − share(t−1)|, × 100.
    pub index_pp: f64,
    /// What a static random split with the same mean shares and per-second counts would score,
    /// from binomial sampling noise alone, × 100.
    pub noise_pp: f64,
    /// Number of consecutive-second pairs measured.
    pub pairs: usize,
}

fn share(s: &SecondShares, backend: &str) -> f64 {
    s.shares.get(backend).copied().unwrap_or(0.0)
}

/// Flapping over `seconds[from..]` for `backends` (seconds without requests break the chain).
pub fn flapping(seconds: &[SecondShares], from: usize, backends: &[String]) -> Flapping {
    let window = seconds.get(from..).unwrap_or_default();
    if backends.is_empty() {
        return Flapping::default();
    }
    // Mean share of each backend over the window, weighted by requests.
    let total: u64 = window.iter().map(|s| s.count).sum();
    let mean: Vec<f64> = backends
        .iter()
        .map(|b| {
            let n: f64 = window.iter().map(|s| share(s, b) * s.count as f64).sum();
            if total > 0 {
                n / total as f64
            } else {
                0.0
            }
        })
        .collect();
    let (mut sum, mut noise, mut pairs) = (0.0, 0.0, 0usize);
    for w in window.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.count == 0 || b.count == 0 {
            continue;
        }
        pairs += 1;
        for (name, p) in backends.iter().zip(&mean) {
            sum += (share(b, name) - share(a, name)).abs();
            // E|X − Y| for two independent normal share estimates of the same p.
            let var = p * (1.0 - p) * (1.0 / a.count as f64 + 1.0 / b.count as f64);
            noise += (2.0 / std::f64::consts::PI).sqrt() * var.sqrt();
        }
    }
    if pairs == 0 {
        return Flapping::default();
    }
    let n = (pairs * backends.len()) as f64;
    Flapping {
        index_pp: 100.0 * sum / n,
        noise_pp: 100.0 * noise / n,
        pairs,
    }
}

/// Seconds from `recovered_at_s` until `backend`'s share, averaged over a 3-second window
/// starting there, first reaches `0.8 × fair`. `None` if it never does within the run.
pub fn recovery_seconds(
    seconds: &[SecondShares],
    backend: &str,
    recovered_at_s: f64,
    fair: f64,
) -> Option<f64> {
    const WINDOW: usize = 3;
    let start = recovered_at_s.ceil().max(0.0) as usize;
    for t in start..seconds.len().saturating_sub(WINDOW - 1) {
        let w = seconds.get(t..t + WINDOW)?;
        let mean = w.iter().map(|s| share(s, backend)).sum::<f64>() / WINDOW as f64;
        if mean >= 0.8 * fair {
            return Some(t as f64 - recovered_at_s);
        }
    }
    None
}

/// `backend`'s share of the requests sent in whole seconds `[from_s, to_s)`.
pub fn window_share(seconds: &[SecondShares], backend: &str, from_s: f64, to_s: f64) -> f64 {
    let (mut n, mut total) = (0.0, 0u64);
    for s in seconds
        .iter()
        .filter(|s| (s.second as f64) >= from_s && (s.second as f64) < to_s)
    {
        n += share(s, backend) * s.count as f64;
        total += s.count;
    }
    if total == 0 {
        0.0
    } else {
        n / total as f64
    }
}

/// The stretch before and from a slow phase's start over which the slowed host's share is
/// compared (seed 000's pause: one spike must not move the table for seconds).
const KEPT_S: f64 = 5.0;

/// A slowed host: its name and the seconds its slow phases start and end.
#[derive(Clone, Debug, PartialEq)]
pub struct Slowdown {
    pub host: String,
    pub from_s: f64,
    pub to_s: f64,
}

/// Fills the figures that come from per-second shares: flapping over every backend and over the
/// steady ones (when some are not), and for a slowdown the slowed host's share while slow and its
/// recovery. `from` is the first measured second.
pub fn share_figures(
    f: &mut RoundFigures,
    seconds: &[SecondShares],
    from: usize,
    names: &[String],
    steady: &[String],
    slowdown: Option<&Slowdown>,
) {
    let flap = flapping(seconds, from, names);
    f.flap_pp = flap.index_pp;
    f.flap_noise_pp = flap.noise_pp;
    if steady.len() > 1 && steady.len() < names.len() {
        let s = flapping(seconds, from, steady);
        f.steady_flap_pp = Some(s.index_pp);
        f.steady_flap_noise_pp = Some(s.noise_pp);
    }
    if let Some(sd) = slowdown {
        let fair = 1.0 / names.len().max(1) as f64;
        f.recovery = Some(Recovery::of(recovery_seconds(
            seconds, &sd.host, sd.to_s, fair,
        )));
        f.slow_phase_share_pct = Some(100.0 * window_share(seconds, &sd.host, sd.from_s, sd.to_s));
        let before = window_share(seconds, &sd.host, sd.from_s - KEPT_S, sd.from_s);
        if before > 0.0 {
            f.kept_5s =
                Some(window_share(seconds, &sd.host, sd.from_s, sd.from_s + KEPT_S) / before);
            let start = sd.from_s.max(0.0) as u64;
            f.lowest_second = seconds
                .iter()
                .filter(|s| s.second >= start && s.second < start + KEPT_S as u64)
                .filter(|s| s.count > 0)
                .map(|s| share(s, &sd.host) / before)
                .reduce(f64::min);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn sec(t: u64, count: u64, shares: &[(&str, f64)]) -> SecondShares {
        SecondShares {
            second: t,
            count,
            shares: shares
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn steady_split_does_not_flap_and_a_flip_flop_does() {
        let names = vec!["a".to_string(), "b".to_string()];
        let steady: Vec<_> = (0..10)
            .map(|t| sec(t, 100, &[("a", 0.5), ("b", 0.5)]))
            .collect();
        assert_eq!(flapping(&steady, 0, &names).index_pp, 0.0);
        let flip: Vec<_> = (0..10)
            .map(|t| {
                if t % 2 == 0 {
                    sec(t, 100, &[("a", 1.0)])
                } else {
                    sec(t, 100, &[("b", 1.0)])
                }
            })
            .collect();
        let f = flapping(&flip, 0, &names);
        assert_eq!(f.pairs, 9);
        assert!((f.index_pp - 100.0).abs() < 1e-9, "{f:?}");
        // Noise floor of a 50/50 split at 100 req/s: sqrt(2/pi) * sqrt(0.25 * 0.02) * 100 ≈ 5.6 pp.
        assert!((f.noise_pp - 5.64).abs() < 0.05, "{f:?}");
    }

    #[test]
    fn flapping_skips_the_warmup_and_empty_seconds() {
        let names = vec!["a".to_string()];
        let v = vec![
            sec(0, 10, &[("a", 0.0)]),
            sec(1, 10, &[("a", 1.0)]),
            sec(2, 0, &[]),
            sec(3, 10, &[("a", 1.0)]),
        ];
        assert_eq!(flapping(&v, 1, &names).pairs, 0);
        assert_eq!(flapping(&v, 0, &names).pairs, 1);
    }

    #[test]
    fn recovery_is_the_first_window_back_near_fair() {
        let v: Vec<_> = (0..20)
            .map(|t| {
                let s = if t < 12 { 0.01 } else { 0.25 };
                sec(t, 100, &[("slow", s)])
            })
            .collect();
        assert_eq!(recovery_seconds(&v, "slow", 10.0, 0.25), Some(2.0));
        assert_eq!(recovery_seconds(&v[..11], "slow", 10.0, 0.25), None);
        assert!((window_share(&v, "slow", 0.0, 12.0) - 0.01).abs() < 1e-12);
    }
}
