//! Telemetry: every metric the plugin exports, declared once (name, kind, labels, help), and the
//! updates the core hands the adapter on each tick.
//!
//! The core decides what each metric means and when it moves; the adapter only maps an
//! [`Update`] to the host's metric calls. Dashboards and tests read [`Metric::ALL`], not source
//! files.

/// Label every series has: the Envoy cluster (`none` for a request without one).
pub const CLUSTER_LABEL: &str = "cluster_name";
/// `cluster_name` of requests that have no cluster (a direct response, a route without one).
pub const NO_CLUSTER: &str = "none";

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
    UnknownEndpoints,
    CrossZoneRequests,
    SharedRecordErrors,
    MetricSeriesEvicted,
}

impl Metric {
    pub const ALL: [Metric; 12] = [
        Metric::SteeredRequests,
        Metric::FallbackRequests,
        Metric::ManagementDeniedRequests,
        Metric::Ejections,
        Metric::HostWeight,
        Metric::HostLatency,
        Metric::HostInFlight,
        Metric::HostEjected,
        Metric::UnknownEndpoints,
        Metric::CrossZoneRequests,
        Metric::SharedRecordErrors,
        Metric::MetricSeriesEvicted,
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
            Metric::UnknownEndpoints => "ewma_lb_unknown_endpoints",
            Metric::CrossZoneRequests => "ewma_lb_cross_zone_requests_total",
            Metric::SharedRecordErrors => "ewma_lb_shared_record_errors_total",
            Metric::MetricSeriesEvicted => "ewma_lb_metric_series_evicted_total",
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
            | Metric::MetricSeriesEvicted => MetricKind::Counter,
            Metric::HostWeight
            | Metric::HostLatency
            | Metric::HostInFlight
            | Metric::HostEjected
            | Metric::UnknownEndpoints => MetricKind::Gauge,
        }
    }

    /// The label beside `cluster_name`, if any.
    pub const fn label(self) -> Option<&'static str> {
        match self {
            Metric::FallbackRequests => Some("reason"),
            Metric::HostWeight | Metric::HostLatency | Metric::HostInFlight | Metric::HostEjected => Some("host"),
            Metric::SteeredRequests
            | Metric::ManagementDeniedRequests
            | Metric::Ejections
            | Metric::UnknownEndpoints
            | Metric::CrossZoneRequests
            | Metric::SharedRecordErrors
            | Metric::MetricSeriesEvicted => None,
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
            Metric::UnknownEndpoints => "endpoints of the cluster the table does not know yet (they get their share through the fallback)",
            Metric::CrossZoneRequests => "sampled requests served by a host outside the proxy's zone",
            Metric::SharedRecordErrors => "stored records that could not be read and were rebuilt",
            Metric::MetricSeriesEvicted => "metric series this VM stopped updating to stay under its series cap (gauges zeroed first)",
        }
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
    pub cluster: String,
    /// The value of [`Metric::label`]; `None` for metrics without one.
    pub label: Option<String>,
    pub change: Change,
}
