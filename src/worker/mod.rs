//! Worker: what one Envoy worker VM holds, per request and per tick.
//!
//! Per request it only reads its local pick table and bumps local counters; it never touches
//! shared data. On a tick it merges its samples into each cluster's shared record (`sync`),
//! adopts a new table when the shared version moved, and hands the adapter what to export
//! (`telemetry`). The shared store and the clock are parameters, so the protocol runs natively
//! in tests with several workers over one store, and in the VM over proxy-wasm shared data.

pub mod diagnose;
pub mod health;
pub mod outcome;
pub mod rules;
pub mod status;
pub mod telemetry;

use std::rc::Rc;

use crate::balance::pick::PickTable;
use crate::balance::probe::{self, Probes};
use crate::balance::score::{parse_load_report, LoadMetric, ScoreParams};
use crate::clock::VmClock;
use crate::config::Config;
use crate::map::{Map, Set};
use crate::record::state::{ClusterBatch, ClusterState, Policy};
use crate::record::sync::{
    self, sync_cluster, DecodeError, Keys, Member, SharedStore, SyncContext, SyncError,
};
use crate::units::{ms_to_whole_us, share_to_ppm, NS_PER_SEC};
use crate::worker::diagnose::{HonourWatch, SteeredWatch, Warning};
use crate::worker::outcome::{GrpcCode, Outcome};
use crate::worker::rules::{normalize_bytes, PathClass};
use crate::worker::status::{ClusterStatus, HostPhase, Status};
use crate::worker::telemetry::{Change, Metric, Update, NO_CLUSTER};

/// Clusters one worker keeps state for at once; an idle one makes room (`Worker::tick`).
pub const MAX_CLUSTERS: usize = 256;
/// Hosts one worker accumulates samples for between ticks.
const MAX_PENDING_HOSTS: usize = 4096;
/// The most a VM's clock may advance between two readings: a VM reads it on every request and
/// every tick, so a larger gap is a step of the host's clock (`clock::VmClock`).
const MIN_CLOCK_GAP_NS: u64 = NS_PER_SEC;

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
    /// The host was due a probe (`probe`), not drawn by weight.
    pub probe: bool,
    /// The version of the pick table it came from.
    pub table_version: u64,
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

/// For logs: `override 10.0.0.1:80,10.0.0.2:80`, `fallback (exploring)`, `deny`, `status`.
impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Override(pick) => {
                f.write_str("override ")?;
                f.write_str(&pick.host)?;
                match &pick.alternative {
                    Some(alternative) => write!(f, ",{alternative}"),
                    None => Ok(()),
                }
            }
            Decision::Fallback(reason) => write!(f, "fallback ({})", reason.label()),
            Decision::Deny => f.write_str("deny"),
            Decision::Status => f.write_str("status"),
        }
    }
}

impl Decision {
    /// Whether the request's outcome is a latency sample of the host that serves it.
    pub fn is_sampled(&self) -> bool {
        match self {
            Decision::Override(_) => true,
            Decision::Fallback(reason) => {
                matches!(
                    reason,
                    FallbackReason::Exploring
                        | FallbackReason::TableNotReady
                        | FallbackReason::Shadow
                )
            }
            Decision::Deny | Decision::Status => false,
        }
    }

    /// The request's decision as the access log reads it (the filter state
    /// `wasm.ewma_lb_decision`): `REASON HOST VERSION`, `-` for what there is none of.
    /// REASON is `steered` or `probe` (a pick: HOST is the picked host), `fallback:WHY` with
    /// WHY the `reason` label of `ewma_lb_fallback_requests_total`, `health_path`,
    /// `management`, `denied` or `status`. VERSION is the pick table's version
    /// (`table_version` of the status page): the pick's own, or for a fallback `table_version`,
    /// the cluster's table at the time. Written into `out` (cleared first), so one buffer
    /// serves every request.
    pub fn write_log_value(&self, table_version: Option<u64>, out: &mut String) {
        use std::fmt::Write as _;
        out.clear();
        let (reason, host, version) = match self {
            Decision::Override(pick) => (
                if pick.probe { "probe" } else { "steered" },
                Some(&*pick.host),
                Some(pick.table_version),
            ),
            Decision::Fallback(FallbackReason::HealthPath) => ("health_path", None, None),
            Decision::Fallback(FallbackReason::Management) => ("management", None, None),
            Decision::Fallback(why) => {
                out.push_str("fallback:");
                (why.label(), None, table_version)
            }
            Decision::Deny => ("denied", None, None),
            Decision::Status => ("status", None, None),
        };
        out.push_str(reason);
        out.push(' ');
        out.push_str(host.unwrap_or("-"));
        match version.filter(|v| *v > 0) {
            Some(v) => {
                let _ = write!(out, " {v}");
            }
            None => out.push_str(" -"),
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
    /// A cluster outside `steered_clusters`: its policy may not obey the header, so the plugin
    /// leaves it to Envoy and keeps no state for it.
    UnlistedCluster,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 8] = [
        FallbackReason::Exploring,
        FallbackReason::TableNotReady,
        FallbackReason::HealthPath,
        FallbackReason::Management,
        FallbackReason::Excluded,
        FallbackReason::NoCluster,
        FallbackReason::Shadow,
        FallbackReason::UnlistedCluster,
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
            FallbackReason::UnlistedCluster => "unlisted_cluster",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the filter knows of a request when it arrives.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request<'a> {
    /// `:path` as the client sent it: bytes, not necessarily UTF-8.
    pub path: &'a [u8],
    /// `xds.cluster_name`: the cluster the route chose.
    pub cluster: Option<&'a str>,
    /// This VM's steady time ([`Worker::clock`]) when the request arrived.
    pub now_ns: u64,
    /// The client has a body still to send. A picked host starts counting the request in flight
    /// only once it has it ([`Worker::request_sent`]): until then it is not working for it, and a
    /// client that trickles its body must not make a host look busy.
    pub body_pending: bool,
}

/// What the filter knows of a request when it is done.
#[derive(Clone, Copy, Debug, Default)]
pub struct Finished<'a> {
    /// The host this worker chose, if it chose one.
    pub picked: Option<&'a str>,
    /// Whether the request counted in the picked host's requests in flight (a request whose body
    /// never ended did not).
    pub in_flight: bool,
    /// `upstream.address`: the host that served the last attempt.
    pub served_by: Option<&'a str>,
    /// `upstream.request_attempt_count`.
    pub attempts: u32,
    pub latency_ms: f64,
    /// What the status code and response flags say ([`Outcome::classify`]).
    pub outcome: Option<Outcome>,
    /// The `grpc-status` of a gRPC response; `None` for any other response. It refines
    /// `outcome` by the configured failure codes ([`Outcome::with_grpc`]).
    pub grpc_status: Option<GrpcCode>,
    /// `upstream.num_endpoints`: the cluster's endpoint count (asked for once a tick, see
    /// [`Worker::wants_endpoint_count`]).
    pub num_endpoints: Option<u32>,
    /// `upstream.locality.zone` of `served_by` (asked for once a host, see [`Worker::wants_zone`]).
    pub zone: Option<&'a str>,
    /// The upstream response's `endpoint-load-metrics` header, as the host sent it: the load
    /// `served_by` reports (`score`). Never a request header: a client's report counts for nothing.
    pub load_report: Option<&'a [u8]>,
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
    /// When each host of the table is due a probe (`probe`).
    probes: Probes,
    /// Share of requests left to the fallback: the configured exploration, or more while the
    /// table does not know every endpoint of the cluster (they get their share through it; see
    /// [`explore_share`]).
    explore_share: f64,
    /// Endpoints the table did not know at the last tick, and since when it has been learning
    /// (the last tick at which that count grew).
    unknown_seen: u32,
    learning_since_ns: u64,
    /// Keyed by address so counts survive a table rebuild.
    in_flight: Map<Rc<str>, InFlight>,
    /// This tick's samples. Entries are emptied, not removed, after a merge: the next tick's
    /// samples of the same host need no allocation.
    batch: ClusterBatch,
    /// This cluster's keys in shared data, and this VM's place there (clock, slot).
    keys: Keys,
    member: Member,
    /// The last record read from shared data, for status and metrics.
    snapshot: ClusterState,
    /// `snapshot.unknown_endpoints()`, counted once per record read.
    unknown: u32,
    /// A request or a sample since the last tick.
    used: bool,
    /// Steady time of the last tick that saw it used.
    last_used_ns: u64,
    /// Reported that the stored record could not be read (reported once).
    reported_bad_record: bool,
    /// Whether Envoy honours this VM's picks (`diagnose`).
    honour: HonourWatch,
    /// When a shared-data error of this cluster was last warned of, and how many were not
    /// warned of since (`ERROR_WARNING_INTERVAL_NS`).
    error_warned_ns: Option<u64>,
    errors_unwarned: u64,
    /// The batch dropped its empty entries since the last tick (`host_batch`).
    batch_pruned: bool,
    /// Hosts Envoy's admin `/clusters` last marked unhealthy: out of the pick table (`health`).
    unhealthy: Set<String>,
}

impl LocalCluster {
    /// The batch of `host`, created while there is room. Entries are emptied, not removed, after a
    /// merge (the next tick's samples of the same host need no allocation); a full batch drops
    /// its empty entries once a tick to make room. Before, the first 4,096 hosts a VM met held
    /// every place for good: a larger cluster was never learned beyond them.
    fn host_batch(&mut self, host: &str) -> Option<&mut crate::record::state::Accumulator> {
        if !self.batch.hosts.contains_key(host)
            && self.batch.hosts.len() >= MAX_PENDING_HOSTS
            && !self.batch_pruned
        {
            self.batch.hosts.retain(|_, acc| !acc.is_empty());
            self.batch_pruned = true;
        }
        if !self.batch.hosts.contains_key(host) && self.batch.hosts.len() < MAX_PENDING_HOSTS {
            self.batch.hosts.insert(
                host.to_owned(),
                crate::record::state::Accumulator::default(),
            );
        }
        self.batch.hosts.get_mut(host)
    }

    fn in_flight(&self, host: &str) -> u32 {
        self.in_flight.get(host).map_or(0, |n| n.now)
    }
}

/// What happened since the last tick, for one `cluster_name`.
#[derive(Debug, Default)]
struct Counts {
    steered: u64,
    denied: u64,
    fallback: [u64; FallbackReason::ALL.len()],
    /// Finished requests served by a host outside the proxy's zone.
    cross_zone: u64,
    /// Stored records that could not be read and were rebuilt.
    bad_records: u64,
    /// Picks Envoy served by another host on the first attempt.
    not_honoured: u64,
    /// A cluster the configuration steers, or [`NO_CLUSTER`] (`counts_entry`).
    steered_label: bool,
    /// Load reports ignored as malformed or out of range.
    load_report_errors: u64,
}

impl Counts {
    /// Nothing to hand over: the counters went to the metrics at the last tick.
    fn is_empty(&self) -> bool {
        self.steered == 0
            && self.denied == 0
            && self.fallback.iter().all(|n| *n == 0)
            && self.cross_zone == 0
            && self.bad_records == 0
            && self.not_honoured == 0
            && self.load_report_errors == 0
    }
}

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
    /// By `cluster_name` label: steered clusters and [`NO_CLUSTER`], and at most [`MAX_CLUSTERS`]
    /// unlisted ones (`counts_entry`).
    counts: Map<String, Counts>,
    /// The names of `steered_clusters` no request carried yet (`diagnose`).
    steered_watch: SteeredWatch,
    /// When this VM last asked Envoy for its hosts' health, and last got an answer (`health`).
    health_asked_ns: Option<u64>,
    health_answered_ns: u64,
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
        };
        // The main-thread VM never sees a request; configured clusters still get refreshed.
        let names: Vec<String> = worker.config.static_clusters().map(str::to_owned).collect();
        for name in names {
            local_entry(&mut worker.clusters, &name, worker.id);
        }
        worker
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

    /// Decides what happens to a request: the path rules first, then the pick. `source` gives
    /// Envoy's `source.address` (the client as its connection manager determined it); it is
    /// asked for only on guarded paths.
    pub fn route(
        &mut self,
        request: &Request,
        source: impl FnOnce() -> Option<String>,
    ) -> Decision {
        let decision = self.decide(request, source);
        if let (Decision::Override(pick), Some(cluster), false) =
            (&decision, request.cluster, request.body_pending)
        {
            self.request_sent(cluster, &pick.host);
        }
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
        let path = normalize_bytes(request.path);
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
                Some(cluster) if !self.config.steers(cluster) => {
                    Decision::Fallback(FallbackReason::UnlistedCluster)
                }
                Some(cluster) if self.config.shadow() => {
                    if let Some(local) = local_entry(&mut self.clusters, cluster, self.id) {
                        local.used = true;
                    }
                    Decision::Fallback(FallbackReason::Shadow)
                }
                Some(cluster) => self.pick(cluster, request.now_ns),
                None => Decision::Fallback(FallbackReason::NoCluster),
            },
        }
    }

    /// Chooses where a request to `cluster` arriving at `now_ns` goes: a host due a probe, or
    /// the pick. Per request: local data only.
    fn pick(&mut self, cluster: &str, now_ns: u64) -> Decision {
        let Worker {
            id,
            config,
            rng,
            clusters,
            ..
        } = self;
        let Some(local) = local_entry(clusters, cluster, *id) else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        local.used = true;
        if local.table.is_empty() {
            return Decision::Fallback(FallbackReason::TableNotReady);
        }
        if local.explore_share > 0.0 && rng.f64() < local.explore_share {
            return Decision::Fallback(FallbackReason::Exploring);
        }
        let LocalCluster {
            table,
            probes,
            in_flight: counts,
            ..
        } = &mut *local;
        let in_flight = |i: usize| {
            table
                .host(i)
                .and_then(|h| counts.get(&**h))
                .map_or(0, |n| n.now)
        };
        let (first, probe) = match probes.due(now_ns, in_flight) {
            Some(i) => {
                table.count_served(i);
                (i, true)
            }
            None => match table.pick(config.pick(), rng, in_flight) {
                Some(i) => (i, false),
                None => return Decision::Fallback(FallbackReason::TableNotReady),
            },
        };
        probes.sent(first, now_ns);
        let Some(host) = local.table.host(first).cloned() else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        let alternative = local
            .table
            .weighted_except(rng, first)
            .and_then(|i| local.table.host(i))
            .cloned();
        Decision::Override(Pick {
            host,
            alternative,
            probe,
            table_version: local.table_version,
        })
    }

    /// The version of the pick table this worker uses for `cluster`; `None` before it has one.
    pub fn table_version(&self, cluster: &str) -> Option<u64> {
        self.clusters
            .get(cluster)
            .map(|c| c.table_version)
            .filter(|v| *v > 0)
    }

    /// Counts a request picked for `host` in flight there: from the end of the request, which is
    /// when the host can work on it (see [`Request::body_pending`]).
    pub fn request_sent(&mut self, cluster: &str, host: &Rc<str>) {
        let Some(local) = self.clusters.get_mut(cluster) else {
            return;
        };
        match local.in_flight.get_mut(&**host) {
            Some(n) => n.now += 1,
            None => {
                local.in_flight.insert(
                    host.clone(),
                    InFlight {
                        now: 1,
                        reported: 0,
                    },
                );
            }
        }
    }

    /// Undoes a pick that never took effect (the host refused the header): the request is the
    /// fallback's, not in flight to the picked host and not steered.
    /// `in_flight`: whether the request was counted in flight (it had no body to send).
    pub fn cancel(&mut self, cluster: &str, pick: &Pick, in_flight: bool) {
        if let Some(n) = self
            .clusters
            .get_mut(cluster)
            .and_then(|c| c.in_flight.get_mut(&*pick.host))
            .filter(|_| in_flight)
        {
            n.now = n.now.saturating_sub(1);
        }
        if let Some(c) = self.counts.get_mut(cluster) {
            c.steered = c.steered.saturating_sub(1);
        }
    }

    /// Whether the adapter should read `upstream.num_endpoints` for a request of `cluster`
    /// finishing now: once a tick is enough.
    pub fn wants_endpoint_count(&self, cluster: &str) -> bool {
        self.clusters
            .get(cluster)
            .is_some_and(|c| c.batch.num_endpoints.is_none())
    }

    /// Whether the adapter should ask Envoy's admin `/clusters` for its hosts' health now, at the
    /// host clock's reading `raw_now_ns`; notes the question as asked. Only a VM with a table
    /// asks: the main thread's VM never picks.
    pub fn envoy_health_due(&mut self, raw_now_ns: u64) -> bool {
        if self.config.admin_cluster().is_none()
            || self.clusters.values().all(|c| c.table.is_empty())
        {
            return false;
        }
        let now_ns = self.clock.now(raw_now_ns);
        let due = self
            .health_asked_ns
            .is_none_or(|at| now_ns.saturating_sub(at) >= self.config.health_poll_ns());
        if due {
            self.health_asked_ns = Some(now_ns);
        }
        due
    }

    /// Takes in Envoy's answer to `/clusters`: each steered cluster's pick table leaves out the
    /// hosts marked unhealthy there, and takes back the ones no longer marked.
    pub fn envoy_health(&mut self, raw_now_ns: u64, clusters_text: &[u8]) {
        let now_ns = self.clock.now(raw_now_ns);
        self.health_answered_ns = now_ns;
        let mut unhealthy =
            crate::worker::health::unhealthy_hosts(clusters_text, |c| self.config.steers(c));
        let policy = self.config.policy();
        for (name, local) in &mut self.clusters {
            let hosts = unhealthy.remove(name).unwrap_or_default();
            if hosts != local.unhealthy {
                local.unhealthy = hosts;
                let state = local.snapshot.clone();
                adopt(local, &state, policy, now_ns);
            }
        }
    }

    /// Forgets what Envoy said of its hosts' health once it has not answered for
    /// [`HEALTH_STALE_POLLS`] intervals: without an answer the table decides again.
    fn forget_stale_health(&mut self, now_ns: u64) {
        let stale_after = self
            .config
            .health_poll_ns()
            .saturating_mul(HEALTH_STALE_POLLS);
        if now_ns.saturating_sub(self.health_answered_ns) < stale_after {
            return;
        }
        let policy = self.config.policy();
        for local in self.clusters.values_mut() {
            if !local.unhealthy.is_empty() {
                local.unhealthy.clear();
                let state = local.snapshot.clone();
                adopt(local, &state, policy, now_ns);
            }
        }
    }

    /// Whether the adapter should read a response's load report (`score`): not when the score
    /// ignores them.
    pub fn reads_load_reports(&self) -> bool {
        let score = &self.config.policy().score;
        score.load_weight > 0.0 && score.load_metric != LoadMetric::Off
    }

    /// Whether the adapter should read the zone of `host` (not known yet).
    pub fn wants_zone(&self, cluster: &str, host: &str) -> bool {
        let Some(local) = self.clusters.get(cluster) else {
            return false;
        };
        let batched = local
            .batch
            .hosts
            .get(host)
            .is_some_and(|a| a.zone.is_some());
        !batched && local.snapshot.host(host).is_none_or(|h| h.zone.is_empty())
    }

    /// Records a sampled request's end. Called exactly once per request `route` sampled.
    pub fn finish(&mut self, cluster: &str, done: &Finished) {
        let penalty_ms = self.config.failure_penalty_ms();
        let latency_ms = done
            .latency_ms
            .max(0.0)
            .min(self.config.latency_ceiling_ms());
        let local_zone = self.local_zone.as_deref().filter(|z| !z.is_empty());
        let Some(local) = local_entry(&mut self.clusters, cluster, self.id) else {
            return;
        };
        local.used = true;
        if let Some(n) = done.num_endpoints {
            local.batch.num_endpoints = Some(n);
        }
        if let Some(count) = done
            .picked
            .filter(|_| done.in_flight)
            .and_then(|p| local.in_flight.get_mut(p))
        {
            count.now = count.now.saturating_sub(1);
        }
        if let (Some(picked), Some(served_by)) = (done.picked, done.served_by) {
            let honoured = served_by == picked || done.attempts > 1;
            local.honour.record(honoured);
            if served_by != picked {
                // The route retries only failed connections and resets before the request: a
                // retried request that ended elsewhere means our pick failed, though Envoy
                // reports the last host. On the first attempt, Envoy did not honour the pick at
                // all: the host is not (or no longer healthy) in the cluster, or the cluster
                // does not read the header (`diagnose`).
                if let Some(acc) = local.host_batch(picked) {
                    if honoured {
                        acc.record(penalty_ms, true, penalty_ms);
                    } else {
                        acc.not_honoured = acc.not_honoured.saturating_add(1);
                    }
                }
                if !honoured {
                    if let Some(c) = counts_entry(&mut self.counts, cluster, || true) {
                        c.not_honoured += 1;
                    }
                }
            }
        }
        let outcome =
            Outcome::with_grpc(done.outcome, done.grpc_status, self.config.grpc_failures());
        let load = match done
            .load_report
            .map(|r| parse_load_report(r, &self.config.policy().score.load_metric))
        {
            Some(Ok(load)) => load,
            Some(Err(_)) => {
                if let Some(c) = counts_entry(&mut self.counts, cluster, || true) {
                    c.load_report_errors += 1;
                }
                None
            }
            None => None,
        };
        let (Some(host), Some(outcome)) = (done.served_by, outcome) else {
            return;
        };
        // The zone as reported now, or as this VM's batch or the record already know it (the
        // adapter reads it once per host: see `wants_zone`).
        let remote = local_zone.is_some_and(|mine| {
            let zone = done
                .zone
                .or_else(|| local.batch.hosts.get(host).and_then(|a| a.zone.as_deref()))
                .or_else(|| local.snapshot.host(host).map(|h| h.zone.as_str()))
                .unwrap_or_default();
            !zone.is_empty() && zone != mine
        });
        // A host outside the stable subset of a cluster larger than the table is the fallback's:
        // its samples would only be refused when folded.
        let endpoints = done.num_endpoints.unwrap_or(local.snapshot.num_endpoints);
        if !crate::record::state::in_subset(host, endpoints, self.config.policy().max_hosts) {
            return;
        }
        if let Some(acc) = local.host_batch(host) {
            acc.record(latency_ms, outcome.is_failure(), penalty_ms);
            if let Some(utilization) = load {
                acc.report_load(utilization);
            }
            if let Some(zone) = done.zone.filter(|z| acc.zone.as_deref() != Some(*z)) {
                acc.zone = Some(zone.to_owned());
            }
        }
        if remote {
            if let Some(c) = counts_entry(&mut self.counts, cluster, || true) {
                c.cross_zone += 1;
            }
        }
    }

    /// Merges this worker's samples into shared state, refreshes weights when due, adopts the
    /// newest table, and collects what the metrics should say. Call on every tick, with the host
    /// clock's reading.
    pub fn tick(&mut self, raw_now_ns: u64, store: &mut dyn SharedStore) -> TickReport {
        let steady_ns = self.clock.now(raw_now_ns);
        let mut report = TickReport::default();
        self.evict_idle(steady_ns);
        self.forget_stale_health(steady_ns);
        let local_zone = self.local_zone.as_deref().filter(|z| !z.is_empty());
        let policy = self.config.policy();
        let slow_start_ns = policy.weights.slow_start_ns;
        let tick_ns = u64::try_from(self.config.tick_period().as_nanos()).unwrap_or(u64::MAX);
        for (name, local) in &mut self.clusters {
            if local.keys.record.is_empty() {
                local.keys = Keys::new(&self.namespace, name);
            }
            let ctx = SyncContext {
                keys: &local.keys,
                static_hosts: self.config.static_endpoints(name),
                policy,
                local_zone,
                steady_ns,
                worker: self.id,
                tick_ns,
                urgent: urgent(&local.batch, &local.snapshot),
                table_version: local.table_version,
            };
            match sync_cluster(store, &ctx, &local.batch, &mut local.member) {
                Ok(sync) => {
                    match sync.kept {
                        None => local.batch.clear(),
                        Some(e) => report.errors.push((name.clone(), e)),
                    }
                    if let Some(e) = sync.failed {
                        report.errors.push((name.clone(), e));
                    }
                    report.refreshed += usize::from(sync.refreshed);
                    if sync.ejected > 0 {
                        report.metrics.push(update(
                            Metric::Ejections,
                            name,
                            None,
                            Change::Add(sync.ejected as i64),
                        ));
                    }
                    if let Some(e) = sync.replaced {
                        if let Some(c) = counts_entry(&mut self.counts, name, || true) {
                            c.bad_records += 1;
                        }
                        if !local.reported_bad_record {
                            local.reported_bad_record = true;
                            report.bad_records.push((name.clone(), e));
                        }
                    }
                    local.probes.set_workers(sync.head.workers as usize);
                    if let Some(state) = sync.state {
                        // Entries of hosts that left the record go; only a change of the
                        // record's hosts can make any.
                        if !same_hosts(&local.snapshot, &state) {
                            forget_departed(local, &state);
                        }
                        local.unknown = if state.num_endpoints > 0 {
                            state.unknown_endpoints()
                        } else {
                            0
                        };
                        if state.table_version != local.table_version {
                            adopt(local, &state, policy, steady_ns);
                            report.adopted.push((name.clone(), local.table_version));
                            // The per-host gauges are the process's, like the table: the VM
                            // that published the table sets them, not every VM that adopts it
                            // (a cluster's hosts times Envoy's workers in host calls a refresh).
                            if sync.folded {
                                host_gauges(
                                    name,
                                    &local.snapshot,
                                    &state,
                                    slow_start_ns,
                                    &policy.score,
                                    &mut report.metrics,
                                );
                                report.metrics.push(update(
                                    Metric::HostsOutsideSubset,
                                    name,
                                    None,
                                    Change::Set(u64::from(state.outside_subset(policy.max_hosts))),
                                ));
                            }
                        }
                        local.snapshot = state;
                    }
                    explore_share(local, self.config.exploration_share(), steady_ns);
                }
                Err(e) => report.errors.push((name.clone(), e)),
            }
            warn_errors(
                name,
                local,
                &report.errors,
                steady_ns,
                &mut report.error_warnings,
            );
            local.batch_pruned = false;
            in_flight_updates(name, local, &mut report.metrics);
            if let Some(window) = local.honour.check(steady_ns) {
                report.warnings.push(Warning::NotHonoured {
                    cluster: name.clone(),
                    window,
                    header: self.config.override_header().to_owned(),
                });
            }
        }
        for (cluster, counts) in &mut self.counts {
            count_updates(cluster, counts, &mut report.metrics);
        }
        self.watch_steered(steady_ns, &*store, &mut report.warnings);
        report
    }

    /// Warns of names in `steered_clusters` no request carried (`diagnose::SteeredWatch`). A
    /// name is seen when this VM counted a request to it; before warning, also when another VM
    /// did (its record shows traffic). Only a VM that saw requests warns, listing their clusters:
    /// the main thread's VM, or a worker without traffic, knows nothing to compare with.
    fn watch_steered(&mut self, steady_ns: u64, store: &dyn SharedStore, out: &mut Vec<Warning>) {
        let Worker {
            steered_watch: watch,
            counts,
            namespace,
            config,
            ..
        } = self;
        watch.observe(|name| counts.contains_key(name));
        if !watch.due(steady_ns) || counts.keys().all(|c| c == NO_CLUSTER) {
            return;
        }
        watch.warned(steady_ns);
        let max_hosts = config.policy().max_hosts;
        watch.observe(|name| record_shows_traffic(store, &sync::key(namespace, name), max_hosts));
        if watch.unseen().is_empty() {
            return;
        }
        out.push(Warning::unseen_clusters(
            watch.unseen(),
            watch.running_ns(steady_ns),
            counts
                .keys()
                .map(String::as_str)
                .filter(|c| *c != NO_CLUSTER),
        ));
    }

    /// Forgets clusters this VM has not used for `host_ttl` (nothing in flight, not configured),
    /// so a proxy that routed to many clusters once keeps room for the ones it uses now.
    fn evict_idle(&mut self, steady_ns: u64) {
        let idle_after_ns = self.config.policy().host_ttl_ns;
        let config = &self.config;
        let counts = &mut self.counts;
        self.clusters.retain(|name, local| {
            if std::mem::take(&mut local.used) {
                local.last_used_ns = steady_ns;
            }
            let idle = steady_ns.saturating_sub(local.last_used_ns) >= idle_after_ns
                && local
                    .in_flight
                    .values()
                    .all(|n| n.now == 0 && n.reported == 0)
                && config.static_endpoints(name).is_empty();
            if idle {
                counts.remove(name.as_str());
            }
            !idle
        });
    }

    /// The shared-data key of `cluster`'s record under this configuration.
    pub fn record_key(&self, cluster: &str) -> String {
        sync::key(&self.namespace, cluster)
    }

    /// The status document, as JSON.
    pub fn status_json(&self) -> String {
        let slow_start_ns = self.config.policy().weights.slow_start_ns;
        let steady_ns = self.clock.last();
        let clusters: Vec<ClusterStatus> = self
            .clusters
            .iter()
            .map(|(name, local)| {
                let now_ns = local
                    .member
                    .clock
                    .estimate(steady_ns)
                    .unwrap_or(local.snapshot.clock_ns);
                ClusterStatus::new(
                    name,
                    &local.snapshot,
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
            .hosts
            .iter()
            .map(|h| format!("{}={}ppm", h.address, share_to_ppm(h.share)))
            .collect();
        shares.join(" ")
    }

    /// The last shared record seen of each cluster.
    pub fn snapshots(&self) -> impl Iterator<Item = (&str, &ClusterState)> {
        self.clusters
            .iter()
            .map(|(name, c)| (name.as_str(), &c.snapshot))
    }

    /// This worker's in-flight count for a host.
    pub fn in_flight(&self, cluster: &str, host: &str) -> u32 {
        self.clusters.get(cluster).map_or(0, |c| c.in_flight(host))
    }

    /// The share of requests `cluster`'s table leaves to the fallback policy.
    pub fn explore_share(&self, cluster: &str) -> Option<f64> {
        self.clusters.get(cluster).map(|c| c.explore_share)
    }

    fn counts_of(&mut self, cluster: Option<&str>) -> Option<&mut Counts> {
        let label = cluster.unwrap_or(NO_CLUSTER);
        let config = &self.config;
        counts_entry(&mut self.counts, label, || {
            label == NO_CLUSTER || config.steers(label)
        })
    }
}

/// The counters of `label`, created on first sight while there is room. Clusters the
/// configuration steers (at most [`MAX_CLUSTERS`] have a local entry) and [`NO_CLUSTER`] always
/// find room: unlisted clusters, which a proxy may meet without bound, have [`MAX_CLUSTERS`] of
/// their own, and one whose counters were handed over at the last tick (all zero) gives its place
/// to a newcomer. Before, the first 257 labels of any kind took every place for good.
fn counts_entry<'a>(
    counts: &'a mut Map<String, Counts>,
    label: &str,
    steered: impl FnOnce() -> bool,
) -> Option<&'a mut Counts> {
    if !counts.contains_key(label) {
        let steered = steered();
        let room = if steered {
            counts.len() <= 2 * MAX_CLUSTERS
        } else {
            let unlisted = counts.values().filter(|c| !c.steered_label).count();
            let idle = (unlisted >= MAX_CLUSTERS)
                .then(|| {
                    counts
                        .iter()
                        .find(|(_, c)| !c.steered_label && c.is_empty())
                        .map(|(k, _)| k.clone())
                })
                .flatten();
            if let Some(idle) = &idle {
                counts.remove(idle);
            }
            unlisted < MAX_CLUSTERS || idle.is_some()
        };
        if room {
            let fresh = Counts {
                steered_label: steered,
                ..Counts::default()
            };
            counts.insert(label.to_owned(), fresh);
        }
    }
    counts.get_mut(label)
}

/// The local entry of `cluster`, created on first sight while there is room.
fn local_entry<'a>(
    clusters: &'a mut Map<String, LocalCluster>,
    cluster: &str,
    worker: u64,
) -> Option<&'a mut LocalCluster> {
    if !clusters.contains_key(cluster) && clusters.len() < MAX_CLUSTERS {
        let mut local = LocalCluster::default();
        local.batch.worker = worker;
        clusters.insert(cluster.to_owned(), local);
    }
    clusters.get_mut(cluster)
}

/// Whether the stored record at `key` shows requests: an endpoint count or a host with samples,
/// which only finished requests give (a cluster's static hosts alone are no traffic).
fn record_shows_traffic(store: &dyn SharedStore, key: &str, max_hosts: usize) -> bool {
    let Ok((Some(bytes), _)) = store.get(key) else {
        return false;
    };
    sync::decode(&bytes, max_hosts)
        .is_ok_and(|state| state.num_endpoints > 0 || state.hosts.iter().any(|h| h.samples > 0))
}

/// Rebuilds this VM's pick table from a new version of the record, with the weights' floor (the
/// pick draws above it, see `pick`) and each host's probe interval (`probe`), measured against
/// the latency the table's traffic gets on average.
fn adopt(local: &mut LocalCluster, state: &ClusterState, policy: &Policy, now_ns: u64) {
    // A host Envoy marked unhealthy gets nothing from this VM, neither picks nor probes.
    let unhealthy = &local.unhealthy;
    let share_of = |h: &crate::record::state::HostState| match unhealthy.contains(&h.address) {
        true => 0.0,
        false => h.share,
    };
    let live = state.hosts.iter().filter(|h| share_of(h) > 0.0);
    let floor = crate::balance::weights::floor(&policy.weights, live.clone().count());
    let (weighted, mass) = live
        .filter_map(|h| h.latency.value_ms().map(|v| (v * h.share, h.share)))
        .fold((0.0, 0.0), |(w, m), (v, s)| (w + v, m + s));
    let reference_ms = (mass > 0.0).then(|| weighted / mass);
    let table = PickTable::with_floor(
        state
            .hosts
            .iter()
            .map(|h| (h.address.as_str(), share_of(h))),
        floor,
    );
    // Only hosts at the floor, which the pick never draws, are probed. A host above it gets its
    // share from the pick, however rarely that comes in a large cluster: probing it for being
    // quiet would turn a sparse table into round robin.
    let at_floor = |share: f64| share <= floor * (1.0 + FLOOR_TOLERANCE);
    let intervals = state
        .hosts
        .iter()
        .filter(|h| share_of(h) > 0.0 && h.share.is_finite())
        .map(|h| match at_floor(h.share) {
            true => {
                probe::interval_ns(policy.probe_interval_ns, h.latency.value_ms(), reference_ms)
            }
            false => u64::MAX,
        })
        .collect();
    local.probes = local.probes.rebuild(
        local.table.host_list(),
        table.host_list(),
        intervals,
        now_ns,
    );
    local.probes.set_floor(floor);
    local.table = table;
    local.table_version = state.table_version;
}

/// Polls without an answer after which Envoy's health is forgotten.
const HEALTH_STALE_POLLS: u64 = 5;

/// Shares this close above the floor (relatively) are at it: rounding of the table's fit.
const FLOOR_TOLERANCE: f64 = 1e-6;

/// How long after endpoints appear that the table does not know the fallback gets at least
/// [`LEARNING_SHARE`] of the requests.
pub const LEARNING_WINDOW_NS: u64 = 5 * NS_PER_SEC;
/// The fallback's share during [`LEARNING_WINDOW_NS`].
pub const LEARNING_SHARE: f64 = 0.5;

/// Sets the share of requests left to the fallback. Endpoints the record does not know get
/// their share only through it: a table that knows one host of three must not send that host
/// every steered request, so the fallback gets at least the unknown fraction. The fallback
/// spreads what it gets over every endpoint, known ones included, so an unknown endpoint
/// receives that fraction of its fair share: with one of fifty unknown, 2 % of it, and it could
/// go unmet for seconds. So for a while after unknown endpoints appear the fallback gets at least
/// half the requests: each unknown endpoint then receives half its fair share and is met within
/// a few of its requests. An endpoint that is never met (one Envoy counts but does not route to)
/// costs that half only for the window, then its fraction.
fn explore_share(local: &mut LocalCluster, configured: f64, now_ns: u64) {
    let unknown = local.unknown;
    let num_endpoints = local.snapshot.num_endpoints;
    if unknown > local.unknown_seen {
        local.learning_since_ns = now_ns;
    }
    local.unknown_seen = unknown;
    // Once the record knows every endpoint Envoy counts, there is nothing to find: probes, not
    // the fallback, keep the known ones measured.
    let everything_known = num_endpoints > 0 && unknown == 0;
    let mut share = if everything_known { 0.0 } else { configured };
    if unknown > 0 {
        share = share.max(f64::from(unknown) / f64::from(num_endpoints));
        if now_ns.saturating_sub(local.learning_since_ns) < LEARNING_WINDOW_NS {
            share = share.max(LEARNING_SHARE);
        }
    }
    local.explore_share = share.min(1.0);
}

fn update(metric: Metric, cluster: &str, label: Option<&str>, change: Change) -> Update {
    Update {
        metric,
        cluster: cluster.to_owned(),
        label: label.map(str::to_owned),
        change,
    }
}

/// The per-host gauges of a newly adopted table, and zeros for the hosts that left it. Every VM
/// adopts the same table, so they all set the same values.
fn host_gauges(
    cluster: &str,
    old: &ClusterState,
    new: &ClusterState,
    slow_start_ns: u64,
    score: &ScoreParams,
    out: &mut Vec<Update>,
) {
    const HOST_GAUGES: [Metric; 6] = [
        Metric::HostWeight,
        Metric::HostLatency,
        Metric::HostEjected,
        Metric::HostErrorRate,
        Metric::HostUtilization,
        Metric::HostScore,
    ];
    for h in &new.hosts {
        let ejected = HostPhase::of(h, new.clock_ns, slow_start_ns) == HostPhase::Ejected;
        let terms = h.terms(new.clock_ns);
        let latency_us = terms.latency_ms.map_or(0, ms_to_whole_us);
        let values = [
            share_to_ppm(h.share),
            latency_us,
            u64::from(ejected),
            share_to_ppm(terms.error_rate),
            terms.utilization.map_or(0, share_to_ppm),
            terms.score_ms(score).map_or(0, ms_to_whole_us),
        ];
        for (metric, value) in HOST_GAUGES.into_iter().zip(values) {
            out.push(update(
                metric,
                cluster,
                Some(&h.address),
                Change::Set(value),
            ));
        }
    }
    // Both sorted by address: one walk finds the hosts that left.
    let mut present = new.hosts.iter().map(|h| h.address.as_str()).peekable();
    let gone = old.hosts.iter().filter(|h| {
        while present.next_if(|a| *a < h.address.as_str()).is_some() {}
        present.peek() != Some(&h.address.as_str())
    });
    for gone in gone {
        for metric in HOST_GAUGES {
            out.push(update(metric, cluster, Some(&gone.address), Change::Set(0)));
        }
    }
    out.push(update(
        Metric::UnknownEndpoints,
        cluster,
        None,
        Change::Set(u64::from(new.unknown_endpoints())),
    ));
}

/// Moves the shared in-flight gauge by this worker's change since the last tick.
/// How often a cluster's shared-data errors are logged at most. Under contention the same error
/// ("every compare-and-swap lost") can come every tick of every VM: ten lines a second each.
const ERROR_WARNING_INTERVAL_NS: u64 = 60_000_000_000;

/// Picks this tick's errors of `cluster` (the last entries of `errors` naming it) to log.
fn warn_errors(
    cluster: &str,
    local: &mut LocalCluster,
    errors: &[(String, SyncError)],
    now_ns: u64,
    out: &mut Vec<(String, SyncError, u64)>,
) {
    for (_, e) in errors.iter().filter(|(c, _)| c == cluster) {
        let due = local
            .error_warned_ns
            .is_none_or(|at| now_ns.saturating_sub(at) >= ERROR_WARNING_INTERVAL_NS);
        if due {
            out.push((cluster.to_owned(), e.clone(), local.errors_unwarned));
            local.error_warned_ns = Some(now_ns);
            local.errors_unwarned = 0;
        } else {
            local.errors_unwarned += 1;
        }
    }
}

fn in_flight_updates(cluster: &str, local: &mut LocalCluster, out: &mut Vec<Update>) {
    for (host, n) in &mut local.in_flight {
        if n.now != n.reported {
            let delta = i64::from(n.now) - i64::from(n.reported);
            out.push(update(
                Metric::HostInFlight,
                cluster,
                Some(host),
                Change::Add(delta),
            ));
            n.reported = n.now;
        }
    }
}

/// Whether `batch` holds what the table should follow at once rather than at the next refresh:
/// a host the record does not know, another endpoint count, a host whose every request failed or
/// that Envoy no longer has. Costs what the batch holds.
fn urgent(batch: &ClusterBatch, record: &ClusterState) -> bool {
    batch
        .num_endpoints
        .is_some_and(|n| n != record.num_endpoints)
        || batch.hosts.iter().any(|(address, acc)| {
            acc.not_honoured > 0
                || (acc.failures > 0 && !acc.had_success)
                || (acc.latency.count > 0 && record.host(address).is_none())
        })
}

/// Whether two records list the same hosts (both are sorted by address).
fn same_hosts(a: &ClusterState, b: &ClusterState) -> bool {
    a.hosts.len() == b.hosts.len()
        && a.hosts
            .iter()
            .zip(&b.hosts)
            .all(|(x, y)| x.address == y.address)
}

/// Forgets the batch entries of hosts no longer in `record`, and the in-flight entries of those
/// with nothing in flight or unreported. Called when the record's hosts changed, not on every
/// tick: searching every entry of a 500-host cluster on every tick cost more than the rest of
/// the tick. (The batch is a hash map, so each entry is looked up in the record, whose hosts
/// are sorted.)
fn forget_departed(local: &mut LocalCluster, record: &ClusterState) {
    local
        .batch
        .hosts
        .retain(|host, _| record.host(host).is_some());
    local
        .in_flight
        .retain(|host, n| n.now > 0 || n.reported > 0 || record.host(host).is_some());
}

/// The counters as counter increments, then zeroed.
fn count_updates(cluster: &str, counts: &mut Counts, out: &mut Vec<Update>) {
    let plain = [
        (Metric::SteeredRequests, counts.steered),
        (Metric::ManagementDeniedRequests, counts.denied),
        (Metric::CrossZoneRequests, counts.cross_zone),
        (Metric::SharedRecordErrors, counts.bad_records),
        (Metric::PicksNotHonoured, counts.not_honoured),
        (Metric::LoadReportErrors, counts.load_report_errors),
    ];
    for (metric, n) in plain.into_iter().filter(|(_, n)| *n > 0) {
        out.push(update(metric, cluster, None, Change::Add(n as i64)));
    }
    for (reason, n) in FallbackReason::ALL.iter().zip(&counts.fallback) {
        if *n > 0 {
            out.push(update(
                Metric::FallbackRequests,
                cluster,
                Some(reason.label()),
                Change::Add(*n as i64),
            ));
        }
    }
    *counts = Counts {
        steered_label: counts.steered_label,
        ..Counts::default()
    };
}

/// What a tick did, for logs and metrics.
#[derive(Debug, Default)]
pub struct TickReport {
    /// Clusters whose weights this worker recomputed.
    pub refreshed: usize,
    /// Clusters whose pick table changed, with the new version.
    pub adopted: Vec<(String, u64)>,
    /// Clusters whose samples could not be written this tick (they are kept), or whose refresh
    /// did not finish (the next refresher redoes it).
    pub errors: Vec<(String, SyncError)>,
    /// The errors to log: per cluster, the first of `errors`, then at most one a minute, with
    /// how many of that cluster's errors went unlogged before it.
    pub error_warnings: Vec<(String, SyncError, u64)>,
    /// Clusters whose stored record could not be read and was rebuilt, the first time each.
    pub bad_records: Vec<(String, DecodeError)>,
    /// What the metrics should say now.
    pub metrics: Vec<Update>,
    /// Misconfigurations to log (`diagnose`), each rate-limited already.
    pub warnings: Vec<Warning>,
}
