//! Per tick: sync every cluster with its shared record, adopt a new table, forget idle clusters
//! and stale health, and collect what the metrics and logs should say ([`TickReport`]).

use std::rc::Rc;

use crate::balance::pick::{PickAlgorithm, PickTable, Waits};
use crate::balance::probe;
use crate::config::Config;
use crate::names::same as same_name;
use crate::record::state::in_subset;
use crate::record::sync::{
    self, sync_cluster, DecodeError, Keys, SharedStore, SyncContext, SyncError,
};
use crate::record::table::{Table, TableHost};
use crate::worker::cluster::{counts_entry, LocalCluster};
use crate::worker::diagnose::Warning;
use crate::worker::telemetry::{self, Change, Metric, Update, NO_CLUSTER};
use crate::worker::Worker;

impl Worker {
    /// Merges this worker's samples into shared state, refreshes weights when due, adopts the
    /// newest table, and collects what the metrics should say. Call on every tick, with the host
    /// clock's reading.
    pub fn tick(&mut self, raw_now_ns: u64, store: &mut dyn SharedStore) -> TickReport {
        let steady_ns = self.clock.now(raw_now_ns);
        let mut report = TickReport::default();
        self.evict_idle(steady_ns);
        self.forget_stale_health(steady_ns);
        report.warnings.extend(self.unanswered_health());
        let local_zone = self.local_zone.as_deref().filter(|z| !z.is_empty());
        let policy = self.config.policy();
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
                urgent: urgent(local),
                table: &local.snapshot,
            };
            match sync_cluster(store, &ctx, &local.batch, &mut local.member) {
                Ok(sync) => {
                    match sync.kept {
                        None => local.clear_batch(),
                        Some(e) => report.errors.push((name.clone(), e)),
                    }
                    if let Some(e) = sync.failed {
                        report.errors.push((name.clone(), e));
                    }
                    report.refreshed += usize::from(sync.refreshed);
                    if sync.ejected > 0 {
                        report.metrics.push(telemetry::update(
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
                    if let Some(table) = sync.table {
                        // Entries of hosts that left the table go; only a departure can
                        // make any.
                        if local.snapshot.lost_hosts(&table) {
                            forget_departed(local, &table);
                        }
                        if table.table_version != local.snapshot.table_version {
                            adopt(local, &table, &self.config, steady_ns);
                            report.adopted.push((name.clone(), table.table_version));
                            // The per-host gauges are the process's, like the table: the VM
                            // that published the table sets them, not every VM that adopts it
                            // (a cluster's hosts times Envoy's workers in host calls a refresh).
                            // Their values are made when asked (`Worker::host_gauges`): the
                            // filter asks; the simulator, which keeps no metrics, does not.
                            if let Some(state) = local.member.record().filter(|_| sync.folded) {
                                telemetry::departed_gauges(
                                    name,
                                    &local.snapshot,
                                    &table,
                                    state.hosts.len(),
                                    &mut report.metrics,
                                );
                                report.gauges_due.push(name.clone());
                                report.metrics.push(telemetry::update(
                                    Metric::UnknownEndpoints,
                                    name,
                                    None,
                                    Change::Set(u64::from(state.unknown_endpoints())),
                                ));
                                report.metrics.push(telemetry::update(
                                    Metric::HostsOutsideSubset,
                                    name,
                                    None,
                                    Change::Set(u64::from(state.outside_subset(policy.max_hosts))),
                                ));
                            }
                        }
                        local.snapshot = table;
                    }
                    local.exploration.update(
                        local.snapshot.unknown_endpoints,
                        local.snapshot.num_endpoints,
                        self.config.exploration_share(),
                        steady_ns,
                    );
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
            telemetry::in_flight_updates(name, local, &mut report.metrics);
            if let Some(window) = local.honour.check(steady_ns) {
                report.warnings.push(Warning::NotHonoured {
                    cluster: name.clone(),
                    window,
                    header: self.config.override_header().to_owned(),
                });
            }
        }
        for (cluster, counts) in &mut self.counts {
            telemetry::count_updates(cluster, counts, &mut report.metrics);
        }
        self.watch_steered(steady_ns, &*store, &mut report.warnings);
        report
    }

    /// The per-host gauges of a cluster the last tick named in [`TickReport::gauges_due`], one
    /// update at a time: each host's share, latency, ejection, error rate, utilisation and score
    /// in the record this VM published. Nothing for a cluster whose table in force this VM did
    /// not publish, or above [`telemetry::MAX_GAUGED_HOSTS`] hosts.
    pub fn host_gauges(&self, cluster: &str, each: impl FnMut(Update)) {
        let Some(local) = self.clusters.get(cluster) else {
            return;
        };
        // The record this VM published, and the table made of it: the gauges pair the record's
        // hosts with the table's names in order.
        let Some(state) = local
            .member
            .record()
            .filter(|s| s.table_version == local.snapshot.table_version)
        else {
            return;
        };
        let policy = self.config.policy();
        telemetry::host_gauges(
            cluster,
            state,
            &local.snapshot,
            policy.weights.slow_start_ns,
            &policy.score,
            each,
        );
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
            self.health_unanswered = self.health_unanswered.saturating_add(1);
        }
        due
    }

    /// Takes in Envoy's answer to `/clusters`: each steered cluster's pick table leaves out the
    /// hosts marked unhealthy there, and takes back the ones no longer marked. Listed hosts the
    /// table does not know go to the record with the next batch (`Accumulator::listed`), the ones
    /// it knows and the page does not list leave it (`Accumulator::unlisted`), and the page's
    /// host count goes with them, as a request would report it (`upstream.num_endpoints`).
    pub fn envoy_health(&mut self, raw_now_ns: u64, clusters_text: &[u8]) {
        let now_ns = self.clock.now(raw_now_ns);
        self.health_answered_ns = now_ns;
        self.health_unanswered = 0;
        self.health_warned = false;
        let max_hosts = self.config.policy().max_hosts;
        let text = String::from_utf8_lossy(clusters_text);
        let mut listed = crate::worker::health::listed_hosts(&text, |c| self.config.steers(c));
        for (name, local) in &mut self.clusters {
            let hosts = listed.remove(name.as_str()).unwrap_or_default();
            let count = hosts.count();
            // Which hosts of the table the page lists (the table is sorted by address), and the
            // serving ones it lacks.
            let table = &local.snapshot;
            let mut on_page = vec![false; table.len()];
            let mut joined = Vec::new();
            for &address in &hosts.serving {
                match table.position(address) {
                    Some(i) => {
                        if let Some(listed) = on_page.get_mut(i) {
                            *listed = true;
                        }
                    }
                    // Outside a large cluster's subset the record would not take it.
                    None if in_subset(address, count, max_hosts) => joined.push(address),
                    None => {}
                }
            }
            for address in &hosts.unhealthy {
                if let Some(listed) = table.position(address).and_then(|i| on_page.get_mut(i)) {
                    *listed = true;
                }
            }
            // Hosts of the table the page no longer lists have left the cluster: the table
            // drops them now, not at the first pick Envoy does not honour. (A page without the
            // cluster says nothing of it.)
            let mut left = Vec::new();
            if count > 0 {
                local.batch.num_endpoints = Some(count);
                left.extend(
                    on_page
                        .iter()
                        .enumerate()
                        .filter(|(_, listed)| !**listed)
                        .map(|(i, _)| i),
                );
            }
            for address in joined {
                if let Some(acc) = local.host_batch(address) {
                    acc.listed = true;
                    local.unknown_sampled = true;
                }
            }
            for i in left {
                let Some(address) = local.snapshot.host_at(i).map(|h| Rc::clone(h.address)) else {
                    continue;
                };
                if let Some(acc) = local.host_batch(&address) {
                    acc.unlisted = true;
                    local.unknown_sampled = true;
                }
            }
            if hosts.unhealthy != local.unhealthy {
                local.unhealthy = hosts.unhealthy;
                let state = local.snapshot.clone();
                adopt(local, &state, &self.config, now_ns);
            }
        }
    }

    /// A warning, once per run of them, when more than [`HEALTH_STALE_POLLS`] polls of Envoy's
    /// admin in a row brought no page (refused, timed out, cut off, not 200 or empty): such a
    /// poll leaves no other trace in the plugin, and the table then picks the hosts Envoy's checks
    /// mark unhealthy. More than: the poll asked last may still be on its way.
    fn unanswered_health(&mut self) -> Option<Warning> {
        if self.health_warned || self.health_unanswered <= HEALTH_STALE_POLLS {
            return None;
        }
        self.health_warned = true;
        Some(Warning::HealthUnanswered {
            admin_cluster: self.config.admin_cluster()?.to_owned(),
            polls: self.health_unanswered,
        })
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
        for local in self.clusters.values_mut() {
            if !local.unhealthy.is_empty() {
                local.unhealthy.clear();
                let state = local.snapshot.clone();
                adopt(local, &state, &self.config, now_ns);
            }
        }
    }
}

/// Whether the stored record at `key` shows requests: an endpoint count or a host with samples,
/// which only finished requests give (a cluster's static hosts alone are no traffic).
fn record_shows_traffic(store: &dyn SharedStore, key: &str, max_hosts: usize) -> bool {
    sync::read_record(store, key, max_hosts)
        .is_some_and(|state| state.num_endpoints > 0 || state.hosts.iter().any(|h| h.samples > 0))
}

/// Rebuilds this VM's pick table from a new version of the table, with the weights' floor (the
/// pick draws above it, see `pick`) and each host's probe interval (`probe`), measured against
/// the latency the table's traffic gets on average.
fn adopt(local: &mut LocalCluster, state: &Table, config: &Config, now_ns: u64) {
    let policy = config.policy();
    // A host Envoy marked unhealthy gets nothing from this VM, neither picks nor probes.
    let unhealthy = &local.unhealthy;
    let share_of = |h: &TableHost| match unhealthy.contains(&**h.address) {
        true => 0.0,
        false => h.share,
    };
    // Two walks over the table's hosts: what they say together (how many are live, the
    // traffic's latency, whether they share one zone), then each host's entry in the pick table
    // and its probe interval, which need the first.
    let (mut live, mut weighted, mut mass) = (0, 0.0, 0.0);
    let first_zone = state.host_at(0).map(|h| h.zone);
    let mut one_zone = true;
    for h in state.hosts() {
        one_zone &= first_zone.is_none_or(|zone| same_name(zone, h.zone));
        if share_of(&h) > 0.0 {
            live += 1;
            if let Some(v) = h.latency_ms {
                weighted += v * h.share;
                mass += h.share;
            }
        }
    }
    let floor = crate::balance::weights::floor(&policy.weights, live);
    let reference_ms = (mass > 0.0).then(|| weighted / mass);
    // How long a host may keep this worker waiting (`pick`): a host on trust not at all; one the
    // table knows, before it is late, what it usually takes (its own latency, or the traffic's
    // when that is higher), and before it is overdue that times the probes' factor. The factor
    // at 0 turns both off.
    let factor = config.probe_timeout_factor();
    let waits = |h: &TableHost| match h.latency_ms {
        None => Waits {
            patience_ns: 0,
            ..Waits::NONE
        },
        Some(ms) if factor > 0.0 => {
            // A float's cast saturates: a huge latency gives u64::MAX, never a wrap.
            let usual_ns = ms.max(reference_ms.unwrap_or(0.0)) * 1e6;
            Waits {
                usual_ns: usual_ns as u64,
                patience_ns: (factor * usual_ns) as u64,
            }
        }
        _ => Waits::NONE,
    };
    // Only hosts out of favour are probed: at the floor, which the pick never draws, or within a
    // floor of it. The pick draws a host by its share above the floor, so one with less than a
    // floor above it gets fewer picks than the probes' budget (a floor's share) would give it:
    // left to the pick, a host whose share settled just above the floor could stay unmeasured,
    // and so out of favour, long after it had recovered (bench/README.md, "The tail and the
    // calm"). A host further above gets its share from the pick, however rarely that comes in a
    // large cluster: probing it for being quiet would turn a sparse table into round robin.
    let out_of_favour = |share: f64| share <= 2.0 * floor * (1.0 + FLOOR_TOLERANCE);
    // Index for index with the pick table's hosts: the ones it holds.
    let mut intervals = Vec::with_capacity(live);
    let mut table = PickTable::over(
        state.addresses(),
        state.hosts().map(|h| {
            let share = share_of(&h);
            if PickTable::holds(share) {
                intervals.push(match out_of_favour(share) {
                    true => {
                        probe::interval_ns(policy.probe_interval_ns, h.latency_ms, reference_ms)
                    }
                    false => u64::MAX,
                });
            }
            (share, waits(&h))
        }),
        floor,
    );
    // At equal counts, shares one refresh's chance could have parted are equal (`pick`).
    if let Some(step) = policy.weights.noise_step() {
        table.set_noise_step(step);
    }
    local.probes = local.probes.rebuild(
        local.table.host_list(),
        table.host_list(),
        intervals,
        now_ns,
    );
    local.probes.set_floor(floor);
    local.probes.set_timeout_ms(probe::timeout_ms(
        config.probe_timeout_factor(),
        reference_ms,
    ));
    // The fallback picks among exactly the table's hosts when Envoy counts as many endpoints as
    // the table holds live hosts (none unknown, ejected or unhealthy), and favours none of them
    // when they share one zone (a zone-aware fallback would favour some).
    local.hosts_equal = config.pick() == PickAlgorithm::WeightedP2cUnlessEqual
        && one_zone
        && state.num_endpoints as usize == table.len()
        && state.hosts_indistinguishable;
    local.table = table;
}

/// Polls without an answer after which Envoy's health is forgotten.
const HEALTH_STALE_POLLS: u64 = 5;

/// Shares this close above the floor (relatively) are at it: rounding of the table's fit.
const FLOOR_TOLERANCE: f64 = 1e-6;

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

/// Whether the batch holds what the table should follow at once rather than at the next
/// refresh: a host the table does not know (`LocalCluster::unknown_sampled`, noted as it was
/// sampled, rather than searching the table here for every host of the batch on every tick),
/// another endpoint count, a host whose every request failed or that Envoy no longer has. Costs
/// what the batch holds.
fn urgent(local: &LocalCluster) -> bool {
    let batch = &local.batch;
    local.unknown_sampled
        || batch
            .num_endpoints
            .is_some_and(|n| n != local.snapshot.num_endpoints)
        || batch
            .hosts
            .values()
            .any(|acc| acc.not_honoured > 0 || (acc.failures > 0 && !acc.had_success))
}

/// Forgets the batch entries, spare or not, of hosts no longer in `table`. Called when the table
/// lost a host, not on every tick nor when hosts only joined: searching every entry of a
/// 500-host cluster cost more than the rest of the tick. (The batch is a hash map, so each entry
/// is looked up in the table, whose hosts are sorted.)
fn forget_departed(local: &mut LocalCluster, table: &Table) {
    local
        .batch
        .hosts
        .retain(|host, _| table.host(host).is_some());
    local.spare.retain(|host, _| table.host(host).is_some());
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
    /// What the metrics should say now, but for the per-host gauges of `gauges_due`.
    pub metrics: Vec<Update>,
    /// Clusters whose table this VM published this tick: [`Worker::host_gauges`] gives their
    /// per-host gauges, until the next tick.
    pub gauges_due: Vec<String>,
    /// Misconfigurations to log (`diagnose`), each rate-limited already.
    pub warnings: Vec<Warning>,
}
