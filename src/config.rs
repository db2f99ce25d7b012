//! Plugin configuration: the JSON an operator writes, its defaults, and the checks that reject a
//! bad one with the field's name and the offending value.
//!
//! Envoy passes the configuration as a `google.protobuf.StringValue`; it reaches `on_configure`
//! byte for byte. Unknown fields are rejected: a typo must not silently become a default.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::outlier::OutlierParams;
use crate::pick::PickAlgorithm;
use crate::rules::{default_health_paths, normalize, ManagementConfig, PathSet, Rules};
use crate::smoothing::{Smoother, MAX_SMA_WINDOW};
use crate::state::Policy;
use crate::weights::WeightParams;

/// The whole plugin configuration. Every field is optional; see README, "Configuration".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Request header the cluster's `override_host` policy reads (`override_host_sources`).
    pub override_header: String,
    /// How often every worker merges its samples into shared state and looks for a new table.
    pub tick_period_ms: u64,
    /// How often the weight table is recomputed (the timed-refresh gate against flapping).
    pub refresh_interval_ms: u64,
    pub smoothing: Smoother,
    pub weights: WeightParams,
    /// Latency a failed request counts as at least, so a host that fails fast never looks fast.
    pub failure_penalty_ms: u64,
    pub pick: PickAlgorithm,
    /// Share of requests left to the cluster's fallback policy, which finds endpoints the table
    /// does not know yet (EDS, Kubernetes).
    pub exploration_share: f64,
    /// A learned host with no traffic for this long is forgotten.
    pub host_ttl_ms: u64,
    pub max_hosts_per_cluster: usize,
    pub outlier_detection: OutlierParams,
    /// Optional static endpoints per Envoy cluster name; others are learned from traffic.
    pub clusters: BTreeMap<String, ClusterConfig>,
    /// Health probes: passed untouched, never steered, never sampled.
    pub health_paths: PathSet,
    /// Management paths: a local 403 unless the client is in `allowed_cidrs`.
    pub management: ManagementConfig,
    /// Long polls, streams, uploads: left to the fallback policy and never sampled.
    pub excluded_paths: PathSet,
    /// Path the plugin answers itself with the weight tables as JSON; guarded like management.
    pub status_path: String,
    /// Compute, export metrics and status, but never override Envoy's choice.
    pub shadow: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `IP:port` of each endpoint, as Envoy names them in `upstream.address`.
    pub endpoints: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            override_header: "x-ewma-lb-host".into(),
            tick_period_ms: 100,
            refresh_interval_ms: 250,
            smoothing: Smoother::default(),
            weights: WeightParams::default(),
            failure_penalty_ms: 1_000,
            pick: PickAlgorithm::default(),
            exploration_share: 0.002,
            host_ttl_ms: 60_000,
            max_hosts_per_cluster: 256,
            outlier_detection: OutlierParams::default(),
            clusters: BTreeMap::new(),
            health_paths: default_health_paths(),
            management: ManagementConfig::default(),
            excluded_paths: PathSet::default(),
            status_path: "/ewma-lb/status".into(),
            shadow: false,
        }
    }
}

/// A configuration error: which field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError { field: field.into(), message: message.into() }
}

fn in_range<T: PartialOrd + fmt::Display>(field: &str, value: T, lo: T, hi: T) -> Result<(), ConfigError> {
    if value >= lo && value <= hi {
        Ok(())
    } else {
        Err(err(field, format!("must be in [{lo}, {hi}], got {value}")))
    }
}

impl Config {
    /// Parses and validates. An empty document means "all defaults".
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Config::default());
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(err("config", "must be a JSON object"));
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let config: Config = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "config".to_owned() } else { path };
            err(field, strip_position(&e.into_inner().to_string()))
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let header = &self.override_header;
        if header.is_empty()
            || !header.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(err(
                "override_header",
                format!("must be a lowercase HTTP header name, got {header:?}"),
            ));
        }
        in_range("tick_period_ms", self.tick_period_ms, 10, 60_000)?;
        in_range("refresh_interval_ms", self.refresh_interval_ms, self.tick_period_ms, 600_000)?;
        validate_smoother(&self.smoothing)?;
        let w = &self.weights;
        in_range("weights.exponent", w.exponent, 0.1, 8.0)?;
        in_range("weights.min_share", w.min_share, 0.0, 0.5)?;
        in_range("weights.max_step_ratio", w.max_step_ratio, 1.0, 1000.0)?;
        in_range("weights.slow_start_ms", w.slow_start_ms, 0, 600_000)?;
        in_range("weights.slow_start_min_factor", w.slow_start_min_factor, 0.01, 1.0)?;
        in_range("failure_penalty_ms", self.failure_penalty_ms, 0, 600_000)?;
        in_range("exploration_share", self.exploration_share, 0.0, 0.5)?;
        in_range("host_ttl_ms", self.host_ttl_ms, self.refresh_interval_ms, 86_400_000)?;
        in_range("max_hosts_per_cluster", self.max_hosts_per_cluster, 1, 1024)?;
        let o = &self.outlier_detection;
        in_range("outlier_detection.consecutive_failures", o.consecutive_failures, 0, 10_000)?;
        in_range("outlier_detection.base_ejection_ms", o.base_ejection_ms, 1, 3_600_000)?;
        in_range("outlier_detection.max_ejection_ms", o.max_ejection_ms, o.base_ejection_ms, 3_600_000)?;
        in_range("outlier_detection.max_ejection_share", o.max_ejection_share, 0.0, 1.0)?;
        for (name, cluster) in &self.clusters {
            if name.is_empty() {
                return Err(err("clusters", "cluster names must not be empty"));
            }
            if cluster.endpoints.len() > self.max_hosts_per_cluster {
                return Err(err(
                    format!("clusters.{name}.endpoints"),
                    format!("{} endpoints, more than max_hosts_per_cluster ({})", cluster.endpoints.len(), self.max_hosts_per_cluster),
                ));
            }
            for (i, endpoint) in cluster.endpoints.iter().enumerate() {
                if endpoint.parse::<SocketAddr>().is_err() {
                    return Err(err(
                        format!("clusters.{name}.endpoints[{i}]"),
                        format!("must be IP:port, got {endpoint:?}"),
                    ));
                }
            }
        }
        if !self.status_path.starts_with('/') || normalize(&self.status_path) != self.status_path {
            return Err(err(
                "status_path",
                format!("must be a normalised absolute path such as /ewma-lb/status, got {:?}", self.status_path),
            ));
        }
        self.rules()?;
        Ok(())
    }

    /// The path rules, compiled.
    pub fn rules(&self) -> Result<Rules, ConfigError> {
        Rules::compile(&self.health_paths, &self.management, &self.excluded_paths).map_err(|e| err(e.field, e.message))
    }

    /// The part of the configuration that merging and refreshing shared state need.
    pub fn policy(&self) -> Policy {
        Policy {
            smoother: self.smoothing,
            weights: self.weights.clone(),
            outlier: self.outlier_detection.clone(),
            refresh_interval_ns: self.refresh_interval_ms.saturating_mul(1_000_000),
            host_ttl_ns: self.host_ttl_ms.saturating_mul(1_000_000),
            max_hosts: self.max_hosts_per_cluster,
        }
    }

    /// Static endpoints of `cluster`, empty when it has none.
    pub fn static_endpoints(&self, cluster: &str) -> &[String] {
        self.clusters.get(cluster).map_or(&[], |c| c.endpoints.as_slice())
    }
}

fn validate_smoother(smoother: &Smoother) -> Result<(), ConfigError> {
    const TAU_MAX_MS: u64 = 600_000;
    match *smoother {
        Smoother::Ewma { alpha } if !(alpha > 0.0 && alpha <= 1.0) => {
            Err(err("smoothing.alpha", format!("must be in (0, 1], got {alpha}")))
        }
        Smoother::Ewma { .. } => Ok(()),
        Smoother::DecayEwma { tau_ms } | Smoother::PeakEwma { tau_ms } => {
            in_range("smoothing.tau_ms", tau_ms, 1, TAU_MAX_MS)
        }
        Smoother::Sma { window } => in_range("smoothing.window", window, 1, MAX_SMA_WINDOW),
        Smoother::BiasCorrectedEwma { beta } => in_range("smoothing.beta", beta, 0.0, 0.999_999),
        Smoother::DualEwma { short_tau_ms, long_tau_ms } => {
            in_range("smoothing.short_tau_ms", short_tau_ms, 1, TAU_MAX_MS)?;
            in_range("smoothing.long_tau_ms", long_tau_ms, short_tau_ms, TAU_MAX_MS)
        }
    }
}

/// serde_json appends " at line L column C"; the field path already says where.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}
