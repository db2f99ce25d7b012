//! `health_paths`, `management` and `excluded_paths`: the path rules as written, and their
//! compiled form ([`Rules`]: normalised paths, parsed networks).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use super::json::quoted;
use super::ConfigError;
use crate::rules::{normalize, CompiledSet, Rules, MAX_DECODINGS};

/// Paths by exact match or by prefix. A prefix matches whole segments, as Envoy's route
/// `path_separated_prefix` does: `/a` matches `/a` and `/a/b`, not `/ab`. Neither kind cares
/// whether the request adds a trailing slash: backends (Spring's trailing-slash match, a
/// directory index) serve `/a/` as `/a`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PathSet {
    pub exact: Vec<String>,
    pub prefix: Vec<String>,
}

impl PathSet {
    fn of(exact: &[&str], prefix: &[&str]) -> Self {
        PathSet {
            exact: exact.iter().map(|s| s.to_string()).collect(),
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefix.is_empty()
    }
}

/// `management` in the plugin configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ManagementConfig {
    pub paths: PathSet,
    /// Networks (CIDR, or a bare address) whose clients may reach management paths. The client
    /// is Envoy's `source.address`: the peer, or with `xff_num_trusted_hops` set on Envoy's
    /// connection manager the address those trusted proxies reported (docs/threat-model.md).
    pub allowed_cidrs: Vec<String>,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            paths: PathSet::of(&[], &["/actuator"]),
            // Loopback only: behind a load balancer or NAT with a private address, every client
            // would be "internal". Operators list their own internal ranges (docs/configuration.md).
            allowed_cidrs: vec!["127.0.0.0/8".to_string(), "::1/128".to_string()],
        }
    }
}

json_struct!(PathSet { exact, prefix });
json_struct!(ManagementConfig {
    paths,
    allowed_cidrs
});

pub(crate) fn default_health_paths() -> PathSet {
    PathSet::of(
        &[
            "/health", "/healthz", "/livez", "/readyz", "/ready", "/status", "/ping",
        ],
        &["/actuator/health"],
    )
}

/// Compiles the path rules: every path normalised and checked, every network parsed. Public for
/// the rules' properties, which need rules no `Config` would accept (every path a probe).
pub fn compile_rules(
    health: &PathSet,
    management: &ManagementConfig,
    excluded: &PathSet,
) -> Result<Rules, ConfigError> {
    let allowed = management
        .allowed_cidrs
        .iter()
        .enumerate()
        .map(|(i, cidr)| {
            parse_network(cidr).ok_or_else(|| ConfigError {
                field: format!("management.allowed_cidrs[{i}]"),
                message: format!(
                    "must be a CIDR such as 10.0.0.0/8 or an IP address, got {}",
                    quoted(cidr)
                ),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rules = Rules {
        health: compile_set("health_paths", health)?,
        management: compile_set("management.paths", &management.paths)?,
        excluded: compile_set("excluded_paths", excluded)?,
        allowed,
    };
    check_guarded_paths(&rules.management, &management.paths)?;
    Ok(rules)
}

fn compile_set(field: &str, set: &PathSet) -> Result<CompiledSet, ConfigError> {
    let check = |kind: &str, paths: &[String]| -> Result<Vec<Vec<u8>>, ConfigError> {
        paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let error = |message| ConfigError { field: format!("{field}.{kind}[{i}]"), message };
                if !p.starts_with('/') || p.len() > MAX_RULE_PATH {
                    return Err(error(format!("must start with '/' and be at most {MAX_RULE_PATH} bytes, got {}", quoted(p))));
                }
                let normal = normalize(p);
                if normal.is_ambiguous() {
                    // It could never match: an ambiguous request path is guarded before any rule.
                    return Err(error(format!(
                        "must not hold a backslash, an encoded separator or dot segment, a control byte, or an escape left after {MAX_DECODINGS} decodings, got {}",
                        quoted(p)
                    )));
                }
                Ok(normal.into_bytes().into_owned())
            })
            .collect()
    };
    Ok(CompiledSet {
        exact: check("exact", &set.exact)?,
        prefix: check("prefix", &set.prefix)?,
    })
}

const MAX_RULE_PATH: usize = 1024;

/// A guarded path with a trailing slash guards what lies under it but not itself: a prefix
/// `/actuator/` leaves `/actuator`, which Spring answers with the list of every endpoint.
fn check_guarded_paths(compiled: &CompiledSet, written: &PathSet) -> Result<(), ConfigError> {
    let kinds = [
        ("exact", &compiled.exact, &written.exact),
        ("prefix", &compiled.prefix, &written.prefix),
    ];
    for (kind, normal, raw) in kinds {
        for (i, (path, p)) in normal.iter().zip(raw).enumerate() {
            let Some(bare) = path.strip_suffix(b"/").filter(|b| !b.is_empty()) else {
                continue;
            };
            let bare = String::from_utf8_lossy(bare);
            let covers = match kind {
                "exact" => "an exact path matches with or without a trailing slash",
                _ => "a prefix matches whole segments, so it covers everything under it",
            };
            return Err(ConfigError {
                field: format!("management.paths.{kind}[{i}]"),
                message: format!(
                    "must not end in '/', which would leave {} itself unguarded (write {}: {covers}), got {}",
                    quoted(&bare),
                    quoted(&bare),
                    quoted(p)
                ),
            });
        }
    }
    Ok(())
}

fn parse_network(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}
