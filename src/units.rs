//! Units in one place. The core keeps time as `u64` nanoseconds (`*_ns`) and latency as `f64`
//! milliseconds (`*_ms`); the operator configures durations in whole milliseconds. Every
//! conversion between them goes through here, so no bare `1e6` hides in an expression.

pub(crate) const NS_PER_US: u64 = 1_000;
pub(crate) const NS_PER_MS: u64 = 1_000_000;
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// A configured duration in ms as core time; saturates instead of wrapping.
pub(crate) const fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(NS_PER_MS)
}

/// Whole milliseconds in `ns`, rounded down: for durations shown to operators.
pub(crate) const fn ns_to_whole_ms(ns: u64) -> u64 {
    ns / NS_PER_MS
}

/// A measured duration in ns as a latency in ms.
pub fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / NS_PER_MS as f64
}

/// A latency in ms as core time (for decay arithmetic in `f64`).
pub(crate) fn ms_to_ns_f64(ms: f64) -> f64 {
    ms * NS_PER_MS as f64
}

/// A latency in ms as whole microseconds, for integer gauges.
pub(crate) fn ms_to_whole_us(ms: f64) -> u64 {
    (ms * (NS_PER_MS / NS_PER_US) as f64).round().max(0.0) as u64
}

/// `v` kept within `[lo, hi]`. Unlike `f64::clamp` it never panics (that one asserts `lo <= hi`
/// and that neither is NaN, and formats both into its panic message), and a NaN bound or value
/// falls back to the other side: a NaN read from shared data must not stop a VM.
pub fn clamp(v: f64, lo: f64, hi: f64) -> f64 {
    v.max(lo).min(hi)
}

/// A share in [0, 1] as parts per million, for integer gauges.
pub(crate) fn share_to_ppm(share: f64) -> u64 {
    (share * 1e6).round().max(0.0) as u64
}
