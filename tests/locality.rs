//! Locality: the share of steered traffic the proxy's zone keeps, case by case.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::locality::{split, LocalityParams, ZoneInput};
use ewma_lb::balance::weights::{shares_within, HostInput, WeightParams};

fn zone(zone: &'static str, score_ms: f64) -> ZoneInput<'static> {
    ZoneInput {
        zone,
        score_ms: Some(score_ms),
        ejected: false,
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_local_zone_keeps_its_traffic_until_it_is_clearly_slower() {
    let p = LocalityParams::default(); // spill past 1.5x
    let ejected = |mut z: ZoneInput<'static>| {
        z.ejected = true;
        z
    };
    type Case = (&'static str, Vec<ZoneInput<'static>>, Option<f64>);
    let cases: Vec<Case> = vec![
        (
            "equal zones",
            vec![
                zone("a", 50.0),
                zone("a", 50.0),
                zone("b", 50.0),
                zone("b", 50.0),
            ],
            Some(1.0),
        ),
        (
            "a small gain elsewhere",
            vec![zone("a", 70.0), zone("b", 50.0)],
            Some(1.0),
        ),
        (
            "twice as slow",
            vec![zone("a", 100.0), zone("b", 50.0)],
            Some(0.75),
        ),
        (
            "four times as slow",
            vec![zone("a", 200.0), zone("b", 50.0)],
            Some(0.375),
        ),
        (
            "half the local hosts ejected",
            vec![zone("a", 50.0), ejected(zone("a", 50.0)), zone("b", 50.0)],
            Some(0.5),
        ),
        (
            "every local host ejected",
            vec![ejected(zone("a", 50.0)), zone("b", 50.0)],
            Some(0.0),
        ),
        (
            "no local host",
            vec![zone("b", 50.0), zone("c", 50.0)],
            None,
        ),
        (
            "nowhere to spill to",
            vec![zone("a", 500.0), ejected(zone("b", 50.0))],
            None,
        ),
        (
            "zones unknown yet count as remote",
            vec![zone("a", 50.0), zone("", 50.0)],
            Some(1.0),
        ),
    ];
    for (name, hosts, want) in cases {
        let got = split(&hosts, Some("a"), &p).map(|s| s.local_share);
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{name}: {g} != {w}"),
            (g, w) => assert_eq!(g, w, "{name}"),
        }
    }
    let two = vec![zone("a", 50.0), zone("b", 50.0)];
    assert_eq!(split(&two, None, &p), None, "the proxy's zone unknown: off");
    assert_eq!(
        split(
            &two,
            Some("a"),
            &LocalityParams {
                enabled: false,
                ..p.clone()
            }
        ),
        None,
        "turned off"
    );
    let few = LocalityParams {
        min_local_hosts: 2,
        ..p
    };
    assert_eq!(
        split(&two, Some("a"), &few).map(|s| s.local_share),
        Some(0.5),
        "one local host of the two wanted"
    );
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn shares_follow_the_split_and_keep_the_floor() {
    let params = WeightParams {
        slow_start_ns: 0,
        ..WeightParams::default()
    };
    let host = |score_ms| HostInput {
        score_ms: Some(score_ms),
        uncertainty: 0.0,
        active_for_ns: 0,
        ejected: false,
        previous_share: None,
        share_on_trust: false,
        share_age_ns: 0,
    };
    let hosts = [host(50.0), host(50.0), host(25.0), host(25.0)];
    let zones = [
        zone("a", 50.0),
        zone("a", 50.0),
        zone("b", 25.0),
        zone("b", 25.0),
    ];
    // The remote zone is twice as fast (50 > 1.5 x 25): a quarter spills over.
    let s = split(&zones, Some("a"), &LocalityParams::default()).unwrap();
    assert!((s.local_share - 0.75).abs() < 1e-9);
    let shares = shares_within(&hosts, &params, Some(&s));
    assert!((shares[0] + shares[1] - 0.75).abs() < 1e-9, "{shares:?}");
    assert!(
        (shares[0] - shares[1]).abs() < 1e-12 && (shares[2] - shares[3]).abs() < 1e-12,
        "{shares:?}"
    );
    // Everything local: the remote hosts keep the floor, so their latency stays known.
    let equal = [
        zone("a", 50.0),
        zone("a", 50.0),
        zone("b", 50.0),
        zone("b", 50.0),
    ];
    let s = split(&equal, Some("a"), &LocalityParams::default()).unwrap();
    let shares = shares_within(
        &[host(50.0), host(50.0), host(50.0), host(50.0)],
        &params,
        Some(&s),
    );
    assert!((shares[2] - params.min_share).abs() < 1e-12, "{shares:?}");
}
