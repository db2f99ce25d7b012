//! Latency profiles for the test backends, and their text form ("fixed:50", "uniform:50-100",
//! "lognormal:80,0.5").

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand::Rng;
use rand_distr::Distribution;

/// Longest delay a profile may produce: a lognormal tail must not park a request for minutes.
pub const MAX_SAMPLE: Duration = Duration::from_secs(60);

/// A distribution of response delays.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    /// Always this many milliseconds.
    Fixed(u64),
    /// Uniform between `lo_ms` and `hi_ms` inclusive.
    Uniform { lo_ms: u64, hi_ms: u64 },
    /// Lognormal with this median (ms) and shape `sigma` (of the underlying normal).
    LogNormal { median_ms: f64, sigma: f64 },
}

impl Default for Latency {
    fn default() -> Self {
        Latency::Fixed(0)
    }
}

impl Latency {
    /// Draws one delay, capped at [`MAX_SAMPLE`].
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        let ms = match *self {
            Latency::Fixed(ms) => ms as f64,
            Latency::Uniform { lo_ms, hi_ms } => rng.random_range(lo_ms as f64..=hi_ms as f64),
            Latency::LogNormal { median_ms, sigma } => {
                // Validated at construction; a bad value still must not panic here.
                match rand_distr::LogNormal::new(median_ms.ln(), sigma) {
                    Ok(d) => d.sample(rng),
                    Err(_) => median_ms,
                }
            }
        };
        Duration::from_secs_f64((ms / 1000.0).clamp(0.0, MAX_SAMPLE.as_secs_f64()))
    }

    /// The median delay, for reports and sanity checks.
    pub fn median(&self) -> Duration {
        let ms = match *self {
            Latency::Fixed(ms) => ms as f64,
            Latency::Uniform { lo_ms, hi_ms } => (lo_ms + hi_ms) as f64 / 2.0,
            Latency::LogNormal { median_ms, .. } => median_ms,
        };
        Duration::from_secs_f64(ms / 1000.0)
    }
}

impl FromStr for Latency {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (kind, args) = s
            .split_once(':')
            .with_context(|| format!("latency {s:?}: expected KIND:ARGS, e.g. fixed:50"))?;
        let num = |v: &str, what: &str| -> Result<f64> {
            let x: f64 = v
                .trim()
                .parse()
                .with_context(|| format!("latency {s:?}: {what} {v:?} is not a number"))?;
            if !x.is_finite() || x < 0.0 {
                bail!("latency {s:?}: {what} must be a finite number >= 0");
            }
            Ok(x)
        };
        match kind.trim() {
            "fixed" => Ok(Latency::Fixed(num(args, "ms")?.round() as u64)),
            "uniform" => {
                let (lo, hi) = args
                    .split_once('-')
                    .with_context(|| format!("latency {s:?}: expected uniform:LO-HI"))?;
                let (lo_ms, hi_ms) = (num(lo, "lo")?.round() as u64, num(hi, "hi")?.round() as u64);
                if lo_ms > hi_ms {
                    bail!("latency {s:?}: lo must be <= hi");
                }
                Ok(Latency::Uniform { lo_ms, hi_ms })
            }
            "lognormal" => {
                let (m, sg) = args
                    .split_once(',')
                    .with_context(|| format!("latency {s:?}: expected lognormal:MEDIAN,SIGMA"))?;
                let (median_ms, sigma) = (num(m, "median")?, num(sg, "sigma")?);
                if median_ms <= 0.0 {
                    bail!("latency {s:?}: median must be > 0");
                }
                Ok(Latency::LogNormal { median_ms, sigma })
            }
            other => bail!("latency {s:?}: unknown kind {other:?} (fixed, uniform, lognormal)"),
        }
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Latency::Fixed(ms) => write!(f, "fixed:{ms}"),
            Latency::Uniform { lo_ms, hi_ms } => write!(f, "uniform:{lo_ms}-{hi_ms}"),
            Latency::LogNormal { median_ms, sigma } => write!(f, "lognormal:{median_ms},{sigma}"),
        }
    }
}

/// Parses "30s", "500ms", "2m", "1.5s" or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("duration {s:?}: expected e.g. 30s, 500ms, 2m"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        u => bail!("duration {s:?}: unknown unit {u:?} (ms, s, m, h)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        bail!("duration {s:?}: must be >= 0");
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_prints_it_back() {
        let cases = [
            ("fixed:50", Latency::Fixed(50)),
            (
                "uniform:50-100",
                Latency::Uniform {
                    lo_ms: 50,
                    hi_ms: 100,
                },
            ),
            (
                "lognormal:80,0.5",
                Latency::LogNormal {
                    median_ms: 80.0,
                    sigma: 0.5,
                },
            ),
        ];
        for (text, want) in cases {
            let got: Latency = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_profiles() {
        for bad in [
            "",
            "fixed",
            "fixed:-1",
            "fixed:x",
            "uniform:100-50",
            "uniform:50",
            "lognormal:0,0.5",
            "lognormal:80",
            "gauss:1",
        ] {
            assert!(
                bad.parse::<Latency>().is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn samples_stay_within_their_profile() {
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let d = Latency::Uniform {
                lo_ms: 50,
                hi_ms: 100,
            }
            .sample(&mut rng);
            assert!(
                d >= Duration::from_millis(50) && d <= Duration::from_millis(100),
                "{d:?}"
            );
            let l = Latency::LogNormal {
                median_ms: 80.0,
                sigma: 3.0,
            }
            .sample(&mut rng);
            assert!(l <= MAX_SAMPLE);
        }
        assert_eq!(Latency::Fixed(7).sample(&mut rng), Duration::from_millis(7));
    }

    #[test]
    fn lognormal_median_is_roughly_its_median() {
        let mut rng = rand::rng();
        let mut v: Vec<Duration> = (0..2001)
            .map(|_| {
                Latency::LogNormal {
                    median_ms: 80.0,
                    sigma: 0.5,
                }
                .sample(&mut rng)
            })
            .collect();
        v.sort();
        let median = v[1000].as_secs_f64() * 1000.0;
        assert!((65.0..=98.0).contains(&median), "median {median}");
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3x").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
