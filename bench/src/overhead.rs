//! `overhead`: what the plugin costs per request. The same Envoy (`--concurrency 1`) in front of
//! one instant backend with no filter, with a no-op wasm filter (bench/noop-filter) and with
//! ewma-lb: throughput at saturation (closed loop) and p50/p99 at a fixed moderate rate, in
//! alternating order over rounds. Plus the native micro-benchmarks and the plugin's size.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use harness::config::{EnvoyLb, CLUSTER, LISTENER};
use harness::load::{self, LoadSpec};
use harness::summary::Summary;
use harness::{Backend, BackendSpec, Envoy, EnvoyConfig, EnvoyOptions, Latency};

use crate::micro::{self, MicroResult};
use crate::policy::{plugin_module, Policy};

/// What sits in front of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    NoFilter,
    NoopWasm,
    EwmaLb,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::NoFilter, Variant::NoopWasm, Variant::EwmaLb];

    pub fn name(self) -> &'static str {
        match self {
            Variant::NoFilter => "no filter",
            Variant::NoopWasm => "no-op wasm filter",
            Variant::EwmaLb => "ewma-lb",
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
    pub rounds: u32,
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

impl OverheadOptions {
    pub fn new(out_dir: PathBuf, wasm: Option<PathBuf>) -> Self {
        OverheadOptions {
            out_dir,
            wasm,
            noop_wasm: None,
            rounds: 2,
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
#[derive(Clone, Debug, Serialize)]
pub struct OverheadRun {
    pub variant: Variant,
    pub round: u32,
    pub saturation_rps: f64,
    pub saturation_errors: u64,
    pub fixed_rate: Summary,
}

/// A variant over all rounds.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadResult {
    pub variant: Variant,
    /// Mean over rounds.
    pub saturation_rps: f64,
    /// Means over rounds.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    pub settings: serde_json::Value,
    pub results: Vec<OverheadResult>,
    pub runs: Vec<OverheadRun>,
    pub micro: Vec<MicroResult>,
    pub plugin_bytes: u64,
    pub noop_bytes: u64,
}

/// Builds bench/noop-filter for wasm32-wasip1 and returns the module's path.
pub fn build_noop() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("noop-filter");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building {} for wasm32-wasip1 ...", dir.display());
    let status = Command::new(cargo)
        .args(["build", "--release", "--target", "wasm32-wasip1", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .status()
        .context("running cargo for the no-op filter")?;
    if !status.success() {
        bail!("building the no-op filter failed (is the wasm32-wasip1 target installed? `rustup target add wasm32-wasip1`)");
    }
    let wasm = dir.join("target/wasm32-wasip1/release/noop_filter.wasm");
    if !wasm.is_file() {
        bail!("{} was not produced", wasm.display());
    }
    Ok(wasm)
}

/// The shipped config (through [`Policy::envoy_config`], as `compare` runs it) with what sits in
/// front of the router swapped: nothing and least request (Envoy's own balancer), the no-op module
/// in the plugin's place and least request, or ewma-lb as shipped.
fn config_for(variant: Variant, wasm: &Path, noop: &Path, endpoint: std::net::SocketAddr) -> Result<EnvoyConfig> {
    let timeout = Duration::from_secs(5);
    let no_plugin_config = serde_json::json!({});
    match variant {
        Variant::NoFilter => Policy::get("least_request")?.envoy_config(&no_plugin_config, wasm, &[endpoint], timeout),
        Variant::NoopWasm => {
            let mut config = Policy::get("ewma_lb")?.envoy_config(&no_plugin_config, noop, &[endpoint], timeout)?;
            config.cluster(CLUSTER)?.use_envoy_lb(EnvoyLb::LeastRequest)?;
            let mut filter = config.plugin()?;
            filter.set_plugin_config("")?;
            for id in ["typed_config.config.name", "typed_config.config.root_id", "typed_config.config.vm_config.vm_id"] {
                filter.set(id, "noop")?;
            }
            Ok(config)
        }
        Variant::EwmaLb => Policy::get("ewma_lb")?.envoy_config(&no_plugin_config, wasm, &[endpoint], timeout),
    }
}

fn measure(variant: Variant, round: u32, o: &OverheadOptions, modules: (&Path, &Path), backend: &Backend) -> Result<OverheadRun> {
    let (wasm, noop) = modules;
    let mut config = config_for(variant, wasm, noop, backend.addr())?;
    let port = config.listener(LISTENER)?.port()?;
    let options = EnvoyOptions {
        concurrency: o.concurrency,
        log_level: "warn".into(),
        component_log_level: "wasm:info".into(),
        ..EnvoyOptions::new(config.to_yaml()?)
    };
    let _envoy = Envoy::start(options).with_context(|| format!("starting Envoy ({})", variant.name()))?;
    let url = format!("http://127.0.0.1:{port}/");
    let closed = |d: Duration| LoadSpec {
        closed_loop_workers: Some(o.workers),
        timeout: Duration::from_secs(5),
        ..LoadSpec::new(url.clone(), 1.0, d)
    };
    // Warm-up: connections, the plugin's first tables, V8's JIT.
    load::run(&closed(Duration::from_secs(if o.smoke { 0 } else { 1 }).max(Duration::from_millis(300))))?;
    let t0 = Instant::now();
    let sat = load::run(&closed(o.saturation_time))?;
    let elapsed = o.saturation_time.as_secs_f64().max(1e-3);
    let _ = t0;
    let ok = sat.iter().filter(|r| !r.is_error() && !r.dropped && r.sent_at < o.saturation_time).count();
    let saturation_errors = sat.iter().filter(|r| r.is_error()).count() as u64;
    let fixed = load::run(&LoadSpec { timeout: Duration::from_secs(5), ..LoadSpec::new(url, o.rate, o.rate_time) })?;
    Ok(OverheadRun {
        variant,
        round,
        saturation_rps: ok as f64 / elapsed,
        saturation_errors,
        fixed_rate: Summary::of(&fixed),
    })
}

/// Runs the overhead measurement and writes results.md / results.json into `o.out_dir`.
pub fn run(o: &OverheadOptions) -> Result<OverheadReport> {
    let wasm = plugin_module(o.wasm.as_deref())?;
    let noop = match &o.noop_wasm {
        Some(p) => p.clone(),
        None => build_noop()?,
    };
    std::fs::create_dir_all(&o.out_dir).with_context(|| format!("creating {}", o.out_dir.display()))?;
    let backend = Backend::start_local(BackendSpec::new("instant", Latency::Fixed(0)))?;
    let mut runs = Vec::new();
    for round in 0..o.rounds {
        let mut order = Variant::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for v in order {
            eprint!("round {round} {:<18} ... ", v.name());
            let r = measure(v, round, o, (&wasm, &noop), &backend)?;
            eprintln!(
                "{:.0} req/s at saturation; at {} req/s p50 {:.2} ms p99 {:.2} ms",
                r.saturation_rps, o.rate, r.fixed_rate.p50_ms, r.fixed_rate.p99_ms
            );
            runs.push(r);
            std::thread::sleep(Duration::from_millis(if o.smoke { 100 } else { 1000 }));
        }
    }
    drop(backend);
    let results = Variant::ALL
        .iter()
        .map(|&v| {
            let mine: Vec<&OverheadRun> = runs.iter().filter(|r| r.variant == v).collect();
            let n = mine.len().max(1) as f64;
            OverheadResult {
                variant: v,
                saturation_rps: mine.iter().map(|r| r.saturation_rps).sum::<f64>() / n,
                p50_ms: mine.iter().map(|r| r.fixed_rate.p50_ms).sum::<f64>() / n,
                p99_ms: mine.iter().map(|r| r.fixed_rate.p99_ms).sum::<f64>() / n,
                errors: mine.iter().map(|r| r.saturation_errors + r.fixed_rate.errors).sum(),
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
            "closed_loop_workers": o.workers,
            "saturation_s": o.saturation_time.as_secs_f64(),
            "fixed_rate_per_s": o.rate,
            "fixed_rate_s": o.rate_time.as_secs_f64(),
            "plugin": wasm.display().to_string(),
            "noop": noop.display().to_string(),
        }),
        results,
        runs,
        micro,
        plugin_bytes: size(&wasm),
        noop_bytes: size(&noop),
    };
    std::fs::write(o.out_dir.join("results.md"), markdown(&report, o)).context("writing results.md")?;
    std::fs::write(o.out_dir.join("results.json"), serde_json::to_string_pretty(&report)?).context("writing results.json")?;
    Ok(report)
}

/// results.md of the overhead run.
pub fn markdown(r: &OverheadReport, o: &OverheadOptions) -> String {
    let mut md = String::from("# Overhead\n\n");
    let _ = writeln!(
        md,
        "Envoy --concurrency {} in front of one instant backend (fixed:0). Saturation: closed loop, {} workers, {} s; \
         latency: open loop at {} req/s for {} s. {} round(s), alternating order; the figures are means over rounds. \
         The load generator, Envoy and the backend share the machine's cores.\n",
        o.concurrency,
        o.workers,
        o.saturation_time.as_secs_f64(),
        o.rate,
        o.rate_time.as_secs_f64(),
        o.rounds
    );
    md.push_str("| filter | req/s at saturation | p50 ms | p99 ms | errors |\n|---|---|---|---|---|\n");
    for x in &r.results {
        let _ = writeln!(md, "| {} | {:.0} | {:.2} | {:.2} | {} |", x.variant.name(), x.saturation_rps, x.p50_ms, x.p99_ms, x.errors);
    }
    let get = |v: Variant| r.results.iter().find(|x| x.variant == v);
    if let (Some(e), Some(n), Some(f)) = (get(Variant::EwmaLb), get(Variant::NoopWasm), get(Variant::NoFilter)) {
        let q = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let _ = writeln!(
            md,
            "\newma-lb / no-op wasm: throughput {:.2}, p50 {:.2}, p99 {:.2}. no-op wasm / no filter: throughput {:.2}.\n",
            q(e.saturation_rps, n.saturation_rps),
            q(e.p50_ms, n.p50_ms),
            q(e.p99_ms, n.p99_ms),
            q(n.saturation_rps, f.saturation_rps)
        );
    }
    md.push_str("Per round:\n\n| round | filter | req/s | p50 ms | p99 ms |\n|---|---|---|---|---|\n");
    for x in &r.runs {
        let _ = writeln!(md, "| {} | {} | {:.0} | {:.2} | {:.2} |", x.round, x.variant.name(), x.saturation_rps, x.fixed_rate.p50_ms, x.fixed_rate.p99_ms);
    }
    let _ = writeln!(
        md,
        "\nPlugin module: {} bytes ({:.0} KB); no-op filter: {} bytes.\n\nNative micro-benchmarks (release build, one core):\n",
        r.plugin_bytes,
        r.plugin_bytes as f64 / 1024.0,
        r.noop_bytes
    );
    md.push_str(&micro::markdown(&r.micro));
    md
}
