//! Clusters as Kubernetes has them, over the in-memory store: endpoints the table does not know
//! keep their share, endpoints that leave are dropped at once, shared records survive other
//! configurations and races, idle clusters cost nothing, and no clock step moves a timer.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

mod store;

use std::collections::BTreeMap;

use ewma_lb::map::Map;

use ewma_lb::balance::explore::{LEARNING_SHARE, LEARNING_WINDOW_NS};
use ewma_lb::balance::outcome::Outcome;
use ewma_lb::record::state::{Accumulator, ClusterBatch, ClusterState};
use ewma_lb::record::sync;
use ewma_lb::testing::tick_updates;
use ewma_lb::worker::status::HostPhase;
use ewma_lb::worker::telemetry::{Change, Metric, MAX_GAUGED_HOSTS};
use ewma_lb::worker::{Decision, Finished, Worker};
use store::{config, defaults, steer, Shared, CLUSTER, MS, SEC};

fn served(w: &mut Worker, host: &str, ms: f64, endpoints: u32) {
    w.finish(
        CLUSTER,
        &Finished {
            served_by: Some(host),
            attempts: 1,
            latency_ms: ms,
            outcome: Some(Outcome::Success),
            num_endpoints: Some(endpoints),
            ..Finished::default()
        },
    );
}

fn host(i: usize) -> String {
    format!("10.0.0.{i}:80")
}

/// Picks `n` times and counts what they became.
fn picks(w: &mut Worker, n: usize) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for _ in 0..n {
        let key = match steer(w) {
            Decision::Override(p) => p.host.to_string(),
            Decision::Fallback(reason) => reason.label().to_string(),
            other => format!("{other:?}"),
        };
        *out.entry(key).or_default() += 1;
    }
    out
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn endpoints_the_table_does_not_know_get_their_share_through_the_fallback() {
    let store = Shared::default();
    let mut w = Worker::new(config(r#"{"exploration_share": 0}"#), 1);
    // The first tick saw one host of a three-endpoint cluster.
    served(&mut w, &host(1), 50.0, 3);
    w.tick(SEC, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(2.0 / 3.0));
    let counts = picks(&mut w, 30_000);
    let steered = counts.get(&host(1)).copied().unwrap_or(0);
    let explored = counts.get("exploring").copied().unwrap_or(0);
    assert!(
        (9_000..11_000).contains(&steered),
        "a third steered to the one known host: {counts:?}"
    );
    assert!(
        (19_000..21_000).contains(&explored),
        "two thirds left to the fallback: {counts:?}"
    );
    // Once all three are known, only the configured exploration is left (0 here).
    served(&mut w, &host(2), 50.0, 3);
    served(&mut w, &host(3), 50.0, 3);
    w.tick(SEC + 100 * MS, &mut store.clone());
    w.tick(SEC + 300 * MS, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(0.0));
    assert_eq!(store.record_of(CLUSTER).unknown_endpoints(), 0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_met_while_learning_the_cluster_need_no_slow_start_but_newcomers_ramp_in() {
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    let mut t = SEC;
    // Cold start: three endpoints found over several ticks are old members of the cluster.
    for i in 1..=3 {
        served(&mut w, &host(i), 50.0, 3);
        w.tick(t, &mut store.clone());
        t += 100 * MS;
    }
    let state = store.record_of(CLUSTER);
    assert!(state.complete, "every endpoint known");
    assert!(
        state.hosts.iter().all(|h| h.active_since_ns == 0),
        "no ramp for a host the plugin met late: {state:?}"
    );
    // Live, not warming, though the record's clock has not run a ramp's length yet.
    let ramp_ns = defaults().policy().weights.slow_start_ns;
    assert!(
        state.clock_ns < ramp_ns,
        "the check needs a young record: {}",
        state.clock_ns
    );
    assert!(
        state
            .hosts
            .iter()
            .all(|h| HostPhase::of(h, state.clock_ns, ramp_ns) == HostPhase::Live),
        "{state:?}"
    );
    // A scale-out: the cluster grows to four, and the fourth is new to the cluster too.
    served(&mut w, &host(4), 50.0, 4);
    w.tick(t, &mut store.clone());
    let state = store.record_of(CLUSTER);
    let newcomer = state.host(&host(4)).cloned().unwrap();
    assert!(newcomer.active_since_ns > 0, "{newcomer:?}");
    assert_eq!(
        HostPhase::of(&newcomer, state.clock_ns, ramp_ns),
        HostPhase::Warming
    );
    // Against the old hosts' mean: the noise band lets their own shares settle over several
    // refreshes, so one of them alone may still be above its target.
    let old = (1.0 - newcomer.share) / 3.0;
    assert!(
        (newcomer.share / old - 0.1).abs() < 0.01,
        "starts at the ramp's 10 %: {} against {old}",
        newcomer.share
    );
}

/// A newcomer as fast as the others is within a tenth of their shares at the first refresh after
/// its ramp: the share it held then was the ramp's last step, which the noise band must not hold
/// (it would climb a tenth of the way a refresh, seconds below fair with nothing to tell it
/// apart). The old hosts' own shares the band does hold, so not all the way.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_newcomer_equal_to_the_others_is_at_its_fair_share_once_its_ramp_is_over() {
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    let ramp_ns = defaults().policy().weights.slow_start_ns;
    let mut t = SEC;
    for i in 1..=3 {
        served(&mut w, &host(i), 50.0, 3);
        w.tick(t, &mut store.clone());
        t += 100 * MS;
    }
    // Settled: every old host measured for a while.
    for _ in 0..20 {
        for i in 1..=3 {
            served(&mut w, &host(i), 50.0, 3);
        }
        w.tick(t, &mut store.clone());
        t += 100 * MS;
    }
    served(&mut w, &host(4), 50.0, 4);
    w.tick(t, &mut store.clone());
    let joined_ns = store.record_of(CLUSTER).clock_ns;
    let ratio = |state: &ClusterState| {
        let newcomer = state.host(&host(4)).unwrap().share;
        newcomer / ((1.0 - newcomer) / 3.0)
    };
    let mut during = Vec::new();
    loop {
        t += 100 * MS;
        for i in 1..=4 {
            served(&mut w, &host(i), 50.0, 4);
        }
        w.tick(t, &mut store.clone());
        let state = store.record_of(CLUSTER);
        let active_ns = state.clock_ns - joined_ns;
        // The first refresh at which the ramp is over.
        if active_ns >= ramp_ns && state.refreshed_ns == state.clock_ns {
            assert!(
                ratio(&state) > 0.9,
                "{:.3} of the old hosts' mean once the ramp is over (during it: {during:?})",
                ratio(&state)
            );
            break;
        }
        during.push(format!("{:.2}", ratio(&state)));
        assert!(active_ns < 3 * ramp_ns, "no refresh after the ramp");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_table_follows_a_change_of_membership_in_the_same_tick_not_at_the_next_refresh() {
    // Refreshes every 10 s: only a change of who is in the cluster may move the table sooner.
    let store = Shared::default();
    let mut w = Worker::new(
        config(r#"{"refresh_interval_ms": 10000, "exploration_share": 0}"#),
        1,
    );
    served(&mut w, &host(1), 50.0, 2);
    served(&mut w, &host(2), 50.0, 2);
    w.tick(SEC, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(0.0));
    // Envoy reports two more endpoints: their share goes to the fallback from this tick on.
    served(&mut w, &host(1), 50.0, 4);
    w.tick(SEC + 100 * MS, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(0.5));
    // The fallback served one of them: it has a share (and the fallback less) at once.
    served(&mut w, &host(3), 50.0, 4);
    let report = w.tick(SEC + 200 * MS, &mut store.clone());
    assert_eq!(report.refreshed, 1);
    assert!(store.record_of(CLUSTER).host(&host(3)).unwrap().share > 0.0);
    // Nothing new: no refresh before the interval.
    served(&mut w, &host(3), 50.0, 4);
    assert_eq!(w.tick(SEC + 300 * MS, &mut store.clone()).refreshed, 0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn while_endpoints_are_unknown_the_fallback_gets_half_the_requests_for_a_while() {
    // Half is what lets the last unknown endpoints of a large cluster be met within a second:
    // the fallback spreads its share over every endpoint, known or not.
    let store = Shared::default();
    let mut w = Worker::new(config(r#"{"exploration_share": 0}"#), 1);
    for i in 1..=49 {
        served(&mut w, &host(i), 50.0, 50);
    }
    w.tick(SEC, &mut store.clone());
    assert_eq!(store.record_of(CLUSTER).unknown_endpoints(), 1);
    assert_eq!(w.explore_share(CLUSTER), Some(LEARNING_SHARE));
    let counts = picks(&mut w, 20_000);
    let explored = counts.get("exploring").copied().unwrap_or(0);
    assert!(
        (9_000..11_000).contains(&explored),
        "half to the fallback while learning: {counts:?}"
    );
    // An endpoint that is never met costs that half only for the window, then its fraction.
    // (Ticks every 100 ms: the VM's clock takes a larger jump for a clock step.)
    let mut t = SEC;
    while t + 100 * MS < SEC + LEARNING_WINDOW_NS {
        t += 100 * MS;
        served(&mut w, &host(1), 50.0, 50);
        w.tick(t, &mut store.clone());
        assert_eq!(
            w.explore_share(CLUSTER),
            Some(LEARNING_SHARE),
            "{} ms into the window",
            (t - SEC) / MS
        );
    }
    served(&mut w, &host(1), 50.0, 50);
    w.tick(SEC + LEARNING_WINDOW_NS, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(1.0 / 50.0));
    // Another endpoint appears: a new window.
    served(&mut w, &host(1), 50.0, 51);
    w.tick(SEC + LEARNING_WINDOW_NS + 100 * MS, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(LEARNING_SHARE));
    // All met: only the configured exploration.
    served(&mut w, &host(50), 50.0, 51);
    served(&mut w, &host(51), 50.0, 51);
    w.tick(SEC + LEARNING_WINDOW_NS + 200 * MS, &mut store.clone());
    assert_eq!(w.explore_share(CLUSTER), Some(0.0));
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_envoy_no_longer_honours_leaves_the_table_at_once_and_its_gauges_go_to_zero() {
    let store = Shared::default();
    let mut w = Worker::new(config(r#"{"exploration_share": 0}"#), 1);
    for i in 1..=3 {
        served(&mut w, &host(i), 50.0, 3);
    }
    w.tick(SEC, &mut store.clone());
    w.tick(SEC + 300 * MS, &mut store.clone());
    // Envoy served a pick of host 3 elsewhere, on the first attempt: it left the cluster.
    let gone = host(3);
    w.finish(
        CLUSTER,
        &Finished {
            picked: Some(&gone),
            in_flight: true,
            served_by: Some(&host(1)),
            attempts: 1,
            latency_ms: 50.0,
            outcome: Some(Outcome::Success),
            ..Finished::default()
        },
    );
    let report = w.tick(SEC + 400 * MS, &mut store.clone());
    assert!(
        store.record_of(CLUSTER).host(&gone).is_none(),
        "still in the record"
    );
    let zeroed: Vec<Metric> = report
        .metrics
        .iter()
        .filter(|u| u.label.as_deref() == Some(gone.as_str()) && u.change == Change::Set(0))
        .map(|u| u.metric)
        .collect();
    assert_eq!(
        zeroed,
        vec![
            Metric::HostWeight,
            Metric::HostLatency,
            Metric::HostEjected,
            Metric::HostErrorRate,
            Metric::HostUtilization,
            Metric::HostScore
        ]
    );
    assert!(
        !picks(&mut w, 2_000).contains_key(&gone),
        "never picked again"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_cluster_that_outgrows_the_per_host_gauges_zeroes_them_once_and_sets_no_more() {
    let address = |i: usize| format!("10.0.{}.{}:80", i / 200, i % 200);
    let per_host = |w: &Worker, report: &ewma_lb::worker::TickReport| -> (usize, usize) {
        let updates = tick_updates(w, report);
        let host_weights = updates.iter().filter(|u| u.metric == Metric::HostWeight);
        let zeroed = host_weights
            .clone()
            .filter(|u| u.change == Change::Set(0))
            .count();
        (host_weights.count(), zeroed)
    };
    let store = Shared::default();
    let mut w = Worker::new(config(r#"{"exploration_share": 0}"#), 1);
    let endpoints = u32::try_from(MAX_GAUGED_HOSTS + 1).unwrap();
    for i in 0..MAX_GAUGED_HOSTS {
        served(&mut w, &address(i), 50.0, endpoints);
    }
    let report = w.tick(SEC, &mut store.clone());
    assert_eq!(
        per_host(&w, &report),
        (MAX_GAUGED_HOSTS, 0),
        "every host gauged"
    );
    // One more host: the cluster is past the limit. The hosts that had gauges get 0, once.
    served(&mut w, &address(MAX_GAUGED_HOSTS), 50.0, endpoints);
    let report = w.tick(SEC + 300 * MS, &mut store.clone());
    assert_eq!(report.adopted.len(), 1);
    assert_eq!(per_host(&w, &report), (MAX_GAUGED_HOSTS, MAX_GAUGED_HOSTS));
    assert!(report
        .metrics
        .iter()
        .any(|u| u.metric == Metric::UnknownEndpoints));
    for i in 0..=MAX_GAUGED_HOSTS {
        served(&mut w, &address(i), 60.0, endpoints);
    }
    let report = w.tick(SEC + 600 * MS, &mut store.clone());
    assert_eq!(report.adopted.len(), 1, "a new table");
    assert_eq!(
        per_host(&w, &report),
        (0, 0),
        "no per-host gauge past the limit"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn fewer_endpoints_drop_the_hosts_seen_least_recently() {
    let p = defaults().policy().clone();
    let mut state = ClusterState::default();
    let batch = |hosts: &[usize], endpoints: u32| {
        let hosts = hosts
            .iter()
            .map(|i| {
                let mut acc = Accumulator::default();
                acc.record(50.0, false, 1000.0);
                (host(*i), acc)
            })
            .collect();
        ClusterBatch {
            worker: 0,
            hosts,
            num_endpoints: Some(endpoints),
        }
    };
    state.merge(&batch(&[1, 2, 3, 4], 4), SEC, &p);
    // Scale-in to two: hosts 3 and 4 fall silent, Envoy reports two endpoints.
    for k in 1..=4 {
        let now = SEC + k * p.refresh_interval_ns;
        state.merge(&batch(&[1, 2], 2), now, &p);
        state.refresh(now, &p, &[], None);
    }
    let left: Vec<&str> = state.hosts.iter().map(|h| h.address.as_str()).collect();
    assert_eq!(left, vec![host(1), host(2)]);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_full_record_forgets_the_host_seen_least_recently_never_the_newest() {
    let cfg = config(r#"{"max_hosts_per_cluster": 2}"#);
    let p = cfg.policy();
    let mut state = ClusterState::default();
    for (i, t) in [(1, SEC), (2, 2 * SEC), (1, 3 * SEC), (3, 4 * SEC)] {
        let mut acc = Accumulator::default();
        acc.record(50.0, false, 1000.0);
        state.merge(
            &ClusterBatch {
                worker: 0,
                hosts: Map::from_iter([(host(i), acc)]),
                num_endpoints: None,
            },
            t,
            p,
        );
    }
    let left: Vec<&str> = state.hosts.iter().map(|h| h.address.as_str()).collect();
    assert_eq!(
        left,
        vec![host(1), host(3)],
        "host 2 was seen least recently"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn static_flags_follow_the_current_configuration() {
    let p = defaults().policy().clone();
    let mut state = ClusterState::default();
    state.refresh(SEC, &p, &[host(1)], None);
    assert!(state.host(&host(1)).unwrap().is_static);
    state.refresh(2 * SEC, &p, &[], None);
    assert!(!state.host(&host(1)).unwrap().is_static, "no longer listed");
    state.refresh(2 * SEC + p.host_ttl_ns, &p, &[], None);
    assert!(
        state.hosts.is_empty(),
        "and forgotten like any learned host"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn two_vms_creating_a_record_in_the_same_tick_lose_no_sample() {
    let store = Shared::default();
    let mut w = Worker::new(defaults(), 1);
    let key = w.record_key(CLUSTER);
    // Another VM creates the record, with its own sample, between this VM's read and write.
    let other = {
        let mut s = ClusterState::default();
        let mut acc = Accumulator::default();
        acc.record(70.0, false, 1000.0);
        s.merge(
            &ClusterBatch {
                worker: 0,
                hosts: Map::from_iter([(host(2), acc)]),
                num_endpoints: None,
            },
            0,
            defaults().policy(),
        );
        sync::encode(&s)
    };
    let key_for_hook = key.clone();
    store.0.borrow_mut().after_missing_read = Some(Box::new(move |data| {
        data.insert(key_for_hook.clone(), (other.clone(), 1));
    }));
    served(&mut w, &host(1), 50.0, 2);
    let report = w.tick(SEC, &mut store.clone());
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let state = store.record(&key);
    assert!(
        state.host(&host(1)).is_some() && state.host(&host(2)).is_some(),
        "both VMs' samples: {state:?}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn two_configurations_keep_their_own_records() {
    let store = Shared::default();
    let mut a = Worker::new(defaults(), 1);
    let mut b = Worker::new(
        config(r#"{"max_hosts_per_cluster": 8, "refresh_interval_ms": 500}"#),
        2,
    );
    assert_ne!(a.record_key(CLUSTER), b.record_key(CLUSTER));
    for t in 1..=10u64 {
        served(&mut a, &host(1), 50.0, 2);
        served(&mut b, &host(2), 50.0, 2);
        let ra = a.tick(t * 100 * MS, &mut store.clone());
        let rb = b.tick(t * 100 * MS, &mut store.clone());
        assert!(ra.bad_records.is_empty() && rb.bad_records.is_empty());
    }
    assert_eq!(store.record(&a.record_key(CLUSTER)).hosts.len(), 1);
    assert_eq!(store.record(&b.record_key(CLUSTER)).hosts.len(), 1);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_idle_cluster_is_not_reweighed_and_is_forgotten_after_the_ttl() {
    let store = Shared::default();
    let mut w = Worker::new(
        config(r#"{"host_ttl_ms": 5000, "weights": {"slow_start_ms": 0}}"#),
        1,
    );
    for i in 1..=2 {
        served(&mut w, &host(i), 50.0, 2);
    }
    let mut t = SEC;
    w.tick(t, &mut store.clone());
    // No traffic from now on: once the table has settled, no new version.
    let mut adopted = Vec::new();
    for _ in 0..30 {
        t += 100 * MS;
        adopted.extend(w.tick(t, &mut store.clone()).adopted);
    }
    let version = store.record_of(CLUSTER).table_version;
    for _ in 0..10 {
        t += 100 * MS;
        assert!(
            w.tick(t, &mut store.clone()).adopted.is_empty(),
            "an idle cluster got a new table"
        );
    }
    assert_eq!(store.record_of(CLUSTER).table_version, version);
    // After host_ttl without use the VM forgets the cluster (the record stays in shared data).
    for _ in 0..60 {
        t += 100 * MS;
        w.tick(t, &mut store.clone());
    }
    assert_eq!(w.tables().count(), 0);
    // A cluster listed in the configuration is never forgotten.
    let mut w = Worker::new(
        config(r#"{"host_ttl_ms": 5000, "clusters": {"backend": {"endpoints": ["10.0.0.1:80"]}}}"#),
        1,
    );
    for k in 0..100 {
        w.tick(SEC + k * 100 * MS, &mut store.clone());
    }
    assert_eq!(w.tables().count(), 1);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_clock_step_moves_no_refresh_no_ejection_and_no_sample() {
    // Ticks every 100 ms by the host's clock, which steps back an hour at 3 s and forward two
    // hours at 6 s. Refreshes keep their pace, an ejection lasts what it should, and a request
    // that spans a step measures its real time.
    let cfg = r#"{"outlier_detection": {"base_ejection_ms": 2000}, "exploration_share": 0,
                 "clusters": {"backend": {"endpoints": ["10.0.0.1:80", "10.0.0.2:80"]}}}"#;
    let store = Shared::default();
    let mut w = Worker::new(config(cfg), 1);
    const HOUR: u64 = 3600 * SEC;
    let raw = |real: u64| match real {
        r if r < 3 * SEC => 10 * HOUR + r,
        r if r < 6 * SEC => 9 * HOUR + r,
        r => 11 * HOUR + r,
    };
    let mut refreshes_per_second = BTreeMap::<u64, usize>::new();
    let mut ejected_ticks = 0;
    for k in 0..100u64 {
        let real = k * 100 * MS;
        if real == 2_500 * MS {
            // Host 2 fails three times: ejected for 2 s.
            for _ in 0..3 {
                w.finish(
                    CLUSTER,
                    &Finished {
                        served_by: Some("10.0.0.2:80"),
                        attempts: 1,
                        latency_ms: 5.0,
                        outcome: Some(Outcome::ServerError),
                        ..Finished::default()
                    },
                );
            }
        }
        let report = w.tick(raw(real), &mut store.clone());
        *refreshes_per_second.entry(real / SEC).or_default() += report.refreshed;
        if store
            .record_of(CLUSTER)
            .host("10.0.0.2:80")
            .is_some_and(|h| h.share == 0.0)
        {
            ejected_ticks += 1;
        }
    }
    // A refresh every 250 ms, on the first tick after it is due: every 300 ms at 100 ms ticks,
    // so three or four a second, the seconds of the steps (3 and 6) included.
    for (second, n) in &refreshes_per_second {
        assert!(
            (3..=4).contains(n),
            "second {second}: {n} refreshes ({refreshes_per_second:?})"
        );
    }
    assert!(
        (19..=22).contains(&ejected_ticks),
        "ejected for {ejected_ticks} ticks of 100 ms, want about 20"
    );
    // A request that starts before the forward step and ends after it took 200 ms.
    let start = w.clock(raw(10_000 * MS));
    let end = w.clock(raw(10_000 * MS) + 2 * HOUR + 200 * MS);
    assert!(
        end - start <= 200 * MS,
        "the step became {} ms of latency",
        (end - start) / MS
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_learn_their_zone_and_the_local_zone_keeps_the_traffic() {
    let store = Shared::default();
    let mut w = Worker::new(config(r#"{"exploration_share": 0}"#), 1);
    w.set_local_zone("zone-a");
    let zone_of = |i: usize| if i <= 2 { "zone-a" } else { "zone-b" };
    let mut t = SEC;
    let mut cross_zone = 0;
    for _ in 0..20 {
        for i in 1..=4 {
            w.finish(
                CLUSTER,
                &Finished {
                    served_by: Some(&host(i)),
                    attempts: 1,
                    latency_ms: 50.0,
                    ended_ns: t,
                    outcome: Some(Outcome::Success),
                    num_endpoints: Some(4),
                    zone: Some(zone_of(i)),
                    picked: None,
                    in_flight: false,
                    grpc_status: None,
                    load_report: None,
                    probe_timeout_ms: None,
                },
            );
        }
        let report = w.tick(t, &mut store.clone());
        cross_zone += report
            .metrics
            .iter()
            .filter(|u| u.metric == Metric::CrossZoneRequests)
            .map(|u| match u.change {
                Change::Add(n) => n,
                Change::Set(_) => 0,
            })
            .sum::<i64>();
        t += 250 * MS;
    }
    assert_eq!(
        cross_zone, 40,
        "the two remote hosts served 20 requests each"
    );
    let state = store.record_of(CLUSTER);
    assert_eq!(
        state.host(&host(3)).map(|h| h.zone.as_str()),
        Some("zone-b")
    );
    let counts = picks(&mut w, 10_000);
    let local: usize = (1..=2)
        .map(|i| counts.get(&host(i)).copied().unwrap_or(0))
        .sum();
    assert!(
        local >= 9_900,
        "equal zones: the local zone keeps all but the floor: {counts:?}"
    );
    // The adapter reads a host's zone once (`wants_zone`): a second request to a new remote
    // host in the same tick comes without it, and crossed zones all the same.
    let newcomer = host(5);
    assert!(w.wants_zone(CLUSTER, &newcomer));
    let done = |zone| Finished {
        served_by: Some(&newcomer),
        attempts: 1,
        latency_ms: 50.0,
        outcome: Some(Outcome::Success),
        num_endpoints: Some(5),
        zone,
        ..Finished::default()
    };
    w.finish(CLUSTER, &done(Some("zone-b")));
    assert!(!w.wants_zone(CLUSTER, &newcomer));
    w.finish(CLUSTER, &done(None));
    let report = w.tick(t, &mut store.clone());
    assert!(
        report
            .metrics
            .iter()
            .any(|u| u.metric == Metric::CrossZoneRequests && u.change == Change::Add(2)),
        "{:?}",
        report.metrics
    );
}

/// A host without a zone (Envoy answers `upstream.locality.zone` empty) is asked once, not on
/// every request: the empty answer is kept like a zone, through the ticks, and counts as no
/// zone (never a crossed one).
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_without_a_zone_is_asked_for_it_once() {
    let store = Shared::default();
    let mut w = Worker::new(config("{}"), 7);
    w.set_local_zone("zone-a");
    let mut t = SEC;
    let zoneless = host(1);
    let mut asked = 0;
    let mut cross_zone = 0;
    for _ in 0..10 {
        for _ in 0..20 {
            let wanted = w.wants_zone(CLUSTER, &zoneless);
            asked += usize::from(wanted);
            w.finish(
                CLUSTER,
                &Finished {
                    served_by: Some(&zoneless),
                    attempts: 1,
                    latency_ms: 50.0,
                    ended_ns: t,
                    outcome: Some(Outcome::Success),
                    num_endpoints: Some(1),
                    zone: wanted.then_some(""),
                    ..Finished::default()
                },
            );
        }
        let report = w.tick(t, &mut store.clone());
        cross_zone += report
            .metrics
            .iter()
            .filter(|u| u.metric == Metric::CrossZoneRequests)
            .count();
        t += 250 * MS;
    }
    assert_eq!(asked, 1, "asked once over 200 requests and 10 ticks");
    assert_eq!(cross_zone, 0, "no zone is not another zone");
    let state = store.record_of(CLUSTER);
    assert_eq!(state.host(&zoneless).map(|h| h.zone.as_str()), Some(""));
}

/// One VM's traffic to a 50-endpoint cluster: `ticks` ticks of 100 ms, 50 requests each (about
/// one per endpoint per tick, as 1,000 req/s over two VMs), every answer 50 ms except `slow`
/// (tick, ms) for the first request to `host(1)` from that tick on. Returns `host(1)`'s requests per
/// simulated second.
fn large_cluster_run(config_json: &str, ticks: u64, slow: (u64, f64)) -> Vec<usize> {
    let store = Shared::default();
    let mut w = Worker::new(config(config_json), 7);
    let watched = host(1);
    let mut per_second = vec![0; (ticks / 10) as usize];
    let mut slow_left = true;
    for tick in 0..ticks {
        for _ in 0..50 {
            let Decision::Override(pick) = steer(&mut w) else {
                continue;
            };
            let mut ms = 50.0;
            if *pick.host == *watched {
                per_second[(tick / 10) as usize] += 1;
                if slow_left && tick >= slow.0 {
                    ms = slow.1;
                    slow_left = false;
                }
            }
            w.finish(
                CLUSTER,
                &Finished {
                    picked: Some(&pick.host),
                    in_flight: true,
                    served_by: Some(&pick.host),
                    attempts: 1,
                    latency_ms: ms,
                    outcome: Some(Outcome::Success),
                    num_endpoints: Some(50),
                    ..Finished::default()
                },
            );
        }
        w.tick(SEC + tick * 100 * MS, &mut store.clone());
    }
    per_second
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn one_slow_answer_in_a_large_cluster_costs_the_host_a_dip_not_its_traffic() {
    let endpoints: Vec<String> = (1..=50).map(host).collect();
    let json = |extra: &str| {
        format!(
            r#"{{"exploration_share": 0, {extra} "clusters": {{"{CLUSTER}": {{"endpoints": {endpoints:?}}}}}}}"#
        )
    };
    // 10 s to settle, one 300 ms answer at second 10, then 6 s more. A fair share is 10 a second.
    let now = large_cluster_run(&json(""), 160, (100, 300.0));
    let settled: usize = now[5..10].iter().sum();
    assert!(
        (35..=65).contains(&settled),
        "host 1 near its fair share before: {now:?}"
    );
    // Seconds 11-15: the answer is in the estimate (Peak EWMA lifts it by a quarter of the way
    // for a batch of one sample) and the table has moved; measured 3, 6, 6, 5, 7 a second.
    let after = &now[11..16];
    let sum = |v: &[usize]| v.iter().sum::<usize>();
    assert!(
        after.iter().all(|n| *n >= 2),
        "never near zero after one slow answer: {now:?}"
    );
    assert!(
        sum(after) >= 20,
        "at least 40 % of its fair share over the 5 s: {now:?}"
    );
    // What the test tells apart: a table that believes one answer (the classic peak adopting the
    // whole batch mean, a long memory, a sharp exponent, every rise taken in at once and every
    // target followed) leaves the host a few requests a second after the same answer.
    let before = large_cluster_run(
        &json(
            r#""smoothing": {"algorithm": "peak_ewma", "tau_ms": 5000, "peak_samples": 1}, "weights": {"exponent": 4.0, "noise_gain": 1.0}, "persistence_ms": 0,"#,
        ),
        160,
        (100, 300.0),
    );
    assert!(
        sum(&before[11..16]) < 20,
        "a table that believes one answer: {before:?}"
    );
}

// === Clusters larger than the table =============================================================

/// What a run over a cluster of `endpoints` equal hosts (5 ms each) left: the record's hosts at
/// each of the last `window` ticks, their sample counts at the end, and the share of the last
/// `window` ticks' requests the fallback got. Requests the plugin does not steer go to an
/// endpoint drawn uniformly, as the fallback's least_request over equal hosts does.
struct LargeRun {
    host_sets: Vec<Vec<String>>,
    samples: Vec<u64>,
    fallback_share: f64,
    outside_subset: Option<f64>,
}

fn large_run(endpoints: usize, cfg: &str, ticks: u64, per_tick: usize, window: u64) -> LargeRun {
    let store = Shared::default();
    let mut w = Worker::new(config(cfg), 1);
    let mut rng = fastrand::Rng::with_seed(7);
    let address = |i: usize| format!("10.{}.{}.{}:80", i / 65_536, (i / 256) % 256, i % 256);
    let n = u32::try_from(endpoints).unwrap();
    let (mut host_sets, mut fallback, mut total) = (Vec::new(), 0usize, 0usize);
    let mut outside_subset = None;
    for t in 1..=ticks {
        for _ in 0..per_tick {
            let host = match steer(&mut w) {
                Decision::Override(p) => p.host.to_string(),
                _ => {
                    if t > ticks - window {
                        fallback += 1;
                    }
                    address(rng.usize(..endpoints))
                }
            };
            if t > ticks - window {
                total += 1;
            }
            served(&mut w, &host, 5.0, n);
        }
        let report = w.tick(t * SEC / 10, &mut store.clone());
        assert!(report.errors.is_empty(), "tick {t}: {:?}", report.errors);
        for u in &report.metrics {
            if u.metric == Metric::HostsOutsideSubset {
                if let Change::Set(v) = u.change {
                    outside_subset = Some(v as f64);
                }
            }
        }
        if t > ticks - window {
            let mut hosts: Vec<String> = store
                .record_of(CLUSTER)
                .hosts
                .iter()
                .map(|h| h.address.clone())
                .collect();
            hosts.sort();
            host_sets.push(hosts);
        }
    }
    LargeRun {
        host_sets,
        samples: store
            .record_of(CLUSTER)
            .hosts
            .iter()
            .map(|h| h.samples)
            .collect(),
        fallback_share: fallback as f64 / total as f64,
        outside_subset,
    }
}

/// 1,100 endpoints, `max_hosts_per_cluster` 1,024: the table keeps a stable subset chosen by a
/// hash of the address, well inside the bound, and leaves the rest to the fallback. Over the last
/// 10 s no host joins or leaves the record, every host in it has at least 20 samples, and
/// `ewma_lb_hosts_outside_subset` says how many endpoints the subset leaves out. Before, every
/// newcomer evicted the least recently seen host: 100 refreshes, 100 new tables, 649 of 1,024
/// hosts with under 20 samples.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_cluster_above_max_hosts_settles_on_a_stable_subset() {
    let run = large_run(1_100, r#"{"exploration_share": 0}"#, 300, 400, 100);
    let first = &run.host_sets[0];
    let changed = run.host_sets.iter().filter(|s| *s != first).count();
    let thin = run.samples.iter().filter(|s| **s < 20).count();
    eprintln!(
        "1,100 endpoints: {} hosts in the record, {changed} of {} ticks with another host set, {thin} with under 20 samples, fallback {:.3}, outside the subset {:?}",
        first.len(),
        run.host_sets.len(),
        run.fallback_share,
        run.outside_subset
    );
    assert!((850..=1_024).contains(&first.len()), "{}", first.len());
    assert_eq!(changed, 0, "the record's hosts churned");
    assert_eq!(thin, 0, "hosts with under 20 samples");
    let outside = run.outside_subset.unwrap();
    assert_eq!(outside, (1_100 - first.len()) as f64);
    // The fallback gets about the share of the hosts outside the subset.
    let expected = outside / 1_100.0;
    assert!(
        (run.fallback_share - expected).abs() < 0.05,
        "fallback {:.3}, outside {expected:.3}",
        run.fallback_share
    );
}

/// 16,000 endpoints with `max_hosts_per_cluster` 16,384: the table learns them all (before, a
/// VM's batch kept the first 4,096 hosts it met for good, and 74 % of requests went to the
/// fallback for good) and keeps them: over the last 10 s hosts only join (the last few of 16,000
/// the fallback finds), none leaves.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn sixteen_thousand_endpoints_are_all_learned_and_settle() {
    let run = large_run(
        16_000,
        r#"{"exploration_share": 0, "max_hosts_per_cluster": 16384}"#,
        400,
        2_000,
        100,
    );
    let first = &run.host_sets[0];
    let changed = run.host_sets.iter().filter(|s| *s != first).count();
    let last = run.host_sets.last().unwrap().len();
    eprintln!(
        "16,000 endpoints: {} then {last} hosts in the record, {changed} of {} ticks with another host set, fallback {:.3}, outside the subset {:?}",
        first.len(),
        run.host_sets.len(),
        run.fallback_share,
        run.outside_subset
    );
    assert!(last >= 15_500, "{last} hosts learned");
    assert!(
        run.fallback_share < 0.05,
        "fallback {:.3}",
        run.fallback_share
    );
    for w in run.host_sets.windows(2) {
        let later: std::collections::BTreeSet<&String> = w[1].iter().collect();
        assert!(
            w[0].iter().all(|h| later.contains(h)),
            "a learned host left"
        );
    }
    assert_eq!(run.outside_subset, Some(0.0));
}
