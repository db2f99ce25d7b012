//! Several workers over one shared store: the tick protocol loses no sample, refreshes once per
//! interval, and every worker ends up picking from the same table.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

mod store;

use std::collections::HashMap;

use ewma_lb::balance::outcome::Outcome;
use ewma_lb::worker::telemetry::{Change, Metric, Update};
use ewma_lb::worker::{Decision, FallbackReason, Finished, Pick, Request, Worker};
use store::{
    config, defaults, finish_pick, keys_of_kind, samples, steer, ticked, Shared, CLUSTER, MS, SEC,
};

fn header_value(pick: &Pick) -> String {
    let mut out = String::new();
    pick.write_header_value(&mut out);
    out
}

fn finish_ok(w: &mut Worker, host: &str, ms: f64) {
    w.finish(
        CLUSTER,
        &Finished {
            served_by: Some(host),
            attempts: 1,
            latency_ms: ms,
            outcome: Some(Outcome::Success),
            ..Finished::default()
        },
    );
}

/// A worker whose configuration lists two endpoints of [`CLUSTER`].
fn two_endpoints(seed: u64) -> Worker {
    let cfg = r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    Worker::new(config(cfg), seed)
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn no_sample_is_lost_under_contention() {
    let store = Shared::default();
    store.0.borrow_mut().lose_every = Some(3);
    let mut workers: Vec<Worker> = (0..3).map(|i| Worker::new(defaults(), i)).collect();
    let mut recorded = 0u64;
    for t in 1..=50u64 {
        for (i, w) in workers.iter_mut().enumerate() {
            for _ in 0..(i + 1) {
                finish_ok(w, "10.0.0.1:80", 50.0);
                recorded += 1;
            }
            w.tick(t * SEC / 5, &mut store.clone());
        }
    }
    // A few more ticks without traffic flush what lost its last compare-and-swap.
    for t in 51..=60u64 {
        for w in &mut workers {
            w.tick(t * SEC / 5, &mut store.clone());
        }
    }
    let merged = store
        .record_of(CLUSTER)
        .host("10.0.0.1:80")
        .map_or(0, |h| h.latency.samples());
    assert_eq!(merged, recorded);
}

/// A VM whose every write loses its compare-and-swap has an error every tick; it logs the first
/// at once, then one a minute saying how many it did not log (before: one line per tick, ten a
/// second per VM).
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn lost_compare_and_swaps_are_warned_of_once_a_minute() {
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    finish_ok(&mut w, "10.0.0.1:80", 5.0);
    w.tick(SEC / 10, &mut store.clone());
    store.0.borrow_mut().lose_every = Some(1);
    let (mut errors, mut warned) = (0u64, Vec::new());
    // 130 s of ticks of 100 ms, a request in each.
    for t in 2..=1_301u64 {
        finish_ok(&mut w, "10.0.0.1:80", 5.0);
        let report = w.tick(t * SEC / 10, &mut store.clone());
        errors += report.errors.len() as u64;
        warned.extend(report.error_warnings.into_iter().map(|(_, _, n)| (t, n)));
    }
    assert!(
        errors >= 1_000,
        "the store should fail nearly every tick: {errors}"
    );
    let at: Vec<u64> = warned.iter().map(|(t, _)| *t).collect();
    assert_eq!(at.len(), 3, "warned at ticks {at:?}");
    assert_eq!(at[1] - at[0], 600, "{at:?}");
    let unlogged: u64 = warned.iter().map(|(_, n)| n).sum();
    assert_eq!(warned[0].1, 0);
    assert!(
        unlogged + 3 <= errors && unlogged + 3 + 200 >= errors,
        "{warned:?} of {errors}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn one_refresh_per_interval_whoever_ticks() {
    let store = Shared::default();
    let cfg = r#"{"tick_period_ms": 200, "refresh_interval_ms": 1000}"#;
    let mut workers: Vec<Worker> = (0..3).map(|i| Worker::new(config(cfg), i)).collect();
    let mut refreshes = 0;
    for t in 1..=40u64 {
        for w in &mut workers {
            finish_ok(w, "10.0.0.1:80", 50.0);
            refreshes += w.tick(t * SEC / 5, &mut store.clone()).refreshed;
        }
    }
    // 40 ticks of 200 ms are 8 s: the first tick builds the table, then one refresh a second.
    assert_eq!(refreshes, 8);
    // The version moves only when a refresh changed the shares.
    assert!(
        (1..=8).contains(&store.record_of(CLUSTER).table_version),
        "{}",
        store.record_of(CLUSTER).table_version
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn every_worker_adopts_the_same_table() {
    let store = Shared::default();
    let mut workers: Vec<Worker> = (0..2).map(|i| Worker::new(defaults(), i)).collect();
    // Both see a first request before any table exists.
    for w in &mut workers {
        assert_eq!(steer(w), Decision::Fallback(FallbackReason::TableNotReady));
    }
    for t in 1..=30u64 {
        finish_ok(&mut workers[0], "10.0.0.1:80", 50.0);
        finish_ok(&mut workers[0], "10.0.0.2:80", 800.0);
        for w in &mut workers {
            w.tick(t * SEC / 5, &mut store.clone());
        }
    }
    // Worker 1 never served a request but steers from the table worker 0's samples built.
    let mut counts: HashMap<String, u32> = HashMap::new();
    for _ in 0..2000 {
        if let Decision::Override(pick) = steer(&mut workers[1]) {
            *counts.entry(pick.host.to_string()).or_default() += 1;
        }
    }
    let fast = counts.get("10.0.0.1:80").copied().unwrap_or(0);
    assert!(fast > 1900, "{counts:?}");
    let snapshot: Vec<_> = workers
        .iter()
        .map(|w| w.tables().map(|(_, s)| s.table_version).collect::<Vec<_>>())
        .collect();
    assert_eq!(snapshot[0], snapshot[1]);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn in_flight_counts_go_up_on_pick_and_down_once_on_finish() {
    let store = Shared::default();
    let mut w = Worker::new(
        config(
            r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#,
        ),
        1,
    );
    w.tick(SEC, &mut store.clone());
    let Decision::Override(pick) = steer(&mut w) else {
        panic!("no table")
    };
    assert_eq!(
        (&*pick.host, header_value(&pick).as_str()),
        ("10.0.0.1:80", "10.0.0.1:80")
    );
    let host = pick.host.to_string();
    steer(&mut w);
    assert_eq!(w.in_flight(CLUSTER, &host), 2);
    let reset = Finished {
        picked: Some(&host),
        in_flight: true,
        served_by: Some(&host),
        attempts: 1,
        latency_ms: 10.0,
        outcome: Some(Outcome::Reset),
        ..Finished::default()
    };
    w.finish(CLUSTER, &reset);
    // A request that never reached a host (no upstream address, no outcome).
    w.finish(
        CLUSTER,
        &Finished {
            picked: Some(&host),
            in_flight: true,
            ..Finished::default()
        },
    );
    assert_eq!(w.in_flight(CLUSTER, &host), 0);
    w.finish(
        CLUSTER,
        &Finished {
            picked: Some(&host),
            in_flight: true,
            ..Finished::default()
        },
    );
    assert_eq!(w.in_flight(CLUSTER, &host), 0, "never below zero");
}

/// A request whose body is still to come is not in flight at its host yet: the filter counts it
/// once the body has ended (`Request::body_pending`), which is when the host can work on it, so
/// a client trickling an upload does not hold up the count of the host it was picked for.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_request_whose_body_is_still_to_come_is_not_in_flight_yet() {
    let store = Shared::default();
    let mut w = Worker::new(
        config(
            r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#,
        ),
        1,
    );
    w.tick(SEC, &mut store.clone());
    let upload = Request {
        path: b"/upload",
        cluster: Some(CLUSTER),
        now_ns: SEC,
        body_pending: true,
    };
    for _ in 0..3 {
        let Decision::Override(pick) = w.route(&upload, || None) else {
            panic!("no table")
        };
        assert_eq!(&*pick.host, "10.0.0.1:80");
    }
    assert_eq!(w.in_flight(CLUSTER, "10.0.0.1:80"), 0);
    // A request without a body is the host's at once.
    steer(&mut w);
    assert_eq!(w.in_flight(CLUSTER, "10.0.0.1:80"), 1);
}

/// How `w` splits `n` requests of [`CLUSTER`], each ending served before the next arrives.
fn split_of_served_requests(w: &mut Worker, n: usize) -> HashMap<String, u32> {
    let mut split = HashMap::new();
    for _ in 0..n {
        let Decision::Override(pick) = steer(w) else {
            panic!("no table")
        };
        let host = pick.host.to_string();
        finish_pick(w, &host, 20.0);
        *split.entry(host).or_default() += 1;
    }
    split
}

/// Steers requests through `w` until one is picked for `host`, left in flight there; each
/// request picked for another host ends served at once.
fn steer_until_picked(w: &mut Worker, host: &str) {
    loop {
        let Decision::Override(pick) = steer(w) else {
            panic!("no table")
        };
        if &*pick.host == host {
            return;
        }
        finish_pick(w, &pick.host, 20.0);
    }
}

/// A request `w` picked `host` for, ending there with `outcome` after a second.
fn end_picked(w: &mut Worker, host: &str, outcome: Outcome) {
    end_picked_after(w, host, 1_000.0, outcome);
}

/// A request `w` picked `host` for, ending there with `outcome` after `latency_ms`.
fn end_picked_after(w: &mut Worker, host: &str, latency_ms: f64, outcome: Outcome) {
    w.finish(
        CLUSTER,
        &Finished {
            picked: Some(host),
            in_flight: true,
            served_by: Some(host),
            attempts: 1,
            latency_ms,
            outcome: Some(outcome),
            num_endpoints: Some(2),
            ..Finished::default()
        },
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_request_a_host_never_answered_counts_against_it_until_it_answers_again() {
    // Two equal hosts; one request to a is picked and ends as the case says, then 200 requests
    // each end before the next: a hung host (its waits cut short, by the client or the route's
    // timeout) keeps them counted and gets none, until it answers anything, even a request the
    // pick did not send it. A host that failed or lost the connection holds nothing.
    let cfg = r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let a = "10.0.0.1:80";
    // (how a's request ends, whether a is left out of the next 200)
    let cases = [
        (Outcome::Abandoned, true),
        (Outcome::Timeout, true),
        (Outcome::Success, false),
        (Outcome::ServerError, false),
        (Outcome::Reset, false),
        (Outcome::ConnectFailure, false),
    ];
    for (outcome, held) in cases {
        let (_, mut w) = ticked(cfg, 7);
        steer_until_picked(&mut w, a);
        end_picked(&mut w, a, outcome);
        assert_eq!(w.in_flight(CLUSTER, a), 0, "{outcome:?}");
        let split = split_of_served_requests(&mut w, 200);
        let to_a = split.get(a).copied().unwrap_or(0);
        if held {
            assert_eq!(to_a, 0, "{outcome:?}: {split:?}");
            // Its next answer, to a request Envoy chose, ends it (and the pick's tie-break,
            // the requests served since the table came, then gives a its turns back).
            finish_ok(&mut w, a, 20.0);
            let split = split_of_served_requests(&mut w, 200);
            let to_a = split.get(a).copied().unwrap_or(0);
            assert!(to_a >= 80, "{outcome:?}, answered: {split:?}");
        } else {
            assert!((80..=120).contains(&to_a), "{outcome:?}: {split:?}");
        }
    }
}

/// A request for `/` of [`CLUSTER`] through `w` at `now_ns`, without a body.
fn steer_at(w: &mut Worker, now_ns: u64) -> Decision {
    w.route(
        &Request {
            path: b"/",
            cluster: Some(CLUSTER),
            now_ns,
            ..Default::default()
        },
        || None,
    )
}

/// Steers requests at `now_ns` until one is picked for `host` and leaves it in flight there;
/// each request picked for the other host ends served at once.
fn hold_one_at(w: &mut Worker, host: &str, now_ns: u64) {
    loop {
        let Decision::Override(pick) = steer_at(w, now_ns) else {
            panic!("no table")
        };
        if &*pick.host == host {
            return;
        }
        finish_pick(w, &pick.host, 20.0);
    }
}

/// A worker of a cluster of two hosts, `a` and `b`, both measured at 20 ms: 400 requests
/// answered, then ticks until the table holds both latencies. Returns it with its table's
/// summary.
fn two_hosts_measured_at_20_ms(factor: u32) -> (Worker, String) {
    let (a, b) = ("10.0.0.1:80", "10.0.0.2:80");
    let cfg = format!(
        r#"{{"exploration_share": 0, "probe_timeout_factor": {factor},
            "clusters": {{"backend": {{"endpoints": ["{a}", "{b}"]}}}}}}"#
    );
    let (store, mut w) = ticked(&cfg, 7);
    for k in 0..400 {
        let request = Request {
            path: b"/",
            cluster: Some(CLUSTER),
            now_ns: SEC + k * MS,
            ..Default::default()
        };
        ewma_lb::testing::steered_request_by(&mut w, CLUSTER, &request, |_| 20.0);
    }
    for k in 0..10 {
        w.tick(2 * SEC + k * 100 * MS, &mut store.clone());
    }
    let measured = w
        .tables()
        .any(|(c, t)| c == CLUSTER && t.hosts().all(|h| h.latency_ms.is_some()));
    assert!(measured, "{}", w.status_json(&store));
    let summary = w.table_summary(CLUSTER);
    (w, summary)
}

/// A 20-ms answer of `host` at `now_ns`.
fn answered_at(host: &str, now_ns: u64) -> Finished<'_> {
    Finished {
        served_by: Some(host),
        attempts: 1,
        latency_ms: 20.0,
        ended_ns: now_ns,
        outcome: Some(Outcome::Success),
        ..Finished::default()
    }
}

/// Two hosts measured at 20 ms (`two_hosts_measured_at_20_ms`), with one request of a and
/// `b_holds` of b left in flight from 3 s; `held` ms later b answers another, and a too when
/// `a_answered`. Returns how many of the next 200 requests, each answered at once, go to a, with
/// the table's summary.
fn to_a_after_a_wait(factor: u32, b_holds: u32, held: u64, a_answered: bool) -> (u32, String) {
    let (a, b) = ("10.0.0.1:80", "10.0.0.2:80");
    let (mut w, summary) = two_hosts_measured_at_20_ms(factor);
    let start = 3 * SEC;
    hold_one_at(&mut w, a, start);
    for _ in 0..b_holds {
        hold_one_at(&mut w, b, start);
    }
    let now = start + held * MS;
    w.finish(CLUSTER, &answered_at(b, now));
    if a_answered {
        w.finish(CLUSTER, &answered_at(a, now));
    }
    (picks_of(&mut w, a, now), summary)
}

/// How many of 200 requests at `now_ns`, each answered at once, go to `host`.
fn picks_of(w: &mut Worker, host: &str, now_ns: u64) -> u32 {
    let mut picked = 0;
    for _ in 0..200 {
        let Decision::Override(pick) = steer_at(w, now_ns) else {
            panic!("no table")
        };
        picked += u32::from(&*pick.host == host);
        finish_pick(w, &pick.host, 20.0);
    }
    picked
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_holding_a_request_past_its_patience_gets_no_other_until_it_answers() {
    // Two hosts measured at 20 ms, so a host's patience is 4 x 20 = 80 ms. At 3 s, a is sent a
    // request and b two, left in flight; `held` ms later b answers another, and 200 requests
    // follow, each served at once. With fewer in flight a wins every comparison, unless it has
    // kept its request for its patience: then it gets none, until it answers anything. With the
    // probe's factor at 0 nothing is ever overdue.
    // (ms since a was sent its request, whether a answered another just then, the factor,
    // whether a is left out of the 200)
    let cases = [
        (40, false, 4, false),
        (100, false, 4, true),
        (100, true, 4, false),
        (100, false, 0, false),
    ];
    for (held, answered, factor, left_out) in cases {
        let (to_a, summary) = to_a_after_a_wait(factor, 2, held, answered);
        let case = (held, answered, factor);
        match left_out {
            true => assert_eq!(to_a, 0, "{case:?}: {summary}"),
            false => assert!(to_a >= 180, "{case:?}: {to_a} of 200; {summary}"),
        }
    }
}

/// At equal counts the host kept waiting longer than it usually takes loses (`pick`): a and b
/// hold a request each from 3 s; `held` ms later b answers another, so only a can be late. Two
/// hosts measured alike are within a noise step of each other, so until a is late they take
/// turns.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn at_equal_counts_the_host_kept_waiting_past_its_usual_latency_loses() {
    // (ms since a was sent its request, whether a answered another just then, whether a is
    // left out of the 200)
    let cases = [(10, false, false), (40, false, true), (40, true, false)];
    for (held, answered, left_out) in cases {
        let (to_a, summary) = to_a_after_a_wait(4, 1, held, answered);
        let case = (held, answered);
        match left_out {
            true => assert_eq!(to_a, 0, "{case:?}: {summary}"),
            false => assert!(
                (60..=140).contains(&to_a),
                "{case:?}: {to_a} of 200; {summary}"
            ),
        }
    }
}

/// A host whose last request failed stays tracked (its probes back off) while the table lists
/// it, and not once the table forgets it: a cluster whose hosts fail as they leave (a rolling
/// restart) does not grow this worker's state.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_that_failed_as_it_left_is_not_tracked_once_the_table_forgets_it() {
    let store = Shared::default();
    let mut w = Worker::new(
        config(r#"{"host_ttl_ms": 1000, "exploration_share": 0}"#),
        3,
    );
    let (a, b) = ("10.0.0.1:80", "10.0.0.2:80");
    let mut t = SEC;
    for _ in 0..5 {
        finish_ok(&mut w, a, 20.0);
        finish_ok(&mut w, b, 20.0);
        w.tick(t, &mut store.clone());
        t += SEC / 10;
    }
    steer_until_picked(&mut w, b);
    end_picked(&mut w, b, Outcome::ConnectFailure);
    w.tick(t, &mut store.clone());
    assert_eq!(w.hosts_tracked(CLUSTER), 1, "b, listed and failing");
    // Only a answers from now on: b is forgotten after host_ttl_ms.
    for _ in 0..30 {
        t += SEC / 10;
        finish_ok(&mut w, a, 20.0);
        w.tick(t, &mut store.clone());
    }
    assert!(w.tables().all(|(_, table)| table.host(b).is_none()));
    assert_eq!(w.hosts_tracked(CLUSTER), 0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_header_names_a_different_host_for_the_retry() {
    let cfg = r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let (_, mut w) = ticked(cfg, 1);
    for _ in 0..100 {
        let Decision::Override(pick) = steer(&mut w) else {
            panic!("no table")
        };
        let value = header_value(&pick);
        let parts: Vec<&str> = value.split(',').collect();
        assert_eq!(parts.len(), 2, "{value}");
        assert_eq!(parts[0], &*pick.host);
        assert_ne!(parts[0], parts[1]);
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_exploration_share_is_left_to_the_fallback() {
    let cfg =
        r#"{"exploration_share": 0.2, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let (_, mut w) = ticked(cfg, 9);
    let explored = (0..10_000)
        .filter(|_| steer(&mut w) == Decision::Fallback(FallbackReason::Exploring))
        .count();
    assert!((1800..2200).contains(&explored), "{explored}");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_unreadable_record_is_rebuilt_reported_once_and_counted() {
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    let garbage = || {
        store
            .0
            .borrow_mut()
            .data
            .insert(w.record_key(CLUSTER), (b"garbage".to_vec(), 7))
    };
    garbage();
    finish_ok(&mut w, "10.0.0.1:80", 5.0);
    let report = w.tick(SEC, &mut store.clone());
    assert!(report.errors.is_empty());
    assert_eq!(
        report.bad_records.len(),
        1,
        "reported: {:?}",
        report.bad_records
    );
    assert!(report.metrics.contains(&Update {
        metric: Metric::SharedRecordErrors,
        cluster: CLUSTER.into(),
        label: None,
        change: Change::Add(1)
    }));
    assert_eq!(
        store.record_of(CLUSTER).hosts.len(),
        1,
        "rebuilt with this tick's samples"
    );
    let garbage = || {
        store
            .0
            .borrow_mut()
            .data
            .insert(w.record_key(CLUSTER), (b"garbage".to_vec(), 7))
    };
    garbage();
    // The record is read by the refresh, once an interval (250 ms at the defaults).
    let again = w.tick(SEC + SEC / 2, &mut store.clone());
    assert!(again.bad_records.is_empty(), "logged once");
    assert!(
        again
            .metrics
            .iter()
            .any(|u| u.metric == Metric::SharedRecordErrors),
        "counted every time"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_pick_that_needed_a_retry_counts_as_its_failure() {
    let cfg = r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let retried = Finished {
        picked: Some("10.0.0.1:80"),
        in_flight: true,
        served_by: Some("10.0.0.2:80"),
        attempts: 2,
        latency_ms: 60.0,
        outcome: Some(Outcome::Success),
        ..Finished::default()
    };
    for _ in 0..3 {
        w.finish(CLUSTER, &retried);
    }
    w.tick(SEC + SEC / 5, &mut store.clone());
    let state = store.record_of(CLUSTER);
    let dead = state.host("10.0.0.1:80").cloned().unwrap_or_default();
    assert!(
        dead.health.is_ejected(SEC + SEC / 5),
        "three failed connections eject: {dead:?}"
    );
    assert_eq!(
        state
            .host("10.0.0.2:80")
            .map(|h| h.health.consecutive_failures),
        Some(0)
    );
    // A pick the override could not honour (the host left the cluster) is not a failure.
    let mut w = Worker::new(config(cfg), 2);
    w.finish(
        CLUSTER,
        &Finished {
            attempts: 1,
            ..retried
        },
    );
    assert_eq!(w.in_flight(CLUSTER, "10.0.0.1:80"), 0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn routes_follow_the_path_rules() {
    let store = Shared::default();
    let cfg = r#"{"exploration_share": 0, "excluded_paths": {"prefix": ["/stream/"]},
                 "management": {"allowed_cidrs": ["10.1.0.0/16"]},
                 "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let mut w = Worker::new(config(cfg), 1);
    w.tick(SEC, &mut store.clone());
    let request = |path: &'static str| Request {
        path: path.as_bytes(),
        cluster: Some(CLUSTER),
        now_ns: 0,
        body_pending: false,
    };
    let cases: &[(&str, &str, Decision)] = &[
        (
            "/health",
            "192.0.2.1:5000",
            Decision::Fallback(FallbackReason::HealthPath),
        ),
        (
            "/actuator/health/liveness",
            "192.0.2.1:5000",
            Decision::Fallback(FallbackReason::HealthPath),
        ),
        ("/actuator/prometheus", "192.0.2.1:5000", Decision::Deny),
        ("/actuator/health/../env", "192.0.2.1:5000", Decision::Deny),
        (
            "/actuator/prometheus",
            "10.1.2.3:5000",
            Decision::Fallback(FallbackReason::Management),
        ),
        (
            "/stream/events?x=1",
            "192.0.2.1:5000",
            Decision::Fallback(FallbackReason::Excluded),
        ),
    ];
    for (path, source, want) in cases {
        assert_eq!(
            &w.route(&request(path), || Some(source.to_string())),
            want,
            "{path} from {source}"
        );
    }
    let business = w.route(&request("/orders/1"), || {
        panic!("the client address is read for guarded paths only")
    });
    assert!(matches!(business, Decision::Override(_)));
    // Bytes that are not UTF-8 (an HTTP/2 client can send them): routed like any other path.
    let raw = |path: &'static [u8]| Request {
        path,
        cluster: Some(CLUSTER),
        now_ns: 0,
        body_pending: false,
    };
    assert!(matches!(
        w.route(&raw(b"/x?\xff"), || None),
        Decision::Override(_)
    ));
    assert_eq!(
        w.route(&raw(b"/%2561ctuator/env%FF"), || Some("192.0.2.1:1".into())),
        Decision::Deny
    );
    assert_eq!(
        w.route(&raw(b"/actuator/health%FF/..%2Fenv"), || Some(
            "192.0.2.1:1".into()
        )),
        Decision::Deny
    );
    let no_cluster = Request {
        path: b"/orders/1",
        ..Request::default()
    };
    assert_eq!(
        w.route(&no_cluster, || None),
        Decision::Fallback(FallbackReason::NoCluster)
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn shadow_mode_samples_but_never_overrides() {
    let cfg = r#"{"shadow": true, "exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let request = Request {
        path: b"/orders",
        cluster: Some(CLUSTER),
        now_ns: 0,
        body_pending: false,
    };
    let decision = w.route(&request, || None);
    assert_eq!(decision, Decision::Fallback(FallbackReason::Shadow));
    assert!(decision.is_sampled());
    finish_ok(&mut w, "10.0.0.1:80", 40.0);
    w.tick(2 * SEC, &mut store.clone());
    assert_eq!(
        store
            .record_of(CLUSTER)
            .host("10.0.0.1:80")
            .map(|h| h.latency.samples()),
        Some(1)
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_status_document_is_guarded_and_describes_the_table() {
    let store = Shared::default();
    let cfg = r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let mut w = Worker::new(config(cfg), 1);
    finish_ok(&mut w, "10.0.0.1:80", 40.0);
    w.tick(SEC, &mut store.clone());
    let status = Request {
        path: b"/ewma-lb/status?x=1",
        cluster: Some(CLUSTER),
        now_ns: 0,
        body_pending: false,
    };
    assert_eq!(
        w.route(&status, || Some("203.0.113.9:1".into())),
        Decision::Deny
    );
    assert_eq!(
        w.route(&status, || Some("127.0.0.1:1".into())),
        Decision::Status
    );
    w.clock(SEC + 500_000_000);
    let status: serde_json::Value = serde_json::from_str(&w.status_json(&store.clone())).unwrap();
    let cluster = &status["clusters"][0];
    assert_eq!(cluster["cluster"], "backend");
    assert_eq!(cluster["refreshed_ms_ago"], 500);
    let hosts = cluster["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2);
    assert_eq!(hosts[0]["host"], "10.0.0.1:80");
    assert_eq!(hosts[0]["latency_ms"], 40.0);
    assert_eq!(hosts[0]["samples"], 1);
    assert_eq!(hosts[0]["state"], "warming");
    assert!(hosts[1]["latency_ms"].is_null());
    let total: f64 = hosts.iter().map(|h| h["weight"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-9);
}

/// The counter and gauge changes of a tick, as `(metric, label, change)`.
fn changes(updates: &[Update]) -> Vec<(Metric, Option<String>, Change)> {
    updates
        .iter()
        .map(
            |Update {
                 metric,
                 label,
                 change,
                 ..
             }| (*metric, label.as_deref().map(str::to_owned), *change),
        )
        .collect()
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn decisions_are_counted_and_handed_over_once() {
    let cfg = r#"{"exploration_share": 0, "management": {"allowed_cidrs": ["10.1.0.0/16"]},
                 "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let business = Request {
        path: b"/orders",
        cluster: Some(CLUSTER),
        now_ns: 0,
        body_pending: false,
    };
    for _ in 0..3 {
        w.route(&business, || None);
    }
    w.route(
        &Request {
            path: b"/health",
            cluster: Some(CLUSTER),
            now_ns: 0,
            body_pending: false,
        },
        || None,
    );
    w.route(
        &Request {
            path: b"/actuator/env",
            cluster: Some(CLUSTER),
            now_ns: 0,
            body_pending: false,
        },
        || Some("192.0.2.1:1".into()),
    );
    w.route(
        &Request {
            path: b"/orders",
            cluster: None,
            now_ns: 0,
            body_pending: false,
        },
        || None,
    );
    // A pick the host refused to apply is neither steered nor in flight.
    let Decision::Override(refused) = w.route(&business, || None) else {
        panic!("no table")
    };
    w.cancel(CLUSTER, &refused, true);
    let report = w.tick(2 * SEC, &mut store.clone());
    let counters: Vec<(Metric, String, Option<String>, Change)> = report
        .metrics
        .iter()
        .filter(|u| u.metric.kind() == ewma_lb::worker::telemetry::MetricKind::Counter)
        .map(|u| {
            (
                u.metric,
                u.cluster.to_string(),
                u.label.as_deref().map(str::to_owned),
                u.change,
            )
        })
        .collect();
    let want = vec![
        (
            Metric::SteeredRequests,
            CLUSTER.to_string(),
            None,
            Change::Add(3),
        ),
        (
            Metric::ManagementDeniedRequests,
            CLUSTER.to_string(),
            None,
            Change::Add(1),
        ),
        (
            Metric::FallbackRequests,
            CLUSTER.to_string(),
            Some("health_path".to_string()),
            Change::Add(1),
        ),
        (
            Metric::FallbackRequests,
            "none".to_string(),
            Some("no_cluster".to_string()),
            Change::Add(1),
        ),
    ];
    assert_eq!(counters, want);
    let again = w.tick(3 * SEC, &mut store.clone());
    assert!(
        again
            .metrics
            .iter()
            .all(|u| u.metric.kind() != ewma_lb::worker::telemetry::MetricKind::Counter),
        "{:?}",
        again.metrics
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_in_flight_gauge_moves_by_this_workers_change_since_the_last_tick() {
    let cfg =
        r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let in_flight = |report: &ewma_lb::worker::TickReport| -> Vec<Change> {
        changes(&report.metrics)
            .into_iter()
            .filter(|(m, _, _)| *m == Metric::HostInFlight)
            .map(|(_, _, c)| c)
            .collect()
    };
    steer(&mut w);
    steer(&mut w);
    assert_eq!(
        in_flight(&w.tick(2 * SEC, &mut store.clone())),
        vec![Change::Add(2)]
    );
    w.finish(
        CLUSTER,
        &Finished {
            picked: Some("10.0.0.1:80"),
            in_flight: true,
            ..Finished::default()
        },
    );
    assert_eq!(
        in_flight(&w.tick(3 * SEC, &mut store.clone())),
        vec![Change::Add(-1)]
    );
    assert_eq!(
        in_flight(&w.tick(4 * SEC, &mut store.clone())),
        vec![],
        "nothing changed"
    );
}

/// Every series a worker moves by deltas is one the metrics adapter never sets when it evicts
/// it (`Metric::moved_by_deltas`): before, evicting the in-flight gauge set it to 0, wiping the
/// other VMs' requests in flight, and their later decrements took Envoy's gauge below zero.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn no_series_moved_by_deltas_is_ever_set() {
    let cfg = r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let mut seen = Vec::new();
    for t in 2..40u64 {
        steer(&mut w);
        finish_ok(&mut w, "10.0.0.1:80", 5.0);
        if t % 3 == 0 {
            w.finish(
                CLUSTER,
                &Finished {
                    picked: Some("10.0.0.2:80"),
                    in_flight: true,
                    ..Finished::default()
                },
            );
        }
        let report = w.tick(t * SEC / 2, &mut store.clone());
        seen.extend(changes(&ewma_lb::testing::tick_updates(&w, &report)));
    }
    assert!(seen
        .iter()
        .any(|(m, _, c)| *m == Metric::HostInFlight && matches!(c, Change::Add(_))));
    for (metric, _, change) in &seen {
        assert_eq!(
            matches!(change, Change::Add(_)),
            metric.moved_by_deltas(),
            "{metric:?} moved by {change:?}"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn adopting_a_table_sets_every_hosts_gauges() {
    let store = Shared::default();
    let mut w = two_endpoints(1);
    let report = w.tick(SEC, &mut store.clone());
    assert_eq!(report.adopted, vec![(CLUSTER.to_string(), 1)]);
    let updates = ewma_lb::testing::tick_updates(&w, &report);
    let weights: Vec<u64> = changes(&updates)
        .into_iter()
        .filter_map(|(m, _, c)| match (m, c) {
            (Metric::HostWeight, Change::Set(ppm)) => Some(ppm),
            _ => None,
        })
        .collect();
    assert_eq!(weights, vec![500_000, 500_000]);
    let ejected = changes(&updates)
        .into_iter()
        .filter(|(m, _, _)| *m == Metric::HostEjected)
        .count();
    assert_eq!(ejected, 2);
    // Another VM adopting the same table leaves the gauges (the process's) as they are.
    let mut other = two_endpoints(2);
    let report = other.tick(SEC + 10 * MS, &mut store.clone());
    assert_eq!(report.adopted, vec![(CLUSTER.to_string(), 1)]);
    let gauges = changes(&ewma_lb::testing::tick_updates(&other, &report))
        .into_iter()
        .filter(|(m, _, _)| {
            matches!(
                m,
                Metric::HostWeight | Metric::HostLatency | Metric::HostEjected
            )
        })
        .count();
    assert_eq!(gauges, 0, "set again by a VM that only adopted the table");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn clusters_outside_steered_clusters_are_left_to_envoy_and_counted() {
    let cfg = r#"{"exploration_share": 0, "steered_clusters": ["back*"],
                 "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let other = Request {
        path: b"/orders",
        cluster: Some("details"),
        now_ns: 0,
        body_pending: false,
    };
    for _ in 0..4 {
        let decision = w.route(&other, || None);
        assert_eq!(
            decision,
            Decision::Fallback(FallbackReason::UnlistedCluster)
        );
        assert!(
            !decision.is_sampled(),
            "a cluster the plugin does not steer is not sampled either"
        );
    }
    assert!(matches!(
        w.route(
            &Request {
                path: b"/orders",
                cluster: Some(CLUSTER),
                now_ns: 0,
                body_pending: false,
            },
            || None
        ),
        Decision::Override(_)
    ));
    // The path rules still hold on any cluster: a management path is guarded there too.
    assert_eq!(
        w.route(
            &Request {
                path: b"/actuator/env",
                cluster: Some("details"),
                now_ns: 0,
                body_pending: false,
            },
            || Some("192.0.2.1:1".into())
        ),
        Decision::Deny
    );
    let report = w.tick(2 * SEC, &mut store.clone());
    let fallback: Vec<(String, Option<String>, Change)> = report
        .metrics
        .iter()
        .filter(|u| u.metric == Metric::FallbackRequests)
        .map(|u| {
            (
                u.cluster.to_string(),
                u.label.as_deref().map(str::to_owned),
                u.change,
            )
        })
        .collect();
    assert_eq!(
        fallback,
        vec![(
            "details".to_string(),
            Some("unlisted_cluster".to_string()),
            Change::Add(4)
        )]
    );
    // No state for it: only the steered cluster has a record.
    let clusters: Vec<&str> = w.tables().map(|(name, _)| name).collect();
    assert_eq!(clusters, vec![CLUSTER]);
}

/// A proxy that routes to many clusters the plugin does not steer (300 here, one a tick) still
/// counts the steered cluster's requests, and every unlisted cluster's fallback too. Before, the
/// first 257 labels took every place of the VM's counters for good: after 300 unlisted clusters
/// the steered cluster's requests were counted nowhere.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn many_unlisted_clusters_never_starve_a_steered_ones_counters() {
    let cfg =
        r#"{"exploration_share": 0, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 1);
    let request = |w: &mut Worker, cluster: &str| {
        w.route(
            &Request {
                path: b"/",
                cluster: Some(cluster),
                ..Default::default()
            },
            || None,
        )
    };
    let mut unlisted_counted = 0;
    for i in 0..300u64 {
        let name = format!("other-{i}");
        request(&mut w, &name);
        let report = w.tick((2 + i) * SEC / 10, &mut store.clone());
        unlisted_counted += report
            .metrics
            .iter()
            .filter(|u| u.metric == Metric::FallbackRequests && *u.cluster == *name)
            .count();
    }
    assert_eq!(unlisted_counted, 300);
    for _ in 0..5 {
        request(&mut w, CLUSTER);
    }
    let report = w.tick(40 * SEC, &mut store.clone());
    let steered: Vec<Change> = report
        .metrics
        .iter()
        .filter(|u| u.metric == Metric::SteeredRequests && &*u.cluster == CLUSTER)
        .map(|u| u.change)
        .collect();
    assert_eq!(steered, vec![Change::Add(5)]);
}

/// Two listeners on one `vm_id` share the VMs' shared data. Configurations that differ in static
/// endpoints, `failure_penalty_ms`, `latency_ceiling_ms` or the gRPC failure codes keep separate
/// records: each listener's table holds its own static hosts. Before, their records shared a key
/// (the fingerprint covered only the policy), and each refresh dropped the other's hosts.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn listeners_that_differ_outside_the_policy_keep_separate_records() {
    let a = r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#;
    let pairs = [
        (
            a,
            r#"{"clusters": {"backend": {"endpoints": ["10.0.0.2:80"]}}}"#,
        ),
        (
            a,
            r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}, "failure_penalty_ms": 2000}"#,
        ),
        (
            a,
            r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}, "latency_ceiling_ms": 5000}"#,
        ),
        (
            a,
            r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}, "grpc_failure_status_codes": ["INTERNAL"]}"#,
        ),
    ];
    for (one, other) in pairs {
        let store = Shared::default();
        let mut first = Worker::new(config(one), 1);
        let mut second = Worker::new(config(other), 2);
        assert_ne!(
            first.record_key(CLUSTER),
            second.record_key(CLUSTER),
            "{other}"
        );
        for t in 1..=10u64 {
            first.tick(t * SEC / 2, &mut store.clone());
            second.tick(t * SEC / 2, &mut store.clone());
        }
        let hosts = |w: &Worker| -> Vec<String> {
            let mut h: Vec<String> = store
                .record(&w.record_key(CLUSTER))
                .hosts
                .iter()
                .map(|h| h.address.clone())
                .collect();
            h.sort();
            h
        };
        assert_eq!(hosts(&first), vec!["10.0.0.1:80"], "{other}");
    }
    // The same configuration written twice is one record.
    let (x, y) = (Worker::new(config(a), 1), Worker::new(config(a), 2));
    assert_eq!(x.record_key(CLUSTER), y.record_key(CLUSTER));
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_grpc_status_decides_what_a_200_was() {
    use ewma_lb::balance::outcome::GrpcCode;
    let grpc = |w: &mut Worker, status: GrpcCode| {
        let done = Finished {
            served_by: Some("10.0.0.1:80"),
            attempts: 1,
            latency_ms: 1.0,
            outcome: Some(Outcome::Success),
            grpc_status: Some(status),
            ..Finished::default()
        };
        w.finish(CLUSTER, &done);
    };
    // What the shared record says of the host after `calls` calls answered `status` in 1 ms.
    let after = |cfg: &str, status: GrpcCode, calls: usize| {
        let store = Shared::default();
        let mut w = Worker::new(config(cfg), 1);
        for _ in 0..calls {
            grpc(&mut w, status);
        }
        w.tick(SEC, &mut store.clone());
        let h = store
            .record_of(CLUSTER)
            .host("10.0.0.1:80")
            .cloned()
            .unwrap();
        (
            h.latency.samples(),
            h.latency.value_ms().unwrap_or(0.0),
            h.health.consecutive_failures,
        )
    };
    // UNAVAILABLE in 1 ms is a failure at the penalty latency, not the fastest host.
    assert_eq!(after("{}", GrpcCode::Unavailable, 3), (3, 1000.0, 3));
    assert_eq!(after("{}", GrpcCode::NotFound, 3), (3, 1.0, 0));
    // Unless the operator says it is not a failure.
    assert_eq!(
        after(
            r#"{"grpc_failure_status_codes": ["INTERNAL"]}"#,
            GrpcCode::Unavailable,
            3
        ),
        (3, 1.0, 0)
    );
    // CANCELLED is no sample at all.
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    grpc(&mut w, GrpcCode::Cancelled);
    finish_ok(&mut w, "10.0.0.2:80", 5.0);
    w.tick(SEC, &mut store.clone());
    assert!(
        store
            .record_of(CLUSTER)
            .host("10.0.0.1:80")
            .is_none_or(|h| h.latency.samples() == 0),
        "{:?}",
        store.record_of(CLUSTER)
    );
}

/// Once the record knows every endpoint Envoy counts, nothing is left to the fallback: probes,
/// not a share of all requests, keep the known hosts measured.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn nothing_is_explored_once_every_endpoint_is_known() {
    let cfg = r#"{"exploration_share": 0.2, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let (store, mut w) = ticked(cfg, 9);
    let explored = |w: &mut Worker| {
        (0..2_000)
            .filter(|_| steer(w) == Decision::Fallback(FallbackReason::Exploring))
            .count()
    };
    // Envoy has not said how many endpoints there are: the configured share.
    assert!((300..500).contains(&explored(&mut w)));
    let done = Finished {
        picked: None,
        served_by: Some("10.0.0.1:80"),
        attempts: 1,
        latency_ms: 20.0,
        outcome: Some(Outcome::Success),
        num_endpoints: Some(2),
        ..Finished::default()
    };
    w.finish(CLUSTER, &done);
    w.tick(2 * SEC, &mut store.clone());
    assert_eq!(explored(&mut w), 0);
}

/// A host the table sends nothing (at the floor: a hundred times slower than the other) gets a
/// request once per probe interval times the workers that serve the cluster, and only when it
/// has nothing in flight from this worker; the cluster's probes do not grow with the traffic.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_out_of_favour_is_probed_by_time_shared_by_the_workers() {
    let cfg = r#"{"exploration_share": 0, "persistence_ms": 0, "weights": {"slow_start_ms": 0}, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    // 1,000 requests a second per worker; the slow host answers in 400 ms, the other in 4.
    let probes = late_requests(cfg, 40, 100, "10.0.0.2:80", [4.0, 400.0]);
    // Over the last 40 s: 100 times slower, so every 3 probe intervals (1 s each, the most) for
    // the cluster, two workers sharing it: each worker every 6 s, about 13 in all. The old 0.2 %
    // floor sent it 160.
    let total: usize = probes.iter().sum();
    assert!((10..=16).contains(&total), "{probes:?}");
    assert!(probes.iter().all(|n| *n >= 1), "{probes:?}");
}

/// A host that answers nothing (each request waits until its client gives up) is probed a
/// quarter as often as one that answers slowly: each request in a row it did not serve, beyond
/// the first, doubles the wait, up to 4 times.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_that_answers_nothing_is_probed_a_quarter_as_often() {
    let cfg = r#"{"exploration_share": 0, "persistence_ms": 0, "weights": {"slow_start_ms": 0}, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let hung = "10.0.0.2:80";
    let served: usize = late_requests_ending(cfg, 40, 100, hung, [4.0, 400.0], Outcome::Success)
        .iter()
        .sum();
    let unanswered: usize =
        late_requests_ending(cfg, 40, 100, hung, [4.0, 1_000.0], Outcome::Abandoned)
            .iter()
            .sum();
    // Over the last 40 s: probed every 3 probe intervals for the cluster, shared by two
    // workers, when its probes are served (about 13); 4 times that apart when they are not:
    // each worker every 24 s, one or two each.
    assert!((10..=16).contains(&served), "{served}");
    assert!((2..=4).contains(&unanswered), "{unanswered}");
}

/// A host whose share settles just above the floor is probed like one at it: the pick draws a
/// host by its share above the floor, and with a twentieth of a floor above it a host gets a
/// request every few tens of seconds, so its recovery goes unseen.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_just_above_the_floor_is_probed() {
    // Four hosts at 10 ms and one at 40: with exponent 2 its share is 1/65 = 0.01538, and the
    // floor (`min_share`) 0.0146 leaves it 0.0008 above it.
    let cfg = r#"{"exploration_share": 0, "persistence_ms": 0,
        "weights": {"slow_start_ms": 0, "exponent": 2, "min_share": 0.0146, "noise_gain": 1},
        "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80"]}}}"#;
    // 50 requests a second per worker.
    let late: usize = late_requests(cfg, 60, 5, "10.0.0.5:80", [10.0, 40.0])
        .iter()
        .sum();
    // Over the last 40 s: probed every 2 intervals (4 times slower than the traffic's average,
    // a square root of 2) of 1 s, for two workers: each worker every 4 s, 20 in all. The pick
    // alone sent it 3.
    assert!((14..=30).contains(&late), "{late}");
}

/// Two workers (seeds `seed`, `seed + 1`) over one store for 60 s, ticking every 100 ms and
/// routing `per_tick` requests between ticks; `slow` answers in `latency[1]` ms, the others in
/// `latency[0]`. Returns how many requests each worker sent `slow` over the last 40 s.
fn late_requests(cfg: &str, seed: u64, per_tick: u64, slow: &str, latency: [f64; 2]) -> Vec<usize> {
    late_requests_ending(cfg, seed, per_tick, slow, latency, Outcome::Success)
}

/// [`late_requests`], the requests to `slow` ending with `outcome`.
fn late_requests_ending(
    cfg: &str,
    seed: u64,
    per_tick: u64,
    slow: &str,
    latency: [f64; 2],
    outcome: Outcome,
) -> Vec<usize> {
    late_requests_with(cfg, seed, per_tick, slow, latency[0], |w, _| {
        end_picked_after(w, slow, latency[1], outcome);
    })
    .0
}

/// [`late_requests`], each request to `slow` ended by `end`; also returns the shared store.
fn late_requests_with(
    cfg: &str,
    seed: u64,
    per_tick: u64,
    slow: &str,
    latency_ms: f64,
    end: impl Fn(&mut Worker, &Pick),
) -> (Vec<usize>, Shared) {
    let store = Shared::default();
    let mut workers: Vec<Worker> = (0..2).map(|i| Worker::new(config(cfg), seed + i)).collect();
    let mut late = vec![0usize; 2];
    for tick in 1..=600u64 {
        for (k, w) in workers.iter_mut().enumerate() {
            let t0 = tick * 100 * MS;
            for r in 0..per_tick {
                let now = w.clock(t0 + r * 100 * MS / per_tick);
                let Decision::Override(pick) = w.route(
                    &Request {
                        path: b"/",
                        cluster: Some(CLUSTER),
                        now_ns: now,
                        body_pending: false,
                    },
                    || None,
                ) else {
                    continue;
                };
                let is_slow = &*pick.host == slow;
                if is_slow && tick > 200 {
                    late[k] += 1;
                }
                if is_slow {
                    end(w, &pick);
                } else {
                    finish_pick(w, &pick.host, latency_ms);
                }
            }
            w.tick(t0 + 100 * MS, &mut store.clone());
        }
    }
    (late, store)
}

/// A probe the alternative answered first, after the probe's wait, tells that the host is at
/// least that slow: no failure, no backoff (a hung host is probed as often as a slow one, since
/// its probes cost no request), and no sample below what the table holds of it (a hung host does
/// not drift towards the wait). The wait is `probe_timeout_factor` times the table's average.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_probe_answered_elsewhere_after_its_wait_is_a_slow_answer_not_a_failure() {
    let cfg = r#"{"exploration_share": 0, "persistence_ms": 0, "weights": {"slow_start_ms": 0}, "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let hung = "10.0.0.2:80";
    let waits = std::cell::RefCell::new(Vec::new());
    // The hung host's requests: those the pick sent wait until the client gives up (1 s); its
    // probes go to the alternative as well after their wait, and it answers 4 ms later.
    let end = |w: &mut Worker, pick: &Pick| match pick.probe_timeout_ms {
        Some(wait) => {
            waits.borrow_mut().push(wait);
            let done = Finished {
                picked: Some(hung),
                in_flight: true,
                served_by: pick.alternative.as_deref(),
                attempts: 2,
                latency_ms: f64::from(wait) + 4.0,
                outcome: Some(Outcome::Success),
                num_endpoints: Some(2),
                probe_timeout_ms: Some(wait),
                ..Finished::default()
            };
            w.finish(CLUSTER, &done);
        }
        None => end_picked_after(w, hung, 1_000.0, Outcome::Abandoned),
    };
    let (late, store) = late_requests_with(cfg, 40, 100, hung, 4.0, end);
    // Probed as often as a host whose probes are served (the test above: about 13 over the
    // last 40 s), not a quarter as often.
    let total: usize = late.iter().sum();
    assert!((10..=16).contains(&total), "{late:?}");
    // Each wait: 4 times the table's average, the other host's 4 ms and the floor's share of
    // the hung host's second.
    let waits = waits.into_inner();
    assert!(waits.len() >= total, "{waits:?}");
    assert!(waits.iter().all(|w| (16..=30).contains(w)), "{waits:?}");
    let record = store.record_of(CLUSTER);
    let h = record.host(hung).unwrap();
    assert!(h.latency.value_ms().unwrap() >= 900.0, "{h:?}");
    assert_eq!(h.health.consecutive_failures, 0, "{h:?}");
    // The alternative kept its own latency.
    let other = record.host("10.0.0.1:80").unwrap();
    assert!(other.latency.value_ms().unwrap() < 5.0, "{other:?}");
}

/// Envoy is told to hedge a probe only where the request may be sent twice, and the request's
/// own retry conditions are kept.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_probe_is_hedged_only_where_a_request_may_be_sent_twice() {
    let pick = |wait: Option<u32>| Pick {
        host: "10.0.0.2:80".into(),
        alternative: Some("10.0.0.1:80".into()),
        probe: true,
        probe_timeout_ms: wait,
        table_version: 1,
    };
    let hedged = |wait: &str, on: &str| Some((wait.to_owned(), on.to_owned()));
    // A request: its method, whether it has a body, its own x-envoy-retry-on, whether it sets
    // its own per-try timeout.
    type Request = (&'static str, bool, Option<&'static str>, bool);
    type Headers = Option<(String, String)>;
    let get: Request = ("GET", false, None, false);
    let cases: [(Option<u32>, Request, Headers); 9] = [
        (Some(20), get, hedged("20", "reset")),
        (
            Some(20),
            ("HEAD", false, None, false),
            hedged("20", "reset"),
        ),
        (
            Some(20),
            ("OPTIONS", false, None, false),
            hedged("20", "reset"),
        ),
        (
            Some(7),
            ("GET", false, Some("5xx"), false),
            hedged("7", "5xx,reset"),
        ),
        (
            Some(20),
            ("GET", false, Some(" "), false),
            hedged("20", "reset"),
        ),
        (None, get, None),
        (Some(20), ("POST", false, None, false), None),
        (Some(20), ("GET", true, None, false), None),
        (Some(20), ("GET", false, None, true), None),
    ];
    for (wait, (method, body, retry_on, own), want) in cases {
        let got = pick(wait).probe_hedge(method.as_bytes(), body, retry_on.map(str::as_bytes), own);
        assert_eq!(
            got, want,
            "{wait:?} {method} body={body} {retry_on:?} own={own}"
        );
    }
    // Conditions that are not text could not be kept: the request is left as the client sent
    // it, not hedged on `reset` alone.
    assert_eq!(
        pick(Some(20)).probe_hedge(b"GET", false, Some(b"5xx,\xff"), false),
        None
    );
}

const HOST: &str = "10.0.0.1:80";

/// The key of `kind` (`head`, `slot0`, ...) of [`CLUSTER`] for `w`'s configuration.
fn key_of(w: &Worker, kind: &str) -> String {
    w.record_key(CLUSTER)
        .replace(".cluster.", &format!(".{kind}."))
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_batch_written_after_the_refresher_collected_is_folded_next_time() {
    use ewma_lb::record::state::Accumulator;
    use ewma_lb::record::sync::{decode_slot, encode_slot, SlotBatch};
    let store = Shared::default();
    let mut workers: Vec<Worker> = (0..2).map(|i| Worker::new(defaults(), i)).collect();
    let mut recorded = 0;
    for t in 1..=5u64 {
        for w in &mut workers {
            finish_ok(w, HOST, 50.0);
            recorded += 1;
            w.tick(t * SEC / 10, &mut store.clone());
        }
    }
    // Worker 1 writes a batch of 7 into its slot (slot1) right after the refresher read it.
    store.0.borrow_mut().after_read_of = Some((
        ".slot1.".into(),
        Box::new(|data| {
            let key = data.keys().find(|k| k.contains(".slot1.")).unwrap().clone();
            let (bytes, version) = data.get(&key).unwrap().clone();
            let mut slot = decode_slot(&bytes).unwrap();
            slot.seq += 1;
            let mut acc = Accumulator::default();
            for _ in 0..7 {
                acc.record(50.0, false, 1000.0);
            }
            slot.batches.push(SlotBatch {
                seq: slot.seq,
                at_ns: slot.written_ns,
                num_endpoints: None,
                hosts: vec![(HOST.to_owned(), acc)],
            });
            data.insert(key, (encode_slot(&slot), version + 1));
        }),
    ));
    finish_ok(&mut workers[0], HOST, 50.0);
    recorded += 1;
    let report = workers[0].tick(SEC, &mut store.clone());
    assert_eq!(report.refreshed, 1, "a refresh was due");
    assert!(
        store.0.borrow().after_read_of.is_none(),
        "the refresher read slot1"
    );
    assert_eq!(samples(&store, HOST), recorded, "not yet collected");
    for t in 11..=20u64 {
        for w in &mut workers {
            w.tick(t * SEC / 10, &mut store.clone());
        }
    }
    assert_eq!(samples(&store, HOST), recorded + 7, "folded once, not lost");
}

/// Ticks `w` from `from` to `to` (steps of 100 ms), recording one sample per tick; returns how
/// many.
fn run(w: &mut Worker, store: &Shared, from: u64, to: u64, traffic: bool) -> u64 {
    let mut recorded = 0;
    let mut t = from;
    while t <= to {
        if traffic {
            finish_ok(w, HOST, 50.0);
            recorded += 1;
        }
        w.tick(t, &mut store.clone());
        t += SEC / 10;
    }
    recorded
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_refresher_that_dies_before_or_after_writing_the_record_is_redone_once() {
    // Died after the record, before the head (writes: lease, record, head): the record says
    // which batches it holds, so the next refresher folds none twice. Died before the record:
    // nothing changed, the next one does it all.
    for (dies_at, key) in [("head", ".head."), ("record", ".cluster.")] {
        let store = Shared::default();
        let mut a = Worker::new(defaults(), 1);
        let mut b = Worker::new(defaults(), 2);
        let mut recorded = 0;
        for t in 1..=5u64 {
            for w in [&mut a, &mut b] {
                finish_ok(w, HOST, 50.0);
                recorded += 1;
                w.tick(t * SEC / 10, &mut store.clone());
            }
        }
        let mut writes = 0;
        let head_write = if dies_at == "head" { 2 } else { 1 };
        store.0.borrow_mut().refuse = Some(Box::new(move |k: &str| {
            writes += usize::from(k.contains(key));
            k.contains(key) && writes == head_write
        }));
        finish_ok(&mut a, HOST, 50.0);
        recorded += 1;
        let report = a.tick(SEC, &mut store.clone());
        assert!(!report.errors.is_empty(), "{dies_at}: the refresh failed");
        store.0.borrow_mut().refuse = None;
        // `a` is gone; `b` goes on once the lease has run out.
        let before = samples(&store, HOST);
        recorded += run(&mut b, &store, SEC, 4 * SEC, true);
        assert!(samples(&store, HOST) > before, "{dies_at}: b refreshed");
        run(&mut b, &store, 4 * SEC + SEC / 10, 5 * SEC, false);
        assert_eq!(samples(&store, HOST), recorded, "{dies_at}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_refresher_that_dies_between_the_record_and_the_table_is_followed_by_a_table_every_vm_adopts() {
    // Writes of a fold: lease, record, table, head. The record of the new version (a host
    // joined) is written, the table not: the next refresher finds a record newer than the head
    // and publishes its table.
    let store = Shared::default();
    let mut a = Worker::new(defaults(), 1);
    let mut b = Worker::new(defaults(), 2);
    let newcomer = "10.0.0.2:80";
    for t in 1..=5u64 {
        for w in [&mut a, &mut b] {
            finish_ok(w, HOST, 50.0);
            w.tick(t * SEC / 10, &mut store.clone());
        }
    }
    store.0.borrow_mut().refuse = Some(Box::new(|k: &str| k.contains(".table.")));
    finish_ok(&mut a, newcomer, 50.0);
    let report = a.tick(6 * SEC / 10, &mut store.clone());
    assert!(!report.errors.is_empty(), "the refresh failed");
    store.0.borrow_mut().refuse = None;
    assert!(
        store.record_of(CLUSTER).host(newcomer).is_some(),
        "the record has it"
    );
    let knows = |w: &Worker| w.tables().any(|(_, t)| t.host(newcomer).is_some());
    assert!(!knows(&a) && !knows(&b), "no table has it yet");
    // `a` is gone; `b` goes on once the lease has run out.
    run(&mut b, &store, 7 * SEC / 10, 3 * SEC, true);
    assert!(knows(&b), "b adopted the table with the newcomer");
    let mut c = Worker::new(defaults(), 3);
    run(&mut c, &store, 3 * SEC, 3 * SEC + SEC / 10, true);
    assert!(knows(&c), "a VM joining reads it");
}

/// A store that remembers every key read.
struct Reads {
    store: Shared,
    keys: std::cell::RefCell<Vec<String>>,
}

impl ewma_lb::record::sync::SharedStore for Reads {
    fn get(
        &self,
        key: &str,
    ) -> Result<(Option<Vec<u8>>, Option<u32>), ewma_lb::record::sync::StoreError> {
        self.keys.borrow_mut().push(key.to_owned());
        self.store.get(key)
    }

    fn set(
        &mut self,
        key: &str,
        value: &[u8],
        cas: Option<u32>,
    ) -> Result<(), ewma_lb::record::sync::StoreError> {
        self.store.set(key, value, cas)
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_vm_adopting_tables_reads_the_table_never_the_record() {
    // `a` folds every refresh (it folded last and ticks right when one is due), and its
    // latencies move the shares: every refresh is a new table. `b` has sampled once and only adopts.
    let cfg = r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let store = Shared::default();
    let mut a = Worker::new(config(cfg), 1);
    let mut b = Worker::new(config(cfg), 2);
    finish_ok(&mut b, "10.0.0.1:80", 50.0);
    b.tick(SEC / 10, &mut store.clone());
    let mut reads = Reads {
        store: store.clone(),
        keys: Default::default(),
    };
    let (mut adopted, mut t) = (0, SEC);
    // Until `a`'s clock agrees with the record's, `b` may find a refresh due first.
    while t < 2 * SEC {
        finish_ok(&mut a, "10.0.0.1:80", 50.0);
        a.tick(t, &mut store.clone());
        b.tick(t + MS, &mut store.clone());
        t += SEC / 10;
    }
    while t < 12 * SEC {
        let ms = if (t / SEC) % 2 == 0 { 20.0 } else { 80.0 };
        for _ in 0..20 {
            finish_ok(&mut a, "10.0.0.1:80", ms);
            finish_ok(&mut a, "10.0.0.2:80", 50.0);
        }
        a.tick(t, &mut store.clone());
        let report = b.tick(t + MS, &mut reads);
        assert_eq!(report.refreshed, 0, "b never refreshes (at {t})");
        adopted += report.adopted.len();
        t += SEC / 4;
    }
    assert!(adopted >= 10, "b adopted {adopted} tables");
    let keys = reads.keys.take();
    let read = |kind: &str| keys.iter().filter(|k| k.contains(kind)).count();
    assert_eq!(
        read(".cluster."),
        0,
        "the record read by a VM that only adopts"
    );
    assert_eq!(
        read(".table."),
        adopted,
        "one read of the table per adoption"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_vm_that_folded_last_keeps_folding_and_another_takes_over_a_tick_after_it_stops() {
    // Ticks of 100 ms at phases 0, 33 and 66 ms, each late by up to 30 ms as a timer may be,
    // refreshes every 250 ms: the VM ticking first once an interval is up varies, and the one that
    // folded last must be the first to find it up (its kept record spares it decoding the record).
    let cfg = r#"{"tick_period_ms": 100, "refresh_interval_ms": 250}"#;
    let store = Shared::default();
    let mut workers: Vec<Worker> = (0..3).map(|i| Worker::new(config(cfg), i)).collect();
    let mut folds: Vec<(u64, usize)> = Vec::new();
    let mut stopped = None;
    let mut rng = fastrand::Rng::with_seed(7);
    for step in 0..300u64 {
        let (w, t) = ((step % 3) as usize, SEC + step * SEC / 30);
        let t = t + rng.u64(0..30) * MS;
        if stopped == Some(w) {
            continue;
        }
        finish_ok(&mut workers[w], HOST, 50.0);
        if workers[w].tick(t, &mut store.clone()).refreshed > 0 {
            folds.push((t, w));
        }
        if step == 150 {
            stopped = folds.last().map(|&(_, w)| w);
        }
    }
    let who = |from: u64, to: u64| {
        let mut w: Vec<usize> = folds
            .iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|&(_, w)| w)
            .collect();
        let n = w.len();
        w.dedup();
        (w, n)
    };
    let (before, n) = who(3 * SEC, 6 * SEC);
    assert_eq!(before.len(), 1, "one VM folds: {folds:?}");
    assert!(
        n >= 8,
        "a fold every interval and a tick at most: {folds:?}"
    );
    let (after, n) = who(6 * SEC + SEC / 2, 11 * SEC);
    assert_eq!(after.len(), 1, "one other VM folds: {folds:?}");
    assert_ne!(after, before);
    assert!(n >= 13, "{folds:?}");
    let stopped = stopped.unwrap();
    let last = folds.iter().rfind(|(_, w)| *w == stopped).unwrap().0;
    let next = folds.iter().find(|(t, _)| *t > last).unwrap().0;
    assert!(
        next - last <= 250 * MS + 2 * 100 * MS,
        "taken over after {} ms",
        (next - last) / MS
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_vm_folds_from_its_kept_record_only_while_shared_data_holds_the_record_it_wrote() {
    use ewma_lb::record::state::HostState;
    use ewma_lb::record::sync::{decode, encode};
    let store = Shared::default();
    let mut a = Worker::new(defaults(), 1);
    let mut t = SEC;
    while t <= 2 * SEC {
        finish_ok(&mut a, HOST, 50.0);
        a.tick(t, &mut store.clone());
        t += SEC / 10;
    }
    // Another writer (a refresher that died before publishing the head, say) leaves a record
    // that holds one host more, stamped as every fold stamps it: `a` must fold into that one,
    // not into the one it kept.
    let key = a.record_key(CLUSTER);
    let (bytes, version) = store.0.borrow().data.get(&key).unwrap().clone();
    let mut record = decode(&bytes, 100).unwrap();
    record.written_by = (record.written_by.0.wrapping_add(1), 1);
    record.hosts.push(HostState {
        address: "10.0.0.9:80".into(),
        last_seen_ns: record.clock_ns,
        ..HostState::default()
    });
    store
        .0
        .borrow_mut()
        .data
        .insert(key, (encode(&record), version + 1));
    let mut folded = 0;
    while t <= 3 * SEC {
        finish_ok(&mut a, HOST, 50.0);
        folded += a.tick(t, &mut store.clone()).refreshed;
        t += SEC / 10;
    }
    assert!(folded >= 3, "{folded} refreshes");
    assert!(
        store.record_of(CLUSTER).host("10.0.0.9:80").is_some(),
        "the other writer's host was dropped"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_folding_vms_own_table_is_the_one_it_publishes_whatever_changes_the_hosts() {
    use ewma_lb::record::sync::decode_table;
    use ewma_lb::record::table::Table;
    // The VM that folds keeps its record, and while nothing has changed the record's hosts since
    // its last table it makes the next one over the names it holds, without comparing them.
    // Here hosts join, report zones and change them, go silent and are forgotten, and the
    // endpoint count moves: after every tick its table must be the stored one, read name by
    // name.
    let store = Shared::default();
    let mut a = Worker::new(config(r#"{"host_ttl_ms": 1000}"#), 1);
    let mut rng = fastrand::Rng::with_seed(7);
    let zones = [None, Some("zone-a"), Some("zone-b")];
    let mut t = SEC;
    let mut versions = std::collections::HashSet::new();
    for step in 0..400 {
        // Hosts 0..live serve this tick: host 7 serves one tick in six, so it is often silent
        // for longer than host_ttl_ms; zones move every 50 ticks.
        let live = 3 + rng.usize(..6);
        for i in 0..live {
            let host = format!("10.0.0.{i}:80");
            a.finish(
                CLUSTER,
                &Finished {
                    served_by: Some(&host),
                    attempts: 1,
                    latency_ms: 20.0 + 40.0 * rng.f64(),
                    outcome: Some(Outcome::Success),
                    num_endpoints: Some(live as u32),
                    zone: zones[(i + step / 50) % 3],
                    ..Finished::default()
                },
            );
        }
        a.tick(t, &mut store.clone());
        t += SEC / 10;
        let bytes = store.0.borrow().data.get(&key_of(&a, "table")).cloned();
        let Some((bytes, _)) = bytes else {
            continue;
        };
        let stored = Table::adopt(&decode_table(&bytes, 64).unwrap(), &Table::default());
        let (_, held) = a.tables().find(|(c, _)| *c == CLUSTER).unwrap();
        assert_eq!(held, &stored, "at step {step}");
        versions.insert(stored.table_version);
    }
    assert!(versions.len() > 100, "{} tables", versions.len());
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_the_table_does_not_list_is_folded_in_at_the_next_tick_whoever_sampled_it() {
    // Refreshes are 250 ms apart, and a tick between two folds only for what cannot wait. A
    // host the table lacks cannot (Envoy chose it: the fallback); a host picked from the table,
    // or one Envoy chose that the table lists, waits for the refresh.
    let store = Shared::default();
    let mut w = two_endpoints(1);
    let end = |w: &mut Worker, picked: Option<&str>, host: &str| {
        w.finish(
            CLUSTER,
            &Finished {
                picked,
                in_flight: picked.is_some(),
                served_by: Some(host),
                attempts: 1,
                latency_ms: 20.0,
                outcome: Some(Outcome::Success),
                num_endpoints: Some(3),
                ..Finished::default()
            },
        );
    };
    end(&mut w, None, "10.0.0.1:80");
    assert_eq!(
        w.tick(SEC, &mut store.clone()).refreshed,
        1,
        "the first table"
    );
    let cases = [
        (Some("10.0.0.1:80"), "10.0.0.1:80", 0),
        (None, "10.0.0.2:80", 0),
        (None, "10.0.0.3:80", 1),
    ];
    for (i, (picked, host, refreshed)) in cases.into_iter().enumerate() {
        end(&mut w, picked, host);
        let t = SEC + (i as u64 + 1) * 60 * MS;
        assert_eq!(
            w.tick(t, &mut store.clone()).refreshed,
            refreshed,
            "{host} picked {picked:?}"
        );
    }
    assert!(store.record_of(CLUSTER).host("10.0.0.3:80").is_some());
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn vms_that_come_and_go_reuse_slots_and_lose_nothing() {
    let store = Shared::default();
    // The main thread's VM: no traffic, no slot, refreshes (and so keeps the record's clock).
    // Every VM of a listener has its configuration (a static endpoint, so the main VM has a
    // table to refresh).
    let cfg = r#"{"clusters": {"backend": {"endpoints": ["10.0.0.9:80"]}}}"#;
    let mut main = Worker::new(config(cfg), 100);
    let mut recorded = 0;
    let mut t = SEC;
    for seed in 0..12 {
        let mut w = Worker::new(config(cfg), seed);
        // Joins midway, serves for a second beside the main VM, and is restarted.
        for _ in 0..10 {
            finish_ok(&mut w, HOST, 50.0);
            recorded += 1;
            w.tick(t, &mut store.clone());
            main.tick(t, &mut store.clone());
            t += SEC / 10;
        }
        run(&mut main, &store, t, t + 11 * SEC, false);
        t += 11 * SEC + SEC / 10;
    }
    assert_eq!(samples(&store, HOST), recorded);
    assert_eq!(keys_of_kind(&store, "slot"), 1, "one slot, reused");
    // Two at once hold two slots.
    let mut a = Worker::new(config(cfg), 50);
    let mut b = Worker::new(config(cfg), 51);
    for _ in 0..3 {
        for w in [&mut a, &mut b] {
            finish_ok(w, HOST, 50.0);
            w.tick(t, &mut store.clone());
        }
        t += SEC / 10;
    }
    assert_eq!(keys_of_kind(&store, "slot"), 2);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn foreign_bytes_in_the_head_or_a_slot_are_replaced_and_counted() {
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    for kind in ["head", "slot0"] {
        store
            .0
            .borrow_mut()
            .data
            .insert(key_of(&w, kind), (b"EWLB\x04Sgarbage".to_vec(), 3));
    }
    finish_ok(&mut w, HOST, 5.0);
    let report = w.tick(SEC, &mut store.clone());
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.bad_records.len(), 1, "{:?}", report.bad_records);
    assert!(report
        .metrics
        .iter()
        .any(|u| u.metric == Metric::SharedRecordErrors));
    assert_eq!(samples(&store, HOST), 1);
}

/// The store every multi-worker test runs on compares and swaps as Envoy does: a write with a
/// stale version fails, and the version of a key that does not exist yet is not checked.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_memory_store_compares_and_swaps_as_envoy_does() {
    use ewma_lb::record::sync::{SharedStore, StoreError};
    use ewma_lb::testing::MemoryStore;
    let mut s = MemoryStore::default();
    assert_eq!(s.get("k").unwrap(), (None, None));
    s.set("k", b"a", Some(u32::MAX)).unwrap();
    let (v, cas) = s.get("k").unwrap();
    assert_eq!((v.as_deref(), cas), (Some(&b"a"[..]), Some(1)));
    assert_eq!(s.set("k", b"b", Some(7)), Err(StoreError::CasMismatch));
    s.set("k", b"b", cas).unwrap();
    assert_eq!(s.get("k").unwrap().1, Some(2));
}

/// `pick: weighted_p2c_unless_equal` leaves hosts the table cannot tell apart to the fallback, and
/// only where the fallback picks among exactly them with nothing to favour. Cases: (pick,
/// endpoints Envoy counts, the hosts' zones, the second host's latency, whether the requests go
/// to the fallback).
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_the_table_cannot_tell_apart_are_left_to_the_fallback_where_it_picks_among_them() {
    let cases = [
        ("weighted_p2c_unless_equal", 2, ["", ""], 20.0, true),
        ("weighted_p2c_unless_equal", 2, ["a", "a"], 20.0, true),
        // A host the table tells apart: it steers.
        ("weighted_p2c_unless_equal", 2, ["", ""], 40.0, false),
        // An endpoint the table does not know: the fallback would send it some of the requests.
        ("weighted_p2c_unless_equal", 3, ["", ""], 20.0, false),
        // Two zones: a zone-aware fallback would favour one.
        ("weighted_p2c_unless_equal", 2, ["a", "b"], 20.0, false),
        ("weighted_p2c", 2, ["", ""], 20.0, false),
    ];
    let hosts = ["10.0.0.1:80", "10.0.0.2:80"];
    for (pick, endpoints, zones, second_ms, equal) in cases {
        let cfg = format!(
            r#"{{"pick": "{pick}", "clusters": {{"backend": {{"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}}}}"#
        );
        let (store, mut w) = ticked(&cfg, 21);
        let mut rng = fastrand::Rng::with_seed(5);
        // Two equal hosts, 2 s of samples.
        for tick in 2..=21u64 {
            for _ in 0..20 {
                for ((host, zone), ms) in hosts.iter().zip(zones).zip([20.0, second_ms]) {
                    w.finish(
                        CLUSTER,
                        &Finished {
                            served_by: Some(host),
                            attempts: 1,
                            // A little spread, as real latencies have: a host's uncertainty
                            // comes from it.
                            latency_ms: ms * (0.9 + 0.2 * rng.f64()),
                            outcome: Some(Outcome::Success),
                            num_endpoints: Some(endpoints),
                            zone: Some(zone).filter(|z| !z.is_empty()),
                            ..Finished::default()
                        },
                    );
                }
            }
            w.tick(tick * 100 * MS + SEC, &mut store.clone());
        }
        let decisions: Vec<Decision> = (0..1_000).map(|_| steer(&mut w)).collect();
        let left = decisions
            .iter()
            .filter(|d| **d == Decision::Fallback(FallbackReason::HostsEqual))
            .count();
        let want = if equal { 1_000 } else { 0 };
        assert_eq!(left, want, "{pick} {endpoints} {zones:?} {second_ms} ms");
    }
}

/// A request that finds no table for its cluster asks the adapter for a tick at once
/// (`take_tick_wanted`), so a worker new to the cluster adopts the table another VM published
/// after about one request, not a tick period of them. It asks once per cluster entry: a cluster
/// no VM has a table of yet costs one early tick, not one per request. A cluster with static
/// endpoints has its table from the first tick and never asks.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_request_without_a_table_asks_for_a_tick_once() {
    let store = Shared::default();
    let mut first = Worker::new(defaults(), 1);
    // No VM has a table yet: the first request asks, the next ones do not.
    assert!(matches!(
        steer(&mut first),
        Decision::Fallback(FallbackReason::TableNotReady)
    ));
    assert!(first.take_tick_wanted());
    steer(&mut first);
    assert!(!first.take_tick_wanted(), "asked again before a tick");
    // Envoy's picks answer; the first worker's ticks publish a table of both hosts.
    for t in 1..=5u64 {
        for host in ["10.0.0.1:80", "10.0.0.2:80"] {
            finish_pick(&mut first, host, 20.0);
        }
        first.tick(t * SEC, &mut store.clone());
    }
    assert!(first.table_version(CLUSTER).is_some());
    // A second worker meets the cluster: it asks once, and its next tick adopts the table.
    let mut second = Worker::new(defaults(), 2);
    assert!(matches!(
        steer(&mut second),
        Decision::Fallback(FallbackReason::TableNotReady)
    ));
    assert!(second.take_tick_wanted());
    second.tick(5 * SEC + MS, &mut store.clone());
    assert!(matches!(steer(&mut second), Decision::Override(_)));
    assert!(!second.take_tick_wanted());
    // Configured endpoints: the table comes with the first tick, no request has to ask.
    let (_, mut configured) = ticked(
        r#"{"clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#,
        3,
    );
    assert!(matches!(steer(&mut configured), Decision::Override(_)));
    assert!(!configured.take_tick_wanted());
}
