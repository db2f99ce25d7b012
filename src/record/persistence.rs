//! Persistence: the weight table follows what lasts; the moment belongs to the pick.
//!
//! A host that stalls for a moment (a garbage-collection pause, a noisy neighbour) already loses
//! the pick while it stalls: its requests pile up in flight, and the two-choice comparison sends
//! the next ones elsewhere. If its smoothed latency took the stall in as well, the table would
//! move its traffic away for seconds after it is fast again, which is the flapping the smoothing
//! exists to prevent. So a batch whose mean rises beyond what is usual for the host is held out of
//! the estimate until such batches have kept coming for `persistence`; then the estimate takes the
//! batch in, and since the held time counts as elapsed, a time-decayed smoother follows the rise
//! almost at once. A batch back within the usual range ends the hold.
//!
//! What is usual is measured per host: the smoothed distance `|ln(mean / estimate)|` of the
//! batches taken in (the spread). A host whose batches vary a lot by nature (mixed request costs,
//! a cache that hits or misses) has a wide spread, and its batches are taken in as they come; a
//! steady host's spike stands out. The bar is also never below the noise band in latency terms:
//! a rise that moves the share by less than the band is noise for `weights` anyway.
//!
//! Failures are never held: a failed request is evidence about the host, not a pause. Nor is the
//! wait of a request its client left before the host answered: the premise above fails for it,
//! since the request leaves this worker's count in flight when the client leaves, while the host
//! may be as stuck as before; the pick then sees an idle host and sends it the next requests,
//! each to be abandoned in its turn (a hung host, clients with a timeout shorter than the route's).

use crate::record::state::{Accumulator, HostState, Policy};

/// How many spreads above the estimate a batch's mean must lie to count as a rise.
const SPREADS: f64 = 3.0;
/// Time constant of the spread: a pause of a second moves it a tenth of the way.
const SPREAD_TAU_NS: f64 = 10_000_000_000.0;
/// Batches after which the spread is a time-decayed average; before, a plain one.
const SPREAD_WARMUP_BATCHES: u32 = 32;
/// The standard deviation of a normal variable per unit of its mean absolute deviation.
const SD_PER_MEAN_DEVIATION: f64 = 1.253_314;
/// Standard errors within which two scores are taken as equal (`weights`): two is about the
/// 95 % interval.
const STANDARD_ERRORS: f64 = 2.0;

/// Whether `acc` should be taken into `host`'s estimate now, and the bookkeeping of holds and
/// spread that goes with the answer. `now_ns` is record time.
pub fn admits(host: &mut HostState, acc: &Accumulator, now_ns: u64, policy: &Policy) -> bool {
    let (Some(estimate), Some(mean)) = (host.latency.value_ms(), acc.latency.mean_ms()) else {
        host.rising_since_ns = 0;
        return true;
    };
    if acc.failures > 0 || acc.abandoned > 0 || estimate <= 0.0 || mean <= 0.0 {
        host.rising_since_ns = 0;
        return true;
    }
    let distance = (mean / estimate).ln();
    // A rise that begins against an estimate older than the persistence itself has nothing to be
    // held against: the batch is the freshest word on a host seen rarely (a proxy of a large
    // fleet sees a host once in seconds), and holding it would hold every change for a second
    // sample, seconds later. (A rise already held keeps its clock: a pause must not outlast the
    // estimate it is held against.)
    let stale = host.rising_since_ns == 0
        && now_ns.saturating_sub(host.latency.updated_ns()) >= policy.persistence_ns;
    let rising = !stale && distance > threshold(host.spread, policy);
    // Every batch moves the spread, held or not: a host whose batches vary by nature comes to
    // show it (its high batches would be held for good otherwise), while a pause, over in a
    // second, moves a spread that remembers ten seconds by a tenth of the way.
    // A host's first batches are averaged alike: until the spread has seen a few, it knows
    // nothing of the host, and "steady" is only a guess that would hold a new host's every
    // load-driven rise.
    let keep = spread_keep(host, now_ns.saturating_sub(host.spread_updated_ns));
    host.spread = keep * host.spread + (1.0 - keep) * distance.abs();
    host.spread_updated_ns = now_ns;
    host.spread_batches = host
        .spread_batches
        .saturating_add(1)
        .min(SPREAD_WARMUP_BATCHES);
    if rising {
        if host.rising_since_ns == 0 {
            host.rising_since_ns = now_ns.max(1);
        }
        if now_ns.saturating_sub(host.rising_since_ns) < policy.persistence_ns {
            return false;
        }
    } else {
        host.rising_since_ns = 0;
    }
    true
}

/// The weight the spread (or the noise) keeps when a batch comes `dt_ns` after the last: what
/// ten seconds leave of it, or while the host's first batches come, their plain average.
fn spread_keep(host: &HostState, dt_ns: u64) -> f64 {
    let decayed = (-(dt_ns as f64) / SPREAD_TAU_NS).exp();
    if host.spread_batches >= SPREAD_WARMUP_BATCHES {
        return decayed;
    }
    let seen = f64::from(host.spread_batches);
    decayed.min(seen / (seen + 1.0))
}

/// The least `ln(mean / estimate)` that counts as a rise: `SPREADS` spreads, and at least the
/// latency ratio that moves a share by the noise band (`noise_band^(1/exponent)`).
fn threshold(spread: f64, policy: &Policy) -> f64 {
    let weights = &policy.weights;
    let band = if weights.exponent > 0.0 {
        weights.noise_band.max(1.0).ln() / weights.exponent
    } else {
        0.0
    };
    (SPREADS * spread).max(band)
}

/// Counts a batch taken into the estimate at `now_ns` in the evidence behind it: the batches
/// within the smoother's memory, each weighted by how much of it the estimate still holds.
/// Also learns how far the batches taken in lie from the estimate (`noise`): held batches are not
/// in the estimate, so they do not make it less certain.
pub fn observed(host: &mut HostState, acc: &Accumulator, now_ns: u64, policy: &Policy) {
    let dt_ns = now_ns.saturating_sub(host.latency.updated_ns());
    let memory_ns = policy.smoother.memory_ns().max(1);
    let keep = (-(dt_ns as f64) / memory_ns as f64).exp();
    host.evidence = keep * host.evidence + 1.0;
    let (Some(estimate), Some(mean)) = (host.latency.value_ms(), acc.latency.mean_ms()) else {
        return;
    };
    // A wait cut short by its client is only a bound on the host's latency, not a measure of
    // how far its batches stray.
    if acc.failures > 0 || acc.abandoned > 0 || estimate <= 0.0 || mean <= 0.0 {
        return;
    }
    let keep = spread_keep(host, dt_ns);
    host.noise = keep * host.noise + (1.0 - keep) * (mean / estimate).ln().abs();
}

/// How uncertain a host's estimate is, as a distance in `ln(latency)`: `STANDARD_ERRORS` standard
/// errors of the mean of the batches behind it (their `noise`). Scores closer than this to the
/// traffic's reference are taken as equal to it (`weights`), so equal hosts, whose estimates differ
/// by chance alone, get equal shares; a host measured by a few probes is uncertain and stays closer
/// to the rest until it has been measured better.
pub fn uncertainty(host: &HostState) -> f64 {
    if host.evidence <= 0.0 {
        return 0.0;
    }
    STANDARD_ERRORS * SD_PER_MEAN_DEVIATION * host.noise / host.evidence.max(1.0).sqrt()
}
