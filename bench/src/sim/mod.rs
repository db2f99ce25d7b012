//! `simulate`: a fleet of proxies running the plugin's own core against simulated hosts, in
//! virtual time.
//!
//! The benchmark (`compare`) runs one real Envoy; what happens when a thousand independent
//! proxies each run the plugin against the same hosts is out of its reach, and that is where
//! latency chasers herd. This is a deterministic discrete-event simulation of that fleet: N
//! proxies (each an Envoy process with W worker VMs and its own shared data, since shared data
//! is per process) against M hosts that serve k requests at once and queue the rest. The plugin
//! is not modelled: every proxy worker is the core's [`ewma_lb::worker::Worker`], routing and
//! finishing each request and ticking over the proxy's [`ewma_lb::testing::MemoryStore`] through
//! `sync::SharedStore`, with the time of the simulation as its clock. Envoy's own balancers
//! (round robin per worker, random, least request by the process's active requests) are
//! modelled as Envoy documents them; they are also the plugin's fallback.
//!
//! Same seed, same result: arrivals, service times and the balancers draw from separate seeded
//! streams, so every policy sees the same arrivals.

pub mod engine;
pub mod file;
pub mod report;

use std::time::Duration;

use harness::latency::Latency;
use harness::Phase;
use serde_json::Value;

use crate::policy::Policy;

/// What one simulation runs.
#[derive(Clone, Debug)]
pub struct SimSpec {
    pub name: String,
    pub description: String,
    /// Envoy processes, each with its own shared data.
    pub proxies: usize,
    /// Worker VMs per proxy (`--concurrency`).
    pub workers: usize,
    pub hosts: Vec<HostSpec>,
    /// Arrivals per second over the whole fleet.
    pub rate: f64,
    pub arrivals: Arrivals,
    /// Request classes; empty: every request costs the host's service time.
    pub costs: Vec<Cost>,
    pub duration: Duration,
    /// Left out of the figures.
    pub warmup: Duration,
    pub route_timeout: Duration,
    pub policies: Vec<Policy>,
    pub plugin_config: Value,
    /// The plugin knows the first hosts from its configuration (`clusters.<name>.endpoints`)
    /// rather than learning them from traffic.
    pub static_endpoints: bool,
    pub seed: u64,
}

/// How requests arrive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Evenly spaced, as the benchmark's open-loop load generator sends them.
    Uniform,
    /// A Poisson process: many independent clients.
    Poisson,
    /// Closed loop: this many clients, each sending its next request when its last one is
    /// answered (`rate` is ignored).
    Closed { clients: usize },
    /// At these times (ns since the start, sorted): the arrivals of an access log
    /// (`ewma-lb-tune`); `rate` is ignored.
    Trace(std::sync::Arc<[u64]>),
}

impl Arrivals {
    /// For reports: `uniform`, `poisson`, `closed`, `trace`.
    pub fn label(&self) -> &'static str {
        match self {
            Arrivals::Uniform => "uniform",
            Arrivals::Poisson => "poisson",
            Arrivals::Closed { .. } => "closed",
            Arrivals::Trace(_) => "trace",
        }
    }
}

/// A class of requests on the route: `share` of them cost `factor` times a host's service time
/// (a route where most requests are cheap and some are dear).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    pub share: f64,
    pub factor: f64,
}

/// One simulated host.
#[derive(Clone, Debug)]
pub struct HostSpec {
    pub name: String,
    /// The group it was declared in, for reports of large fleets.
    pub group: String,
    /// Service time outside phases.
    pub latency: Latency,
    /// Requests served at once; the rest queue (FIFO). `None`: no limit.
    pub capacity: Option<usize>,
    /// Share of requests answered 503 after their service time.
    pub fail_rate: f64,
    /// Windows with another service time (seconds since the start).
    pub phases: Vec<Phase>,
    /// Windows in which a share of requests fails fast: 503 after 1 ms.
    pub failing: Vec<FailPhase>,
    /// When the host joins the cluster (0: from the start): a scale-out.
    pub join_s: f64,
    /// A service model fitted from an access log (`ewma-lb-tune`): when set, it gives every
    /// request's service time and failure instead of `latency`, `phases`, `fail_rate` and
    /// `failing`.
    pub model: Option<std::sync::Arc<FittedHost>>,
}

/// What a request costs one host, fitted from an access log (`tune::model`): its service time is
/// a level that moves with time (one per bucket of `bucket_s`) times a residual drawn from the
/// ones the log showed (the host's queue is its `capacity`); it fails with its bucket's failure
/// rate.
#[derive(Clone, Debug, PartialEq)]
pub struct FittedHost {
    pub bucket_s: f64,
    /// ln(ms) with nothing else in flight, per bucket.
    pub level: Vec<f64>,
    /// Failure probability per bucket.
    pub fail: Vec<f64>,
    /// Residuals of ln(ms) around the fit, to draw from (never empty: `[0]` for none).
    pub residuals: Vec<f64>,
}

impl FittedHost {
    /// A service time and whether the request fails, for a request whose service starts at `t_s`.
    pub fn sample<R: rand::Rng + ?Sized>(&self, t_s: f64, rng: &mut R) -> (Duration, bool) {
        let last = self.level.len().saturating_sub(1);
        let b = ((t_s / self.bucket_s).max(0.0) as usize).min(last);
        let level = self.level.get(b).copied().unwrap_or(0.0);
        let residual = match self.residuals.len() {
            0 => 0.0,
            n => self.residuals[rng.random_range(0..n)],
        };
        let ms = (level + residual).exp().min(3_600_000.0);
        let fail = self.fail.get(b).copied().unwrap_or(0.0).clamp(0.0, 1.0);
        let failed = fail > 0.0 && rng.random_bool(fail);
        (Duration::from_secs_f64(ms / 1000.0), failed)
    }
}

/// A window of fast failures.
#[derive(Clone, Debug, PartialEq)]
pub struct FailPhase {
    pub from_s: f64,
    pub to_s: f64,
    /// Share of the requests started in the window that fail.
    pub share: f64,
}

impl HostSpec {
    pub fn new(name: impl Into<String>, latency: Latency) -> HostSpec {
        let name = name.into();
        HostSpec {
            group: name.clone(),
            name,
            latency,
            capacity: None,
            fail_rate: 0.0,
            phases: Vec::new(),
            failing: Vec::new(),
            join_s: 0.0,
            model: None,
        }
    }

    /// The service time profile in force at `t_s`.
    pub fn latency_at(&self, t_s: f64) -> &Latency {
        self.phases
            .iter()
            .find(|p| t_s >= p.from_s && t_s < p.to_s)
            .map_or(&self.latency, |p| &p.latency)
    }

    /// The share of requests failing fast at `t_s`.
    pub fn failing_at(&self, t_s: f64) -> f64 {
        self.failing
            .iter()
            .find(|p| t_s >= p.from_s && t_s < p.to_s)
            .map_or(0.0, |p| p.share)
    }

    /// Requests per second this host serves at most, from its base profile's mean.
    pub fn capacity_per_s(&self) -> Option<f64> {
        let mean_s = mean_ms(&self.latency) / 1000.0;
        self.capacity.map(|k| {
            if mean_s > 0.0 {
                k as f64 / mean_s
            } else {
                f64::INFINITY
            }
        })
    }
}

/// The mean of a latency profile, in ms.
pub fn mean_ms(latency: &Latency) -> f64 {
    match *latency {
        Latency::Fixed(ms) => ms as f64,
        Latency::Uniform { lo_ms, hi_ms } => (lo_ms + hi_ms) as f64 / 2.0,
        Latency::LogNormal { median_ms, sigma } => median_ms * (sigma * sigma / 2.0).exp(),
    }
}

/// The address of host `i`: `10.a.b.c:8080`, as Envoy would report it in `upstream.address`.
pub fn host_address(i: usize) -> String {
    format!(
        "10.{}.{}.{}:8080",
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

// === Running ===

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use report::SimResult;

/// How to run a simulation.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// One run per policy and seed; tables give the median and range over the seeds.
    pub seeds: Vec<u64>,
    /// Runs at once (each run is single-threaded; runs are independent).
    pub threads: usize,
    pub out_dir: PathBuf,
    pub plots: bool,
}

/// Everything a simulation produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimReport {
    pub name: String,
    pub description: String,
    pub settings: serde_json::Value,
    /// Host names when there are few enough for a column each ([`report::PER_HOST_LIMIT`]).
    pub hosts: Vec<String>,
    pub groups: Vec<report::Group>,
    pub results: Vec<SimResult>,
    pub files: Vec<String>,
}

/// Runs every (policy, seed) of `spec`, `opts.threads` at a time; results in the order of the
/// policies, whatever the threads did first.
pub fn run_all(
    spec: &SimSpec,
    seeds: &[u64],
    threads: usize,
    progress: bool,
) -> Result<Vec<SimResult>> {
    let jobs: Vec<(usize, u64)> = (0..spec.policies.len())
        .flat_map(|p| seeds.iter().map(move |s| (p, *s)))
        .collect();
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<report::RunSummary>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(p, seed)) = jobs.get(i) else { break };
                let policy = &spec.policies[p];
                let run_spec = SimSpec { seed, ..spec.clone() };
                let result = engine::run(&run_spec, policy).map(|out| report::RunSummary::of(&run_spec, &out));
                if progress {
                    match &result {
                        Ok(r) => eprintln!(
                            "  {} x {} {:<18} seed {seed}: p50 {:.1} ms p99 {:.1} ms, utilisation spread {:.1} %, flap {:.1} % of fair ({:.1} s)",
                            spec.proxies, spec.workers, policy.name(), r.figures.p50_ms, r.figures.p99_ms, r.fleet.util_cv_pct, r.fleet.flap_fair_pct, r.fleet.wall_s
                        ),
                        Err(e) => eprintln!("  {} seed {seed}: {e:#}", policy.name()),
                    }
                }
                if let Ok(mut d) = done.lock() {
                    d[i] = Some(result);
                }
            });
        }
    });
    let done = done
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
    let mut results: Vec<SimResult> = spec
        .policies
        .iter()
        .map(|p| SimResult {
            policy: p.name().to_owned(),
            figures: crate::figures::PolicyFigures {
                policy: p.name().to_owned(),
                rounds: Vec::new(),
            },
            ..SimResult::default()
        })
        .collect();
    for ((p, seed), run) in jobs.into_iter().zip(done) {
        let run = run.context("a simulation did not finish")??;
        let r = &mut results[p];
        if r.seeds.is_empty() {
            r.group_seconds = run.group_seconds;
            r.host_seconds = run.host_seconds;
            r.host_util_pct = run.host_util_pct;
            r.quantiles_ms = run.quantiles_ms;
        }
        r.seeds.push(seed);
        r.figures.rounds.push(run.figures);
        r.fleet.push(run.fleet);
    }
    Ok(results)
}

/// Simulates `spec` with every policy and seed, writes results.md, results.json and plots.
pub fn simulate(spec: &SimSpec, opts: &SimOptions) -> Result<SimReport> {
    if opts.plots {
        crate::plot::ensure_font()?;
    }
    std::fs::create_dir_all(&opts.out_dir)
        .with_context(|| format!("creating {}", opts.out_dir.display()))?;
    eprintln!(
        "simulating {}: {} proxies x {} workers, {} hosts, {:.0} req/s, {:?} ({:?} warm-up), {} policies x {} seed(s)",
        spec.name,
        spec.proxies,
        spec.workers,
        spec.hosts.len(),
        spec.rate,
        spec.duration,
        spec.warmup,
        spec.policies.len(),
        opts.seeds.len()
    );
    let results = run_all(spec, &opts.seeds, opts.threads, true)?;
    let mut report = SimReport {
        name: spec.name.clone(),
        description: spec.description.clone(),
        settings: settings(spec, &opts.seeds),
        hosts: if spec.hosts.len() <= report::PER_HOST_LIMIT {
            spec.hosts.iter().map(|h| h.name.clone()).collect()
        } else {
            Vec::new()
        },
        groups: report::groups(spec),
        results,
        files: Vec::new(),
    };
    if opts.plots {
        for f in report::plots(&opts.out_dir, spec, &report.results)? {
            report.files.push(
                f.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
    }
    std::fs::write(opts.out_dir.join("results.md"), markdown(&report))
        .context("writing results.md")?;
    std::fs::write(
        opts.out_dir.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )
    .context("writing results.json")?;
    report
        .files
        .extend(["results.md".to_string(), "results.json".to_string()]);
    Ok(report)
}

fn settings(spec: &SimSpec, seeds: &[u64]) -> serde_json::Value {
    serde_json::json!({
        "proxies": spec.proxies,
        "workers": spec.workers,
        "hosts": spec.hosts.len(),
        "rate_per_s": spec.rate,
        "arrivals": spec.arrivals.label(),
        "duration_s": spec.duration.as_secs_f64(),
        "warmup_s": spec.warmup.as_secs_f64(),
        "route_timeout_s": spec.route_timeout.as_secs_f64(),
        "static_endpoints": spec.static_endpoints,
        "plugin_config": spec.plugin_config,
        "policies": spec.policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "variants": spec.policies.iter().filter(|p| p.uses_plugin() && p.name() != "ewma_lb").map(|p| (p.name().to_owned(), p.overrides().clone())).collect::<serde_json::Map<_, _>>(),
        "seeds": seeds,
    })
}

/// The load line of a simulation: fleet, arrivals, duration, plugin configuration, seeds.
pub fn load_line(report: &SimReport) -> String {
    let st = &report.settings;
    let n = |k: &str| st[k].as_f64().unwrap_or(0.0);
    format!(
        "{} proxies x {} workers, {} hosts; {} arrivals at {:.0} req/s over the fleet; {} s simulated, the first {} s left out of \
         the figures; route timeout {} s; plugin configuration `{}`{}; seeds {} (each figure the median (min-max) over them).",
        st["proxies"],
        st["workers"],
        st["hosts"],
        st["arrivals"].as_str().unwrap_or("?"),
        n("rate_per_s"),
        n("duration_s"),
        n("warmup_s"),
        n("route_timeout_s"),
        st["plugin_config"],
        if st["static_endpoints"].as_bool().unwrap_or(false) { ", the first hosts as its static endpoints" } else { ", hosts learned from traffic" },
        st["seeds"],
    )
}

/// results.md of a simulation.
pub fn markdown(report: &SimReport) -> String {
    use std::fmt::Write as _;
    let mut md = format!("# Simulation `{}`\n\n", report.name);
    if !report.description.is_empty() {
        let _ = writeln!(md, "{}\n", report.description);
    }
    let _ = writeln!(md, "{}\n", load_line(report));
    if !report.hosts.is_empty() {
        md.push_str(&report::bench_table(&report.hosts, &report.results));
        md.push('\n');
    }
    md.push_str(&report::fleet_table(&report.results));
    md.push('\n');
    if report.hosts.is_empty() {
        md.push_str("Traffic per host group:\n\n");
        md.push_str(&report::group_table(&report.groups, &report.results));
        md.push('\n');
    }
    let wall: f64 = report
        .results
        .iter()
        .flat_map(|r| r.fleet.iter().map(|f| f.wall_s))
        .sum();
    let _ = writeln!(md, "Simulation time: {wall:.1} s of CPU over all runs.");
    let plots: Vec<String> = report
        .files
        .iter()
        .filter(|f| !f.starts_with("results"))
        .map(|f| format!("`{f}`"))
        .collect();
    if !plots.is_empty() {
        let _ = writeln!(md, "\nPlots: {}.", plots.join(", "));
    }
    md
}

/// One fleet size of a scaling run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScalePoint {
    pub proxies: usize,
    pub rate_per_proxy: f64,
    pub results: Vec<SimResult>,
}

/// Runs `spec` at each fleet size in `proxies` (same hosts, same total load: each proxy gets
/// less of it as the fleet grows), writes scale.md, scale.json and plots of how each policy's
/// figures move with the fleet size.
pub fn scale(spec: &SimSpec, proxies: &[usize], opts: &SimOptions) -> Result<Vec<ScalePoint>> {
    if opts.plots {
        crate::plot::ensure_font()?;
    }
    std::fs::create_dir_all(&opts.out_dir)
        .with_context(|| format!("creating {}", opts.out_dir.display()))?;
    let mut points = Vec::new();
    for &n in proxies {
        let s = SimSpec {
            proxies: n,
            ..spec.clone()
        };
        file::validate(&s)?;
        eprintln!("{} proxies ({:.1} req/s each):", n, s.rate / n as f64);
        let results = run_all(&s, &opts.seeds, opts.threads, true)?;
        points.push(ScalePoint {
            proxies: n,
            rate_per_proxy: s.rate / n as f64,
            results,
        });
    }
    let mut md = format!(
        "# Simulation `{}` from {} to {} proxies\n\n",
        spec.name,
        proxies.first().unwrap_or(&0),
        proxies.last().unwrap_or(&0)
    );
    md.push_str(&scale_table(&points));
    std::fs::write(opts.out_dir.join("scale.md"), &md).context("writing scale.md")?;
    std::fs::write(
        opts.out_dir.join("scale.json"),
        serde_json::to_string_pretty(&points)?,
    )
    .context("writing scale.json")?;
    if opts.plots {
        type Figure = fn(&SimResult) -> Option<f64>;
        let figures: [(&str, &str, Figure); 3] = [
            ("scale-p99", "p99 latency, ms", |r| {
                r.figures.median(|f| Some(f.p99_ms))
            }),
            (
                "scale-utilisation-spread",
                "utilisation spread over hosts (CV), %",
                |r| r.spread(|f| Some(f.util_cv_pct)).map(|s| s.median),
            ),
            ("scale-flapping", "flapping, % of a fair share", |r| {
                r.spread(|f| Some(f.flap_fair_pct)).map(|s| s.median)
            }),
        ];
        for (stem, what, figure) in figures {
            let lines: Vec<crate::plot::Line> = spec
                .policies
                .iter()
                .map(|p| crate::plot::Line {
                    label: p.name().to_owned(),
                    points: points
                        .iter()
                        .filter_map(|pt| {
                            pt.results
                                .iter()
                                .find(|r| r.policy == p.name())
                                .and_then(figure)
                                .map(|y| (pt.proxies as f64, y))
                        })
                        .collect(),
                })
                .collect();
            crate::plot::lines(
                &opts.out_dir,
                stem,
                &format!("{} (simulated): {what}", spec.name),
                ("proxies (log scale)", what),
                true,
                &lines,
            )?;
        }
    }
    Ok(points)
}

/// One row per fleet size and policy.
pub fn scale_table(points: &[ScalePoint]) -> String {
    use std::fmt::Write as _;
    let mut t = String::from(
        "| proxies | req/s per proxy | policy | p50 ms | p95 ms | p99 ms | errors % | utilisation spread (CV %) | hottest host % | flap, % of fair | busiest hosts' share (p99, × fair) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for pt in points {
        for r in &pt.results {
            let b = |f: &dyn Fn(&crate::figures::RoundFigures) -> Option<f64>| {
                r.figures.spread(f).map_or("-".into(), |s| s.show(1))
            };
            let fl = |f: &dyn Fn(&report::FleetFigures) -> Option<f64>, d: usize| {
                r.spread(f).map_or("-".into(), |s| s.show(d))
            };
            let _ = writeln!(
                t,
                "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                pt.proxies,
                pt.rate_per_proxy,
                r.policy,
                b(&|f| Some(f.p50_ms)),
                b(&|f| Some(f.p95_ms)),
                b(&|f| Some(f.p99_ms)),
                r.figures
                    .spread(|f| Some(f.errors_pct))
                    .map_or("-".into(), |s| s.show(2)),
                fl(&|f| Some(f.util_cv_pct), 1),
                fl(&|f| Some(f.util_max_pct), 1),
                fl(&|f| Some(f.flap_fair_pct), 1),
                fl(&|f| Some(f.peak_share_x_fair), 2),
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hosts: Vec<HostSpec>, rate: f64, policies: &[&str]) -> SimSpec {
        SimSpec {
            name: "t".into(),
            description: String::new(),
            proxies: 1,
            workers: 2,
            hosts,
            rate,
            arrivals: Arrivals::Uniform,
            costs: Vec::new(),
            duration: Duration::from_secs(6),
            warmup: Duration::from_secs(2),
            route_timeout: Duration::from_secs(1),
            policies: policies.iter().map(|p| Policy::get(p).unwrap()).collect(),
            plugin_config: serde_json::json!({}),
            static_endpoints: false,
            seed: 3,
        }
    }

    fn run(s: &SimSpec) -> Vec<SimResult> {
        run_all(s, &[s.seed], 1, false).unwrap()
    }

    #[test]
    fn a_saturated_host_is_busy_all_the_time_and_no_more() {
        // One server, 10 ms a request, 200 arrivals a second: twice what it can serve.
        let host = HostSpec {
            capacity: Some(1),
            ..HostSpec::new("only", Latency::Fixed(10))
        };
        let r = run(&spec(vec![host], 200.0, &["random"]));
        let util = r[0].fleet[0].util_max_pct;
        assert!(
            (99.0..=100.0 + 1e-6).contains(&util),
            "utilisation {util} %"
        );
        assert!(
            r[0].figures.rounds[0].errors_pct > 10.0,
            "the queue overflows into timeouts"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let hosts = vec![
            HostSpec::new(
                "a",
                Latency::LogNormal {
                    median_ms: 20.0,
                    sigma: 0.3,
                },
            ),
            HostSpec::new("b", Latency::Fixed(30)),
        ];
        let s = spec(hosts, 300.0, &["least_request", "ewma_lb"]);
        let (x, y) = (run(&s), run(&s));
        for (a, b) in x.iter().zip(&y) {
            assert_eq!(a.figures, b.figures, "{}", a.policy);
        }
    }

    /// The simulated `/clusters` poll (`engine::clusters_page`): hosts that join reach a
    /// proxy's table through the page, where otherwise a proxy that rarely meets a given host
    /// learns it late. 40 proxies, 100 hosts, 10 requests per proxy per second: a proxy sends a
    /// given host a request every 10 s or so.
    #[test]
    fn hosts_that_join_are_learned_from_the_clusters_page() {
        let mut hosts: Vec<HostSpec> = (0..100)
            .map(|i| HostSpec {
                group: "old".into(),
                ..HostSpec::new(format!("old-{i}"), Latency::Fixed(20))
            })
            .collect();
        hosts.extend((0..20).map(|i| HostSpec {
            group: "new".into(),
            join_s: 3.0,
            ..HostSpec::new(format!("new-{i}"), Latency::Fixed(20))
        }));
        let variants = serde_json::json!({
            "with_page": {"envoy_health": {"admin_cluster": "envoy_admin"}}
        });
        let variants = variants.as_object().unwrap();
        let mut s = spec(hosts, 400.0, &[]);
        s.proxies = 40;
        s.duration = Duration::from_secs(10);
        s.warmup = Duration::from_secs(3);
        s.static_endpoints = true;
        s.policies = ["ewma_lb", "with_page"]
            .iter()
            .map(|p| Policy::named(p, variants).unwrap())
            .collect();
        let r = run(&s);
        let new = |i: usize| r[i].fleet[0].group_shares_pct["new"];
        // Fair: 20 of 120 hosts over the 7 s after the join, 16.7 %.
        eprintln!(
            "newcomers: from the page {:.1} %, from traffic alone {:.1} %",
            new(1),
            new(0)
        );
        assert!(
            new(1) > 10.0 && new(1) > 1.4 * new(0),
            "from the page {:.1} %, from traffic alone {:.1} %",
            new(1),
            new(0)
        );
    }

    /// Issue 16 judges flapping among equal hosts: a host that fails (or slows down) is left out
    /// of the steady hosts' figure, which is then over the two equal ones alone.
    #[test]
    fn the_equal_hosts_flapping_leaves_out_a_failing_host() {
        let lognormal = Latency::LogNormal {
            median_ms: 20.0,
            sigma: 0.3,
        };
        let failing = HostSpec {
            failing: vec![FailPhase {
                from_s: 0.0,
                to_s: 6.0,
                share: 0.5,
            }],
            ..HostSpec::new("f", lognormal.clone())
        };
        let hosts = vec![
            HostSpec::new("a", lognormal.clone()),
            HostSpec::new("b", lognormal),
            failing,
        ];
        let r = run(&spec(hosts, 300.0, &["round_robin"]));
        let round = &r[0].figures.rounds[0];
        let steady = round.steady_flap_pp.expect("a steady hosts' figure");
        // Round robin's two equal hosts: half each every second, give or take a request.
        assert!(
            steady < 0.5,
            "round robin flaps {steady} pp among equal hosts"
        );
    }

    #[test]
    fn the_plugin_leaves_a_slow_host() {
        let hosts = vec![
            HostSpec::new("fast", Latency::Fixed(20)),
            HostSpec::new("slow", Latency::Fixed(400)),
        ];
        let r = run(&spec(hosts, 200.0, &["random", "ewma_lb"]));
        let slow = |i: usize| r[i].figures.rounds[0].shares_pct["slow"];
        assert!((slow(0) - 50.0).abs() < 5.0, "random splits: {}", slow(0));
        assert!(
            slow(1) < 2.0,
            "ewma_lb keeps the slow host to its floor and probes: {}",
            slow(1)
        );
    }
}
