//! Worker: what one Envoy worker VM holds, per request and per tick.
//!
//! Per request it only reads its local pick table and bumps local counters; it never touches
//! shared data. On a tick it merges its samples into each cluster's shared record (`sync`),
//! adopts a new table when the shared version moved, and hands the adapter what to export
//! (`telemetry`). The shared store and the clock are parameters, so the protocol runs natively
//! in tests with several workers over one store, and in the VM over proxy-wasm shared data.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use crate::config::Config;
use crate::outcome::Outcome;
use crate::pick::PickTable;
use crate::rules::{normalize, PathClass};
use crate::state::{Accumulator, ClusterState};
use crate::status::{ClusterStatus, HostPhase, Status};
use crate::sync::{sync_cluster, SharedStore, SyncError};
use crate::telemetry::{Change, Metric, Update, NO_CLUSTER};
use crate::units::{ms_to_whole_us, share_to_ppm};

/// Clusters one worker keeps state for; more are left to the fallback policy.
pub const MAX_CLUSTERS: usize = 256;
/// Hosts one worker accumulates samples for between ticks.
const MAX_PENDING_HOSTS: usize = 1024;

/// What the filter does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Name this host (and an alternative for a retry) in the override header.
    Override(Pick),
    /// Leave the request to the cluster's fallback policy.
    Fallback(FallbackReason),
    /// Answer locally with 403: a management path from outside the allowlist.
    Deny,
    /// Answer locally with the status document.
    Status,
}

/// A host chosen for a request. The addresses are the pick table's own, shared, so a pick
/// allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub host: Rc<str>,
    /// A different host for the retry of a failed connection: Envoy tries the addresses of the
    /// header in order.
    pub alternative: Option<Rc<str>>,
}

impl Pick {
    /// The override header's value, `IP:port` or `IP:port,IP:port`, written into `out` (cleared
    /// first), so a caller can reuse one buffer for every request.
    pub fn write_header_value(&self, out: &mut String) {
        out.clear();
        out.push_str(&self.host);
        if let Some(alternative) = &self.alternative {
            out.push(',');
            out.push_str(alternative);
        }
    }
}

impl Decision {
    /// Whether the request's outcome is a latency sample of the host that serves it.
    pub fn is_sampled(&self) -> bool {
        match self {
            Decision::Override(_) => true,
            Decision::Fallback(reason) => {
                matches!(reason, FallbackReason::Exploring | FallbackReason::TableNotReady | FallbackReason::Shadow)
            }
            Decision::Deny | Decision::Status => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// The exploration share: lets the fallback find endpoints the table does not know.
    Exploring,
    /// No weight table for this cluster yet (first requests, or nothing learned).
    TableNotReady,
    /// A health probe: never steered, never sampled.
    HealthPath,
    /// A management request from an allowed network: passed, never sampled.
    Management,
    /// An excluded path (long poll, stream, upload): never sampled.
    Excluded,
    /// No cluster name: a direct response or a route without a cluster.
    NoCluster,
    /// Shadow mode: the table is computed and sampled, never applied.
    Shadow,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 7] = [
        FallbackReason::Exploring,
        FallbackReason::TableNotReady,
        FallbackReason::HealthPath,
        FallbackReason::Management,
        FallbackReason::Excluded,
        FallbackReason::NoCluster,
        FallbackReason::Shadow,
    ];

    /// The `reason` label of `ewma_lb_fallback_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            FallbackReason::Exploring => "exploring",
            FallbackReason::TableNotReady => "table_not_ready",
            FallbackReason::HealthPath => "health_path",
            FallbackReason::Management => "management",
            FallbackReason::Excluded => "excluded",
            FallbackReason::NoCluster => "no_cluster",
            FallbackReason::Shadow => "shadow",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the filter knows of a request when it arrives.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    pub path: &'a str,
    /// `xds.cluster_name`: the cluster the route chose.
    pub cluster: Option<&'a str>,
}

/// What the filter knows of a request when it is done.
#[derive(Clone, Copy, Debug, Default)]
pub struct Finished<'a> {
    /// The host this worker chose, if it chose one.
    pub picked: Option<&'a str>,
    /// `upstream.address`: the host that served the last attempt.
    pub served_by: Option<&'a str>,
    /// `upstream.request_attempt_count`.
    pub attempts: u32,
    pub latency_ms: f64,
    pub outcome: Option<Outcome>,
}

/// This worker's requests to one host that have not finished, and how many of them the metrics
/// were last told about (the in-flight gauge is shared by every VM, so each moves it by its own
/// changes).
#[derive(Debug, Default)]
struct InFlight {
    now: u32,
    reported: u32,
}

#[derive(Debug, Default)]
struct LocalCluster {
    table: PickTable,
    table_version: u64,
    /// Keyed by address so counts survive a table rebuild.
    in_flight: HashMap<Rc<str>, InFlight>,
    pending: BTreeMap<String, Accumulator>,
    /// The last record read from shared data, for status and metrics.
    snapshot: ClusterState,
}

impl LocalCluster {
    fn record(&mut self, host: &str, latency_ms: f64, failed: bool, penalty_ms: f64) {
        if let Some(acc) = self.pending.get_mut(host) {
            acc.record(latency_ms, failed, penalty_ms);
        } else if self.pending.len() < MAX_PENDING_HOSTS {
            self.pending.entry(host.to_owned()).or_default().record(latency_ms, failed, penalty_ms);
        }
    }

    fn in_flight(&self, host: &str) -> u32 {
        self.in_flight.get(host).map_or(0, |n| n.now)
    }
}

/// Decisions taken since the last tick, for one `cluster_name`.
#[derive(Debug, Default)]
struct DecisionCounts {
    steered: u64,
    denied: u64,
    fallback: [u64; FallbackReason::ALL.len()],
}

/// One VM's balancer.
pub struct Worker {
    config: Config,
    rng: fastrand::Rng,
    clusters: BTreeMap<String, LocalCluster>,
    /// By `cluster_name` label; bounded like `clusters`, plus [`NO_CLUSTER`].
    counts: BTreeMap<String, DecisionCounts>,
}

impl Worker {
    pub fn new(config: Config, seed: u64) -> Self {
        let mut worker =
            Worker { config, rng: fastrand::Rng::with_seed(seed), clusters: BTreeMap::new(), counts: BTreeMap::new() };
        // The main-thread VM never sees a request; configured clusters still get refreshed.
        let names: Vec<String> = worker.config.static_clusters().map(str::to_owned).collect();
        for name in names {
            worker.clusters.entry(name).or_default();
        }
        worker
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Decides what happens to a request: the path rules first, then the pick. `source` gives
    /// Envoy's `source.address` (the client as its connection manager determined it); it is
    /// asked for only on guarded paths.
    pub fn route(&mut self, request: &Request, source: impl FnOnce() -> Option<String>) -> Decision {
        let decision = self.decide(request, source);
        let counts = self.counts_of(request.cluster);
        match (&decision, counts) {
            (Decision::Override(_), Some(c)) => c.steered += 1,
            (Decision::Fallback(reason), Some(c)) => {
                if let Some(n) = c.fallback.get_mut(reason.index()) {
                    *n += 1;
                }
            }
            (Decision::Deny, Some(c)) => c.denied += 1,
            (Decision::Status, _) | (_, None) => {}
        }
        decision
    }

    fn decide(&mut self, request: &Request, source: impl FnOnce() -> Option<String>) -> Decision {
        let path = normalize(request.path);
        let rules = self.config.rules();
        let class = rules.classify_normalized(&path);
        let is_status = class != PathClass::Health && path == self.config.status_path();
        if is_status || class == PathClass::Management {
            let allowed = rules.management_allowed(source().as_deref());
            return match (allowed, is_status) {
                (false, _) => Decision::Deny,
                (true, true) => Decision::Status,
                (true, false) => Decision::Fallback(FallbackReason::Management),
            };
        }
        match class {
            PathClass::Health => Decision::Fallback(FallbackReason::HealthPath),
            PathClass::Management => Decision::Deny,
            PathClass::Excluded => Decision::Fallback(FallbackReason::Excluded),
            PathClass::Business => match request.cluster {
                Some(cluster) if self.config.shadow() => {
                    local_entry(&mut self.clusters, cluster);
                    Decision::Fallback(FallbackReason::Shadow)
                }
                Some(cluster) => self.pick(cluster),
                None => Decision::Fallback(FallbackReason::NoCluster),
            },
        }
    }

    /// Chooses where a request to `cluster` goes. Per request: local data only.
    pub fn pick(&mut self, cluster: &str) -> Decision {
        let Worker { config, rng, clusters, .. } = self;
        let Some(local) = local_entry(clusters, cluster).filter(|c| !c.table.is_empty()) else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        if config.exploration_share() > 0.0 && rng.f64() < config.exploration_share() {
            return Decision::Fallback(FallbackReason::Exploring);
        }
        let in_flight = |i: usize| local.table.host(i).map_or(0, |h| local.in_flight(h));
        let Some(first) = local.table.pick(config.pick(), rng, in_flight) else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        let Some(host) = local.table.host(first).cloned() else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        let alternative = local.table.weighted_except(rng, first).and_then(|i| local.table.host(i)).cloned();
        match local.in_flight.get_mut(&*host) {
            Some(n) => n.now += 1,
            None => {
                local.in_flight.insert(host.clone(), InFlight { now: 1, reported: 0 });
            }
        }
        Decision::Override(Pick { host, alternative })
    }

    /// Undoes a pick that never took effect (the host refused the header): the request is the
    /// fallback's, not in flight to the picked host and not steered.
    pub fn cancel(&mut self, cluster: &str, pick: &Pick) {
        if let Some(n) = self.clusters.get_mut(cluster).and_then(|c| c.in_flight.get_mut(&*pick.host)) {
            n.now = n.now.saturating_sub(1);
        }
        if let Some(c) = self.counts.get_mut(cluster) {
            c.steered = c.steered.saturating_sub(1);
        }
    }

    /// Records a sampled request's end. Called exactly once per request `route` sampled.
    pub fn finish(&mut self, cluster: &str, done: &Finished) {
        let penalty_ms = self.config.failure_penalty_ms();
        let Some(local) = local_entry(&mut self.clusters, cluster) else { return };
        if let Some(count) = done.picked.and_then(|p| local.in_flight.get_mut(p)) {
            count.now = count.now.saturating_sub(1);
        }
        // The route retries only failed connections and resets before the request: a retried
        // request that ended elsewhere means our pick failed, though Envoy reports the last host.
        if let Some(picked) = done.picked.filter(|p| done.attempts > 1 && done.served_by != Some(*p)) {
            local.record(picked, penalty_ms, true, penalty_ms);
        }
        if let (Some(host), Some(outcome)) = (done.served_by, done.outcome) {
            local.record(host, done.latency_ms.max(0.0), outcome.is_failure(), penalty_ms);
        }
    }

    /// Merges this worker's samples into shared state, refreshes weights when due, adopts the
    /// newest table, and collects what the metrics should say. Call on every tick.
    pub fn tick(&mut self, now_ns: u64, store: &mut dyn SharedStore) -> TickReport {
        let mut report = TickReport::default();
        let policy = self.config.policy();
        let slow_start_ns = policy.weights.slow_start_ns;
        for (name, local) in &mut self.clusters {
            let statics = self.config.static_endpoints(name);
            match sync_cluster(store, name, &local.pending, statics, policy, now_ns) {
                Ok(sync) => {
                    local.pending.clear();
                    report.refreshed += usize::from(sync.refreshed);
                    if sync.ejected > 0 {
                        report.metrics.push(update(Metric::Ejections, name, None, Change::Add(sync.ejected as i64)));
                    }
                    if sync.state.table_version != local.table_version {
                        local.table = PickTable::new(sync.state.hosts.iter().map(|h| (h.address.as_str(), h.share)));
                        local.table_version = sync.state.table_version;
                        report.adopted.push((name.clone(), local.table_version));
                        host_gauges(name, &sync.state, now_ns, slow_start_ns, &mut report.metrics);
                    }
                    local.snapshot = sync.state;
                }
                Err(e) => report.errors.push((name.clone(), e)),
            }
            in_flight_updates(name, local, &mut report.metrics);
        }
        for (cluster, counts) in &mut self.counts {
            decision_updates(cluster, counts, &mut report.metrics);
        }
        report
    }

    /// The status document, as JSON.
    pub fn status_json(&self, now_ns: u64) -> String {
        let slow_start_ns = self.config.policy().weights.slow_start_ns;
        let status = Status {
            shadow: self.config.shadow(),
            clusters: self
                .clusters
                .iter()
                .map(|(name, local)| ClusterStatus::new(name, &local.snapshot, now_ns, slow_start_ns, |h| local.in_flight(h)))
                .collect(),
        };
        serde_json::to_string_pretty(&status).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// `host=share` for every host of the table this worker last adopted for `cluster`, for logs.
    pub fn table_summary(&self, cluster: &str) -> String {
        let Some(local) = self.clusters.get(cluster) else { return String::new() };
        let shares: Vec<String> = local.snapshot.hosts.iter().map(|h| format!("{}={:.4}", h.address, h.share)).collect();
        shares.join(" ")
    }

    /// The last shared record seen of each cluster.
    pub fn snapshots(&self) -> impl Iterator<Item = (&str, &ClusterState)> {
        self.clusters.iter().map(|(name, c)| (name.as_str(), &c.snapshot))
    }

    /// This worker's in-flight count for a host.
    pub fn in_flight(&self, cluster: &str, host: &str) -> u32 {
        self.clusters.get(cluster).map_or(0, |c| c.in_flight(host))
    }

    /// The decision counters of `cluster` (`None`: requests without one), created on first sight
    /// while there is room.
    fn counts_of(&mut self, cluster: Option<&str>) -> Option<&mut DecisionCounts> {
        let label = cluster.unwrap_or(NO_CLUSTER);
        if !self.counts.contains_key(label) && self.counts.len() <= MAX_CLUSTERS {
            self.counts.insert(label.to_owned(), DecisionCounts::default());
        }
        self.counts.get_mut(label)
    }
}

/// The local entry of `cluster`, created on first sight while there is room.
fn local_entry<'a>(clusters: &'a mut BTreeMap<String, LocalCluster>, cluster: &str) -> Option<&'a mut LocalCluster> {
    if !clusters.contains_key(cluster) && clusters.len() < MAX_CLUSTERS {
        clusters.insert(cluster.to_owned(), LocalCluster::default());
    }
    clusters.get_mut(cluster)
}

fn update(metric: Metric, cluster: &str, label: Option<&str>, change: Change) -> Update {
    Update { metric, cluster: cluster.to_owned(), label: label.map(str::to_owned), change }
}

/// The per-host gauges of a newly adopted table. Every VM adopts the same table, so they all set
/// the same values.
fn host_gauges(cluster: &str, state: &ClusterState, now_ns: u64, slow_start_ns: u64, out: &mut Vec<Update>) {
    for h in &state.hosts {
        let ejected = HostPhase::of(h, now_ns, slow_start_ns) == HostPhase::Ejected;
        let latency_us = h.latency.value_ms().map_or(0, ms_to_whole_us);
        for (metric, value) in
            [(Metric::HostWeight, share_to_ppm(h.share)), (Metric::HostLatency, latency_us), (Metric::HostEjected, u64::from(ejected))]
        {
            out.push(update(metric, cluster, Some(&h.address), Change::Set(value)));
        }
    }
}

/// Moves the shared in-flight gauge by this worker's change since the last tick, and forgets
/// hosts that have nothing in flight, nothing unreported and no place in the table.
fn in_flight_updates(cluster: &str, local: &mut LocalCluster, out: &mut Vec<Update>) {
    for (host, n) in &mut local.in_flight {
        if n.now != n.reported {
            let delta = i64::from(n.now) - i64::from(n.reported);
            out.push(update(Metric::HostInFlight, cluster, Some(host), Change::Add(delta)));
            n.reported = n.now;
        }
    }
    let snapshot = &local.snapshot;
    local.in_flight.retain(|host, n| n.now > 0 || snapshot.host(host).is_some());
}

/// The decision counters as counter increments, then zeroed.
fn decision_updates(cluster: &str, counts: &mut DecisionCounts, out: &mut Vec<Update>) {
    if counts.steered > 0 {
        out.push(update(Metric::SteeredRequests, cluster, None, Change::Add(counts.steered as i64)));
    }
    if counts.denied > 0 {
        out.push(update(Metric::ManagementDeniedRequests, cluster, None, Change::Add(counts.denied as i64)));
    }
    for (reason, n) in FallbackReason::ALL.iter().zip(&counts.fallback) {
        if *n > 0 {
            out.push(update(Metric::FallbackRequests, cluster, Some(reason.label()), Change::Add(*n as i64)));
        }
    }
    *counts = DecisionCounts::default();
}

/// What a tick did, for logs and metrics.
#[derive(Debug, Default)]
pub struct TickReport {
    /// Clusters whose weights this worker recomputed.
    pub refreshed: usize,
    /// Clusters whose pick table changed, with the new version.
    pub adopted: Vec<(String, u64)>,
    /// Clusters whose samples could not be merged this tick (they are kept).
    pub errors: Vec<(String, SyncError)>,
    /// What the metrics should say now.
    pub metrics: Vec<Update>,
}
