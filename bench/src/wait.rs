//! Bounded polling for tests that wait on something asynchronous (a stat, a health flip).

use std::time::{Duration, Instant};

/// Calls `check` every `every` until it returns true or `limit` has passed; returns the last result.
pub fn poll_until(limit: Duration, every: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}
