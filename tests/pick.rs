//! Picking from a table: frequencies follow the weights, P2C follows load, the floor is probed
//! whatever the load, edges are safe.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::pick::{HostLoad, PickAlgorithm, PickTable, Waits};
#[cfg(not(target_arch = "wasm32"))]
use proptest::prelude::*;

fn counts<L: Into<HostLoad>>(
    table: &PickTable,
    algorithm: PickAlgorithm,
    n: usize,
    in_flight: impl Fn(usize) -> L + Copy,
) -> Vec<usize> {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut counts = vec![0; table.len()];
    for _ in 0..n {
        let i = table
            .pick(algorithm, &mut rng, in_flight)
            .unwrap_or(usize::MAX);
        counts[i] += 1;
    }
    counts
}

/// The loads of two hosts, index 0 and the rest: (requests, waited ns) each.
fn two_loads(a: (u32, u64), b: (u32, u64)) -> impl Fn(usize) -> HostLoad + Copy {
    move |i: usize| {
        let (requests, waited_ns) = if i == 0 { a } else { b };
        HostLoad {
            requests,
            waited_ns,
        }
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn weighted_random_follows_the_shares() {
    let table = PickTable::new([("a:1", 0.7), ("b:1", 0.2), ("c:1", 0.1)]);
    let n = 100_000;
    let c = counts(&table, PickAlgorithm::WeightedRandom, n, |_| 0);
    for (got, want) in c.iter().zip([0.7, 0.2, 0.1]) {
        let share = *got as f64 / n as f64;
        // 5 standard deviations of a binomial at n = 100k is under 0.0075.
        assert!(
            (share - want).abs() < 0.0075,
            "share {share}, want {want} ({c:?})"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn zero_and_invalid_shares_are_never_picked() {
    let table = PickTable::new([("a:1", 0.0), ("b:1", 1.0), ("c:1", f64::NAN), ("d:1", -1.0)]);
    assert_eq!(table.hosts().collect::<Vec<_>>(), vec!["b:1"]);
    assert!(PickTable::new([])
        .weighted(&mut fastrand::Rng::with_seed(1))
        .is_none());
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_retry_alternative_is_another_host_by_weight() {
    let table = PickTable::new([("a:1", 0.5), ("b:1", 0.3), ("c:1", 0.2)]);
    let mut rng = fastrand::Rng::with_seed(3);
    let mut c = [0usize; 3];
    for _ in 0..30_000 {
        let i = table.weighted_except(&mut rng, 0).unwrap_or(0);
        assert_ne!(i, 0);
        c[i] += 1;
    }
    assert!((c[1] as f64 / 30_000.0 - 0.6).abs() < 0.02, "{c:?}");
    let single = PickTable::new([("a:1", 1.0)]);
    assert_eq!(single.weighted_except(&mut rng, 0), None);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn p2c_avoids_the_host_with_requests_piling_up() {
    let table = PickTable::new([("a:1", 0.5), ("b:1", 0.5)]);
    let c = counts(&table, PickAlgorithm::WeightedP2c, 10_000, |i| {
        if i == 0 {
            20
        } else {
            0
        }
    });
    // The two candidates are distinct hosts, so a, always the busier, never wins (drawn with
    // replacement, it would win whenever it was drawn twice: one time in four).
    assert_eq!(c[0], 0, "{c:?}");
    // A fresh table: the tie-break counts what each host was served since the table was built.
    let table = PickTable::new([("a:1", 0.5), ("b:1", 0.5)]);
    let idle = counts(&table, PickAlgorithm::WeightedP2c, 10_000, |_| 0);
    assert!(
        (idle[0] as f64 / 10_000.0 - 0.5).abs() < 0.03,
        "equal load follows the weights: {idle:?}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn p2c_follows_unequal_shares_when_nothing_is_in_flight() {
    // With a `+ 1` in the cost, every idle pair would go to the heavier host: a would get
    // 0.5 + 2·0.5·0.5 = 75 % instead of its 50 %.
    let table = PickTable::with_floor([("a:1", 0.5), ("b:1", 0.3), ("c:1", 0.2)], 0.002);
    let n = 100_000;
    let c = counts(&table, PickAlgorithm::WeightedP2c, n, |_| 0);
    for (got, want) in c.iter().zip([0.5, 0.3, 0.2]) {
        let share = *got as f64 / n as f64;
        assert!(
            (share - want).abs() < 0.01,
            "share {share}, want {want} ({c:?})"
        );
    }
}

/// A host at the floor is out of favour: the pick never draws it, whatever the loads, so it costs
/// the traffic nothing but its probes (`probe`). Drawn as a candidate, it would win every
/// comparison in which it has nothing in flight: at thousands of requests a second, several
/// requests a second to a host that may take a second to answer (tower #76's mix).
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_at_the_floor_is_left_to_the_probes() {
    let table = PickTable::with_floor(
        [("busy:1", 0.498), ("slow:1", 0.002), ("other:1", 0.5)],
        0.002,
    );
    // The slow host idle, the others loaded: the case in which it would win a comparison.
    let c = counts(&table, PickAlgorithm::WeightedP2c, 100_000, |i| {
        if i == 1 {
            0
        } else {
            5
        }
    });
    assert_eq!(c[1], 0, "{c:?}");
    // Weighted random, the pick that ignores loads, still draws it by its share.
    let random = counts(&table, PickAlgorithm::WeightedRandom, 100_000, |_| 0);
    assert!((100..=300).contains(&random[1]), "{random:?}");
}

/// A host the table has no latency of yet (new, or back from ejection) gets one request of this
/// worker's at a time: while it has one in flight (or one it never answered) it loses every
/// comparison with a host that has answered, however its share and loads compare. Otherwise
/// (nothing in flight, or both candidates on trust) the pick is exactly the unmarked table's.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_on_trust_is_sent_one_request_at_a_time() {
    // (shares of new and old, requests in flight at new and old, is old on trust too, whether
    // new is left alone)
    let cases = [
        (0.5, 0.5, 1, 0, false, true),
        (0.9, 0.1, 1, 50, false, true),
        (0.5, 0.5, 0, 0, false, false),
        (0.5, 0.5, 0, 5, false, false),
        (0.5, 0.5, 1, 3, true, false),
        (0.9, 0.1, 2, 1, true, false),
    ];
    for (new_share, old_share, new_load, old_load, both, left_alone) in cases {
        let entries = [("new:1", new_share), ("old:1", old_share)];
        let load = move |i: usize| if i == 0 { new_load } else { old_load };
        let mut marked = PickTable::with_floor(entries, 0.002);
        marked.set_unproven(|h| h == "new:1" || both);
        let plain = PickTable::with_floor(entries, 0.002);
        let got = counts(&marked, PickAlgorithm::WeightedP2c, 10_000, load);
        let unmarked = counts(&plain, PickAlgorithm::WeightedP2c, 10_000, load);
        let case = (new_share, new_load, old_load, both);
        if left_alone {
            assert_eq!(got[0], 0, "{case:?}: {got:?}");
        } else {
            assert_eq!(got, unmarked, "{case:?}");
        }
    }
}

/// A host that has kept this worker waiting on a request for its patience or longer, with no
/// answer in between, loses every comparison with a host that has not, whatever their shares
/// and counts. Anywhere the rule does not act (nothing pending, a wait shorter than the
/// patience, no patience set, both candidates overdue) the pick is exactly the unmarked table's.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_kept_waiting_past_its_patience_loses_every_comparison() {
    const MS: u64 = 1_000_000;
    const NONE: u64 = u64::MAX;
    // (a's share, a's patience, a's requests and wait in ms, b's requests and wait in ms,
    // whether a is left alone); b's patience is 100 ms throughout.
    let cases = [
        (0.5, 80, 1, 80, 3, 0, true),
        (0.9, 80, 1, 500, 40, 5, true),
        (0.5, 80, 1, 79, 3, 0, false),
        (0.5, 80, 0, 500, 3, 0, false),
        (0.5, NONE, 1, 500, 3, 0, false),
        (0.5, 80, 1, 500, 3, 100, false),
        (0.5, 80, 1, 90, 2, 150, false),
    ];
    for (a_share, a_patience, a_requests, a_wait, b_requests, b_wait, left_alone) in cases {
        let entries = [("a:1", a_share), ("b:1", 1.0 - a_share)];
        let load = two_loads((a_requests, a_wait * MS), (b_requests, b_wait * MS));
        let mut marked = PickTable::with_floor(entries, 0.002);
        marked.set_patience(|h| match h {
            "a:1" if a_patience == NONE => NONE,
            "a:1" => a_patience * MS,
            _ => 100 * MS,
        });
        let plain = PickTable::with_floor(entries, 0.002);
        let got = counts(&marked, PickAlgorithm::WeightedP2c, 10_000, load);
        let unmarked = counts(&plain, PickAlgorithm::WeightedP2c, 10_000, load);
        let case = (a_share, a_patience, a_requests, a_wait, b_requests, b_wait);
        if left_alone {
            assert_eq!(got[0], 0, "{case:?}: {got:?}");
        } else {
            assert_eq!(got, unmarked, "{case:?}");
            // The cases where it does not act still give a requests.
            assert!(got[0] > 0, "{case:?}: {got:?}");
        }
    }
}

/// At equal counts above zero, the queues of the moment decide before the shares: a host that
/// has kept the worker waiting longer than it usually takes loses to one that has not, whatever
/// their shares; else two shares within one noise step are equal and the first candidate (taken
/// in turn, so each host about as often as its share) wins; shares further apart keep the strict
/// order. Unequal counts, idle pairs and a table without the settings pick as before.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn at_equal_counts_a_late_host_loses_and_shares_a_noise_step_apart_take_turns() {
    const MS: u64 = 1_000_000;
    const STEP: f64 = 1.072; // 2 ^ 0.1: the default noise band and gain
    #[derive(Clone, Copy, Debug)]
    enum Expect {
        /// a gets about its share: the candidates take turns.
        Turns,
        /// a gets every request.
        AllToA,
        /// b gets every request.
        AllToB,
        /// As a table without the settings.
        AsBefore,
    }
    use Expect::*;
    // (a's share, a's and b's requests, a's and b's wait in ms; each usually takes 20 ms)
    let cases = [
        (0.51, 1, 1, 5, 5, Turns),
        (0.49, 2, 2, 5, 5, Turns),
        (0.51, 1, 1, 30, 30, Turns),
        (0.60, 1, 1, 5, 5, AllToA),
        (0.40, 1, 1, 5, 5, AllToB),
        (0.51, 1, 1, 30, 5, AllToB),
        (0.70, 3, 3, 30, 5, AllToB),
        (0.30, 1, 1, 5, 30, AllToA),
        (0.51, 1, 2, 5, 5, AsBefore),
        (0.51, 0, 0, 0, 0, AsBefore),
    ];
    for (a_share, a_requests, b_requests, a_wait, b_wait, expect) in cases {
        let entries = [("a:1", a_share), ("b:1", 1.0 - a_share)];
        let load = two_loads((a_requests, a_wait * MS), (b_requests, b_wait * MS));
        let mut table = PickTable::with_floor(entries, 0.002);
        table.set_waits(|_| Waits {
            usual_ns: 20 * MS,
            ..Waits::NONE
        });
        table.set_noise_step(STEP);
        let plain = PickTable::with_floor(entries, 0.002);
        let n = 10_000;
        let got = counts(&table, PickAlgorithm::WeightedP2c, n, load);
        let before = counts(&plain, PickAlgorithm::WeightedP2c, n, load);
        let case = (a_share, a_requests, b_requests, a_wait, b_wait, expect);
        match expect {
            Turns => {
                let a = got[0] as f64 / n as f64;
                assert!((a - a_share).abs() < 0.02, "{case:?}: {got:?}");
                // The strict order would have given the heavier host all of them.
                assert!(before.contains(&n), "{case:?}: {before:?}");
            }
            AllToA => assert_eq!(got, [n, 0], "{case:?}"),
            AllToB => assert_eq!(got, [0, n], "{case:?}"),
            AsBefore => assert_eq!(got, before, "{case:?}"),
        }
    }
    // Without the settings the strict order holds: the heavier of two near-equal hosts takes
    // every comparison at equal counts.
    let plain = PickTable::with_floor([("a:1", 0.51), ("b:1", 0.49)], 0.002);
    assert_eq!(
        counts(&plain, PickAlgorithm::WeightedP2c, 1_000, |_| 1),
        [1_000, 0]
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn ties_go_round_equal_hosts() {
    // Nothing in flight: each idle pair goes to the host served least so far, so in any 200
    // picks each of four equal hosts gets close to its 50. Independent draws would stray by
    // ±14 (two standard deviations) in about one window in twenty.
    let table = PickTable::with_floor(
        [("a:1", 0.25), ("b:1", 0.25), ("c:1", 0.25), ("d:1", 0.25)],
        0.002,
    );
    let mut rng = fastrand::Rng::with_seed(5);
    for window in 0..200 {
        let mut c = [0u32; 4];
        for _ in 0..200 {
            c[table.weighted_p2c(&mut rng, |_| 0).unwrap()] += 1;
        }
        assert!(
            c.iter().all(|n| (36..=64).contains(n)),
            "window {window}: {c:?}"
        );
    }
}

/// A host's turns come evenly spaced: of the gaps between two picks of one host (nothing in
/// flight anywhere), few are under a quarter of the mean gap `1 / share`. Independent draws would
/// put about 22 % of the gaps there (1 − e^(−1/4)), and a host that serves one request at a time
/// would queue each such second request behind the first.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_hosts_turns_come_evenly_spaced() {
    let equal_40: Vec<f64> = vec![0.025; 40];
    let cases: [(&str, &[f64]); 4] = [
        ("40 equal hosts", &equal_40),
        ("4 equal hosts", &[0.25; 4]),
        ("unequal shares", &[0.5, 0.3, 0.2]),
        ("one heavy host", &[0.7, 0.1, 0.1, 0.1]),
    ];
    for (case, shares) in cases {
        let names: Vec<String> = (0..shares.len()).map(|i| format!("h{i}:1")).collect();
        let table = PickTable::with_floor(
            names.iter().map(String::as_str).zip(shares.iter().copied()),
            0.002,
        );
        let mut rng = fastrand::Rng::with_seed(11);
        let mut last = vec![None; shares.len()];
        let (mut gaps, mut short) = (vec![0u32; shares.len()], vec![0u32; shares.len()]);
        for k in 0..50_000_usize {
            let i = table.weighted_p2c(&mut rng, |_| 0).unwrap();
            if let Some(before) = last[i] {
                gaps[i] += 1;
                if ((k - before) as f64) < 0.25 / shares[i] {
                    short[i] += 1;
                }
            }
            last[i] = Some(k);
        }
        for (i, (s, g)) in short.iter().zip(&gaps).enumerate() {
            let fraction = f64::from(*s) / f64::from(*g);
            assert!(
                fraction < 0.06,
                "{case}: host {i}: {:.1} % of its gaps under a quarter of the mean",
                fraction * 100.0
            );
        }
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn lowest_latency_always_takes_the_heaviest() {
    let table = PickTable::new([("a:1", 0.3), ("b:1", 0.4), ("c:1", 0.3)]);
    assert_eq!(
        counts(&table, PickAlgorithm::LowestLatency, 1000, |_| 0),
        vec![0, 1000, 0]
    );
}

#[cfg(not(target_arch = "wasm32"))]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever the shares and the loads, the pick draws only hosts above the floor, and with
    /// nothing in flight it follows their shares above it: over 40,000 picks each host is within
    /// 1.5 percentage points of its part (more than 9 standard deviations).
    #[test]
    fn the_pick_follows_the_shares_above_the_floor(
        shares in prop::collection::vec(0.0f64..1.0, 2..12),
        loads in prop::collection::vec(0u32..50, 12),
        seed in any::<u64>(),
    ) {
        let floor = 0.01;
        let total: f64 = shares.iter().sum();
        prop_assume!(total > 0.0);
        // Shares as a refresh leaves them: normalised, none below the floor.
        let shares: Vec<f64> = shares.iter().map(|s| (s / total).max(floor)).collect();
        let total: f64 = shares.iter().sum();
        let above: Vec<f64> = shares.iter().map(|s| (s - floor * total).max(0.0)).collect();
        let above_total: f64 = above.iter().sum();
        prop_assume!(above_total > 0.0);
        let names: Vec<String> = (0..shares.len()).map(|i| format!("10.0.0.{i}:80")).collect();
        let table = PickTable::with_floor(names.iter().map(String::as_str).zip(shares.iter().copied()), floor);
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = 40_000;
        let mut loaded = vec![0usize; shares.len()];
        let mut idle = vec![0usize; shares.len()];
        for _ in 0..n {
            loaded[table.weighted_p2c(&mut rng, |i| loads[i]).unwrap()] += 1;
        }
        let table = PickTable::with_floor(names.iter().map(String::as_str).zip(shares.iter().copied()), floor);
        for _ in 0..n {
            idle[table.weighted_p2c(&mut rng, |_| 0).unwrap()] += 1;
        }
        for i in 0..shares.len() {
            if above[i] <= 0.0 {
                prop_assert_eq!(loaded[i], 0, "host {} at the floor was picked", i);
            }
            let want = above[i] / above_total;
            let got = idle[i] as f64 / n as f64;
            prop_assert!((got - want).abs() < 0.015, "host {}: {} of the picks, its part {}", i, got, want);
        }
    }

    #[test]
    fn picks_stay_in_range_and_skip_zero_shares(
        shares in prop::collection::vec(prop_oneof![Just(0.0), 0.0f64..1.0], 1..50),
        seed in any::<u64>(),
    ) {
        let names: Vec<String> = (0..shares.len()).map(|i| format!("10.0.0.{i}:80")).collect();
        let table = PickTable::new(names.iter().map(String::as_str).zip(shares.iter().copied()));
        let mut rng = fastrand::Rng::with_seed(seed);
        for algorithm in [PickAlgorithm::WeightedRandom, PickAlgorithm::WeightedP2c, PickAlgorithm::LowestLatency] {
            for _ in 0..50 {
                match table.pick(algorithm, &mut rng, |i| i as u32) {
                    Some(i) => {
                        let host = table.host(i).map(|h| &**h);
                        prop_assert!(host.is_some());
                        let original = names.iter().position(|n| Some(n.as_str()) == host).unwrap_or(usize::MAX);
                        prop_assert!(shares[original] > 0.0);
                    }
                    None => prop_assert!(table.is_empty()),
                }
            }
        }
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_table_over_shared_names_is_the_same_table_holding_the_callers_names() {
    let next = [("a", 0.2), ("c", 0.3), ("d", 0.5), ("e", 0.0)];
    let names: Vec<(std::rc::Rc<str>, f64)> = next.iter().map(|(h, s)| ((*h).into(), *s)).collect();
    let shared = PickTable::shared(names.iter().map(|(h, s)| (h, *s)), 0.01);
    let fresh = PickTable::with_floor(next, 0.01);
    assert_eq!(shared.len(), fresh.len(), "the host at 0 is left out");
    for i in 0..fresh.len() {
        assert_eq!(shared.host(i), fresh.host(i));
        assert_eq!(shared.share(i), fresh.share(i));
        let held = names
            .iter()
            .find(|(h, _)| Some(h) == shared.host(i))
            .unwrap();
        assert!(
            std::rc::Rc::ptr_eq(&held.0, shared.host(i).unwrap()),
            "the caller's name, not a copy"
        );
    }
}

/// A table over a list of names, with each host's share and waits index for index, is the table
/// of those shares with the waits set by address afterwards: hosts at 0 left out (at the start,
/// the middle or the end of the list), each host keeping its own entry's waits.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_table_over_a_list_is_the_table_of_its_shares_and_waits() {
    const MS: u64 = 1_000_000;
    // Each host's limits from its name, so a host paired with another's entry would show.
    let waits_of = |h: &str| Waits {
        usual_ns: u64::from(h.as_bytes()[0]) * MS,
        patience_ns: 4 * u64::from(h.as_bytes()[0]) * MS,
    };
    for entries in [
        [("a", 0.2), ("b", 0.0), ("c", 0.3), ("d", 0.0), ("e", 0.5)],
        [("a", 0.0), ("b", 0.1), ("c", 0.3), ("d", 0.1), ("e", 0.0)],
        [("a", 0.2), ("b", 0.1), ("c", 0.3), ("d", 0.1), ("e", 0.3)],
    ] {
        let list: std::rc::Rc<[std::rc::Rc<str>]> =
            entries.iter().map(|(h, _)| (*h).into()).collect();
        let over = PickTable::over(&list, entries.iter().map(|(h, s)| (*s, waits_of(h))), 0.01);
        let mut by_address = PickTable::with_floor(entries, 0.01);
        by_address.set_waits(waits_of);
        assert_eq!(over, by_address, "{entries:?}");
        assert_eq!(over.len(), entries.iter().filter(|(_, s)| *s > 0.0).count());
        // No limit anywhere is a table without waits.
        assert_eq!(
            PickTable::over(&list, entries.iter().map(|(_, s)| (*s, Waits::NONE)), 0.01),
            PickTable::with_floor(entries, 0.01)
        );
        // Entries that stop early give a table of the hosts they name.
        assert_eq!(
            PickTable::over(
                &list,
                entries.iter().take(3).map(|(_, s)| (*s, Waits::NONE)),
                0.01
            ),
            PickTable::with_floor(entries.iter().take(3).copied(), 0.01)
        );
    }
}
