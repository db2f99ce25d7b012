//! Time: a step of the host's clock, back or forward, changes no timer and no sample.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test;

use ewma_lb::clock::{RecordClock, VmClock};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const HOUR: u64 = 3600 * SEC;

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn steady_time_ignores_steps_either_way() {
    // (raw reading, steady time expected): readings 100 ms apart, then a step back by an hour,
    // then a step forward by two hours; steady time advances 100 ms a reading throughout.
    let cases: &[(u64, u64)] = &[
        (5 * HOUR, 0),
        (5 * HOUR + 100 * MS, 100 * MS),
        (4 * HOUR + 200 * MS, 100 * MS),
        (4 * HOUR + 300 * MS, 200 * MS),
        (6 * HOUR + 400 * MS, 200 * MS),
        (6 * HOUR + 500 * MS, 300 * MS),
    ];
    let mut clock = VmClock::new(SEC);
    for (raw, steady) in cases {
        assert_eq!(clock.now(*raw), *steady, "raw {raw}");
    }
}

#[test]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test)]
fn the_record_clock_is_one_timeline_for_vms_with_different_epochs() {
    // Two VMs whose steady clocks started 7 s apart share one record.
    let (mut a, mut b) = (RecordClock::default(), RecordClock::default());
    let t0 = a.now(0, None);
    assert_eq!(t0, 0, "the first VM starts the record's clock");
    // B first sees the record 1 s later (its own steady time: 1 s + 7 s).
    let tb = b.now(8 * SEC, Some(t0));
    assert_eq!(tb, t0, "a VM that just met the record adopts its time");
    // From then on both advance with real time, and agree.
    let ta = a.now(2 * SEC, Some(tb));
    let tb = b.now(9 * SEC, Some(ta));
    assert_eq!(ta, 2 * SEC);
    assert_eq!(tb, 2 * SEC);
    assert_eq!(a.estimate(3 * SEC), b.estimate(10 * SEC));
}
