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
}

impl Metric {
    pub const ALL: [Metric; 8] = [
        Metric::SteeredRequests,
        Metric::FallbackRequests,
        Metric::ManagementDeniedRequests,
        Metric::Ejections,
        Metric::HostWeight,
        Metric::HostLatency,
        Metric::HostInFlight,
        Metric::HostEjected,
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
        }
    }

    pub const fn kind(self) -> MetricKind {
        match self {
            Metric::SteeredRequests | Metric::FallbackRequests | Metric::ManagementDeniedRequests | Metric::Ejections => {
                MetricKind::Counter
            }
            Metric::HostWeight | Metric::HostLatency | Metric::HostInFlight | Metric::HostEjected => MetricKind::Gauge,
        }
    }

    /// The label beside `cluster_name`, if any.
    pub const fn label(self) -> Option<&'static str> {
        match self {
            Metric::FallbackRequests => Some("reason"),
            Metric::HostWeight | Metric::HostLatency | Metric::HostInFlight | Metric::HostEjected => Some("host"),
            Metric::SteeredRequests | Metric::ManagementDeniedRequests | Metric::Ejections => None,
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
