//! What a request costs each host, fitted from the log: latency as a function of time and of the
//! host's load, and failures as a function of time.
//!
//! A log shows what happened under the settings that ran: a host the plugin avoided was measured
//! rarely and lightly loaded. Replaying the logged latencies as they were would pretend another
//! policy would have met the same ones. So each host gets a model instead: a queue of `k` servers
//! (or none) whose service time is a level that moves with time (one per time bucket) times a
//! residual drawn from those the log showed. A request that finds n others in flight (reconstructed
//! from the log's overlapping intervals) waits for `n + 1 − k` of them to leave, so its latency is
//! about `service × max(1, (n + 1) / k)`; `k` is the one of that form that explains the log best.
//! The replay then runs that queue (`HostSpec::capacity`), so a host pushed past what it can serve
//! queues without end, as it would.
//!
//! (A latency merely growing with the load, linear or exponential, was tried first: fitted to a
//! log where the hosts were never saturated, it promised a settling point past their real
//! capacity, and recommended settings that saturated them in the real Envoy.) Failures: the
//! bucket's rate.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sim::FittedHost;

/// One request of the replayed window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Since the window's start.
    pub start_ns: u64,
    pub end_ns: u64,
    pub latency_ms: f64,
    /// A failure of the host's own (a route timeout is not: the replay makes those from latency).
    pub failed: bool,
}

/// A host's fit, and what it was fitted from.
#[derive(Clone, Debug)]
pub struct HostFit {
    pub model: FittedHost,
    /// Requests served at once (`None`: no limit seen).
    pub servers: Option<usize>,
    pub samples: usize,
    /// Buckets with at least one sample of their own.
    pub measured_buckets: usize,
    /// Mean requests in flight at the host when one started.
    pub mean_in_flight: f64,
    pub failure_rate: f64,
}

/// Residuals kept per host to draw from.
const MAX_RESIDUALS: usize = 10_000;
/// The servers are taken from how latency moves with load within buckets; below this spread of
/// in-flight counts that is not measurable, and the host has no limit.
const MIN_LOAD_VARIANCE: f64 = 1.0;
/// The server counts tried (`None`: no limit); the least squares one is taken.
const SERVERS: [Option<usize>; 18] = [
    None,
    Some(1),
    Some(2),
    Some(3),
    Some(4),
    Some(5),
    Some(6),
    Some(8),
    Some(10),
    Some(12),
    Some(16),
    Some(24),
    Some(32),
    Some(48),
    Some(64),
    Some(96),
    Some(128),
    Some(256),
];

/// How much longer than its service a request takes that finds `others` in flight at a queue of
/// `servers`.
fn queue_factor(others: usize, servers: Option<usize>) -> f64 {
    match servers {
        Some(k) if others >= k => (others + 1) as f64 / k as f64,
        _ => 1.0,
    }
}
/// A bucket's failure rate is pulled toward the host's by this many requests' worth.
const FAILURE_PRIOR: f64 = 5.0;

/// Requests in flight at the same host when each started (`samples` sorted by start).
pub fn in_flight_at_start(samples: &[Sample]) -> Vec<usize> {
    let mut ends: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    samples
        .iter()
        .map(|s| {
            while ends.peek().is_some_and(|Reverse(e)| *e <= s.start_ns) {
                ends.pop();
            }
            let n = ends.len();
            ends.push(Reverse(s.end_ns));
            n
        })
        .collect()
}

/// Fits one host from its samples (sorted by start) over `buckets` buckets of `bucket_s`.
pub fn fit(samples: &[Sample], bucket_s: f64, buckets: usize) -> HostFit {
    let buckets = buckets.max(1);
    let load = in_flight_at_start(samples);
    let bucket_of = |s: &Sample| ((s.start_ns as f64 / 1e9 / bucket_s) as usize).min(buckets - 1);
    let y: Vec<f64> = samples
        .iter()
        .map(|s| s.latency_ms.max(0.01).ln())
        .collect();
    // The servers: the count whose fit leaves the least spread within buckets (the level moves
    // with time, so only how latency moves with load inside a bucket says what load does).
    let mut best = (f64::INFINITY, None);
    let loads: Vec<f64> = load.iter().map(|n| *n as f64).collect();
    let varied = within_buckets(samples, &loads, bucket_of, buckets)
        >= MIN_LOAD_VARIANCE * 0.1 * samples.len() as f64;
    for k in SERVERS
        .into_iter()
        .take(if varied { SERVERS.len() } else { 1 })
    {
        let r: Vec<f64> = (0..samples.len())
            .map(|i| y[i] - queue_factor(load[i], k).ln())
            .collect();
        let sse = within_buckets(samples, &r, bucket_of, buckets);
        if sse < best.0 - 1e-9 {
            best = (sse, k);
        }
    }
    let servers = best.1;
    let explained = |i: usize| queue_factor(load[i], servers).ln();
    // The level of each bucket: the median of what load does not explain (a median, so one
    // spike does not lift its bucket).
    let mut adjusted: Vec<Vec<f64>> = vec![Vec::new(); buckets];
    for (i, s) in samples.iter().enumerate() {
        adjusted[bucket_of(s)].push(y[i] - explained(i));
    }
    let mut level: Vec<Option<f64>> = adjusted.iter_mut().map(|v| median(v)).collect();
    let measured_buckets = level.iter().filter(|l| l.is_some()).count();
    fill_nearest(&mut level);
    let level: Vec<f64> = level.into_iter().map(|l| l.unwrap_or(0.0)).collect();
    let mut residuals: Vec<f64> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| y[i] - explained(i) - level[bucket_of(s)])
        .collect();
    if residuals.len() > MAX_RESIDUALS {
        let step = residuals.len() as f64 / MAX_RESIDUALS as f64;
        residuals = (0..MAX_RESIDUALS)
            .filter_map(|k| residuals.get((k as f64 * step) as usize).copied())
            .collect();
    }
    if residuals.is_empty() {
        residuals.push(0.0);
    }
    let failures = samples.iter().filter(|s| s.failed).count();
    let failure_rate = failures as f64 / samples.len().max(1) as f64;
    let mut counts = vec![(0usize, 0usize); buckets];
    for s in samples {
        let c = &mut counts[bucket_of(s)];
        c.0 += 1;
        c.1 += usize::from(s.failed);
    }
    let fail = counts
        .iter()
        .map(|&(n, f)| (f as f64 + FAILURE_PRIOR * failure_rate) / (n as f64 + FAILURE_PRIOR))
        .collect();
    HostFit {
        model: FittedHost {
            bucket_s,
            level,
            fail,
            residuals,
        },
        servers,
        samples: samples.len(),
        measured_buckets,
        mean_in_flight: load.iter().sum::<usize>() as f64 / load.len().max(1) as f64,
        failure_rate,
    }
}

/// The sum of squares of `values` (one per sample) around their bucket's mean.
fn within_buckets(
    samples: &[Sample],
    values: &[f64],
    bucket_of: impl Fn(&Sample) -> usize,
    buckets: usize,
) -> f64 {
    let mut sum = vec![(0.0f64, 0.0f64, 0usize); buckets];
    for (s, v) in samples.iter().zip(values) {
        let b = &mut sum[bucket_of(s)];
        b.0 += v;
        b.1 += v * v;
        b.2 += 1;
    }
    sum.iter()
        .filter(|b| b.2 > 0)
        .map(|b| b.1 - b.0 * b.0 / b.2 as f64)
        .sum()
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Buckets without a sample take the nearest measured bucket's value (the earlier one on a tie).
fn fill_nearest(v: &mut [Option<f64>]) {
    let known: Vec<(usize, f64)> = v
        .iter()
        .enumerate()
        .filter_map(|(i, x)| x.map(|x| (i, x)))
        .collect();
    if known.is_empty() {
        return;
    }
    let mut k = 0;
    for (i, slot) in v.iter_mut().enumerate() {
        while k + 1 < known.len() && known[k + 1].0 <= i {
            k += 1;
        }
        if slot.is_none() {
            let before = known[k];
            let after = known.get(k + 1).copied();
            *slot = Some(match after {
                Some(a) if before.0 > i || a.0 - i < i - before.0 => a.1,
                _ => before.1,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start_ms: u64, latency_ms: f64) -> Sample {
        Sample {
            start_ns: start_ms * 1_000_000,
            end_ns: (start_ms as f64 * 1e6 + latency_ms * 1e6) as u64,
            latency_ms,
            failed: false,
        }
    }

    #[test]
    fn in_flight_counts_the_requests_still_open_at_each_start() {
        let v = [
            s(0, 100.0),
            s(10, 100.0),
            s(50, 10.0),
            s(105, 1.0),
            s(200, 1.0),
        ];
        assert_eq!(in_flight_at_start(&v), vec![0, 1, 2, 1, 0]);
    }

    #[test]
    fn the_level_follows_time_and_gaps_take_the_nearest_bucket() {
        // 10 ms in second 0, nothing in second 1, 100 ms in seconds 2 and 3.
        let mut v: Vec<Sample> = (0..50).map(|i| s(i * 20, 10.0)).collect();
        v.extend((100..200).map(|i| s(i * 20, 100.0)));
        let f = fit(&v, 1.0, 4);
        let ms: Vec<f64> = f.model.level.iter().map(|l| l.exp()).collect();
        assert!((ms[0] - 10.0).abs() < 0.5, "{ms:?}");
        assert!(
            (ms[2] - 100.0).abs() < 1.0 && (ms[3] - 100.0).abs() < 1.0,
            "{ms:?}"
        );
        assert!(ms[1] == ms[0] || ms[1] == ms[2], "{ms:?}");
        assert_eq!(f.measured_buckets, 3);
        assert_eq!(f.servers, None, "no overlap, no queue");
    }

    #[test]
    fn latency_that_grows_with_the_queue_gives_its_servers() {
        // Bursts of 8: the k-th request starts with k others in flight, and 2 servers serve
        // them 10 ms each.
        let mut v = Vec::new();
        for burst in 0..100u64 {
            for k in 0..8 {
                let ms = 10.0 * (k as f64 + 1.0).max(2.0) / 2.0;
                v.push(Sample {
                    start_ns: burst * 100_000_000 + k as u64 * 1000,
                    end_ns: burst * 100_000_000 + 50_000_000,
                    latency_ms: ms,
                    failed: false,
                });
            }
        }
        let f = fit(&v, 1.0, 10);
        assert_eq!(f.servers, Some(2));
    }
}
