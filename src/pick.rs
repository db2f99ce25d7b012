//! Pick: choose one host from a prepared weight table, per request.
//!
//! The table is built once per weight refresh (cumulative shares), so a pick is a few random
//! numbers and binary searches: O(log n), no allocation. Randomness is a parameter, so tests and
//! the bench simulator are reproducible.
//!
//! The default pick is a weighted power of two choices, with two rules that keep the shares the
//! table says:
//! - the floor is a probe budget. Every host's share up to the floor (`weights::floor`) is
//!   drawn on its own, without a load comparison: a host at the floor would lose any comparison
//!   against a host carrying real traffic, so it would get no probes at all and could never earn
//!   its traffic back;
//! - the comparison is by load per unit of share (this worker's requests in flight / share), and
//!   a tie (most often: nothing in flight on either) goes to the host served least per unit of
//!   share since the table was adopted. With a `+ 1` in the cost instead, an idle pair would
//!   always go to the heavier host, turning a 2 % difference in weights into whole refreshes of
//!   traffic for one host; the served count turns ties into a smooth round of the shares.

use std::cell::Cell;
use std::rc::Rc;

use serde::Serialize;

use crate::config::ConfigError;
use crate::json::{variant, FromJson};
use crate::units::within;

/// How a host is chosen from the table; `pick` in the plugin configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PickAlgorithm {
    /// One weighted random draw.
    WeightedRandom,
    /// The floor as probes; otherwise two weighted draws above the floor, the one with fewer of
    /// this worker's requests in flight per unit of share wins (power of two choices). Reacts to
    /// load between refreshes.
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
        Self::NAMES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("", |(n, _)| n)
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
    /// Cumulative floor parts (`min(share, floor)`): the probe budget.
    probes: Vec<f64>,
    /// Each host's share above the floor, and their running sum: what P2C draws from.
    above: Vec<f64>,
    above_cumulative: Vec<f64>,
    /// Picks of each host by P2C since the table was built: the tie-break.
    served: Vec<Cell<u64>>,
}

impl PickTable {
    /// Builds a table from `(host, share)` pairs, without a floor; hosts with a share of 0
    /// (ejected) are left out.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a str, f64)>) -> Self {
        PickTable::with_floor(entries, 0.0)
    }

    /// [`PickTable::new`] with the probe budget of a floor: each host's share up to `floor` (a
    /// share of the table's total) is drawn as a probe, outside the load comparison.
    pub fn with_floor<'a>(entries: impl IntoIterator<Item = (&'a str, f64)>, floor: f64) -> Self {
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
        let floor = if floor.is_finite() {
            within(floor, 0.0, 1.0) * total
        } else {
            0.0
        };
        let (mut probes, mut above) = (0.0, 0.0);
        for w in &table.weights {
            let probe = w.min(floor);
            probes += probe;
            above += w - probe;
            table.probes.push(probes);
            table.above.push(w - probe);
            table.above_cumulative.push(above);
            table.served.push(Cell::new(0));
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
        draw(&self.cumulative, rng)
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
        let i = self
            .cumulative
            .partition_point(|c| *c <= r)
            .min(self.hosts.len() - 1);
        (i != excluded).then_some(i)
    }

    /// Weighted power of two choices with the floor as probes (see the module's doc). Each host
    /// is picked with probability close to its share when loads match the shares; `in_flight(i)`
    /// is this worker's count for host `i`.
    pub fn weighted_p2c(
        &self,
        rng: &mut fastrand::Rng,
        in_flight: impl Fn(usize) -> u32,
    ) -> Option<usize> {
        let total = *self.cumulative.last()?;
        let probes = self.probes.last().copied().unwrap_or(0.0);
        let r = rng.f64() * total;
        if r < probes {
            return Some(
                self.probes
                    .partition_point(|c| *c <= r)
                    .min(self.hosts.len() - 1),
            );
        }
        let Some(a) = draw(&self.above_cumulative, rng) else {
            return self.weighted(rng);
        };
        let b = draw(&self.above_cumulative, rng)?;
        let above = |i: usize| self.above.get(i).copied().unwrap_or(0.0);
        let served = |i: usize| self.served.get(i).map_or(0, Cell::get) as f64;
        // Cross-multiplied: no division, and a share of 0 (never drawn) cannot divide by zero.
        let load = |i: usize, other: usize| f64::from(in_flight(i)) * above(other);
        let (la, lb) = (load(a, b), load(b, a));
        let pick = if lb < la || (lb == la && served(b) * above(a) < served(a) * above(b)) {
            b
        } else {
            a
        };
        if let Some(n) = self.served.get(pick) {
            n.set(n.get().saturating_add(1));
        }
        Some(pick)
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
    pub fn pick(
        &self,
        algorithm: PickAlgorithm,
        rng: &mut fastrand::Rng,
        in_flight: impl Fn(usize) -> u32,
    ) -> Option<usize> {
        match algorithm {
            PickAlgorithm::WeightedRandom => self.weighted(rng),
            PickAlgorithm::WeightedP2c => self.weighted_p2c(rng, in_flight),
            PickAlgorithm::LowestLatency => self.heaviest(),
        }
    }
}

/// A draw from running sums: index `i` with probability `(c_i - c_{i-1}) / c_last`; `None` when
/// they are empty or sum to 0.
fn draw(cumulative: &[f64], rng: &mut fastrand::Rng) -> Option<usize> {
    let total = *cumulative.last()?;
    if total <= 0.0 {
        return None;
    }
    let r = rng.f64() * total;
    Some(
        cumulative
            .partition_point(|c| *c <= r)
            .min(cumulative.len() - 1),
    )
}
