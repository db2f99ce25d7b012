//! The balancing algorithms: how samples become an estimate (`smoothing`), an estimate and
//! errors and load a score (`score`), scores shares (`weights`, `locality`), shares a pick
//! (`pick`), and when a host the pick does not draw gets a request anyway (`probe`) or none at
//! all (`outlier`). Pure functions of their inputs and parameters: no shared data, no clock.

pub mod explore;
pub mod locality;
pub mod outcome;
pub mod outlier;
pub mod pick;
pub mod probe;
pub mod score;
pub mod smoothing;
pub mod weights;

/// The median of the finite scores; `None` when there is none. A selection, not a sort: the
/// refresh takes it of every host.
pub(crate) fn median(scores: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = scores.filter(|s| s.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    let (len, mid) = (v.len(), v.len() / 2);
    let (lower, &mut upper, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    if len % 2 == 1 {
        return Some(upper);
    }
    // Even count: the other middle one is the largest of the lower half.
    lower
        .iter()
        .copied()
        .max_by(f64::total_cmp)
        .map(|lower| (lower + upper) / 2.0)
}
