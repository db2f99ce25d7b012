//! Locality: keep traffic in the proxy's own zone while that zone serves well.
//!
//! Envoy's own locality-aware balancing does not apply to a host the plugin names (the
//! `override_host` policy bypasses it), so the plugin does it itself: crossing zones costs
//! latency and, in most clouds, money per byte. The local zone keeps all steered traffic while
//! its live hosts are within `spillover_latency_ratio` of the remote ones; past that, and when
//! local hosts are ejected or fewer than `min_local_hosts`, traffic spills over in proportion.
//! A small latency gain never sends everything across zones: the spill grows with the ratio,
//! and the local zone keeps its share until the ratio is crossed.

use super::median;
use crate::units::clamp;

/// `locality` in the plugin configuration.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LocalityParams {
    /// Off: zones are ignored and every host is weighed by latency alone.
    pub enabled: bool,
    /// How much slower (median smoothed latency) the local zone may be than the remote ones and
    /// still keep all steered traffic.
    pub spillover_latency_ratio: f64,
    /// Live local hosts below this spill over in proportion.
    pub min_local_hosts: u32,
}

impl Default for LocalityParams {
    fn default() -> Self {
        // 1.5: a cross-zone hop costs about a millisecond and money, so a zone that is a third
        // slower still keeps its traffic; one twice as slow keeps three quarters of it.
        LocalityParams {
            enabled: true,
            spillover_latency_ratio: 1.5,
            min_local_hosts: 1,
        }
    }
}

/// What the split needs to know of one host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZoneInput<'a> {
    /// `upstream.locality.zone`; empty when not known yet.
    pub zone: &'a str,
    pub score_ms: Option<f64>,
    pub ejected: bool,
}

/// Which hosts are local, and the share of steered traffic the local zone keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub is_local: Vec<bool>,
    pub local_share: f64,
}

/// The split for these hosts, or `None` when locality does not apply: turned off, the proxy's
/// zone unknown, or no live host on one side (nothing to keep local, or nowhere to spill to).
pub fn split(
    hosts: &[ZoneInput],
    local_zone: Option<&str>,
    params: &LocalityParams,
) -> Option<Split> {
    let local_zone = local_zone.filter(|z| params.enabled && !z.is_empty())?;
    let is_local: Vec<bool> = hosts.iter().map(|h| h.zone == local_zone).collect();
    let side = |local: bool| {
        hosts
            .iter()
            .zip(&is_local)
            .filter(move |(_, l)| **l == local)
            .map(|(h, _)| h)
    };
    let total_local = side(true).count();
    let live_local = side(true).filter(|h| !h.ejected).count();
    let live_remote = side(false).filter(|h| !h.ejected).count();
    if total_local == 0 || live_remote == 0 {
        return None;
    }
    let local_ms = median(side(true).filter(|h| !h.ejected).filter_map(|h| h.score_ms));
    let remote_ms = median(
        side(false)
            .filter(|h| !h.ejected)
            .filter_map(|h| h.score_ms),
    );
    let latency = match (local_ms, remote_ms) {
        (Some(l), Some(r)) if l > params.spillover_latency_ratio * r => {
            params.spillover_latency_ratio * r / l
        }
        _ => 1.0,
    };
    let health = live_local as f64 / total_local as f64;
    let enough = (live_local as f64 / f64::from(params.min_local_hosts.max(1))).min(1.0);
    Some(Split {
        is_local,
        local_share: clamp(latency * health * enough, 0.0, 1.0),
    })
}
