//! What one VM keeps per cluster: its pick table and probe schedule, its batch of samples for
//! the next tick, its requests in flight, the last table it read; and its request counters per
//! `cluster_name` label, handed to the metrics on every tick.

use std::rc::Rc;

use crate::balance::explore::Exploration;
use crate::balance::outcome::Outcome;
use crate::balance::pick::PickTable;
use crate::balance::probe::Probes;
use crate::map::{Map, Set};
use crate::record::state::{Accumulator, ClusterBatch};
use crate::record::sync::{Keys, Member};
use crate::record::table::Table;
use crate::worker::decision::FallbackReason;
use crate::worker::diagnose::HonourWatch;

/// Clusters one worker keeps state for at once; an idle one makes room (`Worker::tick`).
pub(crate) const MAX_CLUSTERS: usize = 256;

/// Hosts one worker accumulates samples for between ticks.
const MAX_PENDING_HOSTS: usize = 4096;

/// This worker's requests to one host that have not finished, and how many of them the metrics
/// were last told about (the in-flight gauge is shared by every VM, so each moves it by its own
/// changes); and how its last requests ended, which the pick and the probes read.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    pub(crate) now: u32,
    pub(crate) reported: u32,
    /// Requests whose wait ended before the host answered (its client left, or the route's
    /// timeout fired), since it last answered one. Envoy let them go; nothing says the host did,
    /// and a hung host still holds every one. The pick counts them as in flight until the host
    /// answers again: otherwise each client that gives up makes a hung host look idle and earns
    /// it the next request.
    pub(crate) unanswered: u32,
    /// Requests in a row it did not serve (`probe::Pending::unserved`).
    pub(crate) unserved: u32,
    /// Since when this worker has waited on the host (steady ns): when it was sent a request
    /// with nothing pending there, or when it last answered, whichever is later. Meaningful only
    /// while `load() > 0`: the pick holds back a host overdue by it (`pick`'s module doc).
    pub(crate) waiting_since_ns: u64,
}

/// How a request ended for the host that had it last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// It served the request.
    Served,
    /// It answered with a failure.
    Failed,
    /// Its connection or stream failed (refused, reset): no answer, and nothing left with it.
    Lost,
    /// The wait ended before it answered: the host may still hold the request.
    Unanswered,
}

impl Ending {
    pub(crate) fn of(outcome: Outcome) -> Ending {
        match outcome {
            Outcome::Success => Ending::Served,
            Outcome::ServerError | Outcome::GrpcFailure(_) => Ending::Failed,
            Outcome::Reset | Outcome::ConnectFailure => Ending::Lost,
            Outcome::Abandoned | Outcome::Timeout => Ending::Unanswered,
        }
    }
}

impl InFlight {
    /// The requests the pick counts against the host: those in flight and those it never
    /// answered.
    pub(crate) fn load(&self) -> u32 {
        self.now.saturating_add(self.unanswered)
    }

    /// How the host's request ended, at `ended_ns` (0: unknown): an answer, or a stream it
    /// failed, ends the wait so far.
    pub(crate) fn ended(&mut self, ending: Ending, ended_ns: u64) {
        if ending != Ending::Unanswered {
            self.waiting_since_ns = self.waiting_since_ns.max(ended_ns);
        }
        match ending {
            Ending::Served => {
                self.unanswered = 0;
                self.unserved = 0;
            }
            Ending::Failed => {
                self.unanswered = 0;
                self.unserved = self.unserved.saturating_add(1);
            }
            Ending::Lost => self.unserved = self.unserved.saturating_add(1),
            Ending::Unanswered => {
                self.unanswered = self.unanswered.saturating_add(1);
                self.unserved = self.unserved.saturating_add(1);
            }
        }
    }

    /// Whether its last requests went unserved or unanswered (`in_flight_updates` keeps it for
    /// that while the table lists the host).
    pub(crate) fn remembers(&self) -> bool {
        self.unanswered > 0 || self.unserved > 0
    }
}

#[derive(Debug, Default)]
pub(crate) struct LocalCluster {
    pub(crate) table: PickTable,
    /// The table cannot tell its hosts apart, and the fallback picks among exactly them
    /// (`adopt`): `pick: weighted_p2c_unless_equal` leaves the requests to it.
    pub(crate) hosts_equal: bool,
    /// When each host of the table is due a probe (`probe`).
    pub(crate) probes: Probes,
    /// The share of requests left to the fallback (`explore`).
    pub(crate) exploration: Exploration,
    /// Keyed by address so counts survive a table rebuild.
    pub(crate) in_flight: Map<Rc<str>, InFlight>,
    /// This tick's samples: only hosts sampled since the last merge, so a tick costs what this
    /// VM saw, not every host it ever met.
    pub(crate) batch: ClusterBatch,
    /// Entries of hosts sampled before, emptied at a merge (`clear_batch`) and taken back by the
    /// host's next sample: the request path allocates no key or zone for a host met before.
    pub(crate) spare: Map<String, Accumulator>,
    /// This cluster's keys in shared data, and this VM's place there (clock, slot).
    pub(crate) keys: Keys,
    pub(crate) member: Member,
    /// The table `table` was built from (its version is the pick's), as last read from shared
    /// data.
    pub(crate) snapshot: Table,
    /// A request or a sample since the last tick.
    pub(crate) used: bool,
    /// Steady time of the last tick that saw it used.
    pub(crate) last_used_ns: u64,
    /// Reported that the stored record could not be read (reported once).
    pub(crate) reported_bad_record: bool,
    /// Whether Envoy honours this VM's picks (`diagnose`).
    pub(crate) honour: HonourWatch,
    /// When a shared-data error of this cluster was last warned of, and how many were not
    /// warned of since (`ERROR_WARNING_INTERVAL_NS`).
    pub(crate) error_warned_ns: Option<u64>,
    pub(crate) errors_unwarned: u64,
    /// The spare entries were dropped since the last tick (`host_batch`).
    pub(crate) batch_pruned: bool,
    /// The batch holds a host the table in force did not list when it was first sampled since
    /// the last merge (`urgent`): a fallback's, Envoy's choice. A host picked from the table is
    /// listed there and not looked up.
    pub(crate) unknown_sampled: bool,
    /// Hosts Envoy's admin `/clusters` last marked unhealthy: out of the pick table (`health`).
    pub(crate) unhealthy: Set<String>,
    /// A request found no table and asked for a tick at once (`Worker::take_tick_wanted`): once
    /// per entry, so a cluster whose table no VM has published yet costs one early tick, not one
    /// per request.
    pub(crate) asked_for_table: bool,
}

impl LocalCluster {
    /// The batch of `host`: its entry, its spare one, or one created while there is room. A full
    /// batch drops its spare entries once a tick to make room: otherwise the first hosts a VM met
    /// would hold every place for good, and a larger cluster would never be learned beyond them.
    pub(crate) fn host_batch(&mut self, host: &str) -> Option<&mut Accumulator> {
        self.host_batch_new(host).map(|(acc, _)| acc)
    }

    /// [`LocalCluster::host_batch`], and whether the entry is new to the batch since the last
    /// merge (the host's first sample of this tick).
    pub(crate) fn host_batch_new(&mut self, host: &str) -> Option<(&mut Accumulator, bool)> {
        let new = !self.batch.hosts.contains_key(host);
        if new {
            if let Some((address, acc)) = self.spare.remove_entry(host) {
                self.batch.hosts.insert(address, acc);
            } else {
                if self.batch.hosts.len() + self.spare.len() >= MAX_PENDING_HOSTS
                    && !self.batch_pruned
                {
                    self.spare = Map::default();
                    self.batch_pruned = true;
                }
                if self.batch.hosts.len() + self.spare.len() < MAX_PENDING_HOSTS {
                    self.batch
                        .hosts
                        .insert(host.to_owned(), Accumulator::default());
                }
            }
        }
        self.batch.hosts.get_mut(host).map(|acc| (acc, new))
    }

    /// Empties the batch after a merge, its entries kept as spares (`spare`).
    pub(crate) fn clear_batch(&mut self) {
        for (address, mut acc) in self.batch.hosts.drain() {
            acc.clear();
            self.spare.insert(address, acc);
        }
        self.batch.num_endpoints = None;
        self.unknown_sampled = false;
    }

    /// The zone this VM's batch knows of `host`, if any.
    pub(crate) fn batched_zone(&self, host: &str) -> Option<&str> {
        self.batch
            .hosts
            .get(host)
            .or_else(|| self.spare.get(host))
            .and_then(|a| a.zone.as_deref())
    }

    pub(crate) fn in_flight(&self, host: &str) -> u32 {
        self.in_flight.get(host).map_or(0, |n| n.now)
    }
}

/// What happened since the last tick, for one `cluster_name`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) steered: u64,
    pub(crate) denied: u64,
    pub(crate) fallback: [u64; FallbackReason::ALL.len()],
    /// Finished requests served by a host outside the proxy's zone.
    pub(crate) cross_zone: u64,
    /// Stored records that could not be read and were rebuilt.
    pub(crate) bad_records: u64,
    /// Picks Envoy served by another host on the first attempt.
    pub(crate) not_honoured: u64,
    /// A cluster the configuration steers, or `telemetry::NO_CLUSTER` (`counts_entry`).
    pub(crate) steered_label: bool,
    /// Load reports ignored as malformed or out of range.
    pub(crate) load_report_errors: u64,
}

impl Counts {
    /// Nothing to hand over: the counters went to the metrics at the last tick.
    pub(crate) fn is_empty(&self) -> bool {
        self.steered == 0
            && self.denied == 0
            && self.fallback.iter().all(|n| *n == 0)
            && self.cross_zone == 0
            && self.bad_records == 0
            && self.not_honoured == 0
            && self.load_report_errors == 0
    }
}

/// The counters of `label`, created on first sight while there is room. Clusters the configuration
/// steers (at most [`MAX_CLUSTERS`] have a local entry) and `telemetry::NO_CLUSTER` always find
/// room: unlisted clusters, which a proxy may meet without bound, have [`MAX_CLUSTERS`] of their
/// own, and one whose counters were handed over at the last tick (all zero) gives its place to a
/// newcomer: otherwise the first labels of any kind would take every place for good.
pub(crate) fn counts_entry<'a>(
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
pub(crate) fn local_entry<'a>(
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
