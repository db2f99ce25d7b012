//! What a test backend is: its name, latency profile (with time phases), capacity and failure
//! rate, checked before it starts.

use std::str::FromStr;

use anyhow::{bail, Context, Result};
use hyper::header::HeaderValue;

use crate::latency::Latency;

/// Overrides the latency profile during `[from_s, to_s)` seconds after the backend started.
#[derive(Clone, Debug, PartialEq)]
pub struct Phase {
    pub from_s: f64,
    pub to_s: f64,
    pub latency: Latency,
}

/// Where a failed gRPC call's status travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcStatusIn {
    /// A trailers-only response: HTTP 200 headers with `grpc-status`, and nothing else.
    Headers,
    /// HTTP 200 headers first, then trailers with `grpc-status`.
    Trailers,
}

/// What a failed gRPC call answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcFailure {
    pub code: tonic::Code,
    pub status_in: GrpcStatusIn,
}

impl Default for GrpcFailure {
    /// UNAVAILABLE, trailers-only: what a gRPC server shedding load answers.
    fn default() -> Self {
        GrpcFailure {
            code: tonic::Code::Unavailable,
            status_in: GrpcStatusIn::Headers,
        }
    }
}

/// What a backend reports of its load in ORCA's `endpoint-load-metrics` response header.
#[derive(Clone, Debug, PartialEq)]
pub enum Orca {
    /// `TEXT cpu_utilization=<value>`, whatever the backend does.
    Fixed(f64),
    /// `TEXT cpu_utilization=<in flight / capacity + background>`: its own business requests in
    /// flight over `capacity`, plus a `background` share (other proxies' traffic, a batch job).
    Busy { capacity: usize, background: f64 },
    /// This exact header value (malformed reports, the JSON form).
    Raw(String),
}

impl Orca {
    /// The header value with `in_flight` business requests being served and `rps` answered a
    /// second lately (`rps_fractional`: Envoy's client_side_weighted_round_robin weighs a host
    /// by it and ignores a report without it).
    pub fn header(&self, in_flight: usize, rps: f64) -> String {
        match self {
            Orca::Fixed(u) => format!("TEXT cpu_utilization={u}, rps_fractional={rps:.1}"),
            Orca::Busy {
                capacity,
                background,
            } => {
                let u = in_flight as f64 / (*capacity).max(1) as f64 + background;
                format!("TEXT cpu_utilization={u:.4}, rps_fractional={rps:.1}")
            }
            Orca::Raw(value) => value.clone(),
        }
    }
}

impl FromStr for Orca {
    type Err = anyhow::Error;

    /// `fixed:U` or `busy:CAPACITY:BACKGROUND`: `fixed:0.3`, `busy:16:0.5`.
    fn from_str(s: &str) -> Result<Orca> {
        let number = |v: &str| -> Result<f64> {
            let x: f64 = v
                .trim()
                .parse()
                .with_context(|| format!("orca {s:?}: {v:?}"))?;
            if !x.is_finite() || x < 0.0 {
                bail!("orca {s:?}: {v:?} must be a number >= 0");
            }
            Ok(x)
        };
        match s.split(':').collect::<Vec<_>>().as_slice() {
            ["fixed", u] => Ok(Orca::Fixed(number(u)?)),
            ["busy", capacity, background] => {
                let capacity: usize = capacity
                    .trim()
                    .parse()
                    .with_context(|| format!("orca {s:?}: capacity"))?;
                if capacity == 0 {
                    bail!("orca {s:?}: capacity must be >= 1");
                }
                Ok(Orca::Busy {
                    capacity,
                    background: number(background)?,
                })
            }
            _ => bail!("orca {s:?}: expected fixed:U or busy:CAPACITY:BACKGROUND"),
        }
    }
}

/// What a backend is and how it behaves. Every backend speaks HTTP/1.1, HTTP/2 (h2c) and gRPC
/// on its one port; the latency profile, capacity and failure rate apply to each.
#[derive(Clone, Debug)]
pub struct BackendSpec {
    /// Sent back in `x-backend` and in the body.
    pub name: String,
    /// Delay of business requests (outside schedule phases).
    pub latency: Latency,
    /// `Some(k)`: only k requests are served at once and the rest queue, so latency grows with load.
    pub capacity: Option<usize>,
    /// Share of business requests answered 503 (after their delay, like a real overloaded service);
    /// gRPC calls answer `grpc_failure` instead.
    pub fail_rate: f64,
    pub grpc_failure: GrpcFailure,
    /// Time windows with a different latency; the first matching phase wins.
    pub schedule: Vec<Phase>,
    /// Delay of health-path requests; they bypass the worker queue.
    pub health_latency: Latency,
    /// The load it reports in its business responses; `None`: no report.
    pub orca: Option<Orca>,
}

impl BackendSpec {
    /// A backend with this latency, unbounded capacity, no failures, no schedule.
    pub fn new(name: impl Into<String>, latency: Latency) -> Self {
        BackendSpec {
            name: name.into(),
            latency,
            capacity: None,
            fail_rate: 0.0,
            grpc_failure: GrpcFailure::default(),
            schedule: Vec::new(),
            health_latency: Latency::Fixed(0),
            orca: None,
        }
    }

    /// Reports its load in every business response (ORCA `endpoint-load-metrics`).
    pub fn orca(mut self, orca: Orca) -> Self {
        self.orca = Some(orca);
        self
    }

    /// Sets the number of concurrent workers.
    pub fn capacity(mut self, k: usize) -> Self {
        self.capacity = Some(k);
        self
    }

    /// Sets the share of 503 answers.
    pub fn fail_rate(mut self, rate: f64) -> Self {
        self.fail_rate = rate;
        self
    }

    /// Sets what a failed gRPC call answers.
    pub fn grpc_failure(mut self, code: tonic::Code, status_in: GrpcStatusIn) -> Self {
        self.grpc_failure = GrpcFailure { code, status_in };
        self
    }

    /// Adds a latency phase.
    pub fn phase(mut self, from_s: f64, to_s: f64, latency: Latency) -> Self {
        self.schedule.push(Phase {
            from_s,
            to_s,
            latency,
        });
        self
    }

    /// Sets the health-path delay.
    pub fn health_latency(mut self, latency: Latency) -> Self {
        self.health_latency = latency;
        self
    }

    /// Checks the fields that would otherwise fail later, at request time.
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() || HeaderValue::from_str(&self.name).is_err() {
            bail!(
                "backend name {:?} must be non-empty and valid in a header",
                self.name
            );
        }
        if !(0.0..=1.0).contains(&self.fail_rate) {
            bail!(
                "backend {}: fail rate {} must be within 0..=1",
                self.name,
                self.fail_rate
            );
        }
        if self.grpc_failure.code == tonic::Code::Ok {
            bail!("backend {}: a failed gRPC call cannot answer OK", self.name);
        }
        if self.capacity == Some(0) {
            bail!("backend {}: capacity must be >= 1", self.name);
        }
        for p in &self.schedule {
            if !(p.from_s >= 0.0 && p.from_s < p.to_s) {
                bail!(
                    "backend {}: phase {}-{} must have 0 <= from < to",
                    self.name,
                    p.from_s,
                    p.to_s
                );
            }
        }
        Ok(())
    }
}

impl FromStr for Phase {
    type Err = anyhow::Error;

    /// `FROM-TO@LATENCY`, seconds: `5-35@uniform:300-600`.
    fn from_str(s: &str) -> Result<Phase> {
        let (window, lat) = s.split_once('@').with_context(|| {
            format!("phase {s:?}: expected FROM-TO@LATENCY, e.g. 10-20@fixed:500")
        })?;
        let (from, to) = window
            .split_once('-')
            .with_context(|| format!("phase {s:?}: expected FROM-TO seconds"))?;
        Ok(Phase {
            from_s: from
                .trim()
                .parse()
                .with_context(|| format!("phase {s:?}: from"))?,
            to_s: to
                .trim()
                .parse()
                .with_context(|| format!("phase {s:?}: to"))?,
            latency: lat.parse()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_writes_load_reports() {
        assert_eq!("fixed:0.3".parse::<Orca>().unwrap(), Orca::Fixed(0.3));
        let busy: Orca = "busy:4:0.5".parse().unwrap();
        assert_eq!(
            busy,
            Orca::Busy {
                capacity: 4,
                background: 0.5
            }
        );
        assert_eq!(
            Orca::Fixed(0.3).header(7, 12.0),
            "TEXT cpu_utilization=0.3, rps_fractional=12.0"
        );
        // Two of four workers busy, plus half a host of background work.
        assert_eq!(
            busy.header(2, 0.0),
            "TEXT cpu_utilization=1.0000, rps_fractional=0.0"
        );
        assert_eq!(
            busy.header(0, 5.5),
            "TEXT cpu_utilization=0.5000, rps_fractional=5.5"
        );
        for bad in [
            "fixed",
            "fixed:-1",
            "fixed:NaN",
            "busy:0:0.1",
            "busy:4",
            "cpu:0.3",
        ] {
            assert!(bad.parse::<Orca>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_phases() {
        assert_eq!(
            "5-35@uniform:300-600".parse::<Phase>().unwrap(),
            Phase {
                from_s: 5.0,
                to_s: 35.0,
                latency: Latency::Uniform {
                    lo_ms: 300,
                    hi_ms: 600
                }
            }
        );
        for bad in ["5-35", "5@fixed:1", "a-3@fixed:1", "1-2@gauss:1"] {
            assert!(bad.parse::<Phase>().is_err(), "{bad:?}");
        }
    }
}
