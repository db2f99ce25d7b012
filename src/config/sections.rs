//! The smaller sections of the configuration: `weights`, `outlier_detection`, `score`,
//! `envoy_health` and `locality`. Each is the JSON form of a domain type's parameters, with the
//! operator's units; the defaults live with the code that uses them (`WeightParams::default`...),
//! and the JSON form only changes units.

use serde::Serialize;

use super::error::{err, in_range};
use super::json::quoted;
use super::ConfigError;
use crate::balance::locality::LocalityParams;
use crate::balance::outlier::OutlierParams;
use crate::balance::score::{LoadMetric, ScoreParams, MAX_UTILIZATION_CAP};
use crate::balance::weights::WeightParams;
use crate::units::{ms_to_ns, ns_to_whole_ms};

/// `weights`: the JSON form of [`WeightParams`], durations in ms.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WeightsConfig {
    pub exponent: f64,
    pub min_share: f64,
    pub min_fair_share: f64,
    pub max_step_ratio: f64,
    pub noise_band: f64,
    pub noise_gain: f64,
    pub slow_start_ms: u64,
    pub slow_start_min_factor: f64,
}

impl Default for WeightsConfig {
    fn default() -> Self {
        let p = WeightParams::default();
        WeightsConfig {
            exponent: p.exponent,
            min_share: p.min_share,
            min_fair_share: p.min_fair_share,
            max_step_ratio: p.max_step_ratio,
            noise_band: p.noise_band,
            noise_gain: p.noise_gain,
            slow_start_ms: ns_to_whole_ms(p.slow_start_ns),
            slow_start_min_factor: p.slow_start_min_factor,
        }
    }
}

json_struct!(WeightsConfig {
    exponent,
    min_share,
    min_fair_share,
    max_step_ratio,
    noise_band,
    noise_gain,
    slow_start_ms,
    slow_start_min_factor
});

impl WeightsConfig {
    pub(super) fn compile(self) -> Result<WeightParams, ConfigError> {
        Ok(WeightParams {
            exponent: in_range("weights.exponent", self.exponent, 0.1, 8.0)?,
            min_share: in_range("weights.min_share", self.min_share, 0.0, 0.5)?,
            min_fair_share: in_range("weights.min_fair_share", self.min_fair_share, 0.0, 1.0)?,
            max_step_ratio: in_range("weights.max_step_ratio", self.max_step_ratio, 1.0, 1000.0)?,
            noise_band: in_range("weights.noise_band", self.noise_band, 1.0, 100.0)?,
            noise_gain: in_range("weights.noise_gain", self.noise_gain, 0.01, 1.0)?,
            slow_start_ns: ms_to_ns(in_range(
                "weights.slow_start_ms",
                self.slow_start_ms,
                0,
                600_000,
            )?),
            slow_start_min_factor: in_range(
                "weights.slow_start_min_factor",
                self.slow_start_min_factor,
                0.01,
                1.0,
            )?,
        })
    }
}

/// `outlier_detection`: the JSON form of [`OutlierParams`], durations in ms.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutlierConfig {
    pub consecutive_failures: u32,
    pub base_ejection_ms: u64,
    pub max_ejection_ms: u64,
    pub max_ejection_share: f64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        let p = OutlierParams::default();
        OutlierConfig {
            consecutive_failures: p.consecutive_failures,
            base_ejection_ms: ns_to_whole_ms(p.base_ejection_ns),
            max_ejection_ms: ns_to_whole_ms(p.max_ejection_ns),
            max_ejection_share: p.max_ejection_share,
        }
    }
}

json_struct!(OutlierConfig {
    consecutive_failures,
    base_ejection_ms,
    max_ejection_ms,
    max_ejection_share
});

impl OutlierConfig {
    pub(super) fn compile(self) -> Result<OutlierParams, ConfigError> {
        const HOUR_MS: u64 = 3_600_000;
        let base_ms = in_range(
            "outlier_detection.base_ejection_ms",
            self.base_ejection_ms,
            1,
            HOUR_MS,
        )?;
        Ok(OutlierParams {
            consecutive_failures: in_range(
                "outlier_detection.consecutive_failures",
                self.consecutive_failures,
                0,
                10_000,
            )?,
            base_ejection_ns: ms_to_ns(base_ms),
            max_ejection_ns: ms_to_ns(in_range(
                "outlier_detection.max_ejection_ms",
                self.max_ejection_ms,
                base_ms,
                HOUR_MS,
            )?),
            max_ejection_share: in_range(
                "outlier_detection.max_ejection_share",
                self.max_ejection_share,
                0.0,
                1.0,
            )?,
        })
    }
}

/// `score`: the JSON form of [`ScoreParams`], the metric by name.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScoreConfig {
    pub error_weight: f64,
    pub load_weight: f64,
    pub max_utilization: f64,
    pub load_metric: String,
}

impl Default for ScoreConfig {
    fn default() -> Self {
        let p = ScoreParams::default();
        ScoreConfig {
            error_weight: p.error_weight,
            load_weight: p.load_weight,
            max_utilization: p.max_utilization,
            load_metric: p.load_metric.into(),
        }
    }
}

json_struct!(ScoreConfig {
    error_weight,
    load_weight,
    max_utilization,
    load_metric
});

impl ScoreConfig {
    pub(super) fn compile(self) -> Result<ScoreParams, ConfigError> {
        let load_metric = LoadMetric::parse(&self.load_metric).ok_or_else(|| {
            err(
                "score.load_metric",
                format!(
                    "must be `auto`, `cpu_utilization`, `application_utilization`, `named_metrics.<name>` or `none`, got {}",
                    quoted(&self.load_metric)
                ),
            )
        })?;
        Ok(ScoreParams {
            error_weight: in_range("score.error_weight", self.error_weight, 0.0, 10.0)?,
            load_weight: in_range("score.load_weight", self.load_weight, 0.0, 10.0)?,
            max_utilization: in_range(
                "score.max_utilization",
                self.max_utilization,
                0.5,
                MAX_UTILIZATION_CAP,
            )?,
            load_metric,
        })
    }
}

/// `envoy_health`: a cluster pointing at Envoy's admin address, and how often to ask it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EnvoyHealthConfig {
    /// Empty: Envoy's health is not read (hosts it marks unhealthy still get picks).
    pub admin_cluster: String,
    pub poll_interval_ms: u64,
}

impl Default for EnvoyHealthConfig {
    fn default() -> Self {
        EnvoyHealthConfig {
            admin_cluster: String::new(),
            poll_interval_ms: 1_000,
        }
    }
}

json_struct!(EnvoyHealthConfig {
    admin_cluster,
    poll_interval_ms
});

/// `locality`: the JSON form of [`LocalityParams`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocalityConfig {
    pub enabled: bool,
    pub spillover_latency_ratio: f64,
    pub min_local_hosts: u32,
}

impl Default for LocalityConfig {
    fn default() -> Self {
        let p = LocalityParams::default();
        LocalityConfig {
            enabled: p.enabled,
            spillover_latency_ratio: p.spillover_latency_ratio,
            min_local_hosts: p.min_local_hosts,
        }
    }
}

json_struct!(LocalityConfig {
    enabled,
    spillover_latency_ratio,
    min_local_hosts
});

impl LocalityConfig {
    pub(super) fn compile(self) -> Result<LocalityParams, ConfigError> {
        Ok(LocalityParams {
            enabled: self.enabled,
            spillover_latency_ratio: in_range(
                "locality.spillover_latency_ratio",
                self.spillover_latency_ratio,
                1.0,
                100.0,
            )?,
            min_local_hosts: in_range("locality.min_local_hosts", self.min_local_hosts, 1, 1000)?,
        })
    }
}
