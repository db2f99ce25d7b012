//! Weights: from each host's smoothed score to its share of the traffic.
//!
//! A share is `score^-exponent`, normalised, then shaped by six rules that keep the table calm:
//! - cold start: a host without samples is scored at the cluster's median, not 0 (it would be
//!   flooded) nor infinity (it would starve);
//! - slow start: a new or returning host's share ramps up linearly over `slow_start`. The ramp is
//!   a schedule, not noise: the noise band holds neither its steps, nor its last one at the first
//!   refresh after it, nor the room the other hosts make for it (`scheduled`, `standing` below);
//! - noise: a target within a factor `noise_band` of the host's share in force is approached by
//!   `noise_gain` of the way per refresh, and only the part of a move beyond the band is made at
//!   once. Equal hosts' scores differ from refresh to refresh by chance alone (a tick's batch is a
//!   handful of samples); followed at once, those differences swing the traffic between them,
//!   while a real change (a slow host, a queue) moves the target far beyond the band;
//! - damping: a share moves at most by a factor `max_step_ratio` per refresh, up or down. A rise
//!   is bounded because traffic moving onto a host is what herds (every proxy of a fleet moving
//!   onto the same host at once). A fall only spreads a host's traffic over the others, but a
//!   deep one is slow to undo under the bound on rises: a host that alternates slow and fast
//!   would spend most of each fast phase climbing back from the floor (without the bound below,
//!   bench/tests/tune.rs's host alternating every 2 s loses more than half of what a longer
//!   time constant gains);
//! - standing: the noise band and the bound on a fall count from a host's standing among the
//!   hosts the table now holds. When hosts join (new, or back from ejection) or ramp in, that is
//!   its share in force scaled as if the table in force had given them what they get now (beside
//!   what it gave the ramping ones then, which the others' shares held the rest of). A share
//!   granted among fewer hosts is no standing to fall from slowly: a cluster learned from
//!   traffic gives the first host it knows the whole table, and halving that over the refreshes
//!   it takes to reach a fair share floods the host meanwhile. A rise is still bounded from the
//!   share in force: that is the traffic the host had. Nor is a share granted on trust, before
//!   any latency of the host was known (scored at the median): its own share moves as a new
//!   host's until the table holds its latency, so its first answers move it at once, down to the
//!   floor if they are slow enough (`record::state`, `share_on_trust`). To the other hosts it is
//!   no newcomer: their shares in force already make room for it, and scaling them down for it
//!   again at every refresh would hand it more than a fair share before it has answered;
//! - floor: every live host keeps at least `min_share` in the table, the level its share climbs
//!   back from; in a large cluster at most `min_fair_share` of a fair share (1/n), or a floor
//!   above the fair share would pin every host to it and the table could not steer. A host at
//!   the floor gets no traffic from the pick, only probes (`probe`).
//!
//! Ejected hosts get nothing; they are excluded before any of the rules apply.

use super::locality::Split;
use super::median;
use crate::units::{clamp, ms_to_ns};

/// The tunables of [`shares`]; `weights` in the plugin configuration (which gives the ramp in ms).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WeightParams {
    /// Share ∝ score^-exponent. 1 is "inverse latency"; 2 makes a 10x slower host 100x less loaded.
    pub exponent: f64,
    /// Least share of every live host ...
    pub min_share: f64,
    /// ... but at most this fraction of a fair share (1 / live hosts).
    pub min_fair_share: f64,
    /// Largest factor by which one refresh may raise a host's share.
    pub max_step_ratio: f64,
    /// Targets within this factor of a host's share are treated as noise (see `settle`).
    pub noise_band: f64,
    /// Share of the way to a target within the band made per refresh; 1 follows every target.
    pub noise_gain: f64,
    /// Ramp-up time of a new or returning host; 0 turns slow start off.
    pub slow_start_ns: u64,
    /// Share factor a host starts its ramp at.
    pub slow_start_min_factor: f64,
}

impl WeightParams {
    /// The most one refresh moves a share on chance alone: `noise_gain` of the way across the
    /// noise band, a factor `noise_band ^ noise_gain`. `None` with the band off (`noise_gain` 1),
    /// where a refresh follows every target. The pick takes two shares this close as equal
    /// (`pick`).
    pub fn noise_step(&self) -> Option<f64> {
        (self.noise_gain < 1.0).then(|| self.noise_band.max(1.0).powf(self.noise_gain))
    }
}

impl Default for WeightParams {
    fn default() -> Self {
        WeightParams {
            exponent: 2.5,
            min_share: 0.002,
            min_fair_share: 0.1,
            max_step_ratio: 2.0,
            noise_band: 2.0,
            noise_gain: 0.1,
            // 1 s: the plugin measures a newcomer from its first tick, and its latency, not the
            // ramp, keeps a cold host light after that; the ramp only spares it the first burst,
            // and a longer one keeps newcomers below their fair share for longer (bench/README.md,
            // "Clusters that change").
            slow_start_ns: ms_to_ns(1_000),
            slow_start_min_factor: 0.1,
        }
    }
}

/// What the weight computation needs to know of one host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostInput {
    /// Smoothed latency (failures included as penalty latency); `None` before any sample.
    pub score_ms: Option<f64>,
    /// How far `ln(score)` may lie from the truth by chance (`persistence::uncertainty`); a
    /// score within it of the traffic's reference counts as equal to it.
    pub uncertainty: f64,
    /// Time since the host joined or came back from ejection.
    pub active_for_ns: u64,
    pub ejected: bool,
    /// The host's share in the table in force; `None` when it had none.
    pub previous_share: Option<f64>,
    /// The share in force was granted on trust, before any latency of the host was known. It is
    /// no standing of the host's own (neither the noise band nor the bound on a fall holds it),
    /// but the other hosts' shares already make room for it: the host is no newcomer to them.
    pub share_on_trust: bool,
    /// How long ago the share in force was set (the last refresh). Set while the host was still
    /// ramping in, it is a step of slow start's schedule, not a standing the noise band should
    /// hold once the ramp is over.
    pub share_age_ns: u64,
}

impl HostInput {
    /// The share in force, when the host had one above 0.
    fn share_in_force(&self) -> Option<f64> {
        self.previous_share.filter(|p| *p > 0.0)
    }

    /// The share in force the host's own share moves from calmly: none while on trust.
    fn standing_share(&self) -> Option<f64> {
        self.share_in_force().filter(|_| !self.share_on_trust)
    }
}

/// Computes the new shares, in the order of `hosts`. They sum to 1 unless every host is ejected
/// (then all are 0) or `hosts` is empty.
pub fn shares(hosts: &[HostInput], params: &WeightParams) -> Vec<f64> {
    shares_within(hosts, params, None)
}

/// [`shares`] with the zones' split: local hosts share `split.local_share` of the traffic by
/// their weights, remote ones the rest (`locality`). The floor and the damping bound still hold
/// for every host, so a zone's traffic moves as gradually as a host's.
pub fn shares_within(
    hosts: &[HostInput],
    params: &WeightParams,
    split: Option<&Split>,
) -> Vec<f64> {
    let median = median(
        hosts
            .iter()
            .filter(|h| !h.ejected)
            .filter_map(|h| h.score_ms),
    );
    let ln_reference = reference(hosts)
        .or(median)
        .filter(|r| *r > 0.0 && r.is_finite())
        .map(f64::ln);
    let mut targets: Vec<f64> = hosts
        .iter()
        .map(|h| {
            if h.ejected {
                return 0.0;
            }
            let score = h.score_ms.or(median).unwrap_or(1.0).max(MIN_SCORE_MS);
            let ln_score = significant_ln(score.ln(), h.uncertainty, ln_reference);
            (-params.exponent * ln_score).exp() * ramp(h.active_for_ns, params)
        })
        .collect();
    if let Some(split) = split {
        apportion(&mut targets, split);
    }
    let standing = standing_scale(hosts, &targets, params);
    settle(&mut targets, hosts, params, standing);
    let live = hosts.iter().filter(|h| !h.ejected).count();
    if live == 0 {
        return targets;
    }
    // Each live host's share must stay within [lo, hi]: at least the floor, at most a factor
    // `max_step_ratio` above its previous share, and at most that factor below its standing.
    let floor = floor(params, live);
    let ratio = params.max_step_ratio.max(1.0);
    let bounds = |damped: bool| -> Vec<(f64, f64)> {
        hosts
            .iter()
            .map(
                |h| match (h.ejected, h.standing_share().filter(|_| damped)) {
                    (true, _) => (0.0, 0.0),
                    (false, Some(prev)) => (
                        (prev * standing / ratio).max(floor),
                        clamp(prev * ratio, floor, 1.0),
                    ),
                    (false, None) => (floor, 1.0),
                },
            )
            .collect()
    };
    let mut limits = bounds(true);
    let (lo_sum, hi_sum) = limits
        .iter()
        .fold((0.0, 0.0), |(l, h), (lo, hi)| (l + lo, h + hi));
    if lo_sum > 1.0 || hi_sum < 1.0 {
        // Hosts came or went (ejections): the damping bounds cannot all hold; the floor can.
        limits = bounds(false);
    }
    fit(&targets, &limits)
}

/// What a share in force counts for among the hosts the table now holds. The hosts whose share
/// follows a schedule ([`scheduled`]: newcomers without a share in force, hosts ramping in, or
/// whose share is the ramp's last step) move by it, and the shares in force of the others, which
/// held the rest, count for the rest as it is now: as if the table in force had given the
/// scheduled hosts what they get now. 1 when no host is scheduled, when every host is, or when
/// none had a share.
fn standing_scale(hosts: &[HostInput], targets: &[f64], params: &WeightParams) -> f64 {
    // Targets now and shares in force, of all live hosts and of the standing ones.
    let (mut all, mut standing, mut held, mut standing_held) = (0.0, 0.0, 0.0, 0.0);
    for (h, t) in hosts.iter().zip(targets).filter(|(h, _)| !h.ejected) {
        let in_force = h.share_in_force().unwrap_or(0.0);
        all += t;
        held += in_force;
        if !scheduled(h, params) {
            standing += t;
            standing_held += in_force;
        }
    }
    if all <= 0.0 || held <= 0.0 || standing_held <= 0.0 || standing >= all {
        return 1.0;
    }
    let scale = (standing / all) / (standing_held / held);
    if scale.is_finite() {
        scale.max(f64::MIN_POSITIVE)
    } else {
        1.0
    }
}

/// Whether a host's share follows a schedule rather than a standing of its own: it has none in
/// force yet, it is ramping in (slow start), or its share in force is the ramp's last step.
fn scheduled(h: &HostInput, params: &WeightParams) -> bool {
    let ramping = |active_for_ns: u64| active_for_ns < params.slow_start_ns;
    h.share_in_force().is_none()
        || ramping(h.active_for_ns)
        || ramping(h.active_for_ns.saturating_sub(h.share_age_ns))
}

/// Whether the table cannot tell its hosts apart: at least two live hosts, and every one
/// measured, its score within its `uncertainty` of the latency the table's traffic gets (the
/// scale at which [`significant_ln`] draws a score to that reference). Between such hosts what
/// differs is their queues of the moment, which Envoy's least request sees across all of its
/// workers and a plugin VM only for its own (`pick: weighted_p2c_unless_equal`).
pub fn indistinguishable(hosts: &[HostInput]) -> bool {
    let Some(ln_reference) = reference(hosts).filter(|r| *r > 0.0).map(f64::ln) else {
        return false;
    };
    let mut count = 0;
    let all_within = hosts.iter().filter(|h| !h.ejected).all(|h| {
        count += 1;
        h.score_ms.is_some_and(|s| {
            s > 0.0
                && h.uncertainty > 0.0
                && (s.max(MIN_SCORE_MS).ln() - ln_reference).abs() <= h.uncertainty
        })
    });
    all_within && count >= 2
}

/// The latency the table's traffic gets: the mean score weighted by the shares in force; `None`
/// when no host has both.
fn reference(hosts: &[HostInput]) -> Option<f64> {
    let (weighted, mass) = hosts
        .iter()
        .filter(|h| !h.ejected)
        .filter_map(|h| Some((h.score_ms?, h.previous_share?)))
        .filter(|(s, p)| s.is_finite() && *s > 0.0 && *p > 0.0)
        .fold((0.0, 0.0), |(w, m), (s, p)| (w + s * p, m + p));
    (mass > 0.0).then(|| weighted / mass)
}

/// `ln(score)` drawn towards `ln(reference)` as far as its `uncertainty` leaves it in doubt: a
/// distance `d` from the reference is kept as `d·(1 − e^(−(d/u)²))`. Equal hosts, whose
/// estimates differ by chance alone (well within `u`), all come out close to the reference; a
/// host several uncertainties away keeps its whole distance, however few samples stand behind
/// it (a slow host measured by probes alone must not be drawn back into the traffic); in
/// between the pull fades smoothly, so no score jumps at a boundary. In logarithms, as the share
/// is `e^(−exponent·ln score)`: one logarithm and one exponential per host.
fn significant_ln(ln_score: f64, uncertainty: f64, ln_reference: Option<f64>) -> f64 {
    let Some(ln_reference) = ln_reference else {
        return ln_score;
    };
    if uncertainty <= 0.0 || !uncertainty.is_finite() {
        return ln_score;
    }
    let distance = ln_score - ln_reference;
    let z = (distance / uncertainty).powi(2);
    // Beyond this e^(−z) is below a double's resolution next to 1: the whole distance is kept.
    let doubt = if z > 40.0 { 0.0 } else { (-z).exp() };
    ln_reference + distance * (1.0 - doubt)
}

/// The least share of each of `live` hosts: `min_share`, but at most `min_fair_share` of a fair
/// share. At 500 hosts a fair share is 0.2 %: a fixed 0.2 % floor would leave no room to steer.
pub fn floor(params: &WeightParams, live: usize) -> f64 {
    let fair = 1.0 / live.max(1) as f64;
    params.min_share.min(params.min_fair_share * fair).min(fair)
}

/// Rescales the targets so the local ones sum to `local_share` and the remote ones to the rest,
/// each side keeping its proportions.
fn apportion(targets: &mut [f64], split: &Split) {
    let sum = |local: bool| -> f64 {
        targets
            .iter()
            .zip(&split.is_local)
            .filter(|(_, l)| **l == local)
            .map(|(t, _)| t)
            .sum()
    };
    let (local_sum, remote_sum) = (sum(true), sum(false));
    if local_sum <= 0.0 || remote_sum <= 0.0 {
        return;
    }
    for (t, local) in targets.iter_mut().zip(&split.is_local) {
        *t *= if *local {
            split.local_share / local_sum
        } else {
            (1.0 - split.local_share) / remote_sum
        };
    }
}

/// Moves each target that lies within a factor `noise_band` of its host's standing (its share
/// in force times `standing`, [`standing_scale`]) to `noise_gain` of the way there (in log
/// space, so up and down weigh alike); of a target beyond the band, the part within it is taken
/// at that gain and the rest at once, so a real change is late by a fixed fraction of the band
/// at most. Ejected hosts and [`scheduled`] ones are left alone: slow start is a schedule, not
/// noise, up to its last step (held by the band, a newcomer equal to the others would climb
/// from that step to its fair share at the band's gain, seconds after its ramp ended).
fn settle(targets: &mut [f64], hosts: &[HostInput], params: &WeightParams, standing: f64) {
    let gain = clamp(params.noise_gain, 0.0, 1.0);
    let band = params.noise_band.max(1.0).ln();
    let total: f64 = targets.iter().sum();
    if gain >= 1.0 || band <= 0.0 || total <= 0.0 {
        return;
    }
    for (t, h) in targets.iter_mut().zip(hosts) {
        let Some(share) = h.standing_share().map(|p| p * standing) else {
            continue;
        };
        if h.ejected || scheduled(h, params) || *t <= 0.0 {
            continue;
        }
        let distance = (*t / total / share).ln();
        let step = if distance.abs() <= band {
            gain * distance
        } else {
            distance.signum() * (distance.abs() - band * (1.0 - gain))
        };
        *t = share * step.exp() * total;
    }
}

/// Scales `targets` by the one factor λ that makes `Σ clamp(λ·t, lo, hi) = 1`. This is the table
/// closest in proportions to the targets that keeps every bound.
///
/// The sum is piecewise linear and non-decreasing in λ, its slope the targets of the hosts within
/// their bounds. Newton's step lands on the root as soon as λ is in the root's piece; a step
/// that leaves the bracket known to hold the root halves the bracket instead, so the iteration
/// cannot cycle. A few passes over the hosts, where halving alone took about fifty (at 10,000
/// hosts that was most of a refresh).
fn fit(targets: &[f64], limits: &[(f64, f64)]) -> Vec<f64> {
    let total: f64 = targets.iter().sum();
    let targets: Vec<f64> = targets
        .iter()
        .map(|t| if total > 0.0 { t / total } else { 0.0 })
        .collect();
    // The sum at λ and its slope there.
    let at = |lambda: f64| -> (f64, f64) {
        targets
            .iter()
            .zip(limits)
            .fold((0.0, 0.0), |(sum, slope), (t, (lo, hi))| {
                let v = lambda * t;
                if v <= *lo {
                    (sum + lo, slope)
                } else if v >= *hi {
                    (sum + hi, slope)
                } else {
                    (sum + v, slope + t)
                }
            })
    };
    // The bracket [below, above] holds the root; `above` is only known once a λ reaches 1.
    let (mut below, mut above) = (0.0_f64, f64::INFINITY);
    let mut lambda = 1.0;
    for _ in 0..MAX_FIT_STEPS {
        let (sum, slope) = at(lambda);
        if (sum - 1.0).abs() <= FIT_TOLERANCE {
            above = lambda;
            break;
        }
        if sum < 1.0 {
            below = lambda;
        } else {
            above = lambda;
        }
        let newton = lambda + (1.0 - sum) / slope;
        lambda = if slope > 0.0 && newton > below && newton < above {
            newton
        } else if above.is_finite() {
            0.5 * (below + above)
        } else {
            2.0 * lambda
        };
        if above.is_finite() && above - below <= FIT_TOLERANCE * above {
            break;
        }
    }
    let lambda = if above.is_finite() { above } else { lambda };
    let mut out: Vec<f64> = targets
        .iter()
        .zip(limits)
        .map(|(t, (lo, hi))| clamp(lambda * t, *lo, *hi))
        .collect();
    // What the iteration leaves (≤ 1e-12) is rounding; renormalise it away.
    let sum: f64 = out.iter().sum();
    if sum > 0.0 {
        out.iter_mut().for_each(|s| *s /= sum);
    }
    out
}

/// How close to 1 the bounded sum must come, relative; the renormalisation takes the rest.
const FIT_TOLERANCE: f64 = 1e-12;
/// More than the bracket's halvings need from any start (λ within 2^±64 of 1, to 1e-12).
const MAX_FIT_STEPS: usize = 200;

/// Scores below this are treated as equal: no host is infinitely better than another.
const MIN_SCORE_MS: f64 = 0.1;

fn ramp(active_for_ns: u64, params: &WeightParams) -> f64 {
    if params.slow_start_ns == 0 {
        return 1.0;
    }
    let progress = active_for_ns as f64 / params.slow_start_ns as f64;
    clamp(progress, clamp(params.slow_start_min_factor, 0.0, 1.0), 1.0)
}
