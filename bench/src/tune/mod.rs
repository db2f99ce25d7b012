//! `ewma-lb-tune`: the plugin's settings, chosen from an access log of its own traffic.
//!
//! Reads the logs (`log`), fits what a request costs each host (`model`), replays the log's
//! arrivals through the simulator over those models with candidate settings (`replay`), and
//! writes the best as a configuration the plugin's own parser accepts.

pub mod log;
pub mod model;
pub mod replay;
pub mod synth;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::figures::{RoundFigures, Spread};
use replay::{Candidate, Collector, Dataset, Outcome, ReplayOptions, Window};

/// What to tune from.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    pub logs: Vec<PathBuf>,
    /// The plugin configuration that ran while the logs were written (JSON).
    pub current: Value,
    pub window: Window,
    /// Width of the time buckets of the host models.
    pub bucket: Duration,
    pub replay: ReplayOptions,
    pub progress: bool,
    /// Only the smoother stage (a smoke run).
    pub quick: bool,
}

/// Everything a tuning run found.
#[derive(Clone, Debug)]
pub struct TuneReport {
    pub read: log::ReadSummary,
    pub data_summary: String,
    pub logged: RoundFigures,
    /// Every candidate, the current settings first.
    pub outcomes: Vec<Outcome>,
    /// Index of the recommended candidate in `outcomes`: the leader when it beat the current
    /// settings on every seed, else 0 (keep them).
    pub best: usize,
    /// Index of the best candidate: of the first stage (the smoother), the one changing the
    /// fewest settings among those within the replay's noise of the lowest median p99; or of
    /// the second (one more change on top of that) when it beats the first's by more than its
    /// own spread over the seeds.
    pub leader: usize,
    /// The first stage's lowest median p99 and the smoother taken instead, a smaller change
    /// within the replay's noise of it (indices in `outcomes`).
    pub passed_over: Option<(usize, usize)>,
    /// How far the replay of the current settings' p99 is from the log's, as a share of the
    /// log's: above [`MAX_FIT_ERROR`] nothing is recommended.
    pub fit_error: f64,
    /// The leader's p99 gain over the current settings, % of the current p99, per seed: median
    /// and range.
    pub gain_pct: Spread,
    /// The gain to hold the recommendation to, %: the lower of the gain's worst seed and the
    /// leader's median replayed p99 against the low end of the log's own p99
    /// ([`replay::logged_p99_low`]; the current settings' replayed median if lower).
    pub gain_floor_pct: f64,
    /// The low end of the log's own p99, ms.
    pub logged_p99_low: f64,
    /// What the floor's second end is measured against, ms: `logged_p99_low`, or the current
    /// settings' replayed median p99 when that is lower.
    pub floor_base_p99: f64,
    /// The configuration to apply, accepted by the plugin's parser.
    pub recommended: Value,
    /// The report, markdown.
    pub markdown: String,
}

/// The most the replay of the current settings' p99 may be off the log's (a share of it) for a
/// recommendation: further apart, the model misses what makes this log's tail.
pub const MAX_FIT_ERROR: f64 = 0.25;

/// The caveat every report carries.
pub const CAVEAT: &str = "A replay is a model, not what would have happened: the log shows what the hosts did under \
the settings that ran; the replay draws each request's latency from a per-host fit of latency against time and load \
(and failures against time), and what another policy would really have met can differ where the log holds little \
(a host that was avoided was measured only by its probes). Check the recommendation the way any change is checked: \
apply it, and watch p99 and the per-host shares (docs/tuning.md).";

/// Checks a plugin configuration with the plugin's own parser.
pub fn check_config(config: &Value) -> Result<()> {
    let text = serde_json::to_string(config)?;
    ewma_lb::config::Config::from_json(text.as_bytes())
        .map(|_| ())
        .map_err(|e| anyhow!("the plugin refuses the configuration: {e}"))
}

/// Reads the logs, fits, replays and recommends.
pub fn tune(opts: &TuneOptions) -> Result<TuneReport> {
    check_config(&opts.current).context("--config")?;
    let mut collector = Collector::new(opts.window.clone());
    let read = log::read(&opts.logs, opts.progress, |e| collector.add(e))?;
    if read.usable == 0 {
        bail!("{}", no_usable_line(&read));
    }
    let data = collector.finish()?;
    if data.arrivals.len() < 100 {
        bail!(
            "only {} requests of cluster {} in the window: too few to fit a model (widen --duration or --from)",
            data.arrivals.len(),
            data.cluster
        );
    }
    let fits = replay::fit_all(&data, opts.bucket.as_secs_f64());
    let spec = replay::spec(&data, &fits, &opts.replay);
    let logged = replay::logged(&data, opts.replay.warmup);
    let failures = fits.iter().any(|f| f.failure_rate > 0.0);

    let first = replay::candidates(&opts.current, None, failures);
    let bar = if opts.progress {
        let bar = indicatif::ProgressBar::new(first.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "replaying {pos}/{len} candidates x {msg} seeds [{bar:30}] {eta} left",
        ) {
            bar.set_style(style);
        }
        bar.set_message(opts.replay.seeds.len().to_string());
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut outcomes = Vec::new();
    let run = |c: Candidate, outcomes: &mut Vec<Outcome>| -> Result<()> {
        check_config(&c.config).with_context(|| format!("candidate {}", c.name))?;
        let rounds = replay::replay(&spec, &c.name, &c.config, &opts.replay)?;
        outcomes.push(Outcome {
            candidate: c,
            rounds,
        });
        bar.inc(1);
        Ok(())
    };
    for c in first {
        run(c, &mut outcomes)?;
    }
    // Of the smoothers the replay cannot tell apart from the lowest median, the one that changes
    // the fewest settings: the best of a dozen on three seeds is partly the seeds' luck, and a
    // smaller change moves the proxy less far from where the log measured it. In a real Envoy, a
    // smoother that had won the replay by less than its seeds' spread by switching algorithm as
    // well gained less than the replay's lower bound, where the same algorithm with a longer
    // time constant gained more (bench/README.md, "Tuning from the access log").
    let lowest_first = best_of(&outcomes);
    let best_first = simplest_within_noise(&outcomes, lowest_first, &opts.current)?;
    let mut leader = best_first;
    if !opts.quick {
        let second = replay::candidates(
            &opts.current,
            Some(&outcomes[best_first].candidate),
            failures,
        );
        bar.inc_length(second.len() as u64);
        let from = outcomes.len();
        for c in second {
            run(c, &mut outcomes)?;
        }
        // A second change is taken only when it beats the first stage's best by more than the
        // replay's own noise (its worst seed beats that one's median): of candidates the replay
        // cannot tell apart, the smaller change. In a real Envoy, a refresh interval that the
        // replay valued at less than its seeds' spread turned a gain into a loss in some rounds
        // (bench/README.md, "Tuning from the access log").
        let best_second = from + best_of(&outcomes[from..]);
        if outcomes.len() > from && clearly_beats(&outcomes[best_second], &outcomes[best_first]) {
            leader = best_second;
        }
    }
    bar.finish_and_clear();
    let gains = |i: usize| -> Vec<f64> {
        outcomes[0]
            .rounds
            .iter()
            .zip(&outcomes[i].rounds)
            .map(|(cur, b)| 100.0 * (cur.p99_ms - b.p99_ms) / cur.p99_ms.max(1e-9))
            .collect()
    };
    let gain_pct = Spread::of(gains(leader)).unwrap_or_default();
    // Two lower ends of the gain, each from one source of noise, and the promise is the lower:
    // the replay's own (its worst seed), and the log's luck. The log is the one real measurement
    // of the current settings, and one log's p99 can sit well above what those settings usually
    // give (bench/README.md, "The log's own luck in the floor"): measured from the low end of
    // what the log's p99 could have been (or the replay's, if lower), to the candidate's median
    // replay.
    let replayed_p99 = outcomes[0].spread(|r| r.p99_ms).median;
    let logged_p99_low = replay::logged_p99_low(&data, opts.replay.warmup)
        .unwrap_or(logged.p99_ms)
        .min(logged.p99_ms);
    let floor_base_p99 = replayed_p99.min(logged_p99_low);
    let against_log = 100.0 * (floor_base_p99 - outcomes[leader].spread(|r| r.p99_ms).median)
        / floor_base_p99.max(1e-9);
    let gain_floor_pct = gain_pct.min.min(against_log);
    // A change is recommended only when the model reproduces the log (the replay of the current
    // settings is near the log's own p99) and the change beats the current settings on every
    // seed: a gain within the replay's own noise is no reason to change. The floor is not a
    // gate: over simulated logs it would have kept back recommendations that were real gains
    // (bench/README.md, "The log's own luck in the floor").
    let fit_error = (replayed_p99 - logged.p99_ms).abs() / logged.p99_ms.max(1e-9);
    let fit_ok = fit_error <= MAX_FIT_ERROR;
    let best = if fit_ok && gain_pct.min > 0.0 {
        leader
    } else {
        0
    };
    let recommended = outcomes[best].candidate.config.clone();
    check_config(&recommended).context("the recommendation")?;
    let data_summary = describe_data(&data, &fits);
    let mut report = TuneReport {
        read,
        data_summary,
        logged,
        outcomes,
        best,
        leader,
        passed_over: (lowest_first != best_first).then_some((lowest_first, best_first)),
        fit_error,
        gain_pct,
        gain_floor_pct,
        logged_p99_low,
        floor_base_p99,
        recommended,
        markdown: String::new(),
    };
    report.markdown = markdown(&report, opts);
    Ok(report)
}

impl TuneReport {
    /// What a script needs of the report (bench/tune-cycle.sh; `ewma-lb-tune --summary`):
    /// whether a change is recommended, which, and the gains it is promised, as JSON.
    pub fn summary(&self) -> Value {
        let changed = self.best != 0;
        serde_json::json!({
            "recommended": self.recommended,
            "changed": changed,
            "candidate": self.outcomes[self.best].candidate.name,
            "logged_p99_ms": self.logged.p99_ms,
            "fit_error": self.fit_error,
            "gain_pct": changed.then_some(self.gain_pct),
            "gain_floor_pct": changed.then_some(self.gain_floor_pct),
            "floor_base_p99_ms": self.floor_base_p99,
        })
    }
}

/// Whether `a` beats `b` by more than its own spread: its worst seed's p99 is below `b`'s median.
fn clearly_beats(a: &Outcome, b: &Outcome) -> bool {
    a.spread(|r| r.p99_ms).max < b.spread(|r| r.p99_ms).median
}

/// Of the candidates (the current settings left out) that `outcomes[lowest]` does not clearly
/// beat, the one changing the fewest settings from `current`; on a tie, the lower median p99.
fn simplest_within_noise(outcomes: &[Outcome], lowest: usize, current: &Value) -> Result<usize> {
    if lowest == 0 {
        return Ok(0);
    }
    let current = effective(current)?;
    let mut best = (
        settings_changed(&current, &effective(&outcomes[lowest].candidate.config)?),
        lowest,
    );
    for (i, o) in outcomes.iter().enumerate().skip(1) {
        if i == lowest || clearly_beats(&outcomes[lowest], o) {
            continue;
        }
        let changed = settings_changed(&current, &effective(&o.candidate.config)?);
        let p99 = |i: usize| outcomes[i].spread(|r| r.p99_ms).median;
        if changed < best.0 || (changed == best.0 && p99(i) < p99(best.1)) {
            best = (changed, i);
        }
    }
    Ok(best.1)
}

/// A configuration with every default filled in, as the plugin reads it.
fn effective(config: &Value) -> Result<Value> {
    let text = serde_json::to_vec(config)?;
    let parsed = ewma_lb::config::PluginConfig::from_json(&text)
        .map_err(|e| anyhow!("the plugin refuses the configuration: {e}"))?;
    Ok(serde_json::to_value(parsed)?)
}

/// How many settings differ between two configurations: the leaf values that differ (an array
/// is one), and every leaf of a setting only one of them has.
fn settings_changed(a: &Value, b: &Value) -> usize {
    fn leaves(v: &Value) -> usize {
        match v {
            Value::Object(m) => m.values().map(leaves).sum(),
            _ => 1,
        }
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let in_x: usize = x
                .iter()
                .map(|(k, v)| {
                    y.get(k)
                        .map_or_else(|| leaves(v), |w| settings_changed(v, w))
                })
                .sum();
            let only_y: usize = y
                .iter()
                .filter(|(k, _)| !x.contains_key(*k))
                .map(|(_, v)| leaves(v))
                .sum();
            in_x + only_y
        }
        _ => usize::from(a != b),
    }
}

/// The best candidate: the lowest median p99 over the seeds; the current settings on a tie.
fn best_of(outcomes: &[Outcome]) -> usize {
    let mut best = 0;
    for (i, o) in outcomes.iter().enumerate() {
        if o.spread(|r| r.p99_ms).median < outcomes[best].spread(|r| r.p99_ms).median {
            best = i;
        }
    }
    best
}

/// The error for logs with no usable line: what was missing, and where.
pub fn no_usable_line(read: &log::ReadSummary) -> String {
    let mut s = format!("no usable line in {} lines", read.lines);
    if !read.missing.is_empty() {
        let fields: Vec<String> = read
            .missing
            .iter()
            .map(|(f, n)| format!("{f} (missing from {n})"))
            .collect();
        let _ = write!(
            s,
            "; the fields replay needs are {}: {}",
            log::REQUIRED.join(", "),
            fields.join(", ")
        );
    }
    if read.unparsable > 0 {
        let _ = write!(s, "; {} lines are not JSON objects", read.unparsable);
    }
    if read.no_upstream > 0 {
        let _ = write!(
            s,
            "; {} requests reached no upstream host",
            read.no_upstream
        );
    }
    if let Some((f, n, why)) = read.skipped.first() {
        let _ = write!(s, "; first skipped: {}:{n}: {why}", f.display());
    }
    s.push_str(
        ". The shipped envoy.yaml's access log has every field \
         (docs/observability.md, \"Access log\").",
    );
    s
}

fn describe_data(data: &Dataset, fits: &[model::HostFit]) -> String {
    let mut s = format!(
        "Cluster `{}`: {} requests over {:.1} s ({:.0} req/s), {} hosts; {} other lines left out (other clusters, \
         outside the window, health and management requests).\n\n",
        data.cluster,
        data.arrivals.len(),
        data.span_s,
        data.arrivals.len() as f64 / data.span_s.max(1e-9),
        data.hosts.len(),
        data.left_out
    );
    if !data.decisions.is_empty() {
        let d: Vec<String> = data
            .decisions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(s, "The plugin's decisions in the log: {}.\n", d.join(", "));
    }
    s.push_str("| host | requests | buckets measured | service ms (min-median-max over time) | servers (a queue beyond) | mean in flight | failures % |\n|---|---|---|---|---|---|---|\n");
    for (h, f) in data.hosts.iter().zip(fits) {
        let mut levels: Vec<f64> = f.model.level.iter().map(|l| l.exp()).collect();
        levels.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            levels
                .get(((levels.len() - 1) as f64 * q) as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let _ = writeln!(
            s,
            "| {h} | {} | {} of {} | {:.1}-{:.1}-{:.1} | {} | {:.2} | {:.2} |",
            f.samples,
            f.measured_buckets,
            f.model.level.len(),
            pick(0.0),
            pick(0.5),
            pick(1.0),
            f.servers
                .map_or("no limit seen".to_owned(), |k| k.to_string()),
            f.mean_in_flight,
            100.0 * f.failure_rate
        );
    }
    s
}

fn markdown(r: &TuneReport, opts: &TuneOptions) -> String {
    let mut md = String::from("# ewma-lb-tune\n\n");
    let _ = writeln!(
        md,
        "Read {} lines: {} usable, {} reached no upstream host, {} skipped ({} not JSON, {} missing a field, {} with a bad value).",
        r.read.lines,
        r.read.usable,
        r.read.no_upstream,
        r.read.skipped_count(),
        r.read.unparsable,
        r.read.missing_lines,
        r.read.bad_value
    );
    for (f, n, why) in &r.read.skipped {
        let _ = writeln!(md, "- skipped {}:{n}: {why}", f.display());
    }
    if r.read.skipped_count() as usize > r.read.skipped.len() {
        let _ = writeln!(
            md,
            "- ... and {} more",
            r.read.skipped_count() as usize - r.read.skipped.len()
        );
    }
    md.push('\n');
    md.push_str(&r.data_summary);
    let cur = &r.outcomes[0];
    let _ = writeln!(
        md,
        "\n**Model fit**: the log itself (after the first {:.0} s) p50 {:.1} ms, p99 {:.1} ms, errors {:.2} %; \
         the replay of the settings that produced it (`--config`) p50 {} ms, p99 {} ms, errors {} % \
         (median (min-max) over seeds {:?}). The further apart, the less the table below can be trusted.\n",
        opts.replay.warmup.as_secs_f64(),
        r.logged.p50_ms,
        r.logged.p99_ms,
        r.logged.errors_pct,
        cur.spread(|f| f.p50_ms).show(1),
        cur.spread(|f| f.p99_ms).show(1),
        cur.spread(|f| f.errors_pct).show(2),
        opts.replay.seeds
    );
    let _ = writeln!(
        md,
        "Replayed: {} worker VMs, route timeout {:?}, the first {:.0} s left out of the figures; each figure the median \
         (min-max) over the seeds. Flapping: the flapping index (pp, bench/README.md); share moved: how much of the \
         traffic the candidate sends to other hosts than the log shows.\n",
        opts.replay.workers,
        opts.replay.route_timeout,
        opts.replay.warmup.as_secs_f64()
    );
    md.push_str(&replay::table(&r.outcomes, &r.logged.shares_pct));
    md.push('\n');
    let best = &r.outcomes[r.best];
    if r.fit_error > MAX_FIT_ERROR {
        let _ = writeln!(
            md,
            "**No recommendation: the model does not reproduce this log.** The replay of the current settings has p99 {} ms \
             against the log's {:.1} ms, {:.0} % apart (at most {:.0} % for a recommendation): what makes this log's tail \
             (changes shorter than a bucket, requests of very different costs, other proxies) is not in the model. Keep \
             the current settings; a shorter `--bucket` may help.",
            cur.spread(|f| f.p99_ms).show(1),
            r.logged.p99_ms,
            100.0 * r.fit_error,
            100.0 * MAX_FIT_ERROR
        );
    } else if r.best == 0 {
        let leader = &r.outcomes[r.leader];
        match r.leader {
            0 => md.push_str("**Recommendation: keep the current settings**: no candidate had a lower median p99.\n"),
            _ => {
                let _ = writeln!(
                    md,
                    "**Recommendation: keep the current settings**: the best candidate, {} (#{}), gained {} % \
                     (median (min-max) over the seeds), not on every seed: within the replay's noise.",
                    leader.candidate.name,
                    r.leader,
                    r.gain_pct.show(1)
                );
            }
        }
    } else {
        let _ = writeln!(
            md,
            "**Recommendation: {}** (#{}), changing `{}`: p99 {} ms against {} ms now, a gain of {} % \
             (median (min-max) over the seeds, each seed's replay of both against the same arrivals).\n",
            best.candidate.name,
            r.best,
            best.candidate.change,
            best.spread(|f| f.p99_ms).show(1),
            cur.spread(|f| f.p99_ms).show(1),
            r.gain_pct.show(1),
        );
        let base = r.floor_base_p99;
        let base_is = if base < r.logged_p99_low {
            format!(
                "the replay of the current settings, below {:.1} ms, the low end of the log's own p99",
                r.logged_p99_low
            )
        } else {
            "the low end of the log's own p99 (its 5th percentile over block resamples of the log: one log's p99 \
             is partly luck)"
                .to_owned()
        };
        if r.gain_floor_pct > 0.0 {
            let _ = writeln!(
                md,
                "**The gain to expect: at least {:.1} %**: the lower of the gain's worst seed and the gain against \
                 {base:.1} ms, {base_is}. The best of many candidates also looks better on the seeds it was picked on \
                 than it will elsewhere.\n",
                r.gain_floor_pct
            );
        } else {
            let _ = writeln!(
                md,
                "**The gain to expect: none for certain**: against {base:.1} ms, {base_is}, the candidate's median \
                 replay gains {:.1} %. This log's p99 is too much luck to promise a gain; a longer log would tell. \
                 Apply it on one proxy first.\n",
                r.gain_floor_pct
            );
        }
    }
    if let Some((lowest, taken)) = r.passed_over {
        let (lowest, taken) = (&r.outcomes[lowest], &r.outcomes[taken]);
        let _ = writeln!(
            md,
            "Of the smoothers, {} had the lowest median p99 ({} ms), but its worst seed was not below the median of {} \
             ({} ms), which changes fewer settings: of candidates the replay cannot tell apart, the smaller change is taken.\n",
            lowest.candidate.name,
            lowest.spread(|f| f.p99_ms).show(1),
            taken.candidate.name,
            taken.spread(|f| f.p99_ms).show(1),
        );
    }
    let _ = writeln!(md, "{CAVEAT}");
    md
}

/// Draws p50, p99 and p99.9 of every candidate (x: its row number in the table, 0 the current
/// settings), each the median over the seeds, and the log's own p99, into `dir` (svg and png).
pub fn plot(report: &TuneReport, dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let line = |label: &str, f: fn(&RoundFigures) -> f64| crate::plot::Line {
        label: label.to_owned(),
        points: report
            .outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| (i as f64, o.spread(f).median))
            .collect(),
    };
    let n = report.outcomes.len().saturating_sub(1) as f64;
    let lines = [
        line("p50", |r| r.p50_ms),
        line("p99", |r| r.p99_ms),
        line("p99.9", |r| r.p999_ms),
        crate::plot::Line {
            label: "the log's p99".into(),
            points: vec![(0.0, report.logged.p99_ms), (n, report.logged.p99_ms)],
        },
    ];
    crate::plot::lines(
        dir,
        "tune-percentiles",
        "ewma-lb-tune: replayed latency per candidate (median over seeds)",
        ("candidate (row of the table; 0 = current settings)", "ms"),
        false,
        &lines,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outcome(p99s: &[f64]) -> Outcome {
        Outcome {
            candidate: Candidate {
                name: String::new(),
                change: Value::Null,
                config: Value::Null,
            },
            rounds: p99s
                .iter()
                .map(|p99_ms| RoundFigures {
                    p99_ms: *p99_ms,
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn settings_changed_counts_the_leaves_that_differ() {
        let current =
            effective(&json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 250}})).unwrap();
        let count = |c: Value| settings_changed(&current, &effective(&c).unwrap());
        assert_eq!(
            count(json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 250}})),
            0
        );
        assert_eq!(
            count(json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 5000}})),
            1
        );
        // Another algorithm: its name, its time constant, and the peak's sample count it drops.
        assert_eq!(
            count(json!({"smoothing": {"algorithm": "decay_ewma", "tau_ms": 10000}})),
            3
        );
        assert_eq!(
            count(
                json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 5000}, "refresh_interval_ms": 100})
            ),
            2
        );
        // Defaults written out are no change.
        let defaults = effective(&json!({})).unwrap();
        assert_eq!(
            settings_changed(&defaults, &effective(&defaults).unwrap()),
            0
        );
    }

    fn named(config: Value, p99s: &[f64]) -> Outcome {
        let mut o = outcome(p99s);
        o.candidate.config = config;
        o
    }

    #[test]
    fn of_smoothers_within_the_noise_the_smaller_change_is_taken() {
        let current = json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 250}});
        let outcomes = vec![
            named(current.clone(), &[250.0, 260.0, 270.0]),
            named(
                json!({"smoothing": {"algorithm": "peak_ewma", "tau_ms": 5000}}),
                &[200.0, 210.0, 240.0],
            ),
            // The lowest median, but its worst seed is not below the other's median.
            named(
                json!({"smoothing": {"algorithm": "decay_ewma", "tau_ms": 10000}}),
                &[195.0, 205.0, 215.0],
            ),
        ];
        assert_eq!(best_of(&outcomes), 2);
        assert_eq!(simplest_within_noise(&outcomes, 2, &current).unwrap(), 1);
        // Clearly lower on every seed: the larger change is taken.
        let mut clear = outcomes.clone();
        clear[2] = named(clear[2].candidate.config.clone(), &[180.0, 185.0, 190.0]);
        assert_eq!(simplest_within_noise(&clear, 2, &current).unwrap(), 2);
        // Nothing beats the current settings: they stay.
        assert_eq!(simplest_within_noise(&outcomes, 0, &current).unwrap(), 0);
    }

    #[test]
    fn a_further_change_must_beat_by_more_than_its_own_spread() {
        // The second log of bench/README.md's step 1: the smoother alone 198.7, 201.2, 237.4 ms;
        // with the refresh interval as well 195.1, 195.8, 202.2. Lower on every seed, but its
        // worst seed is not below the smoother's median: the replay cannot tell them apart.
        let smoother = outcome(&[198.7, 201.2, 237.4]);
        assert!(!clearly_beats(&outcome(&[195.1, 195.8, 202.2]), &smoother));
        assert!(clearly_beats(&outcome(&[180.0, 185.0, 200.0]), &smoother));
    }
}
