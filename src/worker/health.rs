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
//! The same page lists every host of the cluster, so the answer also tells the record of the
//! hosts no request has met yet: a scale-out's newcomers enter the table within a poll, where
//! otherwise each proxy waits until Envoy's own policy happens to send one of its requests
//! there (at a proxy's share of a large cluster's traffic, tens of seconds per host).
//!
//! `/clusters` prints one line per fact: `CLUSTER::ADDRESS::health_flags::FLAGS`, where FLAGS is
//! `healthy` or a list such as `/failed_active_hc/active_hc_timeout`. Host-free: the text in,
//! each cluster's hosts out.

use crate::map::{Map, Set};

/// Flags under which Envoy's own load balancers take no traffic to the host.
const UNHEALTHY_FLAGS: [&str; 3] = [
    "failed_active_hc",
    "failed_eds_health",
    "failed_outlier_check",
];

/// What precedes a host's flags, after its address.
const HEALTH_FLAGS: &str = "::health_flags";
/// Envoy's flag of a host whose first active check has not answered yet.
const PENDING_FIRST_CHECK: &str = "pending_active_hc";

/// What `/clusters` lists of one cluster's hosts, borrowing the page's addresses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListedHosts<'a> {
    /// The hosts listed and not marked unhealthy, in the page's order: in the cluster and taking
    /// traffic from Envoy's own balancers, so the table may know them before any request has met
    /// them (a scale-out's newcomers).
    pub serving: Vec<&'a str>,
    /// The hosts marked unhealthy.
    pub unhealthy: Set<String>,
}

impl ListedHosts<'_> {
    /// Hosts listed: the cluster's endpoints as Envoy holds them now.
    pub fn count(&self) -> u32 {
        u32::try_from(self.serving.len() + self.unhealthy.len()).unwrap_or(u32::MAX)
    }
}

/// The hosts `/clusters` (the page's text, `String::from_utf8_lossy` of the answer) lists, by
/// cluster, for the clusters `wanted` accepts. Lines that are not health flags, or that do not
/// parse, are skipped.
pub fn listed_hosts<'a>(
    text: &'a str,
    wanted: impl Fn(&str) -> bool,
) -> Map<&'a str, ListedHosts<'a>> {
    let mut out: Map<&str, ListedHosts> = Map::default();
    // A page lists each cluster's lines together: ask `wanted` once per run of them.
    let mut last: Option<(&str, bool)> = None;
    for line in text.lines() {
        // Cheap tests first (a page has a dozen lines per host, one of them its health): the
        // flags are the text after the last `::`, which flags and stat values never contain.
        let Some((head, flags)) = split_last_separator(line) else {
            continue;
        };
        let Some(head) = head.strip_suffix(HEALTH_FLAGS) else {
            continue;
        };
        // Cluster names have no `::` (Envoy's own separator here); addresses may (IPv6, in
        // brackets), so the cluster is everything before the first one.
        let Some((cluster, address)) = head.split_once("::") else {
            continue;
        };
        if cluster.is_empty() || address.is_empty() {
            continue;
        }
        let steered = match last {
            Some((name, steered)) if name == cluster => steered,
            _ => {
                let steered = wanted(cluster);
                last = Some((cluster, steered));
                steered
            }
        };
        if !steered {
            continue;
        }
        // A host Envoy has not checked yet (just added by EDS) carries `failed_active_hc` beside
        // `pending_active_hc`: it is new, not failing, and the picks may find it at once.
        let mut flags = flags.split('/').map(str::trim);
        let unhealthy = flags.clone().any(|flag| UNHEALTHY_FLAGS.contains(&flag))
            && !flags.any(|flag| flag == PENDING_FIRST_CHECK);
        let hosts = out.entry(cluster).or_default();
        if unhealthy {
            hosts.unhealthy.insert(address.to_owned());
        } else {
            hosts.serving.push(address);
        }
    }
    out
}

/// `line` split at its last `::`, found by a byte search for `:` rather than a substring search.
fn split_last_separator(line: &str) -> Option<(&str, &str)> {
    let colon = line.rfind(':')?;
    let head = line.get(..colon)?.strip_suffix(':')?;
    Some((head, line.get(colon + 1..)?))
}
