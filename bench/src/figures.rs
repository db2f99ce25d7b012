//! The figures of one policy's run, and their median and spread over rounds: what every table of
//! `compare` and `simulate` shows. The types read back from results.json, so tables can be
//! rendered again from a finished run (`ewma-bench tables`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One policy's figures in one round (or one simulated run).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundFigures {
    /// Requests sent in the measured window (dropped arrivals excluded).
    pub count: u64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    /// Status 0 or >= 500, in % of the requests sent.
    pub errors_pct: f64,
    /// Open-loop arrivals the generator dropped at its in-flight bound.
    pub dropped: u64,
    /// Share of requests per backend, in %.
    pub shares_pct: BTreeMap<String, f64>,
    /// Flapping index over every backend and its noise floor (metrics.rs), pp.
    pub flap_pp: f64,
    pub flap_noise_pp: f64,
    /// The same over the backends that neither slow down nor fail (the equal hosts of `slowdown`
    /// and of `failing-neighbour`: issue 16 judges flapping among equal hosts); `None` when every
    /// backend is steady.
    pub steady_flap_pp: Option<f64>,
    pub steady_flap_noise_pp: Option<f64>,
    /// Scenarios with a slowdown: the slowed host's share during its slow phase, in %.
    pub slow_phase_share_pct: Option<f64>,
    /// Scenarios with a slowdown: the slowed host's share over the 5 s from the phase's start,
    /// and its lowest second among them, each as a multiple of its share over the 5 s before.
    #[serde(default)]
    pub kept_5s: Option<f64>,
    #[serde(default)]
    pub lowest_second: Option<f64>,
    /// Scenarios with a slowdown: seconds until the slowed host's share is back near fair;
    /// `None` inside `Recovery::Never` when it never was within the run.
    pub recovery: Option<Recovery>,
}

/// Seconds until the slowed host was back near fair, or never within the run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    After(f64),
    Never,
}

impl Recovery {
    pub fn of(seconds: Option<f64>) -> Recovery {
        seconds.map_or(Recovery::Never, Recovery::After)
    }

    fn seconds(self) -> f64 {
        match self {
            Recovery::After(s) => s,
            Recovery::Never => f64::INFINITY,
        }
    }

    pub fn label(self) -> String {
        match self {
            Recovery::After(s) => format!("{s:.0}"),
            Recovery::Never => "never".into(),
        }
    }
}

/// The median of some values and their range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// `None` for no values. The median of an even count is the mean of the middle two.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// `median (min-max)` with `decimals`, or just the value for a single one.
    pub fn show(&self, decimals: usize) -> String {
        let f = |x: f64| {
            if x.is_infinite() {
                "never".to_string()
            } else {
                format!("{x:.decimals$}")
            }
        };
        if self.n <= 1 || f(self.min) == f(self.max) {
            f(self.median)
        } else {
            format!("{} ({}-{})", f(self.median), f(self.min), f(self.max))
        }
    }
}

/// The figures of one policy over all its rounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyFigures {
    pub policy: String,
    pub rounds: Vec<RoundFigures>,
}

impl PolicyFigures {
    /// One figure's median and spread over the rounds; `None` when no round has it.
    pub fn spread(&self, figure: impl Fn(&RoundFigures) -> Option<f64>) -> Option<Spread> {
        Spread::of(self.rounds.iter().filter_map(figure))
    }

    pub fn median(&self, figure: impl Fn(&RoundFigures) -> Option<f64>) -> Option<f64> {
        self.spread(figure).map(|s| s.median)
    }

    /// Recovery of every round, in order, e.g. `4, 5, never`.
    pub fn recoveries(&self) -> Option<String> {
        let all: Vec<String> = self
            .rounds
            .iter()
            .filter_map(|r| r.recovery.map(Recovery::label))
            .collect();
        (!all.is_empty()).then(|| all.join(", "))
    }

    /// The median recovery (never counts as longer than any time).
    pub fn recovery_median(&self) -> Option<String> {
        let s = self.spread(|r| r.recovery.map(Recovery::seconds))?;
        Some(if s.median.is_infinite() {
            "never".into()
        } else {
            format!("{:.0}", s.median)
        })
    }
}

/// A table of every policy's figures: median (min-max) of each over the rounds.
pub fn table(results: &[PolicyFigures], backends: &[String]) -> String {
    let first = results.first().and_then(|r| r.rounds.first());
    let has_steady = first.is_some_and(|r| r.steady_flap_pp.is_some());
    let has_recovery = first.is_some_and(|r| r.recovery.is_some());
    let mut head = vec![
        "policy", "avg ms", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "errors %", "dropped",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    head.extend(backends.iter().map(|b| format!("{b} %")));
    head.extend(["flap pp".to_string(), "flap noise pp".to_string()]);
    if has_steady {
        head.extend([
            "steady hosts' flap pp".to_string(),
            "their noise pp".to_string(),
        ]);
    }
    if has_recovery {
        head.extend([
            "slow-phase share %".to_string(),
            "5 s from the start, × before".to_string(),
            "lowest second, × before".to_string(),
            "back to fair s (each round)".to_string(),
        ]);
    }
    let mut t = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    let cell = |p: &PolicyFigures, f: &dyn Fn(&RoundFigures) -> Option<f64>, d: usize| {
        p.spread(f).map_or_else(|| "-".to_string(), |s| s.show(d))
    };
    for p in results {
        let mut row = vec![p.policy.clone()];
        row.push(cell(p, &|r| Some(r.avg_ms), 1));
        row.push(cell(p, &|r| Some(r.p50_ms), 1));
        row.push(cell(p, &|r| Some(r.p95_ms), 1));
        row.push(cell(p, &|r| Some(r.p99_ms), 1));
        row.push(cell(p, &|r| Some(r.p999_ms), 1));
        row.push(cell(p, &|r| Some(r.errors_pct), 2));
        row.push(cell(p, &|r| Some(r.dropped as f64), 0));
        for b in backends {
            row.push(cell(
                p,
                &|r| Some(r.shares_pct.get(b).copied().unwrap_or(0.0)),
                1,
            ));
        }
        row.push(cell(p, &|r| Some(r.flap_pp), 1));
        row.push(cell(p, &|r| Some(r.flap_noise_pp), 1));
        if has_steady {
            row.push(cell(p, &|r| r.steady_flap_pp, 1));
            row.push(cell(p, &|r| r.steady_flap_noise_pp, 1));
        }
        if has_recovery {
            row.push(cell(p, &|r| r.slow_phase_share_pct, 1));
            row.push(cell(p, &|r| r.kept_5s, 2));
            row.push(cell(p, &|r| r.lowest_second, 2));
            let each = p.recoveries().unwrap_or_else(|| "-".into());
            let median = p.recovery_median().unwrap_or_else(|| "-".into());
            row.push(if p.rounds.len() > 1 {
                format!("{median} ({each})")
            } else {
                median
            });
        }
        let _ = writeln!(t, "| {} |", row.join(" | "));
    }
    t
}

/// `a / b` of two medians, two decimals; `-` when b is 0 or either is missing.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// Ratio lines of `policy` against each of `others` present in `results`, from the medians.
pub fn ratio_lines(results: &[PolicyFigures], policy: &str, others: &[&str]) -> String {
    let get = |name: &str| results.iter().find(|r| r.policy == name);
    let mut out = String::new();
    let Some(me) = get(policy) else { return out };
    for other in others.iter().filter(|o| **o != policy) {
        let Some(o) = get(other) else { continue };
        let q = |f: &dyn Fn(&RoundFigures) -> Option<f64>| ratio(me.median(f), o.median(f));
        let _ = writeln!(
            out,
            "- {policy} / {other}: avg {}, p95 {}, p99 {}, p99.9 {}, flapping {}",
            q(&|r| Some(r.avg_ms)),
            q(&|r| Some(r.p95_ms)),
            q(&|r| Some(r.p99_ms)),
            q(&|r| Some(r.p999_ms)),
            q(&|r| Some(r.flap_pp)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_median_and_range() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(s.show(1), "2.0 (1.0-3.0)");
        assert_eq!(Spread::of([4.0, 1.0]).unwrap().median, 2.5);
        assert_eq!(Spread::of([5.0]).unwrap().show(0), "5");
        assert!(Spread::of([]).is_none());
    }

    #[test]
    fn never_recovering_counts_as_longest() {
        let round = |r| RoundFigures {
            recovery: Some(r),
            ..RoundFigures::default()
        };
        let p = PolicyFigures {
            policy: "x".into(),
            rounds: vec![
                round(Recovery::After(4.0)),
                round(Recovery::Never),
                round(Recovery::Never),
            ],
        };
        assert_eq!(p.recovery_median().as_deref(), Some("never"));
        assert_eq!(p.recoveries().as_deref(), Some("4, never, never"));
    }

    #[test]
    fn table_has_a_row_per_policy_and_a_column_per_backend() {
        let round = RoundFigures {
            p99_ms: 10.0,
            shares_pct: [("a".to_string(), 60.0)].into(),
            ..RoundFigures::default()
        };
        let results = vec![
            PolicyFigures {
                policy: "p".into(),
                rounds: vec![
                    round.clone(),
                    RoundFigures {
                        p99_ms: 14.0,
                        ..round.clone()
                    },
                ],
            },
            PolicyFigures {
                policy: "q".into(),
                rounds: vec![round],
            },
        ];
        let t = table(&results, &["a".to_string(), "b".to_string()]);
        assert_eq!(t.lines().count(), 4, "{t}");
        assert!(
            t.contains("| p | 0.0 | 0.0 | 0.0 | 12.0 (10.0-14.0) |"),
            "{t}"
        );
        assert!(t.contains("| a % | b % |"), "{t}");
        assert!(ratio_lines(&results, "p", &["q"]).contains("p99 1.20"));
    }
}
