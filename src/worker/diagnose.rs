//! Diagnosis: misconfigurations the plugin can see in its own traffic, and how often it says so.
//!
//! Two look healthy otherwise (issue 21):
//! - Envoy ignores the picks: the cluster's `override_host` policy reads another header than the
//!   plugin's `override_header`, or the cluster has no such policy. Requests still flow, the
//!   plugin still counts them steered; only the host that served them differs from the pick.
//!   [`HonourWatch`] judges the share of unhonoured picks over a window, so that an endpoint
//!   leaving the cluster (its picks go unhonoured until every VM adopts a table without it, a
//!   tick or two) does not warn.
//! - A name in `steered_clusters` no request ever carries, a typo most likely: its requests are
//!   `unlisted_cluster` fallbacks and the status page shows nothing. [`SteeredWatch`] says so
//!   once the plugin has run for a while, naming the clusters it did see.
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

/// How long after a VM's first tick a steered cluster may go unseen before the plugin warns.
pub const UNSEEN_AFTER_NS: u64 = 30 * NS_PER_SEC;
/// At most one warning of unseen steered clusters (per VM) this often.
pub const UNSEEN_EVERY_NS: u64 = 300 * NS_PER_SEC;
/// Cluster names a warning lists at most.
pub const MAX_LISTED: usize = 20;

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

/// The exact names of `steered_clusters` no request has carried yet, and when to say so.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SteeredWatch {
    unseen: Vec<String>,
    /// The VM's first tick.
    started_ns: Option<u64>,
    warned_ns: Option<u64>,
}

impl SteeredWatch {
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        SteeredWatch {
            unseen: names.into_iter().map(str::to_owned).collect(),
            ..SteeredWatch::default()
        }
    }

    /// Forgets the names `seen` says were seen: they are no typo. Nothing is left to do, and
    /// nothing is called, once every name was seen.
    pub fn observe(&mut self, mut seen: impl FnMut(&str) -> bool) {
        self.unseen.retain(|name| !seen(name));
    }

    /// The names not seen so far.
    pub fn unseen(&self) -> &[String] {
        &self.unseen
    }

    /// Whether a warning may be given now: names are unseen, the VM has run for
    /// [`UNSEEN_AFTER_NS`] since its first check, and it has not warned for [`UNSEEN_EVERY_NS`].
    /// Called on every tick; the first call starts the clock.
    pub fn due(&mut self, now_ns: u64) -> bool {
        let started_ns = *self.started_ns.get_or_insert(now_ns);
        !self.unseen.is_empty()
            && now_ns.saturating_sub(started_ns) >= UNSEEN_AFTER_NS
            && self
                .warned_ns
                .is_none_or(|at| now_ns.saturating_sub(at) >= UNSEEN_EVERY_NS)
    }

    /// Starts the wait for the next warning (whether or not this one was given).
    pub fn warned(&mut self, now_ns: u64) {
        self.warned_ns = Some(now_ns);
    }

    /// How long the VM has run since its first check.
    pub(crate) fn running_ns(&self, now_ns: u64) -> u64 {
        self.started_ns
            .map_or(0, |started| now_ns.saturating_sub(started))
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
    /// `names` of `steered_clusters` were in no request for `after_ns`; `seen` are the cluster
    /// names this VM saw (at most [`MAX_LISTED`]), `more` how many others.
    UnseenClusters {
        names: Vec<String>,
        after_ns: u64,
        seen: Vec<String>,
        more: usize,
    },
    /// The last `polls` polls of Envoy's admin through `admin_cluster` brought no page of hosts.
    HealthUnanswered { admin_cluster: String, polls: u64 },
}

impl Warning {
    /// An [`Warning::UnseenClusters`] listing `seen` sorted, at most [`MAX_LISTED`] of them.
    pub fn unseen_clusters<'a>(
        names: &[String],
        after_ns: u64,
        seen: impl IntoIterator<Item = &'a str>,
    ) -> Warning {
        let mut seen: Vec<String> = seen.into_iter().map(str::to_owned).collect();
        seen.sort_unstable();
        let more = seen.len().saturating_sub(MAX_LISTED);
        seen.truncate(MAX_LISTED);
        Warning::UnseenClusters {
            names: names.to_vec(),
            after_ns,
            seen,
            more,
        }
    }
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
            Warning::HealthUnanswered {
                admin_cluster,
                polls,
            } => write!(
                f,
                "none of the last {polls} polls of Envoy's admin (/clusters through cluster \
                 {admin_cluster}) brought a page of hosts (each was refused, timed out, cut \
                 off, not 200 or empty): the hosts Envoy's health checks mark unhealthy are \
                 picked like the others until one does. envoy_health.admin_cluster must lead \
                 to Envoy's admin address; a cluster of many hosts needs a longer \
                 envoy_health.poll_interval_ms"
            ),
            Warning::UnseenClusters {
                names,
                after_ns,
                seen,
                more,
            } => {
                let quoted: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
                write!(
                    f,
                    "steered_clusters names {} but no request went to such a cluster in {} s: a \
                     typo? Requests to a cluster not in steered_clusters are left to Envoy \
                     (ewma_lb_fallback_requests_total reason=\"unlisted_cluster\"). Clusters \
                     this worker saw requests for: {}",
                    quoted.join(", "),
                    after_ns / NS_PER_SEC,
                    if seen.is_empty() {
                        "none".to_owned()
                    } else {
                        seen.join(", ")
                    },
                )?;
                if *more > 0 {
                    write!(f, " and {more} more")?;
                }
                Ok(())
            }
        }
    }
}
