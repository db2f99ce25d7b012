//! Score: one host's cost per successful request, from three terms smoothed per host.
//!
//! - **latency**: the smoothed latency of `smoothing`, failures counted as at least
//!   `failure_penalty_ms` (so within a tick a host failing fast never looks fast);
//! - **error rate** `e`: the time-decayed failed fraction of the host's requests ([`ErrorRate`]);
//! - **load** `u`: the utilisation the host itself reports in its responses' ORCA header
//!   `endpoint-load-metrics` ([`parse_load_report`], [`Load`]); absent when it reports none.
//!
//! ```text
//! score = latency · (1 / (1 − min(e, MAX_ERROR_RATE)))^error_weight
//!                 · (1 / (1 − min(u, max_utilization)))^load_weight
//! ```
//!
//! Both factors are dimensionless, so the score stays a latency in ms. `1 / (1 − e)` is the
//! number of attempts a request needs on average until one succeeds: the score is the expected
//! time a success costs on that host. `1 / (1 − u)` is how an M/M/1 queue stretches a request's
//! time at utilisation `u`: a host near full behaves like a queue about to grow, not like a few
//! extra milliseconds, and its share falls before its latency rises (its latency rises only once
//! the queue has formed, which is what the report lets the table avoid). With no report the load
//! factor is 1 and the score is the latency with its error factor, as without ORCA.
//!
//! Time is a parameter (`now_ns`, record time); nothing here knows the host.

use serde::{Deserialize, Serialize};

use crate::units::NS_PER_SEC;

/// Error rates above this count as this: the factor stays finite (10), and a host failing
/// nearly everything is the outlier ejection's to take out, not the score's.
pub(crate) const MAX_ERROR_RATE: f64 = 0.9;
/// Time constant of the error rate: a burst of failures fades over tens of seconds, while the
/// penalty latency of the failures moves the score within a tick.
pub const ERROR_RATE_TAU_NS: u64 = 10 * NS_PER_SEC;
/// Requests of prior evidence of success the error rate starts from: one failure out of a
/// host's first two requests is not a 50 % error rate.
pub(crate) const ERROR_RATE_PRIOR: f64 = 4.0;
/// Time constant of the reported load: reports are instantaneous readings, averaged over about
/// a second, as the latency is.
pub const LOAD_TAU_NS: u64 = NS_PER_SEC;
/// A host that sent no report for this long has no load term (it stopped reporting, or its
/// reports stopped reaching this proxy).
pub const LOAD_TTL_NS: u64 = 10 * NS_PER_SEC;
/// Reported values above this are not a utilisation (ORCA allows a little over 1 for a host past
/// its soft limit, never a thousand percent): the report is ignored and counted.
pub const MAX_REPORTED_UTILIZATION: f64 = 10.0;
/// Longest `endpoint-load-metrics` value read; a longer one is ignored and counted.
pub const MAX_REPORT_BYTES: usize = 4096;

/// The response header ORCA load reports travel in (TEXT and JSON forms).
pub const LOAD_REPORT_HEADER: &str = "endpoint-load-metrics";

/// Which ORCA field feeds the load term: `score.load_metric`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub enum LoadMetric {
    /// `application_utilization` when the report carries a positive one, else
    /// `cpu_utilization` (as gRPC's weighted_round_robin reads them).
    #[default]
    Auto,
    Cpu,
    Application,
    /// `named_metrics.<name>`.
    Named(String),
    /// Reports are not read at all.
    Off,
}

impl LoadMetric {
    /// From the configured name: `auto`, `cpu_utilization`, `application_utilization`,
    /// `named_metrics.<name>` or `none`. `None` for anything else.
    pub fn parse(name: &str) -> Option<LoadMetric> {
        match name {
            "auto" => Some(LoadMetric::Auto),
            "cpu_utilization" => Some(LoadMetric::Cpu),
            "application_utilization" => Some(LoadMetric::Application),
            "none" => Some(LoadMetric::Off),
            _ => {
                let named = name.strip_prefix(NAMED_PREFIX)?;
                let ok = !named.is_empty()
                    && named.len() <= 128
                    && named
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
                ok.then(|| LoadMetric::Named(named.to_owned()))
            }
        }
    }
}

impl From<LoadMetric> for String {
    fn from(metric: LoadMetric) -> String {
        match metric {
            LoadMetric::Auto => "auto".into(),
            LoadMetric::Cpu => CPU.into(),
            LoadMetric::Application => APPLICATION.into(),
            LoadMetric::Named(name) => format!("{NAMED_PREFIX}{name}"),
            LoadMetric::Off => "none".into(),
        }
    }
}

const CPU: &str = "cpu_utilization";
const APPLICATION: &str = "application_utilization";
const NAMED_PREFIX: &str = "named_metrics.";

/// The weights of the score's terms; `score` in the plugin configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScoreParams {
    /// Exponent of the error factor; 0 leaves errors to the penalty latency alone.
    pub error_weight: f64,
    /// Exponent of the load factor; 0 ignores reports.
    pub load_weight: f64,
    /// Utilisations above this count as this: the factor at it is the most a report can weigh.
    pub max_utilization: f64,
    pub load_metric: LoadMetric,
}

impl Default for ScoreParams {
    fn default() -> Self {
        ScoreParams {
            error_weight: 1.0,
            load_weight: 1.0,
            // A factor of 20 at most: a full host scores like one 20 times slower, far enough
            // below the others to get only the floor at the default exponent.
            max_utilization: 0.95,
            load_metric: LoadMetric::Auto,
        }
    }
}

/// `(1 / (1 − min(x, cap)))^weight`, 1 for a weight of 0 or a value that is not a number.
fn factor(x: f64, cap: f64, weight: f64) -> f64 {
    if weight <= 0.0 || !x.is_finite() || x <= 0.0 {
        return 1.0;
    }
    // Callers keep `cap` below 1 (`MAX_ERROR_RATE`, `MAX_UTILIZATION_CAP`).
    let x = x.min(cap).min(MAX_UTILIZATION_CAP);
    (1.0 / (1.0 - x)).powf(weight)
}

/// The three terms of one host, as the status page and metrics show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Terms {
    /// Smoothed latency, failures counted as the penalty; `None` before any sample.
    pub latency_ms: Option<f64>,
    pub error_rate: f64,
    /// Reported utilisation; `None` when the host reports none (lately).
    pub utilization: Option<f64>,
}

impl Terms {
    /// The score in ms; `None` before any latency sample.
    pub fn score_ms(&self, params: &ScoreParams) -> Option<f64> {
        let latency = self.latency_ms?;
        let errors = factor(self.error_rate, MAX_ERROR_RATE, params.error_weight);
        let load = self.utilization.map_or(1.0, |u| {
            factor(
                u,
                params.max_utilization.min(MAX_UTILIZATION_CAP),
                params.load_weight,
            )
        });
        Some(latency * errors * load)
    }
}

/// The highest `max_utilization` allowed: the factor must stay finite.
pub(crate) const MAX_UTILIZATION_CAP: f64 = 0.99;

/// A host's failed fraction: failures and requests, each decayed with [`ERROR_RATE_TAU_NS`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorRate {
    failed: f64,
    requests: f64,
    updated_ns: u64,
}

impl ErrorRate {
    /// Folds in `requests` finished requests, `failures` of them failed, observed up to `now_ns`.
    pub fn observe(&mut self, requests: u32, failures: u32, now_ns: u64) {
        if requests == 0 {
            return;
        }
        let keep = decay(now_ns.saturating_sub(self.updated_ns), ERROR_RATE_TAU_NS);
        self.failed = keep * self.failed + f64::from(failures.min(requests));
        self.requests = keep * self.requests + f64::from(requests);
        self.updated_ns = self.updated_ns.max(now_ns);
    }

    /// The failed fraction, 0-1, drawn towards 0 while few requests stand behind it.
    pub fn value(&self) -> f64 {
        let rate = self.failed / (self.requests + ERROR_RATE_PRIOR);
        if rate.is_finite() {
            rate.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

/// A host's reported utilisation, time-decayed with [`LOAD_TAU_NS`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// `None` until the first report.
    value: Option<f64>,
    updated_ns: u64,
}

impl Load {
    /// Folds in the mean of `reports` reports, received up to `now_ns`.
    pub fn observe(&mut self, mean: f64, reports: u32, now_ns: u64) {
        if reports == 0 || !mean.is_finite() || mean < 0.0 {
            return;
        }
        let dt_ns = now_ns.saturating_sub(self.updated_ns);
        self.value = Some(match self.value {
            Some(old) if dt_ns < LOAD_TTL_NS => {
                let keep = decay(dt_ns, LOAD_TAU_NS);
                keep * old + (1.0 - keep) * mean
            }
            // The first report, or the first after a silence: nothing to average with.
            _ => mean,
        });
        self.updated_ns = self.updated_ns.max(now_ns);
    }

    /// The smoothed utilisation, `None` without a report within [`LOAD_TTL_NS`] of `now_ns`.
    pub fn value(&self, now_ns: u64) -> Option<f64> {
        self.value
            .filter(|_| now_ns.saturating_sub(self.updated_ns) < LOAD_TTL_NS)
    }
}

fn decay(dt_ns: u64, tau_ns: u64) -> f64 {
    (-(dt_ns as f64) / tau_ns.max(1) as f64).exp()
}

/// How often a VM looks for a load report in the responses of a cluster that has sent none:
/// the default tick. A cluster whose hosts start reporting is noticed within this (divided by
/// the share of its responses that carry a report), and the look costs one host call (about
/// 1 µs in Envoy's V8) per cluster and interval instead of one per response.
pub const LOAD_REPORT_RECHECK_NS: u64 = NS_PER_SEC / 10;

/// Whether to read a response's load report header, per cluster and VM: on every response once
/// one of the cluster's responses has carried a report (any value, a malformed one too, so its
/// errors are counted as before), and until then on the first response of each
/// [`LOAD_REPORT_RECHECK_NS`]. Clusters whose hosts send no reports, most of them, are spared
/// the read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadReportWatch {
    reporting: bool,
    next_look_ns: u64,
}

impl LoadReportWatch {
    /// Whether the response whose headers arrived at `now_ns` should be looked at; `true`
    /// commits to telling [`LoadReportWatch::looked`] what was found.
    pub fn wants(&mut self, now_ns: u64) -> bool {
        if self.reporting {
            return true;
        }
        if now_ns < self.next_look_ns {
            return false;
        }
        self.next_look_ns = now_ns.saturating_add(LOAD_REPORT_RECHECK_NS);
        true
    }

    /// What the look found: whether the response carried the header.
    pub fn looked(&mut self, found: bool) {
        self.reporting |= found;
    }
}

/// Why a load report was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadReportError {
    /// Longer than [`MAX_REPORT_BYTES`].
    TooLong,
    /// Neither `TEXT ` nor `JSON ` (the binary form travels in another header).
    UnknownFormat,
    /// Not `key=value, ...`, or not JSON, or a value that is not a number.
    Malformed,
    /// The chosen metric is negative, not finite, or above [`MAX_REPORTED_UTILIZATION`].
    OutOfRange,
}

/// Reads the chosen metric from an `endpoint-load-metrics` value: `Ok(None)` when the report is
/// well formed but does not carry it (then the load term stays as it was). Never panics, whatever
/// the bytes.
pub fn parse_load_report(
    value: &[u8],
    metric: &LoadMetric,
) -> Result<Option<f64>, LoadReportError> {
    if value.len() > MAX_REPORT_BYTES {
        return Err(LoadReportError::TooLong);
    }
    let named = match metric {
        LoadMetric::Off => return Ok(None),
        LoadMetric::Named(name) => Some(name.as_str()),
        _ => None,
    };
    let value = value.trim_ascii();
    let report = if let Some(text) = strip_prefix_ignore_case(value, b"TEXT ") {
        Report::text(text, named)?
    } else if let Some(json) = strip_prefix_ignore_case(value, b"JSON ") {
        Report::json(json, named)?
    } else {
        return Err(LoadReportError::UnknownFormat);
    };
    let chosen = match metric {
        LoadMetric::Auto => report
            .application
            .filter(|a| *a > 0.0)
            .or(report.cpu)
            .or(report.application),
        LoadMetric::Cpu => report.cpu,
        LoadMetric::Application => report.application,
        LoadMetric::Named(_) => report.named,
        LoadMetric::Off => None,
    };
    match chosen {
        Some(u) if (0.0..=MAX_REPORTED_UTILIZATION).contains(&u) => Ok(Some(u)),
        Some(_) => Err(LoadReportError::OutOfRange),
        None => Ok(None),
    }
}

fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let head = value.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| value.get(prefix.len()..))
        .flatten()
}

/// The fields of a report the score may read.
#[derive(Default)]
struct Report {
    cpu: Option<f64>,
    application: Option<f64>,
    /// The named metric the configuration chose, if it chose one.
    named: Option<f64>,
}

impl Report {
    /// `key=value, key=value`: every pair must be well formed and every value a number, as
    /// Envoy's own ORCA parser demands.
    fn text(text: &[u8], named: Option<&str>) -> Result<Report, LoadReportError> {
        let text = std::str::from_utf8(text).map_err(|_| LoadReportError::Malformed)?;
        let mut report = Report::default();
        for pair in text.split(',') {
            let (key, value) = pair.split_once('=').ok_or(LoadReportError::Malformed)?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || value.is_empty() || !value.bytes().all(is_number_byte) {
                return Err(LoadReportError::Malformed);
            }
            let number: f64 = value.parse().map_err(|_| LoadReportError::Malformed)?;
            let name = key.strip_prefix(NAMED_PREFIX);
            report.set(key, name.filter(|n| Some(*n) == named).is_some(), number);
        }
        Ok(report)
    }

    /// `{"cpu_utilization": 0.3, "named_metrics": {"foo": 0.2}, ...}`.
    fn json(json: &[u8], named: Option<&str>) -> Result<Report, LoadReportError> {
        let value: serde_json::Value =
            serde_json::from_slice(json).map_err(|_| LoadReportError::Malformed)?;
        let object = value.as_object().ok_or(LoadReportError::Malformed)?;
        let mut report = Report::default();
        for (key, value) in object {
            match (key.as_str(), value) {
                ("named_metrics", serde_json::Value::Object(metrics)) => {
                    for (name, v) in metrics {
                        let v = v.as_f64().ok_or(LoadReportError::Malformed)?;
                        if Some(name.as_str()) == named {
                            report.named = Some(v);
                        }
                    }
                }
                ("named_metrics", _) => return Err(LoadReportError::Malformed),
                (CPU | APPLICATION, v) => {
                    report.set(key, false, v.as_f64().ok_or(LoadReportError::Malformed)?);
                }
                // Other fields (rps_fractional, mem_utilization, ...) are not read.
                _ => {}
            }
        }
        Ok(report)
    }

    /// Notes `key`'s value; `chosen`: the key is the named metric the configuration chose.
    fn set(&mut self, key: &str, chosen: bool, value: f64) {
        match key {
            _ if chosen => self.named = Some(value),
            CPU => self.cpu = Some(value),
            APPLICATION => self.application = Some(value),
            _ => {}
        }
    }
}

/// Digits, sign, decimal point, exponent: what a number in a TEXT report may hold. `NaN` and
/// `inf`, which Rust's parser would take, are malformed here.
fn is_number_byte(b: u8) -> bool {
    b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E')
}
