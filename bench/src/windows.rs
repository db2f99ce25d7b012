//! Windows of a run: figures over named stretches of seconds (`[[window]]` in a scenario), for
//! what a whole-run summary hides: how evenly a cold start spreads over 50 endpoints, what the
//! endpoints of a scale-out get in their first seconds, how much traffic stays in the proxy's
//! zone before, during and after that zone slows down. Definitions in bench/README.md,
//! "Windows".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

use harness::latency::parse_duration;
use harness::load::Record;
use harness::summary::Summary;

use crate::membership::Membership;

/// A `[[window]]` as the scenario file has it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWindow {
    pub name: String,
    pub from: String,
    pub to: String,
}

/// Seconds `[from_s, to_s)` of each run, by the requests' send times.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    pub name: String,
    pub from_s: f64,
    pub to_s: f64,
}

impl Window {
    pub fn parse(file: &FileWindow) -> Result<Window> {
        let secs = |s: &str| parse_duration(s).map(|d| d.as_secs_f64());
        let w = Window {
            name: file.name.clone(),
            from_s: secs(&file.from)?,
            to_s: secs(&file.to)?,
        };
        if w.from_s >= w.to_s {
            bail!(
                "window {:?}: from ({} s) must come before to ({} s)",
                w.name,
                w.from_s,
                w.to_s
            );
        }
        Ok(w)
    }

    fn contains(&self, r: &Record) -> bool {
        (self.from_s..self.to_s).contains(&r.sent_at.as_secs_f64())
    }
}

/// What one run did in one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowFigures {
    pub window: String,
    pub requests: u64,
    pub errors: u64,
    pub p99_ms: f64,
    /// Of the endpoints in the cluster throughout the window (newcomers aside), the lowest and
    /// the highest `served / fair share` (1 = exactly fair).
    pub endpoint_min_of_fair: Option<f64>,
    pub endpoint_max_of_fair: Option<f64>,
    /// The endpoints that joined the cluster during the window (after the run's start): what
    /// they served over their fair share.
    pub newcomers_of_fair: Option<f64>,
    /// Share of the window's requests served in the proxy's zone.
    pub local_share: Option<f64>,
}

/// The figures of each window, from one run's records (whose `backend` is the backend's name,
/// `names` in the scenario's order).
pub fn figures(
    windows: &[Window],
    membership: &Membership,
    names: &[String],
    records: &[Record],
) -> Vec<WindowFigures> {
    let index: BTreeMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    windows
        .iter()
        .map(|w| {
            let inside: Vec<Record> = records
                .iter()
                .filter(|r| !r.dropped && w.contains(r))
                .cloned()
                .collect();
            let summary = Summary::of(&inside);
            // Each request is a fair share 1/n of the endpoints in the cluster when it was sent.
            let mut fair = vec![0.0; names.len()];
            let mut served = vec![0u64; names.len()];
            for r in &inside {
                let members = membership.members_at(r.sent_at.as_secs_f64());
                for i in &members {
                    fair[*i] += 1.0 / members.len() as f64;
                }
                if let Some(i) = r.backend.as_deref().and_then(|b| index.get(b)) {
                    served[*i] += 1;
                }
            }
            let newcomers: Vec<usize> = (0..names.len())
                .filter(|i| {
                    membership.endpoints[*i].join_s > 0.0
                        && (w.from_s..w.to_s).contains(&membership.endpoints[*i].join_s)
                })
                .collect();
            let steady: Vec<f64> = (0..names.len())
                .filter(|i| {
                    membership.endpoints[*i].member_throughout(w.from_s, w.to_s)
                        && !newcomers.contains(i)
                        && fair[*i] > 0.0
                })
                .map(|i| served[i] as f64 / fair[i])
                .collect();
            let new_fair: f64 = newcomers.iter().map(|i| fair[*i]).sum();
            let new_served: u64 = newcomers.iter().map(|i| served[*i]).sum();
            let local = membership.local_zone.as_deref().map(|zone| {
                let local: u64 = (0..names.len())
                    .filter(|i| membership.endpoints[*i].zone.as_deref() == Some(zone))
                    .map(|i| served[i])
                    .sum();
                local as f64 / summary.count.max(1) as f64
            });
            WindowFigures {
                window: w.name.clone(),
                requests: summary.count,
                errors: summary.errors,
                p99_ms: summary.p99_ms,
                endpoint_min_of_fair: steady.iter().copied().reduce(f64::min),
                endpoint_max_of_fair: steady.iter().copied().reduce(f64::max),
                newcomers_of_fair: (new_fair > 0.0).then(|| new_served as f64 / new_fair),
                local_share: local,
            }
        })
        .collect()
}

/// The median of each figure over a policy's rounds, window by window.
pub fn median_over_rounds(rounds: &[&[WindowFigures]]) -> Vec<WindowFigures> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|w| {
            let of = |f: &dyn Fn(&WindowFigures) -> Option<f64>| {
                median(
                    rounds
                        .iter()
                        .filter_map(|r| r.get(w))
                        .filter_map(f)
                        .collect(),
                )
            };
            WindowFigures {
                window: first[w].window.clone(),
                requests: of(&|x| Some(x.requests as f64)).unwrap_or(0.0).round() as u64,
                errors: of(&|x| Some(x.errors as f64)).unwrap_or(0.0).round() as u64,
                p99_ms: of(&|x| Some(x.p99_ms)).unwrap_or(0.0),
                endpoint_min_of_fair: of(&|x| x.endpoint_min_of_fair),
                endpoint_max_of_fair: of(&|x| x.endpoint_max_of_fair),
                newcomers_of_fair: of(&|x| x.newcomers_of_fair),
                local_share: of(&|x| x.local_share),
            }
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => v.get(n / 2).copied(),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The windows table: one row per policy and window (medians over the rounds); columns that no
/// window has, and windows without requests, are left out.
pub fn markdown(per_policy: &[(String, Vec<WindowFigures>)]) -> String {
    let all = || per_policy.iter().flat_map(|(_, f)| f.iter());
    let spread = all().any(|f| f.endpoint_min_of_fair.is_some());
    let newcomers = all().any(|f| f.newcomers_of_fair.is_some());
    let local = all().any(|f| f.local_share.is_some());
    let mut t = String::from("| policy | window | requests | errors % | p99 ms |");
    let mut cols = 5;
    for (on, title) in [
        (spread, " endpoint share min-max (x fair) |"),
        (newcomers, " newcomers % of fair |"),
        (local, " local zone % |"),
    ] {
        if on {
            t.push_str(title);
            cols += 1;
        }
    }
    t.push_str("\n|");
    t.push_str(&"---|".repeat(cols));
    t.push('\n');
    let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}", 100.0 * v));
    for (policy, rows) in per_policy {
        // A window past the end of a shortened (--smoke) run has nothing to say.
        for f in rows.iter().filter(|f| f.requests > 0) {
            let errors = if f.requests > 0 {
                100.0 * f.errors as f64 / f.requests as f64
            } else {
                0.0
            };
            let _ = write!(
                t,
                "| {policy} | {} | {} | {errors:.2} | {:.1} |",
                f.window, f.requests, f.p99_ms
            );
            if spread {
                match (f.endpoint_min_of_fair, f.endpoint_max_of_fair) {
                    (Some(lo), Some(hi)) => {
                        let _ = write!(t, " {lo:.2}-{hi:.2} |");
                    }
                    _ => t.push_str(" - |"),
                }
            }
            if newcomers {
                let _ = write!(t, " {} |", pct(f.newcomers_of_fair));
            }
            if local {
                let _ = write!(t, " {} |", pct(f.local_share));
            }
            t.push('\n');
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::membership::EndpointPlan;

    fn record(sent_s: f64, backend: &str) -> Record {
        Record {
            sent_at: Duration::from_secs_f64(sent_s),
            latency: Duration::from_millis(10),
            status: 200,
            grpc_status: None,
            backend: Some(backend.into()),
            dropped: false,
        }
    }

    #[test]
    fn shares_against_fair_with_members_that_change() {
        // a and b from the start, c joins at 10 s in zone z (the proxy's).
        let membership = Membership {
            local_zone: Some("z".into()),
            endpoints: vec![
                EndpointPlan::default(),
                EndpointPlan::default(),
                EndpointPlan {
                    zone: Some("z".into()),
                    join_s: 10.0,
                    leave_s: None,
                },
            ],
        };
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let mut records = Vec::new();
        for k in 0..100 {
            let t = k as f64 / 10.0; // 0-10 s: a and b alternate
            records.push(record(t, if k % 2 == 0 { "a" } else { "b" }));
        }
        for k in 0..90 {
            let t = 10.0 + k as f64 / 9.0; // 10-20 s: c gets a sixth, a and b the rest
            records.push(record(t, ["a", "b", "a", "b", "a", "c"][k % 6]));
        }
        let windows = [
            Window {
                name: "before".into(),
                from_s: 0.0,
                to_s: 10.0,
            },
            Window {
                name: "after".into(),
                from_s: 10.0,
                to_s: 20.0,
            },
        ];
        let f = figures(&windows, &membership, &names, &records);
        assert_eq!(f[0].requests, 100);
        assert_eq!(
            (f[0].endpoint_min_of_fair, f[0].endpoint_max_of_fair),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(f[0].newcomers_of_fair, None);
        assert_eq!(f[0].local_share, Some(0.0));
        // c's fair share after 10 s is a third; it got a sixth: half of fair.
        assert!(
            (f[1].newcomers_of_fair.unwrap() - 0.5).abs() < 1e-9,
            "{:?}",
            f[1]
        );
        assert!((f[1].local_share.unwrap() - 1.0 / 6.0).abs() < 1e-9);
        // a got half of the window (fair a third): 1.5; b a third: 1.0.
        assert!(
            (f[1].endpoint_max_of_fair.unwrap() - 1.5).abs() < 1e-9
                && (f[1].endpoint_min_of_fair.unwrap() - 1.0).abs() < 1e-9
        );
        let table = markdown(&[("ewma_lb".into(), median_over_rounds(&[&f, &f, &f]))]);
        assert!(table.contains("| ewma_lb | after | 90 | 0.00 |"), "{table}");
        assert!(table.contains("1.00-1.50 | 50.0 | 16.7 |"), "{table}");
    }

    #[test]
    fn windows_must_be_in_order() {
        let w = |from: &str, to: &str| {
            Window::parse(&FileWindow {
                name: "w".into(),
                from: from.into(),
                to: to.into(),
            })
        };
        assert_eq!(w("1s", "6s").unwrap().to_s, 6.0);
        assert!(w("6s", "1s").is_err());
    }
}
