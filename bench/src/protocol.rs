//! What a scenario's load speaks, and the Envoy edits that go with it: plain HTTP/1.1 (the
//! default), or gRPC unary calls over HTTP/2 to a cluster that talks HTTP/2 upstream, optionally
//! with extra `retry_on` conditions on the route (to measure what Envoy's gRPC retries cost).
//!
//! Kept apart from `compare`: a comparison asks it for two things only, [`Transport::prepare`]
//! on each policy's Envoy config and [`Transport::run_load`] for the load.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use harness::config::{CLUSTER, LISTENER};
use harness::load::{self, LoadSpec, Record};
use harness::{grpc, EnvoyConfig};
use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// HTTP/1.1 GETs; the cluster as it ships (HTTP/1.1 upstream).
    #[default]
    Http,
    /// gRPC unary calls (`harness::grpc`), HTTP/2 downstream and upstream.
    Grpc,
}

impl FromStr for Protocol {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "http" => Ok(Protocol::Http),
            "grpc" => Ok(Protocol::Grpc),
            other => bail!("unknown protocol {other:?} (http, grpc)"),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        })
    }
}

/// A scenario's `protocol` and `retry_on`, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Transport {
    pub protocol: Protocol,
    /// Conditions added to the shipped route's `retry_policy.retry_on`, e.g. `unavailable`.
    pub extra_retry_on: Vec<String>,
}

/// Envoy's `retry_on` conditions for gRPC (x-envoy-retry-grpc-on) and HTTP (x-envoy-retry-on)
/// that a scenario may add.
const RETRY_ON: &[&str] = &[
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
    "5xx",
    "gateway-error",
    "reset",
    "retriable-status-codes",
];

impl Transport {
    /// From the scenario file's `protocol` (default `http`) and `retry_on` (a comma list).
    pub fn parse(protocol: Option<&str>, retry_on: Option<&str>) -> Result<Transport> {
        let protocol = protocol.map(str::parse).transpose()?.unwrap_or_default();
        let extra_retry_on: Vec<String> = retry_on
            .into_iter()
            .flat_map(|r| r.split(','))
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
        if let Some(bad) = extra_retry_on
            .iter()
            .find(|c| !RETRY_ON.contains(&c.as_str()))
        {
            bail!(
                "retry_on: unknown condition {bad:?} ({})",
                RETRY_ON.join(", ")
            );
        }
        Ok(Transport {
            protocol,
            extra_retry_on,
        })
    }

    /// The edits this transport needs on a policy's Envoy config, the same for every policy:
    /// gRPC makes the cluster talk HTTP/2; `retry_on` extends the route's retry conditions.
    pub fn prepare(&self, config: &mut EnvoyConfig) -> Result<()> {
        if self.protocol == Protocol::Grpc {
            config.cluster(CLUSTER)?.use_http2()?;
        }
        if !self.extra_retry_on.is_empty() {
            let mut route = config.listener(LISTENER)?.http()?.route_to(CLUSTER)?;
            let shipped = route.get_str("route.retry_policy.retry_on")?.to_string();
            route.set(
                "route.retry_policy.retry_on",
                format!("{shipped},{}", self.extra_retry_on.join(",")),
            )?;
        }
        Ok(())
    }

    /// Runs the load: HTTP requests to `spec.url`, or gRPC unary calls to its host and port.
    pub fn run_load(&self, spec: &LoadSpec) -> Result<Vec<Record>> {
        match self.protocol {
            Protocol::Http => load::run(spec),
            Protocol::Grpc => grpc::run(spec),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use harness::config::LbPolicy;

    use super::*;
    use crate::policy::Policy;

    #[test]
    fn grpc_makes_the_cluster_http2_and_retry_on_extends_the_shipped_conditions() {
        let t = Transport::parse(Some("grpc"), Some("unavailable, resource-exhausted")).unwrap();
        let endpoints = ["127.0.0.1:8081".parse().unwrap()];
        for policy in [
            Policy::get("ewma_lb").unwrap(),
            Policy::get("least_request").unwrap(),
        ] {
            let mut c = policy
                .envoy_config(
                    &serde_json::json!({}),
                    Path::new("/d/x.wasm"),
                    &endpoints,
                    Duration::from_secs(1),
                )
                .unwrap();
            let before = c.cluster(CLUSTER).unwrap().lb_policy().unwrap();
            t.prepare(&mut c).unwrap();
            assert_eq!(
                c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
                before,
                "the policy stays"
            );
            assert!(c
                .get("static_resources.clusters[name=backend].typed_extension_protocol_options")
                .is_ok());
            let route = c
                .listener(LISTENER)
                .unwrap()
                .http()
                .unwrap()
                .route_to(CLUSTER)
                .unwrap()
                .value()
                .clone();
            assert_eq!(
                route["route"]["retry_policy"]["retry_on"],
                "connect-failure,reset-before-request,unavailable,resource-exhausted"
            );
            assert!(matches!(
                before,
                LbPolicy::Envoy(_) | LbPolicy::OverrideHost { .. }
            ));
        }
        let mut plain = Policy::get("ewma_lb")
            .unwrap()
            .envoy_config(
                &serde_json::json!({}),
                Path::new("/d/x.wasm"),
                &endpoints,
                Duration::from_secs(1),
            )
            .unwrap();
        let shipped = plain.value().clone();
        Transport::default().prepare(&mut plain).unwrap();
        assert_eq!(plain.value(), &shipped, "plain HTTP changes nothing");
    }

    #[test]
    fn rejects_unknown_protocols_and_retry_conditions() {
        assert!(Transport::parse(Some("h3"), None).is_err());
        assert!(Transport::parse(None, Some("unavailable,whenever")).is_err());
        assert_eq!(Transport::parse(None, None).unwrap(), Transport::default());
    }
}
