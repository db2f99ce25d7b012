//! Exploration: the share a VM leaves to the cluster's own policy follows what the table does
//! not know, with at least half the requests for a window after unknown endpoints appear.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::balance::explore::{Exploration, LEARNING_SHARE, LEARNING_WINDOW_NS};

const CONFIGURED: f64 = 0.002;

fn updated(steps: &[(u32, u32, u64)]) -> Exploration {
    let mut e = Exploration::default();
    for &(unknown, endpoints, now_ns) in steps {
        e.update(unknown, endpoints, CONFIGURED, now_ns);
    }
    e
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_configured_share_until_the_endpoint_count_is_known() {
    assert_eq!(updated(&[(0, 0, 1)]).share(), CONFIGURED);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn nothing_left_to_the_fallback_once_every_endpoint_is_known() {
    assert_eq!(updated(&[(0, 3, 1)]).share(), 0.0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_learning_share_for_the_window_then_the_unknown_fraction() {
    let start = 1_000;
    let e = updated(&[(1, 50, start)]);
    assert_eq!(e.share(), LEARNING_SHARE);
    let e = updated(&[(1, 50, start), (1, 50, start + LEARNING_WINDOW_NS - 1)]);
    assert_eq!(e.share(), LEARNING_SHARE);
    let e = updated(&[(1, 50, start), (1, 50, start + LEARNING_WINDOW_NS)]);
    assert_eq!(e.share(), 1.0 / 50.0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn more_unknown_endpoints_open_a_new_window_fewer_do_not() {
    let later = LEARNING_WINDOW_NS + 10;
    let grew = updated(&[(1, 50, 0), (2, 50, later)]);
    assert_eq!(grew.share(), LEARNING_SHARE);
    let shrank = updated(&[(2, 50, 0), (1, 50, later)]);
    assert_eq!(shrank.share(), 1.0 / 50.0);
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_unknown_fraction_wins_over_the_learning_share_and_stays_at_most_one() {
    assert_eq!(updated(&[(3, 4, 0)]).share(), 0.75);
    assert_eq!(updated(&[(5, 4, 0)]).share(), 1.0);
}
