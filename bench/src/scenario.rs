//! Scenario files (TOML): the backends, the load, the route timeout and the policies of one
//! comparison. The format is documented in bench/README.md, "Scenario files".

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use harness::latency::parse_duration;
use harness::BackendSpec;

use crate::membership::{EndpointPlan, FileMembership, Membership};
use crate::metrics::Slowdown;
use crate::policy::Policy;
use crate::protocol::Transport;
use crate::windows::{FileWindow, Window};

/// The first of `(name, phases)` with phases, from its first phase's start to its last one's end.
pub fn slowdown_of<'a>(
    hosts: impl IntoIterator<Item = (&'a str, &'a [harness::Phase])>,
) -> Option<Slowdown> {
    hosts
        .into_iter()
        .find(|(_, phases)| !phases.is_empty())
        .map(|(name, phases)| Slowdown {
            host: name.to_owned(),
            from_s: phases
                .iter()
                .map(|p| p.from_s)
                .fold(f64::INFINITY, f64::min),
            to_s: phases.iter().map(|p| p.to_s).fold(0.0, f64::max),
        })
}

/// Upper bound of one policy's run, so a typo cannot run for hours.
pub const MAX_RUN: Duration = Duration::from_secs(600);
/// Rounds of every policy when a scenario does not say: one round's figures swing by several
/// percent on a shared machine, so every table is a median of at least three.
pub const DEFAULT_ROUNDS: u32 = 3;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    description: Option<String>,
    /// Per policy and round.
    duration: String,
    /// Start of each run left out of the summary (still in the plots and the flapping index).
    #[serde(default)]
    warmup: Option<String>,
    rate: Option<f64>,
    workers: Option<usize>,
    route_timeout: String,
    client_timeout: Option<String>,
    #[serde(default)]
    max_in_flight: Option<usize>,
    concurrency: Option<u32>,
    /// Envoys in front of the same backends, each with `concurrency` workers; the load is split
    /// evenly among them.
    envoys: Option<u32>,
    policies: Option<Vec<String>>,
    rounds: Option<u32>,
    pause: Option<String>,
    /// The plugin configuration, as a TOML table (it becomes the JSON object the plugin reads).
    #[serde(default)]
    plugin_config: Option<toml::Table>,
    /// Plugin variants by name, each a table of settings merged over `plugin_config`; a name
    /// listed in `policies` that is not built in must be one of them.
    #[serde(default)]
    variants: Option<toml::Table>,
    #[serde(rename = "backend")]
    backends: Vec<FileBackend>,
    /// The proxy's own zone (the bootstrap's `node.locality.zone`).
    local_zone: Option<String>,
    #[serde(default, rename = "window")]
    windows: Vec<FileWindow>,
    #[serde(default)]
    smoke: Option<SmokeFile>,
    /// `http` (default) or `grpc`; and extra route `retry_on` conditions (`crate::protocol`).
    protocol: Option<String>,
    retry_on: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBackend {
    name: String,
    latency: String,
    capacity: Option<usize>,
    fail: Option<f64>,
    /// The load it reports in ORCA `endpoint-load-metrics`: `fixed:U` or `busy:CAPACITY:BACKGROUND`.
    orca: Option<String>,
    /// "FROM-TO@LATENCY", seconds since the run's start, e.g. "5-35@uniform:300-600".
    #[serde(default)]
    phases: Vec<String>,
    /// "FROM-TO", seconds since the run's start: the backend is down (its listener closed,
    /// connections refused, as a crashed process whose endpoint is still listed) in between.
    down: Option<String>,
    /// This many backends like it, named NAME00, NAME01, ...
    count: Option<usize>,
    // When it is in the cluster, and where (membership.rs).
    zone: Option<String>,
    join: Option<String>,
    leave: Option<String>,
    stagger: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SmokeFile {
    duration: Option<String>,
    rate: Option<f64>,
}

/// A backend down (connections refused) from `from_s` to `to_s` of each run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outage {
    pub backend: usize,
    pub from_s: f64,
    pub to_s: f64,
}

impl Outage {
    fn parse(text: &str, backend: usize) -> Result<Outage> {
        let (from, to) = text
            .split_once('-')
            .with_context(|| format!("down {text:?}: expected FROM-TO in seconds, e.g. 10-40"))?;
        let secs = |v: &str| -> Result<f64> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .with_context(|| format!("down {text:?}: {v:?} is not a second >= 0"))
        };
        let (from_s, to_s) = (secs(from)?, secs(to)?);
        if to_s <= from_s {
            bail!("down {text:?}: the end must come after the start");
        }
        Ok(Outage {
            backend,
            from_s,
            to_s,
        })
    }
}

/// A parsed, validated scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub duration: Duration,
    pub warmup: Duration,
    /// Open-loop arrivals per second (when `workers` is `None`).
    pub rate: f64,
    /// Closed loop with this many workers.
    pub workers: Option<usize>,
    pub route_timeout: Duration,
    pub client_timeout: Duration,
    pub max_in_flight: usize,
    pub concurrency: u32,
    /// Envoys in front of the same backends (each `concurrency` workers), the load split evenly.
    pub envoys: u32,
    pub policies: Vec<Policy>,
    pub rounds: u32,
    pub pause: Duration,
    pub plugin_config: serde_json::Value,
    pub backends: Vec<BackendSpec>,
    /// When each backend is in the cluster, and in which zone (same order as `backends`).
    pub membership: Membership,
    /// Backends down for a while: (index in `backends`, from s, to s).
    pub outages: Vec<Outage>,
    pub windows: Vec<Window>,
    pub transport: Transport,
}

impl Scenario {
    /// Reads and validates a scenario file; the name defaults to the file stem.
    pub fn load(path: &Path) -> Result<Scenario> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("scenario");
        Scenario::parse(&text, stem).with_context(|| format!("scenario {}", path.display()))
    }

    /// Parses scenario TOML.
    pub fn parse(text: &str, default_name: &str) -> Result<Scenario> {
        let f: File = toml::from_str(text)?;
        Scenario::from_file(f, default_name, false)
    }

    /// Parses scenario TOML and applies its smoke settings: a few seconds per policy.
    pub fn parse_smoke(text: &str, default_name: &str) -> Result<Scenario> {
        let f: File = toml::from_str(text)?;
        Scenario::from_file(f, default_name, true)
    }

    /// [`Scenario::load`] with the smoke settings.
    pub fn load_smoke(path: &Path) -> Result<Scenario> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("scenario");
        Scenario::parse_smoke(&text, stem).with_context(|| format!("scenario {}", path.display()))
    }

    fn from_file(f: File, default_name: &str, smoke: bool) -> Result<Scenario> {
        let dur = |s: &str, what: &str| parse_duration(s).with_context(|| what.to_string());
        let mut s = Scenario {
            name: f.name.unwrap_or_else(|| default_name.to_string()),
            description: f.description.unwrap_or_default().trim().to_string(),
            duration: dur(&f.duration, "duration")?,
            warmup: f
                .warmup
                .as_deref()
                .map(|w| dur(w, "warmup"))
                .transpose()?
                .unwrap_or_default(),
            rate: f.rate.unwrap_or(100.0),
            workers: f.workers,
            route_timeout: dur(&f.route_timeout, "route_timeout")?,
            client_timeout: f
                .client_timeout
                .as_deref()
                .map(|t| dur(t, "client_timeout"))
                .transpose()?
                .unwrap_or(Duration::from_secs(10)),
            max_in_flight: f.max_in_flight.unwrap_or(2000),
            concurrency: f.concurrency.unwrap_or(2),
            envoys: f.envoys.unwrap_or(1),
            policies: {
                let variants = match serde_json::to_value(f.variants.unwrap_or_default())? {
                    serde_json::Value::Object(m) => m,
                    _ => serde_json::Map::new(),
                };
                match f.policies {
                    Some(ps) => ps
                        .iter()
                        .map(|p| Policy::named(p, &variants))
                        .collect::<Result<_>>()?,
                    None => Policy::defaults(),
                }
            },
            rounds: f.rounds.unwrap_or(DEFAULT_ROUNDS),
            pause: f
                .pause
                .as_deref()
                .map(|p| dur(p, "pause"))
                .transpose()?
                .unwrap_or(Duration::from_secs(2)),
            plugin_config: serde_json::to_value(f.plugin_config.unwrap_or_default())?,
            backends: Vec::new(),
            membership: Membership {
                local_zone: f.local_zone,
                endpoints: Vec::new(),
            },
            outages: Vec::new(),
            windows: f.windows.iter().map(Window::parse).collect::<Result<_>>()?,
            transport: Transport::parse(f.protocol.as_deref(), f.retry_on.as_deref())?,
        };
        for b in f.backends {
            let mut spec = BackendSpec::new(
                b.name.clone(),
                b.latency
                    .parse()
                    .with_context(|| format!("backend {}", b.name))?,
            );
            spec.capacity = b.capacity;
            spec.fail_rate = b.fail.unwrap_or(0.0);
            spec.orca = b
                .orca
                .as_deref()
                .map(str::parse)
                .transpose()
                .with_context(|| format!("backend {}", b.name))?;
            for p in &b.phases {
                spec.schedule
                    .push(p.parse().with_context(|| format!("backend {}", b.name))?);
            }
            spec.validate()?;
            let membership = FileMembership {
                zone: b.zone,
                join: b.join,
                leave: b.leave,
                stagger: b.stagger,
            };
            for i in 0..b.count.unwrap_or(1) {
                let name = if b.count.is_some() {
                    format!("{}{i:02}", b.name)
                } else {
                    b.name.clone()
                };
                s.membership.endpoints.push(
                    EndpointPlan::parse(&membership, i)
                        .with_context(|| format!("backend {name}"))?,
                );
                if let Some(down) = &b.down {
                    let outage = Outage::parse(down, s.backends.len())
                        .with_context(|| format!("backend {name}"))?;
                    s.outages.push(outage);
                }
                s.backends.push(BackendSpec {
                    name,
                    ..spec.clone()
                });
            }
        }
        s.membership.validate(s.duration)?;
        if smoke {
            let sm = f.smoke.unwrap_or_default();
            s.duration = sm
                .duration
                .as_deref()
                .map(|d| dur(d, "smoke.duration"))
                .transpose()?
                .unwrap_or(Duration::from_secs(2));
            s.rate = sm.rate.unwrap_or(s.rate.min(50.0));
            s.workers = s.workers.map(|w| w.min(4));
            s.warmup = Duration::ZERO;
            s.rounds = 1;
            s.pause = Duration::from_millis(200);
        }
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<()> {
        if self.backends.is_empty() {
            bail!("at least one [[backend]] is needed");
        }
        let mut names: Vec<&str> = self.backends.iter().map(|b| b.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            bail!("backend names must be unique");
        }
        if self.duration.is_zero() || self.duration > MAX_RUN {
            bail!("duration must be in (0, {MAX_RUN:?}]");
        }
        if self.warmup >= self.duration {
            bail!(
                "warmup {:?} must be shorter than duration {:?}",
                self.warmup,
                self.duration
            );
        }
        if self.workers.is_none()
            && !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 20_000.0)
        {
            bail!("rate must be in (0, 20000]");
        }
        if self.route_timeout.is_zero() {
            bail!("route_timeout must be > 0");
        }
        if !(1..=16).contains(&self.concurrency) {
            bail!("concurrency must be in 1..=16");
        }
        if !(1..=8).contains(&self.envoys) {
            bail!("envoys must be in 1..=8");
        }
        if self.envoys > 1 && !self.membership.is_static() {
            // Each Envoy would need its own endpoint file rewritten in step with the others.
            bail!("envoys > 1 needs backends that stay in the cluster (no join, leave or zone)");
        }
        if let Some(w) = self.workers.filter(|w| *w < self.envoys as usize) {
            bail!("workers ({w}) must be at least envoys ({})", self.envoys);
        }
        if !(1..=10).contains(&self.rounds) {
            bail!("rounds must be in 1..=10");
        }
        if self.policies.is_empty() {
            bail!("policies must not be empty");
        }
        let mut names: Vec<&str> = self.policies.iter().map(Policy::name).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            bail!("policies must be listed once each");
        }
        if !self.plugin_config.is_object() {
            bail!("plugin_config must be a table");
        }

        Ok(())
    }

    /// Policies in the order of round `round`: as listed in even rounds, reversed in odd ones, so
    /// a drift of the machine over the run does not always favour the same policy.
    pub fn order(&self, round: u32) -> Vec<Policy> {
        let mut v = self.policies.clone();
        if round % 2 == 1 {
            v.reverse();
        }
        v
    }

    /// The first backend with a schedule, from its first phase's start to its last one's end:
    /// the slowdown to watch.
    pub fn slowdown(&self) -> Option<Slowdown> {
        slowdown_of(
            self.backends
                .iter()
                .map(|b| (b.name.as_str(), b.schedule.as_slice())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
duration = "30s"
warmup = "5s"
rate = 200
route_timeout = "1640ms"
[plugin_config]
refresh_interval_ms = 500
[plugin_config.weights]
exponent = 3.0
[[backend]]
name = "a"
latency = "uniform:50-100"
[[backend]]
name = "b"
latency = "fixed:20"
capacity = 4
phases = ["5-35@uniform:300-600"]
"#;

    #[test]
    fn an_outage_is_a_span_of_seconds() {
        assert_eq!(
            Outage::parse("10-40", 2).unwrap(),
            Outage {
                backend: 2,
                from_s: 10.0,
                to_s: 40.0
            }
        );
        for bad in ["40-10", "10", "ten-40", "-1-5", "5-5"] {
            assert!(Outage::parse(bad, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn several_envoys_need_a_static_cluster_and_a_worker_each() {
        let with = |extra: &str| Scenario::parse(&format!("envoys = 3\n{extra}{MINIMAL}"), "x");
        assert_eq!(with("").unwrap().envoys, 3);
        assert_eq!(with("workers = 3\n").unwrap().workers, Some(3));
        let err = |r: Result<Scenario>| format!("{:#}", r.unwrap_err());
        assert!(err(with("workers = 2\n")).contains("workers (2) must be at least envoys (3)"));
        let joining = MINIMAL.replace("name = \"b\"", "name = \"b\"\njoin = \"10s\"");
        assert!(err(Scenario::parse(&format!("envoys = 2\n{joining}"), "x"))
            .contains("envoys > 1 needs backends that stay in the cluster"));
        for n in ["0", "9"] {
            assert!(
                err(Scenario::parse(&format!("envoys = {n}\n{MINIMAL}"), "x"))
                    .contains("envoys must be in 1..=8")
            );
        }
    }

    #[test]
    fn parses_a_scenario_with_defaults() {
        let s = Scenario::parse(MINIMAL, "x").unwrap();
        assert_eq!(s.name, "x");
        assert_eq!(s.duration, Duration::from_secs(30));
        assert_eq!(s.route_timeout, Duration::from_millis(1640));
        assert_eq!(s.policies, Policy::defaults());
        assert_eq!(s.rounds, DEFAULT_ROUNDS);
        assert_eq!(s.concurrency, 2);
        assert_eq!(s.envoys, 1);
        assert_eq!(
            s.plugin_config,
            serde_json::json!({"refresh_interval_ms": 500, "weights": {"exponent": 3.0}})
        );
        assert_eq!(s.backends[1].capacity, Some(4));
        assert_eq!(
            s.slowdown(),
            Some(Slowdown {
                host: "b".into(),
                from_s: 5.0,
                to_s: 35.0
            })
        );
        assert_eq!(s.order(1).first().map(Policy::name), Some("ewma_lowest"));
    }

    #[test]
    fn smoke_shrinks_the_run() {
        let s = Scenario::parse_smoke(MINIMAL, "x").unwrap();
        assert_eq!(s.duration, Duration::from_secs(2));
        assert_eq!(s.warmup, Duration::ZERO);
        assert!(s.rate <= 50.0);
    }

    #[test]
    fn rejects_bad_scenarios() {
        for bad in [
            MINIMAL.replace("warmup = \"5s\"", "warmup = \"40s\""),
            MINIMAL.replace("name = \"b\"", "name = \"a\""),
            MINIMAL.replace("rate = 200", "rate = 200\ncolour = 1"),
            MINIMAL.replace("uniform:50-100", "gauss:1"),
            format!("policies = [\"fastest\"]\n{MINIMAL}"),
            format!("policies = [\"ewma_lb\", \"ewma_lb\"]\n{MINIMAL}"),
        ] {
            assert!(Scenario::parse(&bad, "x").is_err(), "{bad}");
        }
    }

    #[test]
    fn shipped_scenarios_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                Scenario::load(&p).unwrap();
                Scenario::load_smoke(&p).unwrap();
                n += 1;
            }
        }
        assert!(n >= 3);
    }
}
