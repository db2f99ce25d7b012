//! `hostcalls`: what one host call costs in Envoy's V8. The overhead run's Envoy and cluster
//! (`--concurrency 1`, the shipped `override_host` cluster, instant backends), with
//! bench/hostcall-filter in the plugin's place making N of one call per request (N = 0: the same
//! module doing nothing). Throughput at saturation per (call, N), in alternating order over
//! rounds; a call's cost is the time per request it adds over N = 0 in the same round, divided
//! by N: at saturation the single Envoy worker is the bottleneck, so 1 / (req/s) is its time per
//! request.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use harness::Backend;

use crate::figures::Spread;
use crate::overhead::{
    build_module, prepare, reference_module, saturate, shipped_config, write_results,
};

/// The calls bench/hostcall-filter knows (its configuration's first word), where it makes them,
/// and the host call each is.
pub const CALLS: [(&str, &str, &str); 10] = [
    (
        "path",
        "request headers",
        "get_http_request_header(\":path\")",
    ),
    (
        "cluster_name",
        "request headers",
        "get_property([\"xds\", \"cluster_name\"])",
    ),
    (
        "monotonic_clock",
        "request headers",
        "`Instant::now()` (WASI clock_time_get, monotonic)",
    ),
    (
        "current_time",
        "request headers",
        "get_current_time (proxy_get_current_time_nanoseconds)",
    ),
    (
        "set_header",
        "request headers",
        "set_http_request_header(\"x-bench-hostcall\", \"1\")",
    ),
    (
        "filter_state",
        "request headers",
        "set_property([\"bench_hostcall_I\"], ...), a new filter state per call (as the decision for the access log)",
    ),
    (
        "gauge",
        "request headers",
        "record_metric(gauge I, ...), N gauges defined at configure time (as the refreshing VM sets its per-host gauges)",
    ),
    (
        "content_type",
        "response headers",
        "get_http_response_header(\"content-type\")",
    ),
    (
        "upstream_address",
        "on_log",
        "get_property([\"upstream\", \"address\"])",
    ),
    (
        "response_code",
        "on_log",
        "get_property([\"response\", \"code\"])",
    ),
];

/// The module doing nothing: every call's baseline.
pub const BASELINE: &str = "none";

#[derive(Clone, Debug)]
pub struct HostcallOptions {
    pub out_dir: PathBuf,
    /// The module; built from bench/hostcall-filter when `None`.
    pub module: Option<PathBuf>,
    pub calls: Vec<String>,
    /// N per request, each > 0 (N = 0, the baseline, always runs).
    pub counts: Vec<u32>,
    pub rounds: u32,
    pub endpoints: usize,
    pub workers: usize,
    pub warmup: Duration,
    pub saturation_time: Duration,
    pub concurrency: u32,
    pub smoke: bool,
}

impl HostcallOptions {
    pub fn new(out_dir: PathBuf) -> Self {
        HostcallOptions {
            out_dir,
            module: None,
            calls: CALLS.iter().map(|c| c.0.to_string()).collect(),
            // N = 10 of the cheap calls is below this machine's noise (±5 % per round).
            counts: vec![50, 200],
            rounds: 3,
            endpoints: 4,
            workers: 16,
            warmup: Duration::from_secs(1),
            saturation_time: Duration::from_secs(4),
            concurrency: 1,
            smoke: false,
        }
    }

    /// One call, one N, one round, a fraction of a second each: checks that the tool works.
    pub fn smoke(mut self) -> Self {
        self.smoke = true;
        self.calls = vec!["path".into()];
        self.counts = vec![50];
        self.rounds = 1;
        self.workers = 4;
        self.warmup = Duration::from_millis(200);
        self.saturation_time = Duration::from_millis(500);
        self
    }
}

/// One (call, N) in one round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostcallRun {
    pub call: String,
    pub n: u32,
    pub round: u32,
    pub saturation_rps: f64,
    pub errors: u64,
}

/// A call at one N over the rounds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostcallResult {
    pub call: String,
    pub n: u32,
    pub saturation_rps: Spread,
    /// µs per call: per round, (1 / rps(N) - 1 / rps(0)) / N against the same round's baseline.
    pub us_per_call: Option<Spread>,
    pub errors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostcallReport {
    pub settings: serde_json::Value,
    pub baseline: HostcallResult,
    pub results: Vec<HostcallResult>,
    pub runs: Vec<HostcallRun>,
}

/// Runs every (call, N) and the baseline, writes results.md / results.json into `o.out_dir`.
pub fn run(o: &HostcallOptions) -> Result<HostcallReport> {
    for call in &o.calls {
        if !CALLS.iter().any(|c| c.0 == call) {
            anyhow::bail!(
                "unknown call {call:?} (known: {})",
                CALLS.map(|c| c.0).join(", ")
            );
        }
    }
    let module = match &o.module {
        Some(p) => p.clone(),
        None => build_module("hostcall-filter")?,
    };
    let backends = prepare(&o.out_dir, o.endpoints)?;
    let endpoints: Vec<SocketAddr> = backends.iter().map(Backend::addr).collect();
    let mut points: Vec<(String, u32)> = vec![(BASELINE.to_string(), 0)];
    for call in &o.calls {
        for &n in o.counts.iter().filter(|&&n| n > 0) {
            points.push((call.clone(), n));
        }
    }
    let mut runs = Vec::new();
    for round in 0..o.rounds {
        let mut order = points.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for (call, n) in order {
            // The baseline is the module too, with N = 0 of a call it then never makes.
            let plugin_config = format!("{} {n}", if n == 0 { "path" } else { &call });
            let mut config = shipped_config(&module, &endpoints)?;
            reference_module(&mut config, "hostcall", &module, &plugin_config)?;
            eprint!("round {round} {call:>16} x {n:<3} ... ");
            let sat = saturate(
                &mut config,
                &plugin_config,
                o.concurrency,
                o.workers,
                o.warmup,
                o.saturation_time,
                None,
            )?;
            eprintln!("{:.0} req/s", sat.rps);
            runs.push(HostcallRun {
                call,
                n,
                round,
                saturation_rps: sat.rps,
                errors: sat.errors,
            });
            std::thread::sleep(Duration::from_millis(if o.smoke { 50 } else { 500 }));
        }
    }
    drop(backends);
    let result = |call: &str, n: u32| {
        let mine: Vec<&HostcallRun> = runs.iter().filter(|r| r.call == call && r.n == n).collect();
        let per_call = mine.iter().filter_map(|r| {
            let base = runs
                .iter()
                .find(|b| b.call == BASELINE && b.round == r.round)?;
            Some(us_per_call(r.saturation_rps, base.saturation_rps, n))
        });
        HostcallResult {
            call: call.to_string(),
            n,
            saturation_rps: Spread::of(mine.iter().map(|r| r.saturation_rps)).unwrap_or_default(),
            us_per_call: if n == 0 { None } else { Spread::of(per_call) },
            errors: mine.iter().map(|r| r.errors).sum(),
        }
    };
    let baseline = result(BASELINE, 0);
    let results = points
        .iter()
        .skip(1)
        .map(|(call, n)| result(call, *n))
        .collect();
    let report = HostcallReport {
        settings: serde_json::json!({
            "envoy_concurrency": o.concurrency,
            "rounds": o.rounds,
            "endpoints": o.endpoints,
            "closed_loop_workers": o.workers,
            "warmup_s": o.warmup.as_secs_f64(),
            "saturation_s": o.saturation_time.as_secs_f64(),
            "counts": o.counts,
            "calls": o.calls,
            "module": module.display().to_string(),
        }),
        baseline,
        results,
        runs,
    };
    write_results(&o.out_dir, &markdown(&report), &report)?;
    Ok(report)
}

/// The time per request `n` calls add over the baseline, per call, in µs: at saturation one
/// Envoy worker is the bottleneck, so 1 / (req/s) is its time per request.
pub fn us_per_call(rps: f64, baseline_rps: f64, n: u32) -> f64 {
    (1e6 / rps - 1e6 / baseline_rps) / f64::from(n.max(1))
}

/// One row per call: req/s at each N and the µs per call each N gives.
pub fn table(r: &HostcallReport) -> String {
    let mut counts: Vec<u32> = r.results.iter().map(|x| x.n).collect();
    counts.sort_unstable();
    counts.dedup();
    let mut md = String::from("| call | host call | where |");
    for n in &counts {
        let _ = write!(md, " req/s, N = {n} |");
    }
    for n in &counts {
        let _ = write!(md, " µs per call (N = {n}) |");
    }
    md.push_str("\n|---|---|---|");
    for _ in 0..counts.len() * 2 {
        md.push_str("---|");
    }
    md.push('\n');
    let mut calls: Vec<&str> = Vec::new();
    for x in &r.results {
        if !calls.contains(&x.call.as_str()) {
            calls.push(&x.call);
        }
    }
    for call in calls {
        let (what, at) = CALLS
            .iter()
            .find(|c| c.0 == call)
            .map_or(("?", "?"), |c| (c.2, c.1));
        let _ = write!(md, "| `{call}` | {what} | {at} |");
        let get = |n: u32| r.results.iter().find(|x| x.call == call && x.n == n);
        for &n in &counts {
            let _ = write!(
                md,
                " {} |",
                get(n).map_or("-".into(), |x| x.saturation_rps.show(0))
            );
        }
        for &n in &counts {
            let _ = write!(
                md,
                " {} |",
                get(n)
                    .and_then(|x| x.us_per_call.as_ref())
                    .map_or("-".into(), |s| s.show(3))
            );
        }
        md.push('\n');
    }
    let errors: u64 = r.baseline.errors + r.results.iter().map(|x| x.errors).sum::<u64>();
    let _ = writeln!(
        md,
        "\nN = 0 (the module making no call): {} req/s. Errors over all runs: {errors}.",
        r.baseline.saturation_rps.show(0)
    );
    md
}

/// results.md of the host-call run.
pub fn markdown(r: &HostcallReport) -> String {
    let mut md = String::from("# Host calls\n\n");
    let _ = writeln!(
        md,
        "Envoy --concurrency {} with the shipped cluster in front of {} instant backends; bench/hostcall-filter \
         in the plugin's place making N of one host call per request. Closed loop, {} workers, {} s after {} s of \
         warm-up, per (call, N); {} round(s) in alternating order; each figure the median (min-max) over the rounds. \
         µs per call: per round, (1 / req/s at N - 1 / req/s at N = 0) / N.\n",
        r.settings["envoy_concurrency"],
        r.settings["endpoints"],
        r.settings["closed_loop_workers"],
        r.settings["saturation_s"],
        r.settings["warmup_s"],
        r.settings["rounds"],
    );
    md.push_str(&table(r));
    md.push_str("\nPer round:\n\n| round | call | N | req/s |\n|---|---|---|---|\n");
    for x in &r.runs {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} |",
            x.round, x.call, x.n, x.saturation_rps
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call the bench offers is one the module parses: its doc table lists the same names.
    #[test]
    fn the_modules_calls_are_the_benchs() {
        let src =
            std::fs::read_to_string(harness::repo_root().join("bench/hostcall-filter/src/lib.rs"))
                .unwrap();
        for (call, _, _) in CALLS {
            assert!(src.contains(&format!("\"{call}\" => Call::")), "{call}");
        }
    }

    #[test]
    fn the_cost_per_call_is_the_added_time_over_n() {
        // 100 µs per request at N = 0, 150 µs at N = 50: 1 µs per call.
        let us = us_per_call(1e6 / 150.0, 10_000.0, 50);
        assert!((us - 1.0).abs() < 1e-9, "{us}");
        // A faster run than the baseline (noise) is a negative cost, not hidden.
        assert!(us_per_call(11_000.0, 10_000.0, 10) < 0.0);
    }
}
