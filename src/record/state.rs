//! Shared state: the record of one cluster that every worker VM merges its samples into, and
//! what merging and refreshing do to it.
//!
//! Merging happens on ticks, never per request. Whoever merges when a refresh is due also
//! recomputes the weight table; the compare-and-swap around the write (`sync`) makes that one VM
//! per refresh. `table_version` moves only when the shares do, or a host's first latency arrives
//! (VMs read from the table which hosts are on trust), so a cluster with nothing new costs no VM a
//! table rebuild. Times in the record are the record's own clock (`clock`), which
//! no wall-clock step moves.
//!
//! The record knows the cluster as Envoy shows it through traffic: hosts from `upstream.address`
//! (or static configuration), how many endpoints the cluster has from `upstream.num_endpoints`,
//! each host's zone from `upstream.locality`. A host leaves when Envoy stops honouring picks of
//! it (it left the cluster), when the cluster has fewer endpoints than the record has hosts (the
//! least recently seen go), or after `host_ttl` of silence.

use serde::{Deserialize, Serialize};

use crate::balance::locality::{self, LocalityParams, ZoneInput};
use crate::balance::outlier::{ejection_budget, Health, OutlierParams};
use crate::balance::score::{ErrorRate, Load, ScoreParams, Terms};
use crate::balance::smoothing::{Batch, Estimate, Smoother};
use crate::balance::weights::{self, HostInput, WeightParams};
use crate::map::Map;
use crate::record::persistence;
use crate::units::NS_PER_SEC;

/// What one worker observed of one host since its last successful merge. Stored in the worker's
/// slot of shared data until a refresh folds it in (`sync`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Accumulator {
    pub latency: Batch,
    pub failures: u32,
    /// Failures after the last success in this batch.
    pub trailing_failures: u32,
    pub had_success: bool,
    /// Picks of this host that Envoy served elsewhere on the first attempt: the override was not
    /// honoured, so the host is no longer (or not healthy) in the cluster.
    pub not_honoured: u32,
    /// `upstream.locality.zone`, once reported.
    pub zone: Option<String>,
    /// Sum and count of the utilisations the host reported (`score`).
    pub load_sum: f64,
    pub load_reports: u32,
    /// Requests the client left before the host answered; their waits are in `latency`. Neither
    /// a success nor a failure, and never held back from the score (`persistence`).
    pub abandoned: u32,
    /// Envoy's admin page listed the host in the cluster, healthy (`worker::health`): a host the
    /// record should know even without samples.
    pub listed: bool,
    /// Envoy's admin page no longer lists the host: it left the cluster.
    pub unlisted: bool,
}

impl Accumulator {
    /// Adds one finished request. A failure counts at least `penalty_ms`, so a host that fails
    /// fast never looks fast.
    pub fn record(&mut self, latency_ms: f64, failed: bool, penalty_ms: f64) {
        if failed {
            self.latency.add(latency_ms.max(penalty_ms));
            self.failures = self.failures.saturating_add(1);
            self.trailing_failures = self.trailing_failures.saturating_add(1);
        } else {
            self.latency.add(latency_ms);
            self.trailing_failures = 0;
            self.had_success = true;
        }
    }

    /// Adds the wait of a request the client left before the host answered: the host took at
    /// least that long. It says nothing of whether the host answers, so the failures in a row
    /// run on past it.
    pub fn record_abandoned(&mut self, waited_ms: f64) {
        self.latency.add(waited_ms);
        self.abandoned = self.abandoned.saturating_add(1);
    }

    /// Adds one utilisation the host reported in a response (`score::parse_load_report`).
    pub fn report_load(&mut self, utilization: f64) {
        self.load_sum += utilization;
        self.load_reports = self.load_reports.saturating_add(1);
    }

    /// Adds a later batch of the same host: counts add up, the trailing failures are the later
    /// batch's (and run on from this one's when it had no success).
    pub(crate) fn absorb(&mut self, later: &Accumulator) {
        self.latency.count = self.latency.count.saturating_add(later.latency.count);
        self.latency.sum_ms += later.latency.sum_ms;
        self.failures = self.failures.saturating_add(later.failures);
        self.trailing_failures = if later.had_success {
            later.trailing_failures
        } else {
            self.trailing_failures
                .saturating_add(later.trailing_failures)
        };
        self.had_success |= later.had_success;
        self.not_honoured = self.not_honoured.saturating_add(later.not_honoured);
        self.load_sum += later.load_sum;
        self.load_reports = self.load_reports.saturating_add(later.load_reports);
        self.abandoned = self.abandoned.saturating_add(later.abandoned);
        // The later page decides whether the host is in the cluster.
        self.listed = later.listed || (self.listed && !later.unlisted);
        self.unlisted = later.unlisted || (self.unlisted && !later.listed);
        if later.zone.is_some() {
            self.zone.clone_from(&later.zone);
        }
    }

    /// Whether there is anything to merge.
    pub fn is_empty(&self) -> bool {
        self.latency.count == 0 && self.not_honoured == 0 && !self.listed && !self.unlisted
    }

    /// Empties the batch, keeping what never changes (the zone), so the next batch of this host
    /// needs no allocation.
    pub fn clear(&mut self) {
        *self = Accumulator {
            zone: self.zone.take(),
            ..Accumulator::default()
        };
    }
}

/// What one worker observed of one cluster since its last successful merge.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterBatch {
    /// The worker VM's random identity, so the record can count the VMs that serve the cluster.
    pub worker: u64,
    pub hosts: Map<String, Accumulator>,
    /// The latest `upstream.num_endpoints` seen.
    pub num_endpoints: Option<u32>,
}

impl ClusterBatch {
    pub fn is_empty(&self) -> bool {
        self.num_endpoints.is_none() && self.hosts.values().all(Accumulator::is_empty)
    }
}

/// The shared record of one upstream host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostState {
    /// `IP:port`, as Envoy reports it in `upstream.address` and accepts in the override header.
    pub address: String,
    /// Listed in the configuration: never dropped for silence.
    pub is_static: bool,
    /// A static host Envoy did not honour picks of: out of the table until it serves again.
    pub absent: bool,
    /// `upstream.locality.zone`; empty until reported.
    pub zone: String,
    pub last_seen_ns: u64,
    /// When the host joined or came back from ejection: the start of its slow-start ramp; 0 for
    /// a host that needs none (`active_for_ns`).
    pub active_since_ns: u64,
    pub latency: Estimate,
    /// Samples merged for the host, taken into the estimate or held out of it (`persistence`).
    pub samples: u64,
    /// How far a batch's mean usually lies from the estimate: the smoothed |ln(mean / estimate)|
    /// of the batches taken in (`persistence`).
    pub spread: f64,
    pub spread_updated_ns: u64,
    /// The same distance for the batches the estimate took in: how noisy what it averages is.
    pub noise: f64,
    /// Batches the spread has seen, while it is warming up (`persistence`).
    pub spread_batches: u32,
    /// How many batches stand behind the estimate, each weighted by how much of it the estimate
    /// still holds (`persistence::observed`).
    pub evidence: f64,
    /// Since when (record time) every batch has risen beyond the spread without the estimate
    /// taking it in; 0 when the last batch did not.
    pub rising_since_ns: u64,
    /// Smoothed share of failed requests: the score's error term (`score`).
    pub errors: ErrorRate,
    /// Smoothed utilisation the host reports: the score's load term (`score`).
    pub load: Load,
    pub health: Health,
    /// Share of steered traffic in the table in force; 0 for ejected and not yet weighted hosts.
    pub share: f64,
    /// Whether `share` was granted before any latency of the host was known (scored at the
    /// cluster's median): a share on trust, which is no standing to fall from slowly (`weights`).
    pub share_on_trust: bool,
}

impl HostState {
    /// The score's three terms at `now_ns` (`score`).
    pub fn terms(&self, now_ns: u64) -> Terms {
        Terms {
            latency_ms: self.latency.value_ms(),
            error_rate: self.errors.value(),
            utilization: self.load.value(now_ns),
        }
    }

    /// How long the host has been on its slow-start ramp; `u64::MAX` for a host that never
    /// needed one (`active_since_ns` 0: met while the plugin learned the cluster).
    pub fn active_for_ns(&self, now_ns: u64) -> u64 {
        if self.active_since_ns == 0 {
            u64::MAX
        } else {
            now_ns.saturating_sub(self.active_since_ns)
        }
    }
}

/// The shared record of one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// The VM that wrote this record and its count of folds then (`sync`): first, so a VM finds
    /// whether shared data still holds the record it wrote by reading these bytes, not all.
    pub written_by: (u64, u64),
    /// Bumped on every change of the shares; workers rebuild their pick table when it moves.
    pub table_version: u64,
    pub refreshed_ns: u64,
    /// The record's clock: the latest time any VM merging into it has seen (see `clock`).
    pub clock_ns: u64,
    /// The cluster's endpoint count, as Envoy last reported it; 0 when unknown.
    pub num_endpoints: u32,
    /// Whether the record has known every endpoint at some point. Until then, a host found is an
    /// old member of the cluster the plugin had not met yet, and gets no slow start; after, a new
    /// host is new to the cluster too (a scale-out, a replaced pod) and ramps in.
    pub complete: bool,
    /// Sorted by address.
    pub hosts: Vec<HostState>,
    /// The last refresh could not tell the hosts apart ([`weights::indistinguishable`]).
    pub hosts_indistinguishable: bool,
    /// The worker VMs that merged samples within the last [`WORKER_TTL_NS`], with when they last
    /// did, sorted by identity: they share the cluster's probes (`probe`).
    pub workers: Vec<(u64, u64)>,
    /// For each slot of shared data the last batch folded in (`sync`), so a refresh that
    /// published this record and died before saying so is not folded twice.
    pub acked: Vec<Ack>,
}

/// The last batch of one worker slot a record holds: batches of that slot's `epoch` up to `seq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub slot: u16,
    pub epoch: u64,
    pub seq: u64,
}

/// A worker VM that merged nothing for this long no longer counts as serving the cluster.
pub const WORKER_TTL_NS: u64 = 2 * NS_PER_SEC;
/// Most worker VMs a record counts: more than any Envoy runs.
pub(crate) const MAX_WORKERS: usize = 256;

/// Everything merge and refresh need to know of the configuration; `Config::policy`. Serialized
/// only to fingerprint it (`Config::record_namespace`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Policy {
    pub smoother: Smoother,
    pub weights: WeightParams,
    pub outlier: OutlierParams,
    pub locality: LocalityParams,
    pub refresh_interval_ns: u64,
    pub host_ttl_ns: u64,
    pub max_hosts: usize,
    /// How long a rise beyond a host's usual spread must last before its estimate follows it.
    pub persistence_ns: u64,
    /// How often each worker probes a host the table sends nothing (`probe`).
    pub probe_interval_ns: u64,
    /// How latency, error rate and reported load make a host's score.
    pub score: ScoreParams,
}

/// What a refresh did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Hosts it ejected (a failure count reached during a refresh-only tick).
    pub ejected: usize,
    /// Whether the list of hosts changed: static hosts added, silent or surplus ones dropped.
    pub relisted: bool,
}

/// What a merge did to the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    pub ejected: usize,
    /// Hosts dropped because Envoy no longer honoured picks of them.
    pub removed: usize,
    /// Hosts met for the first time.
    pub joined: usize,
    /// Whether Envoy reported another endpoint count than the record held.
    pub resized: bool,
    /// Whether a host's zone changed.
    pub rezoned: bool,
}

impl Merged {
    /// Adds what a later merge of the same fold did.
    pub fn absorb(&mut self, other: Merged) {
        self.ejected += other.ejected;
        self.removed += other.removed;
        self.joined += other.joined;
        self.resized |= other.resized;
        self.rezoned |= other.rezoned;
    }

    /// Whether the record's list of hosts (addresses and zones) may have changed: a host met,
    /// dropped or marked absent, or another zone. Never false when it did.
    pub(crate) fn relisted(&self) -> bool {
        self.joined > 0 || self.removed > 0 || self.rezoned
    }

    /// Whether the cluster's membership changed: the table should follow now, not at the next
    /// refresh, or a newcomer waits a refresh interval for its first share and the endpoints
    /// the record does not know wait as long for theirs (the anti-flap timer is for latencies,
    /// not for who is in the cluster).
    pub(crate) fn membership_changed(&self) -> bool {
        self.joined > 0 || self.resized
    }
}

impl ClusterState {
    pub fn host(&self, address: &str) -> Option<&HostState> {
        self.index(address).ok().and_then(|i| self.hosts.get(i))
    }

    fn index(&self, address: &str) -> Result<usize, usize> {
        self.hosts
            .binary_search_by(|h| h.address.as_str().cmp(address))
    }

    pub(crate) fn refresh_due(&self, now_ns: u64, policy: &Policy) -> bool {
        self.table_version == 0
            || now_ns.saturating_sub(self.refreshed_ns) >= policy.refresh_interval_ns
    }

    /// Endpoints Envoy reports beyond what the table holds when the cluster is larger than
    /// `max_hosts` (the stable subset's outside, once it is learned); 0 otherwise.
    pub fn outside_subset(&self, max_hosts: usize) -> u32 {
        if usize::try_from(self.num_endpoints).unwrap_or(usize::MAX) > max_hosts {
            self.unknown_endpoints()
        } else {
            0
        }
    }

    /// How many endpoints of the cluster the record does not know: Envoy's count minus the hosts
    /// known to be in it.
    pub fn unknown_endpoints(&self) -> u32 {
        let known = self.hosts.iter().filter(|h| !h.absent).count();
        self.num_endpoints
            .saturating_sub(u32::try_from(known).unwrap_or(u32::MAX))
    }

    /// How many worker VMs serve the cluster now (at least 1).
    pub(crate) fn active_workers(&self) -> usize {
        self.workers.len().max(1)
    }

    /// Notes that `worker` merged samples at `now_ns`, and forgets the ones silent too long.
    fn worker_seen(&mut self, worker: u64, now_ns: u64) {
        self.workers
            .retain(|(_, seen)| now_ns.saturating_sub(*seen) < WORKER_TTL_NS);
        match self.workers.binary_search_by_key(&worker, |(id, _)| *id) {
            Ok(i) => {
                if let Some(w) = self.workers.get_mut(i) {
                    w.1 = now_ns;
                }
            }
            Err(i) if self.workers.len() < MAX_WORKERS => self.workers.insert(i, (worker, now_ns)),
            Err(_) => {}
        }
    }

    /// Folds one worker's batch in. An ejection or a host that left changes the table at once
    /// rather than at the next refresh.
    pub fn merge(&mut self, batch: &ClusterBatch, now_ns: u64, policy: &Policy) -> Merged {
        if batch.hosts.values().any(|a| a.latency.count > 0) {
            self.worker_seen(batch.worker, now_ns);
        }
        let merged = self.merge_hosts(
            batch.hosts.iter().map(|(a, acc)| (a.as_str(), acc)),
            batch.num_endpoints,
            now_ns,
            policy,
        );
        self.settle(merged, now_ns, policy)
    }

    /// The per-host part of [`ClusterState::merge`]: costs what the batch holds, not what the
    /// cluster does, so a refresh folding many batches pays the cluster once ([`settle`]). Hosts
    /// new to the record add one pass over it, however many they are (`insert_all`).
    ///
    /// [`settle`]: ClusterState::settle
    pub fn merge_hosts<'a>(
        &mut self,
        hosts: impl Iterator<Item = (&'a str, &'a Accumulator)>,
        num_endpoints: Option<u32>,
        now_ns: u64,
        policy: &Policy,
    ) -> Merged {
        let resized = num_endpoints.is_some_and(|n| n != self.num_endpoints);
        if let Some(n) = num_endpoints {
            self.num_endpoints = n;
        }
        let (mut removed, mut joined, mut rezoned) = (0, 0, false);
        // Hosts the record lacks wait until the others are merged, and go in together.
        let mut new = Vec::new();
        for (address, acc) in hosts.filter(|(_, acc)| !acc.is_empty()) {
            if acc.latency.count == 0 && (acc.not_honoured > 0 || acc.unlisted) {
                // Only unhonoured picks, or Envoy's page without it: Envoy no longer has this
                // host.
                removed += usize::from(self.remove_absent(address));
                continue;
            }
            match self.index(address) {
                // Only listed, and known: nothing to take in.
                Ok(_) if acc.latency.count == 0 => {}
                Ok(i) => {
                    if let Some(host) = self.hosts.get_mut(i) {
                        rezoned |= take_batch(host, acc, now_ns, policy);
                    }
                }
                Err(_) => new.push((address, acc)),
            }
        }
        let together = self.insert_all(
            &new.iter().map(|(address, _)| *address).collect::<Vec<_>>(),
            now_ns,
            false,
            policy.max_hosts,
        );
        for (address, acc) in new {
            let host = match together {
                true => self.index(address).ok().and_then(|i| self.hosts.get_mut(i)),
                false => self.host_mut_or_insert(address, now_ns, false, policy.max_hosts),
            };
            if acc.latency.count == 0 {
                // Only listed: a host of the cluster no request met yet. It enters as a host met
                // by a request would, with no samples (scored at the median, and ramped in once
                // the record knew the cluster: `new_host`).
                joined += usize::from(host.is_some());
                continue;
            }
            joined += 1;
            if let Some(host) = host {
                rezoned |= take_batch(host, acc, now_ns, policy);
            }
        }
        Merged {
            ejected: 0,
            removed,
            joined,
            resized,
            rezoned,
        }
    }

    /// What merges cost the whole cluster, once after any number of [`merge_hosts`]: the shares
    /// of hosts that left, the version a new endpoint count needs, ejections.
    ///
    /// [`merge_hosts`]: ClusterState::merge_hosts
    pub fn settle(&mut self, merged: Merged, now_ns: u64, policy: &Policy) -> Merged {
        if merged.removed > 0 {
            self.renormalise();
        } else if merged.resized || merged.joined > 0 {
            // The share left to the endpoints the record does not know changed, or a host
            // joined: every VM must adopt the table that says so, even if no share moves.
            self.bump_version();
        }
        self.complete |= self.num_endpoints > 0 && self.unknown_endpoints() == 0;
        Merged {
            ejected: merged.ejected + self.eject_failing(now_ns, &policy.outlier),
            ..merged
        }
    }

    /// Recomputes the shares: adds the static hosts (and clears the flag of hosts no longer
    /// listed), forgets learned hosts that are silent or surplus, ends elapsed ejections, and
    /// bumps `table_version` when the shares changed. `local_zone` is the proxy's zone.
    pub fn refresh(
        &mut self,
        now_ns: u64,
        policy: &Policy,
        static_hosts: &[String],
        local_zone: Option<&str>,
    ) -> Refreshed {
        // The listed hosts and the record's are both sorted by address: one walk sets every
        // host's flag and finds the listed ones the record lacks (a search per listed host was
        // the refresh's largest cost at 500 static endpoints).
        let mut missing = Vec::new();
        if static_hosts.is_sorted() {
            let mut listed = static_hosts.iter().map(String::as_str).peekable();
            for host in &mut self.hosts {
                let address = host.address.as_str();
                while let Some(a) = listed.next_if(|a| *a < address) {
                    missing.push(a);
                }
                host.is_static = listed.next_if(|a| *a == address).is_some();
            }
            missing.extend(listed);
        } else {
            for host in &mut self.hosts {
                host.is_static = false;
            }
            for address in static_hosts {
                match self.index(address) {
                    Ok(i) => {
                        if let Some(host) = self.hosts.get_mut(i) {
                            host.is_static = true;
                        }
                    }
                    Err(_) => missing.push(address),
                }
            }
        }
        let mut moved = !missing.is_empty();
        if !self.insert_all(&missing, now_ns, true, policy.max_hosts) {
            for address in missing {
                if let Some(host) = self.host_mut_or_insert(address, now_ns, true, policy.max_hosts)
                {
                    host.is_static = true;
                }
            }
        }
        let num_endpoints = self.num_endpoints;
        let before = self.hosts.len();
        self.hosts.retain(|h| {
            h.is_static
                || (now_ns.saturating_sub(h.last_seen_ns) < policy.host_ttl_ns
                    && in_subset(&h.address, num_endpoints, policy.max_hosts))
        });
        self.drop_surplus(now_ns, policy.refresh_interval_ns);
        moved |= self.hosts.len() != before;
        for host in &mut self.hosts {
            if host.health.tick(&policy.outlier, now_ns) {
                // Back from ejection: its old latency is the failures' penalty. Start afresh at
                // the cluster median and ramp up, as a new host would.
                host.active_since_ns = now_ns.max(1);
                host.share = 0.0;
                host.latency = Estimate::default();
                host.errors = ErrorRate::default();
            }
        }
        let ejected = self.eject_failing(now_ns, &policy.outlier);
        // The table lists the hosts: a new list is a new version, whatever the shares do.
        self.reweigh(now_ns, policy, local_zone, moved);
        self.refreshed_ns = now_ns;
        Refreshed {
            ejected,
            relisted: moved,
        }
    }

    /// What the weights are computed from, host by host.
    fn weight_inputs(&self, now_ns: u64, policy: &Policy) -> Vec<HostInput> {
        let out = |h: &HostState| h.absent || h.health.is_ejected(now_ns);
        self.hosts
            .iter()
            .map(|h| HostInput {
                score_ms: h.terms(now_ns).score_ms(&policy.score),
                uncertainty: persistence::uncertainty(h),
                active_for_ns: h.active_for_ns(now_ns),
                ejected: out(h),
                previous_share: (h.share > 0.0).then_some(h.share),
                // Until the table holds its latency its first answers move it at once.
                share_on_trust: h.share_on_trust,
                // The shares in force were set at the last refresh.
                share_age_ns: now_ns.saturating_sub(self.refreshed_ns),
            })
            .collect()
    }

    /// Recomputes the shares; bumps the version when one moved, or when `moved` (the hosts did).
    fn reweigh(&mut self, now_ns: u64, policy: &Policy, local_zone: Option<&str>, moved: bool) {
        let out = |h: &HostState| h.absent || h.health.is_ejected(now_ns);
        let mut inputs = self.weight_inputs(now_ns, policy);
        let zones: Vec<ZoneInput> = self
            .hosts
            .iter()
            .map(|h| ZoneInput {
                zone: &h.zone,
                score_ms: h.latency.value_ms(),
                ejected: out(h),
            })
            .collect();
        let split = locality::split(&zones, local_zone, &policy.locality);
        let shares = weights::shares_within(&inputs, &policy.weights, split.as_ref());
        let mut changed = moved || self.table_version == 0;
        for ((host, share), input) in self.hosts.iter_mut().zip(shares).zip(&mut inputs) {
            // A host whose first latency just arrived is a change too: VMs read from the table
            // which hosts are on trust (`balance::pick`), even when its share stands.
            let on_trust = input.score_ms.is_none();
            changed |=
                (host.share - share).abs() > SHARE_EPSILON || host.share_on_trust != on_trust;
            host.share = share;
            host.share_on_trust = on_trust;
            input.previous_share = (share > 0.0).then_some(share);
        }
        // Judged against the shares just set, as a VM picks from them.
        self.hosts_indistinguishable = weights::indistinguishable(&inputs);
        if changed {
            self.bump_version();
        }
    }

    /// Ejects hosts at their failure threshold while the cluster's ejection budget lasts;
    /// returns how many.
    fn eject_failing(&mut self, now_ns: u64, params: &OutlierParams) -> usize {
        let budget = ejection_budget(params, self.hosts.len());
        let mut ejected = self
            .hosts
            .iter()
            .filter(|h| h.health.is_ejected(now_ns))
            .count();
        let mut newly = 0;
        for host in &mut self.hosts {
            if ejected >= budget {
                break;
            }
            if host.health.should_eject(params, now_ns) {
                host.health.eject(params, now_ns);
                host.share = 0.0;
                ejected += 1;
                newly += 1;
            }
        }
        if newly > 0 {
            self.renormalise();
        }
        newly
    }

    /// Spreads the shares of hosts that just left the table over the rest, proportionally, and
    /// publishes the result.
    fn renormalise(&mut self) {
        let total: f64 = self.hosts.iter().map(|h| h.share).sum();
        for host in &mut self.hosts {
            host.share = if total > 0.0 { host.share / total } else { 0.0 };
        }
        self.bump_version();
    }

    fn bump_version(&mut self) {
        self.table_version = self.table_version.wrapping_add(1).max(1);
    }

    /// A host Envoy no longer honours picks of: a learned one is dropped, a static one is kept
    /// out of the table until it serves again. Returns whether the table changed.
    fn remove_absent(&mut self, address: &str) -> bool {
        let Ok(i) = self.index(address) else {
            return false;
        };
        match self.hosts.get_mut(i) {
            Some(h) if h.is_static => {
                let changed = !h.absent;
                h.absent = true;
                h.share = 0.0;
                changed
            }
            Some(_) => {
                self.hosts.remove(i);
                true
            }
            None => false,
        }
    }

    /// When Envoy reports fewer endpoints than the record has hosts, some left: drop the learned
    /// ones seen least recently, if they have been silent for `grace_ns` (a host still in the
    /// cluster keeps being seen).
    fn drop_surplus(&mut self, now_ns: u64, grace_ns: u64) {
        let present = self.hosts.iter().filter(|h| !h.absent).count();
        let surplus =
            present.saturating_sub(usize::try_from(self.num_endpoints).unwrap_or(usize::MAX));
        if self.num_endpoints == 0 || surplus == 0 {
            return;
        }
        let mut silent: Vec<(u64, String)> = self
            .hosts
            .iter()
            .filter(|h| !h.is_static && now_ns.saturating_sub(h.last_seen_ns) >= grace_ns)
            .map(|h| (h.last_seen_ns, h.address.clone()))
            .collect();
        silent.sort_unstable();
        silent.truncate(surplus);
        self.hosts
            .retain(|h| !silent.iter().any(|(_, a)| *a == h.address));
    }

    /// The host's entry, created when missing. In a cluster larger than `max_hosts`, only a host of
    /// the stable subset ([`in_subset`]) is created, and only while there is room. Otherwise a
    /// full record makes room by forgetting the learned host seen least recently: the newest
    /// endpoints are never the ones left out.
    fn host_mut_or_insert(
        &mut self,
        address: &str,
        now_ns: u64,
        is_static: bool,
        max_hosts: usize,
    ) -> Option<&mut HostState> {
        let i = match self.index(address) {
            Ok(i) => i,
            Err(_) => {
                let subsetting =
                    usize::try_from(self.num_endpoints).unwrap_or(usize::MAX) > max_hosts;
                if !self.may_enter(address, is_static, max_hosts)
                    || (subsetting && self.hosts.len() >= max_hosts)
                {
                    return None;
                }
                if self.hosts.len() >= max_hosts {
                    let oldest = self
                        .hosts
                        .iter()
                        .enumerate()
                        .filter(|(_, h)| !h.is_static)
                        .min_by_key(|(_, h)| h.last_seen_ns);
                    let (victim, _) = oldest?;
                    self.hosts.remove(victim);
                }
                let i = self.index(address).err()?;
                let host = self.new_host(address.to_owned(), now_ns, is_static);
                self.hosts.insert(i, host);
                i
            }
        };
        self.hosts.get_mut(i)
    }

    /// Inserts the hosts of `addresses` the record lacks, each as [`host_mut_or_insert`] would,
    /// with one merge: inserted one at a time into the sorted hosts, each shifts the hosts after
    /// it, and a fold that meets a whole cluster (its first, or one with the cluster's listing)
    /// took time quadratic in its size (bench/README.md, "Shared state at 10,000 endpoints").
    /// In a cluster larger than `max_hosts`, only the hosts of the stable subset (and static
    /// ones) go in, as one at a time. `false`, with nothing inserted, when the record has no room
    /// for them all: which go in then depends on the order, and they go one at a time.
    ///
    /// [`host_mut_or_insert`]: ClusterState::host_mut_or_insert
    fn insert_all(
        &mut self,
        addresses: &[&str],
        now_ns: u64,
        is_static: bool,
        max_hosts: usize,
    ) -> bool {
        if addresses.is_empty() {
            return true;
        }
        // Owned names: the sort the module has already (a sort of `&str`s would be a second).
        let mut addresses: Vec<String> = addresses
            .iter()
            .filter(|a| self.may_enter(a, is_static, max_hosts))
            .map(|a| (*a).to_owned())
            .collect();
        addresses.sort_unstable();
        addresses.dedup();
        addresses.retain(|address| self.index(address).is_err());
        if addresses.is_empty() {
            return true;
        }
        if self.hosts.len().saturating_add(addresses.len()) > max_hosts {
            return false;
        }
        let new: Vec<HostState> = addresses
            .into_iter()
            .map(|address| self.new_host(address, now_ns, is_static))
            .collect();
        let mut new = new.into_iter().peekable();
        let mut hosts = Vec::with_capacity(self.hosts.len() + new.len());
        for host in std::mem::take(&mut self.hosts) {
            while let Some(joining) = new.next_if(|n| n.address < host.address) {
                hosts.push(joining);
            }
            hosts.push(host);
        }
        hosts.extend(new);
        self.hosts = hosts;
        true
    }

    /// Whether `address` may have an entry, room aside: a static host, or one the record keeps
    /// ([`in_subset`]: any host while the cluster fits the record).
    fn may_enter(&self, address: &str, is_static: bool, max_hosts: usize) -> bool {
        is_static || in_subset(address, self.num_endpoints, max_hosts)
    }

    /// A host as it enters the record.
    fn new_host(&self, address: String, now_ns: u64, is_static: bool) -> HostState {
        let joined = is_static || self.complete || self.num_endpoints == 0;
        HostState {
            address,
            is_static,
            last_seen_ns: now_ns,
            // 0: fully ramped from the start (see `complete`); a ramp that starts at the
            // record's time 0 starts at 1.
            active_since_ns: if joined { now_ns.max(1) } else { 0 },
            health: Health {
                healthy_since_ns: now_ns,
                ..Health::default()
            },
            ..HostState::default()
        }
    }
}

/// Takes a batch of the host's samples into its record; returns whether its zone changed.
fn take_batch(host: &mut HostState, acc: &Accumulator, now_ns: u64, policy: &Policy) -> bool {
    host.absent = false;
    host.last_seen_ns = now_ns;
    let mut rezoned = false;
    if let Some(zone) = acc.zone.as_deref().filter(|z| *z != host.zone) {
        host.zone = zone.to_owned();
        rezoned = true;
    }
    host.samples = host.samples.saturating_add(u64::from(acc.latency.count));
    if persistence::admits(host, acc, now_ns, policy) {
        persistence::observed(host, acc, now_ns, policy);
        policy
            .smoother
            .observe(&mut host.latency, &acc.latency, now_ns);
    }
    host.errors.observe(acc.latency.count, acc.failures, now_ns);
    if acc.load_reports > 0 {
        host.load.observe(
            acc.load_sum / f64::from(acc.load_reports),
            acc.load_reports,
            now_ns,
        );
    }
    if !host.health.is_ejected(now_ns) {
        host.health
            .record(acc.failures, acc.trailing_failures, acc.had_success);
    }
    rezoned
}

/// The share of `max_hosts_per_cluster` the stable subset of a larger cluster aims at. The subset
/// is a draw (by a hash of each address), so its size varies by about its square root: at 90 %
/// of 1,024 hosts, the bound is 3.3 standard deviations away, and a full record admits no
/// newcomer rather than evicting a host (so a subset never churns).
pub(crate) const SUBSET_FILL: f64 = 0.9;

/// Whether the table keeps `address`: always in a cluster of at most `max_hosts` endpoints; in a
/// larger one only if the address is in the stable subset, which a hash of the address decides
/// the same way in every VM and at every tick, so the same hosts stay in and the others are left
/// to Envoy's fallback policy. The subset changes only when the endpoint count does, and then
/// mostly by the hosts at its edge.
pub(crate) fn in_subset(address: &str, num_endpoints: u32, max_hosts: usize) -> bool {
    let n = usize::try_from(num_endpoints).unwrap_or(usize::MAX);
    if n <= max_hosts {
        return true;
    }
    let keep = SUBSET_FILL * max_hosts as f64 / f64::from(num_endpoints);
    // FNV-1a, then a finaliser (splitmix64's): similar addresses get unrelated draws.
    let mut h = crate::hash::fnv1a(crate::hash::FNV_OFFSET, address.as_bytes());
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    ((h >> 11) as f64 / (1u64 << 53) as f64) < keep
}

/// Share differences below this are rounding, not a new table.
const SHARE_EPSILON: f64 = 1e-9;
