//! What the worker decides for a request ([`Decision`]): a host to name in the override header,
//! the fallback and why, or a local answer; and how the adapter writes it into the header and
//! the access log.

use std::rc::Rc;

/// What the filter does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Name this host (and an alternative for a retry) in the override header.
    Override(Pick),
    /// Leave the request to the cluster's fallback policy.
    Fallback(FallbackReason),
    /// Answer locally with 403: a management path from outside the allowlist.
    Deny,
    /// Answer locally with the status document.
    Status,
}

/// Envoy's request header for a per-try timeout, in milliseconds.
pub const PER_TRY_TIMEOUT_HEADER: &str = "x-envoy-upstream-rq-per-try-timeout-ms";
/// Envoy's request header that adds retry conditions to the route's.
pub const RETRY_ON_HEADER: &str = "x-envoy-retry-on";
/// Envoy's request header that makes a per-try timeout start a second attempt beside the first
/// instead of cancelling it (hedging): the first answer wins.
pub const HEDGE_HEADER: &str = "x-envoy-hedge-on-per-try-timeout";

/// A host chosen for a request. The addresses are the pick table's own, shared, so a pick
/// allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub host: Rc<str>,
    /// A different host for the retry of a failed connection, or a probe's hedge: Envoy tries
    /// the addresses of the header in order.
    pub alternative: Option<Rc<str>>,
    /// The host was due a probe (`probe`), not drawn by weight.
    pub probe: bool,
    /// For a probe with an alternative: how long it may wait for its host alone before Envoy
    /// sends it there as well, where the request can be sent twice (`probe::timeout_ms`; the
    /// adapter decides, and tells `finish`).
    pub probe_timeout_ms: Option<u32>,
    /// The version of the pick table it came from.
    pub table_version: u64,
}

impl Pick {
    /// The override header's value, `IP:port` or `IP:port,IP:port`, written into `out` (cleared
    /// first), so a caller can reuse one buffer for every request.
    pub fn write_header_value(&self, out: &mut String) {
        out.clear();
        out.push_str(&self.host);
        if let Some(alternative) = &self.alternative {
            out.push(',');
            out.push_str(alternative);
        }
    }

    /// The values of [`PER_TRY_TIMEOUT_HEADER`] and [`RETRY_ON_HEADER`] (with [`HEDGE_HEADER`]
    /// `true`) that have Envoy send a probe to the alternative as well once it has waited its
    /// wait for its host (`probe`), the first answer winning, for a request that may be sent
    /// twice: a safe method (RFC 9110, 9.2.1) and no body. `retry_on` is the request's own value,
    /// kept; a request with its own per-try timeout (`own_per_try`), or with conditions that are
    /// not text (which the plugin could not keep), is left as it came and probed as before. A per-try timeout Envoy ignores (one not below the route's timeout) leaves the
    /// probe as it was.
    pub fn probe_hedge(
        &self,
        method: &[u8],
        body: bool,
        retry_on: Option<&[u8]>,
        own_per_try: bool,
    ) -> Option<(String, String)> {
        let wait = self.probe_timeout_ms?;
        let safe = matches!(method, b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE");
        if !safe || body || own_per_try {
            return None;
        }
        // A route without a retry policy retries nothing: any condition gives it one retry,
        // which hedging spends on the second attempt.
        let retry_on = match retry_on.map(std::str::from_utf8) {
            Some(Ok(v)) if !v.trim().is_empty() => format!("{v},reset"),
            Some(Err(_)) => return None,
            _ => "reset".to_owned(),
        };
        Some((wait.to_string(), retry_on))
    }
}

/// For logs: `override 10.0.0.1:80,10.0.0.2:80`, `fallback (exploring)`, `deny`, `status`.
impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Override(pick) => {
                f.write_str("override ")?;
                f.write_str(&pick.host)?;
                match &pick.alternative {
                    Some(alternative) => write!(f, ",{alternative}"),
                    None => Ok(()),
                }
            }
            Decision::Fallback(reason) => write!(f, "fallback ({})", reason.label()),
            Decision::Deny => f.write_str("deny"),
            Decision::Status => f.write_str("status"),
        }
    }
}

impl Decision {
    /// Whether the request's outcome is a latency sample of the host that serves it.
    pub fn is_sampled(&self) -> bool {
        match self {
            Decision::Override(_) => true,
            Decision::Fallback(reason) => {
                matches!(
                    reason,
                    FallbackReason::Exploring
                        | FallbackReason::HostsEqual
                        | FallbackReason::TableNotReady
                        | FallbackReason::Shadow
                )
            }
            Decision::Deny | Decision::Status => false,
        }
    }

    /// The request's decision as the access log reads it (the filter state
    /// `wasm.ewma_lb_decision`): `REASON HOST VERSION`, `-` for what there is none of.
    /// REASON is `steered` or `probe` (a pick: HOST is the picked host), `fallback:WHY` with
    /// WHY the `reason` label of `ewma_lb_fallback_requests_total`, `health_path`,
    /// `management`, `denied` or `status`. VERSION is the pick table's version
    /// (`table_version` of the status page): the pick's own, or for a fallback `table_version`,
    /// the cluster's table at the time. Written into `out` (cleared first), so one buffer
    /// serves every request.
    pub fn write_log_value(&self, table_version: Option<u64>, out: &mut String) {
        use std::fmt::Write as _;
        out.clear();
        let (reason, host, version) = match self {
            Decision::Override(pick) => (
                if pick.probe { "probe" } else { "steered" },
                Some(&*pick.host),
                Some(pick.table_version),
            ),
            Decision::Fallback(FallbackReason::HealthPath) => ("health_path", None, None),
            Decision::Fallback(FallbackReason::Management) => ("management", None, None),
            Decision::Fallback(why) => {
                out.push_str("fallback:");
                (why.label(), None, table_version)
            }
            Decision::Deny => ("denied", None, None),
            Decision::Status => ("status", None, None),
        };
        out.push_str(reason);
        out.push(' ');
        out.push_str(host.unwrap_or("-"));
        match version.filter(|v| *v > 0) {
            Some(v) => {
                let _ = write!(out, " {v}");
            }
            None => out.push_str(" -"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackReason {
    /// The exploration share: lets the fallback find endpoints the table does not know.
    Exploring,
    /// The table cannot tell its hosts apart (`pick: weighted_p2c_unless_equal`): the fallback,
    /// least request in every shipped configuration, sees every worker's requests in flight.
    HostsEqual,
    /// No weight table for this cluster yet (first requests, or nothing learned).
    TableNotReady,
    /// A health probe: never steered, never sampled.
    HealthPath,
    /// A management request from an allowed network: passed, never sampled.
    Management,
    /// An excluded path (long poll, stream, upload): never sampled.
    Excluded,
    /// No cluster name: a direct response or a route without a cluster.
    NoCluster,
    /// Shadow mode: the table is computed and sampled, never applied.
    Shadow,
    /// A cluster outside `steered_clusters`: its policy may not obey the header, so the plugin
    /// leaves it to Envoy and keeps no state for it.
    UnlistedCluster,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 9] = [
        FallbackReason::Exploring,
        FallbackReason::HostsEqual,
        FallbackReason::TableNotReady,
        FallbackReason::HealthPath,
        FallbackReason::Management,
        FallbackReason::Excluded,
        FallbackReason::NoCluster,
        FallbackReason::Shadow,
        FallbackReason::UnlistedCluster,
    ];

    /// The `reason` label of `ewma_lb_fallback_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            FallbackReason::Exploring => "exploring",
            FallbackReason::HostsEqual => "hosts_equal",
            FallbackReason::TableNotReady => "table_not_ready",
            FallbackReason::HealthPath => "health_path",
            FallbackReason::Management => "management",
            FallbackReason::Excluded => "excluded",
            FallbackReason::NoCluster => "no_cluster",
            FallbackReason::Shadow => "shadow",
            FallbackReason::UnlistedCluster => "unlisted_cluster",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}
