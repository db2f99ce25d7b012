//! Path rules: which requests the balancer touches, and who may reach management paths.
//!
//! Seed 000 draws the line: a load balancer probes a light health path and routes by it alone;
//! metrics and management endpoints are not business traffic, must not be reachable through the
//! business entry point except from internal networks, and their heavy scrapes must not pollute
//! the latency statistics. So:
//! - health probes pass untouched: never steered, never sampled;
//! - management paths are answered with a local 403 unless the client is in the allowlist;
//! - excluded paths (long polls, streams, uploads) are left to the fallback and never sampled,
//!   since their duration says nothing about the host's speed.
//!
//! Paths are compared after normalisation (query dropped, percent-decoding, dot segments,
//! repeated slashes, `;` parameters, case), so `/Actuator/./env;x` cannot slip past a rule.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Paths by exact match or by prefix, as Envoy's route `path` and `prefix` matchers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
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

    /// `path` must already be normalised; the rules are normalised when compiled.
    pub fn matches(&self, path: &str) -> bool {
        self.exact.iter().any(|e| e == path) || self.prefix.iter().any(|p| path.starts_with(p.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefix.is_empty()
    }
}

/// `management` in the plugin configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ManagementConfig {
    pub paths: PathSet,
    /// Networks (CIDR, or a bare address) whose clients may reach management paths. The client
    /// is Envoy's `source.address`: the peer, or with `xff_num_trusted_hops` set on Envoy's
    /// connection manager the address those trusted proxies reported (see README).
    pub allowed_cidrs: Vec<String>,
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            paths: PathSet::of(&[], &["/actuator"]),
            allowed_cidrs: ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

pub fn default_health_paths() -> PathSet {
    PathSet::of(
        &["/health", "/healthz", "/livez", "/readyz", "/ready", "/status", "/ping"],
        &["/actuator/health"],
    )
}

/// What a request's path makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathClass {
    Health,
    Management,
    Excluded,
    Business,
}

/// The compiled rules: normalised paths and parsed networks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    health: PathSet,
    management: PathSet,
    excluded: PathSet,
    allowed: Vec<IpNet>,
}

/// A rule that cannot be compiled: the field and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub field: String,
    pub message: String,
}

impl Rules {
    pub fn compile(health: &PathSet, management: &ManagementConfig, excluded: &PathSet) -> Result<Rules, RuleError> {
        let allowed = management
            .allowed_cidrs
            .iter()
            .enumerate()
            .map(|(i, cidr)| parse_network(cidr).ok_or_else(|| RuleError {
                field: format!("management.allowed_cidrs[{i}]"),
                message: format!("must be a CIDR such as 10.0.0.0/8 or an IP address, got {cidr:?}"),
            }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Rules {
            health: compile_set("health_paths", health)?,
            management: compile_set("management.paths", &management.paths)?,
            excluded: compile_set("excluded_paths", excluded)?,
            allowed,
        })
    }

    /// Classifies a request by its `:path`. Health wins over management, so the default
    /// `/actuator/health` stays a probe while the rest of `/actuator/` is guarded.
    pub fn classify(&self, raw_path: &str) -> PathClass {
        self.classify_normalized(&normalize(raw_path))
    }

    /// `classify` for a path `normalize` already returned.
    pub fn classify_normalized(&self, path: &str) -> PathClass {
        if self.health.matches(path) {
            PathClass::Health
        } else if self.management.matches(path) {
            PathClass::Management
        } else if self.excluded.matches(path) {
            PathClass::Excluded
        } else {
            PathClass::Business
        }
    }

    /// May the client reach a management path? `source` is Envoy's `source.address`
    /// (`IP:port`). X-Forwarded-For is never read here: Envoy's connection manager already
    /// folds the hops it trusts into `source.address`, and only those.
    pub fn management_allowed(&self, source: Option<&str>) -> bool {
        source
            .and_then(parse_ip)
            .is_some_and(|ip| self.allowed.iter().any(|net| net.contains(&ip)))
    }
}

fn compile_set(field: &str, set: &PathSet) -> Result<PathSet, RuleError> {
    let check = |kind: &str, paths: &[String]| -> Result<Vec<String>, RuleError> {
        paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if p.starts_with('/') && p.len() <= MAX_RULE_PATH {
                    Ok(normalize(p).into_owned())
                } else {
                    Err(RuleError {
                        field: format!("{field}.{kind}[{i}]"),
                        message: format!("must start with '/' and be at most {MAX_RULE_PATH} bytes, got {p:?}"),
                    })
                }
            })
            .collect()
    };
    Ok(PathSet { exact: check("exact", &set.exact)?, prefix: check("prefix", &set.prefix)? })
}

const MAX_RULE_PATH: usize = 1024;

fn parse_network(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

/// An IP from `IP`, `IP:port` or `[IPv6]:port`; IPv4-mapped IPv6 counts as IPv4. Unix socket
/// paths and anything else give `None`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip = s.parse::<SocketAddr>().map(|a| a.ip()).or_else(|_| s.parse::<IpAddr>()).ok()?;
    Some(ip.to_canonical())
}

/// The form paths are compared in: no query or fragment, percent-decoded, backslashes as
/// slashes, `;` parameters dropped, no empty or `.` segments, `..` resolved, lower case.
pub fn normalize(raw: &str) -> Cow<'_, str> {
    let path = raw.split(['?', '#']).next().unwrap_or_default();
    if is_normal(path) {
        return Cow::Borrowed(path);
    }
    Cow::Owned(normalize_slowly(path))
}

/// True for the common path that normalising would not change: lower case, digits and `-_~.`,
/// slash-separated segments none of which is empty, `.` or `..` (a trailing slash is kept).
fn is_normal(path: &str) -> bool {
    let plain = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'~' | b'.' | b'/');
    let Some(rest) = path.strip_prefix('/') else { return false };
    if !path.bytes().all(plain) {
        return false;
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return path == "/";
    }
    rest.split('/').all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

fn normalize_slowly(path: &str) -> String {
    let decoded = percent_decode(path).replace('\\', "/").to_ascii_lowercase();
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        let segment = segment.split(';').next().unwrap_or_default();
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len() + 1);
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || decoded.ends_with('/') {
        out.push('/');
    }
    out
}

/// Decodes `%XX` escapes until none is left (so `%252e` cannot hide a dot). `%3F` and `%23` stay
/// encoded: decoded, they would read as a query or fragment the next time. Invalid escapes and
/// non-UTF-8 results are kept as they are.
fn percent_decode(s: &str) -> String {
    let mut current = s.to_owned();
    // Every round that changes anything makes the string shorter, so this ends.
    while current.contains('%') {
        let bytes = current.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            match (b, hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
                (b'%', Some(v)) if v != b'?' && v != b'#' => {
                    out.push(v);
                    i += 3;
                }
                _ => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        match String::from_utf8(out) {
            Ok(next) if next != current => current = next,
            _ => break,
        }
    }
    current
}
