//! `smoothing`: the algorithm and its parameters side by side in JSON, read into a
//! [`Smoother`] and checked against its bounds.

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::error::{err, in_range, Shown};
use super::json::{error, ticked, variant, Fields, FromJson};
use super::ConfigError;
use crate::balance::smoothing::{
    Smoother, DEFAULT_PEAK_SAMPLES, DEFAULT_TAU_MS, MAX_PEAK_SAMPLES, MAX_SMA_WINDOW,
};

/// The JSON form of `smoothing`: the algorithm and its parameters side by side. Parameters left
/// out take their defaults; a parameter of another algorithm is an error, not a silent no-op.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct SmoothingSpec {
    algorithm: Algorithm,
    #[serde(skip_serializing_if = "Option::is_none")]
    alpha: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tau_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_samples: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    beta: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    short_tau_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    long_tau_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Algorithm {
    Ewma,
    DecayEwma,
    #[default]
    PeakEwma,
    Sma,
    BiasCorrectedEwma,
    DualEwma,
}

impl Algorithm {
    const NAMES: [(&'static str, Algorithm); 6] = [
        ("ewma", Algorithm::Ewma),
        ("decay_ewma", Algorithm::DecayEwma),
        ("peak_ewma", Algorithm::PeakEwma),
        ("sma", Algorithm::Sma),
        ("bias_corrected_ewma", Algorithm::BiasCorrectedEwma),
        ("dual_ewma", Algorithm::DualEwma),
    ];
}

/// `smoothing`: an `algorithm` and that algorithm's parameters.
impl FromJson for Smoother {
    fn from_json(value: &Value, path: &str) -> Result<Self, ConfigError> {
        const PARAMS: [&str; 8] = [
            "algorithm",
            "alpha",
            "tau_ms",
            "peak_samples",
            "window",
            "beta",
            "short_tau_ms",
            "long_tau_ms",
        ];
        let fields = Fields::of(value, path, &PARAMS)?;
        let Some(algorithm) = fields.get("algorithm") else {
            return Err(error(path, "missing field `algorithm`"));
        };
        let mut spec = SmoothingSpec {
            algorithm: variant(algorithm, &fields.path_of("algorithm"), &Algorithm::NAMES)?,
            ..SmoothingSpec::default()
        };
        fields.read("alpha", &mut spec.alpha)?;
        fields.read("tau_ms", &mut spec.tau_ms)?;
        fields.read("peak_samples", &mut spec.peak_samples)?;
        fields.read("window", &mut spec.window)?;
        fields.read("beta", &mut spec.beta)?;
        fields.read("short_tau_ms", &mut spec.short_tau_ms)?;
        fields.read("long_tau_ms", &mut spec.long_tau_ms)?;
        Smoother::try_from(spec).map_err(|message| error(path, message))
    }
}

impl TryFrom<SmoothingSpec> for Smoother {
    type Error = String;

    fn try_from(spec: SmoothingSpec) -> Result<Self, String> {
        let given = [
            ("alpha", spec.alpha.is_some()),
            ("tau_ms", spec.tau_ms.is_some()),
            ("peak_samples", spec.peak_samples.is_some()),
            ("window", spec.window.is_some()),
            ("beta", spec.beta.is_some()),
            ("short_tau_ms", spec.short_tau_ms.is_some()),
            ("long_tau_ms", spec.long_tau_ms.is_some()),
        ];
        let (smoother, takes): (Smoother, &[&str]) = match spec.algorithm {
            Algorithm::Ewma => (
                Smoother::Ewma {
                    alpha: spec.alpha.unwrap_or(0.3),
                },
                &["alpha"],
            ),
            Algorithm::DecayEwma => (
                Smoother::DecayEwma {
                    tau_ms: spec.tau_ms.unwrap_or(DEFAULT_TAU_MS),
                },
                &["tau_ms"],
            ),
            Algorithm::PeakEwma => (
                Smoother::PeakEwma {
                    tau_ms: spec.tau_ms.unwrap_or(DEFAULT_TAU_MS),
                    peak_samples: spec.peak_samples.unwrap_or(DEFAULT_PEAK_SAMPLES),
                },
                &["tau_ms", "peak_samples"],
            ),
            Algorithm::Sma => (
                Smoother::Sma {
                    window: spec.window.unwrap_or(16),
                },
                &["window"],
            ),
            Algorithm::BiasCorrectedEwma => (
                Smoother::BiasCorrectedEwma {
                    beta: spec.beta.unwrap_or(0.9),
                },
                &["beta"],
            ),
            Algorithm::DualEwma => (
                Smoother::DualEwma {
                    short_tau_ms: spec.short_tau_ms.unwrap_or(1_000),
                    long_tau_ms: spec.long_tau_ms.unwrap_or(10_000),
                },
                &["short_tau_ms", "long_tau_ms"],
            ),
        };
        match given
            .iter()
            .find(|(name, present)| *present && !takes.contains(name))
        {
            Some((name, _)) => Err(format!(
                "`{name}` is not a parameter of `{}`, which takes {}",
                smoother.name(),
                ticked(takes)
            )),
            None => Ok(smoother),
        }
    }
}

impl From<Smoother> for SmoothingSpec {
    fn from(smoother: Smoother) -> Self {
        let none = SmoothingSpec::default();
        match smoother {
            Smoother::Ewma { alpha } => SmoothingSpec {
                algorithm: Algorithm::Ewma,
                alpha: Some(alpha),
                ..none
            },
            Smoother::DecayEwma { tau_ms } => SmoothingSpec {
                algorithm: Algorithm::DecayEwma,
                tau_ms: Some(tau_ms),
                ..none
            },
            Smoother::PeakEwma {
                tau_ms,
                peak_samples,
            } => SmoothingSpec {
                algorithm: Algorithm::PeakEwma,
                tau_ms: Some(tau_ms),
                peak_samples: Some(peak_samples),
                ..none
            },
            Smoother::Sma { window } => SmoothingSpec {
                algorithm: Algorithm::Sma,
                window: Some(window),
                ..none
            },
            Smoother::BiasCorrectedEwma { beta } => SmoothingSpec {
                algorithm: Algorithm::BiasCorrectedEwma,
                beta: Some(beta),
                ..none
            },
            Smoother::DualEwma {
                short_tau_ms,
                long_tau_ms,
            } => SmoothingSpec {
                algorithm: Algorithm::DualEwma,
                short_tau_ms: Some(short_tau_ms),
                long_tau_ms: Some(long_tau_ms),
                ..none
            },
        }
    }
}

/// The configuration and the status page show a smoother in its JSON form.
impl Serialize for Smoother {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        SmoothingSpec::from(*self).serialize(serializer)
    }
}

/// The bounds of each smoother's parameters.
pub(super) fn check_smoother(smoother: Smoother) -> Result<Smoother, ConfigError> {
    const TAU_MAX_MS: u64 = 600_000;
    match smoother {
        Smoother::Ewma { alpha } if !(alpha > 0.0 && alpha <= 1.0) => {
            return Err(err(
                "smoothing.alpha",
                format!("must be in (0, 1], got {}", alpha.shown()),
            ))
        }
        Smoother::Ewma { .. } => {}
        Smoother::DecayEwma { tau_ms } => {
            in_range("smoothing.tau_ms", tau_ms, 1, TAU_MAX_MS)?;
        }
        Smoother::PeakEwma {
            tau_ms,
            peak_samples,
        } => {
            in_range("smoothing.tau_ms", tau_ms, 1, TAU_MAX_MS)?;
            in_range("smoothing.peak_samples", peak_samples, 1, MAX_PEAK_SAMPLES)?;
        }
        Smoother::Sma { window } => {
            in_range("smoothing.window", window, 1, MAX_SMA_WINDOW)?;
        }
        Smoother::BiasCorrectedEwma { beta } => {
            in_range("smoothing.beta", beta, 0.0, 0.999_999)?;
        }
        Smoother::DualEwma {
            short_tau_ms,
            long_tau_ms,
        } => {
            in_range("smoothing.short_tau_ms", short_tau_ms, 1, TAU_MAX_MS)?;
            in_range(
                "smoothing.long_tau_ms",
                long_tau_ms,
                short_tau_ms,
                TAU_MAX_MS,
            )?;
        }
    }
    Ok(smoother)
}
