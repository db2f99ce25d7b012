//! Probes: how a host out of favour keeps being measured.
//!
//! A host at the weight table's floor gets no traffic from the pick (`pick`), so without probes its
//! estimate would never change and it could never earn its traffic back. Only such hosts are
//! probed, and those within a floor of it, which the pick draws by less than a floor's share
//! (`worker::tick`); one further above gets its share from the pick, however rarely in a large
//! cluster.
//! Probes are spent by time, not by share: each worker VM sends a host a request when it has sent
//! it none for the host's probe interval, so what a slow host costs does not grow with the traffic
//! (a share of all requests would: at thousands of requests a second, 0.2 % is several requests a
//! second to a host that may take a second to answer).
//!
//! A probe costs the request that carries it the host's latency, and a probe seen sooner shows a
//! recovery sooner. The interval that minimises their sum, cost per second ∝ `excess / interval`
//! plus delay ∝ `interval`, grows with the square root of how much slower the host is than what
//! the table's traffic gets: a host as fast as the rest is probed every `probe_interval`, one 4
//! times slower every 2 `probe_interval`s, and none less often than every 3, so a recovery is
//! seen within a bounded time however slow the host was.
//!
//! The interval is the cluster's, not each worker's: a worker VM waits it times the number of VMs
//! that serve the cluster (counted in the shared record), so an Envoy with 16 workers probes a
//! slow host as often as one with 2.
//!
//! Time alone does not bound what probes cost where each proxy's traffic is thin: a fleet of a
//! thousand Envoys, each probing a host every second or two, sends it a thousand probes a second,
//! more than a host of half the others' capacity can serve, and a host drained for being slow
//! would be kept full by probes alone. So a worker VM also sends a host no more probes than the
//! table's floor allows of its own requests (one in `1 / floor`): the floor is the least share a
//! host keeps, and probes are that share's only spending. With traffic of its own, a VM is bound
//! by time; a VM that sees a host seldom is bound by the share, and a fleet of such VMs sends a
//! host at the floor the floor's share of the fleet's traffic, as a pick at the floor would.
//!
//! A probe goes only to a host with nothing in flight from this worker, and the check is one host
//! per request in turn, so the cost per request is O(1) whatever the cluster's size.
//!
//! A probe to a host that serves nothing (it fails, refuses, or keeps the request until the
//! client gives up) costs the request that carries it whole, and a host down for a while is
//! likely to stay down a while longer. So each request in a row that a host did not serve beyond
//! the first doubles the wait for its next probe, up to [`MAX_BACKOFF`] times; any request it
//! serves ends the backoff. One failure among successes changes nothing; a host that only
//! answers slowly is never backed off (its probes are served), nor one whose probes the
//! alternative answered after their wait (below): those cost their requests no error.
//!
//! A probe need not cost its request the host's whole latency, nor the request itself. Where the
//! request can be sent twice (a safe method, no body: the adapter decides), the probe waits for
//! its host alone at most [`timeout_ms`], `probe_timeout_factor` times the latency the table's
//! traffic gets; then Envoy sends it to the pick's alternative as well and the first answer wins
//! (a per-try timeout with hedging, set by request header). Hedged, not retried: a retry would
//! give the second attempt the same short wait, and fail a request that is slow wherever it
//! goes. A host that has recovered answers within the wait: a healthy host's latency is rarely
//! more than four times its mean (an exponential service's 98th percentile, a lognormal's of
//! spread 0.3 far beyond its 99.9th). A probe the alternative answered first says only that the
//! host is at least that slow: its sample is the wait or what the table already holds of the
//! host, whichever is longer, and it neither fails the host nor backs its probes off
//! (`worker::finish`).

use std::rc::Rc;

use crate::names::same as same_name;
use crate::units::clamp;

/// The longest a host goes without a probe, whatever its latency, as a multiple of the
/// configured interval: how late a recovery is seen must not grow without bound with how slow
/// the host was (a host 22 times slower, probed every 4.7 intervals, came back to its share after
/// the end of bench/scenarios/slowdown.toml's run). Past a host 9 times slower, the bound decides.
const MAX_INTERVAL_FACTOR: f64 = 3.0;

/// The longest a host that serves nothing waits for a probe, as a multiple of the interval its
/// latency sets: with the defaults, a hung host whose probes cannot be hedged (requests with a
/// body) is probed once every 12 s per cluster (3 x 4 x `probe_interval`), so its recovery is
/// seen within that, well inside the 30 s that Envoy's outlier detection ejects a host for at
/// first (`base_ejection_time`).
pub const MAX_BACKOFF: u64 = 4;

/// What a worker knows of a host when the schedule asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// This worker's requests to it that have not ended.
    pub in_flight: u32,
    /// This worker's requests in a row that it did not serve (failed, refused, or never
    /// answered), counted back from the last one that ended.
    pub unserved: u32,
}

/// How many times its interval a host waits for a probe after `unserved` requests in a row it
/// did not serve: 1 up to the first, then doubling, at most [`MAX_BACKOFF`].
pub fn backoff(unserved: u32) -> u64 {
    (1u64 << unserved.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}

/// The probe interval of a host whose smoothed latency is `score_ms`, when the table's traffic
/// gets `reference_ms` on average; `base_ns` is `probe_interval`. Unknown values count as equal.
pub fn interval_ns(base_ns: u64, score_ms: Option<f64>, reference_ms: Option<f64>) -> u64 {
    let ratio = match (score_ms, reference_ms) {
        (Some(s), Some(r)) if r > 0.0 && s.is_finite() && r.is_finite() => s / r,
        _ => 1.0,
    };
    let factor = clamp(ratio, 1.0, MAX_INTERVAL_FACTOR * MAX_INTERVAL_FACTOR).sqrt();
    (base_ns as f64 * factor) as u64
}

/// How long a probe waits for its host alone before Envoy sends it to another as well (the
/// module's doc): `factor` times `reference_ms`, the latency the table's traffic gets, in whole
/// milliseconds as Envoy's header takes them, rounded up. `None` when the factor is 0 (off) or
/// the reference is unknown.
pub fn timeout_ms(factor: f64, reference_ms: Option<f64>) -> Option<u32> {
    let t = factor * reference_ms?;
    (factor > 0.0 && t.is_finite() && t > 0.0)
        .then(|| clamp(t.ceil(), 1.0, f64::from(u32::MAX)) as u32)
}

/// One worker's probe schedule for one cluster, index for index with its pick table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Probes {
    /// When this worker last sent each host a request (steady ns), and how many requests to
    /// the cluster it had routed then.
    last_sent_ns: Vec<u64>,
    last_sent_request: Vec<u64>,
    /// Requests to the cluster this worker has routed (each one checks for a probe).
    requests: u64,
    /// Requests this worker routes between two probes of one host: `1 / floor` (0: no bound).
    spacing: u64,
    /// How long each host may go without one before it is probed.
    interval_ns: Vec<u64>,
    /// The host the next request checks.
    cursor: usize,
    /// Worker VMs that serve the cluster: each waits that many intervals, so the cluster's
    /// probes do not grow with Envoy's `--concurrency`.
    workers: u32,
    /// How long a probe may wait for its host ([`timeout_ms`]).
    timeout_ms: Option<u32>,
}

impl Probes {
    /// The schedule for a new table of `hosts` with their `intervals`, keeping what this worker
    /// knows of the hosts both tables have (`old_hosts`, the previous table's, in the same
    /// order: both are sorted by address). A host new to the table counts as sent to `now_ns`:
    /// a new table does not probe every host at once.
    pub fn rebuild(
        &self,
        old_hosts: &[Rc<str>],
        hosts: &[Rc<str>],
        intervals: Vec<u64>,
        now_ns: u64,
    ) -> Probes {
        // The same list (a pick table over the table's own, which kept its hosts): every host
        // keeps what this schedule knows of it.
        if std::ptr::eq(old_hosts, hosts) && self.last_sent_ns.len() == hosts.len() {
            return Probes {
                last_sent_ns: self.last_sent_ns.clone(),
                last_sent_request: self.last_sent_request.clone(),
                interval_ns: intervals,
                ..*self
            };
        }
        let mut old = old_hosts
            .iter()
            .zip(self.last_sent_ns.iter().zip(&self.last_sent_request))
            .peekable();
        let (last_sent_ns, last_sent_request) = hosts
            .iter()
            .map(|h| {
                // Both lists name hosts with the table's `Rc`s, mostly the same allocations.
                while old
                    .next_if(|(o, _)| !same_name(o, h) && ***o < **h)
                    .is_some()
                {}
                match old.next_if(|(o, _)| same_name(o, h)) {
                    Some((_, (sent, request))) => (*sent, *request),
                    None => (now_ns, self.requests),
                }
            })
            .unzip();
        Probes {
            last_sent_ns,
            last_sent_request,
            interval_ns: intervals,
            cursor: self.cursor,
            workers: self.workers,
            requests: self.requests,
            spacing: self.spacing,
            timeout_ms: self.timeout_ms,
        }
    }

    /// The host this request should probe, if any: the next host in turn, when this worker has
    /// sent it nothing for its interval (times its [`backoff`]) nor for `1 / floor` of its
    /// requests, and has nothing in flight to it. `pending(i)` is what this worker knows of
    /// host `i`'s requests.
    pub fn due(&mut self, now_ns: u64, pending: impl Fn(usize) -> Pending) -> Option<usize> {
        self.requests = self.requests.saturating_add(1);
        let n = self.last_sent_ns.len();
        if n == 0 {
            return None;
        }
        let i = self.cursor % n;
        self.cursor = (i + 1) % n;
        let last = *self.last_sent_ns.get(i)?;
        let last_request = *self.last_sent_request.get(i)?;
        if self.requests.saturating_sub(last_request) < self.spacing {
            return None;
        }
        let host = pending(i);
        let interval = self
            .interval_ns
            .get(i)?
            .saturating_mul(u64::from(self.workers.max(1)))
            .saturating_mul(backoff(host.unserved));
        (now_ns.saturating_sub(last) >= interval && host.in_flight == 0).then_some(i)
    }

    /// The table's floor (a share): this worker probes a host at most once every `1 / floor`
    /// of its requests. 0 (or anything not a share) sets no such bound.
    pub fn set_floor(&mut self, floor: f64) {
        self.spacing = if floor > 0.0 && floor <= 1.0 {
            (1.0 / floor).ceil() as u64
        } else {
            0
        };
    }

    /// How long a probe may wait for its host ([`timeout_ms`]).
    pub fn set_timeout_ms(&mut self, timeout_ms: Option<u32>) {
        self.timeout_ms = timeout_ms;
    }

    pub fn timeout_ms(&self) -> Option<u32> {
        self.timeout_ms
    }

    /// How many worker VMs share the cluster's probes.
    pub fn set_workers(&mut self, workers: usize) {
        self.workers = u32::try_from(workers).unwrap_or(u32::MAX);
    }

    /// Host `i` was sent a request at `now_ns`.
    pub fn sent(&mut self, i: usize, now_ns: u64) {
        if let Some(last) = self.last_sent_ns.get_mut(i) {
            *last = (*last).max(now_ns);
        }
        if let Some(last) = self.last_sent_request.get_mut(i) {
            *last = self.requests;
        }
    }
}
