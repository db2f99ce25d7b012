//! Aggregates of load records: latency percentiles, errors, traffic share per backend.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::Record;

/// Key for answers without an `x-backend` header (transport errors, Envoy's own replies).
pub const NO_BACKEND: &str = "(none)";
/// Histogram range in microseconds; longer values are clamped to it.
const MAX_US: u64 = 3_600_000_000;

/// Totals and latency percentiles (milliseconds) of a set of records.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Requests sent (dropped arrivals excluded).
    pub count: u64,
    /// Status 0 or >= 500.
    pub errors: u64,
    /// Status 0 only (connect failure, reset, timeout).
    pub transport_errors: u64,
    /// Arrivals the generator dropped at its in-flight bound.
    pub dropped: u64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// Share of sent requests per `x-backend` value (sums to 1 when count > 0).
    pub shares: BTreeMap<String, f64>,
}

impl Summary {
    /// Summarises `records`.
    pub fn of(records: &[Record]) -> Summary {
        Summary::from(records)
    }

    /// `errors / count`, 0 when nothing was sent.
    pub fn error_rate(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.errors as f64 / self.count as f64
        }
    }

    /// Share of backend `name`, 0 if it served nothing.
    pub fn share(&self, name: &str) -> f64 {
        self.shares.get(name).copied().unwrap_or(0.0)
    }
}

fn histogram() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_US, 3).ok()
}

fn micros(d: Duration) -> u64 {
    (d.as_micros().min(MAX_US as u128) as u64).max(1)
}

impl From<&[Record]> for Summary {
    /// Latency covers every sent request, errors and timeouts included, since a client waits for them too.
    fn from(records: &[Record]) -> Summary {
        let mut s = Summary::default();
        let Some(mut h) = histogram() else { return s };
        let mut per_backend: BTreeMap<String, u64> = BTreeMap::new();
        let mut total_us: u128 = 0;
        for r in records {
            if r.dropped {
                s.dropped += 1;
                continue;
            }
            s.count += 1;
            if r.is_error() {
                s.errors += 1;
            }
            if r.status == 0 {
                s.transport_errors += 1;
            }
            let us = micros(r.latency);
            total_us += us as u128;
            let _ = h.record(us);
            *per_backend
                .entry(r.backend.clone().unwrap_or_else(|| NO_BACKEND.to_string()))
                .or_insert(0) += 1;
        }
        if s.count == 0 {
            return s;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        s.avg_ms = total_us as f64 / s.count as f64 / 1000.0;
        s.p50_ms = ms(h.value_at_quantile(0.50));
        s.p95_ms = ms(h.value_at_quantile(0.95));
        s.p99_ms = ms(h.value_at_quantile(0.99));
        s.p999_ms = ms(h.value_at_quantile(0.999));
        s.max_ms = ms(h.max());
        s.shares = per_backend
            .into_iter()
            .map(|(k, n)| (k, n as f64 / s.count as f64))
            .collect();
        s
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "requests {}  errors {} ({:.2}%, transport {})  dropped {}",
            self.count,
            self.errors,
            100.0 * self.error_rate(),
            self.transport_errors,
            self.dropped
        )?;
        writeln!(
            f,
            "latency ms  avg {:.1}  p50 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            self.avg_ms, self.p50_ms, self.p95_ms, self.p99_ms, self.p999_ms, self.max_ms
        )?;
        write!(f, "share      {}", format_shares(&self.shares))
    }
}

/// `name 45.0%  name 55.0%`.
pub fn format_shares(shares: &BTreeMap<String, f64>) -> String {
    shares
        .iter()
        .map(|(k, v)| format!("{k} {:.1}%", 100.0 * v))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Traffic share per backend within one second of the run.
#[derive(Clone, Debug, Serialize)]
pub struct SecondShares {
    /// Whole seconds since the start, by `sent_at`.
    pub second: u64,
    /// Requests sent in that second (dropped excluded).
    pub count: u64,
    pub shares: BTreeMap<String, f64>,
}

/// Per-second traffic shares, one entry per second from 0 to the last record (empty seconds included).
pub fn shares_per_second(records: &[Record]) -> Vec<SecondShares> {
    let last = records
        .iter()
        .filter(|r| !r.dropped)
        .map(|r| r.sent_at.as_secs())
        .max();
    let Some(last) = last else { return Vec::new() };
    let mut counts: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); last as usize + 1];
    for r in records.iter().filter(|r| !r.dropped) {
        if let Some(sec) = counts.get_mut(r.sent_at.as_secs() as usize) {
            *sec.entry(r.backend.clone().unwrap_or_else(|| NO_BACKEND.to_string()))
                .or_insert(0) += 1;
        }
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let count: u64 = m.values().sum();
            let shares = m
                .into_iter()
                .map(|(k, n)| (k, n as f64 / count.max(1) as f64))
                .collect();
            SecondShares {
                second: i as u64,
                count,
                shares,
            }
        })
        .collect()
}
