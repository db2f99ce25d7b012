//! Probes: a host out of favour is measured by time, not by share; the interval grows with the
//! square root of how much slower the host is, and the worker VMs of a cluster share it.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use std::rc::Rc;

use ewma_lb::balance::probe::{backoff, interval_ns, Pending, Probes};

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_interval_grows_with_the_square_root_of_the_slowness() {
    // (score, reference, interval for a base of 1 s)
    let cases = [
        (Some(20.0), Some(20.0), SEC),
        // Faster than the traffic's average: no more often than the base.
        (Some(5.0), Some(20.0), SEC),
        (Some(80.0), Some(20.0), 2 * SEC),
        (Some(180.0), Some(20.0), 3 * SEC),
        // Past nine times slower the bound decides: a recovery is seen within 3 intervals.
        (Some(1_600.0), Some(100.0), 3 * SEC),
        (Some(1_000.0), Some(1.0), 3 * SEC),
        // Nothing known: as fast as the rest.
        (None, Some(20.0), SEC),
        (Some(20.0), None, SEC),
        (Some(f64::NAN), Some(20.0), SEC),
        (Some(20.0), Some(0.0), SEC),
    ];
    for (score, reference, want) in cases {
        let got = interval_ns(SEC, score, reference);
        assert!(
            got.abs_diff(want) <= MS,
            "score {score:?}, reference {reference:?}: {got} ns, want {want}"
        );
    }
}

fn hosts(names: &[&str]) -> Vec<Rc<str>> {
    names.iter().map(|h| Rc::from(*h)).collect()
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_is_probed_when_its_interval_has_passed_and_it_has_nothing_in_flight() {
    let table = hosts(&["a:1", "b:1"]);
    let mut probes = Probes::default().rebuild(&[], &table, vec![SEC, 4 * SEC], 0);
    probes.set_workers(1);
    // Host a is sent requests all along by the pick; b gets none.
    let mut probed = Vec::new();
    for step in 1..=100u64 {
        let now = step * 100 * MS;
        probes.sent(0, now);
        if let Some(i) = probes.due(now, |_| Pending::default()) {
            probes.sent(i, now);
            probed.push((i, now / MS));
        }
    }
    // b every 4 s (checked every other request, so within 100 ms of it); a never.
    let at: Vec<u64> = probed.iter().map(|(_, ms)| *ms).collect();
    assert!(probed.iter().all(|(i, _)| *i == 1), "{probed:?}");
    assert_eq!(at.len(), 2, "{probed:?}");
    assert!(
        at[0] >= 4_000 && at[0] <= 4_100 && at[1] - at[0] >= 4_000,
        "{probed:?}"
    );
    // With a request in flight to it, a due host waits.
    let mut busy = Probes::default().rebuild(&[], &table, vec![SEC, SEC], 0);
    busy.set_workers(1);
    let busy_host = Pending {
        in_flight: 1,
        unserved: 0,
    };
    for step in 0..40 {
        assert_eq!(busy.due(10 * SEC + step, |_| busy_host), None);
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_worker_vms_of_a_cluster_share_its_probes() {
    let table = hosts(&["a:1"]);
    for (workers, want) in [(1, 10), (2, 5), (4, 2)] {
        let mut probes = Probes::default().rebuild(&[], &table, vec![SEC], 0);
        probes.set_workers(workers);
        let mut n = 0;
        for step in 1..=1_000u64 {
            let now = step * 10 * MS;
            if let Some(i) = probes.due(now, |_| Pending::default()) {
                probes.sent(i, now);
                n += 1;
            }
        }
        assert_eq!(n, want, "{workers} workers over 10 s");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_new_table_keeps_what_the_worker_knows_of_the_hosts_it_keeps() {
    // A VM's tables share their names (the same allocations), but a table read anew holds
    // names of its own: the rebuild must match hosts either way.
    for shared in [true, false] {
        let old = hosts(&["a:1", "b:1", "c:1"]);
        let mut probes = Probes::default().rebuild(&[], &old, vec![SEC; 3], 0);
        probes.set_workers(1);
        probes.sent(0, 5 * SEC);
        probes.sent(2, 5 * SEC);
        // b leaves, d joins (counted as sent at the rebuild), a and c keep their last request.
        let new = match shared {
            true => vec![old[0].clone(), old[2].clone(), Rc::from("d:1")],
            false => hosts(&["a:1", "c:1", "d:1"]),
        };
        let mut probes = probes.rebuild(&old, &new, vec![SEC; 3], 6 * SEC);
        let mut due = Vec::new();
        for step in 0..6 {
            let now = 6 * SEC + 500 * MS + step;
            if let Some(i) = probes.due(now, |_| Pending::default()) {
                probes.sent(i, now);
                due.push(new[i].to_string());
            }
        }
        assert_eq!(
            due,
            ["a:1", "c:1"],
            "d was sent to at the rebuild (names shared: {shared})"
        );
    }
}

/// A pick table that kept its hosts shares the table's list, and the schedule is rebuilt over the
/// same list it was built on: that is the schedule a copy of the list gives, with the new
/// intervals.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_schedule_rebuilt_over_the_same_list_is_the_one_a_copy_gives() {
    let list = hosts(&["a:1", "b:1", "c:1"]);
    let mut probes = Probes::default().rebuild(&[], &list, vec![SEC; 3], 0);
    probes.set_workers(2);
    probes.sent(1, 5 * SEC);
    let copy = hosts(&["a:1", "b:1", "c:1"]);
    let same = probes.rebuild(&list, &list, vec![SEC, 2 * SEC, 3 * SEC], 6 * SEC);
    assert_eq!(
        same,
        probes.rebuild(&list, &copy, vec![SEC, 2 * SEC, 3 * SEC], 6 * SEC)
    );
    assert_ne!(same, probes, "the new intervals");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_worker_spends_on_probes_at_most_the_floors_share_of_its_requests() {
    // Host a takes the traffic, b is at the floor (1 %: one request in 100 at most) with a 1 s
    // interval. A busy worker is bound by time, a quiet one by the share: in a fleet of quiet
    // proxies, time alone would send b one probe a second from each of them.
    let table = hosts(&["a:1", "b:1"]);
    for (gap_ms, want) in [(1, 20), (10, 20), (100, 2), (500, 0)] {
        let mut probes = Probes::default().rebuild(&[], &table, vec![SEC, SEC], 0);
        probes.set_workers(1);
        probes.set_floor(0.01);
        let mut n = 0;
        let mut now = 0;
        while now < 20 * SEC {
            now += gap_ms * MS;
            match probes.due(now, |_| Pending::default()) {
                Some(i) => {
                    probes.sent(i, now);
                    n += u64::from(i == 1);
                }
                None => probes.sent(0, now),
            }
        }
        assert_eq!(n, want, "a request every {gap_ms} ms for 20 s");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_wait_doubles_with_each_request_in_a_row_a_host_did_not_serve_beyond_the_first() {
    // (requests in a row not served, times the interval)
    let cases = [
        (0, 1),
        (1, 1),
        (2, 2),
        (3, 4),
        (4, 4),
        (40, 4),
        (u32::MAX, 4),
    ];
    for (unserved, want) in cases {
        assert_eq!(backoff(unserved), want, "{unserved} unserved");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_that_serves_nothing_is_probed_less_often_until_it_serves_again() {
    // Host b (1 s interval) fails every probe for 40 s, then serves them: its probes come 1, 2
    // and then 4 s apart, and once one is served, every second again.
    let table = hosts(&["a:1", "b:1"]);
    let mut probes = Probes::default().rebuild(&[], &table, vec![SEC, SEC], 0);
    probes.set_workers(1);
    let mut unserved = 0;
    let mut probed = Vec::new();
    for step in 1..=6_000u64 {
        let now = step * 10 * MS;
        let b = Pending {
            in_flight: 0,
            unserved,
        };
        match probes.due(now, |i| if i == 1 { b } else { Pending::default() }) {
            Some(i) => {
                probes.sent(i, now);
                probed.push(now / MS);
                // Each probe ends before the next request here.
                unserved = if now < 40 * SEC { unserved + 1 } else { 0 };
            }
            None => probes.sent(0, now),
        }
    }
    let gaps: Vec<u64> = probed
        .windows(2)
        .map(|w| (w[1] - w[0] + 50) / 1_000)
        .collect();
    assert_eq!(probed.first().map(|ms| ms / 1_000), Some(1), "{probed:?}");
    assert_eq!(&gaps[..4], [1, 2, 4, 4], "{probed:?}");
    // Failing until 40 s: probes at 1, 2, 4, 8, 12, ... 40, 44 (served), then every second.
    let after: Vec<u64> = probed.iter().filter(|ms| **ms > 44_100).copied().collect();
    assert!(!after.is_empty(), "{probed:?}");
    assert!(
        after.windows(2).all(|w| w[1] - w[0] <= 1_100),
        "back to every second once served: {probed:?}"
    );
    assert!(
        probed.iter().filter(|ms| **ms < 40_000).count() <= 12,
        "about one probe per 4 s while it served nothing: {probed:?}"
    );
}
