//! `ewma-bench`: run test backends in the foreground, or send load and report latency and shares.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ewma_bench::backend_arg::parse_backend_arg;
use ewma_bench::compare::{markdown_table, windows_section, CompareOptions};
use ewma_bench::overhead::OverheadOptions;
use ewma_bench::policy::Policy;
use ewma_bench::scenario::Scenario;
use harness::latency::parse_duration;
use harness::load::{run_observed, LoadSpec, Record};
use harness::summary::{format_shares, Summary};
use harness::Backend;

#[derive(Parser)]
#[command(
    name = "ewma-bench",
    about = "Backends and load for ewma-lb tests and benchmarks (127.0.0.1 only)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run HTTP backends until SIGINT/SIGTERM (or --for).
    Backends(BackendsArgs),
    /// Send load to a URL and report latency and traffic share per backend.
    Load(LoadArgs),
    /// Run a scenario through Envoy with each policy; write results.md, results.json and plots.
    Compare(CompareArgs),
    /// Envoy with no filter, a no-op wasm filter, a header-only wasm filter and ewma-lb: throughput and latency; plus the
    /// native micro-benchmarks and the plugin's size.
    Overhead(OverheadArgs),
    /// What one host call costs in Envoy's V8: a module making N of one call per request
    /// (bench/hostcall-filter), req/s at saturation and µs per call against N = 0.
    Hostcalls(HostcallsArgs),
    /// Only the native micro-benchmarks (weight recompute, pick).
    Micro(MicroArgs),
    /// A fleet of proxies running the plugin's core against simulated hosts, in virtual time
    /// (a benchmark scenario, or a fleet file from bench/scenarios/fleet/).
    Simulate(SimulateArgs),
    /// Rewrite the marked sections of README.md and bench/README.md from bench/out/*/results.json.
    Tables(TablesArgs),
}

#[derive(Args)]
struct TablesArgs {
    /// Files with `<!-- bench:... -->` sections [default: README.md bench/README.md].
    files: Vec<PathBuf>,
    /// Where the results are [default: bench/out].
    #[arg(long)]
    from: Option<PathBuf>,
}

#[derive(Args)]
struct SimulateArgs {
    /// A fleet file (bench/scenarios/fleet/*.toml) or a benchmark scenario.
    file: PathBuf,
    /// Output directory [default: bench/out/sim-<name>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override the number of proxies.
    #[arg(long)]
    proxies: Option<usize>,
    /// Override the workers per proxy.
    #[arg(long)]
    workers: Option<usize>,
    /// Override the simulated duration (e.g. 30s).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Seeds, one run per policy each (e.g. 1,2,3) [default: the file's, else 1].
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Run at each of these fleet sizes instead (same hosts and total load), e.g. 10,100,1000.
    #[arg(long, value_delimiter = ',')]
    scale: Vec<usize>,
    /// Only these policies (names from the file's variants or the built-in ones).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Runs at once.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A few simulated seconds over a few proxies: checks that the tool works.
    #[arg(long)]
    smoke: bool,
    #[arg(long)]
    no_plots: bool,
}

#[derive(Args)]
struct CompareArgs {
    /// Scenario file, e.g. bench/scenarios/seed-table.toml.
    scenario: PathBuf,
    /// Output directory [default: bench/out/<scenario name>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The plugin module [default: dist/ewma_lb.wasm, from ./wasm-build.sh].
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// A few seconds per policy at a low rate: checks that the tool works, measures nothing.
    #[arg(long)]
    smoke: bool,
    /// Override the scenario's number of rounds.
    #[arg(long)]
    rounds: Option<u32>,
    /// Skip the SVG/PNG plots.
    #[arg(long)]
    no_plots: bool,
    /// Only these policies (names from the file's variants or the built-in ones), e.g. to run
    /// one policy with two modules (`--wasm`) back to back.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// A plugin variant `NAME=JSON` (or `NAME=@FILE`, such as ewma-lb-tune's output), merged over
    /// the scenario's `plugin_config` as a `[variants.NAME]` table is; it replaces the file's
    /// variant of that name or joins the policies. Repeatable.
    #[arg(long = "variant")]
    variants: Vec<String>,
}

#[derive(Args)]
struct OverheadArgs {
    /// Output directory [default: bench/out/overhead].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The plugin module [default: dist/ewma_lb.wasm].
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// The no-op filter module [default: built from bench/noop-filter].
    #[arg(long)]
    noop_wasm: Option<PathBuf>,
    /// The header-only filter module [default: built from bench/header-filter].
    #[arg(long)]
    header_wasm: Option<PathBuf>,
    /// Another ewma-lb module (e.g. built from the commit before a change), measured in the same
    /// rounds as a fifth variant.
    #[arg(long)]
    baseline_wasm: Option<PathBuf>,
    /// Rounds, in alternating order [default: 5].
    #[arg(long)]
    rounds: Option<u32>,
    /// About a second per phase: checks that the tool works, measures nothing.
    #[arg(long)]
    smoke: bool,
}

#[derive(Args)]
struct HostcallsArgs {
    /// Output directory [default: bench/out/hostcalls].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The module [default: built from bench/hostcall-filter].
    #[arg(long)]
    module: Option<PathBuf>,
    /// The calls [default: all: path, cluster_name, monotonic_clock, current_time, set_header,
    /// filter_state, gauge, content_type, upstream_address, response_code].
    #[arg(long, value_delimiter = ',')]
    calls: Vec<String>,
    /// Calls per request, each > 0; N = 0 always runs [default: 50,200].
    #[arg(long, value_delimiter = ',')]
    n: Vec<u32>,
    /// Rounds, in alternating order [default: 3].
    #[arg(long)]
    rounds: Option<u32>,
    /// Seconds at saturation per (call, N) [default: 4].
    #[arg(long)]
    seconds: Option<u64>,
    /// One call, one N, half a second: checks that the tool works, measures nothing.
    #[arg(long)]
    smoke: bool,
}

#[derive(Args)]
struct MicroArgs {
    /// A few milliseconds per measurement.
    #[arg(long)]
    smoke: bool,
    #[arg(long)]
    json: bool,
    /// Only these host counts (comma-separated), e.g. one of them under a profiler.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<usize>,
    /// At least this long per measurement, instead of 400 ms (5 ms with --smoke).
    #[arg(long)]
    budget_ms: Option<u64>,
}

#[derive(Args)]
struct BackendsArgs {
    /// name=N,addr=127.0.0.1:PORT,latency=uniform:50-100[,capacity=K][,fail=0.01][,health=fixed:0][,phase=10-20@fixed:500]
    #[arg(long = "backend", required = true)]
    backends: Vec<String>,
    /// Stop by itself after this long (e.g. 10m).
    #[arg(long = "for", value_parser = parse_duration)]
    run_for: Option<Duration>,
}

#[derive(Args)]
struct LoadArgs {
    #[arg(long)]
    url: String,
    /// Arrivals per second (open loop).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Print a line per interval with that interval's latency and shares.
    #[arg(long, value_parser = parse_duration)]
    report_every: Option<Duration>,
    /// Open loop: arrivals beyond this many outstanding requests are dropped and counted.
    #[arg(long, default_value_t = 1000)]
    max_in_flight: usize,
    /// Closed loop with this many workers instead of a fixed rate.
    #[arg(long)]
    workers: Option<usize>,
    /// Extra request header, "name: value".
    #[arg(long = "header")]
    headers: Vec<String>,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    timeout: Duration,
    /// Print the final summary as JSON.
    #[arg(long)]
    json: bool,
    /// gRPC unary calls (the harness's test service, HTTP/2) to the URL's host and port instead
    /// of HTTP GETs; headers become call metadata.
    #[arg(long)]
    grpc: bool,
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("ewma-bench: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Backends(a) => backends(a),
        Cmd::Load(a) => load(a),
        Cmd::Compare(a) => compare(a),
        Cmd::Overhead(a) => overhead(a),
        Cmd::Hostcalls(a) => hostcalls(a),
        Cmd::Micro(a) => micro(a),
        Cmd::Simulate(a) => simulate(a),
        Cmd::Tables(a) => tables(a),
    }
}

fn backends(args: BackendsArgs) -> Result<()> {
    let mut running = Vec::new();
    for arg in &args.backends {
        let (spec, addr) = parse_backend_arg(arg)?;
        let latency = spec.latency.clone();
        let b = Backend::start(spec, &addr)?;
        println!(
            "backend {} listening on {} latency {}",
            b.name(),
            b.addr(),
            latency
        );
        running.push(b);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let limit = args.run_for.unwrap_or(Duration::from_secs(365 * 24 * 3600));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = tokio::time::sleep(limit) => {}
        }
        anyhow::Ok(())
    })?;
    for b in &running {
        println!(
            "backend {} served {} (503: {}, health: {})",
            b.name(),
            b.served(),
            b.failed(),
            b.health_served()
        );
    }
    Ok(())
}

fn parse_header(h: &str) -> Result<(String, String)> {
    let (k, v) = h
        .split_once(':')
        .or_else(|| h.split_once('='))
        .with_context(|| format!("header {h:?}: expected \"name: value\""))?;
    if k.trim().is_empty() {
        bail!("header {h:?}: empty name");
    }
    Ok((k.trim().to_string(), v.trim().to_string()))
}

fn load(args: LoadArgs) -> Result<()> {
    let spec = LoadSpec {
        url: args.url.clone(),
        rate_per_s: args.rate,
        duration: args.duration,
        max_in_flight: args.max_in_flight,
        closed_loop_workers: args.workers,
        headers: args
            .headers
            .iter()
            .map(|h| parse_header(h))
            .collect::<Result<_>>()?,
        timeout: args.timeout,
        epoch: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let records = rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let reporter = args
            .report_every
            .map(|every| tokio::spawn(report(rx, every)));
        // Without a reporter the channel is simply not created, so nothing piles up unread.
        let observer = reporter.as_ref().map(|_| tx);
        let records = if args.grpc {
            harness::grpc::run_observed(&spec, observer).await
        } else {
            run_observed(&spec, observer).await
        };
        if let Some(r) = reporter {
            let _ = r.await;
        }
        records
    })?;
    let summary = Summary::of(&records);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!("{summary}");
    }
    Ok(())
}

/// Prints one line per interval about the records completed in it, until the run ends.
async fn report(mut rx: tokio::sync::mpsc::UnboundedReceiver<Record>, every: Duration) {
    let every = every.max(Duration::from_millis(100));
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval_at(start + every, every);
    let mut window: Vec<Record> = Vec::new();
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Some(r) => window.push(r),
                None => break,
            },
            _ = tick.tick() => {
                print_window(start.elapsed(), &window);
                window.clear();
            }
        }
    }
    if !window.is_empty() {
        print_window(start.elapsed(), &window);
    }
}

fn print_window(at: Duration, window: &[Record]) {
    let s = Summary::of(window);
    println!(
        "[{:6.1}s] n={} err={} drop={} p50={:.1}ms p99={:.1}ms  {}",
        at.as_secs_f64(),
        s.count,
        s.errors,
        s.dropped,
        s.p50_ms,
        s.p99_ms,
        format_shares(&s.shares)
    );
}

fn bench_out(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("out").join(name)
}

fn compare(args: CompareArgs) -> Result<()> {
    let mut scenario = if args.smoke {
        Scenario::load_smoke(&args.scenario)?
    } else {
        Scenario::load(&args.scenario)?
    };
    for v in &args.variants {
        let variant = Policy::from_arg(v)?;
        match scenario
            .policies
            .iter_mut()
            .find(|p| p.name() == variant.name())
        {
            Some(p) => *p = variant,
            None => scenario.policies.push(variant),
        }
    }
    if !args.policies.is_empty() {
        scenario.policies = Policy::select(&scenario.policies, &args.policies)?;
    }
    let out = args.out.unwrap_or_else(|| bench_out(&scenario.name));
    let opts = CompareOptions {
        out_dir: out.clone(),
        wasm: args.wasm,
        plots: !args.no_plots,
        rounds: args.rounds,
    };
    let report = ewma_bench::compare::compare(&scenario, &opts)?;
    println!("\n{}", markdown_table(&report));
    print!("{}", windows_section(&report));
    println!("written to {}: {}", out.display(), report.files.join(", "));
    Ok(())
}

fn overhead(args: OverheadArgs) -> Result<()> {
    let out = args.out.unwrap_or_else(|| bench_out("overhead"));
    let mut opts = OverheadOptions::new(out.clone(), args.wasm);
    opts.noop_wasm = args.noop_wasm;
    opts.header_wasm = args.header_wasm;
    opts.baseline_wasm = args.baseline_wasm;
    if let Some(r) = args.rounds {
        opts.rounds = r.clamp(1, 20);
    }
    if args.smoke {
        opts = opts.smoke();
    }
    let report = ewma_bench::overhead::run(&opts)?;
    println!("\n{}", ewma_bench::overhead::markdown(&report, &opts));
    println!("written to {}", out.display());
    Ok(())
}

fn hostcalls(args: HostcallsArgs) -> Result<()> {
    use ewma_bench::hostcalls::HostcallOptions;
    let out = args.out.unwrap_or_else(|| bench_out("hostcalls"));
    let mut opts = HostcallOptions::new(out.clone());
    if args.smoke {
        opts = opts.smoke();
    }
    opts.module = args.module;
    if !args.calls.is_empty() {
        opts.calls = args.calls;
    }
    if !args.n.is_empty() {
        opts.counts = args.n.into_iter().filter(|&n| n > 0).collect();
    }
    if let Some(r) = args.rounds {
        opts.rounds = r.clamp(1, 20);
    }
    if let Some(s) = args.seconds {
        opts.saturation_time = Duration::from_secs(s.clamp(1, 60));
    }
    let report = ewma_bench::hostcalls::run(&opts)?;
    println!("\n{}", ewma_bench::hostcalls::markdown(&report));
    println!("written to {}", out.display());
    Ok(())
}

fn micro(args: MicroArgs) -> Result<()> {
    if cfg!(debug_assertions) && !args.smoke {
        eprintln!("note: a debug build; run with --release for meaningful numbers");
    }
    let results = if args.hosts.is_empty() && args.budget_ms.is_none() {
        ewma_bench::micro::run(args.smoke)
    } else {
        let counts = if args.hosts.is_empty() {
            ewma_bench::micro::HOST_COUNTS.to_vec()
        } else {
            args.hosts.clone()
        };
        let default_ms = if args.smoke { 5 } else { 400 };
        let budget = std::time::Duration::from_millis(args.budget_ms.unwrap_or(default_ms));
        ewma_bench::micro::run_with(&counts, budget)
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!("{}", ewma_bench::micro::markdown(&results));
    }
    Ok(())
}

fn simulate(args: SimulateArgs) -> Result<()> {
    use ewma_bench::sim::{self, SimOptions};
    if cfg!(debug_assertions) && !args.smoke {
        eprintln!("note: a debug build; run with --release for fleet sizes");
    }
    let mut spec = sim::file::load(&args.file, args.smoke)?;
    if let Some(n) = args.proxies {
        spec.rate *= n as f64 / spec.proxies as f64;
        spec.proxies = n;
    }
    if let Some(w) = args.workers {
        spec.workers = w;
    }
    if let Some(d) = args.duration {
        spec.duration = d;
    }
    if !args.policies.is_empty() {
        spec.policies = Policy::select(&spec.policies, &args.policies)?;
    }
    sim::file::validate(&spec)?;
    let seeds = if args.seeds.is_empty() {
        vec![spec.seed]
    } else {
        args.seeds.clone()
    };
    let suffix = if args.scale.is_empty() { "" } else { "-scale" };
    let out = args
        .out
        .unwrap_or_else(|| bench_out(&format!("sim-{}{suffix}", spec.name)));
    let opts = SimOptions {
        seeds,
        threads: args.threads.max(1),
        out_dir: out.clone(),
        plots: !args.no_plots,
    };
    let started = std::time::Instant::now();
    if args.scale.is_empty() {
        let report = sim::simulate(&spec, &opts)?;
        println!("\n{}", sim::markdown(&report));
    } else {
        let points = sim::scale(&spec, &args.scale, &opts)?;
        println!("\n{}", sim::scale_table(&points));
    }
    println!(
        "written to {} ({:.1} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn tables(args: TablesArgs) -> Result<()> {
    let root = harness::repo_root();
    let files = if args.files.is_empty() {
        vec![root.join("README.md"), root.join("bench/README.md")]
    } else {
        args.files
    };
    let from = args.from.unwrap_or_else(|| bench_out(""));
    let n = ewma_bench::tables::rewrite(&files, &from)?;
    println!(
        "rewrote {n} section(s) of {}",
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
