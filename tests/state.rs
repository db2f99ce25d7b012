//! Shared state: the codec survives anything, merges count every sample, refreshes and
//! ejections shape the table.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::map::Map;

use ewma_lb::config::Config;
use ewma_lb::record::state::{Accumulator, ClusterBatch, ClusterState, Merged, Policy};
use ewma_lb::record::sync::{decode, encode, DecodeError, FORMAT_VERSION, MAGIC};
#[cfg(not(target_arch = "wasm32"))]
use proptest::prelude::*;

const SEC: u64 = 1_000_000_000;

fn policy() -> Policy {
    Config::from_json(b"{}").unwrap().policy().clone()
}

fn samples(entries: &[(&str, &[f64], bool)]) -> ClusterBatch {
    let hosts = entries
        .iter()
        .map(|(host, latencies, failed)| {
            let mut acc = Accumulator::default();
            for l in *latencies {
                acc.record(*l, *failed, 1000.0);
            }
            (host.to_string(), acc)
        })
        .collect();
    ClusterBatch {
        hosts,
        ..ClusterBatch::default()
    }
}

fn steady_state() -> ClusterState {
    let p = policy();
    let mut state = ClusterState::default();
    for t in 1..=20 {
        state.merge(
            &samples(&[
                ("10.0.0.1:80", &[50.0, 60.0], false),
                ("10.0.0.2:80", &[2000.0], false),
            ]),
            t * SEC,
            &p,
        );
        state.refresh(t * SEC, &p, &[], None);
    }
    state
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn round_trip() {
    let state = steady_state();
    let bytes = encode(&state);
    assert!(bytes.starts_with(MAGIC));
    assert_eq!(decode(&bytes, 256), Ok(state));
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn foreign_bytes_are_rejected_with_a_reason() {
    let good = encode(&steady_state());
    let mut other_version = good.clone();
    other_version[4] = FORMAT_VERSION + 1;
    type Case = (&'static str, Vec<u8>, fn(&DecodeError) -> bool);
    let cases: Vec<Case> = vec![
        ("empty", vec![], |e| *e == DecodeError::NotOurs),
        ("other magic", b"JSON{}".to_vec(), |e| {
            *e == DecodeError::NotOurs
        }),
        ("other version", other_version, |e| {
            matches!(e, DecodeError::OtherVersion(_))
        }),
        ("truncated", good[..good.len() / 2].to_vec(), |e| {
            matches!(e, DecodeError::Corrupt(_))
        }),
    ];
    for (name, bytes, expected) in cases {
        match decode(&bytes, 256) {
            Err(e) => assert!(expected(&e), "{name}: unexpected error {e}"),
            Ok(s) => panic!("{name}: decoded {s:?}"),
        }
    }
    assert!(
        matches!(decode(&good, 1), Err(DecodeError::Corrupt(_))),
        "host limit"
    );
}

#[cfg(not(target_arch = "wasm32"))]
proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes, 256);
        let mut framed = MAGIC.to_vec();
        framed.push(FORMAT_VERSION);
        framed.extend_from_slice(&bytes);
        let _ = decode(&framed, 256);
    }

    /// `sync`'s own postcard output copies each piece at a length known when compiled; what it
    /// writes must be what postcard writes, for every length a varint can take.
    #[test]
    fn a_record_is_encoded_as_postcard_encodes_it(
        times in prop::collection::vec(any::<u64>(), 3),
        samples in any::<u64>(),
        spread in any::<f64>(),
        address in "[0-9a-f.:\\[\\]]{0,48}",
    ) {
        use ewma_lb::record::state::HostState;
        let mut state = steady_state();
        state.clock_ns = times[0];
        state.hosts.push(HostState {
            address,
            last_seen_ns: times[1],
            active_since_ns: times[2],
            samples,
            spread,
            ..HostState::default()
        });
        let bytes = encode(&state);
        let postcards = postcard::to_allocvec(&state).unwrap();
        prop_assert_eq!(&bytes[..4], MAGIC.as_slice());
        prop_assert_eq!(&bytes[6..], postcards.as_slice());
    }

    #[test]
    fn flipping_bytes_of_a_real_record_never_panics(index in any::<prop::sample::Index>(), value in any::<u8>()) {
        let mut bytes = encode(&steady_state());
        let i = index.index(bytes.len());
        bytes[i] = value;
        let _ = decode(&bytes, 256);
    }
}

/// A fold that meets many hosts takes them in with one merge into the sorted record; the record
/// and what the merge reports are those of meeting them in separate folds, one host each: the
/// new hosts' places and first state, the known ones' samples, a host only listed, a host gone;
/// in a record with room, and in a cluster larger than the record, where only the hosts of its
/// stable subset go in.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn hosts_met_together_enter_the_record_as_hosts_met_one_at_a_time() {
    let cases = [("room", 1024, 7), ("subset", 16, 40)];
    for (case, max_hosts, num_endpoints) in cases {
        let mut p = policy();
        p.max_hosts = max_hosts;
        let mut together = ClusterState::default();
        together.merge(
            &samples(&[
                ("10.0.0.5:80", &[40.0], false),
                ("10.0.0.2:80", &[30.0], false),
                ("10.0.0.8:80", &[20.0], false),
            ]),
            SEC,
            &p,
        );
        let mut one_at_a_time = together.clone();
        let mut batch = samples(&[
            ("10.0.0.9:80", &[50.0, 70.0], false),
            ("10.0.0.1:80", &[60.0], true),
            ("10.0.0.5:80", &[45.0], false),
            ("10.0.0.6:80", &[10.0], false),
            ("10.0.0.3:80", &[], false),
            ("10.0.0.8:80", &[], false),
            ("10.0.0.4:80", &[25.0], false),
            ("10.0.0.7:80", &[], false),
        ]);
        for listed in ["10.0.0.3:80", "10.0.0.7:80"] {
            batch.hosts.get_mut(listed).unwrap().listed = true;
        }
        batch.hosts.get_mut("10.0.0.8:80").unwrap().unlisted = true;
        let now = 2 * SEC;
        let merged = together.merge_hosts(
            batch.hosts.iter().map(|(a, acc)| (a.as_str(), acc)),
            Some(num_endpoints),
            now,
            &p,
        );
        let mut each = Merged::default();
        for (address, acc) in &batch.hosts {
            each.absorb(one_at_a_time.merge_hosts(
                std::iter::once((address.as_str(), acc)),
                Some(num_endpoints),
                now,
                &p,
            ));
        }
        assert_eq!(together, one_at_a_time, "{case}");
        assert_eq!(merged, each, "{case}");
        let addresses: Vec<&str> = together.hosts.iter().map(|h| h.address.as_str()).collect();
        assert!(addresses.is_sorted(), "{case}: {addresses:?}");
        // With room every host goes in; of a cluster larger than the record, some stay out.
        match case {
            "room" => assert_eq!(addresses.len(), 8, "{case}: {addresses:?}"),
            _ => assert!((3..8).contains(&addresses.len()), "{case}: {addresses:?}"),
        }
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_slow_host_ends_with_the_floor() {
    let state = steady_state();
    let fast = state.host("10.0.0.1:80").map(|h| h.share).unwrap_or(0.0);
    let slow = state.host("10.0.0.2:80").map(|h| h.share).unwrap_or(1.0);
    assert!(
        (slow - policy().weights.min_share).abs() < 1e-9,
        "slow {slow}"
    );
    assert!((fast + slow - 1.0).abs() < 1e-9);
    assert!(
        (1..=20).contains(&state.table_version),
        "one version per refresh that changed the shares"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn merges_count_every_sample() {
    let p = policy();
    let mut state = ClusterState::default();
    state.merge(&samples(&[("a:1", &[10.0; 7], false)]), SEC, &p);
    state.merge(
        &samples(&[("a:1", &[10.0; 5], false), ("b:1", &[10.0; 2], false)]),
        SEC,
        &p,
    );
    assert_eq!(state.host("a:1").map(|h| h.latency.samples()), Some(12));
    assert_eq!(state.host("b:1").map(|h| h.latency.samples()), Some(2));
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn failures_count_as_the_penalty_latency() {
    let mut acc = Accumulator::default();
    acc.record(2.0, true, 1000.0);
    assert_eq!(
        acc.latency.mean_ms(),
        Some(1000.0),
        "a fast failure is not fast"
    );
    acc.record(3000.0, true, 1000.0);
    assert_eq!(
        acc.latency.mean_ms(),
        Some(2000.0),
        "a slow failure keeps its own latency"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_abandoned_wait_is_a_sample_but_neither_a_success_nor_a_failure() {
    let mut acc = Accumulator::default();
    acc.record(5.0, true, 1000.0);
    acc.record_abandoned(1000.0);
    acc.record(5.0, true, 1000.0);
    assert_eq!(acc.latency.count, 3, "the wait is a latency sample");
    assert_eq!(acc.abandoned, 1);
    assert_eq!(
        acc.failures, 2,
        "the client leaving is not the host's failure"
    );
    assert_eq!(
        acc.trailing_failures, 2,
        "nor does it break a run of failures: the host answered nothing"
    );
    assert!(!acc.had_success);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn consecutive_failures_eject_and_the_host_returns_later() {
    let p = policy();
    let mut state = steady_state();
    let now = 21 * SEC;
    let merged = state.merge(
        &samples(&[("10.0.0.1:80", &[5.0, 5.0, 5.0], true)]),
        now,
        &p,
    );
    assert_eq!(merged.ejected, 1);
    let host = state.host("10.0.0.1:80").cloned().unwrap_or_default();
    assert!(host.health.is_ejected(now) && host.share == 0.0);
    assert!((state.host("10.0.0.2:80").map(|h| h.share).unwrap_or(0.0) - 1.0).abs() < 1e-9);
    // Still ejected one refresh later, back after the base ejection time, ramping up.
    state.refresh(now + SEC, &p, &[], None);
    assert_eq!(state.host("10.0.0.1:80").map(|h| h.share), Some(0.0));
    let back = now + p.outlier.base_ejection_ns + 1;
    state.refresh(back, &p, &[], None);
    let host = state.host("10.0.0.1:80").cloned().unwrap_or_default();
    assert!(!host.health.is_ejected(back) && host.share > 0.0 && host.active_since_ns == back);
    assert_eq!(
        host.latency.value_ms(),
        None,
        "scored at the median again, not at the penalty"
    );
}

const THREE_HOSTS: [&str; 3] = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];

/// `hosts` after 20 s of answering alike, a refresh a second: equal shares resting on answers.
fn measured_equal_hosts(hosts: &[&str], p: &Policy) -> ClusterState {
    let mut state = ClusterState::default();
    for t in 1..=20 {
        answer_and_refresh(&mut state, hosts, t * SEC, p);
    }
    state
}

/// Each of `hosts` answers two requests (50 and 60 ms) at `now_ns`; then a refresh.
fn answer_and_refresh(state: &mut ClusterState, hosts: &[&str], now_ns: u64, p: &Policy) {
    let batch: Vec<(&str, &[f64], bool)> = hosts
        .iter()
        .map(|h| (*h, &[50.0, 60.0][..], false))
        .collect();
    state.merge(&samples(&batch), now_ns, p);
    state.refresh(now_ns, p, &[], None);
}

/// VMs read from the table which hosts are on trust, with no latency yet (`balance::pick`): a
/// host's first latency makes a new table version even where the shares stand (two hosts
/// answering alike stay at a half each), and answers that move nothing make none.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_hosts_first_latency_is_a_new_table_even_when_the_shares_stand() {
    let p = policy();
    let hosts = ["10.0.0.1:80", "10.0.0.2:80"];
    let listed: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    let mut state = ClusterState::default();
    state.refresh(SEC, &p, &listed, None);
    let listed_only = state.table_version;
    assert!(state.hosts.iter().all(|h| h.latency.value_ms().is_none()));
    let batch = |hosts: &[&str]| {
        let b: Vec<(&str, &[f64], bool)> = hosts.iter().map(|h| (*h, &[20.0][..], false)).collect();
        samples(&b)
    };
    state.merge(&batch(&hosts), 2 * SEC, &p);
    state.refresh(2 * SEC, &p, &listed, None);
    assert!(state.hosts.iter().all(|h| (h.share - 0.5).abs() < 1e-9));
    assert!(
        state.table_version > listed_only,
        "no new table for the first latencies"
    );
    let measured = state.table_version;
    state.merge(&batch(&hosts), 3 * SEC, &p);
    state.refresh(3 * SEC, &p, &listed, None);
    assert_eq!(state.table_version, measured, "a new table for nothing new");
}

/// A host back from ejection has no latency: it is scored at the cluster's median and ramped in
/// on trust. Its share then is no standing to fall from slowly: when its first answers show it
/// twenty times slower than the rest (a restarted process with cold caches), its share falls to
/// the floor at that refresh. A host whose share rests on answers that turns as slow falls by
/// at most `max_step_ratio` a refresh (damping), as before.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_share_on_trust_gives_way_to_the_first_answers_at_once() {
    let p = policy();
    let hosts = THREE_HOSTS;
    let state = measured_equal_hosts(&hosts, &p);
    let share = |state: &ClusterState, h: &str| state.host(h).map_or(0.0, |h| h.share);
    // Both cases start from the third host at a fair share: once on trust (back from
    // ejection, its ramp over), once on its own answers.
    let mut trusted = state.clone();
    let now = 21 * SEC;
    trusted.merge(&samples(&[(hosts[2], &[5.0, 5.0, 5.0], true)]), now, &p);
    let back = now + p.outlier.base_ejection_ns + 1;
    let mut t = back;
    while t <= back + 3 * SEC {
        trusted.refresh(t, &p, &[], None);
        t += SEC / 4;
    }
    let before = share(&trusted, hosts[2]);
    assert!(trusted
        .host(hosts[2])
        .is_some_and(|h| h.latency.value_ms().is_none()));
    assert!(before > 0.25, "ramped in on trust: {before}");
    let slow = samples(&[(hosts[2], &[1100.0], false)]);
    trusted.merge(&slow, t, &p);
    trusted.refresh(t, &p, &[], None);
    let after = share(&trusted, hosts[2]);
    assert!(after <= 0.01, "on trust: {before} -> {after}");

    let mut measured = state;
    let before = share(&measured, hosts[2]);
    measured.merge(&slow, 21 * SEC, &p);
    measured.refresh(21 * SEC, &p, &[], None);
    let after = share(&measured, hosts[2]);
    assert!(
        after >= before / p.weights.max_step_ratio - 1e-9,
        "on answers, damped: {before} -> {after}"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_ejection_budget_keeps_half_the_cluster() {
    let p = policy();
    let mut state = ClusterState::default();
    let all_failing: Vec<(&str, &[f64], bool)> = vec![
        ("a:1", &[1.0; 3], true),
        ("b:1", &[1.0; 3], true),
        ("c:1", &[1.0; 3], true),
        ("d:1", &[1.0; 3], true),
    ];
    state.merge(&samples(&all_failing), SEC, &p);
    let ejected = state
        .hosts
        .iter()
        .filter(|h| h.health.is_ejected(SEC))
        .count();
    assert_eq!(ejected, 2, "max_ejection_share 0.5 of 4 hosts");
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_success_resets_the_failure_count() {
    let p = policy();
    let mut state = ClusterState::default();
    let mut acc = Accumulator::default();
    for failed in [true, true, false, true, true] {
        acc.record(1.0, failed, 1000.0);
    }
    state.merge(
        &ClusterBatch {
            hosts: Map::from_iter([("a:1".to_string(), acc)]),
            ..ClusterBatch::default()
        },
        SEC,
        &p,
    );
    state.merge(&samples(&[("b:1", &[1.0], false)]), SEC, &p);
    assert_eq!(
        state.host("a:1").map(|h| h.health.consecutive_failures),
        Some(2)
    );
    assert!(!state.host("a:1").is_some_and(|h| h.health.is_ejected(SEC)));
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn silent_learned_hosts_are_forgotten_static_ones_kept() {
    let p = policy();
    let mut state = ClusterState::default();
    state.merge(&samples(&[("learned:1", &[10.0], false)]), SEC, &p);
    state.refresh(SEC, &p, &["static:1".to_string()], None);
    assert_eq!(state.hosts.len(), 2);
    state.refresh(SEC + p.host_ttl_ns, &p, &["static:1".to_string()], None);
    let left: Vec<&str> = state.hosts.iter().map(|h| h.address.as_str()).collect();
    assert_eq!(left, vec!["static:1"]);
}

/// One small value of each kind, every field set, as written to shared data.
fn golden_values() -> [Vec<u8>; 4] {
    use ewma_lb::record::state::{Ack, HostState};
    use ewma_lb::record::sync::{
        encode_head, encode_slot, encode_table, Head, Lease, Slot, SlotBatch,
    };
    use ewma_lb::record::table::{HostView, TableView};
    let mut host = HostState {
        address: "10.0.0.1:80".into(),
        zone: "a".into(),
        last_seen_ns: 6,
        samples: 4,
        spread: 0.5,
        share: 1.0,
        ..HostState::default()
    };
    host.errors.observe(4, 1, 6);
    host.load.observe(0.5, 1, 6);
    let record = ClusterState {
        written_by: (7, 2),
        table_version: 3,
        refreshed_ns: 5,
        clock_ns: 6,
        num_endpoints: 2,
        complete: true,
        hosts: vec![host],
        hosts_indistinguishable: true,
        workers: vec![(9, 6)],
        acked: vec![Ack {
            slot: 1,
            epoch: 2,
            seq: 7,
        }],
    };
    let head = Head {
        table_version: 3,
        clock_ns: 6,
        folded_ns: 6,
        lease: Some(Lease {
            holder: 9,
            until_ns: 8,
        }),
        workers: 1,
        acked: record.acked.clone(),
    };
    let mut acc = Accumulator::default();
    acc.record(50.0, false, 1000.0);
    acc.zone = Some("a".into());
    acc.report_load(0.25);
    acc.abandoned = 1;
    acc.listed = true;
    let slot = Slot {
        owner: 9,
        epoch: 2,
        seq: 8,
        written_ns: 6,
        sampled_ns: 6,
        batches: vec![SlotBatch {
            seq: 8,
            at_ns: 6,
            num_endpoints: Some(2),
            hosts: vec![("10.0.0.1:80".into(), acc)],
        }],
    };
    let table = TableView {
        table_version: 3,
        num_endpoints: 2,
        unknown_endpoints: 1,
        hosts_indistinguishable: true,
        hosts_hash: 5,
        hosts: vec![HostView {
            address: "10.0.0.1:80",
            zone: "a",
            share: 1.0,
            latency_ms: Some(50.0),
        }],
    };
    [
        encode(&record),
        encode_head(&head),
        encode_slot(&slot),
        encode_table(&table),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Ties `FORMAT_VERSION` to the layout: a change to any stored type changes these bytes, and the
/// version must move with them (VMs of two builds share data during an upgrade; the version in
/// the key keeps them apart only if it differs).
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_format_version_names_the_encoded_layout() {
    const GOLDEN: [&str; 4] = [
        "45574c420c5207020305060201010b31302e302e302e313a38300000016106000000000004000000000000e03f00000000000000000000000000000000000000000000000000f03f00000000000010400601000000000000e03f0600000000000000000000f03f000101090601010207",
        "45574c420c480306060109080101010207",
        "45574c420c5309020806060108060102010b31302e302e302e313a383001000000000000494000000100010161000000000000d03f01010100",
        "45574c420c54030201010501000000000000f03f010000000000004940010b31302e302e302e313a38300161",
    ];
    assert_eq!(FORMAT_VERSION, 12, "update GOLDEN when the version moves");
    for (value, golden) in golden_values().iter().zip(GOLDEN) {
        assert_eq!(
            hex(value),
            golden,
            "the encoded layout changed: bump sync::FORMAT_VERSION and update GOLDEN"
        );
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn values_are_bounded_in_size() {
    use ewma_lb::record::state::HostState;
    use ewma_lb::record::sync::{
        decode_head, decode_slot, decode_table, MAX_RECORD_HOSTS, MAX_VALUE_BYTES,
    };
    // The largest record a configuration allows, with long addresses and zones, fits a value.
    let host = |i: usize| HostState {
        address: format!(
            "[fd00:1234:5678:9abc:def0:1234:{:04x}:{:04x}]:65535",
            i >> 16,
            i & 0xffff
        ),
        zone: "europe-west4-a-zone-of-a-long-name".into(),
        last_seen_ns: u64::MAX,
        active_since_ns: u64::MAX,
        samples: u64::MAX,
        spread_updated_ns: u64::MAX,
        rising_since_ns: u64::MAX,
        share: 1.0,
        ..HostState::default()
    };
    let record = ClusterState {
        hosts: (0..MAX_RECORD_HOSTS).map(host).collect(),
        ..ClusterState::default()
    };
    let bytes = encode(&record);
    assert!(bytes.len() <= MAX_VALUE_BYTES, "{} bytes", bytes.len());
    assert!(decode(&bytes, MAX_RECORD_HOSTS).is_ok());
    // A larger value is refused whatever it holds.
    let mut big = bytes.clone();
    big.resize(MAX_VALUE_BYTES + 1, 0);
    for result in [
        decode(&big, MAX_RECORD_HOSTS).err(),
        decode_head(&big).err(),
        decode_slot(&big).err(),
        decode_table(&big, MAX_RECORD_HOSTS).err(),
    ] {
        assert!(
            matches!(result, Some(DecodeError::Corrupt(_))),
            "{result:?}"
        );
    }
    // A value of one kind is not read as another.
    let [record, head, slot, table] = golden_values();
    assert!(decode_head(&record).is_err());
    assert!(decode_slot(&head).is_err());
    assert!(decode_table(&slot, 16).is_err());
    assert!(decode(&table, 16).is_err());
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn an_adopted_table_is_the_stored_one_holding_the_names_it_held_before() {
    use ewma_lb::record::table::{HostView, Table, TableHost, TableView};
    use std::rc::Rc;
    let view = |hosts: &[(&'static str, &'static str, f64)]| TableView {
        table_version: hosts.len() as u64,
        num_endpoints: 4,
        unknown_endpoints: 1,
        hosts_indistinguishable: false,
        hosts_hash: 0,
        hosts: hosts
            .iter()
            .map(|&(address, zone, share)| HostView {
                address,
                zone,
                share,
                latency_ms: Some(share * 100.0),
            })
            .collect(),
    };
    let before = Table::adopt(
        &view(&[("a:1", "z1", 0.5), ("b:1", "z1", 0.3), ("d:1", "", 0.2)]),
        &Table::default(),
    );
    // One host left (b), one joined (c), one moved zone (d).
    let now = view(&[("a:1", "z1", 0.2), ("c:1", "z2", 0.3), ("d:1", "z2", 0.5)]);
    let after = Table::adopt(&now, &before);
    let listed: Vec<(&str, &str, f64, Option<f64>)> = after
        .hosts()
        .map(|h| (&**h.address, &**h.zone, h.share, h.latency_ms))
        .collect();
    let stored: Vec<(&str, &str, f64, Option<f64>)> = now
        .hosts
        .iter()
        .map(|h| (h.address, h.zone, h.share, h.latency_ms))
        .collect();
    assert_eq!(listed, stored);
    assert_eq!(
        (
            after.table_version,
            after.num_endpoints,
            after.unknown_endpoints
        ),
        (3, 4, 1)
    );
    fn at(t: &Table, i: usize) -> TableHost<'_> {
        t.host_at(i).unwrap()
    }
    let held = |i: usize, j: usize| Rc::ptr_eq(at(&before, i).address, at(&after, j).address);
    assert!(held(0, 0) && held(2, 2), "names in both are the ones held");
    assert!(
        Rc::ptr_eq(at(&before, 0).zone, at(&after, 0).zone),
        "an unchanged zone too"
    );
    assert!(after.host("c:1").is_some() && after.host("b:1").is_none());
    assert!(!after.same_hosts(&before) && after.same_hosts(&Table::adopt(&now, &after)));
    // A worker forgets what it keeps of departed hosts only when a table lost one: hosts that
    // only joined leave nothing to forget.
    assert!(before.lost_hosts(&after), "b left");
    assert!(
        !after.lost_hosts(&Table::adopt(&now, &after)),
        "the same hosts"
    );
    let joined = Table::adopt(
        &view(&[
            ("a:1", "z1", 0.2),
            ("b:2", "z1", 0.1),
            ("c:1", "z2", 0.3),
            ("d:1", "z2", 0.3),
            ("e:1", "z2", 0.1),
        ]),
        &after,
    );
    assert!(!after.lost_hosts(&joined), "b:2 and e:1 joined, none left");
    assert!(joined.lost_hosts(&after), "seen the other way, two left");
    assert!(!Table::default().lost_hosts(&after) && after.lost_hosts(&Table::default()));
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_table_listing_the_hosts_held_is_read_without_its_names() {
    use ewma_lb::record::sync::{decode_table, decode_table_onto, encode_table};
    use ewma_lb::record::table::{hosts_hash, HostView, Table, TableView};
    use std::rc::Rc;
    let view = |names: &[(&'static str, &'static str)], share: f64| TableView {
        table_version: 1 + (share * 10.0) as u64,
        num_endpoints: 3,
        unknown_endpoints: 0,
        hosts_indistinguishable: false,
        hosts_hash: 0,
        hosts: names
            .iter()
            .map(|&(address, zone)| HostView {
                address,
                zone,
                share,
                latency_ms: Some(share * 100.0),
            })
            .collect(),
    };
    let names = [("a:1", "z1"), ("b:1", "z1"), ("c:1", "z2")];
    let held = Table::adopt(&view(&names, 0.2), &Table::default());
    assert_eq!(held.hosts_hash, hosts_hash(names));
    // What a refresher holding the same hosts writes: the hash it held, new shares.
    let mut next = view(&names, 0.3);
    let adopted = Table::adopt(&next, &held);
    assert_eq!(adopted.hosts_hash, held.hosts_hash);
    next.hosts_hash = adopted.hosts_hash;
    let bytes = encode_table(&next);
    let read = decode_table_onto(&bytes, 16, &held).unwrap();
    assert_eq!(
        read,
        Table::adopt(&decode_table(&bytes, 16).unwrap(), &held)
    );
    assert!(
        Rc::ptr_eq(read.addresses(), held.addresses()),
        "the list held"
    );
    assert_eq!(read.host_at(2).unwrap().share, 0.3);
    // The names are not read: cut off, the table still reads over the hosts held, and only so.
    let shares_only = &bytes[..bytes.len() - 20];
    assert!(decode_table(shares_only, 16).is_err());
    assert_eq!(decode_table_onto(shares_only, 16, &held).unwrap(), read);
    // Another list as long (one zone moved, one host replaced) is read with its own names.
    for other in [
        [("a:1", "z1"), ("b:1", "z2"), ("c:1", "z2")],
        [("a:1", "z1"), ("b:2", "z1"), ("c:1", "z2")],
    ] {
        let mut v = view(&other, 0.3);
        v.hosts_hash = Table::adopt(&v, &held).hosts_hash;
        assert_ne!(v.hosts_hash, held.hosts_hash, "{other:?}");
        let t = decode_table_onto(&encode_table(&v), 16, &held).unwrap();
        let listed: Vec<(&str, &str)> = t.hosts().map(|h| (&**h.address, &**h.zone)).collect();
        assert_eq!(listed, other);
    }
}

/// A host on trust is scored at the cluster's median: with its ramp over, it has no more than a
/// fair share among equal hosts, however many refreshes go by before its first answer. Its share
/// in force is what the others' shares already make room for, so it must not count as a
/// newcomer's again at every refresh.
#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn a_host_on_trust_gets_no_more_than_a_fair_share_while_it_waits() {
    let p = policy();
    let hosts = THREE_HOSTS;
    let mut state = measured_equal_hosts(&hosts, &p);
    let now = 21 * SEC;
    state.merge(&samples(&[(hosts[2], &[5.0, 5.0, 5.0], true)]), now, &p);
    let back = now + p.outlier.base_ejection_ns + 1;
    let mut t = back;
    let mut most: f64 = 0.0;
    while t <= back + 10 * SEC {
        answer_and_refresh(&mut state, &hosts[..2], t, &p);
        most = most.max(state.host(hosts[2]).map_or(0.0, |h| h.share));
        t += SEC / 4;
    }
    let last = state.host(hosts[2]).map_or(0.0, |h| h.share);
    assert!(
        most <= 1.0 / 3.0 + 0.01 && last >= 1.0 / 3.0 - 0.01,
        "on trust: at most {most}, at last {last}"
    );
}
