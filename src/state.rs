//! Shared state: the record of one cluster that every worker VM merges its samples into, and
//! what merging and refreshing do to it.
//!
//! Merging happens on ticks, never per request. Whoever merges when a refresh is due also
//! recomputes the weight table and bumps `table_version`; the compare-and-swap around the write
//! (`sync`) makes that one VM per refresh. How the record is stored, keyed and encoded is
//! `sync`'s business too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::outlier::{ejection_budget, Health, OutlierParams};
use crate::smoothing::{Batch, Estimate, Smoother};
use crate::units::NS_PER_SEC;
use crate::weights::{self, HostInput, WeightParams};

/// What one worker observed of one host since its last successful merge.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accumulator {
    pub latency: Batch,
    pub failures: u32,
    /// Failures after the last success in this batch.
    pub trailing_failures: u32,
    pub had_success: bool,
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
}

/// The shared record of one upstream host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostState {
    /// `IP:port`, as Envoy reports it in `upstream.address` and accepts in the override header.
    pub address: String,
    /// From the configuration: never dropped for silence.
    pub is_static: bool,
    pub last_seen_ns: u64,
    /// When the host joined or came back from ejection: the start of its slow-start ramp.
    pub active_since_ns: u64,
    pub latency: Estimate,
    /// Smoothed share of failed requests, for operators (the score already includes failures).
    pub error_rate: f64,
    pub health: Health,
    /// Share of steered traffic in the table in force; 0 for ejected and not yet weighted hosts.
    pub share: f64,
}

/// The shared record of one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Bumped on every change of the shares; workers rebuild their pick table when it moves.
    pub table_version: u64,
    pub refreshed_ns: u64,
    pub hosts: Vec<HostState>,
}

/// Everything merge and refresh need to know of the configuration; `Config::policy`.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub smoother: Smoother,
    pub weights: WeightParams,
    pub outlier: OutlierParams,
    pub refresh_interval_ns: u64,
    pub host_ttl_ns: u64,
    pub max_hosts: usize,
}

impl ClusterState {
    pub fn host(&self, address: &str) -> Option<&HostState> {
        self.hosts.iter().find(|h| h.address == address)
    }

    pub fn refresh_due(&self, now_ns: u64, policy: &Policy) -> bool {
        self.table_version == 0 || now_ns.saturating_sub(self.refreshed_ns) >= policy.refresh_interval_ns
    }

    /// Folds one worker's samples in. Returns how many hosts it ejected; an ejection changes the
    /// table at once rather than at the next refresh. Hosts past `max_hosts` are not tracked.
    pub fn merge(&mut self, samples: &BTreeMap<String, Accumulator>, now_ns: u64, policy: &Policy) -> usize {
        for (address, acc) in samples {
            let Some(host) = self.host_mut_or_insert(address, now_ns, false, policy.max_hosts) else {
                continue;
            };
            host.last_seen_ns = now_ns;
            let dt_ns = now_ns.saturating_sub(host.latency.updated_ns());
            policy.smoother.observe(&mut host.latency, &acc.latency, now_ns);
            if acc.latency.count > 0 {
                let rate = f64::from(acc.failures) / f64::from(acc.latency.count);
                let keep = (-(dt_ns as f64) / ERROR_RATE_TAU_NS).exp();
                host.error_rate = keep * host.error_rate + (1.0 - keep) * rate;
            }
            if !host.health.is_ejected(now_ns) {
                host.health.record(acc.failures, acc.trailing_failures, acc.had_success);
            }
        }
        self.eject_failing(now_ns, &policy.outlier)
    }

    /// Recomputes the shares: adds the static hosts, forgets silent learned ones, ends elapsed
    /// ejections, and bumps `table_version`.
    /// Returns how many hosts it ejected (a failure count reached during a refresh-only tick).
    pub fn refresh(&mut self, now_ns: u64, policy: &Policy, static_hosts: &[String]) -> usize {
        for address in static_hosts {
            if let Some(host) = self.host_mut_or_insert(address, now_ns, true, policy.max_hosts) {
                host.is_static = true;
            }
        }
        self.hosts
            .retain(|h| h.is_static || now_ns.saturating_sub(h.last_seen_ns) < policy.host_ttl_ns);
        for host in &mut self.hosts {
            if host.health.tick(&policy.outlier, now_ns) {
                // Back from ejection: its old latency is the failures' penalty. Start afresh at
                // the cluster median and ramp up, as a new host would.
                host.active_since_ns = now_ns;
                host.share = 0.0;
                host.latency = Estimate::default();
            }
        }
        let ejected = self.eject_failing(now_ns, &policy.outlier);
        self.reweigh(now_ns, &policy.weights);
        self.refreshed_ns = now_ns;
        ejected
    }

    fn reweigh(&mut self, now_ns: u64, params: &WeightParams) {
        let inputs: Vec<HostInput> = self
            .hosts
            .iter()
            .map(|h| HostInput {
                score_ms: h.latency.value_ms(),
                active_for_ns: now_ns.saturating_sub(h.active_since_ns),
                ejected: h.health.is_ejected(now_ns),
                previous_share: (h.share > 0.0).then_some(h.share),
            })
            .collect();
        for (host, share) in self.hosts.iter_mut().zip(weights::shares(&inputs, params)) {
            host.share = share;
        }
        self.table_version = self.table_version.wrapping_add(1).max(1);
    }

    /// Ejects hosts at their failure threshold while the cluster's ejection budget lasts;
    /// returns how many.
    fn eject_failing(&mut self, now_ns: u64, params: &OutlierParams) -> usize {
        let budget = ejection_budget(params, self.hosts.len());
        let mut ejected = self.hosts.iter().filter(|h| h.health.is_ejected(now_ns)).count();
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
            // Redistribute the ejected hosts' shares among the rest, proportionally.
            let total: f64 = self.hosts.iter().map(|h| h.share).sum();
            for host in &mut self.hosts {
                host.share = if total > 0.0 { host.share / total } else { 0.0 };
            }
            self.table_version = self.table_version.wrapping_add(1).max(1);
        }
        newly
    }

    fn host_mut_or_insert(&mut self, address: &str, now_ns: u64, is_static: bool, max_hosts: usize) -> Option<&mut HostState> {
        let index = match self.hosts.iter().position(|h| h.address == address) {
            Some(i) => i,
            None if self.hosts.len() < max_hosts => {
                self.hosts.push(HostState {
                    address: address.to_owned(),
                    is_static,
                    last_seen_ns: now_ns,
                    active_since_ns: now_ns,
                    health: Health { healthy_since_ns: now_ns, ..Health::default() },
                    ..HostState::default()
                });
                self.hosts.len() - 1
            }
            None => return None,
        };
        self.hosts.get_mut(index)
    }
}

/// Time constant of the operator-facing error rate.
const ERROR_RATE_TAU_NS: f64 = (10 * NS_PER_SEC) as f64;
