//! Telemetry: every metric the plugin exports, declared once (name, kind, labels, help), and the
//! updates the core hands the adapter on each tick.
//!
//! The core decides what each metric means and when it moves; the adapter only maps an
//! [`Update`] to the host's metric calls. Dashboards and tests read [`Metric::ALL`], not source
//! files.

use std::rc::Rc;

use serde::Serialize;

use crate::balance::score::ScoreParams;
use crate::record::state::ClusterState;
use crate::record::table::Table;
use crate::units::{ms_to_whole_us, share_to_ppm};
use crate::worker::cluster::{Counts, LocalCluster};
use crate::worker::decision::FallbackReason;
use crate::worker::status::HostPhase;

/// Label every series has but `ewma_lb_build_info`: the Envoy cluster (`none` for a request
/// without one).
pub(crate) const CLUSTER_LABEL: &str = "cluster_name";
/// `cluster_name` of requests that have no cluster (a direct response, a route without one).
pub(crate) const NO_CLUSTER: &str = "none";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetricKind {
    /// Only goes up; summed over every VM.
    Counter,
    /// Set, or moved up and down, by every VM alike.
    Gauge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    SteeredRequests,
    FallbackRequests,
    ManagementDeniedRequests,
    Ejections,
    HostWeight,
    HostLatency,
    HostInFlight,
    HostEjected,
    HostErrorRate,
    HostUtilization,
    HostScore,
    UnknownEndpoints,
    HostsOutsideSubset,
    CrossZoneRequests,
    SharedRecordErrors,
    PicksNotHonoured,
    LoadReportErrors,
    MetricSeriesEvicted,
    BuildInfo,
}

impl Metric {
    pub const ALL: [Metric; 19] = [
        Metric::SteeredRequests,
        Metric::FallbackRequests,
        Metric::ManagementDeniedRequests,
        Metric::Ejections,
        Metric::HostWeight,
        Metric::HostLatency,
        Metric::HostInFlight,
        Metric::HostEjected,
        Metric::HostErrorRate,
        Metric::HostUtilization,
        Metric::HostScore,
        Metric::UnknownEndpoints,
        Metric::HostsOutsideSubset,
        Metric::CrossZoneRequests,
        Metric::SharedRecordErrors,
        Metric::PicksNotHonoured,
        Metric::LoadReportErrors,
        Metric::MetricSeriesEvicted,
        Metric::BuildInfo,
    ];

    /// The Prometheus name, as `/stats/prometheus` shows it.
    pub const fn name(self) -> &'static str {
        match self {
            Metric::SteeredRequests => "ewma_lb_steered_requests_total",
            Metric::FallbackRequests => "ewma_lb_fallback_requests_total",
            Metric::ManagementDeniedRequests => "ewma_lb_management_denied_requests_total",
            Metric::Ejections => "ewma_lb_ejections_total",
            Metric::HostWeight => "ewma_lb_host_weight_ppm",
            Metric::HostLatency => "ewma_lb_host_latency_microseconds",
            Metric::HostInFlight => "ewma_lb_host_in_flight_requests",
            Metric::HostEjected => "ewma_lb_host_ejected",
            Metric::HostErrorRate => "ewma_lb_host_error_rate_ppm",
            Metric::HostUtilization => "ewma_lb_host_utilization_ppm",
            Metric::HostScore => "ewma_lb_host_score_microseconds",
            Metric::UnknownEndpoints => "ewma_lb_unknown_endpoints",
            Metric::HostsOutsideSubset => "ewma_lb_hosts_outside_subset",
            Metric::CrossZoneRequests => "ewma_lb_cross_zone_requests_total",
            Metric::SharedRecordErrors => "ewma_lb_shared_record_errors_total",
            Metric::PicksNotHonoured => "ewma_lb_picks_not_honoured_total",
            Metric::LoadReportErrors => "ewma_lb_load_report_errors_total",
            Metric::MetricSeriesEvicted => "ewma_lb_metric_series_evicted_total",
            Metric::BuildInfo => "ewma_lb_build_info",
        }
    }

    pub const fn kind(self) -> MetricKind {
        match self {
            Metric::SteeredRequests
            | Metric::FallbackRequests
            | Metric::ManagementDeniedRequests
            | Metric::Ejections
            | Metric::CrossZoneRequests
            | Metric::SharedRecordErrors
            | Metric::PicksNotHonoured
            | Metric::LoadReportErrors
            | Metric::MetricSeriesEvicted => MetricKind::Counter,
            Metric::HostWeight
            | Metric::HostLatency
            | Metric::HostInFlight
            | Metric::HostEjected
            | Metric::HostErrorRate
            | Metric::HostUtilization
            | Metric::HostScore
            | Metric::UnknownEndpoints
            | Metric::HostsOutsideSubset
            | Metric::BuildInfo => MetricKind::Gauge,
        }
    }

    /// Whether every VM moves the series by its own deltas ([`Change::Add`]): counters, and the
    /// gauge of requests in flight, which holds the sum of every VM's contributions. No VM may
    /// set such a series (not even to 0 when it stops updating it): that would wipe the other
    /// VMs' contributions, and their later decrements would take Envoy's gauge below zero.
    pub const fn moved_by_deltas(self) -> bool {
        matches!(self.kind(), MetricKind::Counter) || matches!(self, Metric::HostInFlight)
    }

    /// The label beside `cluster_name`, if any (none for `BuildInfo`, which has no cluster).
    pub const fn label(self) -> Option<&'static str> {
        match (self, self.labels()) {
            (Metric::BuildInfo, _) => None,
            (_, [_, second]) => Some(*second),
            _ => None,
        }
    }

    /// Every label of the metric's series, in the order they are written into its name.
    pub const fn labels(self) -> &'static [&'static str] {
        match self {
            Metric::BuildInfo => &BUILD_LABELS,
            Metric::FallbackRequests => &[CLUSTER_LABEL, "reason"],
            Metric::HostWeight
            | Metric::HostLatency
            | Metric::HostInFlight
            | Metric::HostEjected
            | Metric::HostErrorRate
            | Metric::HostUtilization
            | Metric::HostScore => &[CLUSTER_LABEL, "host"],
            Metric::SteeredRequests
            | Metric::ManagementDeniedRequests
            | Metric::Ejections
            | Metric::UnknownEndpoints
            | Metric::HostsOutsideSubset
            | Metric::CrossZoneRequests
            | Metric::SharedRecordErrors
            | Metric::PicksNotHonoured
            | Metric::LoadReportErrors
            | Metric::MetricSeriesEvicted => &[CLUSTER_LABEL],
        }
    }

    pub const fn help(self) -> &'static str {
        match self {
            Metric::SteeredRequests => "requests the plugin sent to a host of its choice",
            Metric::FallbackRequests => "requests left to the cluster's fallback policy, by reason",
            Metric::ManagementDeniedRequests => "management requests answered 403",
            Metric::Ejections => "hosts ejected by passive health",
            Metric::HostWeight => "share of steered traffic, parts per million",
            Metric::HostLatency => "smoothed latency",
            Metric::HostInFlight => "steered requests not finished yet",
            Metric::HostEjected => "1 while ejected",
            Metric::HostErrorRate => "smoothed share of failed requests, parts per million (the score's error term)",
            Metric::HostUtilization => "smoothed utilisation the host reports in ORCA endpoint-load-metrics, parts per million; 0 when it reports none (the score's load term)",
            Metric::HostScore => "the score the weight is computed from: latency x error factor x load factor",
            Metric::UnknownEndpoints => "endpoints of the cluster the table does not know yet (they get their share through the fallback)",
            Metric::HostsOutsideSubset => "endpoints of a cluster larger than max_hosts_per_cluster that the table's stable subset leaves to the fallback",
            Metric::CrossZoneRequests => "sampled requests served by a host outside the proxy's zone",
            Metric::SharedRecordErrors => "stored records that could not be read and were rebuilt",
            Metric::PicksNotHonoured => "picks Envoy did not honour: another host served the first attempt (the cluster does not read the plugin's header, or the host left it)",
            Metric::LoadReportErrors => "ORCA load reports (endpoint-load-metrics) ignored as malformed, out of range or too long",
            Metric::MetricSeriesEvicted => "metric series this VM stopped updating to stay under its series cap (gauges zeroed first)",
            Metric::BuildInfo => "1, labelled with the running build's version and git commit",
        }
    }
}

/// The labels of `ewma_lb_build_info`.
const BUILD_LABELS: [&str; 2] = ["version", "commit"];

/// The build that runs: in the status page, the startup log line and `ewma_lb_build_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Build {
    /// The crate version (Cargo.toml).
    pub version: &'static str,
    /// The git commit ./wasm-build.sh built, from `EWMA_LB_GIT_COMMIT` at compile time
    /// (`-dirty` when the tree had uncommitted changes); `unknown` for other builds.
    pub commit: &'static str,
}

pub(crate) const BUILD: Build = Build {
    version: env!("CARGO_PKG_VERSION"),
    commit: match option_env!("EWMA_LB_GIT_COMMIT") {
        Some(commit) => commit,
        None => "unknown",
    },
};

impl Build {
    /// `(label, value)` of `ewma_lb_build_info`, in [`Metric::labels`] order.
    pub fn labels(&self) -> [(&'static str, &'static str); 2] {
        [
            (BUILD_LABELS[0], self.version),
            (BUILD_LABELS[1], self.commit),
        ]
    }
}

/// How an update moves a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add to a counter, or move a gauge shared by every VM up or down.
    Add(i64),
    /// Set a gauge every VM sets to the same value.
    Set(u64),
}

/// One series' change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    pub metric: Metric,
    /// Shared, like the label: a refresh sets six gauges for each of up to 512 hosts, and the
    /// names are the table's.
    pub cluster: Rc<str>,
    /// The value of [`Metric::label`]; `None` for metrics without one.
    pub label: Option<Rc<str>>,
    pub change: Change,
}

// === The updates of a tick ===

pub(crate) fn update(metric: Metric, cluster: &str, label: Option<&str>, change: Change) -> Update {
    Update {
        metric,
        cluster: Rc::from(cluster),
        label: label.map(Rc::from),
        change,
    }
}

/// Most hosts of one cluster that get per-host gauges. Six gauges a host, and a VM keeps 4,096
/// series (`filter::metrics`): a larger cluster's gauges would evict each other on every
/// refresh, each eviction a new series in Envoy and a host call, for a per-host panel no one can
/// read at that size. Larger clusters keep their cluster-wide metrics; the status page and
/// Envoy's `per_endpoint_stats` show their hosts.
pub const MAX_GAUGED_HOSTS: usize = 512;

const HOST_GAUGES: [Metric; 6] = [
    Metric::HostWeight,
    Metric::HostLatency,
    Metric::HostEjected,
    Metric::HostErrorRate,
    Metric::HostUtilization,
    Metric::HostScore,
];

fn gauged(hosts: usize) -> bool {
    hosts <= MAX_GAUGED_HOSTS
}

/// A per-host gauge set to `value`, sharing the cluster's and the table's names.
fn host_gauge(metric: Metric, cluster: &Rc<str>, host: &Rc<str>, value: u64) -> Update {
    Update {
        metric,
        cluster: Rc::clone(cluster),
        label: Some(Rc::clone(host)),
        change: Change::Set(value),
    }
}

/// Zeros for the hosts of the table in force (`old`) that left the new one (`table`), or all of
/// them when the cluster outgrew [`MAX_GAUGED_HOSTS`]. `hosts` is the new record's host count.
pub(crate) fn departed_gauges(
    cluster: &str,
    old: &Table,
    table: &Table,
    hosts: usize,
    out: &mut Vec<Update>,
) {
    if !gauged(old.len()) {
        return;
    }
    let cluster_name: Rc<str> = Rc::from(cluster);
    // Both sorted by address: one walk finds the hosts that left.
    let mut present = table.addresses().iter().peekable();
    let unset = old.addresses().iter().filter(|h| {
        while present.next_if(|a| a < h).is_some() {}
        !gauged(hosts) || present.peek() != Some(h)
    });
    for host in unset {
        for metric in HOST_GAUGES {
            out.push(host_gauge(metric, &cluster_name, host, 0));
        }
    }
}

/// The per-host gauges of a newly published table (`table`, over the record `new`), one update
/// at a time; none when the cluster has more than [`MAX_GAUGED_HOSTS`] hosts.
pub(crate) fn host_gauges(
    cluster: &str,
    new: &ClusterState,
    table: &Table,
    slow_start_ns: u64,
    score: &ScoreParams,
    mut each: impl FnMut(Update),
) {
    if !gauged(new.hosts.len()) {
        return;
    }
    let cluster_name: Rc<str> = Rc::from(cluster);
    for (h, name) in new.hosts.iter().zip(table.addresses().iter()) {
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
            each(host_gauge(metric, &cluster_name, name, value));
        }
    }
}

/// Moves the shared in-flight gauge by this worker's change since the last tick.
pub(crate) fn in_flight_updates(cluster: &str, local: &mut LocalCluster, out: &mut Vec<Update>) {
    // A host with nothing in flight, once reported, leaves the map, unless its last requests
    // went unserved and the table in force lists it: a tick costs the hosts with requests in
    // flight or held out of favour, not every host this VM ever picked, and a host that failed
    // as it left the cluster is not remembered for good. Its next pick inserts it again without
    // allocating (the key is the table's `Rc`, the map keeps its capacity).
    let LocalCluster {
        in_flight,
        snapshot,
        ..
    } = local;
    in_flight.retain(|host, n| {
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
        n.now > 0 || (n.remembers() && snapshot.host(host).is_some())
    });
}

/// The counters as counter increments, then zeroed.
pub(crate) fn count_updates(cluster: &str, counts: &mut Counts, out: &mut Vec<Update>) {
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
