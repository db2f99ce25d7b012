//! Known answers for `ewma-lb-tune` (issue 18): the simulator writes an access log from a world
//! under some settings; the tool reads only the log. The answer is known because the world is:
//! each test runs the world again under the tool's recommendation (not a replay of the fitted
//! model) and checks that its p99 is really lower, by a margin, than under the settings that
//! wrote the log; where the model does not reproduce the log's tail, the tool must recommend
//! nothing.
//!
//! The issue expected "a host alternating with period P wants a time constant well under P" and
//! "rare spikes want a long one or no peak". Run on the true worlds, the first did not hold for
//! this plugin (its pick compares requests in flight, and rises persist before they count): for
//! periods of 2-8 s longer time constants did as well or better, and the shortest was the worst
//! (the two alternating worlds below). The second holds: spikes held by a long peak are let go
//! (`rare_spikes_held_by_a_long_peak_are_let_go`). The worlds below are ones where the true answer
//! is clear.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use ewma_bench::policy::Policy;
use ewma_bench::sim::{Arrivals, Cost, HostSpec, SimSpec};
use ewma_bench::tune::replay::{ReplayOptions, Window};
use ewma_bench::tune::{synth, tune, TuneOptions, TuneReport};
use harness::latency::Latency;
use harness::Phase;
use serde_json::{json, Value};

/// The model's bucket in most worlds here: each phase spans whole buckets.
const HALF_S: Duration = Duration::from_millis(500);

fn world(hosts: Vec<HostSpec>, rate: f64, secs: u64, costs: Vec<Cost>) -> SimSpec {
    SimSpec {
        name: "world".into(),
        description: String::new(),
        proxies: 1,
        workers: 2,
        hosts,
        rate,
        arrivals: Arrivals::Poisson,
        costs,
        duration: Duration::from_secs(secs),
        warmup: Duration::from_secs(0),
        route_timeout: Duration::from_secs(5),
        policies: Vec::new(),
        plugin_config: json!({}),
        static_endpoints: false,
        seed: 11,
    }
}

/// Writes the world's log under `config` and tunes from it (the smoother stage).
fn tune_world(
    name: &str,
    spec: &SimSpec,
    config: Value,
    seeds: &[u64],
    bucket: Duration,
) -> TuneReport {
    let dir = std::env::temp_dir().join(format!("ewma-tune-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("access.log");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let policy = Policy::variant("current", config.clone()).unwrap();
    let lines = synth::write_log(spec, &policy, &mut file).unwrap();
    file.flush().unwrap();
    drop(file);
    assert!(lines > 1000, "{lines} lines");
    let report = tune(&TuneOptions {
        logs: vec![path],
        current: config,
        window: Window {
            cluster: None,
            from_s: 0.0,
            duration_s: 3600.0,
        },
        bucket,
        replay: ReplayOptions {
            workers: 2,
            route_timeout: Duration::from_secs(5),
            warmup: Duration::from_secs(3),
            seeds: seeds.to_vec(),
            threads: 2,
        },
        progress: false,
        quick: true,
    })
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{}", report.markdown);
    report
}

fn smoothing(report: &TuneReport) -> &Value {
    &report.recommended["smoothing"]
}

/// The p99 `config` gets on the true world (not a replay), median over `seeds`.
fn true_p99(spec: &SimSpec, config: &Value, seeds: &[u64]) -> f64 {
    let s = SimSpec {
        policies: vec![Policy::variant("truth", config.clone()).unwrap()],
        warmup: Duration::from_secs(3),
        ..spec.clone()
    };
    let r = ewma_bench::sim::run_all(&s, seeds, 2, false).unwrap();
    r[0].figures.median(|f| Some(f.p99_ms)).unwrap()
}

/// A host of 4 servers at 8-12 ms that queues the rest.
fn queueing_host(name: &str) -> HostSpec {
    HostSpec {
        capacity: Some(4),
        ..HostSpec::new(
            name,
            Latency::Uniform {
                lo_ms: 8,
                hi_ms: 12,
            },
        )
    }
}

/// A host, one of three that queue (4 servers at 10 ms), alternating slow and fast with period
/// `period_s`.
fn alternating_world(period_s: f64, slow: Latency, rate: f64) -> SimSpec {
    let mut alternating = queueing_host("alternating");
    let mut t = 0.0;
    while t < 40.0 {
        alternating.phases.push(Phase {
            from_s: t,
            to_s: t + period_s / 2.0,
            latency: slow.clone(),
        });
        t += period_s;
    }
    world(
        vec![
            alternating,
            queueing_host("steady1"),
            queueing_host("steady2"),
        ],
        rate,
        40,
        Vec::new(),
    )
}

/// The tool, from a log written under `current`, recommends a change that is really better:
/// on the true world (run again under the recommendation, not replayed) its p99 is at least
/// `margin` lower than the current settings', and the tool's own gain holds on every seed.
fn finds_the_better_setting(
    name: &str,
    spec: &SimSpec,
    current: Value,
    bucket: Duration,
    margin: f64,
) -> TuneReport {
    let report = tune_world(name, spec, current.clone(), &[1, 2], bucket);
    assert!(
        report.best > 0,
        "no change recommended\n{}",
        report.markdown
    );
    assert!(report.gain_pct.min > 0.0, "{}", report.markdown);
    // What bench/tune-cycle.sh reads: the same recommendation and promises as the report.
    let summary = report.summary();
    assert_eq!(summary["changed"], true);
    assert_eq!(summary["recommended"], report.recommended);
    assert_eq!(summary["gain_pct"]["min"], report.gain_pct.min);
    assert_eq!(summary["gain_floor_pct"], report.gain_floor_pct);
    let (now, then) = (
        true_p99(spec, &current, &[1, 2]),
        true_p99(spec, &report.recommended, &[1, 2]),
    );
    assert!(
        then <= now * (1.0 - margin),
        "true p99 {then:.1} ms under the recommendation against {now:.1} ms now\n{}",
        report.markdown
    );
    eprintln!("true p99: {now:.1} ms now, {then:.1} ms recommended");
    report
}

/// The known-answer worlds, each with the settings its log is written under.
fn alternating_every_2_s() -> (SimSpec, Value) {
    let slow = Latency::Uniform {
        lo_ms: 150,
        hi_ms: 250,
    };
    (
        alternating_world(4.0, slow, 800.0),
        json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 250}}),
    )
}

fn slow_every_other_4_s() -> (SimSpec, Value) {
    let slow = Latency::Uniform {
        lo_ms: 40,
        hi_ms: 60,
    };
    (
        alternating_world(8.0, slow, 850.0),
        json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 500}}),
    )
}

fn spikes_under_a_long_peak() -> (SimSpec, Value) {
    (
        spikes_world(),
        json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 10000}}),
    )
}

#[test]
fn a_host_alternating_every_2_s_gets_no_change_that_is_truly_worse() {
    // On the true world a 250 ms time constant used to chase every phase (p99 118 ms against
    // 92-100 for 0.5-2 s). Since the pick decides comparisons at equal counts by the queues
    // first, a worker steers round the slow phase as it comes, and 250 ms is as good as any:
    // p99 93.2 ms against 93.5, 95.4, 100.4, 96.3 and 105.2 for 0.5, 1, 2, 5 and 10 s (seeds 1
    // and 2). Reading the log written under it, the tool must not recommend a change that is
    // truly worse: it keeps the settings (its replay misses this log's p99 by 27 %), or what it
    // recommends is no worse on the true world.
    let (spec, current) = alternating_every_2_s();
    let report = tune_world("alternating", &spec, current.clone(), &[1, 2], HALF_S);
    if report.best > 0 {
        let (now, then) = (
            true_p99(&spec, &current, &[1, 2]),
            true_p99(&spec, &report.recommended, &[1, 2]),
        );
        assert!(
            then <= now * 1.02,
            "true p99 {then:.1} ms under the recommendation against {now:.1} ms now\n{}",
            report.markdown
        );
    }
}

#[test]
fn a_host_slow_every_other_4_s_is_held_down_by_a_longer_time_constant() {
    // Period 8 s, 50 ms when slow: on the true world a 500 ms time constant lets the host back
    // in at each fast phase and pays for it at the next slow one (p99 88.5 ms; 10 s: 66.1). The
    // model fitted before service times were taken out of the queue exactly did not see this
    // gain and kept the current settings.
    let (spec, current) = slow_every_other_4_s();
    let report = finds_the_better_setting("period-8", &spec, current, HALF_S, 0.1);
    let tau = smoothing(&report)["tau_ms"].as_f64().unwrap();
    assert!(tau >= 2000.0, "{}", report.markdown);
}

/// Three hosts that each stall for 100 ms (300 ms a request) once every 8 s, at their own times:
/// rare isolated spikes.
fn spikes_world() -> SimSpec {
    let host = |name: &str, offset_s: f64| {
        let mut h = queueing_host(name);
        let mut t = offset_s;
        while t < 40.0 {
            h.phases.push(Phase {
                from_s: t,
                to_s: t + 0.1,
                latency: Latency::Fixed(300),
            });
            t += 8.0;
        }
        h
    };
    world(
        vec![host("a", 2.0), host("b", 4.7), host("c", 7.3)],
        850.0,
        40,
        Vec::new(),
    )
}

#[test]
fn rare_spikes_held_by_a_long_peak_are_let_go() {
    // Peak EWMA jumps to a spike and, with a 10 s time constant, holds it for seconds: on the
    // true world p99 170-184 ms, against 42-45 without the peak or with a short time constant.
    // With buckets no longer than a spike the model sees them, and the tool must recommend
    // letting them go: no peak, or a peak that decays within a second. Buckets of 250 ms did
    // until the pick passed over a host that keeps a request past its patience: the stalled host
    // then gets fewer requests while it stalls, a 250 ms bucket's fit dilutes the 100 ms stall,
    // and the replay missed the log's p99 by 44 % (119 against 66.7 ms), so the tool, as it
    // should, recommended nothing and suggested a shorter bucket.
    let (spec, current) = spikes_under_a_long_peak();
    let report =
        finds_the_better_setting("long-peak", &spec, current, Duration::from_millis(100), 0.5);
    let s = smoothing(&report);
    assert!(
        s["algorithm"] == "decay_ewma" || s["tau_ms"].as_f64().unwrap() <= 1000.0,
        "{}",
        report.markdown
    );
}

#[test]
fn where_the_model_misses_the_tail_nothing_is_recommended() {
    // The same spikes, shorter than a bucket of the model (500 ms), which takes each bucket's
    // median. The replay's p99 is far from the log's, and the tool says so instead of
    // recommending from it.
    let spec = spikes_world();
    let current = json!({
        "smoothing": {"algorithm": "peak_ewma", "tau_ms": 10000, "peak_samples": 1},
        "persistence_ms": 0
    });
    let report = tune_world("spikes", &spec, current.clone(), &[1, 2], HALF_S);
    assert!(
        report.fit_error > ewma_bench::tune::MAX_FIT_ERROR,
        "{}",
        report.markdown
    );
    assert_eq!(report.best, 0, "{}", report.markdown);
    assert_eq!(report.recommended, current);
    let summary = report.summary();
    assert_eq!(summary["changed"], false);
    assert_eq!(summary["recommended"], current);
    assert!(summary["gain_floor_pct"].is_null());
    assert!(report
        .markdown
        .contains("No recommendation: the model does not reproduce this log"));
}

fn options(logs: Vec<PathBuf>) -> TuneOptions {
    TuneOptions {
        logs,
        current: json!({}),
        window: Window {
            cluster: None,
            from_s: 0.0,
            duration_s: 600.0,
        },
        bucket: Duration::from_secs(1),
        replay: ReplayOptions {
            workers: 2,
            route_timeout: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            seeds: vec![1],
            threads: 1,
        },
        progress: false,
        quick: true,
    }
}

#[test]
fn a_log_with_no_usable_line_is_an_error_naming_what_is_missing() {
    let dir = std::env::temp_dir().join(format!("ewma-tune-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.log");
    std::fs::write(
        &path,
        "[2026-01-01 00:00:00.000][1][info][main] starting main dispatch loop\n\
         {\"start_time\": \"2026-01-01T00:00:00.000Z\", \"path\": \"/\", \"response_code\": 200}\n\
         \u{0}\u{1}binary\n\
         {\"upstream_host\": \"10.0.0.1:80\", \"duration\": 3}\n",
    )
    .unwrap();
    let e = tune(&options(vec![path.clone()])).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.contains("no usable line in 4 lines"), "{e}");
    assert!(e.contains("upstream_host (missing from 1)"), "{e}");
    assert!(e.contains("duration (missing from 1)"), "{e}");
    assert!(e.contains("start_time (missing from 1)"), "{e}");
    assert!(e.contains("2 lines are not JSON objects"), "{e}");
    assert!(e.contains("bad.log:1: not JSON"), "{e}");
}

#[test]
fn bad_lines_among_good_ones_are_counted_with_their_numbers_and_gzip_reads_the_same() {
    let dir = std::env::temp_dir().join(format!("ewma-tune-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = SimSpec {
        hosts: vec![
            HostSpec::new("a", Latency::Fixed(10)),
            HostSpec::new("b", Latency::Fixed(20)),
        ],
        ..world(Vec::new(), 100.0, 8, Vec::new())
    };
    let mut text = Vec::new();
    synth::write_log(&spec, &Policy::get("ewma_lb").unwrap(), &mut text).unwrap();
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    lines.insert(10, b"not json at all");
    lines.insert(20, b"{\"truncated\": ");
    let joined = lines.join(&b'\n');
    let plain = dir.join("access.log");
    std::fs::write(&plain, &joined).unwrap();
    let gz = dir.join("access.log.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(&joined).unwrap();
    enc.finish().unwrap();
    let a = tune(&options(vec![plain])).unwrap();
    let b = tune(&options(vec![gz])).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(a.read.unparsable, 2);
    let numbers: Vec<u64> = a.read.skipped.iter().map(|(_, n, _)| *n).collect();
    assert_eq!(numbers, vec![11, 21]);
    assert!(
        a.markdown.contains("access.log:11: not JSON"),
        "{}",
        a.markdown
    );
    assert_eq!(a.read.usable, b.read.usable);
    assert_eq!(
        a.outcomes[0].rounds, b.outcomes[0].rounds,
        "gzip reads the same lines"
    );
}

/// The gain to expect, checked over many logs (`cargo test --release -p ewma-bench --test tune --
/// --ignored --nocapture`, about a minute; bench/README.md, "The log's own luck in the floor"):
/// the three worlds above, each logged under its current settings with 20 seeds of its own, are
/// tuned (seeds 1-3, as `ewma-lb-tune` by default); each leader is run on the true world (seeds
/// 1-6). Of the recommendations, the floor must hold (the true gain at least the floor) for 90 %
/// in each world. Prints every log's figures.
#[test]
#[ignore = "a minute in release; run by hand"]
fn the_gain_to_expect_holds_over_twenty_logs_of_each_world() {
    let worlds = [
        ("alternating every 2 s", alternating_every_2_s(), HALF_S),
        ("slow every other 4 s", slow_every_other_4_s(), HALF_S),
        (
            "isolated stalls",
            spikes_under_a_long_peak(),
            Duration::from_millis(250),
        ),
    ];
    let truth = |spec: &SimSpec, config: &Value| true_p99(spec, config, &[1, 2, 3, 4, 5, 6]);
    let mut failures = Vec::new();
    for (name, (spec, current), bucket) in worlds {
        let now = truth(&spec, &current);
        let (mut recommended, mut held, mut worst_seed_held) = (0, 0, 0);
        println!("{name}: true p99 under the current settings {now:.1} ms");
        println!("| log seed | fit error % | leader | true gain % | worst seed's % | floor % | recommended |");
        for seed in 11..=30u64 {
            let log = SimSpec {
                seed,
                ..spec.clone()
            };
            let r = tune_world(
                &format!("floor-{seed}"),
                &log,
                current.clone(),
                &[1, 2, 3],
                bucket,
            );
            if r.leader == 0 {
                println!("| {seed} | {:.0} | - | | | | no |", 100.0 * r.fit_error);
                continue;
            }
            let leader = &r.outcomes[r.leader].candidate;
            let real = 100.0 * (now - truth(&spec, &leader.config)) / now;
            if r.best > 0 {
                recommended += 1;
                held += usize::from(r.gain_floor_pct <= real);
                worst_seed_held += usize::from(r.gain_pct.min <= real);
            }
            println!(
                "| {seed} | {:.0} | {} | {real:.1} | {:.1} | {:.1} | {} |",
                100.0 * r.fit_error,
                leader.change,
                r.gain_pct.min,
                r.gain_floor_pct,
                if r.best > 0 { "yes" } else { "no" }
            );
        }
        println!(
            "{name}: {recommended} of 20 recommended; the floor held for {held}, the worst seed's gain for {worst_seed_held}\n"
        );
        if held * 10 < recommended * 9 {
            failures.push(format!(
                "{name}: the floor held for {held} of {recommended}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}
