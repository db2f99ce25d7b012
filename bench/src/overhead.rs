//! `overhead`: what the plugin costs per request, filter against filter. The same Envoy
//! (`--concurrency 1`) and the same cluster (the shipped `override_host` policy with its
//! least-request fallback) in front of several instant backends, with no wasm filter, with a
//! no-op wasm filter (bench/noop-filter) and with ewma-lb; the two modules built the same way
//! (`./wasm-build.sh`: profile `wasm`, wasm-opt). Throughput at saturation (closed loop) and
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
}

/// Builds bench/noop-filter with ./wasm-build.sh, as the plugin is built, and returns the module.
pub fn build_noop() -> Result<PathBuf> {
    let root = harness::repo_root();
    let out = root.join("target/noop-filter/noop_filter.wasm");
    eprintln!("building bench/noop-filter as the plugin is built (./wasm-build.sh) ...");
    let status = Command::new(root.join("wasm-build.sh"))
        .arg(root.join("bench/noop-filter"))
        .arg(&out)
        .status()
        .context("running ./wasm-build.sh for the no-op filter")?;
    if !status.success() || !out.is_file() {
        bail!("building the no-op filter failed (is the wasm32-wasip1 target installed? `rustup target add wasm32-wasip1`)");
    }
    Ok(out)
}

/// The shipped config as `compare` runs the plugin ([`Policy::envoy_config`]), with what sits in
/// front of the router swapped and the cluster left as it ships (`override_host`, fallback least
/// request): the plugin removed, the no-op module in the plugin's place, or ewma-lb.
fn config_for(
    variant: Variant,
    wasm: &Path,
    noop: &Path,
    endpoints: &[SocketAddr],
) -> Result<EnvoyConfig> {
    let timeout = Duration::from_secs(5);
    let ewma_lb = Policy::get("ewma_lb")?;
    let no_plugin_config = serde_json::json!({});
    match variant {
        Variant::NoFilter => {
            let mut config = ewma_lb.envoy_config(&no_plugin_config, wasm, endpoints, timeout)?;
            config.remove_plugin()?;
            Ok(config)
        }
        Variant::NoopWasm => {
            let mut config = ewma_lb.envoy_config(&no_plugin_config, noop, endpoints, timeout)?;
            let mut filter = config.plugin()?;
            filter.set_plugin_config("")?;
            for id in [
                "typed_config.config.name",
                "typed_config.config.root_id",
                "typed_config.config.vm_config.vm_id",
            ] {
                filter.set(id, "noop")?;
            }
            Ok(config)
        }
        Variant::EwmaLb => ewma_lb.envoy_config(&no_plugin_config, wasm, endpoints, timeout),
    }
}

fn measure(
    variant: Variant,
    round: u32,
    o: &OverheadOptions,
    modules: (&Path, &Path),
    backends: &[Backend],
) -> Result<OverheadRun> {
    let (wasm, noop) = modules;
    let endpoints: Vec<SocketAddr> = backends.iter().map(Backend::addr).collect();
    let mut config = config_for(variant, wasm, noop, &endpoints)?;
    let port = config.listener(LISTENER)?.port()?;
    let options = EnvoyOptions {
        concurrency: o.concurrency,
        log_level: "warn".into(),
        component_log_level: "wasm:info".into(),
        ..EnvoyOptions::new(config.to_yaml()?)
    };
    let _envoy =
        Envoy::start(options).with_context(|| format!("starting Envoy ({})", variant.name()))?;
    let url = format!("http://127.0.0.1:{port}/");
    let closed = |d: Duration| LoadSpec {
        closed_loop_workers: Some(o.workers),
        timeout: Duration::from_secs(5),
        ..LoadSpec::new(url.clone(), 1.0, d)
    };
    // Warm-up: connections, the plugin's first tables, V8's JIT.
    load::run(&closed(
        Duration::from_secs(if o.smoke { 0 } else { 2 }).max(Duration::from_millis(300)),
    ))?;
    let sat = load::run(&closed(o.saturation_time))?;
    let elapsed = o.saturation_time.as_secs_f64().max(1e-3);
    let ok = sat
        .iter()
        .filter(|r| !r.is_error() && !r.dropped && r.sent_at < o.saturation_time)
        .count();
    let saturation_errors = sat.iter().filter(|r| r.is_error()).count() as u64;
    let fixed = load::run(&LoadSpec {
        timeout: Duration::from_secs(5),
        ..LoadSpec::new(url, o.rate, o.rate_time)
    })?;
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
    std::fs::create_dir_all(&o.out_dir)
        .with_context(|| format!("creating {}", o.out_dir.display()))?;
    let backends: Vec<Backend> = (0..o.endpoints.max(1))
        .map(|i| Backend::start_local(BackendSpec::new(format!("instant{i}"), Latency::Fixed(0))))
        .collect::<Result<_>>()?;
    let mut runs = Vec::new();
    for round in 0..o.rounds {
        let mut order = Variant::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        for v in order {
            eprint!("round {round} {:<18} ... ", v.name());
            let r = measure(v, round, o, (&wasm, &noop), &backends)?;
            eprintln!(
                "{:.0} req/s at saturation; at {} req/s p50 {:.2} ms p99 {:.2} ms",
                r.saturation_rps, o.rate, r.fixed_rate.p50_ms, r.fixed_rate.p99_ms
            );
            runs.push(r);
            std::thread::sleep(Duration::from_millis(if o.smoke { 100 } else { 1000 }));
        }
    }
    drop(backends);
    let results = Variant::ALL
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
            "plugin": wasm.display().to_string(),
            "noop": noop.display().to_string(),
        }),
        results,
        runs,
        micro,
        plugin_bytes: size(&wasm),
        noop_bytes: size(&noop),
    };
    std::fs::write(o.out_dir.join("results.md"), markdown(&report, o))
        .context("writing results.md")?;
    std::fs::write(
        o.out_dir.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )
    .context("writing results.json")?;
    Ok(report)
}

/// The variants' table and the ratios against the targets.
pub fn table(r: &OverheadReport) -> String {
    let mut md = String::from(
        "| filter | req/s at saturation | p50 ms | p99 ms | errors |\n|---|---|---|---|---|\n",
    );
    for x in &r.results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            x.variant.name(),
            x.saturation_rps.show(0),
            x.p50_ms.show(2),
            x.p99_ms.show(2),
            x.errors
        );
    }
    let get = |v: Variant| r.results.iter().find(|x| x.variant == v);
    if let (Some(e), Some(n), Some(f)) = (
        get(Variant::EwmaLb),
        get(Variant::NoopWasm),
        get(Variant::NoFilter),
    ) {
        let q = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let throughput = q(e.saturation_rps.median, n.saturation_rps.median);
        let p99 = q(e.p99_ms.median, n.p99_ms.median);
        let verdict = |met: bool| if met { "met" } else { "missed" };
        let _ = writeln!(
            md,
            "\newma-lb / no-op wasm filter, medians: throughput {throughput:.3} (target >= 0.95: {}), p50 {:.3}, p99 {p99:.3} \
             (target <= 1.05: {}). No-op wasm / no filter: throughput {:.3}, p99 {:.3}.",
            verdict(throughput >= 0.95),
            q(e.p50_ms.median, n.p50_ms.median),
            verdict(p99 <= 1.05),
            q(n.saturation_rps.median, f.saturation_rps.median),
            q(n.p99_ms.median, f.p99_ms.median),
        );
    }
    md
}

/// results.md of the overhead run.
pub fn markdown(r: &OverheadReport, o: &OverheadOptions) -> String {
    let mut md = String::from("# Overhead\n\n");
    let _ = writeln!(
        md,
        "Envoy --concurrency {} with the shipped cluster (`override_host`, fallback least request) in front of {} instant \
         backends (fixed:0); the wasm filter removed, replaced by a no-op one, or ewma-lb (both modules built by \
         ./wasm-build.sh). Saturation: closed loop, {} workers, {} s; latency: open loop at {} req/s for {} s. {} round(s) in \
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
        "\nPlugin module: {} bytes ({:.0} KB); no-op filter: {} bytes.\n\nNative micro-benchmarks (release build, one core):\n",
        r.plugin_bytes,
        r.plugin_bytes as f64 / 1024.0,
        r.noop_bytes
    );
    md.push_str(&micro::markdown(&r.micro));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The no-op filter must be built as the plugin is: the same release and wasm profiles.
    #[test]
    fn the_noop_filter_has_the_plugins_profiles() {
        let read = |p: &str| -> toml::Table {
            toml::from_str(&std::fs::read_to_string(harness::repo_root().join(p)).unwrap()).unwrap()
        };
        let (root, noop) = (read("Cargo.toml"), read("bench/noop-filter/Cargo.toml"));
        for profile in ["release", "wasm"] {
            assert_eq!(
                root["profile"][profile], noop["profile"][profile],
                "profile.{profile}"
            );
        }
    }

    #[test]
    fn every_variant_runs_the_shipped_cluster() {
        let endpoints: Vec<SocketAddr> = vec![
            "127.0.0.1:8081".parse().unwrap(),
            "127.0.0.1:8082".parse().unwrap(),
        ];
        let lb = |v| {
            config_for(
                v,
                Path::new("/d/ewma_lb.wasm"),
                Path::new("/d/noop.wasm"),
                &endpoints,
            )
            .unwrap()
            .cluster(harness::config::CLUSTER)
            .unwrap()
            .lb_policy()
            .unwrap()
        };
        let shipped = lb(Variant::EwmaLb);
        assert_eq!(lb(Variant::NoFilter), shipped);
        assert_eq!(lb(Variant::NoopWasm), shipped);
        let mut no_filter = config_for(
            Variant::NoFilter,
            Path::new("/d/ewma_lb.wasm"),
            Path::new("/d/noop.wasm"),
            &endpoints,
        )
        .unwrap();
        assert!(no_filter.plugin().is_err());
        let mut noop = config_for(
            Variant::NoopWasm,
            Path::new("/d/ewma_lb.wasm"),
            Path::new("/d/noop.wasm"),
            &endpoints,
        )
        .unwrap();
        assert_eq!(
            noop.plugin().unwrap().module_file().unwrap(),
            "/d/noop.wasm"
        );
    }
}
