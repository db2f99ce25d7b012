//! `tables`: the published tables, rendered again from the runs' results.json files.
//!
//! README.md and bench/README.md mark each generated section:
//!
//! ```text
//! <!-- bench:compare slowdown -->
//! ... (rewritten) ...
//! <!-- /bench -->
//! ```
//!
//! Kinds: `compare NAME` (bench/out/NAME/results.json), `overhead` and `micro`
//! (bench/out/overhead/results.json), `hostcalls` (bench/out/hostcalls/results.json), `sim NAME` (bench/out/sim-NAME/results.json), `scale NAME`
//! (bench/out/sim-NAME-scale/scale.json), `crosscheck` (the simulated scenarios against the real
//! ones) and `headline` (README's summary, with each target's verdict computed from the medians).
//! Every section says the command that reproduces it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;

use crate::compare::{self, Report};
use crate::figures::{PolicyFigures, RoundFigures};
use crate::overhead::{self, OverheadReport, Variant};
use crate::sim::{self, ScalePoint, SimReport};

const START: &str = "<!-- bench:";
const END: &str = "<!-- /bench -->";

/// The scenarios of the suite, in the order the docs show them.
pub const SCENARIOS: [&str; 3] = ["seed-table", "slowdown", "capacity"];

/// Rewrites every marked section of `files` from the results under `out`; returns how many
/// sections it rewrote.
pub fn rewrite(files: &[PathBuf], out: &Path) -> Result<usize> {
    let mut n = 0;
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let (new, count) = rewrite_text(&text, |kind, name| render(kind, name, out))
            .with_context(|| file.display().to_string())?;
        if new != text {
            std::fs::write(file, new).with_context(|| format!("writing {}", file.display()))?;
        }
        n += count;
    }
    Ok(n)
}

/// Where the next marker starts: at the start of a line (a marker quoted inside prose is not one).
fn next_marker(text: &str, at_line_start: bool) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text.get(from..)?.find(START) {
        let i = from + i;
        if (i == 0 && at_line_start) || text.get(..i).is_some_and(|b| b.ends_with('\n')) {
            return Some(i);
        }
        from = i + START.len();
    }
    None
}

/// `text` with each marked section replaced by `render(kind, name)`. Markers start a line.
pub fn rewrite_text(
    text: &str,
    render: impl Fn(&str, &str) -> Result<String>,
) -> Result<(String, usize)> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut n = 0;
    while let Some(i) = next_marker(rest, out.is_empty() || out.ends_with('\n')) {
        let (before, at) = rest.split_at(i);
        out.push_str(before);
        let close = at
            .find("-->")
            .context("a bench marker is not closed with -->")?;
        let marker = &at[..close + 3];
        let spec = at[START.len()..close].trim();
        let (kind, name) = spec
            .split_once(' ')
            .map_or((spec, ""), |(k, n)| (k, n.trim()));
        let after = &at[close + 3..];
        let end = after
            .find(END)
            .with_context(|| format!("{marker} has no {END}"))?;
        let body = render(kind, name).with_context(|| format!("section {marker}"))?;
        out.push_str(marker);
        out.push('\n');
        out.push_str(body.trim_end());
        out.push('\n');
        out.push_str(END);
        rest = &after[end + END.len()..];
        n += 1;
    }
    out.push_str(rest);
    Ok((out, n))
}

fn read<T: DeserializeOwned>(file: &Path, how: &str) -> Result<T> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading {} (make it with: {how})", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))
}

fn compare_report(out: &Path, name: &str) -> Result<Report> {
    read(
        &out.join(name).join("results.json"),
        &format!("cargo run --release -p ewma-bench -- compare bench/scenarios/{name}.toml"),
    )
}

/// The scenario file of a `sim` section and its results' directory name: a suite scenario
/// (`slowdown`), a fleet file (`fleet`), or a path under bench/scenarios (`tuning/ablation-x`).
fn sim_file(name: &str) -> (String, String) {
    let stem = name.rsplit('/').next().unwrap_or(name).to_owned();
    let file = if name.contains('/') || SCENARIOS.contains(&name) {
        format!("bench/scenarios/{name}.toml")
    } else {
        format!("bench/scenarios/fleet/{name}.toml")
    };
    (file, format!("sim-{stem}"))
}

fn sim_report(out: &Path, name: &str) -> Result<SimReport> {
    let (file, dir) = sim_file(name);
    read(
        &out.join(dir).join("results.json"),
        &format!("cargo run --release -p ewma-bench -- simulate {file}"),
    )
}

fn overhead_report(out: &Path) -> Result<OverheadReport> {
    read(
        &out.join("overhead/results.json"),
        "cargo run --release -p ewma-bench -- overhead",
    )
}

/// One section's text.
pub fn render(kind: &str, name: &str, out: &Path) -> Result<String> {
    Ok(match kind {
        "compare" => {
            let r = compare_report(out, name)?;
            let mut md = String::new();
            let _ = writeln!(md, "{}", compare::load_line(&r));
            let _ = writeln!(md, "\n{}", compare::markdown_table(&r));
            let ratios = figures_ratios(&r.results);
            if !ratios.is_empty() {
                let _ = writeln!(md, "Ratios of the medians:\n\n{ratios}");
            }
            let _ = writeln!(md, "Reproduce: `cargo run --release -p ewma-bench -- compare bench/scenarios/{name}.toml` (bench/out/{name}/).");
            md
        }
        "overhead" => {
            let r = overhead_report(out)?;
            let mut md = overhead::table(&r);
            let _ = writeln!(
                md,
                "\nPlugin module: {} bytes; no-op filter: {} bytes; header-only filter: {} bytes. {} rounds, {} endpoints. Reproduce: `cargo run --release -p ewma-bench -- overhead --rounds {}` (bench/out/overhead/).",
                r.plugin_bytes, r.noop_bytes, r.header_bytes, r.settings["rounds"], r.settings["endpoints"], r.settings["rounds"]
            );
            md
        }
        "hostcalls" => {
            let r: crate::hostcalls::HostcallReport = read(
                &out.join("hostcalls/results.json"),
                "cargo run --release -p ewma-bench -- hostcalls",
            )?;
            let mut md = crate::hostcalls::table(&r);
            let n: Vec<String> = r.settings["counts"]
                .as_array()
                .map(|a| a.iter().map(|v| v.to_string()).collect())
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "\n{} rounds, {} s at saturation per (call, N), Envoy --concurrency {}. Reproduce: `cargo run --release -p ewma-bench -- hostcalls --n {} --rounds {}` (bench/out/hostcalls/).",
                r.settings["rounds"],
                r.settings["saturation_s"],
                r.settings["envoy_concurrency"],
                n.join(","),
                r.settings["rounds"]
            );
            md
        }
        "micro" => {
            let r = overhead_report(out)?;
            format!("{}\nReproduce: `cargo run --release -p ewma-bench -- micro` (also part of `overhead`).", crate::micro::markdown(&r.micro))
        }
        "sim" => {
            let r = sim_report(out, name)?;
            let mut md = format!("{}\n\n", sim::load_line(&r));
            if !r.hosts.is_empty() {
                let _ = writeln!(
                    md,
                    "{}",
                    crate::sim::report::bench_table(&r.hosts, &r.results)
                );
            }
            let _ = writeln!(md, "{}", crate::sim::report::fleet_table(&r.results));
            if r.hosts.is_empty() {
                let _ = writeln!(
                    md,
                    "Traffic per host group:\n\n{}",
                    crate::sim::report::group_table(&r.groups, &r.results)
                );
            }
            let wall: Vec<String> = r
                .results
                .iter()
                .map(|x| {
                    format!(
                        "{} {:.0} s",
                        x.policy,
                        x.fleet.iter().map(|f| f.wall_s).sum::<f64>()
                    )
                })
                .collect();
            let _ = writeln!(md, "CPU time per policy: {}.", wall.join(", "));
            let _ = writeln!(
                md,
                "\nReproduce: `{}` (bench/out/{}/).",
                sim_command(name, &r),
                sim_file(name).1
            );
            md
        }
        "scale" => {
            let file = out.join(format!("sim-{name}-scale/scale.json"));
            let points: Vec<ScalePoint> = read(&file, &format!("cargo run --release -p ewma-bench -- simulate bench/scenarios/fleet/{name}.toml --scale 10,30,100,300,1000"))?;
            let sizes: Vec<String> = points.iter().map(|p| p.proxies.to_string()).collect();
            format!(
                "{}\nReproduce: `cargo run --release -p ewma-bench -- simulate bench/scenarios/fleet/{name}.toml --scale {}` (bench/out/sim-{name}-scale/).",
                sim::scale_table(&points),
                sizes.join(",")
            )
        }
        "crosscheck" => crosscheck(out)?,
        "headline" => headline(out)?,
        other => bail!(
            "unknown kind {other:?} (compare, overhead, hostcalls, micro, sim, scale, crosscheck, headline)"
        ),
    })
}

fn sim_command(name: &str, r: &SimReport) -> String {
    let seeds: Vec<String> = r.settings["seeds"]
        .as_array()
        .map(|a| a.iter().map(|v| v.to_string()).collect())
        .unwrap_or_default();
    format!(
        "cargo run --release -p ewma-bench -- simulate {} --seeds {}",
        sim_file(name).0,
        seeds.join(",")
    )
}

fn figures_ratios(results: &[PolicyFigures]) -> String {
    crate::figures::ratio_lines(
        results,
        "ewma_lb",
        &[
            "ewma_lb_previous",
            "least_request",
            "round_robin",
            "ewma_lowest",
        ],
    )
}

/// Real Envoy against simulation on the suite's scenarios: p99 per policy and the order of the
/// policies by p99.
fn crosscheck(out: &Path) -> Result<String> {
    let mut md = String::from(
        "| scenario | policy | p99 ms, real Envoy (median of rounds) | p99 ms, simulated (median of seeds) | simulated / real | flap pp real | flap pp simulated |\n|---|---|---|---|---|---|---|\n",
    );
    let mut orders = Vec::new();
    let mut worst: f64 = 0.0;
    for name in SCENARIOS {
        let (real, simulated) = (compare_report(out, name)?, sim_report(out, name)?);
        let p99 = |f: &PolicyFigures| f.median(|r| Some(r.p99_ms)).unwrap_or(f64::NAN);
        let flap = |f: &PolicyFigures| f.median(|r| Some(r.flap_pp)).unwrap_or(f64::NAN);
        let mut both = Vec::new();
        for r in &real.results {
            let Some(s) = simulated.results.iter().find(|s| s.policy == r.policy) else {
                continue;
            };
            let (a, b) = (p99(r), p99(&s.figures));
            worst = worst.max((b / a).ln().abs());
            let _ = writeln!(
                md,
                "| {name} | {} | {a:.1} | {b:.1} | {:.2} | {:.1} | {:.1} |",
                r.policy,
                b / a,
                flap(r),
                flap(&s.figures)
            );
            both.push((r.policy.clone(), a, b));
        }
        // Every pair of policies the real runs tell apart (p99 more than 10 % apart) must come
        // out in the same order in the simulation; ties (all the policies at the route timeout)
        // are not a ranking.
        let (mut pairs, mut same) = (0, 0);
        let mut differ = Vec::new();
        for (i, x) in both.iter().enumerate() {
            for y in both.iter().skip(i + 1) {
                if (x.1 / y.1).ln().abs() > 1.1f64.ln() {
                    pairs += 1;
                    if (x.1 < y.1) == (x.2 < y.2) {
                        same += 1;
                    } else {
                        differ.push(format!("{} / {}", x.0, y.0));
                    }
                }
            }
        }
        orders.push(format!(
            "- {name}: {same} of {pairs} pairs of policies in the same order{}",
            if differ.is_empty() {
                String::new()
            } else {
                format!(" (not: {})", differ.join(", "))
            }
        ));
    }
    let _ = writeln!(
        md,
        "\nThe ranking by p99: of the pairs of policies whose real p99 differ by more than 10 %, how many the simulation orders the same way:\n\n{}\n\nLargest gap: the simulated p99 is within a factor {:.2} of the real one.",
        orders.join("\n"),
        worst.exp()
    );
    let _ = writeln!(
        md,
        "\nReproduce: the compare runs above, and `for s in {}; do cargo run --release -p ewma-bench -- simulate bench/scenarios/$s.toml --seeds 1,2,3,4,5; done`.",
        SCENARIOS.join(" ")
    );
    Ok(md)
}

/// A target's verdict.
fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**missed**"
    }
}

fn median(r: &Report, policy: &str, f: impl Fn(&RoundFigures) -> Option<f64>) -> Option<f64> {
    r.results
        .iter()
        .find(|p| p.policy == policy)
        .and_then(|p| p.median(f))
}

/// The equal hosts' flapping while the slowdown is settled (from 3 s after it starts to its end),
/// median over `policy`'s rounds, from the per-second shares in results.json: the whole-run
/// index also counts the (correct) reallocation when the slow host leaves and comes back.
fn settled_steady_flap(out: &Path, scenario: &str, policy: &str) -> Result<Option<f64>> {
    let file = out.join(scenario).join("results.json");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&file).with_context(|| file.display().to_string())?,
    )?;
    let backends = json["settings"]["backends"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut steady = Vec::new();
    let mut window = None;
    for b in &backends {
        let name = b["name"].as_str().unwrap_or_default().to_owned();
        let phases: Vec<(f64, f64)> = b["phases"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter_map(|x| {
                        x.as_str()?
                            .split('@')
                            .next()?
                            .split_once('-')
                            .map(|(a, b)| (a.parse().ok(), b.parse().ok()))
                    })
                    .filter_map(|(a, b)| Some((a?, b?)))
                    .collect()
            })
            .unwrap_or_default();
        match phases.first() {
            Some(&(from, to)) => window = window.or(Some((from + 3.0, to))),
            None => steady.push(name),
        }
    }
    let Some((from, to)) = window else {
        return Ok(None);
    };
    let mut values = Vec::new();
    for run in json["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["policy"] == policy)
    {
        let seconds: Vec<harness::summary::SecondShares> = run["seconds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["second"].as_f64().is_some_and(|t| t >= from && t < to))
            .map(|s| harness::summary::SecondShares {
                second: s["second"].as_u64().unwrap_or(0),
                count: s["count"].as_u64().unwrap_or(0),
                shares: s["shares"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(0.0)))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect();
        values.push(crate::metrics::flapping(&seconds, 0, &steady).index_pp);
    }
    Ok(crate::figures::Spread::of(values).map(|s| s.median))
}

/// README's summary: one row per scenario, the medians of ewma_lb, its previous defaults and
/// least_request from the same runs, and each target's verdict.
fn headline(out: &Path) -> Result<String> {
    let mut md = String::from("| scenario | ewma-lb | previous defaults (same runs) | least_request (same runs) | targets |\n|---|---|---|---|---|\n");
    let f1 = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    let f2 = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    let le = |a: Option<f64>, b: Option<f64>| matches!((a, b), (Some(a), Some(b)) if a <= b);

    let r = compare_report(out, "seed-table")?;
    let (avg, p95, p99, err) = (
        median(&r, "ewma_lb", |x| Some(x.avg_ms)),
        median(&r, "ewma_lb", |x| Some(x.p95_ms)),
        median(&r, "ewma_lb", |x| Some(x.p99_ms)),
        median(&r, "ewma_lb", |x| Some(x.errors_pct)),
    );
    let prev99 = median(&r, "ewma_lb_previous", |x| Some(x.p99_ms));
    let _ = writeln!(
        md,
        "| `seed-table` (the source article's experiment) | avg {} ms, p95 {}, p99 {}, errors {} % | p99 {} | avg {}, p95 {}, errors {} % | the article's Peak EWMA row, avg <= 82, p95 <= 105, errors <= 0.5 %: {}; p99 <= previous: {} |",
        f1(avg),
        f1(p95),
        f1(p99),
        f2(err),
        f1(prev99),
        f1(median(&r, "least_request", |x| Some(x.avg_ms))),
        f1(median(&r, "least_request", |x| Some(x.p95_ms))),
        f2(median(&r, "least_request", |x| Some(x.errors_pct))),
        verdict(le(avg, Some(82.0)) && le(p95, Some(105.0)) && le(err, Some(0.5))),
        verdict(le(p99, prev99)),
    );

    let r = compare_report(out, "slowdown")?;
    let steady = |p: &str| median(&r, p, |x| x.steady_flap_pp);
    let p99 = |p: &str| median(&r, p, |x| Some(x.p99_ms));
    let settled = |p: &str| settled_steady_flap(out, "slowdown", p).ok().flatten();
    let recoveries = r
        .results
        .iter()
        .find(|p| p.policy == "ewma_lb")
        .and_then(PolicyFigures::recoveries)
        .unwrap_or_default();
    let recovery_median = r
        .results
        .iter()
        .find(|p| p.policy == "ewma_lb")
        .and_then(PolicyFigures::recovery_median);
    let recovered = recovery_median
        .as_deref()
        .and_then(|m| m.parse::<f64>().ok())
        .is_some_and(|s| s <= 10.0);
    let _ = writeln!(
        md,
        "| `slowdown` (one of four hosts at 300-600 ms for 30 s) | p99 {} ms; equal hosts' flap {} pp ({} while the slowdown is settled); back to fair (s, each round): {} | p99 {}; flap {} ({}) | p99 {}; flap {} ({}) | equal hosts' flap <= least_request's: {} (settled: {}); p99 <= previous: {}; p99 <= 0.5 x least_request: {}; back to fair <= 10 s (median): {} |",
        f1(p99("ewma_lb")),
        f1(steady("ewma_lb")),
        f2(settled("ewma_lb")),
        recoveries,
        f1(p99("ewma_lb_previous")),
        f1(steady("ewma_lb_previous")),
        f2(settled("ewma_lb_previous")),
        f1(p99("least_request")),
        f1(steady("least_request")),
        f2(settled("least_request")),
        verdict(le(steady("ewma_lb"), steady("least_request"))),
        verdict(le(settled("ewma_lb"), settled("least_request"))),
        verdict(le(p99("ewma_lb"), p99("ewma_lb_previous"))),
        verdict(le(p99("ewma_lb"), p99("least_request").map(|x| x / 2.0))),
        verdict(recovered),
    );

    let r = compare_report(out, "capacity")?;
    let flap = |p: &str| median(&r, p, |x| Some(x.flap_pp));
    let p99 = |p: &str| median(&r, p, |x| Some(x.p99_ms));
    let _ = writeln!(
        md,
        "| `capacity` (hosts of 2, 4 and 8 workers near saturation) | p99 {} ms; flap {} pp | p99 {}; flap {} | p99 {}; flap {} | flap <= least_request's: {}; p99 <= previous: {} |",
        f1(p99("ewma_lb")),
        f1(flap("ewma_lb")),
        f1(p99("ewma_lb_previous")),
        f1(flap("ewma_lb_previous")),
        f1(p99("least_request")),
        f1(flap("least_request")),
        verdict(le(flap("ewma_lb"), flap("least_request"))),
        verdict(le(p99("ewma_lb"), p99("ewma_lb_previous"))),
    );

    let o = overhead_report(out)?;
    let get = |v: Variant| o.results.iter().find(|x| x.variant == v);
    if let (Some(e), Some(n)) = (get(Variant::EwmaLb), get(Variant::NoopWasm)) {
        let throughput = e.saturation_rps.median / n.saturation_rps.median;
        let p99 = e.p99_ms.median / n.p99_ms.median;
        let _ = writeln!(
            md,
            "| overhead (`--concurrency 1`, {} instant backends, {} rounds) | {:.0} req/s at saturation; p99 {:.2} ms at {} req/s | | no-op wasm filter: {:.0} req/s; p99 {:.2} ms | throughput >= 0.95 x no-op ({throughput:.3}): {}; p99 <= 1.05 x no-op ({p99:.3}): {} |",
            o.settings["endpoints"],
            o.settings["rounds"],
            e.saturation_rps.median,
            e.p99_ms.median,
            o.settings["fixed_rate_per_s"],
            n.saturation_rps.median,
            n.p99_ms.median,
            verdict(throughput >= 0.95),
            verdict(p99 <= 1.05),
        );
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_sections_are_replaced_and_the_rest_kept() {
        let text = "intro\n<!-- bench:compare x -->\nold\n<!-- /bench -->\nmiddle\n<!-- bench:overhead -->\n<!-- /bench -->\nend\n";
        let (new, n) = rewrite_text(text, |kind, name| Ok(format!("{kind}/{name}"))).unwrap();
        assert_eq!(n, 2);
        assert_eq!(new, "intro\n<!-- bench:compare x -->\ncompare/x\n<!-- /bench -->\nmiddle\n<!-- bench:overhead -->\noverhead/\n<!-- /bench -->\nend\n");
        let (again, _) = rewrite_text(&new, |kind, name| Ok(format!("{kind}/{name}"))).unwrap();
        assert_eq!(again, new, "rewriting is idempotent");
        assert!(
            rewrite_text("<!-- bench:compare x -->\nno end", |_, _| Ok(String::new())).is_err()
        );
        let quoted = "a line `<!-- bench:KIND NAME -->` in prose\n";
        assert_eq!(
            rewrite_text(quoted, |_, _| Ok("x".into())).unwrap(),
            (quoted.to_string(), 0),
            "not a marker"
        );
    }
}
