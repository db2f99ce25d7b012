//! Pick: choose one host from a prepared weight table, per request.
//!
//! The table is built once per weight refresh (cumulative shares), so a pick is one random number
//! and a binary search: O(log n), no allocation. Randomness is a parameter, so tests and the
//! bench simulator are reproducible.

use std::rc::Rc;

use serde::Serialize;

use crate::config::ConfigError;
use crate::json::{variant, FromJson};

/// How a host is chosen from the table; `pick` in the plugin configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PickAlgorithm {
    /// One weighted random draw.
    WeightedRandom,
    /// Two weighted random draws; the one with fewer of this worker's requests in flight per unit
    /// of weight wins (power of two choices). Reacts to load between refreshes.
    #[default]
    WeightedP2c,
    /// Always the host with the highest weight. Shipped for the benchmark only: it is the
    /// "always the fastest" balancer the seeds warn herds and flaps.
    LowestLatency,
}

impl PickAlgorithm {
    /// Every algorithm by its name in the configuration.
    pub const NAMES: [(&'static str, PickAlgorithm); 3] = [
        ("weighted_random", PickAlgorithm::WeightedRandom),
        ("weighted_p2c", PickAlgorithm::WeightedP2c),
        ("lowest_latency", PickAlgorithm::LowestLatency),
    ];

    /// The name `pick` gives it.
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, p)| *p == self).map_or("", |(n, _)| n)
    }
}

impl FromJson for PickAlgorithm {
    fn from_json(value: &serde_json::Value, path: &str) -> Result<Self, ConfigError> {
        variant(value, path, &Self::NAMES)
    }
}

/// Cumulative shares of a cluster's pickable hosts, ready for sampling. Host addresses are
/// shared (`Rc<str>`), so a pick hands one out without allocating.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PickTable {
    hosts: Vec<Rc<str>>,
    weights: Vec<f64>,
    cumulative: Vec<f64>,
}

impl PickTable {
    /// Builds a table from `(host, share)` pairs; hosts with a share of 0 (ejected) are left out.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a str, f64)>) -> Self {
        let mut table = PickTable::default();
        let mut total = 0.0;
        for (host, share) in entries {
            if share > 0.0 && share.is_finite() {
                total += share;
                table.hosts.push(Rc::from(host));
                table.weights.push(share);
                table.cumulative.push(total);
            }
        }
        table
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn host(&self, index: usize) -> Option<&Rc<str>> {
        self.hosts.get(index)
    }

    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.iter().map(|h| &**h)
    }

    /// Weighted random draw: host `i` is chosen with probability `weight_i / Σ weight`.
    pub fn weighted(&self, rng: &mut fastrand::Rng) -> Option<usize> {
        let total = *self.cumulative.last()?;
        let r = rng.f64() * total;
        let i = self.cumulative.partition_point(|c| *c <= r);
        Some(i.min(self.hosts.len() - 1))
    }

    /// Weighted random draw among all hosts but `excluded`; `None` when no other host exists.
    pub fn weighted_except(&self, rng: &mut fastrand::Rng, excluded: usize) -> Option<usize> {
        let total = *self.cumulative.last()?;
        let w_excluded = *self.weights.get(excluded)?;
        let before_excluded = self.cumulative.get(excluded)? - w_excluded;
        let rest = total - w_excluded;
        if rest <= 0.0 {
            return None;
        }
        // Draw over the others' mass and step over the excluded host's interval.
        let mut r = rng.f64() * rest;
        if r >= before_excluded {
            r += w_excluded;
        }
        let i = self.cumulative.partition_point(|c| *c <= r).min(self.hosts.len() - 1);
        (i != excluded).then_some(i)
    }

    /// Power of two weighted choices: of two draws, the host with the lower
    /// `(in_flight + 1) / weight` wins. `in_flight(i)` is this worker's count for host `i`.
    pub fn weighted_p2c(&self, rng: &mut fastrand::Rng, in_flight: impl Fn(usize) -> u32) -> Option<usize> {
        let a = self.weighted(rng)?;
        let b = self.weighted(rng)?;
        let cost = |i: usize| {
            let weight = self.weights.get(i).copied().unwrap_or(0.0);
            (f64::from(in_flight(i)) + 1.0) / weight
        };
        Some(if cost(b) < cost(a) { b } else { a })
    }

    /// The host with the highest weight (ties: the first).
    pub fn heaviest(&self) -> Option<usize> {
        let mut heaviest: Option<(usize, f64)> = None;
        for (i, w) in self.weights.iter().enumerate() {
            if heaviest.is_none_or(|(_, best)| *w > best) {
                heaviest = Some((i, *w));
            }
        }
        heaviest.map(|(i, _)| i)
    }

    /// Picks with `algorithm`; `None` only for an empty table.
    pub fn pick(&self, algorithm: PickAlgorithm, rng: &mut fastrand::Rng, in_flight: impl Fn(usize) -> u32) -> Option<usize> {
        match algorithm {
            PickAlgorithm::WeightedRandom => self.weighted(rng),
            PickAlgorithm::WeightedP2c => self.weighted_p2c(rng, in_flight),
            PickAlgorithm::LowestLatency => self.heaviest(),
        }
    }
}
