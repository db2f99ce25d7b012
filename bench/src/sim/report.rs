//! What a simulation reports: the benchmark's figures (so a simulated scenario reads like its
//! real-Envoy table), fleet figures (utilisation spread, flapping relative to a fair share, how
//! far above fair the busiest hosts get), tables and plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use harness::summary::SecondShares;
use serde::{Deserialize, Serialize};

use super::engine::RunOutput;
use super::SimSpec;
use crate::figures::{self, PolicyFigures, RoundFigures, Spread};
use crate::metrics::{flapping, share_figures};
use crate::plot;
use crate::scenario::slowdown_of;

/// Figures of one simulated run that only a fleet has.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetFigures {
    /// Busy servers over capacity, per host over the measured window: their mean, coefficient
    /// of variation (standard deviation / mean) and maximum, in %.
    pub util_mean_pct: f64,
    pub util_cv_pct: f64,
    pub util_max_pct: f64,
    /// Flapping index over every host relative to a fair share: mean over consecutive seconds and
    /// hosts of |share(t) − share(t−1)| / (1/M), in %; and the same for a static random split.
    pub flap_fair_pct: f64,
    pub flap_noise_fair_pct: f64,
    /// 99th percentile over (host, second) of a host's share of the second's requests, as a
    /// multiple of a fair share: how far above fair the busiest hosts get (herding).
    pub peak_share_x_fair: f64,
    /// The least share of the measured window any host got, as a multiple of a fair share, among
    /// the hosts present from its start: whether a balancer starves one (issue 16's cold start:
    /// every host at least half its fair share).
    #[serde(default)]
    pub least_share_x_fair: f64,
    /// Share of requests the plugin steered (the rest went to its fallback).
    pub steered_pct: Option<f64>,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// Share of requests per host group, in % (groups in the order declared).
    pub group_shares_pct: BTreeMap<String, f64>,
}

/// A policy's simulated runs, one per seed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SimResult {
    pub policy: String,
    pub seeds: Vec<u64>,
    /// The benchmark's figures, one "round" per seed.
    pub figures: PolicyFigures,
    pub fleet: Vec<FleetFigures>,
    /// Per-second shares of each host group, of the first seed's run (for the plots).
    #[serde(skip_deserializing)]
    pub group_seconds: Vec<SecondShares>,
    /// Per-second shares of each host, first seed, only for small clusters (plots).
    #[serde(skip_deserializing)]
    pub host_seconds: Vec<SecondShares>,
    /// Utilisation of every host, sorted, first seed (plots), in %.
    pub host_util_pct: Vec<f64>,
    /// Latency quantiles of the first seed for the CDF plot, ms.
    #[serde(skip)]
    pub quantiles_ms: Vec<f64>,
}

impl SimResult {
    /// A fleet figure's median and spread over the seeds.
    pub fn spread(&self, f: impl Fn(&FleetFigures) -> Option<f64>) -> Option<Spread> {
        Spread::of(self.fleet.iter().filter_map(f))
    }
}

/// What one run contributes to a [`SimResult`].
pub struct RunSummary {
    pub figures: RoundFigures,
    pub fleet: FleetFigures,
    pub host_seconds: Vec<SecondShares>,
    pub group_seconds: Vec<SecondShares>,
    pub host_util_pct: Vec<f64>,
    pub quantiles_ms: Vec<f64>,
}

impl RunSummary {
    pub fn of(spec: &SimSpec, out: &RunOutput) -> RunSummary {
        let (figures, fleet, host_seconds, group_seconds, host_util_pct) = summarise(spec, out);
        RunSummary {
            figures,
            fleet,
            host_seconds,
            group_seconds,
            host_util_pct,
            quantiles_ms: quantiles(out),
        }
    }
}

/// Host clusters up to this size get per-host shares and plots; bigger ones per group.
pub const PER_HOST_LIMIT: usize = 16;

/// The figures of one run.
pub fn summarise(
    spec: &SimSpec,
    out: &RunOutput,
) -> (
    RoundFigures,
    FleetFigures,
    Vec<SecondShares>,
    Vec<SecondShares>,
    Vec<f64>,
) {
    let names: Vec<String> = spec.hosts.iter().map(|h| h.name.clone()).collect();
    let h = &out.latency_us;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let count = out.count;
    let from = spec.warmup.as_secs() as usize;
    let measured = out.per_second.get(from..).unwrap_or_default();
    let total: u64 = measured.iter().flatten().map(|&n| u64::from(n)).sum();
    let per_host: Vec<u64> = (0..names.len())
        .map(|i| measured.iter().map(|row| u64::from(row[i])).sum())
        .collect();
    let mut f = RoundFigures {
        count,
        avg_ms: if count > 0 {
            out.sum_latency_us as f64 / count as f64 / 1000.0
        } else {
            0.0
        },
        p50_ms: ms(0.5),
        p95_ms: ms(0.95),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        errors_pct: if count > 0 {
            100.0 * out.errors as f64 / count as f64
        } else {
            0.0
        },
        dropped: 0,
        ..RoundFigures::default()
    };
    let host_seconds = seconds_of(&out.per_second, |i| names[i].clone());
    if names.len() <= PER_HOST_LIMIT {
        f.shares_pct = names
            .iter()
            .zip(&per_host)
            .map(|(n, c)| (n.clone(), 100.0 * *c as f64 / total.max(1) as f64))
            .collect();
        let steady: Vec<String> = spec
            .hosts
            .iter()
            .filter(|h| h.phases.is_empty() && h.failing.is_empty() && h.fail_rate == 0.0)
            .map(|h| h.name.clone())
            .collect();
        let slowdown = slowdown_of(
            spec.hosts
                .iter()
                .map(|h| (h.name.as_str(), h.phases.as_slice())),
        );
        share_figures(
            &mut f,
            &host_seconds,
            from,
            &names,
            &steady,
            slowdown.as_ref(),
        );
    } else {
        let flap = flapping(&host_seconds, from, &names);
        f.flap_pp = flap.index_pp;
        f.flap_noise_pp = flap.noise_pp;
    }
    let m = names.len() as f64;
    let groups: Vec<String> = {
        let mut g: Vec<String> = Vec::new();
        for h in &spec.hosts {
            if !g.contains(&h.group) {
                g.push(h.group.clone());
            }
        }
        g
    };
    let group_seconds = {
        let rows: Vec<Vec<u32>> = out
            .per_second
            .iter()
            .map(|row| {
                groups
                    .iter()
                    .map(|g| {
                        spec.hosts
                            .iter()
                            .zip(row)
                            .filter(|(h, _)| &h.group == g)
                            .map(|(_, n)| *n)
                            .sum()
                    })
                    .collect()
            })
            .collect();
        seconds_of(&rows, |i| groups[i].clone())
    };
    let measured_end_s = spec.duration.as_secs_f64();
    let utils: Vec<f64> = spec
        .hosts
        .iter()
        .zip(&out.busy_ns)
        .map(|(h, busy)| {
            let window_s = (measured_end_s - spec.warmup.as_secs_f64().max(h.join_s)).max(1e-9);
            let servers = h.capacity.map_or(1.0, |k| k as f64);
            100.0 * busy / 1e9 / (servers * window_s)
        })
        .collect();
    let util = Spread::of(utils.iter().copied()).unwrap_or_default();
    let mean = utils.iter().sum::<f64>() / m.max(1.0);
    let sd = (utils.iter().map(|u| (u - mean).powi(2)).sum::<f64>() / m.max(1.0)).sqrt();
    let mut peaks: Vec<f64> = host_seconds
        .iter()
        .skip(from)
        .filter(|s| s.count > 0)
        .flat_map(|s| {
            names
                .iter()
                .map(move |n| s.shares.get(n).copied().unwrap_or(0.0) * m)
        })
        .collect();
    peaks.sort_by(f64::total_cmp);
    let p99 = peaks
        .get(((peaks.len() as f64 * 0.99) as usize).min(peaks.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let from_start: Vec<u64> = spec
        .hosts
        .iter()
        .zip(&per_host)
        .filter(|(h, _)| h.join_s <= spec.warmup.as_secs_f64())
        .map(|(_, c)| *c)
        .collect();
    let fair = from_start.iter().sum::<u64>() as f64 / from_start.len().max(1) as f64;
    let least = from_start.iter().min().map_or(0.0, |c| match fair > 0.0 {
        true => *c as f64 / fair,
        false => 0.0,
    });
    let plugin = out.steered + out.fallback > 0;
    let fleet = FleetFigures {
        util_mean_pct: mean,
        util_cv_pct: if mean > 0.0 { 100.0 * sd / mean } else { 0.0 },
        util_max_pct: util.max,
        flap_fair_pct: f.flap_pp * m,
        flap_noise_fair_pct: f.flap_noise_pp * m,
        peak_share_x_fair: p99,
        least_share_x_fair: least,
        steered_pct: plugin
            .then(|| 100.0 * out.steered as f64 / (out.steered + out.fallback) as f64),
        wall_s: out.wall_s,
        group_shares_pct: groups
            .iter()
            .map(|g| {
                let n: u64 = spec
                    .hosts
                    .iter()
                    .zip(&per_host)
                    .filter(|(h, _)| &h.group == g)
                    .map(|(_, c)| *c)
                    .sum();
                (g.clone(), 100.0 * n as f64 / total.max(1) as f64)
            })
            .collect(),
    };
    let mut sorted = utils;
    sorted.sort_by(f64::total_cmp);
    (
        f,
        fleet,
        if names.len() <= PER_HOST_LIMIT {
            host_seconds
        } else {
            Vec::new()
        },
        group_seconds,
        sorted,
    )
}

/// Per-second shares from per-second counts per column.
fn seconds_of(rows: &[Vec<u32>], name: impl Fn(usize) -> String) -> Vec<SecondShares> {
    rows.iter()
        .enumerate()
        .map(|(t, row)| {
            let count: u64 = row.iter().map(|&n| u64::from(n)).sum();
            let shares = row
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (name(i), f64::from(*n) / count.max(1) as f64))
                .collect();
            SecondShares {
                second: t as u64,
                count,
                shares,
            }
        })
        .collect()
}

/// Latency quantiles for a CDF plot, ms.
pub fn quantiles(out: &RunOutput) -> Vec<f64> {
    const POINTS: usize = 4000;
    if out.count == 0 {
        return Vec::new();
    }
    (0..POINTS)
        .map(|i| {
            out.latency_us
                .value_at_quantile((i as f64 + 0.5) / POINTS as f64) as f64
                / 1000.0
        })
        .collect()
}

/// The fleet table: one row per policy, each figure's median (min-max) over the seeds.
pub fn fleet_table(results: &[SimResult]) -> String {
    let mut t = String::from(
        "| policy | p50 ms | p95 ms | p99 ms | p99.9 ms | errors % | utilisation mean % | utilisation spread (CV %) | hottest host % | flap, % of fair | its noise floor | busiest hosts' share (p99, × fair) | least-served host (× fair) | steered % |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let b = |f: &dyn Fn(&RoundFigures) -> Option<f64>, d: usize| {
            r.figures.spread(f).map_or("-".into(), |s| s.show(d))
        };
        let fl = |f: &dyn Fn(&FleetFigures) -> Option<f64>, d: usize| {
            r.spread(f).map_or("-".into(), |s| s.show(d))
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.policy,
            b(&|x| Some(x.p50_ms), 1),
            b(&|x| Some(x.p95_ms), 1),
            b(&|x| Some(x.p99_ms), 1),
            b(&|x| Some(x.p999_ms), 1),
            b(&|x| Some(x.errors_pct), 2),
            fl(&|x| Some(x.util_mean_pct), 1),
            fl(&|x| Some(x.util_cv_pct), 1),
            fl(&|x| Some(x.util_max_pct), 1),
            fl(&|x| Some(x.flap_fair_pct), 1),
            fl(&|x| Some(x.flap_noise_fair_pct), 1),
            fl(&|x| Some(x.peak_share_x_fair), 2),
            fl(&|x| Some(x.least_share_x_fair), 2),
            fl(&|x| x.steered_pct, 1),
        );
    }
    t
}

/// A host group of a simulation and its share of the capacity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub hosts: usize,
    pub capacity_pct: f64,
}

/// The host groups of `spec`, in the order declared.
pub fn groups(spec: &SimSpec) -> Vec<Group> {
    let mut groups: Vec<(String, usize, f64)> = Vec::new();
    for h in &spec.hosts {
        let cap = h.capacity_per_s().unwrap_or(0.0);
        match groups.iter_mut().find(|(g, _, _)| *g == h.group) {
            Some(g) => {
                g.1 += 1;
                g.2 += cap;
            }
            None => groups.push((h.group.clone(), 1, cap)),
        }
    }
    let total: f64 = groups.iter().map(|g| g.2).sum();
    groups
        .into_iter()
        .map(|(name, hosts, cap)| Group {
            name,
            hosts,
            capacity_pct: 100.0 * cap / total.max(1e-9),
        })
        .collect()
}

/// Share of traffic per host group against its share of the capacity.
pub fn group_table(groups: &[Group], results: &[SimResult]) -> String {
    let mut t = String::from("| policy |");
    for g in groups {
        let _ = write!(
            t,
            " {} ({} hosts, {:.1} % of capacity) |",
            g.name, g.hosts, g.capacity_pct
        );
    }
    let _ = writeln!(t, "\n|{}", "---|".repeat(groups.len() + 1));
    for r in results {
        let _ = write!(t, "| {} |", r.policy);
        for g in groups {
            let s = r
                .spread(|f| f.group_shares_pct.get(&g.name).copied())
                .map_or("-".into(), |s| s.show(1));
            let _ = write!(t, " {s} % |");
        }
        t.push('\n');
    }
    t
}

/// The benchmark's table of a simulated scenario (per-host shares, flapping, recovery).
pub fn bench_table(hosts: &[String], results: &[SimResult]) -> String {
    let figs: Vec<PolicyFigures> = results.iter().map(|r| r.figures.clone()).collect();
    figures::table(&figs, hosts)
}

/// Writes the plots of a simulation into `dir`; returns the files.
pub fn plots(dir: &Path, spec: &SimSpec, results: &[SimResult]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let lines: Vec<plot::CdfLine> = results
        .iter()
        .map(|r| plot::CdfLine {
            label: r.policy.clone(),
            sorted_ms: r.quantiles_ms.clone(),
        })
        .collect();
    files.extend(plot::latency_cdf(
        dir,
        &format!("{} (simulated): latency CDF per policy", spec.name),
        &lines,
    )?);
    let small = spec.hosts.len() <= PER_HOST_LIMIT;
    let panels: Vec<plot::SharePanel> = results
        .iter()
        .map(|r| plot::SharePanel {
            label: format!(
                "{} (seed {})",
                r.policy,
                r.seeds.first().copied().unwrap_or(0)
            ),
            seconds: if small {
                r.host_seconds.clone()
            } else {
                r.group_seconds.clone()
            },
        })
        .collect();
    let series: Vec<String> = if small {
        spec.hosts.iter().map(|h| h.name.clone()).collect()
    } else {
        let mut g: Vec<String> = Vec::new();
        for h in &spec.hosts {
            if !g.contains(&h.group) {
                g.push(h.group.clone());
            }
        }
        g
    };
    let what = if small { "backend" } else { "host group" };
    files.extend(plot::share_over_time(
        dir,
        &format!(
            "{} (simulated): traffic share per {what} per second",
            spec.name
        ),
        &panels,
        &series,
    )?);
    if !small {
        let lines: Vec<plot::Line> = results
            .iter()
            .map(|r| plot::Line {
                label: r.policy.clone(),
                points: r
                    .host_util_pct
                    .iter()
                    .enumerate()
                    .map(|(i, u)| (i as f64, *u))
                    .collect(),
            })
            .collect();
        files.extend(plot::lines(
            dir,
            "utilisation",
            &format!("{} (simulated): utilisation per host, sorted", spec.name),
            ("hosts, least to most utilised", "utilisation %"),
            false,
            &lines,
        )?);
    }
    Ok(files)
}
