//! The load-balancing policies a benchmark compares, and the Envoy config of each: the shipped
//! envoy-config/envoy.yaml with the policy's edits (harness::config), so what the bench measures
//! is what ships.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use harness::config::{EnvoyLb, CLUSTER, LISTENER};
use harness::load::UPSTREAM_HOST_HEADER;
use harness::{free_port, EnvoyConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// The plugin with the scenario's configuration, as envoy-config/envoy.yaml runs it (it is
    /// that file, see [`Policy::envoy_config`]).
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

    /// Envoy's own balancer this policy is, `None` for the plugin's.
    pub fn envoy_lb(self) -> Option<EnvoyLb> {
        match self {
            Policy::RoundRobin => Some(EnvoyLb::RoundRobin),
            Policy::Random => Some(EnvoyLb::Random),
            Policy::LeastRequest => Some(EnvoyLb::LeastRequest),
            Policy::EwmaLb | Policy::EwmaLowest => None,
        }
    }

    /// The Envoy config this policy runs: envoy-config/envoy.yaml as it ships, in front of
    /// `endpoints` on a free port, with
    /// - Envoy's own policies: the policy swap (the cluster's `lb_policy`, no plugin);
    /// - the plugin's: the plugin configuration [`Policy::plugin_config`] makes of the scenario's,
    ///   the module `wasm`, and `override_host` reading the header that configuration names;
    /// - every policy: the bench's observation edits ([`observe`]).
    pub fn envoy_config(self, scenario_config: &Value, wasm: &Path, endpoints: &[SocketAddr], route_timeout: Duration) -> Result<EnvoyConfig> {
        let mut config = EnvoyConfig::local(free_port()?, wasm)?;
        config.cluster(CLUSTER)?.set_endpoints(endpoints)?;
        if let Some(lb) = self.envoy_lb() {
            config.use_envoy_lb(CLUSTER, lb)?;
        }
        if let Some(plugin_config) = self.plugin_config(scenario_config) {
            config.plugin()?.set_plugin_config(&serde_json::to_string(&plugin_config)?)?;
            if let Some(header) = plugin_config.get("override_header").and_then(Value::as_str) {
                config.cluster(CLUSTER)?.set_override_header(header)?;
            }
        }
        observe(&mut config, route_timeout)?;
        Ok(config)
    }

    /// The plugin configuration this policy runs with: the scenario's, plus the naive pick for
    /// [`Policy::EwmaLowest`]. `None` for Envoy's own policies.
    pub fn plugin_config(self, scenario_config: &Value) -> Option<Value> {
        match self {
            Policy::EwmaLb => Some(scenario_config.clone()),
            Policy::EwmaLowest => {
                let mut c = scenario_config.clone();
                if let Some(map) = c.as_object_mut() {
                    map.insert("pick".into(), Value::String("lowest_latency".into()));
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

/// `--wasm FILE`, else the plugin ./wasm-build.sh leaves; an error naming the fix when it is
/// missing.
pub fn plugin_module(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        None => harness::plugin_wasm(),
        Some(file) if file.is_file() => Ok(file.canonicalize().unwrap_or_else(|_| file.to_path_buf())),
        Some(file) => bail!("plugin {} (--wasm) not found", file.display()),
    }
}

/// The bench's own edits, the same for every policy: they change what is observed, not how a
/// host is chosen.
/// - the route timeout is the scenario's (seed-table's 1.64 s makes round robin's error rate the
///   seed's 12 %);
/// - responses name the upstream host (`x-upstream-host: %UPSTREAM_HOST%`), so a 504 Envoy sends
///   on the route timeout still counts against the host that was too slow.
pub fn observe(config: &mut EnvoyConfig, route_timeout: Duration) -> Result<()> {
    let mut route = config.listener(LISTENER)?.http()?.route_to(CLUSTER)?;
    route.set_timeout(route_timeout)?;
    route.add_response_header(UPSTREAM_HOST_HEADER, "%UPSTREAM_HOST%")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use harness::config::LbPolicy;
    use serde_json::json;

    use super::*;

    fn endpoints() -> Vec<SocketAddr> {
        vec!["127.0.0.1:8081".parse().unwrap(), "127.0.0.1:8082".parse().unwrap()]
    }

    /// The config `policy` runs with for a scenario's plugin configuration.
    fn config(policy: Policy, scenario_config: Value) -> EnvoyConfig {
        policy.envoy_config(&scenario_config, Path::new("/d/ewma_lb.wasm"), &endpoints(), Duration::from_millis(1640)).unwrap()
    }

    #[test]
    fn envoy_policies_are_the_shipped_config_with_the_policy_swapped() {
        let mut c = config(Policy::LeastRequest, json!({}));
        assert_eq!(c.cluster(CLUSTER).unwrap().lb_policy().unwrap(), LbPolicy::Envoy(EnvoyLb::LeastRequest));
        assert!(c.plugin().is_err(), "no plugin");
        assert_eq!(c.cluster(CLUSTER).unwrap().endpoints().unwrap(), endpoints());
        let route = c.listener(LISTENER).unwrap().http().unwrap().route_to(CLUSTER).unwrap().value().clone();
        assert_eq!(route["route"]["timeout"], "1.64s");
        assert_eq!(route["response_headers_to_add"], json!([{"header": {"key": "x-upstream-host", "value": "%UPSTREAM_HOST%"}}]));
        // What ships with the plugin stays for every policy.
        let hcm = c.listener(LISTENER).unwrap().http().unwrap().value().clone();
        assert_eq!((hcm["use_remote_address"].clone(), hcm["normalize_path"].clone(), hcm["merge_slashes"].clone()), (json!(true), json!(true), json!(true)));
        assert!(c.get("stats_config.stats_tags").is_ok());
        assert_eq!(route["route"]["retry_policy"]["retry_on"], "connect-failure,reset-before-request");
    }

    #[test]
    fn plugin_policies_carry_the_scenario_config_and_override_host() {
        let mut c = config(Policy::EwmaLowest, json!({"weights": {"exponent": 3.0}}));
        assert_eq!(c.plugin().unwrap().plugin_config().unwrap(), r#"{"pick":"lowest_latency","weights":{"exponent":3.0}}"#);
        assert_eq!(c.plugin().unwrap().module_file().unwrap(), "/d/ewma_lb.wasm");
        assert_eq!(
            c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
            LbPolicy::OverrideHost { header: "x-ewma-lb-host".into(), fallback: EnvoyLb::LeastRequest }
        );
        let mut c = config(Policy::EwmaLb, json!({"override_header": "x-other"}));
        assert!(matches!(c.cluster(CLUSTER).unwrap().lb_policy().unwrap(), LbPolicy::OverrideHost { header, .. } if header == "x-other"));
    }

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>().unwrap(), p);
        }
        assert!("fastest".parse::<Policy>().is_err());
    }
}
