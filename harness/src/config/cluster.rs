//! A cluster: its endpoints and how it picks one. The plugin's way is `override_host` (obey the
//! header the plugin sets, else a fallback policy); the benchmark's comparisons swap that for one
//! of Envoy's own `lb_policy` values.

use std::fmt;
use std::net::SocketAddr;

use anyhow::Result;
use serde_json::{json, Value};

use super::node::view;
use crate::eds::EdsFile;

const OVERRIDE_HOST: &str = "envoy.load_balancing_policies.override_host";
const POLICY: &str = "load_balancing_policy.policies[0].typed_extension_config";

/// One of Envoy's own load balancers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvoyLb {
    RoundRobin,
    Random,
    LeastRequest,
}

/// Each balancer's `lb_policy` value and its `load_balancing_policy` extension name.
const ENVOY_LBS: [(EnvoyLb, &str, &str); 3] = [
    (
        EnvoyLb::RoundRobin,
        "ROUND_ROBIN",
        "envoy.load_balancing_policies.round_robin",
    ),
    (
        EnvoyLb::Random,
        "RANDOM",
        "envoy.load_balancing_policies.random",
    ),
    (
        EnvoyLb::LeastRequest,
        "LEAST_REQUEST",
        "envoy.load_balancing_policies.least_request",
    ),
];

impl EnvoyLb {
    /// The cluster's `lb_policy` value.
    pub fn lb_policy(self) -> &'static str {
        ENVOY_LBS
            .iter()
            .find(|(lb, ..)| *lb == self)
            .map_or("", |(_, name, _)| name)
    }

    fn from_lb_policy(name: &str) -> Option<EnvoyLb> {
        ENVOY_LBS
            .iter()
            .find(|(_, n, _)| *n == name)
            .map(|(lb, ..)| *lb)
    }

    fn from_extension(name: &str) -> Option<EnvoyLb> {
        ENVOY_LBS
            .iter()
            .find(|(.., ext)| *ext == name)
            .map(|(lb, ..)| *lb)
    }
}

/// How a cluster picks a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LbPolicy {
    /// `lb_policy`, no `load_balancing_policy`.
    Envoy(EnvoyLb),
    /// `override_host`: the address in request header `header`, else `fallback`.
    OverrideHost { header: String, fallback: EnvoyLb },
}

impl fmt::Display for LbPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LbPolicy::Envoy(lb) => f.write_str(lb.lb_policy()),
            LbPolicy::OverrideHost { header, fallback } => write!(
                f,
                "override_host({header}, fallback {})",
                fallback.lb_policy()
            ),
        }
    }
}

view!(
    /// `static_resources.clusters[name=...]`.
    Cluster
);

impl Cluster<'_> {
    /// The addresses of every endpoint, in every locality group.
    pub fn endpoints(&self) -> Result<Vec<SocketAddr>> {
        let groups = self.get("load_assignment.endpoints")?;
        let mut out = Vec::new();
        for (g, group) in groups.as_array().into_iter().flatten().enumerate() {
            for (e, endpoint) in group
                .get("lb_endpoints")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let at = format!("load_assignment.endpoints[{g}].lb_endpoints[{e}].endpoint.address.socket_address");
                let ip = endpoint
                    .pointer("/endpoint/address/socket_address/address")
                    .and_then(Value::as_str);
                let port = endpoint
                    .pointer("/endpoint/address/socket_address/port_value")
                    .and_then(Value::as_u64);
                let addr = ip
                    .zip(port)
                    .and_then(|(ip, port)| format!("{}:{port}", bracket(ip)).parse().ok());
                out.push(addr.ok_or_else(|| self.error(&at, "not an IP address and port"))?);
            }
        }
        Ok(out)
    }

    /// Replaces the endpoints. The cluster must have one locality group (a config with several
    /// says which endpoint goes where, which a flat list cannot); each new endpoint is a copy of
    /// the group's first one with its address changed, so per-endpoint settings carry over.
    pub fn set_endpoints(&mut self, addrs: &[SocketAddr]) -> Result<&mut Self> {
        let groups = self
            .get("load_assignment.endpoints")?
            .as_array()
            .map_or(0, Vec::len);
        if groups != 1 {
            return Err(self.error(
                "load_assignment.endpoints",
                format!("{groups} locality groups, set_endpoints needs exactly one"),
            ));
        }
        let template = self
            .get("load_assignment.endpoints[0].lb_endpoints[0]")?
            .clone();
        let list: Vec<Value> = addrs
            .iter()
            .map(|a| {
                let mut e = template.clone();
                if let Some(s) = e.pointer_mut("/endpoint/address/socket_address") {
                    s["address"] = json!(a.ip().to_string());
                    s["port_value"] = json!(a.port());
                }
                e
            })
            .collect();
        self.set("load_assignment.endpoints[0].lb_endpoints", list)?;
        // The template must have had the address where it was read from.
        self.endpoints()?;
        Ok(self)
    }

    /// Endpoints from `eds`'s file instead of the config (`type: EDS`, `eds_cluster_config`
    /// with a `path_config_source` watching its directory), so they can change while Envoy runs.
    /// Everything else of the cluster (its load-balancing policy, per-endpoint stats, timeouts)
    /// stays as it is. Envoy also needs a bootstrap node id to read the file:
    /// [`EnvoyConfig::use_eds_file`](super::EnvoyConfig::use_eds_file) does both.
    pub fn use_eds_file(&mut self, eds: &EdsFile) -> Result<&mut Self> {
        let name = self.get_str("name")?.to_string();
        if eds.cluster() != name {
            return Err(self.error(
                "name",
                format!("the EDS file is for cluster {:?}", eds.cluster()),
            ));
        }
        if self.get("load_assignment").is_ok() {
            self.remove("load_assignment")?;
        }
        self.upsert("type", "EDS")?;
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        self.upsert(
            "eds_cluster_config",
            json!({"eds_config": {"path_config_source": {"path": path(&eds.path()), "watched_directory": {"path": path(&eds.watched_dir())}}}}),
        )?;
        Ok(self)
    }

    /// How the cluster picks a host now.
    pub fn lb_policy(&self) -> Result<LbPolicy> {
        if self.get("load_balancing_policy").is_err() {
            let name = self
                .get("lb_policy")
                .ok()
                .and_then(Value::as_str)
                .unwrap_or("ROUND_ROBIN");
            return EnvoyLb::from_lb_policy(name)
                .map(LbPolicy::Envoy)
                .ok_or_else(|| {
                    self.error("lb_policy", format!("{name} is not one this harness knows"))
                });
        }
        let name = self.get_str(&format!("{POLICY}.name"))?;
        if name != OVERRIDE_HOST {
            return Err(self.error(
                &format!("{POLICY}.name"),
                format!("expected {OVERRIDE_HOST}, found {name}"),
            ));
        }
        let header = self
            .get_str(&format!(
                "{POLICY}.typed_config.override_host_sources[0].header"
            ))?
            .to_string();
        let fallback_at = format!(
            "{POLICY}.typed_config.fallback_policy.policies[0].typed_extension_config.name"
        );
        let fallback_name = self.get_str(&fallback_at)?;
        let fallback = EnvoyLb::from_extension(fallback_name)
            .ok_or_else(|| self.error(&fallback_at, format!("unknown fallback {fallback_name}")))?;
        Ok(LbPolicy::OverrideHost { header, fallback })
    }

    /// One of Envoy's own balancers instead of whatever the cluster had: `lb_policy` set,
    /// `load_balancing_policy` gone.
    pub fn use_envoy_lb(&mut self, lb: EnvoyLb) -> Result<&mut Self> {
        if self.get("load_balancing_policy").is_ok() {
            self.remove("load_balancing_policy")?;
        }
        self.upsert("lb_policy", lb.lb_policy())?;
        Ok(self)
    }

    /// Envoy's ORCA-driven balancer instead of whatever the cluster had:
    /// `client_side_weighted_round_robin`, weighing each host by the `rps_fractional` and
    /// utilisation its responses report (`endpoint-load-metrics`), with `blackout_period` and
    /// `weight_update_period` as given (Envoy's defaults are 10 s and 1 s).
    pub fn use_client_side_wrr(
        &mut self,
        blackout: &str,
        weight_update_period: &str,
    ) -> Result<&mut Self> {
        const CSWRR: &str = "envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin";
        if self.get("lb_policy").is_ok() {
            self.remove("lb_policy")?;
        }
        let policy = json!({"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.client_side_weighted_round_robin",
            "typed_config": {
                "@type": format!("type.googleapis.com/{CSWRR}"),
                "blackout_period": blackout,
                "weight_update_period": weight_update_period,
            },
        }}]});
        self.upsert("load_balancing_policy", policy)?;
        Ok(self)
    }

    /// Talk HTTP/2 to the endpoints (h2c: prior knowledge, no TLS), as a gRPC cluster must:
    /// `typed_extension_protocol_options` with `explicit_http_config.http2_protocol_options`.
    /// Requests to one endpoint then share a connection per Envoy worker, multiplexed.
    pub fn use_http2(&mut self) -> Result<&mut Self> {
        const OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
        let options = json!({
            OPTIONS: {
                "@type": format!("type.googleapis.com/{OPTIONS}"),
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        });
        self.upsert("typed_extension_protocol_options", options)?;
        Ok(self)
    }

    /// The request header `override_host` reads (it must be the plugin's `override_header`).
    pub fn set_override_header(&mut self, header: &str) -> Result<&mut Self> {
        self.lb_policy()?;
        self.set(
            &format!("{POLICY}.typed_config.override_host_sources[0].header"),
            header,
        )?;
        Ok(self)
    }
}

/// `::1` -> `[::1]`, for parsing `IP:port`.
fn bracket(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    }
}
