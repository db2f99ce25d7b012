//! `compare`: one scenario through a real Envoy with each policy in turn, same backends, in
//! rounds of alternating order; then a markdown table of each figure's median and spread over
//! the rounds, results.json and plots.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use harness::config::LISTENER;
use harness::load::{LoadSpec, Record};
use harness::summary::{shares_per_second, SecondShares, Summary};
use harness::{Backend, BackendPool, Envoy, EnvoyOptions};

use crate::figures::{self, PolicyFigures, RoundFigures};
use crate::membership::Churn;
use crate::metrics::share_figures;
use crate::plot;
use crate::policy::{plugin_module, Policy};
use crate::scenario::Scenario;
use crate::windows::{self, WindowFigures};

/// How to run a comparison.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub out_dir: PathBuf,
    /// The plugin module; `None`: the one ./wasm-build.sh leaves in dist/.
    pub wasm: Option<PathBuf>,
    pub plots: bool,
    /// Overrides the scenario's `rounds`.
    pub rounds: Option<u32>,
}

/// One policy's run in one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PolicyRun {
    pub policy: String,
    pub round: u32,
    /// Position in the whole run (0 = first).
    pub position: usize,
    #[serde(skip)]
    pub records: Vec<Record>,
    /// What the tables show of this run.
    pub figures: RoundFigures,
    /// Measured window (after warmup), as the harness summarises it.
    #[serde(skip_deserializing)]
    pub summary: Summary,
    #[serde(skip_deserializing)]
    pub seconds: Vec<SecondShares>,
    /// A few of Envoy's counters at the end of the run.
    pub envoy_counters: BTreeMap<String, u64>,
    /// The scenario's `[[window]]`s (windows.rs).
    #[serde(default)]
    pub windows: Vec<WindowFigures>,
}

/// Everything a comparison produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    pub description: String,
    pub settings: serde_json::Value,
    pub backends: Vec<String>,
    /// Each policy's figures over its rounds, in the scenario's order of policies.
    pub results: Vec<PolicyFigures>,
    pub runs: Vec<PolicyRun>,
    pub files: Vec<String>,
}

/// Runs the scenario, writes results.md, results.json and the plots into `opts.out_dir`.
pub fn compare(s: &Scenario, opts: &CompareOptions) -> Result<Report> {
    if opts.plots {
        plot::ensure_font()?;
    }
    // Envoy's own policies run without the plugin: its module is only looked for when needed.
    let mut wasm = PathBuf::from(harness::paths::PLUGIN_WASM);
    if s.policies.iter().any(Policy::uses_plugin) {
        wasm = plugin_module(opts.wasm.as_deref())?;
        for p in s.policies.iter().filter(|p| p.uses_plugin()) {
            if let Some(pc) = p.plugin_config(&s.plugin_config) {
                ewma_lb::config::Config::from_json(serde_json::to_string(&pc)?.as_bytes())
                    .map_err(|e| anyhow::anyhow!("plugin_config for {p}: {e}"))?;
            }
        }
    }
    std::fs::create_dir_all(&opts.out_dir)
        .with_context(|| format!("creating {}", opts.out_dir.display()))?;

    // One runtime for all of them: a scenario may have dozens.
    let backends: Vec<Backend> = BackendPool::new()?.start_all(s.backends.iter().cloned())?;
    let names: Vec<String> = backends.iter().map(|b| b.name().to_string()).collect();
    let by_addr: HashMap<String, String> = backends
        .iter()
        .map(|b| (b.addr().to_string(), b.name().to_string()))
        .collect();
    let endpoints: Vec<_> = backends.iter().map(|b| b.addr()).collect();

    let rounds = opts.rounds.unwrap_or(s.rounds);
    let total_runs = rounds as usize * s.policies.len();
    let started = Instant::now();
    eprintln!(
        "scenario {}: {} policies x {} round(s) x {:?} (+ Envoy start and {:?} pause each)",
        s.name,
        s.policies.len(),
        rounds,
        s.duration,
        s.pause
    );
    let mut runs = Vec::new();
    for round in 0..rounds {
        for policy in s.order(round) {
            let position = runs.len();
            eprint!(
                "[{:>3}/{total_runs}] {policy:<18} round {round} ... ",
                position + 1
            );
            let run = run_policy(
                s, &policy, round, position, &wasm, &endpoints, &backends, &by_addr, &names,
            )?;
            eprintln!(
                "n={} avg={:.1}ms p99={:.1}ms err={:.2}% dropped={} flap={:.1}pp  ({:.0}s elapsed)",
                run.figures.count,
                run.figures.avg_ms,
                run.figures.p99_ms,
                run.figures.errors_pct,
                run.figures.dropped,
                run.figures.flap_pp,
                started.elapsed().as_secs_f64()
            );
            runs.push(run);
            std::thread::sleep(s.pause);
        }
    }
    drop(backends);

    let results = s
        .policies
        .iter()
        .map(|p| PolicyFigures {
            policy: p.name().to_owned(),
            rounds: runs
                .iter()
                .filter(|r| r.policy == p.name())
                .map(|r| r.figures.clone())
                .collect(),
        })
        .collect();
    let mut report = Report {
        scenario: s.name.clone(),
        description: s.description.clone(),
        settings: {
            let mut st = settings(s, rounds);
            // The plugin as it was at the end of the run (./wasm-build.sh may have replaced it).
            st["plugin"] = serde_json::json!({
                "path": wasm.display().to_string(),
                "bytes": std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0),
            });
            st
        },
        backends: names,
        results,
        runs,
        files: Vec::new(),
    };
    write_outputs(s, opts, &mut report)?;
    Ok(report)
}

/// The load of every Envoy at once, its records in one list in the order they were sent.
fn run_loads(s: &Scenario, specs: &[LoadSpec]) -> Result<Vec<Record>> {
    if let [spec] = specs {
        return s.transport.run_load(spec);
    }
    let per_envoy: Vec<Result<Vec<Record>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = specs
            .iter()
            .map(|spec| scope.spawn(move || s.transport.run_load(spec)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a load generator panicked")))
            })
            .collect()
    });
    let mut records = Vec::new();
    for r in per_envoy {
        records.extend(r?);
    }
    records.sort_by_key(|r| r.sent_at);
    Ok(records)
}

/// Envoy `i`'s part of `total` closed-loop workers split among `n`: the first ones get the
/// remainder.
fn share(total: usize, n: u32, i: u32) -> usize {
    let (n, i) = (n as usize, i as usize);
    total / n + usize::from(i < total % n)
}

/// Runs `load` while the scenario's outages happen: each backend down (stopped: connections
/// refused) over its seconds, counted from now; every one of them is listening again when this
/// returns, so the next policy starts with the same backends.
fn with_outages<T>(s: &Scenario, backends: &[Backend], load: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let until = s.duration.as_secs_f64();
    let sleep_to = |t: f64| {
        std::thread::sleep(
            (start + Duration::from_secs_f64(t)).saturating_duration_since(Instant::now()),
        )
    };
    std::thread::scope(|scope| {
        for outage in s.outages.iter().filter(|o| o.from_s < until) {
            let Some(backend) = backends.get(outage.backend) else {
                continue;
            };
            scope.spawn(move || {
                sleep_to(outage.from_s);
                backend.stop();
                sleep_to(outage.to_s.min(until));
                if let Err(e) = backend.restart() {
                    eprintln!("warning: {e:#}");
                }
            });
        }
        load()
    })
}

#[allow(clippy::too_many_arguments)]
fn run_policy(
    s: &Scenario,
    policy: &Policy,
    round: u32,
    position: usize,
    wasm: &Path,
    endpoints: &[std::net::SocketAddr],
    backends: &[Backend],
    by_addr: &HashMap<String, String>,
    names: &[String],
) -> Result<PolicyRun> {
    // Every Envoy the same configuration but its own listener; only the first rewrites endpoint
    // files (more than one Envoy needs a static membership, `Scenario::validate`).
    let mut envoys = Vec::new();
    let mut specs = Vec::new();
    let mut churn = None;
    for i in 0..s.envoys {
        let mut config = policy.envoy_config(&s.plugin_config, wasm, endpoints, s.route_timeout)?;
        s.transport.prepare(&mut config)?;
        if i == 0 {
            // Endpoints that join, leave or have zones: from a file, rewritten while the load runs.
            churn = Churn::prepare(&s.membership, &mut config, backends)?;
        }
        let options = EnvoyOptions {
            concurrency: s.concurrency,
            log_level: "warn".into(),
            component_log_level: "wasm:info".into(),
            ..EnvoyOptions::new(config.to_yaml()?)
        };
        let envoy =
            Envoy::start(options).with_context(|| format!("starting Envoy {i} for {policy}"))?;
        let listener = envoy.listener_addr(LISTENER)?;
        envoys.push(envoy);
        specs.push(LoadSpec {
            url: format!("http://{listener}/"),
            rate_per_s: s.rate / f64::from(s.envoys),
            duration: s.duration,
            max_in_flight: s.max_in_flight,
            closed_loop_workers: s.workers.map(|w| share(w, s.envoys, i)),
            headers: Vec::new(),
            timeout: s.client_timeout,
            epoch: None,
        });
    }
    for b in backends {
        b.reset_clock();
        b.reset_counts();
    }
    let churn = churn.map(|c| c.start(s.duration));
    let mut records = with_outages(s, backends, || run_loads(s, &specs))?;
    let _eds = churn
        .map(|c| {
            c.join()
                .map_err(|_| anyhow::anyhow!("the endpoint changes panicked"))?
        })
        .transpose()?;
    for r in &mut records {
        if let Some(name) = r.backend.as_ref().and_then(|b| by_addr.get(b)) {
            r.backend = Some(name.clone());
        }
    }
    let mut envoy_counters = BTreeMap::new();
    for stats in envoys.iter().filter_map(|e| e.stats().ok()) {
        let mut add = |key: String, v: u64| *envoy_counters.entry(key).or_insert(0) += v;
        for key in [
            "cluster.backend.upstream_rq_total",
            "cluster.backend.upstream_rq_timeout",
            "cluster.backend.upstream_rq_retry",
            "cluster.backend.upstream_cx_total",
            "cluster.backend.upstream_rq_pending_overflow",
        ] {
            if let Some(v) = stats.get(key) {
                add(key.trim_start_matches("cluster.backend.").to_string(), *v);
            }
        }
        for (k, v) in stats.iter().filter(|(k, _)| k.starts_with("wasmcustom.")) {
            add(k.clone(), *v);
        }
    }
    drop(envoys);
    let measured: Vec<Record> = records
        .iter()
        .filter(|r| r.sent_at >= s.warmup)
        .cloned()
        .collect();
    let summary = Summary::of(&measured);
    let seconds = shares_per_second(&records);
    let figures = round_figures(s, &summary, &seconds, names);
    let windows = windows::figures(&s.windows, &s.membership, names, &records);
    Ok(PolicyRun {
        policy: policy.name().to_owned(),
        round,
        position,
        figures,
        summary,
        seconds,
        records,
        envoy_counters,
        windows,
    })
}

/// What the tables show of one run: its measured window's summary, and the per-second shares
/// (flapping, slow-phase share and recovery).
pub fn round_figures(
    s: &Scenario,
    summary: &Summary,
    seconds: &[SecondShares],
    names: &[String],
) -> RoundFigures {
    let mut f = RoundFigures {
        count: summary.count,
        avg_ms: summary.avg_ms,
        p50_ms: summary.p50_ms,
        p95_ms: summary.p95_ms,
        p99_ms: summary.p99_ms,
        p999_ms: summary.p999_ms,
        errors_pct: 100.0 * summary.error_rate(),
        dropped: summary.dropped,
        shares_pct: names
            .iter()
            .map(|b| (b.clone(), 100.0 * summary.share(b)))
            .collect(),
        ..RoundFigures::default()
    };
    let steady: Vec<String> = s
        .backends
        .iter()
        .filter(|b| b.schedule.is_empty() && b.fail_rate == 0.0)
        .map(|b| b.name.clone())
        .collect();
    share_figures(
        &mut f,
        seconds,
        s.warmup.as_secs() as usize,
        names,
        &steady,
        s.slowdown().as_ref(),
    );
    f
}

fn settings(s: &Scenario, rounds: u32) -> serde_json::Value {
    serde_json::json!({
        "duration_s": s.duration.as_secs_f64(),
        "warmup_s": s.warmup.as_secs_f64(),
        "rate_per_s": if s.workers.is_none() { Some(s.rate) } else { None },
        "closed_loop_workers": s.workers,
        "route_timeout_s": s.route_timeout.as_secs_f64(),
        "client_timeout_s": s.client_timeout.as_secs_f64(),
        "envoy_concurrency": s.concurrency,
        "envoys": s.envoys,
        "rounds": rounds,
        "policies": s.policies.iter().map(Policy::name).collect::<Vec<_>>(),
        "variants": s.policies.iter().filter(|p| p.uses_plugin() && p.name() != "ewma_lb").map(|p| (p.name().to_owned(), p.overrides().clone())).collect::<serde_json::Map<_, _>>(),
        "plugin_config": s.plugin_config,
        "transport": s.transport,
        "backends": s.backends.iter().map(|b| serde_json::json!({
            "name": b.name,
            "latency": b.latency.to_string(),
            "capacity": b.capacity,
            "fail_rate": b.fail_rate,
            "phases": b.schedule.iter().map(|p| format!("{}-{}@{}", p.from_s, p.to_s, p.latency)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// The markdown table of the results: each figure's median (min-max) over the rounds.
pub fn markdown_table(report: &Report) -> String {
    figures::table(&report.results, &report.backends)
}

fn ratio_lines(report: &Report) -> String {
    figures::ratio_lines(
        &report.results,
        "ewma_lb",
        &[
            "ewma_lb_previous",
            "least_request",
            "round_robin",
            "ewma_lowest",
        ],
    )
}

fn write_outputs(s: &Scenario, opts: &CompareOptions, report: &mut Report) -> Result<()> {
    let dir = &opts.out_dir;
    if opts.plots {
        let lines: Vec<plot::CdfLine> = report
            .results
            .iter()
            .map(|r| {
                let mut v: Vec<f64> = report
                    .runs
                    .iter()
                    .filter(|x| x.policy == r.policy)
                    .flat_map(|x| {
                        x.records
                            .iter()
                            .filter(|rec| !rec.dropped && rec.sent_at >= s.warmup)
                    })
                    .map(|rec| rec.latency.as_secs_f64() * 1000.0)
                    .collect();
                v.sort_by(f64::total_cmp);
                plot::CdfLine {
                    label: r.policy.to_string(),
                    sorted_ms: v,
                }
            })
            .collect();
        let title = format!("{}: latency CDF per policy", s.name);
        for p in plot::latency_cdf(dir, &title, &lines)? {
            report.files.push(file_name(&p));
        }
        let panels: Vec<plot::SharePanel> = s
            .policies
            .iter()
            .filter_map(|p| representative_run(&report.runs, p.name()))
            .map(|r| plot::SharePanel {
                label: format!("{} (round {})", r.policy, r.round),
                seconds: r.seconds.clone(),
            })
            .collect();
        let title = format!("{}: traffic share per backend per second", s.name);
        for p in plot::share_over_time(dir, &title, &panels, &report.backends)? {
            report.files.push(file_name(&p));
        }
    }
    report.files.push("results.md".into());
    report.files.push("results.json".into());
    std::fs::write(dir.join("results.md"), results_markdown(report))
        .context("writing results.md")?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(report)?,
    )
    .context("writing results.json")?;
    Ok(())
}

/// The run of `policy` whose flapping index is the median of its rounds (the lower middle one of
/// an even count): the one its share plot shows.
pub fn representative_run<'a>(runs: &'a [PolicyRun], policy: &str) -> Option<&'a PolicyRun> {
    let mut mine: Vec<&PolicyRun> = runs.iter().filter(|r| r.policy == policy).collect();
    mine.sort_by(|a, b| a.figures.flap_pp.total_cmp(&b.figures.flap_pp));
    mine.get(mine.len().saturating_sub(1) / 2).copied()
}

/// The scenario's windows, each policy's median over its rounds; empty without windows.
pub fn windows_section(report: &Report) -> String {
    let per_policy: Vec<(String, Vec<WindowFigures>)> = report
        .results
        .iter()
        .map(|r| {
            let rounds: Vec<&[WindowFigures]> = report
                .runs
                .iter()
                .filter(|x| x.policy == r.policy)
                .map(|x| x.windows.as_slice())
                .collect();
            (r.policy.to_string(), windows::median_over_rounds(&rounds))
        })
        .filter(|(_, w)| !w.is_empty())
        .collect();
    if per_policy.is_empty() {
        return String::new();
    }
    format!(
        "Windows (bench/README.md, \"Windows\"; medians over the rounds):\n\n{}\n",
        windows::markdown(&per_policy)
    )
}

/// A JSON number with at most 3 decimals, trailing zeros dropped.
fn num(v: &serde_json::Value) -> String {
    let x = v.as_f64().unwrap_or(0.0);
    let t = format!("{x:.3}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `; variants: NAME = {...}` for the plugin variants a comparison ran, from its settings.
fn variants_note(settings: &serde_json::Value) -> String {
    let Some(v) = settings
        .get("variants")
        .and_then(|v| v.as_object())
        .filter(|v| !v.is_empty())
    else {
        return String::new();
    };
    let each: Vec<String> = v
        .iter()
        .map(|(name, c)| format!("`{name}` = `{c}`"))
        .collect();
    format!("; plugin variants (merged over it): {}", each.join(", "))
}

/// The load, timing, rounds and plugin configuration of a comparison, in one sentence.
pub fn load_line(report: &Report) -> String {
    let st = &report.settings;
    let load = match st.get("closed_loop_workers").and_then(|w| w.as_u64()) {
        Some(w) => format!("closed loop, {w} workers"),
        None => format!(
            "open loop, {} req/s",
            st.get("rate_per_s").and_then(|r| r.as_f64()).unwrap_or(0.0)
        ),
    };
    format!(
        "Load: {load}; {} s per policy and round, the first {} s left out of the latency figures; \
         route timeout {} s; {}; {} round(s) in alternating order, each figure the median \
         (min-max) over the rounds. Plugin configuration: `{}`{}.",
        num(&st["duration_s"]),
        num(&st["warmup_s"]),
        num(&st["route_timeout_s"]),
        envoys_note(st),
        st["rounds"],
        st["plugin_config"],
        variants_note(st)
    )
}

/// "Envoy --concurrency N", or how many Envoys shared the load (runs before `envoys` existed had
/// one).
fn envoys_note(st: &serde_json::Value) -> String {
    match st.get("envoys").and_then(serde_json::Value::as_u64) {
        Some(n) if n > 1 => format!(
            "{n} Envoys in front of the same backends, each --concurrency {}, the load split evenly \
             among them",
            st["envoy_concurrency"]
        ),
        _ => format!("Envoy --concurrency {}", st["envoy_concurrency"]),
    }
}

/// results.md: the settings, the table, the ratios, the run order and the files.
pub fn results_markdown(report: &Report) -> String {
    let mut md = format!("# Scenario `{}`\n\n", report.scenario);
    if !report.description.is_empty() {
        let _ = writeln!(md, "{}\n", report.description);
    }
    let _ = writeln!(md, "{}\n", load_line(report));
    md.push_str(&markdown_table(report));
    md.push('\n');
    let ratios = ratio_lines(report);
    if !ratios.is_empty() {
        md.push_str("Ratios of the medians:\n\n");
        md.push_str(&ratios);
        md.push('\n');
    }
    md.push_str(&windows_section(report));
    md.push_str("Run order: ");
    let order: Vec<String> = report
        .runs
        .iter()
        .map(|r| format!("{} (round {})", r.policy, r.round))
        .collect();
    md.push_str(&order.join(", "));
    md.push_str(".\n\nFlapping index: mean over consecutive seconds and backends of |share(t) − share(t−1)|, in percentage points; \"flap noise\" is what a static random split with the same mean shares and per-second request counts would score (bench/README.md).\n");
    let files: Vec<&String> = report
        .files
        .iter()
        .filter(|f| !f.starts_with("results"))
        .collect();
    if !files.is_empty() {
        let _ = writeln!(
            md,
            "\nPlots: {}.",
            files
                .iter()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn closed_loop_workers_are_split_without_losing_any() {
        for (total, n) in [(50, 3), (3, 3), (7, 2), (8, 1)] {
            let parts: Vec<usize> = (0..n).map(|i| share(total, n, i)).collect();
            assert_eq!(parts.iter().sum::<usize>(), total, "{total} among {n}");
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
        }
    }
}
