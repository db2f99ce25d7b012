//! `overhead`: what the plugin costs per request, filter against filter. The same Envoy
//! (`--concurrency 1`) and the same cluster (the shipped `override_host` policy with its
//! least-request fallback) in front of several instant backends, with no wasm filter, with a
//! no-op wasm filter (bench/noop-filter), with a header-only filter (bench/header-filter: the
//! override header and the upstream address, the mechanism without the balancer) and with
//! ewma-lb; the modules built the same way (`./wasm-build.sh`: profile `wasm`, wasm-opt). Throughput at saturation (closed loop) and
//! p50/p99 at a fixed moderate rate, in alternating order over rounds; each figure is the median
//! over the rounds. Plus the native micro-benchmarks and the modules' sizes.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use harness::config::LISTENER;
use harness::load::{self, LoadSpec};
use harness::summary::Summary;
use harness::{Backend, BackendSpec, Envoy, EnvoyConfig, EnvoyOptions, Latency};

use crate::figures::Spread;
use crate::micro::{self, MicroResult};
use crate::policy::{plugin_module, Policy};

/// What sits in front of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    NoFilter,
    NoopWasm,
    HeaderOnly,
    EwmaLb,
    /// Another build of ewma-lb (`--baseline-wasm`, e.g. the commit before a change), run in
    /// the same rounds so a change is measured against it under the same noise.
    Baseline,
}

impl Variant {
    pub const ALL: [Variant; 4] = [
        Variant::NoFilter,
        Variant::NoopWasm,
        Variant::HeaderOnly,
        Variant::EwmaLb,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::NoFilter => "no filter",
            Variant::NoopWasm => "no-op wasm filter",
            Variant::HeaderOnly => "header-only wasm filter",
            Variant::EwmaLb => "ewma-lb",
            Variant::Baseline => "ewma-lb baseline (--baseline-wasm)",
        }
    }
}

/// How to measure.
#[derive(Clone, Debug)]
pub struct OverheadOptions {
    pub out_dir: PathBuf,
    /// The plugin module; `None`: the one ./wasm-build.sh leaves in dist/.
    pub wasm: Option<PathBuf>,
    /// The no-op filter; built from bench/noop-filter when `None`.
    pub noop_wasm: Option<PathBuf>,
    /// The header-only filter; built from bench/header-filter when `None`.
    pub header_wasm: Option<PathBuf>,
    /// Another ewma-lb module run as a fifth variant ([`Variant::Baseline`]).
    pub baseline_wasm: Option<PathBuf>,
    pub rounds: u32,
    /// Instant backends in the cluster: more than one, so the plugin's pick is a real one.
    pub endpoints: usize,
    /// Closed-loop workers (connections) at saturation.
    pub workers: usize,
    pub saturation_time: Duration,
    /// Fixed moderate rate for the latency figures.
    pub rate: f64,
    pub rate_time: Duration,
    pub concurrency: u32,
    /// A few seconds in all: for ./test.sh.
    pub smoke: bool,
}

/// Rounds by default: a single round's throughput swings by ±5 % on a shared machine.
pub const DEFAULT_ROUNDS: u32 = 5;

impl OverheadOptions {
    pub fn new(out_dir: PathBuf, wasm: Option<PathBuf>) -> Self {
        OverheadOptions {
            out_dir,
            wasm,
            noop_wasm: None,
            header_wasm: None,
            baseline_wasm: None,
            rounds: DEFAULT_ROUNDS,
            endpoints: 4,
            workers: 16,
            saturation_time: Duration::from_secs(10),
            rate: 1000.0,
            rate_time: Duration::from_secs(10),
            concurrency: 1,
            smoke: false,
        }
    }

    /// Shrinks every phase to about a second.
    pub fn smoke(mut self) -> Self {
        self.smoke = true;
        self.rounds = 1;
        self.workers = 4;
        self.saturation_time = Duration::from_secs(1);
        self.rate = 100.0;
        self.rate_time = Duration::from_secs(1);
        self
    }
}

/// One variant in one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OverheadRun {
    pub variant: Variant,
    pub round: u32,
    pub saturation_rps: f64,
    pub saturation_errors: u64,
    #[serde(skip_deserializing)]
    pub fixed_rate: Summary,
    /// What a `callback-timing` build logged at saturation (`./wasm-build.sh --timing`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timing: Vec<String>,
}

/// A variant over all rounds: each figure's median and range.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OverheadResult {
    pub variant: Variant,
    pub saturation_rps: Spread,
    pub p50_ms: Spread,
    pub p99_ms: Spread,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OverheadReport {
    pub settings: serde_json::Value,
    pub results: Vec<OverheadResult>,
    pub runs: Vec<OverheadRun>,
    pub micro: Vec<MicroResult>,
    pub plugin_bytes: u64,
    pub noop_bytes: u64,
    /// 0 in the results of a run before the header-only reference existed.
    #[serde(default)]
    pub header_bytes: u64,
}

/// Builds bench/CRATE (a proxy-wasm crate of its own workspace) with ./wasm-build.sh, as the
/// plugin is built, and returns the module, at target/CRATE/LIB.wasm.
pub fn build_module(crate_name: &str) -> Result<PathBuf> {
    let root = harness::repo_root();
    let out = root
        .join("target")
        .join(crate_name)
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    eprintln!("building bench/{crate_name} as the plugin is built (./wasm-build.sh) ...");
    let status = Command::new(root.join("wasm-build.sh"))
        .arg(root.join("bench").join(crate_name))
        .arg(&out)
        .status()
        .with_context(|| format!("running ./wasm-build.sh for bench/{crate_name}"))?;
    if !status.success() || !out.is_file() {
        bail!("building bench/{crate_name} failed (is the wasm32-wasip1 target installed? `rustup target add wasm32-wasip1`)");
    }
    Ok(out)
}

/// The modules of the variants.
pub struct Modules {
    pub plugin: PathBuf,
    pub noop: PathBuf,
    pub header: PathBuf,
    pub baseline: Option<PathBuf>,
}

/// `config` with a reference module in the plugin's place: its file, its configuration (a
/// string) and its own name, root id and VM id.
pub(crate) fn reference_module(
    config: &mut EnvoyConfig,
    name: &str,
    module: &Path,
    plugin_config: &str,
) -> Result<()> {
    let mut filter = config.plugin()?;
    filter.set_module_file(module)?;
    filter.set_plugin_config(plugin_config)?;
    for id in [
        "typed_config.config.name",
        "typed_config.config.root_id",
        "typed_config.config.vm_config.vm_id",
    ] {
        filter.set(id, name)?;
    }
    Ok(())
}

/// The shipped config as `compare` runs the plugin ([`Policy::envoy_config`]), with what sits in
/// front of the router swapped and the cluster left as it ships (`override_host`, fallback least
/// request): the plugin removed, a reference module in the plugin's place, or ewma-lb.
fn config_for(variant: Variant, m: &Modules, endpoints: &[SocketAddr]) -> Result<EnvoyConfig> {
    let mut config = shipped_config(&m.plugin, endpoints)?;
    match variant {
        Variant::NoFilter => {
            config.remove_plugin()?;
        }
        Variant::NoopWasm => reference_module(&mut config, "noop", &m.noop, "")?,
        Variant::HeaderOnly => {
            let hosts: Vec<String> = endpoints.iter().map(SocketAddr::to_string).collect();
            reference_module(&mut config, "header_only", &m.header, &hosts.join(","))?
        }
        Variant::EwmaLb => {}
        Variant::Baseline => match &m.baseline {
            Some(module) => config = shipped_config(module, endpoints)?,
            None => bail!("no --baseline-wasm module"),
        },
    }
    Ok(config)
}

/// The config `compare` runs ewma-lb with (default plugin configuration) over `endpoints`.
pub(crate) fn shipped_config(plugin: &Path, endpoints: &[SocketAddr]) -> Result<EnvoyConfig> {
    Policy::get("ewma_lb")?.envoy_config(
        &serde_json::json!({}),
        plugin,
        endpoints,
        Duration::from_secs(5),
    )
}

/// What [`saturate`] measured.
pub(crate) struct Saturation {
    /// Successful requests a second.
    pub rps: f64,
    pub errors: u64,
    /// The open-loop phase, when a rate was given.
    pub fixed: Option<Summary>,
    /// The lines a module built with `callback-timing` logged during the closed loop (one a
    /// second, so the first may begin in the warm-up); none from any other module.
    pub timing: Vec<String>,
}

/// The lines of Envoy's log so far that a `callback-timing` build wrote.
fn timing_lines(envoy: &Envoy) -> Vec<String> {
    envoy.flush_logs();
    envoy
        .log()
        .lines()
        .filter_map(|l| l.find(TIMING_MARK).map(|at| l[at..].to_owned()))
        .collect()
}

/// How a `callback-timing` build's lines begin (`src/filter/timing.rs`).
const TIMING_MARK: &str = "ewma-lb timing:";

/// Closed-loop load at saturation through `config`'s Envoy after a warm-up: successful req/s
/// and errors; then, when `rate` is given, open-loop load at that rate.
pub(crate) fn saturate(
    config: &mut EnvoyConfig,
    label: &str,
    concurrency: u32,
    workers: usize,
    warmup: Duration,
    time: Duration,
    rate: Option<(f64, Duration)>,
) -> Result<Saturation> {
    let options = EnvoyOptions {
        concurrency,
        log_level: "warn".into(),
        component_log_level: "wasm:info".into(),
        ..EnvoyOptions::new(config.to_yaml()?)
    };
    let envoy = Envoy::start(options).with_context(|| format!("starting Envoy ({label})"))?;
    let url = format!("http://{}/", envoy.listener_addr(LISTENER)?);
    let closed = |d: Duration| LoadSpec {
        closed_loop_workers: Some(workers),
        timeout: Duration::from_secs(5),
        ..LoadSpec::new(url.clone(), 1.0, d)
    };
    // Warm-up: connections, the plugin's first tables, V8's JIT.
    load::run(&closed(warmup))?;
    // Every variant's log is flushed between the phases alike (a few ms outside the timed
    // loop), so a timing build's lines are told apart by phase.
    let before = timing_lines(&envoy).len();
    let sat = load::run(&closed(time))?;
    let timing = timing_lines(&envoy).split_off(before);
    let elapsed = time.as_secs_f64().max(1e-3);
    let ok = sat
        .iter()
        .filter(|r| !r.is_error() && !r.dropped && r.sent_at < time)
        .count();
    let errors = sat.iter().filter(|r| r.is_error()).count() as u64;
    let fixed = match rate {
        Some((rate, time)) => Some(Summary::of(&load::run(&LoadSpec {
            timeout: Duration::from_secs(5),
            ..LoadSpec::new(url, rate, time)
        })?)),
        None => None,
    };
    Ok(Saturation {
        rps: ok as f64 / elapsed,
        errors,
        fixed,
        timing,
    })
}

/// The header-only reference measures the mechanism only if Envoy follows its header: with one
/// endpoint in its list, every request must reach that endpoint (the fallback, least request,
/// would spread them over all).
fn check_header_only_steers(m: &Modules, backends: &[Backend]) -> Result<()> {
    let endpoints: Vec<SocketAddr> = backends.iter().map(Backend::addr).collect();
    let mut config = shipped_config(&m.plugin, &endpoints)?;
    reference_module(
        &mut config,
        "header_only",
        &m.header,
        &endpoints[0].to_string(),
    )?;
    let envoy = Envoy::start(EnvoyOptions {
        concurrency: 1,
        log_level: "warn".into(),
        ..EnvoyOptions::new(config.to_yaml()?)
    })
    .context("starting Envoy (header-only check)")?;
    backends.iter().for_each(Backend::reset_counts);
    let records = load::run(&LoadSpec {
        timeout: Duration::from_secs(5),
        ..LoadSpec::new(
            format!("http://{}/", envoy.listener_addr(LISTENER)?),
            100.0,
            Duration::from_millis(300),
        )
    })?;
    let ok = records
        .iter()
        .filter(|r| !r.is_error() && !r.dropped)
        .count() as u64;
    let served: Vec<u64> = backends.iter().map(Backend::served).collect();
    backends.iter().for_each(Backend::reset_counts);
    if ok < 10 || served[0] != ok || served.iter().sum::<u64>() != ok {
        bail!(
            "the header-only filter does not steer: {ok} requests answered, served per endpoint {served:?} \
             (all should be on the first)"
        );
    }
    Ok(())
}

fn measure(
    variant: Variant,
    round: u32,
    o: &OverheadOptions,
    modules: &Modules,
    backends: &[Backend],
) -> Result<OverheadRun> {
    let endpoints: Vec<SocketAddr> = backends.iter().map(Backend::addr).collect();
    let mut config = config_for(variant, modules, &endpoints)?;
    let warmup = Duration::from_secs(if o.smoke { 0 } else { 2 }).max(Duration::from_millis(300));
    let sat = saturate(
        &mut config,
        variant.name(),
        o.concurrency,
        o.workers,
        warmup,
        o.saturation_time,
        Some((o.rate, o.rate_time)),
    )?;
    Ok(OverheadRun {
        variant,
        round,
        saturation_rps: sat.rps,
        saturation_errors: sat.errors,
        fixed_rate: sat.fixed.unwrap_or_default(),
        timing: sat.timing,
    })
}

/// Makes `out_dir` and starts `n` instant backends (fixed:0) on 127.0.0.1.
pub(crate) fn prepare(out_dir: &Path, n: usize) -> Result<Vec<Backend>> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    (0..n.max(1))
        .map(|i| Backend::start_local(BackendSpec::new(format!("instant{i}"), Latency::Fixed(0))))
        .collect()
}

/// timing.txt into `out_dir`, when a variant's module was a `callback-timing` build: per such
/// variant, a table of the medians over its lines, then the lines by round.
fn write_timing(out_dir: &Path, runs: &[OverheadRun]) -> Result<()> {
    let mut text = String::new();
    for v in Variant::ALL.into_iter().chain([Variant::Baseline]) {
        let mine: Vec<&OverheadRun> = runs
            .iter()
            .filter(|r| r.variant == v && !r.timing.is_empty())
            .collect();
        if mine.is_empty() {
            continue;
        }
        let lines: Vec<&str> = mine
            .iter()
            .flat_map(|r| r.timing.iter().map(String::as_str))
            .collect();
        let _ = writeln!(text, "# {}\n\n{}", v.name(), timing_table(&lines));
        for r in mine {
            let _ = writeln!(text, "## round {}\n", r.round);
            for line in &r.timing {
                let _ = writeln!(text, "{line}");
            }
            text.push('\n');
        }
    }
    if text.is_empty() {
        return Ok(());
    }
    let path = out_dir.join("timing.txt");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "where ewma-lb's time goes inside the VM: {}",
        path.display()
    );
    Ok(())
}

/// One slot of a timing line: µs a request, and calls.
struct SlotTiming<'a> {
    name: &'a str,
    us: f64,
    calls: f64,
}

/// One line of a `callback-timing` build (`src/filter/timing.rs`: `ewma-lb timing: N requests,
/// callbacks T µs a request; name µs (calls) ...`).
struct TimingLine<'a> {
    requests: f64,
    /// All callbacks, µs a request.
    callbacks: f64,
    slots: Vec<SlotTiming<'a>>,
}

fn parse_timing_line(line: &str) -> Option<TimingLine<'_>> {
    let rest = line.strip_prefix(TIMING_MARK)?.trim_start();
    let (requests, rest) = rest.split_once(" requests, callbacks ")?;
    let (callbacks, slots) = rest.split_once(" µs a request;")?;
    let words: Vec<&str> = slots.split_whitespace().collect();
    let slots = words
        .chunks(3)
        .map(|w| match *w {
            [name, us, calls] => Some(SlotTiming {
                name,
                us: us.parse().ok()?,
                calls: calls.strip_prefix('(')?.strip_suffix(')')?.parse().ok()?,
            }),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    Some(TimingLine {
        requests: requests.parse().ok()?,
        callbacks: callbacks.parse().ok()?,
        slots,
    })
}

/// The medians (min-max) over `lines` of all callbacks and of each slot's µs a request and
/// calls a request; the parts of a callback (the slots from `path` on) marked as such.
fn timing_table(lines: &[&str]) -> String {
    let parsed: Vec<_> = lines.iter().filter_map(|l| parse_timing_line(l)).collect();
    let Some(first) = parsed.first().map(|l| &l.slots) else {
        return String::new();
    };
    let mut md = format!(
        "| inside the VM | µs a request, median (min-max) over {} line{} | calls a request |\n|---|---|---|\n",
        parsed.len(),
        if parsed.len() == 1 { "" } else { "s" }
    );
    let callbacks = first.iter().take_while(|s| s.name != "path").count();
    if let Some(all) = Spread::of(parsed.iter().map(|l| l.callbacks)) {
        let _ = writeln!(md, "| all callbacks | {} | |", all.show(2));
    }
    for (i, SlotTiming { name, .. }) in first.iter().enumerate() {
        let per = |f: &dyn Fn(f64, &SlotTiming) -> f64| {
            Spread::of(
                parsed
                    .iter()
                    .filter_map(|l| l.slots.get(i).map(|s| f(l.requests, s))),
            )
        };
        let (Some(us), Some(calls)) = (
            per(&|_, s| s.us),
            per(&|requests, s| s.calls / requests.max(1.0)),
        ) else {
            continue;
        };
        if calls.max == 0.0 {
            continue;
        }
        let name = if i < callbacks {
            (*name).to_owned()
        } else {
            format!("part: {name}")
        };
        let _ = writeln!(md, "| {name} | {} | {:.2} |", us.show(2), calls.median);
    }
    md
}

/// results.md and results.json into `out_dir`.
pub(crate) fn write_results(out_dir: &Path, md: &str, report: &impl Serialize) -> Result<()> {
    std::fs::write(out_dir.join("results.md"), md).context("writing results.md")?;
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(report)?,
    )
    .context("writing results.json")
}

/// Runs the overhead measurement and writes results.md / results.json into `o.out_dir`.
pub fn run(o: &OverheadOptions) -> Result<OverheadReport> {
    let modules = Modules {
        plugin: plugin_module(o.wasm.as_deref())?,
        noop: match &o.noop_wasm {
            Some(p) => p.clone(),
            None => build_module("noop-filter")?,
        },
        header: match &o.header_wasm {
            Some(p) => p.clone(),
            None => build_module("header-filter")?,
        },
        baseline: o.baseline_wasm.clone(),
    };
    let variants: Vec<Variant> = Variant::ALL
        .into_iter()
        .chain(modules.baseline.is_some().then_some(Variant::Baseline))
        .collect();
    let backends = prepare(&o.out_dir, o.endpoints)?;
    check_header_only_steers(&modules, &backends)?;
    let mut runs = Vec::new();
    for round in 0..o.rounds {
        let mut order = variants.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for v in order {
            eprint!("round {round} {:<24} ... ", v.name());
            let r = measure(v, round, o, &modules, &backends)?;
            eprintln!(
                "{:.0} req/s at saturation; at {} req/s p50 {:.2} ms p99 {:.2} ms",
                r.saturation_rps, o.rate, r.fixed_rate.p50_ms, r.fixed_rate.p99_ms
            );
            runs.push(r);
            std::thread::sleep(Duration::from_millis(if o.smoke { 100 } else { 1000 }));
        }
    }
    drop(backends);
    let results = variants
        .iter()
        .map(|&v| {
            let mine: Vec<&OverheadRun> = runs.iter().filter(|r| r.variant == v).collect();
            let spread = |f: &dyn Fn(&OverheadRun) -> f64| {
                Spread::of(mine.iter().map(|r| f(r))).unwrap_or_default()
            };
            OverheadResult {
                variant: v,
                saturation_rps: spread(&|r| r.saturation_rps),
                p50_ms: spread(&|r| r.fixed_rate.p50_ms),
                p99_ms: spread(&|r| r.fixed_rate.p99_ms),
                errors: mine
                    .iter()
                    .map(|r| r.saturation_errors + r.fixed_rate.errors)
                    .sum(),
            }
        })
        .collect();
    eprintln!("micro-benchmarks ...");
    let micro = micro::run(o.smoke);
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let report = OverheadReport {
        settings: serde_json::json!({
            "envoy_concurrency": o.concurrency,
            "rounds": o.rounds,
            "endpoints": o.endpoints,
            "closed_loop_workers": o.workers,
            "saturation_s": o.saturation_time.as_secs_f64(),
            "fixed_rate_per_s": o.rate,
            "fixed_rate_s": o.rate_time.as_secs_f64(),
            "plugin": modules.plugin.display().to_string(),
            "noop": modules.noop.display().to_string(),
            "header_only": modules.header.display().to_string(),
            "baseline": modules.baseline.as_ref().map(|p| p.display().to_string()),
        }),
        results,
        runs,
        micro,
        plugin_bytes: size(&modules.plugin),
        noop_bytes: size(&modules.noop),
        header_bytes: size(&modules.header),
    };
    write_results(&o.out_dir, &markdown(&report, o), &report)?;
    write_timing(&o.out_dir, &report.runs)?;
    Ok(report)
}

/// The variants' table, each median's ratio to the no-op filter's beside it, and ewma-lb's
/// ratios against the targets.
pub fn table(r: &OverheadReport) -> String {
    let get = |v: Variant| r.results.iter().find(|x| x.variant == v);
    let q = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let noop = get(Variant::NoopWasm);
    let ratio = |x: f64, of: fn(&OverheadResult) -> f64| {
        noop.map_or("-".to_string(), |n| format!("{:.3}", q(x, of(n))))
    };
    let mut md = String::from(
        "| filter | req/s at saturation | req/s / no-op | p50 ms | p99 ms | p99 / no-op | errors |\n|---|---|---|---|---|---|---|\n",
    );
    for x in &r.results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            x.variant.name(),
            x.saturation_rps.show(0),
            ratio(x.saturation_rps.median, |n| n.saturation_rps.median),
            x.p50_ms.show(2),
            x.p99_ms.show(2),
            ratio(x.p99_ms.median, |n| n.p99_ms.median),
            x.errors
        );
    }
    if let (Some(e), Some(n)) = (get(Variant::EwmaLb), noop) {
        let throughput = q(e.saturation_rps.median, n.saturation_rps.median);
        let p99 = q(e.p99_ms.median, n.p99_ms.median);
        let verdict = |met: bool| if met { "met" } else { "missed" };
        let _ = write!(
            md,
            "\newma-lb / no-op wasm filter, medians: throughput {throughput:.3} (target >= 0.95: {}), p50 {:.3}, p99 {p99:.3} \
             (target <= 1.05: {}).",
            verdict(throughput >= 0.95),
            q(e.p50_ms.median, n.p50_ms.median),
            verdict(p99 <= 1.05),
        );
        // Time per request at saturation (one Envoy worker): what each layer adds.
        let us = |x: &OverheadResult| 1e6 / x.saturation_rps.median;
        if let Some(h) = get(Variant::HeaderOnly) {
            let _ = write!(
                md,
                " Per request at saturation: the mechanism (header-only - no-op) {:+.1} µs, ewma-lb's own work (ewma-lb - header-only) {:+.1} µs.",
                us(h) - us(n),
                us(e) - us(h)
            );
        }
        if let Some(b) = get(Variant::Baseline) {
            let _ = write!(
                md,
                " ewma-lb / the baseline module, medians: throughput {:.3}, p99 {:.3}; per request {:+.1} µs.",
                q(e.saturation_rps.median, b.saturation_rps.median),
                q(e.p99_ms.median, b.p99_ms.median),
                us(e) - us(b)
            );
        }
        md.push('\n');
    }
    md
}

/// results.md of the overhead run.
pub fn markdown(r: &OverheadReport, o: &OverheadOptions) -> String {
    let mut md = String::from("# Overhead\n\n");
    let _ = writeln!(
        md,
        "Envoy --concurrency {} with the shipped cluster (`override_host`, fallback least request) in front of {} instant \
         backends (fixed:0); the wasm filter removed, replaced by a no-op one or by a header-only one (the override \
         header and the upstream address, nothing else), or ewma-lb (the modules built by ./wasm-build.sh). Saturation: closed loop, {} workers, {} s; latency: open loop at {} req/s for {} s. {} round(s) in \
         alternating order; each figure the median (min-max) over the rounds. The load generator, Envoy and the backends \
         share the machine's cores.\n",
        o.concurrency,
        o.endpoints,
        o.workers,
        o.saturation_time.as_secs_f64(),
        o.rate,
        o.rate_time.as_secs_f64(),
        o.rounds
    );
    md.push_str(&table(r));
    md.push_str(
        "\nPer round:\n\n| round | filter | req/s | p50 ms | p99 ms |\n|---|---|---|---|---|\n",
    );
    for x in &r.runs {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.2} | {:.2} |",
            x.round,
            x.variant.name(),
            x.saturation_rps,
            x.fixed_rate.p50_ms,
            x.fixed_rate.p99_ms
        );
    }
    let _ = writeln!(
        md,
        "\nPlugin module: {} bytes ({:.0} KB); no-op filter: {} bytes; header-only filter: {} bytes.\n\nNative micro-benchmarks (release build, one core):\n",
        r.plugin_bytes,
        r.plugin_bytes as f64 / 1024.0,
        r.noop_bytes,
        r.header_bytes
    );
    md.push_str(&micro::markdown(&r.micro));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of a timing build's lines: medians per slot, calls per request, the callbacks
    /// summed; slots never called left out; a line of another shape ignored.
    #[test]
    fn a_timing_builds_lines_make_a_table_of_medians() {
        let lines = [
            "ewma-lb timing: 1000 requests, callbacks 3.00 µs a request; create_context 1.00 (1000) \
             log 2.00 (1000) request_body 0.00 (0) path 0.50 (1000) zone 0.01 (4)",
            "ewma-lb timing: 2000 requests, callbacks 5.00 µs a request; create_context 2.00 (2000) \
             log 3.00 (2000) request_body 0.00 (0) path 0.70 (4000) zone 0.00 (0)",
            "ewma-lb timing: garbled",
            "ewma-lb timing: 3000 requests, callbacks 7.00 µs a request; create_context 3.00 (3000) \
             log 4.00 (3000) request_body 0.00 (0) path 0.90 (3000) zone 0.00 (0)",
        ];
        let table = timing_table(&lines);
        assert!(table.contains("over 3 lines"), "{table}");
        assert!(
            table.contains("| all callbacks | 5.00 (3.00-7.00) | |"),
            "{table}"
        );
        assert!(
            table.contains("| create_context | 2.00 (1.00-3.00) | 1.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| log | 3.00 (2.00-4.00) | 1.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| part: path | 0.70 (0.50-0.90) | 1.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| part: zone | 0.00 (0.00-0.01) | 0.00 |"),
            "{table}"
        );
        assert!(!table.contains("request_body"), "{table}");
    }

    /// The reference modules must be built as the plugin is: the same release and wasm profiles.
    #[test]
    fn the_reference_modules_have_the_plugins_profiles() {
        let read = |p: &str| -> toml::Table {
            toml::from_str(&std::fs::read_to_string(harness::repo_root().join(p)).unwrap()).unwrap()
        };
        let root = read("Cargo.toml");
        for module in ["noop-filter", "header-filter", "hostcall-filter"] {
            let other = read(&format!("bench/{module}/Cargo.toml"));
            for profile in ["release", "wasm"] {
                assert_eq!(
                    root["profile"][profile], other["profile"][profile],
                    "{module}: profile.{profile}"
                );
            }
        }
    }

    fn modules() -> Modules {
        Modules {
            plugin: "/d/ewma_lb.wasm".into(),
            noop: "/d/noop.wasm".into(),
            header: "/d/header.wasm".into(),
            baseline: Some("/d/before.wasm".into()),
        }
    }

    #[test]
    fn every_variant_runs_the_shipped_cluster() {
        let endpoints: Vec<SocketAddr> = vec![
            "127.0.0.1:8081".parse().unwrap(),
            "127.0.0.1:8082".parse().unwrap(),
        ];
        let config = |v| config_for(v, &modules(), &endpoints).unwrap();
        let lb = |v| {
            config(v)
                .cluster(harness::config::CLUSTER)
                .unwrap()
                .lb_policy()
                .unwrap()
        };
        let shipped = lb(Variant::EwmaLb);
        for v in Variant::ALL.into_iter().chain([Variant::Baseline]) {
            assert_eq!(lb(v), shipped, "{}", v.name());
        }
        // The baseline is the plugin as shipped, from its own file.
        let mut baseline = config(Variant::Baseline);
        let mut plugin = config(Variant::EwmaLb);
        assert_eq!(
            baseline.plugin().unwrap().module_file().unwrap(),
            "/d/before.wasm"
        );
        assert_eq!(
            baseline.plugin().unwrap().plugin_config().unwrap(),
            plugin.plugin().unwrap().plugin_config().unwrap()
        );
        assert!(config(Variant::NoFilter).plugin().is_err());
        let mut noop = config(Variant::NoopWasm);
        assert_eq!(
            noop.plugin().unwrap().module_file().unwrap(),
            "/d/noop.wasm"
        );
        let mut header = config(Variant::HeaderOnly);
        let filter = header.plugin().unwrap();
        assert_eq!(filter.module_file().unwrap(), "/d/header.wasm");
        assert_eq!(
            filter.plugin_config().unwrap(),
            "127.0.0.1:8081,127.0.0.1:8082",
            "the header-only module round-robins over the cluster's endpoints"
        );
    }
}
