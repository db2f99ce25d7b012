//! What a request costs each host, fitted from the log: latency as a function of time and of the
//! host's load, and failures as a function of time.
//!
//! A log shows what happened under the settings that ran: a host the plugin avoided was measured
//! rarely and lightly loaded. Replaying the logged latencies as they were would pretend another
//! policy would have met the same ones. So each host gets a model instead: a queue of `k` servers
//! (or none) whose service time is a level that moves with time (one per time bucket) times a
//! residual drawn from those the log showed. Each request's service is taken out of the log
//! exactly as that queue would have given it (`service_times`: its latency less its wait for a
//! server), and `k` is the count under which those service times are likeliest.
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
/// Below this spread of in-flight counts within buckets the log never queued at the host, so it
/// cannot tell how many servers the host has, and the host has no limit.
const MIN_LOAD_VARIANCE: f64 = 1.0;
/// The server counts tried (`None`: no limit); the likeliest is taken (`fit`).
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

/// One request's service as a queue would have given it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Service {
    /// When a server took it (since the window's start).
    begin_ns: u64,
    ms: f64,
}

/// Each request's service at a FIFO queue of `servers` (`None`: no queue), from when it arrived
/// and when it left: it started service when it arrived or when a server freed up for it,
/// whichever came later, and with FIFO order that is the `servers`-th latest departure among the
/// requests that arrived before it. The replay runs the same queue, so what it draws as service
/// is what the log's hosts spent on each request, not that plus a share of the wait. (`samples`
/// sorted by start; a departure is the start plus the latency.)
fn service_times(samples: &[Sample], servers: Option<usize>) -> Vec<Service> {
    let mut latest: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    samples
        .iter()
        .map(|s| {
            let done = s.start_ns + (s.latency_ms.max(0.0) * 1e6) as u64;
            let Some(k) = servers else {
                return Service {
                    begin_ns: s.start_ns,
                    ms: s.latency_ms,
                };
            };
            let begin_ns = match latest.peek() {
                Some(Reverse(free)) if latest.len() >= k => s.start_ns.max(*free),
                _ => s.start_ns,
            };
            latest.push(Reverse(done));
            if latest.len() > k {
                latest.pop();
            }
            Service {
                begin_ns,
                ms: done.saturating_sub(begin_ns) as f64 / 1e6,
            }
        })
        .collect()
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
    let bucket_at = |ns: u64| ((ns as f64 / 1e9 / bucket_s) as usize).min(buckets - 1);
    let arrived: Vec<usize> = samples.iter().map(|s| bucket_at(s.start_ns)).collect();
    // A service is bucketed by when it began, as the replay draws it (`FittedHost::sample`): a
    // request that queued through a change of level is served at the new one.
    let ln = |service: &[Service]| -> (Vec<f64>, Vec<usize>) {
        service
            .iter()
            .map(|s| (s.ms.max(0.01).ln(), bucket_at(s.begin_ns)))
            .unzip()
    };
    // The servers: the count under which the log is likeliest. Each count turns the log into
    // service times (one per request, `service_times`), and a queue of that count given those
    // services gives back the log exactly; so what tells the counts apart is how likely those
    // services are, each bucket's lognormal around its own level (the level moves with time;
    // the spread is the host's). Too many servers leave part of each wait in the service; too
    // few start requests before a server was free and cut their service short by varying
    // amounts. The `Σ ln s` term is the change of variable from ln s back to s: without it,
    // services all made shorter would look as good as the true ones.
    let loads: Vec<f64> = load.iter().map(|n| *n as f64).collect();
    let varied =
        within_buckets(&loads, &arrived, buckets) >= MIN_LOAD_VARIANCE * 0.1 * samples.len() as f64;
    let n = samples.len().max(1) as f64;
    let mut best = (f64::INFINITY, None, Vec::new(), Vec::new());
    for k in SERVERS
        .into_iter()
        .take(if varied { SERVERS.len() } else { 1 })
    {
        let (y, bucket) = ln(&service_times(samples, k));
        let spread = (within_buckets(&y, &bucket, buckets) / n).max(1e-6);
        let cost = y.iter().sum::<f64>() + n / 2.0 * spread.ln();
        if cost < best.0 - 1e-9 * n {
            best = (cost, k, y, bucket);
        }
    }
    let (_, servers, y, bucket) = best;
    // The level of each bucket: the median service (a median, so one spike does not lift its
    // bucket).
    let mut in_bucket: Vec<Vec<f64>> = vec![Vec::new(); buckets];
    for (y, b) in y.iter().zip(&bucket) {
        in_bucket[*b].push(*y);
    }
    let mut level: Vec<Option<f64>> = in_bucket.iter_mut().map(|v| median(v)).collect();
    let measured_buckets = level.iter().filter(|l| l.is_some()).count();
    fill_nearest(&mut level);
    let level: Vec<f64> = level.into_iter().map(|l| l.unwrap_or(0.0)).collect();
    let mut residuals: Vec<f64> = y.iter().zip(&bucket).map(|(y, b)| y - level[*b]).collect();
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
    for (s, b) in samples.iter().zip(&arrived) {
        let c = &mut counts[*b];
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

/// The sum of squares of `values` around their bucket's mean (`bucket`: one per value).
fn within_buckets(values: &[f64], bucket: &[usize], buckets: usize) -> f64 {
    let mut sum = vec![(0.0f64, 0.0f64, 0usize); buckets];
    for (v, b) in values.iter().zip(bucket) {
        let b = &mut sum[*b];
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

    /// A FIFO queue of `servers` fed `arrivals_ms` with `service_ms`: its samples as a log
    /// would show them, to the microsecond.
    fn queue(arrivals_ms: &[f64], service_ms: &[f64], servers: usize) -> Vec<Sample> {
        let mut free = vec![0.0f64; servers];
        arrivals_ms
            .iter()
            .zip(service_ms)
            .map(|(&a, &service)| {
                let (i, &at) = free
                    .iter()
                    .enumerate()
                    .min_by(|x, y| x.1.total_cmp(y.1))
                    .unwrap();
                let done = a.max(at) + service;
                free[i] = done;
                Sample {
                    start_ns: (a * 1000.0).round() as u64 * 1000,
                    end_ns: (done * 1000.0).round() as u64 * 1000,
                    latency_ms: ((done - a) * 1000.0).round() / 1000.0,
                    failed: false,
                }
            })
            .collect()
    }

    #[test]
    fn a_fifo_queues_service_times_come_back_exactly() {
        // Bursts of 8 at a queue of 2 servers: the requests leave in pairs.
        let arrivals: Vec<f64> = (0..100)
            .flat_map(|b| (0..8).map(move |k| b as f64 * 100.0 + k as f64 * 0.01))
            .collect();
        let service: Vec<f64> = (0..800).map(|i| 8.0 + (i % 5) as f64).collect();
        let v = queue(&arrivals, &service, 2);
        let got = service_times(&v, Some(2));
        for (g, want) in got.iter().zip(&service) {
            assert!((g.ms - want).abs() < 0.01, "{g:?} against {want}");
        }
        assert_eq!(fit(&v, 1.0, 10).servers, Some(2));
    }

    #[test]
    fn a_queue_near_its_capacity_is_fitted_at_its_true_service_time() {
        // Two servers, service 16-24 ms (mean 20), random arrivals at 90 % of capacity: most
        // requests find someone ahead. The fit must see the 20 ms, not a service shrunk by the
        // part of the wait it takes for the queue's (a service shorter by 5 % is a capacity 5 %
        // larger, and at this load the replay's queue then barely forms).
        let mut rng = fastrand::Rng::with_seed(7);
        let mut t = 0.0;
        let arrivals: Vec<f64> = (0..20_000)
            .map(|_| {
                t += -(1.0 - rng.f64()).ln() * 20.0 / 2.0 / 0.9;
                t
            })
            .collect();
        let service: Vec<f64> = (0..20_000).map(|_| 16.0 + 8.0 * rng.f64()).collect();
        let v = queue(&arrivals, &service, 2);
        let f = fit(&v, 1000.0, 1);
        assert_eq!(f.servers, Some(2));
        let median_ms = f.model.level[0].exp();
        assert!((median_ms - 20.0).abs() < 0.4, "{median_ms}");
    }
}
