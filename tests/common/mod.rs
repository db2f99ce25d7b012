//! Assertion helpers of the end-to-end tests. Starting Envoy, backends and load is the harness's
//! job (`harness::Stack`), the same one the benchmark uses.

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
