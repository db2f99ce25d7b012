//! The load-balancing policies a benchmark compares, and the Envoy config of each: the shipped
//! envoy-config/envoy.yaml with the policy's edits (harness::config), so what the bench measures
//! is what ships.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use harness::config::{EnvoyLb, CLUSTER, LISTENER};
use harness::load::UPSTREAM_HOST_HEADER;
use harness::EnvoyConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which balancer a policy runs: one of Envoy's own, or the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balancer {
    /// Envoy's `lb_policy: ROUND_ROBIN`.
    RoundRobin,
    /// Envoy's `lb_policy: RANDOM`.
    Random,
    /// Envoy's `lb_policy: LEAST_REQUEST` (power of two choices by active requests).
    LeastRequest,
    /// Envoy's `client_side_weighted_round_robin`: weights from the backends' ORCA reports, with
    /// `blackout_period` and `weight_update_period` of 1 s.
    ClientSideWrr,
    /// The plugin, as envoy-config/envoy.yaml runs it, with a plugin configuration.
    Plugin,
}

/// One way of choosing the upstream host, by name: Envoy's balancers, the plugin with the
/// scenario's configuration, and variants of the plugin that change a few settings on top of it
/// (so two settings run against the same backends in the same run).
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    name: String,
    balancer: Balancer,
    /// Merged over the scenario's plugin configuration ([`merge`]); `{}` for none.
    overrides: Value,
}

/// The plugin's defaults before this round's changes (issue 11), as a plugin configuration: the
/// `ewma_lb_previous` variant runs them beside `ewma_lb`. bench/README.md, "Defaults", says
/// what changed and why.
pub fn previous_defaults() -> Value {
    serde_json::json!({
        "smoothing": {"algorithm": "peak_ewma", "tau_ms": 2000, "peak_samples": 1},
        "weights": {"exponent": 2.0, "noise_gain": 1.0},
    })
}

impl Policy {
    /// The built-in policies, in the default order of a comparison.
    pub const DEFAULT: [&'static str; 5] = [
        "round_robin",
        "random",
        "least_request",
        "ewma_lb",
        "ewma_lowest",
    ];
    /// Every built-in name ([`Policy::builtin`]).
    pub const BUILTIN: [&'static str; 7] = [
        "round_robin",
        "random",
        "least_request",
        "client_side_weighted_round_robin",
        "ewma_lb",
        "ewma_lowest",
        "ewma_lb_previous",
    ];

    /// A built-in policy:
    /// - `round_robin`, `random`, `least_request`: Envoy's own balancers;
    /// - `ewma_lb`: the plugin with the scenario's configuration;
    /// - `ewma_lowest`: the same with `"pick": "lowest_latency"`, always the host of lowest EWMA
    ///   (the naive balancer the seeds warn about);
    /// - `ewma_lb_previous`: the same with the previous defaults ([`previous_defaults`]).
    pub fn builtin(name: &str) -> Option<Policy> {
        let envoy = |balancer| {
            Some(Policy {
                name: name.to_owned(),
                balancer,
                overrides: Value::Object(Default::default()),
            })
        };
        match name {
            "round_robin" => envoy(Balancer::RoundRobin),
            "random" => envoy(Balancer::Random),
            "least_request" => envoy(Balancer::LeastRequest),
            "client_side_weighted_round_robin" => envoy(Balancer::ClientSideWrr),
            "ewma_lb" => Policy::variant(name, serde_json::json!({})),
            "ewma_lowest" => Policy::variant(name, serde_json::json!({"pick": "lowest_latency"})),
            "ewma_lb_previous" => Policy::variant(name, previous_defaults()),
            _ => None,
        }
    }

    /// [`Policy::builtin`], as an error naming the policy when there is none of that name.
    pub fn get(name: &str) -> Result<Policy> {
        Policy::builtin(name).with_context(|| format!("no built-in policy {name:?}"))
    }

    /// The plugin with `overrides` merged over the scenario's configuration; `None` unless
    /// `overrides` is a JSON object.
    pub fn variant(name: &str, overrides: Value) -> Option<Policy> {
        overrides.is_object().then(|| Policy {
            name: name.to_owned(),
            balancer: Balancer::Plugin,
            overrides,
        })
    }

    /// The built-in policy `name`, or the variant of that name in `variants` (a scenario's
    /// `[variants.NAME]` tables).
    pub fn named(name: &str, variants: &serde_json::Map<String, Value>) -> Result<Policy> {
        let name = name.trim();
        if let Some(p) = Policy::builtin(name) {
            return Ok(p);
        }
        match variants.get(name) {
            Some(overrides) => Policy::variant(name, overrides.clone()).with_context(|| format!("variant {name}: must be a table")),
            None => bail!(
                "unknown policy {name:?}: not one of {} nor a [variants.{name}] table of the scenario",
                Policy::BUILTIN.join(", ")
            ),
        }
    }

    /// A variant given on the command line as `NAME=JSON` or `NAME=@FILE` (a JSON object of
    /// settings, such as ewma-lb-tune writes).
    pub fn from_arg(arg: &str) -> Result<Policy> {
        let Some((name, value)) = arg.split_once('=') else {
            bail!("--variant {arg:?}: expected NAME=JSON or NAME=@FILE");
        };
        let name = name.trim();
        if name.is_empty() || Policy::builtin(name).is_some() {
            bail!("--variant {arg:?}: the name must be new, not empty nor a built-in policy's");
        }
        let text = match value.strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("--variant {name}: reading {file}"))?,
            None => value.to_owned(),
        };
        let overrides: Value =
            serde_json::from_str(&text).with_context(|| format!("--variant {name}: not JSON"))?;
        Policy::variant(name, overrides)
            .with_context(|| format!("--variant {name}: must be a JSON object"))
    }

    /// The policies named in `names`, each the one of that name in `known` (a scenario's list,
    /// which holds its variants) or else a built-in one; an error names a policy that is neither.
    pub fn select(known: &[Policy], names: &[String]) -> Result<Vec<Policy>> {
        names
            .iter()
            .map(|n| {
                known
                    .iter()
                    .find(|p| p.name() == n)
                    .cloned()
                    .map_or_else(|| Policy::get(n), Ok)
            })
            .collect()
    }

    /// The default policies of a comparison.
    pub fn defaults() -> Vec<Policy> {
        Policy::DEFAULT
            .iter()
            .filter_map(|n| Policy::builtin(n))
            .collect()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin settings this policy merges over the scenario's.
    pub fn overrides(&self) -> &Value {
        &self.overrides
    }

    pub fn balancer(&self) -> Balancer {
        self.balancer
    }

    /// Whether this policy runs the plugin.
    pub fn uses_plugin(&self) -> bool {
        self.balancer == Balancer::Plugin
    }

    /// Envoy's own balancer this policy is, `None` for the plugin's.
    pub fn envoy_lb(&self) -> Option<EnvoyLb> {
        match self.balancer {
            Balancer::RoundRobin => Some(EnvoyLb::RoundRobin),
            Balancer::Random => Some(EnvoyLb::Random),
            Balancer::LeastRequest => Some(EnvoyLb::LeastRequest),
            Balancer::ClientSideWrr | Balancer::Plugin => None,
        }
    }

    /// The Envoy config this policy runs: envoy-config/envoy.yaml as it ships, in front of
    /// `endpoints` on a free port, with
    /// - Envoy's own policies: the policy swap (the cluster's `lb_policy`, no plugin);
    /// - the plugin's: the plugin configuration [`Policy::plugin_config`] makes of the scenario's,
    ///   the module `wasm`, and `override_host` reading the header that configuration names;
    /// - every policy: the bench's observation edits ([`observe`]).
    pub fn envoy_config(
        &self,
        scenario_config: &Value,
        wasm: &Path,
        endpoints: &[SocketAddr],
        route_timeout: Duration,
    ) -> Result<EnvoyConfig> {
        // The listener's port is Envoy's choice: read it back with `Envoy::listener_addr`.
        let mut config = EnvoyConfig::local(0, wasm)?;
        config.cluster(CLUSTER)?.set_endpoints(endpoints)?;
        if let Some(lb) = self.envoy_lb() {
            config.use_envoy_lb(CLUSTER, lb)?;
        }
        if self.balancer == Balancer::ClientSideWrr {
            // 1 s each, so it is not handicapped against the plugin's 250 ms refresh (Envoy's
            // default blackout is 10 s).
            config.use_client_side_wrr(CLUSTER, "1s", "1s")?;
        }
        if let Some(plugin_config) = self.plugin_config(scenario_config) {
            config
                .plugin()?
                .set_plugin_config(&serde_json::to_string(&plugin_config)?)?;
            if let Some(header) = plugin_config.get("override_header").and_then(Value::as_str) {
                config.cluster(CLUSTER)?.set_override_header(header)?;
            }
        }
        observe(&mut config, route_timeout)?;
        Ok(config)
    }

    /// The plugin configuration this policy runs with: the scenario's with the policy's
    /// overrides merged over it. `None` for Envoy's own policies.
    pub fn plugin_config(&self, scenario_config: &Value) -> Option<Value> {
        self.uses_plugin().then(|| {
            let mut c = scenario_config.clone();
            merge(&mut c, &self.overrides);
            c
        })
    }
}

/// Merges `patch` into `base`: objects key by key (recursively), anything else replaces.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

impl Serialize for Policy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.name)
    }
}

/// `--wasm FILE`, else the plugin ./wasm-build.sh leaves; an error naming the fix when it is
/// missing.
pub fn plugin_module(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        None => harness::plugin_wasm(),
        Some(file) if file.is_file() => {
            Ok(file.canonicalize().unwrap_or_else(|_| file.to_path_buf()))
        }
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
        vec![
            "127.0.0.1:8081".parse().unwrap(),
            "127.0.0.1:8082".parse().unwrap(),
        ]
    }

    /// The config `policy` runs with for a scenario's plugin configuration.
    fn config(policy: Policy, scenario_config: Value) -> EnvoyConfig {
        policy
            .envoy_config(
                &scenario_config,
                Path::new("/d/ewma_lb.wasm"),
                &endpoints(),
                Duration::from_millis(1640),
            )
            .unwrap()
    }

    #[test]
    fn envoy_policies_are_the_shipped_config_with_the_policy_swapped() {
        let mut c = config(Policy::builtin("least_request").unwrap(), json!({}));
        assert_eq!(
            c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
            LbPolicy::Envoy(EnvoyLb::LeastRequest)
        );
        assert!(c.plugin().is_err(), "no plugin");
        assert_eq!(
            c.cluster(CLUSTER).unwrap().endpoints().unwrap(),
            endpoints()
        );
        let route = c
            .listener(LISTENER)
            .unwrap()
            .http()
            .unwrap()
            .route_to(CLUSTER)
            .unwrap()
            .value()
            .clone();
        assert_eq!(route["route"]["timeout"], "1.64s");
        assert_eq!(
            route["response_headers_to_add"],
            json!([{"header": {"key": "x-upstream-host", "value": "%UPSTREAM_HOST%"}}])
        );
        // What ships with the plugin stays for every policy.
        let hcm = c
            .listener(LISTENER)
            .unwrap()
            .http()
            .unwrap()
            .value()
            .clone();
        assert_eq!(
            (
                hcm["use_remote_address"].clone(),
                hcm["normalize_path"].clone(),
                hcm["merge_slashes"].clone()
            ),
            (json!(true), json!(true), json!(true))
        );
        assert!(c.get("stats_config.stats_tags").is_ok());
        assert_eq!(
            route["route"]["retry_policy"]["retry_on"],
            "connect-failure,reset-before-request"
        );
    }

    #[test]
    fn plugin_policies_carry_the_scenario_config_and_override_host() {
        let mut c = config(
            Policy::builtin("ewma_lowest").unwrap(),
            json!({"weights": {"exponent": 3.0}}),
        );
        assert_eq!(
            c.plugin().unwrap().plugin_config().unwrap(),
            r#"{"pick":"lowest_latency","weights":{"exponent":3.0}}"#
        );
        assert_eq!(
            c.plugin().unwrap().module_file().unwrap(),
            "/d/ewma_lb.wasm"
        );
        assert_eq!(
            c.cluster(CLUSTER).unwrap().lb_policy().unwrap(),
            LbPolicy::OverrideHost {
                header: "x-ewma-lb-host".into(),
                fallback: EnvoyLb::LeastRequest
            }
        );
        let mut c = config(
            Policy::builtin("ewma_lb").unwrap(),
            json!({"override_header": "x-other"}),
        );
        assert!(
            matches!(c.cluster(CLUSTER).unwrap().lb_policy().unwrap(), LbPolicy::OverrideHost { header, .. } if header == "x-other")
        );
    }

    #[test]
    fn policies_by_name_and_variants() {
        let none = serde_json::Map::new();
        for name in Policy::BUILTIN {
            assert_eq!(Policy::named(name, &none).unwrap().name(), name);
        }
        assert!(Policy::named("fastest", &none).is_err());
        let mut variants = serde_json::Map::new();
        variants.insert("slow_tau".into(), json!({"smoothing": {"tau_ms": 5000}}));
        let v = Policy::named("slow_tau", &variants).unwrap();
        assert!(v.uses_plugin());
        let scenario = json!({"smoothing": {"algorithm": "peak_ewma"}, "pick": "weighted_random"});
        assert_eq!(
            v.plugin_config(&scenario).unwrap(),
            json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 5000}, "pick": "weighted_random"})
        );
        assert_eq!(
            Policy::named("least_request", &variants)
                .unwrap()
                .plugin_config(&scenario),
            None
        );
    }

    #[test]
    fn a_command_line_variant_is_a_named_json_object() {
        let p = Policy::from_arg(r#"tuned={"smoothing": {"tau_ms": 5000}}"#).unwrap();
        assert_eq!(p.name(), "tuned");
        assert_eq!(p.overrides(), &json!({"smoothing": {"tau_ms": 5000}}));
        let file = std::env::temp_dir().join(format!("variant-{}.json", std::process::id()));
        std::fs::write(&file, r#"{"pick": "weighted_random"}"#).unwrap();
        let p = Policy::from_arg(&format!("from_file=@{}", file.display())).unwrap();
        let _ = std::fs::remove_file(&file);
        assert_eq!(p.overrides(), &json!({"pick": "weighted_random"}));
        for bad in [
            "tuned",
            "=",
            "ewma_lb={}",
            "least_request={}",
            "tuned=[1]",
            "tuned={",
        ] {
            assert!(Policy::from_arg(bad).is_err(), "{bad} accepted");
        }
    }
}
