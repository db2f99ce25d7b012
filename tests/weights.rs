//! Shares from scores: the rules of weights.rs, case by case, and the laws of every table.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::weights::{indistinguishable, shares, HostInput, WeightParams};
#[cfg(not(target_arch = "wasm32"))]
use proptest::prelude::*;

const SEC: u64 = 1_000_000_000;

fn host(score_ms: Option<f64>) -> HostInput {
    HostInput {
        score_ms,
        uncertainty: 0.0,
        active_for_ns: 3600 * SEC,
        ejected: false,
        previous_share: None,
        share_on_trust: false,
        share_age_ns: 0,
    }
}

/// Each rule alone: no slow start, no noise band.
fn params() -> WeightParams {
    WeightParams {
        slow_start_ns: 0,
        noise_gain: 1.0,
        ..WeightParams::default()
    }
}

fn previous(score_ms: f64, share: f64) -> HostInput {
    HostInput {
        previous_share: Some(share),
        share_on_trust: false,
        ..host(Some(score_ms))
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn faster_hosts_get_more_by_the_exponent() {
    let p = WeightParams {
        exponent: 1.0,
        min_share: 0.0,
        ..params()
    };
    let s = shares(&[host(Some(50.0)), host(Some(100.0))], &p);
    assert!(
        (s[0] - 2.0 / 3.0).abs() < 1e-9 && (s[1] - 1.0 / 3.0).abs() < 1e-9,
        "{s:?}"
    );
    let p = WeightParams {
        exponent: 2.0,
        min_share: 0.0,
        ..params()
    };
    let s = shares(&[host(Some(50.0)), host(Some(100.0))], &p);
    assert!((s[0] - 0.8).abs() < 1e-9, "{s:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_slow_host_keeps_the_minimum_share() {
    let p = WeightParams {
        min_share: 0.01,
        ..params()
    };
    let s = shares(
        &[host(Some(75.0)), host(Some(75.0)), host(Some(1500.0))],
        &p,
    );
    assert!((s[2] - 0.01).abs() < 1e-12, "{s:?}");
    assert!((s[0] - 0.495).abs() < 1e-9, "{s:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_without_samples_is_scored_at_the_median() {
    let p = WeightParams {
        exponent: 1.0,
        min_share: 0.0,
        ..params()
    };
    let s = shares(
        &[
            host(Some(50.0)),
            host(Some(100.0)),
            host(Some(200.0)),
            host(None),
        ],
        &p,
    );
    assert!(
        (s[3] - s[1]).abs() < 1e-12,
        "the newcomer is treated like the median host: {s:?}"
    );
    let s = shares(&[host(None), host(None)], &p);
    assert_eq!(s, vec![0.5, 0.5], "no samples anywhere: equal shares");
    // An even count: the median is the mean of the two middle scores (150 ms here).
    let s = shares(
        &[
            host(Some(400.0)),
            host(Some(50.0)),
            host(None),
            host(Some(200.0)),
            host(Some(100.0)),
        ],
        &p,
    );
    assert!(
        (s[2] / s[1] - 50.0 / 150.0).abs() < 1e-12,
        "the newcomer is scored at 150 ms: {s:?}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_large_table_keeps_every_bound() {
    // 10,000 hosts whose scores span four orders of magnitude, half of them with a share in
    // force: the fit meets the floor, the damping bound and the sum at every host.
    let p = WeightParams::default();
    let hosts: Vec<HostInput> = (0..10_000)
        .map(|i| {
            let score = 1.0 + ((i * 7919) % 10_000) as f64;
            match i % 2 {
                0 => previous(score, 1.0 / 10_000.0),
                _ => host(Some(score)),
            }
        })
        .collect();
    let s = shares(&hosts, &p);
    let floor = ewma_lb::balance::weights::floor(&p, hosts.len());
    assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    for (share, h) in s.iter().zip(&hosts) {
        assert!(
            *share >= floor * (1.0 - 1e-9),
            "{share} below the floor {floor}"
        );
        if let Some(prev) = h.previous_share {
            assert!(
                *share <= prev * p.max_step_ratio * (1.0 + 1e-9),
                "{share} from {prev}"
            );
        }
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn slow_start_ramps_a_new_host_in() {
    let p = WeightParams {
        slow_start_ns: 10 * SEC,
        slow_start_min_factor: 0.1,
        min_share: 0.0,
        ..params()
    };
    let new = |age_s: u64| HostInput {
        active_for_ns: age_s * SEC,
        ..host(Some(50.0))
    };
    let s = shares(&[host(Some(50.0)), new(0)], &p);
    assert!(
        (s[1] - 0.1 / 1.1).abs() < 1e-9,
        "starts at the minimum factor: {s:?}"
    );
    let s = shares(&[host(Some(50.0)), new(5)], &p);
    assert!((s[1] - 0.5 / 1.5).abs() < 1e-9, "halfway: {s:?}");
    let s = shares(&[host(Some(50.0)), new(10)], &p);
    assert!((s[1] - 0.5).abs() < 1e-9, "done: {s:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn damping_bounds_the_move_of_one_refresh() {
    let p = WeightParams {
        max_step_ratio: 2.0,
        min_share: 0.0,
        ..params()
    };
    // The slow host recovered at once; its share may only double per refresh.
    let mut hosts = [host(Some(50.0)), host(Some(50.0)), host(Some(50.0))];
    hosts[0].previous_share = Some(0.45);
    hosts[1].previous_share = Some(0.45);
    hosts[2].previous_share = Some(0.1);
    let s = shares(&hosts, &p);
    assert!((s[2] - 0.2).abs() < 1e-9, "{s:?}");
    assert!((s[0] - 0.4).abs() < 1e-9, "{s:?}");
}

/// A fall is bounded from a host's standing among the hosts the table now holds: its share in
/// force, scaled when hosts joined as if they had had the shares they get now. Each case: the
/// shares in force (`None`: a host new to the table), the scores, and the table one refresh
/// makes of them.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_fall_is_bounded_from_the_standing_among_the_hosts_now_held() {
    type Case = (&'static str, Vec<Option<f64>>, Vec<f64>, Vec<f64>);
    let floor = 0.002;
    let cases: Vec<Case> = vec![
        (
            // A cluster learned from traffic: the first table knew one host and gave it
            // everything. Bounded from that share it kept half, then a quarter...
            "the only host known meets three equal ones: all at a fair share at once",
            vec![Some(1.0), None, None, None],
            vec![20.0; 4],
            vec![0.25; 4],
        ),
        (
            "the only host known, slow, meets a fast one: at the floor at once",
            vec![Some(1.0), None],
            vec![400.0, 20.0],
            vec![floor, 1.0 - floor],
        ),
        (
            "without newcomers a favoured host turning 20 times slower halves",
            vec![Some(0.55), Some(0.15), Some(0.15), Some(0.15)],
            vec![400.0, 20.0, 20.0, 20.0],
            vec![0.275, 0.725 / 3.0, 0.725 / 3.0, 0.725 / 3.0],
        ),
    ];
    let p = WeightParams {
        max_step_ratio: 2.0,
        min_share: floor,
        ..params()
    };
    for (name, previous, scores, want) in cases {
        let hosts: Vec<HostInput> = previous
            .iter()
            .zip(&scores)
            .map(|(prev, score)| HostInput {
                previous_share: *prev,
                share_on_trust: false,
                ..host(Some(*score))
            })
            .collect();
        let got = shares(&hosts, &p);
        let close = got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-9);
        assert!(close, "{name}: got {got:?}, want {want:?}");
    }
    // The noise band counts from the standing too: the first host's whole table is not a share
    // in force to approach a tenth of the way per refresh.
    let banded = WeightParams {
        noise_gain: 0.1,
        ..p
    };
    let first = [previous(20.0, 1.0), host(Some(20.0)), host(Some(20.0))];
    let got = shares(&first, &banded);
    assert!(got.iter().all(|s| (s - 1.0 / 3.0).abs() < 1e-9), "{got:?}");
}

/// A share granted on trust (`share_on_trust`: the host had no latency in the table when it got
/// it) is no standing of the host's own: its first answers move it at once. It is room the other
/// hosts' shares already made, though: they keep their standing. Each case: the third host's
/// score (`None`: still on trust), whether its share in force was granted on trust, and the
/// table one refresh makes, from a third each, with the noise band and damping on.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_share_on_trust_is_no_standing_of_its_own_but_room_the_others_made() {
    type Case = (&'static str, Option<f64>, bool, [f64; 3]);
    let floor = 0.002;
    let cases: [Case; 3] = [
        (
            "still on trust, scored at the median: a third each, as before",
            None,
            true,
            [1.0 / 3.0; 3],
        ),
        (
            "its first answers, 20 times slower: at the floor at once",
            Some(400.0),
            true,
            [(1.0 - floor) / 2.0, (1.0 - floor) / 2.0, floor],
        ),
        (
            "a share it earned on answers, 20 times slower: halved",
            Some(400.0),
            false,
            [5.0 / 12.0, 5.0 / 12.0, 1.0 / 6.0],
        ),
    ];
    let p = WeightParams {
        max_step_ratio: 2.0,
        min_share: floor,
        noise_gain: 0.1,
        ..params()
    };
    for (name, score, on_trust, want) in cases {
        let third = HostInput {
            previous_share: Some(1.0 / 3.0),
            share_on_trust: on_trust,
            ..host(score)
        };
        let hosts = [previous(20.0, 1.0 / 3.0), previous(20.0, 1.0 / 3.0), third];
        let got = shares(&hosts, &p);
        let close = got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-9);
        assert!(close, "{name}: got {got:?}, want {want:?}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn ejected_hosts_get_nothing() {
    let mut hosts = [host(Some(50.0)), host(Some(50.0))];
    hosts[1].ejected = true;
    hosts[1].previous_share = Some(0.5);
    assert_eq!(shares(&hosts, &params()), vec![1.0, 0.0]);
    hosts[0].ejected = true;
    assert_eq!(shares(&hosts, &params()), vec![0.0, 0.0]);
}

#[cfg(not(target_arch = "wasm32"))]
fn arb_host() -> impl Strategy<Value = HostInput> {
    (
        prop::option::of(0.0f64..100_000.0),
        0u64..20 * SEC,
        prop::bool::weighted(0.2),
        prop::option::of(0.0f64..1.0),
        0u64..20 * SEC,
    )
        .prop_map(
            |(score_ms, active_for_ns, ejected, previous_share, share_age_ns)| HostInput {
                score_ms,
                uncertainty: 0.0,
                active_for_ns,
                ejected,
                previous_share,
                share_on_trust: false,
                share_age_ns,
            },
        )
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_floor_leaves_room_to_steer_in_a_large_cluster() {
    // 600 hosts: a fair share is 0.17 %, under the 0.2 % floor. Held to min_share alone, every
    // host would be at the floor and all shares equal whatever their scores.
    let mut hosts: Vec<HostInput> = (0..600).map(|_| host(Some(20.0))).collect();
    hosts[0] = host(Some(400.0));
    let s = shares(
        &hosts,
        &WeightParams {
            min_share: 0.002,
            min_fair_share: 0.1,
            ..params()
        },
    );
    assert!(
        (s[0] - 0.1 / 600.0).abs() < 1e-12,
        "the slow host at a tenth of a fair share: {}",
        s[0]
    );
    assert!(s[1] > 1.0 / 600.0, "{}", s[1]);
    let pinned = shares(
        &hosts,
        &WeightParams {
            min_share: 0.002,
            min_fair_share: 1.0,
            ..params()
        },
    );
    assert!(
        (pinned[0] - pinned[1]).abs() < 1e-12,
        "without it every host is at the floor: {pinned:?}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn equal_hosts_do_not_follow_their_noise() {
    // Four equal hosts at a quarter each; this refresh's scores differ by chance by up to 15 %,
    // which followed at once would move shares by up to 40 % (exponent 2.5).
    let scores = [20.0, 23.0, 17.5, 21.0];
    let hosts: Vec<HostInput> = scores.iter().map(|s| previous(*s, 0.25)).collect();
    let followed = shares(&hosts, &params());
    let settled = shares(
        &hosts,
        &WeightParams {
            noise_gain: 0.1,
            noise_band: 2.0,
            ..params()
        },
    );
    let spread = |s: &[f64]| s.iter().fold(0.0f64, |m, x| m.max((x / 0.25).ln().abs()));
    assert!(spread(&followed) > 0.25, "{followed:?}");
    assert!(spread(&settled) < 0.05, "a tenth of the way: {settled:?}");
    assert!(
        settled[2] > settled[0] && settled[0] > settled[1],
        "still in the right direction: {settled:?}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_real_change_goes_beyond_the_band_at_once() {
    // One of four hosts turns 20 times slower: its target is 1/1,800 of the others'. Only the
    // band's width is lagged, so damping (halving per refresh) is what bounds it, as without
    // the band.
    let hosts = [
        previous(20.0, 0.25),
        previous(20.0, 0.25),
        previous(20.0, 0.25),
        previous(400.0, 0.25),
    ];
    let settled = shares(
        &hosts,
        &WeightParams {
            noise_gain: 0.1,
            noise_band: 2.0,
            ..params()
        },
    );
    let followed = shares(&hosts, &params());
    assert!(
        (settled[3] - 0.125).abs() < 1e-9 && (followed[3] - 0.125).abs() < 1e-9,
        "{settled:?} {followed:?}"
    );
    // Recovering from the floor, a host climbs as fast as damping allows until its target is
    // within the band.
    let hosts = [
        previous(20.0, 0.33),
        previous(20.0, 0.33),
        previous(20.0, 0.33),
        previous(20.0, 0.01),
    ];
    let settled = shares(
        &hosts,
        &WeightParams {
            noise_gain: 0.1,
            noise_band: 2.0,
            min_share: 0.0,
            ..params()
        },
    );
    assert!((settled[3] - 0.02).abs() < 1e-9, "{settled:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_ramping_in_follows_its_ramp_not_the_band() {
    let p = WeightParams {
        slow_start_ns: 10 * SEC,
        slow_start_min_factor: 0.1,
        min_share: 0.0,
        noise_gain: 0.1,
        ..params()
    };
    let ramping = HostInput {
        active_for_ns: 5 * SEC,
        ..previous(50.0, 0.2)
    };
    let s = shares(&[previous(50.0, 0.8), ramping], &p);
    // Its ramp says a third; settled like noise it would only go from 0.2 to 0.21. (The other
    // host's share is settled, so the third is not exact.)
    assert!(s[1] > 0.28, "most of the way up its ramp at once: {s:?}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_whose_ramp_just_ended_takes_its_target_not_the_bands_pace() {
    let p = WeightParams {
        slow_start_ns: SEC,
        slow_start_min_factor: 0.1,
        min_share: 0.0,
        noise_gain: 0.1,
        ..params()
    };
    // Two equal hosts; the second's ramp ended a second ago. Its share in force set 1.5 s ago
    // is the ramp's last step; one set 0.25 s ago is its own.
    let after_ramp = |share_age_ns| HostInput {
        active_for_ns: 2 * SEC,
        share_age_ns,
        ..previous(50.0, 0.4)
    };
    let ramped = shares(&[previous(50.0, 0.6), after_ramp(3 * SEC / 2)], &p);
    // Its target is half; the other host's share is settled by the band, so not exactly half.
    assert!(ramped[1] > 0.45, "at its target at once: {ramped:?}");
    // A share of its own standing is held by the band: a tenth of the way.
    let standing = shares(&[previous(50.0, 0.6), after_ramp(SEC / 4)], &p);
    assert!(standing[1] < 0.42, "{standing:?}");
}

#[cfg(not(target_arch = "wasm32"))]
proptest! {
    #[test]
    fn shares_sum_to_one_and_respect_the_floor(
        hosts in prop::collection::vec(arb_host(), 1..40),
        min_share in 0.0f64..0.1,
        exponent in 0.5f64..4.0,
        max_step_ratio in 1.0f64..4.0,
    ) {
        let p = WeightParams { min_share, exponent, max_step_ratio, ..WeightParams::default() };
        let s = shares(&hosts, &p);
        prop_assert_eq!(s.len(), hosts.len());
        let live = hosts.iter().filter(|h| !h.ejected).count();
        let total: f64 = s.iter().sum();
        if live == 0 {
            prop_assert!(total == 0.0);
        } else {
            prop_assert!((total - 1.0).abs() < 1e-9, "sum {}", total);
        }
        let fair = 1.0 / live.max(1) as f64;
        let floor = min_share.min(p.min_fair_share * fair).min(fair);
        for (share, h) in s.iter().zip(&hosts) {
            prop_assert!(share.is_finite() && *share >= 0.0);
            if h.ejected {
                prop_assert!(*share == 0.0);
            } else {
                prop_assert!(*share >= floor - 1e-9, "share {} below floor {}", share, floor);
            }
        }
    }

    #[test]
    fn one_refresh_moves_a_share_by_at_most_the_step_ratio(
        scores in prop::collection::vec(1.0f64..5_000.0, 2..30),
        previous in prop::collection::vec(0.01f64..1.0, 30),
        ratio in 1.1f64..4.0,
        min_share in 0.0f64..0.02,
    ) {
        let total: f64 = previous.iter().take(scores.len()).sum();
        let hosts: Vec<HostInput> = scores
            .iter()
            .zip(&previous)
            .map(|(score, prev)| HostInput { previous_share: Some(prev / total), ..host(Some(*score)) })
            .collect();
        let p = WeightParams { max_step_ratio: ratio, min_share, ..params() };
        let s = shares(&hosts, &p);
        prop_assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let fair = 1.0 / hosts.len() as f64;
        let floor = min_share.min(p.min_fair_share * fair);
        for (share, h) in s.iter().zip(&hosts) {
            let prev = h.previous_share.unwrap_or(0.0);
            let lo = (prev / ratio).max(floor);
            let hi = (prev * ratio).max(floor);
            prop_assert!(*share >= lo - 1e-9 && *share <= hi + 1e-9, "{} outside [{}, {}]", share, lo, hi);
        }
    }
}

/// Scores that differ by less than their uncertainty come out equal: equal hosts whose estimates
/// differ by chance get equal shares. A host far beyond its uncertainty keeps its distance, however
/// few samples stand behind it.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn chance_differences_do_not_move_the_table_real_ones_do() {
    let noisy = |score: f64, u: f64| HostInput {
        uncertainty: u,
        ..previous(score, 0.25)
    };
    let p = params();
    // Four equal hosts measured at 18-22 ms with an uncertainty of 0.5 (in ln terms).
    let equal = shares(
        &[
            noisy(18.0, 0.5),
            noisy(22.0, 0.5),
            noisy(20.0, 0.5),
            noisy(21.0, 0.5),
        ],
        &p,
    );
    for s in &equal {
        assert!((s - 0.25).abs() < 0.01, "{equal:?}");
    }
    // The same scores known precisely: the table follows them.
    let precise = shares(
        &[
            noisy(18.0, 0.0),
            noisy(22.0, 0.0),
            noisy(20.0, 0.0),
            noisy(21.0, 0.0),
        ],
        &p,
    );
    assert!(precise[0] > precise[1] * 1.5, "{precise:?}");
    // A host 17 times slower than the rest, measured by probes alone (uncertainty 0.9): as far
    // down as if it were known precisely.
    let slow = |u: f64| {
        shares(
            &[
                noisy(75.0, 0.1),
                noisy(75.0, 0.1),
                noisy(75.0, 0.1),
                noisy(1_300.0, u),
            ],
            &WeightParams {
                min_share: 0.0,
                ..p.clone()
            },
        )[3]
    };
    assert!(
        slow(0.9) < slow(0.0) * 1.05,
        "{} against {}",
        slow(0.9),
        slow(0.0)
    );
}

/// When the table cannot tell its hosts apart (`pick: weighted_p2c_unless_equal` then leaves them
/// to the fallback). Cases: hosts as (score ms, uncertainty in ln terms, share in force,
/// ejected), and the answer. The reference is the share-weighted mean score.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_are_indistinguishable_when_every_score_is_within_its_uncertainty() {
    type Case<'a> = (&'a [(Option<f64>, f64, f64, bool)], bool);
    let cases: [Case; 8] = [
        // 20 and 21 ms, each known to within 10 %: equal.
        (
            &[(Some(20.0), 0.1, 0.5, false), (Some(21.0), 0.1, 0.5, false)],
            true,
        ),
        // 20 and 30 ms, known to within 10 %: 30 ms is 0.22 from the 25 ms reference in ln.
        (
            &[(Some(20.0), 0.1, 0.5, false), (Some(30.0), 0.1, 0.5, false)],
            false,
        ),
        // The same hosts known only to within 30 %: equal as far as the table can tell.
        (
            &[(Some(20.0), 0.3, 0.5, false), (Some(30.0), 0.3, 0.5, false)],
            true,
        ),
        // A host with no uncertainty yet (no evidence) is not known to be equal.
        (
            &[(Some(20.0), 0.1, 0.5, false), (Some(20.0), 0.0, 0.5, false)],
            false,
        ),
        // A host never measured.
        (
            &[(Some(20.0), 0.1, 0.5, false), (None, 0.1, 0.5, false)],
            false,
        ),
        // One live host: nothing to tell apart, nothing to leave to anyone.
        (&[(Some(20.0), 0.1, 1.0, false)], false),
        // An ejected host does not count; the two live ones are equal.
        (
            &[
                (Some(20.0), 0.1, 0.5, false),
                (Some(1000.0), 0.1, 0.0, true),
                (Some(20.5), 0.1, 0.5, false),
            ],
            true,
        ),
        // No share in force: no reference yet.
        (
            &[(Some(20.0), 0.1, 0.0, false), (Some(20.0), 0.1, 0.0, false)],
            false,
        ),
    ];
    for (hosts, want) in cases {
        let inputs: Vec<HostInput> = hosts
            .iter()
            .map(|&(score_ms, uncertainty, share, ejected)| HostInput {
                uncertainty,
                ejected,
                previous_share: (share > 0.0).then_some(share),
                share_on_trust: false,
                ..host(score_ms)
            })
            .collect();
        assert_eq!(indistinguishable(&inputs), want, "{hosts:?}");
    }
}
