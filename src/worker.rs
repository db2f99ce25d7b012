//! Worker: what one Envoy worker VM holds, per request and per tick.
//!
//! Per request it only reads its local pick table and bumps local counters; it never touches
//! shared data. On a tick it merges its samples into each cluster's shared record under
//! compare-and-swap, refreshes the weights when due, and adopts a new table when the shared
//! version moved. The shared store is a parameter, so the protocol runs natively in tests with
//! several workers over one store, and in the VM over proxy-wasm shared data.

use std::collections::{BTreeMap, HashMap};

use crate::config::Config;
use crate::outcome::Outcome;
use crate::pick::PickTable;
use crate::rules::{normalize, PathClass, Rules};
use crate::status::{ClusterStatus, Status};
use crate::state::{Accumulator, ClusterState, Policy};

/// Clusters one worker keeps state for; more are left to the fallback policy.
pub const MAX_CLUSTERS: usize = 256;
/// Compare-and-swap attempts per cluster per tick; samples of a tick that lost every attempt are
/// kept and merged on the next one.
pub const MAX_CAS_ATTEMPTS: usize = 8;

/// Shared data as proxy-wasm offers it: values with a version token for compare-and-swap.
pub trait SharedStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;
    /// Writes `value` if the stored version still equals `cas` (`None`: unconditionally).
    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    CasMismatch,
    Other(String),
}

/// What the filter does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Set the override header to this value (`IP:port`, then an alternative for a retry).
    Override { host: String, header_value: String },
    /// Leave the request to the cluster's fallback policy.
    Fallback(FallbackReason),
    /// Answer locally with 403: a management path from outside the allowlist.
    Deny,
    /// Answer locally with the status document.
    Status,
}

impl Decision {
    /// Whether the request's outcome is a latency sample of the host that serves it.
    pub fn is_sampled(&self) -> bool {
        match self {
            Decision::Override { .. } => true,
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

/// The shared-data key of a cluster's record. One key per cluster keeps the key count bounded:
/// proxy-wasm shared data has no reliable delete.
pub fn shared_key(cluster: &str) -> String {
    format!("ewma_lb.v1.cluster.{cluster}")
}

#[derive(Debug, Default)]
struct LocalCluster {
    table: PickTable,
    table_version: u64,
    /// Requests this worker sent to each host and has not seen finish; keyed by address so
    /// counts survive a table rebuild.
    in_flight: HashMap<String, u32>,
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
}

/// One VM's balancer.
pub struct Worker {
    config: Config,
    policy: Policy,
    rules: Rules,
    rng: fastrand::Rng,
    clusters: BTreeMap<String, LocalCluster>,
}

impl Worker {
    pub fn new(config: Config, seed: u64) -> Self {
        let mut worker = Worker {
            policy: config.policy(),
            // A configuration that reached here was validated; the fallback denies management.
            rules: config.rules().unwrap_or_default(),
            config,
            rng: fastrand::Rng::with_seed(seed),
            clusters: BTreeMap::new(),
        };
        // The main-thread VM never sees a request; configured clusters still get refreshed.
        let names: Vec<String> = worker.config.clusters.keys().cloned().collect();
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
        let path = normalize(request.path);
        let class = self.rules.classify_normalized(&path);
        let is_status = class != PathClass::Health && path == self.config.status_path;
        if is_status || class == PathClass::Management {
            let allowed = self.rules.management_allowed(source().as_deref());
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
                Some(cluster) if self.config.shadow => {
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
        if config.exploration_share > 0.0 && rng.f64() < config.exploration_share {
            return Decision::Fallback(FallbackReason::Exploring);
        }
        let in_flight = |i: usize| local.table.host(i).and_then(|h| local.in_flight.get(h)).copied().unwrap_or(0);
        let Some(first) = local.table.pick(config.pick, rng, in_flight) else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        let host = local.table.host(first).unwrap_or_default();
        // A second, different host for the retry of a failed connection: Envoy tries the
        // addresses of the header in order.
        let alternative = local.table.weighted_except(rng, first).and_then(|i| local.table.host(i));
        let header_value = match alternative {
            Some(alt) => format!("{host},{alt}"),
            None => host.to_owned(),
        };
        let host = host.to_owned();
        match local.in_flight.get_mut(&host) {
            Some(n) => *n += 1,
            None => {
                local.in_flight.insert(host.clone(), 1);
            }
        }
        Decision::Override { host, header_value }
    }

    /// Records a sampled request's end. Called exactly once per request `route` sampled.
    pub fn finish(&mut self, cluster: &str, done: &Finished) {
        let penalty_ms = self.config.failure_penalty_ms as f64;
        let Some(local) = local_entry(&mut self.clusters, cluster) else { return };
        if let Some(count) = done.picked.and_then(|p| local.in_flight.get_mut(p)) {
            *count = count.saturating_sub(1);
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

    /// Merges this worker's samples into shared state, refreshes weights when due, and adopts the
    /// newest table. Call on every tick.
    pub fn tick(&mut self, now_ns: u64, store: &mut dyn SharedStore) -> TickReport {
        let mut report = TickReport::default();
        for (name, local) in &mut self.clusters {
            let statics = self.config.static_endpoints(name);
            match sync_cluster(name, local, statics, &self.policy, now_ns, store) {
                Ok(sync) => {
                    report.refreshed += usize::from(sync.refreshed);
                    if sync.ejected > 0 {
                        report.ejections.push((name.clone(), sync.ejected));
                    }
                    if sync.state.table_version != local.table_version {
                        local.table = PickTable::new(sync.state.hosts.iter().map(|h| (h.address.as_str(), h.share)));
                        local.table_version = sync.state.table_version;
                        local.in_flight.retain(|host, n| *n > 0 || sync.state.host(host).is_some());
                        report.adopted.push((name.clone(), local.table_version));
                    }
                    local.snapshot = sync.state;
                }
                Err(e) => report.errors.push((name.clone(), e)),
            }
        }
        report
    }

    /// The status document, as JSON.
    pub fn status_json(&self, now_ns: u64) -> String {
        let slow_start_ns = self.config.weights.slow_start_ms.saturating_mul(1_000_000);
        let status = Status {
            shadow: self.config.shadow,
            clusters: self
                .clusters
                .iter()
                .map(|(name, local)| {
                    let in_flight = |host: &str| local.in_flight.get(host).copied().unwrap_or(0);
                    ClusterStatus::new(name, &local.snapshot, now_ns, slow_start_ns, in_flight)
                })
                .collect(),
        };
        serde_json::to_string_pretty(&status).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The last shared record seen of each cluster.
    pub fn snapshots(&self) -> impl Iterator<Item = (&str, &ClusterState)> {
        self.clusters.iter().map(|(name, c)| (name.as_str(), &c.snapshot))
    }

    /// This worker's in-flight count for a host.
    pub fn in_flight(&self, cluster: &str, host: &str) -> u32 {
        self.clusters.get(cluster).and_then(|c| c.in_flight.get(host)).copied().unwrap_or(0)
    }
}

/// The local entry of `cluster`, created on first sight while there is room.
fn local_entry<'a>(clusters: &'a mut BTreeMap<String, LocalCluster>, cluster: &str) -> Option<&'a mut LocalCluster> {
    if !clusters.contains_key(cluster) && clusters.len() < MAX_CLUSTERS {
        clusters.insert(cluster.to_owned(), LocalCluster::default());
    }
    clusters.get_mut(cluster)
}

/// Hosts one worker accumulates samples for between ticks.
const MAX_PENDING_HOSTS: usize = 1024;

/// What a tick did, for logs and metrics.
#[derive(Debug, Default)]
pub struct TickReport {
    /// Clusters whose weights this worker recomputed.
    pub refreshed: usize,
    /// Clusters whose pick table changed, with the new version.
    pub adopted: Vec<(String, u64)>,
    /// Clusters whose samples could not be merged this tick (they are kept).
    pub errors: Vec<(String, SyncError)>,
    /// Hosts this worker ejected, per cluster.
    pub ejections: Vec<(String, usize)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncError {
    /// Every compare-and-swap attempt lost to another worker.
    Contended,
    Store(String),
}

struct Synced {
    state: ClusterState,
    refreshed: bool,
    ejected: usize,
}

fn sync_cluster(
    name: &str,
    local: &mut LocalCluster,
    statics: &[String],
    policy: &Policy,
    now_ns: u64,
    store: &mut dyn SharedStore,
) -> Result<Synced, SyncError> {
    let key = shared_key(name);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, cas) = store.get(&key).map_err(|e| SyncError::Store(format!("{e:?}")))?;
        // A record of another version, truncated or foreign is rebuilt from scratch.
        let mut state = bytes
            .and_then(|b| ClusterState::decode(&b, policy.max_hosts).ok())
            .unwrap_or_default();
        let mut ejected = state.merge(&local.pending, now_ns, policy);
        let refreshed = state.refresh_due(now_ns, policy);
        if refreshed {
            ejected += state.refresh(now_ns, policy, statics);
        }
        if local.pending.is_empty() && !refreshed && ejected == 0 {
            return Ok(Synced { state, refreshed, ejected });
        }
        match store.set(&key, &state.encode(), cas) {
            Ok(()) => {
                local.pending.clear();
                return Ok(Synced { state, refreshed, ejected });
            }
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
        }
    }
    Err(SyncError::Contended)
}
