//! Envoy's own health of the hosts, as its admin endpoint `/clusters` states it.
//!
//! Envoy's `override_host` policy sends a request to the host its header names whatever that
//! host's health: a host Envoy's active health checks (or its EDS health, or its own outlier
//! detection) marked unhealthy still gets every pick (Envoy 1.40's `findHost` looks the address
//! up among all hosts and does not check the status). The plugin has no property that says a
//! host's health, so, when `envoy_health.admin_cluster` names a cluster pointing at Envoy's admin
//! address, each VM asks `/clusters` every `poll_interval_ms` and leaves the hosts marked there
//! out of its pick table until Envoy marks them healthy again.
//!
//! `/clusters` prints one line per fact: `CLUSTER::ADDRESS::health_flags::FLAGS`, where FLAGS is
//! `healthy` or a list such as `/failed_active_hc/active_hc_timeout`. Host-free: the text in,
//! the unhealthy addresses of each cluster out.

use crate::map::{Map, Set};

/// Flags under which Envoy's own load balancers take no traffic to the host.
const UNHEALTHY_FLAGS: [&str; 3] = [
    "failed_active_hc",
    "failed_eds_health",
    "failed_outlier_check",
];

const HEALTH_FLAGS: &str = "::health_flags::";
/// Envoy's flag of a host whose first active check has not answered yet.
const PENDING_FIRST_CHECK: &str = "pending_active_hc";

/// The hosts `/clusters` reports unhealthy, by cluster, for the clusters `wanted` accepts. Lines
/// that are not health flags, or that do not parse, are skipped.
pub fn unhealthy_hosts(text: &[u8], wanted: impl Fn(&str) -> bool) -> Map<String, Set<String>> {
    let mut out: Map<String, Set<String>> = Map::default();
    let text = String::from_utf8_lossy(text);
    for line in text.lines() {
        let Some((head, flags)) = line.rsplit_once(HEALTH_FLAGS) else {
            continue;
        };
        // Cluster names have no `::` (Envoy's own separator here); addresses may (IPv6, in
        // brackets), so the cluster is everything before the first one.
        let Some((cluster, address)) = head.split_once("::") else {
            continue;
        };
        if cluster.is_empty() || address.is_empty() || !wanted(cluster) {
            continue;
        }
        // A host Envoy has not checked yet (just added by EDS) carries `failed_active_hc` beside
        // `pending_active_hc`: it is new, not failing, and the picks may find it at once.
        let mut flags = flags.split('/').map(str::trim);
        let unhealthy = flags.clone().any(|flag| UNHEALTHY_FLAGS.contains(&flag))
            && !flags.any(|flag| flag == PENDING_FIRST_CHECK);
        let hosts = out.entry(cluster.to_owned()).or_default();
        if unhealthy {
            hosts.insert(address.to_owned());
        }
    }
    out
}
