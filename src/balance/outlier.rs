//! Passive health: eject a host after consecutive failures, for a time that grows on repeated
//! ejections and shrinks back while the host stays healthy.
//!
//! Modelled on nginx's `max_fails=3 fail_timeout=30s` and Envoy's outlier detection
//! (`consecutive_5xx`, `base_ejection_time`, `max_ejection_percent`): never eject so much of a
//! cluster that the rest is overloaded; past that share, spreading load beats piling it up.

use serde::{Deserialize, Serialize};

use crate::units::{clamp, ms_to_ns};

/// `outlier_detection` in the plugin configuration (which gives the times in ms).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutlierParams {
    /// Consecutive failures that eject a host; 0 turns ejection off.
    pub consecutive_failures: u32,
    /// First ejection time; the n-th consecutive ejection lasts n times as long.
    pub base_ejection_ns: u64,
    /// Cap on one ejection's time.
    pub max_ejection_ns: u64,
    /// Largest share of a cluster's hosts ejected at once (at least one host of two or more).
    pub max_ejection_share: f64,
}

impl Default for OutlierParams {
    fn default() -> Self {
        OutlierParams {
            consecutive_failures: 3,
            base_ejection_ns: ms_to_ns(30_000),
            max_ejection_ns: ms_to_ns(300_000),
            max_ejection_share: 0.5,
        }
    }
}

/// One host's passive-health record, kept in shared state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub consecutive_failures: u32,
    /// 0 when the host is not ejected.
    pub ejected_until_ns: u64,
    /// How many ejections in a row the host has had; sets the next ejection's length.
    pub ejections_in_a_row: u32,
    /// Since when the host has been serving without ejection; `ejections_in_a_row` decays with it.
    pub healthy_since_ns: u64,
}

impl Health {
    pub fn is_ejected(&self, now_ns: u64) -> bool {
        self.ejected_until_ns > now_ns
    }

    /// Records a batch's outcomes: `failures` in total, of which `trailing` came after its last
    /// success (`had_success`).
    pub fn record(&mut self, failures: u32, trailing: u32, had_success: bool) {
        self.consecutive_failures = if had_success {
            trailing
        } else {
            self.consecutive_failures.saturating_add(failures)
        };
    }

    pub(crate) fn should_eject(&self, params: &OutlierParams, now_ns: u64) -> bool {
        params.consecutive_failures > 0
            && !self.is_ejected(now_ns)
            && self.consecutive_failures >= params.consecutive_failures
    }

    pub fn eject(&mut self, params: &OutlierParams, now_ns: u64) {
        self.ejections_in_a_row = self.ejections_in_a_row.saturating_add(1);
        let ejection_ns = params
            .base_ejection_ns
            .saturating_mul(u64::from(self.ejections_in_a_row))
            .min(params.max_ejection_ns.max(params.base_ejection_ns));
        self.ejected_until_ns = now_ns.saturating_add(ejection_ns).max(1);
        self.consecutive_failures = 0;
    }

    /// Ends an elapsed ejection (returns true when it did) and lets the ejection count decay by
    /// one for every base ejection time served without a new ejection.
    pub fn tick(&mut self, params: &OutlierParams, now_ns: u64) -> bool {
        let base_ns = params.base_ejection_ns.max(1);
        if self.ejected_until_ns != 0 && !self.is_ejected(now_ns) {
            self.ejected_until_ns = 0;
            self.consecutive_failures = 0;
            self.healthy_since_ns = now_ns;
            return true;
        }
        if self.ejected_until_ns == 0
            && self.ejections_in_a_row > 0
            && now_ns.saturating_sub(self.healthy_since_ns) >= base_ns
        {
            self.ejections_in_a_row -= 1;
            self.healthy_since_ns = now_ns;
        }
        false
    }
}

/// How many of `hosts` may be ejected at once.
pub(crate) fn ejection_budget(params: &OutlierParams, hosts: usize) -> usize {
    if hosts < 2 {
        return 0;
    }
    ((clamp(params.max_ejection_share, 0.0, 1.0) * hosts as f64).floor() as usize).max(1)
}
