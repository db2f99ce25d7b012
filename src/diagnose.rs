//! Diagnosis: misconfigurations the plugin can see in its own traffic, and how often it says so.
//!
//! One looks healthy otherwise (issue 21):
//! - Envoy ignores the picks: the cluster's `override_host` policy reads another header than the
//!   plugin's `override_header`, or the cluster has no such policy. Requests still flow, the
//!   plugin still counts them steered; only the host that served them differs from the pick.
//!   [`HonourWatch`] judges the share of unhonoured picks over a window, so that an endpoint
//!   leaving the cluster (its picks go unhonoured until every VM adopts a table without it, a
//!   tick or two) does not warn.
//!
//! Each watch is per VM, takes the time as a parameter and rate-limits itself; the worker feeds
//! them and hands the adapter [`Warning`]s to log.

use std::fmt;

use crate::units::NS_PER_SEC;

/// Picks in a window below which the share of unhonoured ones says nothing.
pub const MIN_PICKS: u32 = 20;
/// The shortest window picks are judged over: long enough that the picks of an endpoint that
/// left, unhonoured for a tick or two, are a small part of it.
pub const WINDOW_NS: u64 = 5 * NS_PER_SEC;
/// A window that has not reached [`MIN_PICKS`] by then starts over (old picks say little).
pub const MAX_WINDOW_NS: u64 = 60 * NS_PER_SEC;
/// At most one warning of unhonoured picks per cluster (and VM) this often.
pub const NOT_HONOURED_EVERY_NS: u64 = 60 * NS_PER_SEC;

/// Picks of one cluster in the current window, and when the last warning was.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HonourWatch {
    picks: u32,
    not_honoured: u32,
    /// Start of the window: the first check after the last one closed it.
    since_ns: Option<u64>,
    warned_ns: Option<u64>,
}

/// A window in which Envoy did not honour most picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unhonoured {
    pub picks: u32,
    pub not_honoured: u32,
    pub window_ns: u64,
}

impl HonourWatch {
    /// One pick whose request finished; `honoured`: Envoy sent its first attempt to the picked
    /// host. Per request: two integers.
    pub fn record(&mut self, honoured: bool) {
        self.picks = self.picks.saturating_add(1);
        if !honoured {
            self.not_honoured = self.not_honoured.saturating_add(1);
        }
    }

    /// Called on every tick with the VM's steady time. Closes the window once it spans
    /// [`WINDOW_NS`] and holds [`MIN_PICKS`]; returns it when more than half its picks were not
    /// honoured and no warning was given for [`NOT_HONOURED_EVERY_NS`].
    pub fn check(&mut self, now_ns: u64) -> Option<Unhonoured> {
        let since_ns = *self.since_ns.get_or_insert(now_ns);
        let window_ns = now_ns.saturating_sub(since_ns);
        if window_ns < WINDOW_NS {
            return None;
        }
        if self.picks < MIN_PICKS {
            if window_ns >= MAX_WINDOW_NS {
                self.restart(now_ns);
            }
            return None;
        }
        let window = Unhonoured {
            picks: self.picks,
            not_honoured: self.not_honoured,
            window_ns,
        };
        self.restart(now_ns);
        let most = u64::from(window.not_honoured) * 2 > u64::from(window.picks);
        let quiet = self
            .warned_ns
            .is_none_or(|at| now_ns.saturating_sub(at) >= NOT_HONOURED_EVERY_NS);
        if !(most && quiet) {
            return None;
        }
        self.warned_ns = Some(now_ns);
        Some(window)
    }

    fn restart(&mut self, now_ns: u64) {
        self.picks = 0;
        self.not_honoured = 0;
        self.since_ns = Some(now_ns);
    }
}

/// What the adapter logs as a warning, worded here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Warning {
    /// Envoy served most of a window's picks for `cluster` by another host.
    NotHonoured {
        cluster: String,
        window: Unhonoured,
        /// The plugin's `override_header`.
        header: String,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::NotHonoured {
                cluster,
                window,
                header,
            } => write!(
                f,
                "Envoy did not honour {} of {} picks for cluster {cluster} in the last {} s \
                 (another host served the first attempt; counted in \
                 ewma_lb_picks_not_honoured_total). Likely causes: the cluster's override_host \
                 policy reads another header than the plugin's override_header \"{header}\", or \
                 the cluster has no override_host load_balancing_policy",
                window.not_honoured,
                window.picks,
                window.window_ns / NS_PER_SEC,
            ),
        }
    }
}
