//! `ewma-lb-tune`: chooses ewma-lb's settings from an Envoy access log of its own traffic
//! (docs/tuning.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use ewma_bench::tune::replay::{ReplayOptions, Window};
use ewma_bench::tune::{tune, TuneOptions};

/// Replays an access log's arrivals through the plugin's own core over a model of each host
/// fitted from the log, with candidate settings, and writes the best as a plugin configuration.
#[derive(Parser, Debug)]
#[command(name = "ewma-lb-tune", version)]
struct Cli {
    /// Access logs (one JSON object a line, the shipped format; plain or gzip), read in order.
    #[arg(required = true)]
    logs: Vec<PathBuf>,
    /// The plugin configuration that ran while the logs were written: JSON, or @FILE.
    #[arg(long, default_value = "{}")]
    config: String,
    /// The cluster to tune (`upstream_cluster`); default: the one with the most requests.
    #[arg(long)]
    cluster: Option<String>,
    /// Replay from this many seconds after the log's first request ...
    #[arg(long, default_value_t = 0.0)]
    from: f64,
    /// ... for this many seconds (the window kept in memory: about 64 bytes a request).
    #[arg(long, default_value_t = 600.0)]
    duration: f64,
    /// Width of the time buckets of the host models, seconds: well under the period of any
    /// change of the hosts the replay should see.
    #[arg(long, default_value_t = 1.0)]
    bucket: f64,
    /// Envoy worker threads (`--concurrency`) of the proxy that wrote the log.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// The route's timeout, seconds.
    #[arg(long, default_value_t = 5.0)]
    route_timeout: f64,
    /// Seconds at the start of the window left out of every figure (the table forms).
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Seeds: each candidate is replayed once per seed.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// Replays at once.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Where to write the recommended plugin configuration.
    #[arg(long, default_value = "ewma-lb-tuned.json")]
    out: PathBuf,
    /// Also write the report (markdown) here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Also write a summary for scripts here (JSON: the recommendation, whether it changes
    /// anything, its predicted gain and the gain to expect).
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Also draw each candidate's p50, p99 and p99.9 into this directory
    /// (tune-percentiles.svg and .png; needs a TrueType font, bench/README.md).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Only the smoother and its time constant (fewer candidates).
    #[arg(long)]
    quick: bool,
    /// No progress bars.
    #[arg(long)]
    no_progress: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let config_text = match cli.config.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file).with_context(|| format!("--config {file}"))?,
        None => cli.config.clone(),
    };
    let current: serde_json::Value =
        serde_json::from_str(&config_text).context("--config: not JSON")?;
    let opts = TuneOptions {
        logs: cli.logs,
        current,
        window: Window {
            cluster: cli.cluster,
            from_s: cli.from,
            duration_s: cli.duration,
        },
        bucket: Duration::from_secs_f64(cli.bucket.max(0.01)),
        replay: ReplayOptions {
            workers: cli.workers,
            route_timeout: Duration::from_secs_f64(cli.route_timeout.max(0.001)),
            warmup: Duration::from_secs_f64(cli.warmup.max(0.0)),
            seeds: cli.seeds,
            threads: cli.threads,
        },
        progress: !cli.no_progress,
        quick: cli.quick,
    };
    let report = tune(&opts)?;
    println!("{}", report.markdown);
    let json = serde_json::to_string_pretty(&report.recommended)?;
    std::fs::write(&cli.out, format!("{json}\n"))
        .with_context(|| format!("writing {}", cli.out.display()))?;
    println!(
        "Wrote {} (checked by the plugin's parser): the plugin configuration to apply.",
        cli.out.display()
    );
    if let Some(dir) = cli.plot {
        for f in ewma_bench::tune::plot(&report, &dir)? {
            println!("Wrote {}.", f.display());
        }
    }
    if let Some(path) = cli.report {
        std::fs::write(&path, &report.markdown)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = cli.summary {
        let json = serde_json::to_string_pretty(&report.summary())?;
        std::fs::write(&path, format!("{json}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
