//! Pick: choose one host from a prepared weight table, per request.
//!
//! The table is built once per weight refresh (cumulative shares), so a pick is a few random
//! numbers and binary searches: O(log n), no allocation. Randomness is a parameter, so tests and
//! the bench simulator are reproducible.
//!
//! The default pick is a weighted power of two choices over each host's share above the floor
//! (`weights::floor`). A host at the floor is out of favour: it is never a candidate here, and
//! gets its samples from probes, which are spent by time (`probe`), not by share. Drawn as a
//! candidate, a host at the floor would win every comparison in which it has nothing in flight,
//! and at thousands of requests a second that is several requests a second to a host that takes
//! a second to answer.
//!
//! The two candidates are distinct hosts. The first comes from a golden-ratio sequence (a Weyl
//! sequence, `u + k·0.618...` modulo 1, from a random start) mapped through the shares instead of
//! from independent random numbers: over any run of requests each host is the first candidate in
//! proportion to its share, and its turns come at nearly even spacing (at most three distinct
//! gaps). Independent draws clump: one host gets two of a worker's requests close together while
//! another waits, and a host that serves one request at a time queues the second. Even spacing is
//! what round robin gives equal hosts and why, over hosts that serve one request at a time, it
//! beats least request's two random choices even when least request sees every worker's queue
//! (bench/README.md, "The tail and the calm"). The second candidate is an independent draw, so
//! a host whose turn it is still loses to a less loaded one.
//!
//! The comparison is by load per unit of share (this worker's requests in flight / share), and a
//! tie (most often: nothing in flight on either) goes to the host served least per unit of share
//! since the table was adopted, then to the first candidate. With a `+ 1` in the cost instead, an
//! idle pair would always go to the heavier host, turning a 2 % difference in weights into whole
//! refreshes of traffic for one host; the served count turns ties into a smooth round of the
//! shares. With equal shares this is least request's two choices over this worker's requests in
//! flight, with the first choice taken in turn; `weighted_p2c_unless_equal` leaves a table that
//! cannot tell its hosts apart to Envoy's least request itself, which counts every worker's
//! requests (`worker::route`).
//!
//! At equal counts above zero, load per unit of share is decided by the shares alone, and equal
//! hosts' shares differ by chance: the heavier of the moment would take every such comparison
//! until a refresh turned the order round, and equal hosts would swing with the refreshes
//! (bench/README.md, "Ties at equal counts"). So at equal counts the queues of the moment decide
//! first: a host that has kept this worker waiting longer than it usually takes (its latency, or
//! the traffic's when that is higher: what the patience below is a multiple of) loses to one that
//! has not. Failing that, two shares within one noise step of each other (`noise_band ^
//! noise_gain`, the most one refresh moves a share on chance alone, `weights`) are taken as
//! equal and the first candidate, whose turn it is, wins; shares further apart keep the strict
//! order, which is how a host the table knows to be smaller or slower gets fewer requests.
//!
//! A host the table has no latency of yet (new, or back from ejection) is on trust: it is scored
//! at the cluster's median and ramped in by time (slow start), before a single answer says how
//! fast it is. A host that takes a second or two to answer would take a ramp's worth of requests
//! before its first answer arrived, some of them past the route's timeout (bench/README.md,
//! "cold-return"). So while such a host has a request of this worker's in flight (or
//! one it never answered), it loses every comparison to a candidate that has an answer behind it:
//! each worker sends it one request at a time until the table holds its latency. A host that
//! answers in milliseconds is held to one at a time for those milliseconds, until the next
//! refresh; two such hosts are compared as usual.
//!
//! The same rule holds back a host the table knows once it keeps a request past its patience:
//! while this worker has waited on it, with no answer, longer than `probe_timeout_factor` times
//! what the table's traffic or the host itself usually takes (the probes' wait, `probe`), it
//! loses every comparison to a candidate that is not overdue, until it answers anything.
//! Requests in flight steer away from a host that stalls, but by count only: a host that has just
//! hung still wins against a candidate holding as many requests, and took two or three of each
//! worker's before it lost for good, every one of them lost (bench/README.md, "host-hung"). A
//! healthy host rarely takes four times its mean (the probes' doc), and each answer restarts the
//! wait. The weights are not touched: a pause diverts only the requests that arrive during it.

use std::cell::Cell;
use std::rc::Rc;

use serde::Serialize;

use crate::units::clamp;

/// How a host is chosen from the table; `pick` in the plugin configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PickAlgorithm {
    /// One weighted random draw.
    WeightedRandom,
    /// Two weighted draws over the shares above the floor; the one with fewer of this worker's
    /// requests in flight per unit of share wins (power of two choices). Reacts to load between
    /// refreshes.
    #[default]
    WeightedP2c,
    /// [`PickAlgorithm::WeightedP2c`], unless the table cannot tell its hosts apart: then the
    /// cluster's fallback policy (`weights::indistinguishable`; the worker decides).
    WeightedP2cUnlessEqual,
    /// Always the host with the highest weight. Shipped for the benchmark only: "always the
    /// fastest" herds every request onto one host and flaps when another looks faster.
    LowestLatency,
}

impl PickAlgorithm {
    /// Every algorithm by its name in the configuration.
    pub(crate) const NAMES: [(&'static str, PickAlgorithm); 4] = [
        ("weighted_random", PickAlgorithm::WeightedRandom),
        ("weighted_p2c", PickAlgorithm::WeightedP2c),
        (
            "weighted_p2c_unless_equal",
            PickAlgorithm::WeightedP2cUnlessEqual,
        ),
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

/// Cumulative shares of a cluster's pickable hosts, ready for sampling. Host addresses are
/// shared (`Rc<str>`), so a pick hands one out without allocating.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PickTable {
    /// The live hosts: the table's own list when every host it lists is (`PickTable::over`).
    hosts: Rc<[Rc<str>]>,
    weights: Vec<f64>,
    cumulative: Vec<f64>,
    /// Each host's share above the floor, and their running sum: what P2C draws from.
    above: Vec<f64>,
    above_cumulative: Vec<f64>,
    /// Picks of each host by P2C since the table was built: the tie-break.
    served: Vec<Cell<u64>>,
    /// Where the first candidate's sequence stands, in [0, 1); negative until the first pick,
    /// which starts it at random (so workers and proxies do not take turns in step).
    turn: Cell<f64>,
    /// How long each host may keep this worker waiting on a request before it is overdue (the
    /// module's doc), index for index: 0 for a host on trust; empty when no host has a limit.
    patience_ns: Vec<u64>,
    /// What each host usually takes to answer (the patience's unit), index for index: a host
    /// that has kept this worker waiting longer is late, and loses a comparison at equal counts
    /// to one that is not. Empty when unknown.
    usual_ns: Vec<u64>,
    /// Shares within this factor of each other are equal at equal counts (the module's doc); 0
    /// (the default) for none.
    noise_step: f64,
}

/// How long a host may keep a worker waiting on a request, with no answer, before the
/// two-choice pick holds it against the host (the module's doc); `u64::MAX` for no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waits {
    /// What the host usually takes: beyond it the host is late, and loses at equal counts to a
    /// host that is not.
    pub usual_ns: u64,
    /// Beyond it the host is overdue, and loses every comparison to a host that is not; 0 for a
    /// host on trust.
    pub patience_ns: u64,
}

impl Waits {
    /// No limit: never late, never overdue.
    pub const NONE: Waits = Waits {
        usual_ns: u64::MAX,
        patience_ns: u64::MAX,
    };
}

/// What one worker has pending at a host, as the two-choice pick weighs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostLoad {
    /// Requests in flight, and those it never answered (`worker`'s `InFlight::load`).
    pub requests: u32,
    /// How long the worker has waited on it without an answer: since it was sent a request with
    /// nothing pending there, or since its last answer, whichever is later. 0 with nothing
    /// pending.
    pub waited_ns: u64,
}

impl From<u32> for HostLoad {
    /// A count alone: no wait, so only a host on trust can be overdue.
    fn from(requests: u32) -> Self {
        HostLoad {
            requests,
            waited_ns: 0,
        }
    }
}

impl PickTable {
    /// Builds a table from `(host, share)` pairs, without a floor; hosts with a share of 0
    /// (ejected) are left out.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a str, f64)>) -> Self {
        PickTable::with_floor(entries, 0.0)
    }

    /// [`PickTable::new`] with a floor (a share of the table's total): P2C draws each host by its
    /// share above it, so a host at the floor is never its candidate.
    pub fn with_floor<'a>(entries: impl IntoIterator<Item = (&'a str, f64)>, floor: f64) -> Self {
        let names: Vec<(Rc<str>, f64)> = entries
            .into_iter()
            .map(|(host, share)| (Rc::from(host), share))
            .collect();
        PickTable::shared(names.iter().map(|(host, share)| (host, *share)), floor)
    }

    /// [`PickTable::with_floor`] over names the caller holds: the table shares them instead of
    /// copying them (a new table of a 10,000-host cluster otherwise allocated 10,000 names on
    /// every VM).
    pub fn shared<'a>(entries: impl IntoIterator<Item = (&'a Rc<str>, f64)>, floor: f64) -> Self {
        let (names, shares): (Vec<Rc<str>>, Vec<f64>) = entries
            .into_iter()
            .map(|(host, share)| (Rc::clone(host), share))
            .unzip();
        PickTable::over(
            &names.into(),
            shares.into_iter().map(|share| (share, Waits::NONE)),
            floor,
        )
    }

    /// Whether a host with this share has a place in a table: a positive, finite share. What
    /// the table leaves out, so does anything kept index for index with it.
    pub fn holds(share: f64) -> bool {
        share > 0.0 && share.is_finite()
    }

    /// A table over `hosts`, a list the caller holds (a `record::Table`'s addresses), with each
    /// host's share and waits ([`PickTable::set_waits`]) index for index; hosts with a share of
    /// 0 are left out. When none is, the table shares the list itself: a VM adopting a table of
    /// 10,000 hosts neither copies 10,000 names nor counts each one (bench/README.md, "Shared
    /// state at 10,000 endpoints"). One walk for the shares and the waits.
    pub fn over(
        hosts: &Rc<[Rc<str>]>,
        entries: impl IntoIterator<Item = (f64, Waits)>,
        floor: f64,
    ) -> Self {
        let capacity = hosts.len();
        let mut table = PickTable {
            turn: Cell::new(-1.0),
            weights: Vec::with_capacity(capacity),
            cumulative: Vec::with_capacity(capacity),
            usual_ns: Vec::with_capacity(capacity),
            patience_ns: Vec::with_capacity(capacity),
            ..PickTable::default()
        };
        // The live hosts, once one is left out; until then they are the list's first ones.
        let mut live: Option<Vec<Rc<str>>> = None;
        let mut walked = 0;
        let mut total = 0.0;
        for (i, (host, (share, waits))) in hosts.iter().zip(entries).enumerate() {
            walked = i + 1;
            if PickTable::holds(share) {
                total += share;
                if let Some(live) = &mut live {
                    live.push(Rc::clone(host));
                }
                table.weights.push(share);
                table.cumulative.push(total);
                table.usual_ns.push(waits.usual_ns);
                table.patience_ns.push(waits.patience_ns);
            } else if live.is_none() {
                live = Some(hosts.get(..i).unwrap_or_default().to_vec());
            }
        }
        table.hosts = match live {
            None if walked == hosts.len() => Rc::clone(hosts),
            None => hosts.get(..walked).unwrap_or_default().into(),
            Some(live) => live.into(),
        };
        table.drop_unlimited_waits();
        let floor = if floor.is_finite() {
            clamp(floor, 0.0, 1.0) * total
        } else {
            0.0
        };
        let n = table.weights.len();
        table.above.reserve_exact(n);
        table.above_cumulative.reserve_exact(n);
        table.served.reserve_exact(n);
        let mut above = 0.0;
        for w in &table.weights {
            let excess = (w - floor).max(0.0);
            above += excess;
            table.above.push(excess);
            table.above_cumulative.push(above);
            table.served.push(Cell::new(0));
        }
        table
    }

    /// Marks the hosts the table has no latency of yet (`unproven(address)`), which P2C sends
    /// one request of this worker's at a time (the module's doc); no other host is ever overdue.
    pub fn set_unproven(&mut self, unproven: impl Fn(&str) -> bool) {
        self.set_patience(|h| match unproven(h) {
            true => 0,
            false => u64::MAX,
        });
    }

    /// Sets how long each host may keep this worker waiting before it is overdue
    /// (`patience_ns(address)`, the module's doc): 0 for a host on trust, `u64::MAX` for none. No
    /// host is ever late.
    pub fn set_patience(&mut self, patience_ns: impl Fn(&str) -> u64) {
        self.set_waits(|h| Waits {
            patience_ns: patience_ns(h),
            ..Waits::NONE
        });
    }

    /// Sets, for each host (`waits(address)`), how long it may keep this worker waiting before
    /// it is late (at equal counts) and before it is overdue (the module's doc).
    pub fn set_waits(&mut self, waits: impl Fn(&str) -> Waits) {
        let (usual, patience) = self
            .hosts
            .iter()
            .map(|h| {
                let w = waits(h);
                (w.usual_ns, w.patience_ns)
            })
            .unzip();
        self.usual_ns = usual;
        self.patience_ns = patience;
        self.drop_unlimited_waits();
    }

    /// Keeps no limits where no host has one: the pick then skips the lookups.
    fn drop_unlimited_waits(&mut self) {
        for waits in [&mut self.usual_ns, &mut self.patience_ns] {
            if waits.iter().all(|w| *w == u64::MAX) {
                *waits = Vec::new();
            }
        }
    }

    /// Sets the factor within which two shares are equal at equal counts: one refresh's noise
    /// step, `noise_band ^ noise_gain` (the module's doc). 1 or less, or not finite: none.
    pub fn set_noise_step(&mut self, step: f64) {
        self.noise_step = if step.is_finite() && step > 1.0 {
            step
        } else {
            0.0
        };
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

    /// The share of host `index` in the table (of the table's total).
    pub fn share(&self, index: usize) -> f64 {
        let total = self.cumulative.last().copied().unwrap_or(0.0);
        match self.weights.get(index) {
            Some(w) if total > 0.0 => w / total,
            _ => 0.0,
        }
    }

    /// Records a pick that did not come from [`PickTable::weighted_p2c`] (a probe), so the
    /// tie-break counts every request a host was sent.
    pub(crate) fn count_served(&self, index: usize) {
        if let Some(n) = self.served.get(index) {
            n.set(n.get().saturating_add(1));
        }
    }

    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.iter().map(|h| &**h)
    }

    /// The table's hosts, in its order (sorted by address when built from a record).
    pub(crate) fn host_list(&self) -> &[Rc<str>] {
        &self.hosts
    }

    /// Weighted random draw: host `i` is chosen with probability `weight_i / Σ weight`.
    pub fn weighted(&self, rng: &mut fastrand::Rng) -> Option<usize> {
        draw(&self.cumulative, rng)
    }

    /// Weighted random draw among all hosts but `excluded`; `None` when no other host exists.
    pub fn weighted_except(&self, rng: &mut fastrand::Rng, excluded: usize) -> Option<usize> {
        draw_except(&self.weights, &self.cumulative, excluded, rng)
    }

    /// Weighted power of two choices over the shares above the floor (see the module's doc). Each
    /// host above the floor is picked with probability close to its share when loads match the
    /// shares; `load(i)` is what this worker has pending at host `i` (a count alone will do).
    pub fn weighted_p2c<L: Into<HostLoad>>(
        &self,
        rng: &mut fastrand::Rng,
        load: impl Fn(usize) -> L,
    ) -> Option<usize> {
        let Some(a) = self.draw_in_turn(rng) else {
            return self.weighted(rng);
        };
        // Two distinct candidates, as tower and Linkerd draw them: with replacement, a host with
        // most of the share would be compared with itself share² of the time and keep that much
        // of the traffic while it stalls.
        let Some(b) = draw_except(&self.above, &self.above_cumulative, a, rng) else {
            self.count_served(a);
            return Some(a);
        };
        let above = |i: usize| self.above_floor(i);
        let served = |i: usize| self.served.get(i).map_or(0, Cell::get) as f64;
        let (ha, hb): (HostLoad, HostLoad) = (load(a).into(), load(b).into());
        let (na, nb) = (ha.requests, hb.requests);
        // Cross-multiplied: no division, and a share of 0 (never drawn) cannot divide by zero.
        let (la, lb) = (f64::from(na) * above(b), f64::from(nb) * above(a));
        // On trust and waiting for its answer, or kept waiting past its patience (the module's
        // doc).
        let overdue = |i: usize, h: HostLoad| {
            h.requests > 0 && self.patience_ns.get(i).is_some_and(|p| h.waited_ns >= *p)
        };
        let even = match na == nb && na > 0 {
            true => self.at_equal_counts((a, ha), (b, hb)),
            false => None,
        };
        let pick = match (overdue(a, ha), overdue(b, hb), even) {
            (true, false, _) => b,
            (false, true, _) => a,
            (_, _, Some(pick)) => pick,
            _ if lb < la || (lb == la && served(b) * above(a) < served(a) * above(b)) => b,
            _ => a,
        };
        if let Some(n) = self.served.get(pick) {
            n.set(n.get().saturating_add(1));
        }
        Some(pick)
    }

    /// Between two candidates with as many requests in flight (the module's doc): the one not
    /// late when the other is, else the first when their shares are within a noise step; `None`
    /// leaves it to the shares' strict order.
    fn at_equal_counts(
        &self,
        (a, ha): (usize, HostLoad),
        (b, hb): (usize, HostLoad),
    ) -> Option<usize> {
        let late = |i: usize, h: HostLoad| self.usual_ns.get(i).is_some_and(|u| h.waited_ns > *u);
        match (late(a, ha), late(b, hb)) {
            (true, false) => return Some(b),
            (false, true) => return Some(a),
            _ => {}
        }
        let (sa, sb) = (self.above_floor(a), self.above_floor(b));
        let (heavier, lighter) = (sa.max(sb), sa.min(sb));
        (self.noise_step > 1.0 && lighter > 0.0 && heavier <= self.noise_step * lighter)
            .then_some(a)
    }

    /// Host `i`'s share above the floor, what P2C draws by and weighs loads against; 0 for none.
    fn above_floor(&self, i: usize) -> f64 {
        self.above.get(i).copied().unwrap_or(0.0)
    }

    /// The next host of the golden-ratio sequence over the shares above the floor (the module's
    /// doc); `None` when no host is above it.
    fn draw_in_turn(&self, rng: &mut fastrand::Rng) -> Option<usize> {
        // 1/φ: of all steps, the one whose multiples spread most evenly over [0, 1).
        const STEP: f64 = 0.618_033_988_749_894_9;
        let total = *self.above_cumulative.last()?;
        if total <= 0.0 {
            return None;
        }
        let mut u = self.turn.get();
        if u < 0.0 {
            u = rng.f64();
        }
        self.turn.set((u + STEP).fract());
        Some(at(&self.above_cumulative, u * total))
    }

    /// The host with the highest weight (ties: the first).
    pub(crate) fn heaviest(&self) -> Option<usize> {
        let mut heaviest: Option<(usize, f64)> = None;
        for (i, w) in self.weights.iter().enumerate() {
            if heaviest.is_none_or(|(_, best)| *w > best) {
                heaviest = Some((i, *w));
            }
        }
        heaviest.map(|(i, _)| i)
    }

    /// Picks with `algorithm`; `None` only for an empty table.
    pub fn pick<L: Into<HostLoad>>(
        &self,
        algorithm: PickAlgorithm,
        rng: &mut fastrand::Rng,
        load: impl Fn(usize) -> L,
    ) -> Option<usize> {
        match algorithm {
            PickAlgorithm::WeightedRandom => self.weighted(rng),
            PickAlgorithm::WeightedP2c | PickAlgorithm::WeightedP2cUnlessEqual => {
                self.weighted_p2c(rng, load)
            }
            PickAlgorithm::LowestLatency => self.heaviest(),
        }
    }
}

/// A draw by `weights` (with their running sums `cumulative`) among every index but `excluded`;
/// `None` when no other index has weight.
fn draw_except(
    weights: &[f64],
    cumulative: &[f64],
    excluded: usize,
    rng: &mut fastrand::Rng,
) -> Option<usize> {
    let total = *cumulative.last()?;
    let w_excluded = *weights.get(excluded)?;
    let before_excluded = cumulative.get(excluded)? - w_excluded;
    let rest = total - w_excluded;
    if rest <= 0.0 {
        return None;
    }
    // Draw over the others' mass and step over the excluded index's interval.
    let mut r = rng.f64() * rest;
    if r >= before_excluded {
        r += w_excluded;
    }
    let i = at(cumulative, r);
    (i != excluded).then_some(i)
}

/// A draw from running sums: index `i` with probability `(c_i - c_{i-1}) / c_last`; `None` when
/// they are empty or sum to 0.
fn draw(cumulative: &[f64], rng: &mut fastrand::Rng) -> Option<usize> {
    let total = *cumulative.last()?;
    if total <= 0.0 {
        return None;
    }
    Some(at(cumulative, rng.f64() * total))
}

/// The index whose interval of the running sums `cumulative` (not empty) holds `r`.
fn at(cumulative: &[f64], r: f64) -> usize {
    cumulative
        .partition_point(|c| *c <= r)
        .min(cumulative.len().saturating_sub(1))
}
