//! The status document: the shared record of each cluster a worker knows, as it stands when
//! asked, for operators.

use serde::Serialize;

use crate::balance::score::ScoreParams;
use crate::record::state::{ClusterState, HostState};
use crate::units::ns_to_whole_ms;
use crate::worker::telemetry::Build;

#[derive(Serialize)]
pub struct Status<'a> {
    /// The plugin's version and git commit.
    pub build: Build,
    /// True when the plugin computes everything but never overrides Envoy's choice.
    pub shadow: bool,
    /// `steered_clusters` as configured: the clusters (exact names, or prefixes ending in `*`)
    /// whose requests the plugin steers. A cluster listed here but absent from `clusters` has
    /// had no steered request yet (a typo, maybe: the log says so).
    pub steered_clusters: &'a [String],
    /// The proxy's own zone; `null` when the node has none.
    pub local_zone: Option<&'a str>,
    pub clusters: Vec<ClusterStatus<'a>>,
}

#[derive(Serialize)]
pub struct ClusterStatus<'a> {
    pub cluster: &'a str,
    pub table_version: u64,
    /// Age of the weight table; `null` before the first refresh.
    pub refreshed_ms_ago: Option<u64>,
    /// The cluster's endpoint count as Envoy last reported it; `null` when not reported.
    pub endpoints: Option<u32>,
    /// Endpoints the table does not know yet.
    pub unknown_endpoints: u32,
    pub hosts: Vec<HostStatus<'a>>,
}

#[derive(Serialize)]
pub struct HostStatus<'a> {
    pub host: &'a str,
    /// `upstream.locality.zone`; `null` until reported.
    pub zone: Option<&'a str>,
    /// Share of steered traffic, 0-1.
    pub weight: f64,
    /// What the weight is computed from: latency × error factor × load factor
    /// (docs/score.md), in ms; `null` before any sample.
    pub score_ms: Option<f64>,
    /// Smoothed latency (failures count as the penalty latency); `null` before any sample.
    pub latency_ms: Option<f64>,
    pub samples: u64,
    /// Smoothed share of failed requests, 0-1.
    pub error_rate: f64,
    /// Smoothed utilisation the host reports (ORCA `endpoint-load-metrics`); `null` when it
    /// reports none.
    pub utilization: Option<f64>,
    pub state: HostPhase,
    pub consecutive_failures: u32,
    /// Time left of an ejection; 0 when not ejected.
    pub ejected_for_ms: u64,
    /// Requests this worker has in flight to the host.
    pub in_flight: u32,
    /// Envoy's admin `/clusters` marks the host unhealthy (its active health checks, EDS health
    /// or outlier detection): this worker does not pick it (`envoy_health`).
    pub envoy_unhealthy: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPhase {
    /// Still on its slow-start ramp (new, or back from ejection).
    Warming,
    Live,
    Ejected,
    /// A configured host Envoy does not have (it did not honour picks of it).
    Absent,
}

impl HostPhase {
    pub fn of(host: &HostState, now_ns: u64, slow_start_ns: u64) -> HostPhase {
        if host.absent {
            HostPhase::Absent
        } else if host.health.is_ejected(now_ns) {
            HostPhase::Ejected
        } else if host.active_for_ns(now_ns) < slow_start_ns {
            HostPhase::Warming
        } else {
            HostPhase::Live
        }
    }
}

impl<'a> ClusterStatus<'a> {
    pub fn new(
        cluster: &'a str,
        state: &'a ClusterState,
        now_ns: u64,
        slow_start_ns: u64,
        score: &ScoreParams,
        in_flight: impl Fn(&str) -> u32,
        envoy_unhealthy: impl Fn(&str) -> bool,
    ) -> Self {
        ClusterStatus {
            cluster,
            table_version: state.table_version,
            refreshed_ms_ago: (state.table_version > 0)
                .then(|| ns_to_whole_ms(now_ns.saturating_sub(state.refreshed_ns))),
            endpoints: (state.num_endpoints > 0).then_some(state.num_endpoints),
            unknown_endpoints: state.unknown_endpoints(),
            hosts: state
                .hosts
                .iter()
                .map(|h| {
                    let terms = h.terms(now_ns);
                    HostStatus {
                        host: &h.address,
                        zone: (!h.zone.is_empty()).then_some(h.zone.as_str()),
                        weight: h.share,
                        score_ms: terms.score_ms(score),
                        latency_ms: terms.latency_ms,
                        samples: h.samples,
                        error_rate: terms.error_rate,
                        utilization: terms.utilization,
                        state: HostPhase::of(h, now_ns, slow_start_ns),
                        consecutive_failures: h.health.consecutive_failures,
                        ejected_for_ms: ns_to_whole_ms(
                            h.health.ejected_until_ns.saturating_sub(now_ns),
                        ),
                        in_flight: in_flight(&h.address),
                        envoy_unhealthy: envoy_unhealthy(&h.address),
                    }
                })
                .collect(),
        }
    }
}
