//! The load-balancing policies a benchmark compares, and the Envoy config of each, rendered from
//! the templates in `bench/templates/`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::template::render;

const ENVOY_TEMPLATE: &str = include_str!("../templates/envoy.yaml");
const WASM_FILTER_TEMPLATE: &str = include_str!("../templates/wasm-filter.yaml");
const OVERRIDE_HOST_TEMPLATE: &str = include_str!("../templates/lb-override-host.yaml");
const ENDPOINT_TEMPLATE: &str = include_str!("../templates/endpoint.yaml");

/// Header the plugin sets by default (`override_header` in its configuration).
pub const DEFAULT_OVERRIDE_HEADER: &str = "x-ewma-lb-host";

/// One way of choosing the upstream host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Envoy's `lb_policy: ROUND_ROBIN`.
    RoundRobin,
    /// Envoy's `lb_policy: RANDOM`.
    Random,
    /// Envoy's `lb_policy: LEAST_REQUEST` (power of two choices by active requests).
    LeastRequest,
    /// The plugin with the scenario's configuration, as envoy-config/envoy.yaml runs it.
    EwmaLb,
    /// The plugin with `"pick": "lowest_latency"`: always the host of lowest EWMA (the naive
    /// balancer the seeds warn about).
    EwmaLowest,
}

impl Policy {
    /// All five, in the default order of a comparison.
    pub const ALL: [Policy; 5] = [Policy::RoundRobin, Policy::Random, Policy::LeastRequest, Policy::EwmaLb, Policy::EwmaLowest];

    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::Random => "random",
            Policy::LeastRequest => "least_request",
            Policy::EwmaLb => "ewma_lb",
            Policy::EwmaLowest => "ewma_lowest",
        }
    }

    /// Whether this policy runs the plugin.
    pub fn uses_plugin(self) -> bool {
        matches!(self, Policy::EwmaLb | Policy::EwmaLowest)
    }

    fn lb_policy(self) -> Option<&'static str> {
        match self {
            Policy::RoundRobin => Some("ROUND_ROBIN"),
            Policy::Random => Some("RANDOM"),
            Policy::LeastRequest => Some("LEAST_REQUEST"),
            Policy::EwmaLb | Policy::EwmaLowest => None,
        }
    }

    /// The plugin configuration this policy runs with: the scenario's, plus the naive pick for
    /// [`Policy::EwmaLowest`]. `None` for Envoy's own policies.
    pub fn plugin_config(self, scenario_config: &serde_json::Value) -> Option<serde_json::Value> {
        match self {
            Policy::EwmaLb => Some(scenario_config.clone()),
            Policy::EwmaLowest => {
                let mut c = scenario_config.clone();
                if let Some(map) = c.as_object_mut() {
                    map.insert("pick".into(), serde_json::Value::String("lowest_latency".into()));
                }
                Some(c)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Policy {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s.trim())
            .with_context(|| format!("unknown policy {s:?} (round_robin, random, least_request, ewma_lb, ewma_lowest)"))
    }
}

/// A wasm filter to put in front of the router.
#[derive(Clone, Debug)]
pub struct WasmFilter {
    /// Plugin name, root id and vm id.
    pub name: String,
    pub file: PathBuf,
    /// The plugin configuration (JSON text).
    pub config_json: String,
}

/// Everything that varies between the rendered Envoy configs.
#[derive(Clone, Debug)]
pub struct EnvoyConfig {
    pub admin_port: u16,
    pub listen_port: u16,
    pub route_timeout: Duration,
    pub endpoints: Vec<SocketAddr>,
    /// Envoy's own `lb_policy`, or `None` for the plugin's override_host policy.
    pub lb_policy: Option<&'static str>,
    /// The header override_host reads (only with `lb_policy: None`).
    pub override_header: String,
    pub wasm: Option<WasmFilter>,
}

impl EnvoyConfig {
    /// The config of `policy`: Envoy's `lb_policy` and no filter, or the plugin and override_host
    /// exactly as envoy-config/envoy.yaml runs them.
    pub fn for_policy(
        policy: Policy,
        plugin_config: &serde_json::Value,
        wasm_file: &Path,
        endpoints: &[SocketAddr],
        route_timeout: Duration,
    ) -> Result<EnvoyConfig> {
        let mut cfg = EnvoyConfig {
            admin_port: crate::free_port()?,
            listen_port: crate::free_port()?,
            route_timeout,
            endpoints: endpoints.to_vec(),
            lb_policy: policy.lb_policy(),
            override_header: DEFAULT_OVERRIDE_HEADER.into(),
            wasm: None,
        };
        if let Some(pc) = policy.plugin_config(plugin_config) {
            if let Some(h) = pc.get("override_header").and_then(|h| h.as_str()) {
                cfg.override_header = h.to_string();
            }
            cfg.wasm = Some(WasmFilter {
                name: "ewma_lb".into(),
                file: wasm_file.to_path_buf(),
                config_json: serde_json::to_string(&pc)?,
            });
        }
        Ok(cfg)
    }

    /// The bootstrap YAML.
    pub fn render(&self) -> Result<String> {
        let filters = match &self.wasm {
            None => String::new(),
            Some(w) => {
                let file = w.file.to_str().context("wasm path is not UTF-8")?;
                if file.contains(['"', '\n', '}', ',']) {
                    bail!("wasm path {file:?} has characters the YAML template cannot carry");
                }
                render(
                    WASM_FILTER_TEMPLATE,
                    &[
                        ("WASM_NAME", w.name.clone()),
                        ("WASM_FILE", file.to_string()),
                        // A JSON string literal is a valid YAML double-quoted scalar.
                        ("PLUGIN_JSON", serde_json::to_string(&w.config_json)?),
                    ],
                )?
            }
        };
        let lb = match self.lb_policy {
            Some(p) => format!("    lb_policy: {p}\n"),
            None => render(OVERRIDE_HOST_TEMPLATE, &[("OVERRIDE_HEADER", self.override_header.clone())])?,
        };
        let mut endpoints = String::new();
        for ep in &self.endpoints {
            if !ep.ip().is_loopback() {
                bail!("endpoint {ep} is not loopback");
            }
            endpoints.push_str(&render(ENDPOINT_TEMPLATE, &[("PORT", ep.port().to_string())])?);
        }
        render(
            ENVOY_TEMPLATE,
            &[
                ("ADMIN_PORT", self.admin_port.to_string()),
                ("LISTEN_PORT", self.listen_port.to_string()),
                ("ROUTE_TIMEOUT", format!("{:.3}s", self.route_timeout.as_secs_f64())),
                ("HTTP_FILTERS", filters.trim_end_matches('\n').to_string()),
                ("CLUSTER_LB", lb.trim_end_matches('\n').to_string()),
                ("ENDPOINTS", endpoints.trim_end_matches('\n').to_string()),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints() -> Vec<SocketAddr> {
        vec!["127.0.0.1:8081".parse().unwrap(), "127.0.0.1:8082".parse().unwrap()]
    }

    #[test]
    fn envoy_policies_set_lb_policy_and_no_filter() {
        let c = EnvoyConfig::for_policy(Policy::LeastRequest, &serde_json::json!({}), Path::new("/x.wasm"), &endpoints(), Duration::from_millis(1640)).unwrap();
        let y = c.render().unwrap();
        assert!(y.contains("lb_policy: LEAST_REQUEST"), "{y}");
        assert!(!y.contains("envoy.filters.http.wasm"));
        assert!(y.contains("timeout: 1.640s"), "{y}");
        assert!(y.contains("port_value: 8081") && y.contains("port_value: 8082"));
    }

    #[test]
    fn plugin_policies_carry_the_scenario_config_and_override_host() {
        let pc = serde_json::json!({"weights": {"exponent": 3.0}});
        let c = EnvoyConfig::for_policy(Policy::EwmaLowest, &pc, Path::new("/d/ewma_lb.wasm"), &endpoints(), Duration::from_secs(2)).unwrap();
        let y = c.render().unwrap();
        assert!(y.contains("override_host") && y.contains("- header: x-ewma-lb-host"), "{y}");
        assert!(y.contains(r#"value: "{\"pick\":\"lowest_latency\",\"weights\":{\"exponent\":3.0}}""#), "{y}");
        assert!(!y.contains("lb_policy:"));
    }

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        assert!("fastest".parse::<Policy>().is_err());
    }
}
