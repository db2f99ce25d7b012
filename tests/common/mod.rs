//! Assertion helpers of the end-to-end tests. Starting Envoy, backends and load is the harness's
//! job (`harness::Stack`), the same one the benchmark uses.

#![allow(dead_code)] // each test binary uses its own part

use harness::Stack;

/// Share of `name` among all counts.
pub fn share(counts: &[(String, u64)], name: &str) -> f64 {
    let total: u64 = counts.iter().map(|(_, c)| c).sum();
    let mine = counts
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, c)| *c);
    if total == 0 {
        0.0
    } else {
        mine as f64 / total as f64
    }
}

/// The samples the plugin has merged for all of `stack`'s backends (its status page).
pub fn samples(stack: &Stack) -> u64 {
    stack
        .backends
        .iter()
        .map(|b| {
            stack.host_status(b.name()).unwrap()["samples"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// Envoy's log says nothing of a panic or a failed VM.
pub fn assert_log_clean(stack: &Stack) {
    let log = stack.envoy.log();
    for needle in [
        "panicked",
        "Wasm VM failed",
        "wasm_fail_stream",
        "[critical]",
    ] {
        assert!(!log.contains(needle), "Envoy log mentions {needle:?}");
    }
}

/// Envoy's log and its stats say no VM of the plugin failed or was reloaded.
pub fn assert_vm_never_failed(stack: &Stack) {
    assert_log_clean(stack);
    let stats = stack.envoy.stats().unwrap_or_default();
    let failures: Vec<(&String, &u64)> = stats
        .iter()
        .filter(|(k, v)| {
            (k.contains("vm_reload") || k.ends_with(".failed")) && !k.contains("backoff") && **v > 0
        })
        .collect();
    assert!(
        failures.is_empty(),
        "the VM failed or was reloaded: {failures:?}"
    );
}
