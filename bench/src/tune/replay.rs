//! The replay: the log's arrivals through the simulator (the plugin's own core, virtual time) over
//! each host's fitted model, once per candidate setting and seed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use harness::latency::Latency;
use serde_json::{json, Value};

use super::log::Entry;
use super::model::{self, HostFit, Sample};
use crate::figures::{RoundFigures, Spread};
use crate::policy::{merge, Policy};
use crate::sim::{self, Arrivals, HostSpec, SimSpec};

/// The requests of one cluster within the replayed window, ready to fit and replay.
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    pub cluster: String,
    /// The window's start, ms since the epoch.
    pub start_ms: f64,
    pub span_s: f64,
    pub hosts: Vec<String>,
    /// Per host, sorted by start.
    pub samples: Vec<Vec<Sample>>,
    /// Every arrival, sorted (ns since the window's start).
    pub arrivals: Vec<u64>,
    /// Requests of other clusters, outside the window, or never steered (health, management).
    pub left_out: u64,
    /// The plugin's decisions over the window, by reason (`steered`, `probe`, `fallback:...`).
    pub decisions: BTreeMap<String, u64>,
}

/// What of the log to replay.
#[derive(Clone, Debug)]
pub struct Window {
    /// The cluster; `None`: the one with the most requests.
    pub cluster: Option<String>,
    /// Seconds after the log's first request.
    pub from_s: f64,
    /// Seconds replayed from there.
    pub duration_s: f64,
}

/// One request as the collector keeps it: start (epoch ms), host, latency and duration (ms),
/// failed.
type Row = (f64, u32, f32, f32, bool);

/// Keeps the entries of one cluster in one window, compactly: what a day of a busy proxy would
/// not fit as lines fits as these (24 bytes a request) for the window replayed; fitting adds
/// about 40 more a request.
pub struct Collector {
    window: Window,
    first_ms: Option<f64>,
    by_cluster: BTreeMap<String, Vec<Row>>,
    hosts: BTreeMap<String, u32>,
    host_names: Vec<String>,
    decisions: BTreeMap<String, BTreeMap<String, u64>>,
    left_out: u64,
}

impl Collector {
    pub fn new(window: Window) -> Collector {
        Collector {
            window,
            first_ms: None,
            by_cluster: BTreeMap::new(),
            hosts: BTreeMap::new(),
            host_names: Vec::new(),
            decisions: BTreeMap::new(),
            left_out: 0,
        }
    }

    pub fn add(&mut self, e: Entry) {
        // Logs are written as requests end, so start times arrive nearly but not exactly in
        // order: the window counts from the first line's start.
        let first = *self.first_ms.get_or_insert(e.start_ms);
        let t_s = (e.start_ms - first) / 1000.0;
        let in_window =
            t_s >= self.window.from_s && t_s < self.window.from_s + self.window.duration_s;
        let cluster = e.cluster.clone().unwrap_or_else(|| "-".into());
        let wanted = self.window.cluster.as_ref().is_none_or(|c| *c == cluster);
        if !in_window || !wanted || e.never_steered() {
            self.left_out += 1;
            return;
        }
        if let Some(d) = &e.decision {
            let reason = d.split(' ').next().unwrap_or_default().to_owned();
            *self
                .decisions
                .entry(cluster.clone())
                .or_default()
                .entry(reason)
                .or_default() += 1;
        }
        let next = self.host_names.len() as u32;
        let host = *self.hosts.entry(e.host.clone()).or_insert(next);
        if host == next {
            self.host_names.push(e.host.clone());
        }
        self.by_cluster.entry(cluster).or_default().push((
            e.start_ms,
            host,
            e.latency_ms() as f32,
            e.duration_ms.max(e.latency_ms()) as f32,
            e.failed() && !e.timed_out(),
        ));
    }

    /// The window's requests of the chosen cluster; an error when there are none.
    pub fn finish(mut self) -> Result<Dataset> {
        let cluster = match &self.window.cluster {
            Some(c) => c.clone(),
            None => self
                .by_cluster
                .iter()
                .max_by_key(|(_, v)| v.len())
                .map(|(c, _)| c.clone())
                .context("no request with an upstream host in the window")?,
        };
        let Some(mut rows) = self.by_cluster.remove(&cluster) else {
            bail!("no request of cluster {cluster:?} in the window");
        };
        let others: u64 = self.by_cluster.values().map(|v| v.len() as u64).sum();
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let start_ms = rows.first().map_or(0.0, |r| r.0);
        let last_ms = rows.last().map_or(0.0, |r| r.0);
        // Hosts of this cluster only, renumbered.
        let mut index: BTreeMap<u32, usize> = BTreeMap::new();
        let mut hosts = Vec::new();
        for r in &rows {
            index.entry(r.1).or_insert_with(|| {
                hosts.push(self.host_names[r.1 as usize].clone());
                hosts.len() - 1
            });
        }
        let mut samples = vec![Vec::new(); hosts.len()];
        let mut arrivals = Vec::with_capacity(rows.len());
        for (t, h, latency, duration, failed) in rows {
            let start_ns = ((t - start_ms) * 1e6) as u64;
            arrivals.push(start_ns);
            samples[index[&h]].push(Sample {
                start_ns,
                end_ns: start_ns + (f64::from(duration) * 1e6) as u64,
                latency_ms: f64::from(latency),
                failed,
            });
        }
        Ok(Dataset {
            decisions: self.decisions.remove(&cluster).unwrap_or_default(),
            cluster,
            start_ms,
            span_s: (last_ms - start_ms) / 1000.0,
            hosts,
            samples,
            arrivals,
            left_out: self.left_out + others,
        })
    }
}

/// One setting to try: the whole plugin configuration it runs.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub name: String,
    /// What it changes, for the table.
    pub change: Value,
    pub config: Value,
}

/// The candidates: the current settings first, then the smoother and its time constant, with
/// and without peak handling; then, around the best of those, one other setting at a time.
/// `best_smoothing` is `None` for the first stage.
pub fn candidates(current: &Value, best: Option<&Candidate>, failures: bool) -> Vec<Candidate> {
    let with = |base: &Value, key: &str, v: Value| {
        let mut c = base.clone();
        if let Value::Object(m) = &mut c {
            m.insert(key.to_owned(), v);
        }
        c
    };
    let Some(best) = best else {
        let mut out = vec![Candidate {
            name: "current".into(),
            change: json!({}),
            config: current.clone(),
        }];
        let mut smoothing = |name: String, s: Value| {
            out.push(Candidate {
                name,
                change: json!({ "smoothing": s.clone() }),
                config: with(current, "smoothing", s),
            });
        };
        for tau in [250, 500, 1000, 2000, 5000, 10000] {
            smoothing(
                format!("peak_ewma tau {tau} ms"),
                json!({"algorithm": "peak_ewma", "tau_ms": tau}),
            );
        }
        smoothing(
            "peak_ewma tau 1000 ms, peak_samples 1".into(),
            json!({"algorithm": "peak_ewma", "tau_ms": 1000, "peak_samples": 1}),
        );
        for tau in [250, 1000, 5000, 10000] {
            smoothing(
                format!("decay_ewma tau {tau} ms (no peak)"),
                json!({"algorithm": "decay_ewma", "tau_ms": tau}),
            );
        }
        return out;
    };
    let mut out = Vec::new();
    let mut one = |key: &str, label: &str, values: &[Value]| {
        for v in values {
            let mut change = best.change.clone();
            let mut patch = serde_json::Map::new();
            let mut nested = v.clone();
            // `weights.exponent` and the like: a nested object.
            let parts: Vec<&str> = key.split('.').collect();
            for p in parts.iter().skip(1).rev() {
                nested = json!({ *p: nested });
            }
            patch.insert(parts[0].to_owned(), nested);
            let patch = Value::Object(patch);
            merge(&mut change, &patch);
            let mut config = best.config.clone();
            merge(&mut config, &patch);
            out.push(Candidate {
                name: format!("{} + {label} {v}", best.name),
                change,
                config,
            });
        }
    };
    one("refresh_interval_ms", "refresh", &[json!(100), json!(1000)]);
    one(
        "probe_interval_ms",
        "probe interval",
        &[json!(500), json!(3000)],
    );
    one("persistence_ms", "persistence", &[json!(0), json!(3000)]);
    one("weights.exponent", "exponent", &[json!(1.5), json!(4.0)]);
    if failures {
        one(
            "failure_penalty_ms",
            "failure penalty",
            &[json!(250), json!(3000)],
        );
    }
    out
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub workers: usize,
    pub route_timeout: Duration,
    pub warmup: Duration,
    pub seeds: Vec<u64>,
    pub threads: usize,
}

/// One candidate's figures, per seed.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub candidate: Candidate,
    pub rounds: Vec<RoundFigures>,
}

impl Outcome {
    pub fn spread(&self, f: impl Fn(&RoundFigures) -> f64) -> Spread {
        Spread::of(self.rounds.iter().map(f)).unwrap_or_default()
    }
}

/// The simulation of `data` over `fits`: one proxy with `workers` worker VMs, the log's
/// arrivals, each host its fitted model.
pub fn spec(data: &Dataset, fits: &[HostFit], opts: &ReplayOptions) -> SimSpec {
    let hosts = data
        .hosts
        .iter()
        .zip(fits)
        .map(|(name, fit)| HostSpec {
            model: Some(Arc::new(fit.model.clone())),
            capacity: fit.servers,
            ..HostSpec::new(name.clone(), Latency::Fixed(1))
        })
        .collect();
    SimSpec {
        name: format!("replay of {}", data.cluster),
        description: String::new(),
        proxies: 1,
        workers: opts.workers.max(1),
        hosts,
        rate: data.arrivals.len() as f64 / data.span_s.max(1.0),
        arrivals: Arrivals::Trace(data.arrivals.clone().into()),
        costs: Vec::new(),
        duration: Duration::from_secs_f64(data.span_s + 0.001),
        warmup: opts.warmup,
        route_timeout: opts.route_timeout,
        policies: Vec::new(),
        plugin_config: json!({}),
        static_endpoints: false,
        seed: 1,
    }
}

/// The figures of the plugin with configuration `config` replayed over `spec`, one per seed.
pub fn replay(
    spec: &SimSpec,
    name: &str,
    config: &Value,
    opts: &ReplayOptions,
) -> Result<Vec<RoundFigures>> {
    let policy = Policy::variant(name, sim_config(config))
        .with_context(|| format!("{name}: the configuration is not a JSON object"))?;
    let spec = SimSpec {
        policies: vec![policy],
        ..spec.clone()
    };
    let results = sim::run_all(&spec, &opts.seeds, opts.threads, false)?;
    Ok(results
        .into_iter()
        .next()
        .map(|r| r.figures.rounds)
        .unwrap_or_default())
}

/// A configuration as the simulator runs it: its one cluster is `backend`, whatever the proxy
/// names it, so the fields naming clusters go (they decide which clusters are steered, not how).
pub fn sim_config(config: &Value) -> Value {
    let mut c = config.clone();
    if let Value::Object(m) = &mut c {
        m.remove("steered_clusters");
        m.remove("clusters");
    }
    c
}

/// The log's own figures over the replay's measured window (after the warm-up), as the
/// simulator computes a run's: p50, p99, p99.9 of the latency, errors, shares.
pub fn logged(data: &Dataset, warmup: Duration) -> RoundFigures {
    let from_ns = u64::try_from(warmup.as_nanos()).unwrap_or(0);
    let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .unwrap_or_else(|_| hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!()));
    let (mut count, mut errors) = (0u64, 0u64);
    let mut shares = BTreeMap::new();
    for (host, samples) in data.hosts.iter().zip(&data.samples) {
        let mut n = 0u64;
        for s in samples.iter().filter(|s| s.start_ns >= from_ns) {
            let _ = h.record(((s.latency_ms * 1000.0) as u64).clamp(1, 3_600_000_000));
            n += 1;
            errors += u64::from(s.failed);
        }
        count += n;
        shares.insert(host.clone(), n as f64);
    }
    for v in shares.values_mut() {
        *v = 100.0 * *v / count.max(1) as f64;
    }
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    RoundFigures {
        count,
        p50_ms: ms(0.5),
        p95_ms: ms(0.95),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        errors_pct: 100.0 * errors as f64 / count.max(1) as f64,
        shares_pct: shares,
        ..RoundFigures::default()
    }
}

/// How low the log's own p99 could have come out under the same settings: the 5th percentile of
/// its p99 over 200 block bootstrap resamples (the window after `warmup` cut into 8 consecutive
/// blocks, 8 drawn with replacement; a block keeps the hosts' changes within it together). A
/// gain measured from the log's one p99 inherits that p99's luck (bench/README.md, "The log's
/// own luck in the floor"). `None` for fewer than 100 requests.
pub fn logged_p99_low(data: &Dataset, warmup: Duration) -> Option<f64> {
    const BLOCKS: usize = 8;
    const RESAMPLES: usize = 200;
    let from_ns = u64::try_from(warmup.as_nanos()).unwrap_or(0);
    let end_ns = (data.span_s * 1e9) as u64;
    let block_ns = (end_ns.saturating_sub(from_ns) / BLOCKS as u64).max(1);
    let mut blocks: Vec<Vec<f64>> = vec![Vec::new(); BLOCKS];
    for s in data
        .samples
        .iter()
        .flatten()
        .filter(|s| s.start_ns >= from_ns)
    {
        let i = usize::try_from((s.start_ns - from_ns) / block_ns).unwrap_or(BLOCKS);
        blocks[i.min(BLOCKS - 1)].push(s.latency_ms);
    }
    if blocks.iter().map(Vec::len).sum::<usize>() < 100 {
        return None;
    }
    let mut rng = fastrand::Rng::with_seed(1);
    let mut drawn = Vec::new();
    let mut p99s: Vec<f64> = (0..RESAMPLES)
        .filter_map(|_| {
            drawn.clear();
            for _ in 0..BLOCKS {
                drawn.extend_from_slice(&blocks[rng.usize(..BLOCKS)]);
            }
            if drawn.is_empty() {
                return None;
            }
            // The rank `logged`'s histogram reads p99 at: ceil(0.99 n), from 1.
            let rank = ((drawn.len() as f64 * 0.99).ceil() as usize).max(1) - 1;
            let (_, p99, _) = drawn.select_nth_unstable_by(rank, f64::total_cmp);
            Some(*p99)
        })
        .collect();
    p99s.sort_by(f64::total_cmp);
    p99s.get(p99s.len() / 20).copied()
}

/// Half the sum of the share differences, in %: how much of the traffic goes elsewhere than in
/// `base`.
pub fn share_moved(base: &BTreeMap<String, f64>, other: &BTreeMap<String, f64>) -> f64 {
    let keys: std::collections::BTreeSet<&String> = base.keys().chain(other.keys()).collect();
    keys.into_iter()
        .map(|k| (base.get(k).unwrap_or(&0.0) - other.get(k).unwrap_or(&0.0)).abs())
        .sum::<f64>()
        / 2.0
}

/// Fits every host of `data` over buckets of `bucket_s`.
pub fn fit_all(data: &Dataset, bucket_s: f64) -> Vec<HostFit> {
    let buckets = (data.span_s / bucket_s).ceil() as usize + 1;
    data.samples
        .iter()
        .map(|s| model::fit(s, bucket_s, buckets))
        .collect()
}

/// The table of outcomes: the current settings first.
pub fn table(outcomes: &[Outcome], log_shares: &BTreeMap<String, f64>) -> String {
    let mut t = String::from(
        "| # | candidate | p50 ms | p99 ms | p99.9 ms | errors % | flapping pp | share moved % |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (i, o) in outcomes.iter().enumerate() {
        let moved: Vec<f64> = o
            .rounds
            .iter()
            .filter(|r| !r.shares_pct.is_empty())
            .map(|r| share_moved(log_shares, &r.shares_pct))
            .collect();
        let moved = Spread::of(moved).map_or("-".into(), |s| s.show(1));
        let _ = writeln!(
            t,
            "| {i} | {} | {} | {} | {} | {} | {} | {moved} |",
            o.candidate.name,
            o.spread(|r| r.p50_ms).show(1),
            o.spread(|r| r.p99_ms).show(1),
            o.spread(|r| r.p999_ms).show(1),
            o.spread(|r| r.errors_pct).show(2),
            o.spread(|r| r.flap_pp).show(1),
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 s of one host, a request every 10 ms, latency given by the request's start.
    fn dataset(latency_ms: impl Fn(u64) -> f64) -> Dataset {
        let samples = (0..800u64)
            .map(|i| {
                let start_ns = i * 10_000_000;
                Sample {
                    start_ns,
                    end_ns: start_ns + 1,
                    latency_ms: latency_ms(i),
                    failed: false,
                }
            })
            .collect();
        Dataset {
            cluster: "c".into(),
            start_ms: 0.0,
            span_s: 8.0,
            hosts: vec!["h".into()],
            samples: vec![samples],
            arrivals: Vec::new(),
            left_out: 0,
            decisions: BTreeMap::new(),
        }
    }

    #[test]
    fn a_p99_made_by_one_stretch_of_the_log_has_a_low_end_without_it() {
        // The last second slow: the log's p99 is 100 ms, but a run of the same settings that
        // missed that stretch would have had 10.
        let data = dataset(|i| if i >= 700 { 100.0 } else { 10.0 });
        let p99 = logged(&data, Duration::ZERO).p99_ms;
        assert!((p99 - 100.0).abs() < 0.1, "{p99}");
        assert_eq!(logged_p99_low(&data, Duration::ZERO), Some(10.0));
    }

    #[test]
    fn a_p99_spread_over_the_whole_log_stays_near_it() {
        // Every block alike (latencies 1-100 ms in every second): nothing is luck.
        let data = dataset(|i| (i % 100 + 1) as f64);
        let low = logged_p99_low(&data, Duration::ZERO).unwrap();
        assert!((98.0..=99.0).contains(&low), "{low}");
        assert_eq!(
            logged_p99_low(&dataset(|_| 1.0), Duration::from_secs(8)),
            None
        );
    }
}
