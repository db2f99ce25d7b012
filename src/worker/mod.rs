//! Worker: what one VM holds, per request and per tick. Every VM has one, the main thread's too
//! (it serves no request, but ticks, so configured clusters are refreshed).
//!
//! Per request (`route`) it only reads its local pick table and bumps local counters; it never
//! touches shared data. On a tick (`tick`) it merges its samples into each cluster's shared
//! record (`record::sync`), adopts a new table when the shared version moved, and hands the
//! adapter what to export (`telemetry`). What it keeps per cluster is in `cluster`. The shared
//! store and the clock are parameters, so the protocol runs natively in tests with several
//! workers over one store, and in the VM over proxy-wasm shared data.

mod cluster;
pub mod decision;
pub mod diagnose;
pub mod health;
pub mod request;
mod route;
pub mod status;
pub mod telemetry;
mod tick;

pub use decision::{
    Decision, FallbackReason, Pick, HEDGE_HEADER, PER_TRY_TIMEOUT_HEADER, RETRY_ON_HEADER,
};
pub use request::{Finished, Request};
pub use tick::TickReport;

use crate::clock::VmClock;
use crate::config::Config;
use crate::map::Map;
use crate::record::state::ClusterState;
use crate::record::sync::{self, SharedStore};
use crate::record::table::Table;
use crate::units::{share_to_ppm, NS_PER_SEC};
use cluster::{counts_entry, local_entry, Counts, LocalCluster};
use diagnose::SteeredWatch;
use status::{ClusterStatus, Status};
use telemetry::NO_CLUSTER;

/// The most a VM's clock may advance between two readings: a VM reads it on every request and
/// every tick, so a larger gap is a step of the host's clock (`clock::VmClock`).
const MIN_CLOCK_GAP_NS: u64 = NS_PER_SEC;

/// One VM's balancer.
pub struct Worker {
    /// This VM's identity in the records it merges into (`ClusterBatch::worker`).
    id: u64,
    config: Config,
    /// Key namespace of this configuration's records (`Config::record_namespace`).
    namespace: String,
    rng: fastrand::Rng,
    clock: VmClock,
    /// The proxy's zone (`xds.node` locality), once the adapter has read it.
    local_zone: Option<String>,
    clusters: Map<String, LocalCluster>,
    /// By `cluster_name` label: steered clusters and [`NO_CLUSTER`], and at most
    /// `cluster::MAX_CLUSTERS` unlisted ones (`counts_entry`).
    counts: Map<String, Counts>,
    /// The names of `steered_clusters` no request carried yet (`diagnose`).
    steered_watch: SteeredWatch,
    /// When this VM last asked Envoy for its hosts' health, and last got an answer (`health`).
    health_asked_ns: Option<u64>,
    health_answered_ns: u64,
    /// Polls asked since the last answer, and whether this run of them was warned of.
    health_unanswered: u64,
    health_warned: bool,
    /// A request found a cluster without a table: the adapter should tick now rather than at
    /// the next period, so the requests after it are steered (`take_tick_wanted`).
    tick_wanted: bool,
}

impl Worker {
    pub fn new(config: Config, seed: u64) -> Self {
        let max_gap_ns = u64::try_from(config.tick_period().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(2);
        let mut rng = fastrand::Rng::with_seed(seed);
        let id = rng.u64(..);
        let steered_watch = SteeredWatch::new(config.steered_names());
        let mut worker = Worker {
            id,
            namespace: config.record_namespace(),
            clock: VmClock::new(max_gap_ns.max(MIN_CLOCK_GAP_NS)),
            config,
            rng,
            local_zone: None,
            clusters: Map::default(),
            counts: Map::default(),
            steered_watch,
            health_asked_ns: None,
            health_answered_ns: 0,
            health_unanswered: 0,
            health_warned: false,
            tick_wanted: false,
        };
        // The main-thread VM never sees a request; configured clusters still get refreshed.
        let names: Vec<String> = worker.config.static_clusters().map(str::to_owned).collect();
        for name in names {
            local_entry(&mut worker.clusters, &name, worker.id);
        }
        worker
    }

    /// Whether a request since the last call met a cluster this VM has no table of yet (its first
    /// request to it, or the first after it went idle). The table is read on a tick: up to
    /// `tick_period_ms` away, and until then Envoy's own policy picks. The adapter asks the host
    /// for a tick at once instead, so about one request, not a tick period of them, goes unsteered.
    pub fn take_tick_wanted(&mut self) -> bool {
        std::mem::take(&mut self.tick_wanted)
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This VM's steady time (ns) at the host clock's reading `raw_ns`: never back, never a
    /// jump (see `clock`). Latencies are differences of it.
    pub fn clock(&mut self, raw_ns: u64) -> u64 {
        self.clock.now(raw_ns)
    }

    /// Whether the adapter should read the proxy's zone (not known yet).
    pub fn wants_local_zone(&self) -> bool {
        self.local_zone.is_none()
    }

    /// The proxy's own zone, from `xds.node`'s locality; an empty zone means none is set.
    pub fn set_local_zone(&mut self, zone: &str) {
        self.local_zone = Some(zone.to_owned());
    }

    fn local_zone(&self) -> Option<&str> {
        self.local_zone.as_deref().filter(|z| !z.is_empty())
    }

    /// The shared-data key of `cluster`'s record under this configuration.
    pub fn record_key(&self, cluster: &str) -> String {
        sync::key(&self.namespace, cluster)
    }

    /// The status document, as JSON: each cluster's record as `store` holds it now (this VM
    /// keeps only the table it picks from).
    pub fn status_json(&self, store: &dyn SharedStore) -> String {
        let slow_start_ns = self.config.policy().weights.slow_start_ns;
        let max_hosts = self.config.policy().max_hosts;
        let steady_ns = self.clock.last();
        let records: Vec<(&String, &LocalCluster, ClusterState)> = self
            .clusters
            .iter()
            .map(|(name, local)| {
                let record = sync::read_record(store, &local.keys.record, max_hosts);
                (name, local, record.unwrap_or_default())
            })
            .collect();
        let clusters: Vec<ClusterStatus> = records
            .iter()
            .map(|(name, local, record)| {
                let now_ns = local
                    .member
                    .clock
                    .estimate(steady_ns)
                    .unwrap_or(record.clock_ns);
                ClusterStatus::new(
                    name,
                    record,
                    now_ns,
                    slow_start_ns,
                    &self.config.policy().score,
                    |h| local.in_flight(h),
                    |h| local.unhealthy.contains(h),
                )
            })
            .collect();
        let status = Status {
            build: crate::worker::telemetry::BUILD,
            shadow: self.config.shadow(),
            steered_clusters: self.config.steered_clusters(),
            local_zone: self.local_zone(),
            clusters,
        };
        serde_json::to_string_pretty(&status).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// `host=share` (in parts per million) for every host of the table this worker last adopted
    /// for `cluster`, for logs.
    pub fn table_summary(&self, cluster: &str) -> String {
        let Some(local) = self.clusters.get(cluster) else {
            return String::new();
        };
        let shares: Vec<String> = local
            .snapshot
            .hosts()
            .map(|h| format!("{}={}ppm", h.address, share_to_ppm(h.share)))
            .collect();
        shares.join(" ")
    }

    /// The last table read of each cluster.
    pub fn tables(&self) -> impl Iterator<Item = (&str, &Table)> {
        self.clusters
            .iter()
            .map(|(name, c)| (name.as_str(), &c.snapshot))
    }

    /// This worker's in-flight count for a host.
    pub fn in_flight(&self, cluster: &str, host: &str) -> u32 {
        self.clusters.get(cluster).map_or(0, |c| c.in_flight(host))
    }

    /// How many hosts of `cluster` this worker keeps request state for (requests in flight, how
    /// the last ones ended): after a tick, only those with requests in flight and those the
    /// table in force lists.
    pub fn hosts_tracked(&self, cluster: &str) -> usize {
        self.clusters.get(cluster).map_or(0, |c| c.in_flight.len())
    }

    /// The share of requests `cluster`'s table leaves to the fallback policy.
    pub fn explore_share(&self, cluster: &str) -> Option<f64> {
        self.clusters.get(cluster).map(|c| c.exploration.share())
    }

    fn counts_of(&mut self, cluster: Option<&str>) -> Option<&mut Counts> {
        let label = cluster.unwrap_or(NO_CLUSTER);
        let config = &self.config;
        counts_entry(&mut self.counts, label, || {
            label == NO_CLUSTER || config.steers(label)
        })
    }
}
