//! Per request: the path rules, the pick, the request's end. Local data only: nothing here
//! touches shared data or waits on another VM.

use std::rc::Rc;

use crate::balance::outcome::Outcome;
use crate::balance::pick::HostLoad;
use crate::balance::probe::Pending;
use crate::balance::score::{parse_load_report, LoadMetric};
use crate::rules::{normalize_bytes, PathClass};
use crate::worker::cluster::{counts_entry, local_entry, Ending, InFlight, LocalCluster};
use crate::worker::decision::{Decision, FallbackReason, Pick};
use crate::worker::request::{Finished, Request};
use crate::worker::Worker;

impl Worker {
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
            self.request_sent(cluster, &pick.host, request.now_ns);
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
            tick_wanted,
            ..
        } = self;
        let Some(local) = local_entry(clusters, cluster, *id) else {
            return Decision::Fallback(FallbackReason::TableNotReady);
        };
        local.used = true;
        if local.table.is_empty() {
            *tick_wanted |= !std::mem::replace(&mut local.asked_for_table, true);
            return Decision::Fallback(FallbackReason::TableNotReady);
        }
        let explore_share = local.exploration.share();
        if explore_share > 0.0 && rng.f64() < explore_share {
            return Decision::Fallback(FallbackReason::Exploring);
        }
        let LocalCluster {
            table,
            probes,
            in_flight: counts,
            hosts_equal,
            ..
        } = &mut *local;
        let entry = |i: usize| table.host(i).and_then(|h| counts.get(&**h));
        let pending = |i: usize| {
            entry(i).map_or(Pending::default(), |n| Pending {
                in_flight: n.now,
                unserved: n.unserved,
            })
        };
        let load = |i: usize| {
            entry(i).map_or(HostLoad::default(), |n| HostLoad {
                requests: n.load(),
                waited_ns: now_ns.saturating_sub(n.waiting_since_ns),
            })
        };
        let (first, probe) = match probes.due(now_ns, pending) {
            Some(i) => {
                table.count_served(i);
                (i, true)
            }
            // Set only under `pick: weighted_p2c_unless_equal` (`adopt`).
            None if *hosts_equal => {
                return Decision::Fallback(FallbackReason::HostsEqual);
            }
            None => match table.pick(config.pick(), rng, load) {
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
        let probe_timeout_ms = local
            .probes
            .timeout_ms()
            .filter(|_| probe && alternative.is_some());
        Decision::Override(Pick {
            host,
            alternative,
            probe,
            probe_timeout_ms,
            table_version: local.snapshot.table_version,
        })
    }

    /// The version of the pick table this worker uses for `cluster`; `None` before it has one.
    pub fn table_version(&self, cluster: &str) -> Option<u64> {
        self.clusters
            .get(cluster)
            .map(|c| c.snapshot.table_version)
            .filter(|v| *v > 0)
    }

    /// Counts a request picked for `host` in flight there from `now_ns`: the end of the request,
    /// which is when the host can work on it (see [`Request::body_pending`]).
    pub(crate) fn request_sent(&mut self, cluster: &str, host: &Rc<str>, now_ns: u64) {
        let Some(local) = self.clusters.get_mut(cluster) else {
            return;
        };
        match local.in_flight.get_mut(&**host) {
            Some(n) => {
                if n.load() == 0 {
                    n.waiting_since_ns = now_ns;
                }
                n.now += 1;
            }
            None => {
                local.in_flight.insert(
                    host.clone(),
                    InFlight {
                        now: 1,
                        waiting_since_ns: now_ns,
                        ..InFlight::default()
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

    /// Whether the adapter should read a response's load report (`score`): not when the score
    /// ignores them.
    pub fn reads_load_reports(&self) -> bool {
        let score = &self.config.policy().score;
        score.load_weight > 0.0 && score.load_metric != LoadMetric::Off
    }

    /// Whether the adapter should read the zone of `host`: not while this VM's batch holds an
    /// answer for it (an empty one included: a host without a zone) or the record names one.
    pub fn wants_zone(&self, cluster: &str, host: &str) -> bool {
        let Some(local) = self.clusters.get(cluster) else {
            return false;
        };
        local.batched_zone(host).is_none()
            && local.snapshot.host(host).is_none_or(|h| h.zone.is_empty())
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
        let outcome =
            Outcome::with_grpc(done.outcome, done.grpc_status, self.config.grpc_failures());
        if let Some(count) = done
            .picked
            .filter(|_| done.in_flight)
            .and_then(|p| local.in_flight.get_mut(p))
        {
            count.now = count.now.saturating_sub(1);
        }
        // Whoever chose it, the host that had the request last tells how it ends for that host.
        if let (Some(entry), Some(outcome)) = (
            done.served_by.and_then(|h| local.in_flight.get_mut(h)),
            outcome,
        ) {
            entry.ended(Ending::of(outcome), done.ended_ns);
        }
        if let (Some(picked), Some(served_by)) = (done.picked, done.served_by) {
            let honoured = served_by == picked || done.attempts > 1;
            local.honour.record(honoured);
            // A probe the alternative answered first, after the probe's wait: the host is at
            // least that slow, which is no failure, and no reason to probe it less often
            // (`probe`). What the table holds of it stands if it is slower; the alternative
            // started after the wait, so the request's time is not its sample.
            let hedged = done.probe_timeout_ms.filter(|t| {
                served_by != picked && done.attempts > 1 && done.latency_ms >= f64::from(*t)
            });
            if let Some(wait) = hedged {
                let known = local.snapshot.host(picked).and_then(|h| h.latency_ms);
                let sample = f64::from(wait).max(known.unwrap_or(0.0));
                if let Some(acc) = local.host_batch(picked) {
                    acc.record(
                        sample.min(self.config.latency_ceiling_ms()),
                        false,
                        penalty_ms,
                    );
                }
                return;
            }
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
                if let Some(entry) = local.in_flight.get_mut(picked).filter(|_| honoured) {
                    entry.ended(Ending::Lost, done.ended_ns);
                }
                if !honoured {
                    if let Some(c) = counts_entry(&mut self.counts, cluster, || true) {
                        c.not_honoured += 1;
                    }
                }
            }
        }
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
                .or_else(|| local.batched_zone(host))
                .or_else(|| local.snapshot.host(host).map(|h| &**h.zone))
                .unwrap_or_default();
            !zone.is_empty() && zone != mine
        });
        // A host outside the stable subset of a cluster larger than the table is the fallback's:
        // its samples would only be refused when folded.
        let endpoints = done.num_endpoints.unwrap_or(local.snapshot.num_endpoints);
        if !crate::record::state::in_subset(host, endpoints, self.config.policy().max_hosts) {
            return;
        }
        let mut first_sample = false;
        if let Some((acc, new)) = local.host_batch_new(host) {
            first_sample = new;
            if outcome == Outcome::Abandoned {
                acc.record_abandoned(latency_ms);
            } else {
                acc.record(latency_ms, outcome.is_failure(), penalty_ms);
            }
            if let Some(utilization) = load {
                acc.report_load(utilization);
            }
            if let Some(zone) = done.zone.filter(|z| acc.zone.as_deref() != Some(*z)) {
                acc.zone = Some(zone.to_owned());
            }
        }
        // A host the table does not list makes the next tick fold at once (`urgent`). Looked up
        // at its first sample of the tick, and only when Envoy chose it: a pick came from the
        // table.
        if first_sample && done.picked != Some(host) && local.snapshot.host(host).is_none() {
            local.unknown_sampled = true;
        }
        if remote {
            if let Some(c) = counts_entry(&mut self.counts, cluster, || true) {
                c.cross_zone += 1;
            }
        }
    }
}
