//! Exploration: the share of a cluster's requests a VM leaves to the cluster's own policy.
//!
//! Endpoints the record does not know get requests only through that policy: a table that knows
//! one host of three must not send that host every steered request, so the fallback gets at
//! least the unknown fraction. The fallback spreads what it gets over every endpoint, known ones
//! included, so an unknown endpoint receives that fraction of its fair share: with one of fifty
//! unknown, 2 % of it, and it could go unmet for seconds. So for a while after unknown endpoints
//! appear the fallback gets at least [`LEARNING_SHARE`]: each unknown endpoint then receives
//! that part of its fair share and is met within a few of its requests. An endpoint that is
//! never met (one Envoy counts but does not route to) costs that share only for
//! [`LEARNING_WINDOW_NS`], then its fraction.

use crate::units::NS_PER_SEC;

/// How long after endpoints appear that the table does not know the fallback gets at least
/// [`LEARNING_SHARE`] of the requests.
pub const LEARNING_WINDOW_NS: u64 = 5 * NS_PER_SEC;
/// The fallback's share during [`LEARNING_WINDOW_NS`].
pub const LEARNING_SHARE: f64 = 0.5;

/// One cluster's exploration in one VM, updated on every tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exploration {
    share: f64,
    /// Endpoints the table did not know at the last update, and since when it has been learning
    /// (the last update at which that count grew).
    unknown_seen: u32,
    learning_since_ns: u64,
}

impl Exploration {
    /// The share of requests to leave to the fallback, in [0, 1].
    pub fn share(&self) -> f64 {
        self.share
    }

    /// Takes in the record's view at `now_ns`: `unknown` of the cluster's `num_endpoints` (as
    /// Envoy counts them; 0 when not known yet) are not in the table. `configured` is
    /// `exploration_share`.
    pub fn update(&mut self, unknown: u32, num_endpoints: u32, configured: f64, now_ns: u64) {
        if unknown > self.unknown_seen {
            self.learning_since_ns = now_ns;
        }
        self.unknown_seen = unknown;
        // Once the record knows every endpoint Envoy counts, there is nothing to find: probes,
        // not the fallback, keep the known ones measured.
        let everything_known = num_endpoints > 0 && unknown == 0;
        let mut share = if everything_known { 0.0 } else { configured };
        if unknown > 0 {
            share = share.max(f64::from(unknown) / f64::from(num_endpoints));
            if now_ns.saturating_sub(self.learning_since_ns) < LEARNING_WINDOW_NS {
                share = share.max(LEARNING_SHARE);
            }
        }
        self.share = share.min(1.0);
    }
}
