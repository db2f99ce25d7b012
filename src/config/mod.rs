//! Configuration: the JSON an operator writes ([`PluginConfig`]), and the checked runtime form
//! the core runs on ([`Config`]).
//!
//! Parse, don't validate: [`Config::from_json`] is the only way to a `Config`, and it either
//! compiles everything (path rules, networks, durations in the core's units) or fails with one
//! [`ConfigError`] that names the field and the value. Nothing downstream can hold an unchecked
//! configuration, so nothing downstream needs a fallback for one.
//!
//! Envoy passes the configuration as a `google.protobuf.StringValue`; it reaches `on_configure`
//! byte for byte. Unknown fields are rejected: a typo must not silently become a default.

mod error;
#[macro_use]
pub(crate) mod json;
mod clusters;
mod rules;
mod sections;
mod smoothing;

use std::time::Duration;

use serde::Serialize;

use crate::balance::outcome::{GrpcCode, GrpcCodes};
use crate::balance::pick::PickAlgorithm;
use crate::balance::smoothing::Smoother;
use crate::map::Map;
use crate::record::state::Policy;
use crate::record::sync::MAX_RECORD_HOSTS;
use crate::rules::{normalize, Rules};
use crate::units::ms_to_ns;
use clusters::{compile_clusters, ANY_CLUSTER};
pub use clusters::{ClusterConfig, SteeredClusters};
pub use error::ConfigError;
use error::{err, in_range};
use json::{quoted, variant, FromJson};
use rules::default_health_paths;
pub use rules::{compile_rules, ManagementConfig, PathSet};
pub use sections::{EnvoyHealthConfig, LocalityConfig, OutlierConfig, ScoreConfig, WeightsConfig};
use smoothing::check_smoother;

// === The JSON form ===

/// The whole plugin configuration as written. Every field is optional; see
/// docs/configuration.md and schema/ewma-lb.schema.json.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PluginConfig {
    /// Request header the cluster's `override_host` policy reads (`override_host_sources`).
    pub override_header: String,
    /// How often every worker merges its samples into shared state and looks for a new table.
    pub tick_period_ms: u64,
    /// How often the weight table is recomputed (the timed-refresh gate against flapping).
    pub refresh_interval_ms: u64,
    pub smoothing: Smoother,
    pub weights: WeightsConfig,
    /// Latency a failed request counts as at least, so a host that fails fast never looks fast.
    pub failure_penalty_ms: u64,
    /// Latency a sample counts as at most: one request cannot move a host's score without bound.
    pub latency_ceiling_ms: u64,
    /// How long a rise beyond a host's usual spread must last before its score follows it.
    pub persistence_ms: u64,
    /// How long each worker lets a host go without a request before it probes it, for a host
    /// as fast as the table's traffic; slower hosts wait longer (`probe`).
    pub probe_interval_ms: u64,
    /// How long a probe may wait for its host alone before Envoy sends it to another as well,
    /// as a multiple of the latency the table's traffic gets; 0: probes wait like any request.
    pub probe_timeout_factor: f64,
    pub pick: PickAlgorithm,
    /// Share of requests left to the cluster's fallback policy, which finds endpoints the table
    /// does not know yet (EDS, Kubernetes).
    pub exploration_share: f64,
    /// A learned host with no traffic for this long is forgotten.
    pub host_ttl_ms: u64,
    pub max_hosts_per_cluster: usize,
    pub outlier_detection: OutlierConfig,
    /// How latency, error rate and the load a host reports make its score (`score`).
    pub score: ScoreConfig,
    /// Where each VM reads Envoy's own health of the hosts (`health`).
    pub envoy_health: EnvoyHealthConfig,
    /// Zone-aware steering: keep traffic in the proxy's zone while it serves well.
    pub locality: LocalityConfig,
    /// The Envoy clusters the plugin may steer: exact names, or prefixes ending in `*`. Only
    /// clusters whose load-balancing policy obeys the header belong here; requests to any other
    /// are left to Envoy and counted as `unlisted_cluster`.
    pub steered_clusters: Vec<String>,
    /// gRPC status codes (canonical names, e.g. `UNAVAILABLE`) that are the serving host's
    /// failure, read from a gRPC response's trailers or trailers-only headers.
    pub grpc_failure_status_codes: Vec<String>,
    /// Optional static endpoints per Envoy cluster name; others are learned from traffic.
    pub clusters: Map<String, ClusterConfig>,
    /// Health probes: passed untouched, never steered, never sampled.
    pub health_paths: PathSet,
    /// Management paths: a local 403 unless the client is in `allowed_cidrs`.
    pub management: ManagementConfig,
    /// Long polls, streams, uploads: left to the fallback policy and never sampled.
    pub excluded_paths: PathSet,
    /// Path the plugin answers itself with the weight tables as JSON; guarded like management.
    pub status_path: String,
    /// Compute, export metrics and status, but never override Envoy's choice.
    pub shadow: bool,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            override_header: "x-ewma-lb-host".into(),
            tick_period_ms: 100,
            refresh_interval_ms: 250,
            smoothing: Smoother::default(),
            weights: WeightsConfig::default(),
            failure_penalty_ms: 1_000,
            latency_ceiling_ms: 10_000,
            persistence_ms: 1_000,
            probe_interval_ms: 1_000,
            probe_timeout_factor: 4.0,
            pick: PickAlgorithm::default(),
            exploration_share: 0.002,
            host_ttl_ms: 60_000,
            max_hosts_per_cluster: 1024,
            outlier_detection: OutlierConfig::default(),
            score: ScoreConfig::default(),
            envoy_health: EnvoyHealthConfig::default(),
            locality: LocalityConfig::default(),
            steered_clusters: vec![ANY_CLUSTER.into()],
            grpc_failure_status_codes: GrpcCodes::DEFAULT_FAILURES
                .iter()
                .map(|c| c.name().to_owned())
                .collect(),
            clusters: Map::default(),
            health_paths: default_health_paths(),
            management: ManagementConfig::default(),
            excluded_paths: PathSet::default(),
            status_path: "/ewma-lb/status".into(),
            shadow: false,
        }
    }
}

json_struct!(PluginConfig {
    override_header,
    tick_period_ms,
    refresh_interval_ms,
    smoothing,
    weights,
    failure_penalty_ms,
    latency_ceiling_ms,
    persistence_ms,
    probe_interval_ms,
    probe_timeout_factor,
    pick,
    exploration_share,
    host_ttl_ms,
    max_hosts_per_cluster,
    outlier_detection,
    score,
    envoy_health,
    locality,
    steered_clusters,
    grpc_failure_status_codes,
    clusters,
    health_paths,
    management,
    excluded_paths,
    status_path,
    shadow,
});

/// `pick`: an algorithm by its name.
impl FromJson for PickAlgorithm {
    fn from_json(value: &serde_json::Value, path: &str) -> Result<Self, ConfigError> {
        variant(value, path, &Self::NAMES)
    }
}

// === The runtime form ===

/// The checked configuration the core runs on. Only [`Config::from_json`] makes one.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    override_header: String,
    tick_period: Duration,
    policy: Policy,
    failure_penalty_ms: f64,
    latency_ceiling_ms: f64,
    grpc_failures: GrpcCodes,
    pick: PickAlgorithm,
    probe_timeout_factor: f64,
    exploration_share: f64,
    rules: Rules,
    steered: SteeredClusters,
    static_endpoints: Map<String, Vec<String>>,
    status_path: String,
    shadow: bool,
    guard_warning: Option<String>,
    /// `envoy_health`: the admin cluster (`None`: off) and the poll interval.
    admin_cluster: Option<String>,
    health_poll_ns: u64,
}

impl Config {
    /// Parses and compiles the plugin configuration. An empty document means "all defaults".
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        PluginConfig::from_json(bytes)?.compile()
    }

    /// The header the plugin writes its pick into.
    pub fn override_header(&self) -> &str {
        &self.override_header
    }

    /// How often the host should call the tick.
    pub fn tick_period(&self) -> Duration {
        self.tick_period
    }

    /// What merging and refreshing shared state need.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Latency a failed request counts as at least.
    pub fn failure_penalty_ms(&self) -> f64 {
        self.failure_penalty_ms
    }

    /// Latency a sample counts as at most.
    pub fn latency_ceiling_ms(&self) -> f64 {
        self.latency_ceiling_ms
    }

    /// gRPC codes that are the serving host's failure.
    pub fn grpc_failures(&self) -> GrpcCodes {
        self.grpc_failures
    }

    pub fn pick(&self) -> PickAlgorithm {
        self.pick
    }

    /// How long a probe waits for its host alone, as a multiple of the table's average latency,
    /// before Envoy sends it to another host as well (`probe::timeout_ms`); 0: off.
    pub fn probe_timeout_factor(&self) -> f64 {
        self.probe_timeout_factor
    }

    pub fn exploration_share(&self) -> f64 {
        self.exploration_share
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Whether requests to `cluster` may be steered (`steered_clusters`).
    pub fn steers(&self, cluster: &str) -> bool {
        self.steered.contains(cluster)
    }

    /// `steered_clusters` as configured, in its order: for the start-up log and the status page.
    pub fn steered_clusters(&self) -> &[String] {
        &self.steered.listed
    }

    /// The exact names of `steered_clusters` (not the prefixes), in configured order: the ones a
    /// typo can hide in (`diagnose::SteeredWatch`).
    pub(crate) fn steered_names(&self) -> impl Iterator<Item = &str> {
        self.steered
            .listed
            .iter()
            .map(String::as_str)
            .filter(|e| !e.ends_with('*'))
    }

    /// Static endpoints of `cluster`, empty when it has none.
    pub fn static_endpoints(&self, cluster: &str) -> &[String] {
        self.static_endpoints
            .get(cluster)
            .map_or(&[], Vec::as_slice)
    }

    /// Clusters with static endpoints.
    pub(crate) fn static_clusters(&self) -> impl Iterator<Item = &str> {
        self.static_endpoints.keys().map(String::as_str)
    }

    /// What to warn of at start-up about the management guard, if anything: an allowlist beyond
    /// loopback is only as good as Envoy's `source.address`, which the plugin cannot tell how
    /// Envoy derived (the connection manager's `use_remote_address` is not a property a filter
    /// can read).
    pub fn guard_warning(&self) -> Option<&str> {
        self.guard_warning.as_deref()
    }

    pub fn status_path(&self) -> &str {
        &self.status_path
    }

    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// The cluster to ask Envoy's admin `/clusters` through; `None` when Envoy's health is not
    /// read (`health`).
    pub fn admin_cluster(&self) -> Option<&str> {
        self.admin_cluster.as_deref()
    }

    /// How often each VM asks it.
    pub(crate) fn health_poll_ns(&self) -> u64 {
        self.health_poll_ns
    }

    /// The namespace of records written under this configuration: a stable hash (FNV-1a, the same
    /// in every VM of a build) of every setting that changes what the record holds or what merging
    /// and refreshing do: the policy, in postcard's encoding (a field added to the policy is
    /// fingerprinted without anyone remembering to), and the settings outside it that shape
    /// samples or hosts (static endpoints, `failure_penalty_ms`, `latency_ceiling_ms`, the gRPC
    /// codes that are failures). Two listeners on one `vm_id` that differ in any of them keep
    /// separate records: sharing one, each listener's refresh would drop the other's static hosts.
    pub(crate) fn record_namespace(&self) -> String {
        let mut bytes = postcard::to_allocvec(self.policy()).unwrap_or_default();
        // Owned names, sorted: the sort `compile_clusters` already has for endpoints, where
        // sorting `&str`s would bring a second copy of the sort into the module (3.8 KB).
        let mut clusters: Vec<String> = self.static_clusters().map(str::to_owned).collect();
        clusters.sort_unstable();
        for cluster in &clusters {
            bytes.extend_from_slice(cluster.as_bytes());
            bytes.push(0);
            for endpoint in self.static_endpoints(cluster) {
                bytes.extend_from_slice(endpoint.as_bytes());
                bytes.push(0);
            }
            bytes.push(0xff);
        }
        bytes.extend_from_slice(&self.failure_penalty_ms().to_bits().to_le_bytes());
        bytes.extend_from_slice(&self.latency_ceiling_ms().to_bits().to_le_bytes());
        bytes.extend_from_slice(format!("{:?}", self.grpc_failures()).as_bytes());
        let hash = crate::hash::fnv1a(crate::hash::FNV_OFFSET, &bytes);
        format!("{hash:016x}")
    }
}

impl PluginConfig {
    /// Parses the JSON form; checks types and field names, not bounds (`compile` does).
    pub fn from_json(bytes: &[u8]) -> Result<PluginConfig, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(PluginConfig::default());
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(err("config", "must be a JSON object"));
        }
        // Not JSON at all: serde_json says where ("EOF while parsing a value at line 1 column 12").
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| err("config", e.to_string()))?;
        <PluginConfig as FromJson>::from_json(&value, "")
    }

    /// Checks every bound and compiles the runtime form.
    pub fn compile(self) -> Result<Config, ConfigError> {
        let header = self.override_header;
        if header.is_empty()
            || !header
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(err(
                "override_header",
                format!(
                    "must be a lowercase HTTP header name, got {}",
                    quoted(&header)
                ),
            ));
        }
        if is_reserved_header(&header) {
            return Err(err(
                "override_header",
                format!(
                    "must be a header of its own, not one HTTP or Envoy gives a meaning to (the plugin removes the client's copy from every request), got {}",
                    quoted(&header)
                ),
            ));
        }
        let tick_period_ms = in_range("tick_period_ms", self.tick_period_ms, 10, 60_000)?;
        let refresh_interval_ms = in_range(
            "refresh_interval_ms",
            self.refresh_interval_ms,
            tick_period_ms,
            600_000,
        )?;
        let smoother = check_smoother(self.smoothing)?;
        let weights = self.weights.compile()?;
        // Zero would let a host that fails fast look fast, the one thing the penalty is for.
        let failure_penalty_ms =
            in_range("failure_penalty_ms", self.failure_penalty_ms, 1, 600_000)?;
        let latency_ceiling_ms = in_range(
            "latency_ceiling_ms",
            self.latency_ceiling_ms,
            failure_penalty_ms,
            3_600_000,
        )?;
        let persistence_ms = in_range("persistence_ms", self.persistence_ms, 0, 60_000)?;
        let probe_interval_ms = in_range("probe_interval_ms", self.probe_interval_ms, 10, 60_000)?;
        // Below 1 a host as fast as the rest would lose most of its probes to the alternative,
        // and a recovery would be seen late.
        let probe_timeout_factor = match self.probe_timeout_factor {
            0.0 => 0.0,
            f => in_range("probe_timeout_factor", f, 1.0, 100.0)
                .map_err(|e| err(e.field, format!("{} (or 0: off)", e.message)))?,
        };
        let grpc_failures = compile_grpc_codes(&self.grpc_failure_status_codes)?;
        let exploration_share = in_range("exploration_share", self.exploration_share, 0.0, 0.5)?;
        let host_ttl_ms = in_range(
            "host_ttl_ms",
            self.host_ttl_ms,
            refresh_interval_ms,
            86_400_000,
        )?;
        let max_hosts = in_range(
            "max_hosts_per_cluster",
            self.max_hosts_per_cluster,
            1,
            MAX_RECORD_HOSTS,
        )?;
        let outlier = self.outlier_detection.compile()?;
        let score = self.score.compile()?;
        let admin_cluster = self.envoy_health.admin_cluster;
        if admin_cluster
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(err(
                "envoy_health.admin_cluster",
                format!(
                    "cluster names have no white space, got {}",
                    quoted(&admin_cluster)
                ),
            ));
        }
        let poll_interval_ms = in_range(
            "envoy_health.poll_interval_ms",
            self.envoy_health.poll_interval_ms,
            100,
            60_000,
        )?;
        let locality = self.locality.compile()?;
        let steered = SteeredClusters::compile(&self.steered_clusters)?;
        let static_endpoints = compile_clusters(self.clusters, max_hosts, &steered)?;
        let rules = compile_rules(&self.health_paths, &self.management, &self.excluded_paths)?;
        let status_path = check_status_path(self.status_path, &rules, &self.health_paths)?;
        let guard_warning = guard_warning(&self.management.allowed_cidrs);
        Ok(Config {
            override_header: header,
            tick_period: Duration::from_millis(tick_period_ms),
            policy: Policy {
                smoother,
                weights,
                outlier,
                locality,
                refresh_interval_ns: ms_to_ns(refresh_interval_ms),
                host_ttl_ns: ms_to_ns(host_ttl_ms),
                max_hosts,
                persistence_ns: ms_to_ns(persistence_ms),
                probe_interval_ns: ms_to_ns(probe_interval_ms),
                score,
            },
            failure_penalty_ms: failure_penalty_ms as f64,
            latency_ceiling_ms: latency_ceiling_ms as f64,
            grpc_failures,
            pick: self.pick,
            probe_timeout_factor,
            exploration_share,
            rules,
            steered,
            static_endpoints,
            status_path,
            shadow: self.shadow,
            guard_warning,
            admin_cluster: (!admin_cluster.is_empty()).then_some(admin_cluster),
            health_poll_ns: ms_to_ns(poll_interval_ms),
        })
    }
}

/// The start-up warning for an allowlist that admits more than loopback (`Config::guard_warning`).
fn guard_warning(allowed: &[String]) -> Option<String> {
    let beyond: Vec<&String> = allowed
        .iter()
        .filter(|c| {
            !ManagementConfig::default()
                .allowed_cidrs
                .iter()
                .any(|d| d == *c)
        })
        .collect();
    if beyond.is_empty() {
        return None;
    }
    let listed: Vec<String> = beyond.iter().map(|c| quoted(c)).collect();
    Some(format!(
        "management.allowed_cidrs admits {}: the guard trusts Envoy's client address, which follows the client's X-Forwarded-For unless the connection manager sets use_remote_address: true (Envoy's default is false, and Istio's sidecars keep it) or xff_num_trusted_hops counts only your own proxies; the plugin cannot read that setting, so check it (README, Threat model)",
        listed.join(", ")
    ))
}

/// Headers whose meaning HTTP or Envoy fixes. The plugin removes the client's copy of
/// `override_header` from every request and Envoy reads the plugin's as an address list, so
/// naming one of these would strip it from all traffic (credentials, cookies, the body's length)
/// or hand Envoy's own instructions to the plugin. The list keeps to the names that define the
/// message and its connection, carry the client's identity, or belong to a proxy; prefixes cover
/// the namespaces Envoy and gRPC reserve. Pseudo-headers (`:authority`) fail the name check.
const RESERVED_HEADERS: &[&str] = &[
    // The message and its connection (RFC 9110, RFC 9112): Envoy's codecs own them.
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    // Who the client is, for the backend.
    "authorization",
    "proxy-authorization",
    "cookie",
    // What proxies report about the client; Envoy reads, appends or generates them.
    "forwarded",
    "via",
    "x-request-id",
];
const RESERVED_HEADER_PREFIXES: &[&str] = &["x-envoy-", "x-forwarded-", "grpc-"];

fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADERS.contains(&name) || RESERVED_HEADER_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The status page must be a path of its own: the root would answer every client's `/` with a
/// 403, and a probe path is passed to the backend before the plugin would serve it.
fn check_status_path(
    status_path: String,
    rules: &Rules,
    health: &PathSet,
) -> Result<String, ConfigError> {
    let normal = normalize(&status_path);
    if !status_path.starts_with('/') || normal != status_path || normal.is_ambiguous() {
        return Err(err(
            "status_path",
            format!(
                "must be a normalised absolute path such as /ewma-lb/status, got {}",
                quoted(&status_path)
            ),
        ));
    }
    if status_path == "/" {
        return Err(err(
            "status_path",
            "must not be the root: every request for / from outside the allowlist would get a 403, got \"/\"",
        ));
    }
    if let Some((kind, i)) = rules.health_rule(&status_path) {
        let list = if kind == "exact" {
            &health.exact
        } else {
            &health.prefix
        };
        let written = list
            .get(i)
            .map_or_else(String::new, |p| format!(" {}", quoted(p)));
        return Err(err(
            "status_path",
            format!(
                "must not be a health path: health_paths.{kind}[{i}]{written} matches it, and probes pass to the backend, so the page would be unreachable, got {}",
                quoted(&status_path)
            ),
        ));
    }
    Ok(status_path)
}

/// `grpc_failure_status_codes`: canonical names only. OK is a success and CANCELLED no sample
/// at all (the caller gave up), so neither can be a host's failure.
fn compile_grpc_codes(names: &[String]) -> Result<GrpcCodes, ConfigError> {
    const FIELD: &str = "grpc_failure_status_codes";
    let mut codes = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let field = format!("{FIELD}[{i}]");
        let Some(code) = GrpcCode::from_name(name) else {
            let canonical = name.trim().to_ascii_uppercase().replace('-', "_");
            let hint = match GrpcCode::from_name(&canonical) {
                Some(c) => format!("write it as {c}"),
                None => format!(
                    "one of {}",
                    // Owned, as every list a message joins: one `join` in the module, not two.
                    GrpcCode::ALL
                        .iter()
                        .map(|(_, n)| (*n).to_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            return Err(err(
                field,
                format!(
                    "must be a gRPC status code name ({hint}), got {}",
                    quoted(name)
                ),
            ));
        };
        match code {
            GrpcCode::Ok => return Err(err(field, "OK is a success, not a failure")),
            GrpcCode::Cancelled => {
                return Err(err(
                    field,
                    "CANCELLED is never a sample: the call was abandoned, most often by the client",
                ))
            }
            _ => codes.push(code),
        }
    }
    Ok(codes.into_iter().collect())
}
