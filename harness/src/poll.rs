//! Bounded waiting for something asynchronous (a stat, a health flip, Envoy's readiness).

use std::thread;
use std::time::{Duration, Instant};

/// How often [`within`] checks.
pub const EVERY: Duration = Duration::from_millis(250);

/// Calls `check` every `every` until it holds; returns how long that took, or `None` when it
/// still did not hold at its last call before `limit` (a check is never started after `limit`, so
/// "within 2 s" means it held at a check made within 2 s).
pub fn poll(limit: Duration, every: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return Some(start.elapsed());
        }
        thread::sleep(every);
    }
    None
}

/// [`poll`] every [`EVERY`].
pub fn within(limit: Duration, check: impl FnMut() -> bool) -> Option<Duration> {
    poll(limit, EVERY, check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_time_it_took_or_none() {
        let mut n = 0;
        let took = poll(Duration::from_secs(1), Duration::from_millis(10), || {
            n += 1;
            n == 3
        });
        assert!(
            took.is_some_and(|t| t >= Duration::from_millis(20)),
            "{took:?}"
        );
        assert_eq!(
            poll(Duration::from_millis(30), Duration::from_millis(10), || {
                false
            }),
            None
        );
    }
}
