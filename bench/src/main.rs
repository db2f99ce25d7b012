//! `ewma-bench`: run test backends in the foreground, or send load and report latency and shares.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use ewma_bench::backend::{parse_backend_arg, Backend};
use ewma_bench::latency::parse_duration;
use ewma_bench::load::{run_observed, LoadSpec, Record};
use ewma_bench::summary::{format_shares, Summary};

#[derive(Parser)]
#[command(name = "ewma-bench", about = "Backends and load for ewma-lb tests and benchmarks (127.0.0.1 only)")]
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
    }
}

fn backends(args: BackendsArgs) -> Result<()> {
    let mut running = Vec::new();
    for arg in &args.backends {
        let (spec, addr) = parse_backend_arg(arg)?;
        let latency = spec.latency.clone();
        let b = Backend::start(spec, &addr)?;
        println!("backend {} listening on {} latency {}", b.name(), b.addr(), latency);
        running.push(b);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
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
        println!("backend {} served {} (503: {}, health: {})", b.name(), b.served(), b.failed(), b.health_served());
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
        headers: args.headers.iter().map(|h| parse_header(h)).collect::<Result<_>>()?,
        timeout: args.timeout,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let records = rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let reporter = args.report_every.map(|every| tokio::spawn(report(rx, every)));
        // Without a reporter the channel is simply not created, so nothing piles up unread.
        let observer = reporter.as_ref().map(|_| tx);
        let records = run_observed(&spec, observer).await;
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
