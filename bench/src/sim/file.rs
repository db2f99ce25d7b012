//! What `simulate` reads: a benchmark scenario (bench/scenarios/*.toml, simulated as one proxy
//! with the scenario's backends, for the cross-check against the real Envoy) or a fleet file
//! (bench/scenarios/fleet/*.toml: many proxies, host groups, events). Fleet files are
//! documented by example in bench/scenarios/fleet/ and in bench/README.md.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use harness::latency::{parse_duration, Latency};
use harness::Phase;
use serde::Deserialize;

use super::{Arrivals, FailPhase, HostSpec, SimSpec};
use crate::policy::Policy;
use crate::scenario::Scenario;

/// Upper bound of simulated time, so a typo cannot run for hours.
pub const MAX_SIMULATED: Duration = Duration::from_secs(3600);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetFile {
    name: Option<String>,
    description: Option<String>,
    proxies: usize,
    /// Worker VMs per proxy (Envoy's --concurrency).
    workers: usize,
    duration: String,
    warmup: Option<String>,
    /// Arrivals per second over the fleet ...
    rate: Option<f64>,
    /// ... or the offered load as a share of the hosts' total capacity at their base latency.
    utilisation: Option<f64>,
    /// "poisson" (default) or "uniform"; or `clients` for a closed loop.
    arrivals: Option<String>,
    /// Closed loop: this many clients, each waiting for its answer before the next request.
    clients: Option<usize>,
    /// Request classes: `share` of the requests cost `factor` times the service time.
    #[serde(default)]
    costs: Vec<FileCost>,
    route_timeout: String,
    /// The plugin knows the first hosts from its configuration (default true).
    static_endpoints: Option<bool>,
    policies: Option<Vec<String>>,
    seed: Option<u64>,
    #[serde(default)]
    plugin_config: Option<toml::Table>,
    #[serde(default)]
    variants: Option<toml::Table>,
    hosts: Vec<HostGroup>,
    #[serde(default)]
    smoke: Option<SmokeFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostGroup {
    name: String,
    count: usize,
    latency: String,
    capacity: Option<usize>,
    fail: Option<f64>,
    /// "FROM-TO@LATENCY", seconds since the start: a slowdown.
    #[serde(default)]
    phases: Vec<String>,
    /// "FROM-TO@SHARE": a share of requests fails fast (503 after 1 ms).
    #[serde(default)]
    failing: Vec<String>,
    /// When the group joins the cluster: a scale-out.
    join: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCost {
    share: f64,
    factor: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SmokeFile {
    proxies: Option<usize>,
    duration: Option<String>,
    warmup: Option<String>,
}

/// The policies of a fleet run when the file does not say: the plugin against Envoy's least
/// request and random, and the naive lowest-latency pick.
pub const FLEET_POLICIES: [&str; 4] = ["least_request", "random", "ewma_lb", "ewma_lowest"];

/// Reads a scenario or fleet file; `smoke` shrinks it to seconds of work.
pub fn load(path: &Path, smoke: bool) -> Result<SimSpec> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("simulation");
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let spec = if table.contains_key("hosts") {
        parse_fleet(&text, stem, smoke)
    } else {
        let s = if smoke {
            Scenario::parse_smoke(&text, stem)?
        } else {
            Scenario::parse(&text, stem)?
        };
        from_scenario(&s)
    };
    spec.with_context(|| format!("simulation {}", path.display()))
}

/// A benchmark scenario as the simulator runs it: its Envoys (one unless it says) with their
/// concurrency, its backends as hosts, its open-loop rate with evenly spaced arrivals, and the
/// plugin learning hosts from traffic as it does in the benchmark's Envoy.
pub fn from_scenario(s: &Scenario) -> Result<SimSpec> {
    if !s.outages.is_empty() {
        // Refused connections and Envoy's retries on them are not modelled: simulated, the
        // scenario would quietly be another one.
        bail!("a backend `down` span is not simulated: run this scenario with `compare`");
    }
    if let Some(b) = s.backends.iter().find(|b| b.orca.is_some()) {
        // The simulated hosts report no load: the score's load term would silently be absent.
        bail!(
            "backend {}: ORCA load reports are not simulated: run this scenario with `compare`",
            b.name
        );
    }
    let hosts = s
        .backends
        .iter()
        .map(|b| HostSpec {
            capacity: b.capacity,
            fail_rate: b.fail_rate,
            phases: b.schedule.clone(),
            ..HostSpec::new(b.name.clone(), b.latency.clone())
        })
        .collect();
    Ok(SimSpec {
        name: s.name.clone(),
        description: s.description.clone(),
        proxies: s.envoys as usize,
        workers: s.concurrency as usize,
        hosts,
        rate: s.rate,
        arrivals: match s.workers {
            Some(clients) => Arrivals::Closed { clients },
            None => Arrivals::Uniform,
        },
        costs: Vec::new(),
        duration: s.duration,
        warmup: s.warmup,
        route_timeout: s.route_timeout,
        policies: s.policies.clone(),
        plugin_config: s.plugin_config.clone(),
        static_endpoints: false,
        seed: 1,
    })
}

fn parse_fleet(text: &str, stem: &str, smoke: bool) -> Result<SimSpec> {
    let f: FleetFile = toml::from_str(text)?;
    let dur = |s: &str, what: &str| parse_duration(s).with_context(|| what.to_string());
    let mut hosts = Vec::new();
    for g in &f.hosts {
        let latency: Latency = g
            .latency
            .parse()
            .with_context(|| format!("hosts {}", g.name))?;
        let phases = g
            .phases
            .iter()
            .map(|p| p.parse::<Phase>())
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("hosts {}", g.name))?;
        let failing = g
            .failing
            .iter()
            .map(|p| parse_fail_phase(p))
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("hosts {}", g.name))?;
        let join_s = g
            .join
            .as_deref()
            .map(|j| dur(j, "join"))
            .transpose()?
            .map_or(0.0, |d| d.as_secs_f64());
        if g.count == 0 {
            bail!("hosts {}: count must be at least 1", g.name);
        }
        for i in 0..g.count {
            hosts.push(HostSpec {
                name: format!("{}-{i}", g.name),
                group: g.name.clone(),
                latency: latency.clone(),
                capacity: g.capacity,
                fail_rate: g.fail.unwrap_or(0.0),
                phases: phases.clone(),
                failing: failing.clone(),
                join_s,
                model: None,
            });
        }
    }
    let variants = match serde_json::to_value(f.variants.unwrap_or_default())? {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    let names: Vec<String> = f
        .policies
        .unwrap_or_else(|| FLEET_POLICIES.iter().map(|s| s.to_string()).collect());
    let policies = names
        .iter()
        .map(|p| Policy::named(p, &variants))
        .collect::<Result<Vec<_>>>()?;
    let rate = match (f.rate, f.utilisation) {
        _ if f.clients.is_some() => 0.0,
        (Some(r), None) => r,
        (None, Some(u)) => {
            let initial = hosts.iter().filter(|h| h.join_s <= 0.0);
            let capacity: f64 = initial
                .map(|h| h.capacity_per_s().unwrap_or(f64::NAN))
                .sum();
            if !capacity.is_finite() {
                bail!("utilisation needs every host that is there from the start to have a capacity (or give rate)");
            }
            // A request of a dearer class holds a server longer.
            let classes: f64 = f.costs.iter().map(|c| c.share).sum();
            let mean_cost =
                f.costs.iter().map(|c| c.share * c.factor).sum::<f64>() + (1.0 - classes).max(0.0);
            u * capacity / mean_cost.max(f64::MIN_POSITIVE)
        }
        _ => bail!("give either rate or utilisation"),
    };
    let mut spec = SimSpec {
        name: f.name.unwrap_or_else(|| stem.to_owned()),
        description: f.description.unwrap_or_default().trim().to_owned(),
        proxies: f.proxies,
        workers: f.workers,
        hosts,
        rate,
        arrivals: match (f.clients, f.arrivals.as_deref()) {
            (Some(clients), None) if clients > 0 => Arrivals::Closed { clients },
            (Some(_), _) => bail!("clients: a positive count, without arrivals"),
            (None, None | Some("poisson")) => Arrivals::Poisson,
            (None, Some("uniform")) => Arrivals::Uniform,
            (None, Some(other)) => bail!("arrivals {other:?}: poisson or uniform"),
        },
        costs: f
            .costs
            .iter()
            .map(|c| {
                if c.share > 0.0 && c.share <= 1.0 && c.factor > 0.0 && c.factor.is_finite() {
                    Ok(super::Cost {
                        share: c.share,
                        factor: c.factor,
                    })
                } else {
                    bail!("costs: share in (0, 1] and factor > 0, got {c:?}")
                }
            })
            .collect::<Result<Vec<_>>>()?,
        duration: dur(&f.duration, "duration")?,
        warmup: f
            .warmup
            .as_deref()
            .map(|w| dur(w, "warmup"))
            .transpose()?
            .unwrap_or_default(),
        route_timeout: dur(&f.route_timeout, "route_timeout")?,
        policies,
        plugin_config: serde_json::to_value(f.plugin_config.unwrap_or_default())?,
        static_endpoints: f.static_endpoints.unwrap_or(true),
        seed: f.seed.unwrap_or(1),
    };
    if smoke {
        let sm = f.smoke.unwrap_or_default();
        let proxies = sm.proxies.unwrap_or(spec.proxies.min(10));
        // The same load per proxy.
        spec.rate *= proxies as f64 / spec.proxies as f64;
        spec.proxies = proxies;
        spec.duration = sm
            .duration
            .as_deref()
            .map(|d| dur(d, "smoke.duration"))
            .transpose()?
            .unwrap_or(Duration::from_secs(5));
        spec.warmup = sm
            .warmup
            .as_deref()
            .map(|d| dur(d, "smoke.warmup"))
            .transpose()?
            .unwrap_or(Duration::from_secs(1));
    }
    validate(&spec)?;
    Ok(spec)
}

/// "FROM-TO@SHARE", seconds.
fn parse_fail_phase(s: &str) -> Result<FailPhase> {
    let (range, share) = s
        .split_once('@')
        .with_context(|| format!("failing {s:?}: expected FROM-TO@SHARE"))?;
    let (from, to) = range
        .split_once('-')
        .with_context(|| format!("failing {s:?}: expected FROM-TO@SHARE"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<f64>()
            .with_context(|| format!("failing {s:?}: {v:?} is not a number"))
    };
    let (from_s, to_s, share) = (num(from)?, num(to)?, num(share)?);
    if !(from_s < to_s && (0.0..=1.0).contains(&share)) {
        bail!("failing {s:?}: FROM < TO and SHARE within 0..=1");
    }
    Ok(FailPhase {
        from_s,
        to_s,
        share,
    })
}

/// Checks a spec's bounds, whatever it came from.
pub fn validate(spec: &SimSpec) -> Result<()> {
    if spec.hosts.is_empty() {
        bail!("at least one host is needed");
    }
    if !(1..=100_000).contains(&spec.proxies) || !(1..=64).contains(&spec.workers) {
        bail!("proxies must be in 1..=100000 and workers in 1..=64");
    }
    if !(spec.rate.is_finite() && spec.rate > 0.0) {
        bail!("the arrival rate must be positive, got {}", spec.rate);
    }
    if spec.duration.is_zero() || spec.duration > MAX_SIMULATED || spec.warmup >= spec.duration {
        bail!("duration must be in (0, {MAX_SIMULATED:?}] and longer than warmup");
    }
    if spec.route_timeout.is_zero() {
        bail!("route_timeout must be > 0");
    }
    if spec
        .hosts
        .iter()
        .any(|h| h.capacity == Some(0) || !(0.0..=1.0).contains(&h.fail_rate))
    {
        bail!("a host's capacity must be at least 1 and its fail rate within 0..=1");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLEET: &str = r#"
proxies = 100
workers = 2
duration = "20s"
warmup = "5s"
utilisation = 0.5
route_timeout = "2s"
[[hosts]]
name = "big"
count = 3
latency = "fixed:50"
capacity = 4
[[hosts]]
name = "new"
count = 2
latency = "fixed:50"
capacity = 4
join = "10s"
failing = ["12-14@0.5"]
[smoke]
proxies = 10
"#;

    #[test]
    fn fleet_files_expand_groups_and_derive_the_rate() {
        let s = parse_fleet(FLEET, "f", false).unwrap();
        assert_eq!(s.hosts.len(), 5);
        assert_eq!(s.hosts[3].name, "new-0");
        assert_eq!(s.hosts[4].join_s, 10.0);
        // 3 initial hosts of 4 workers at 50 ms: 240 req/s; half of it.
        assert!((s.rate - 120.0).abs() < 1e-9, "{}", s.rate);
        assert_eq!(s.hosts[4].failing_at(13.0), 0.5);
        assert_eq!(
            s.policies.iter().map(Policy::name).collect::<Vec<_>>(),
            FLEET_POLICIES
        );
        let smoke = parse_fleet(FLEET, "f", true).unwrap();
        assert_eq!(smoke.proxies, 10);
        assert!((smoke.rate - 12.0).abs() < 1e-9);
    }

    #[test]
    fn bad_fleet_files_are_refused() {
        for bad in [
            FLEET.replace("utilisation = 0.5", ""),
            FLEET.replace("count = 3", "count = 0"),
            FLEET.replace("12-14@0.5", "14-12@0.5"),
            FLEET.replace("proxies = 100", "proxies = 0"),
            FLEET.replace("workers = 2", "workers = 2\ncolour = 1"),
        ] {
            assert!(parse_fleet(&bad, "f", false).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_scenario_becomes_its_envoys_and_orca_reports_are_refused() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let three =
            crate::scenario::Scenario::load(&dir.join("orca-capacity-3-envoys.toml")).unwrap();
        let err = from_scenario(&three).unwrap_err().to_string();
        assert!(err.contains("ORCA load reports are not simulated"), "{err}");
        let mut plain = three.clone();
        for b in &mut plain.backends {
            b.orca = None;
        }
        let spec = from_scenario(&plain).unwrap();
        assert_eq!((spec.proxies, spec.workers), (3, 1));
    }

    #[test]
    fn shipped_fleet_files_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/fleet");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                load(&p, false).unwrap();
                load(&p, true).unwrap();
                n += 1;
            }
        }
        assert!(n >= 1);
    }
}
