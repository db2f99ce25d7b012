//! `steered_clusters` and `clusters`: which Envoy clusters the plugin may steer, and the static
//! endpoints of some.

use std::net::SocketAddr;

use serde::Serialize;

use super::error::err;
use super::json::quoted;
use super::ConfigError;
use crate::map::{Map, Set};

/// `steered_clusters` entry that matches every cluster (the default).
pub(crate) const ANY_CLUSTER: &str = "*";

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClusterConfig {
    /// `IP:port` of each endpoint, as Envoy names them in `upstream.address`.
    pub endpoints: Vec<String>,
}

json_struct!(ClusterConfig { endpoints });

/// The compiled `steered_clusters`: exact names, and prefixes (an entry ending in `*`).
///
/// Istio names clusters `outbound|PORT|SUBSET|FQDN` and Envoy Gateway `httproute/NS/NAME/rule/N`,
/// so an exact name or a prefix says everything an operator needs; a regex would be one more
/// language to get wrong in a list that decides where Envoy obeys the plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SteeredClusters {
    exact: Set<String>,
    prefixes: Vec<String>,
    /// Every entry as configured, in order, without repeats.
    pub(super) listed: Vec<String>,
}

impl SteeredClusters {
    pub(super) fn compile(entries: &[String]) -> Result<SteeredClusters, ConfigError> {
        let mut set = SteeredClusters::default();
        for (i, entry) in entries.iter().enumerate() {
            let field = || format!("steered_clusters[{i}]");
            let (name, is_prefix) = match entry.strip_suffix('*') {
                Some(prefix) => (prefix, true),
                None => (entry.as_str(), false),
            };
            if name.contains('*') {
                return Err(err(
                    field(),
                    format!("`*` may only end a prefix, got {}", quoted(entry)),
                ));
            }
            if !is_prefix && name.is_empty() {
                return Err(err(
                    field(),
                    "must be a cluster name or a prefix ending in `*`, got \"\"",
                ));
            }
            if name.chars().any(char::is_whitespace) {
                return Err(err(
                    field(),
                    format!("cluster names have no white space, got {}", quoted(entry)),
                ));
            }
            if is_prefix {
                set.prefixes.push(name.to_owned());
            } else {
                set.exact.insert(name.to_owned());
            }
            if !set.listed.contains(entry) {
                set.listed.push(entry.clone());
            }
        }
        Ok(set)
    }

    /// Whether `cluster` is listed, by name or by prefix.
    pub fn contains(&self, cluster: &str) -> bool {
        self.exact.contains(cluster)
            || self
                .prefixes
                .iter()
                .any(|p| cluster.starts_with(p.as_str()))
    }
}

pub(super) fn compile_clusters(
    clusters: Map<String, ClusterConfig>,
    max_hosts: usize,
    steered: &SteeredClusters,
) -> Result<Map<String, Vec<String>>, ConfigError> {
    for (name, cluster) in &clusters {
        if name.is_empty() {
            return Err(err("clusters", "cluster names must not be empty"));
        }
        if !steered.contains(name) {
            return Err(err(
                format!("clusters.{name}"),
                "has static endpoints but is not in steered_clusters: the plugin would never steer it",
            ));
        }
        if cluster.endpoints.len() > max_hosts {
            return Err(err(
                format!("clusters.{name}.endpoints"),
                format!(
                    "{} endpoints, more than max_hosts_per_cluster ({max_hosts})",
                    cluster.endpoints.len()
                ),
            ));
        }
        for (i, endpoint) in cluster.endpoints.iter().enumerate() {
            let Ok(addr) = endpoint.parse::<SocketAddr>() else {
                return Err(err(
                    format!("clusters.{name}.endpoints[{i}]"),
                    format!("must be IP:port, got {}", quoted(endpoint)),
                ));
            };
            // Hosts are matched by the text Envoy gives (`upstream.address`), which is the
            // canonical form: `[0:0::1]:80` would never match Envoy's `[::1]:80`.
            let canonical = addr.to_string();
            if canonical != *endpoint {
                return Err(err(
                    format!("clusters.{name}.endpoints[{i}]"),
                    format!(
                        "must be written as Envoy writes the address, {}, got {}",
                        quoted(&canonical),
                        quoted(endpoint)
                    ),
                ));
            }
        }
    }
    // Sorted like a record's hosts, so a refresh matches them in one walk.
    Ok(clusters
        .into_iter()
        .map(|(name, mut c)| {
            c.endpoints.sort_unstable();
            c.endpoints.dedup();
            (name, c.endpoints)
        })
        .collect())
}
