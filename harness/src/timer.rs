//! Waits that end when they are due. tokio's timer counts whole milliseconds and fires after the
//! deadline's millisecond is over, about 1 ms late. A backend's latency profile and the load's
//! arrival times are what a benchmark measures the balancer against, so their waits are each a
//! kernel timer (timerfd, set to the nanosecond) watched by the runtime's own epoll, which wakes
//! the waiting task on its own thread. bench/README.md (under seed-table) has a backend measured
//! with no Envoy on each timer. A timeout, a poll or a back-off may stay on tokio's timer.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;

/// Waits `d`, ending within a fraction of a millisecond after it.
pub async fn sleep(d: Duration) {
    sleep_until(Instant::now() + d).await
}

/// Waits until `deadline`, ending within a fraction of a millisecond after it.
pub async fn sleep_until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return;
    }
    // SAFETY: what `register` asks is that the descriptor stay open while it is registered. The
    // AsyncFd owns it (an `OwnedFd` moved in), and dropping the AsyncFd deregisters it before
    // the descriptor closes.
    let registered =
        armed(left).and_then(|fd| unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from));
    match registered {
        // Readable once it has expired.
        Ok(fd) => {
            let _ = fd.readable().await;
        }
        // Out of file descriptors: late is better than never.
        Err(_) => tokio::time::sleep_until(deadline.into()).await,
    }
}

/// A one-shot timer that expires after `left`.
fn armed(left: Duration) -> std::io::Result<OwnedFd> {
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    let spec = Itimerspec {
        it_interval: Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        },
    };
    timerfd_settime(&fd, TimerfdTimerFlags::empty(), &spec)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend never answers faster than its profile: no wait ends before it is due, however
    /// many run at once, and each ends (the bound only catches a wait that is never woken).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_end_after_their_deadline_never_before() {
        let waits = (0..300u64).map(|i| {
            let d = Duration::from_micros(i * 67 % 20_000);
            tokio::spawn(async move {
                let t = Instant::now();
                sleep(d).await;
                (d, t.elapsed())
            })
        });
        for w in waits.collect::<Vec<_>>() {
            let (d, took) = w.await.unwrap();
            assert!(took >= d, "a wait of {d:?} ended after {took:?}");
            assert!(took < d + Duration::from_secs(2), "{d:?} took {took:?}");
        }
        let due = Instant::now() + Duration::from_millis(3);
        sleep_until(due).await;
        assert!(Instant::now() >= due);
        sleep_until(due - Duration::from_millis(1)).await; // in the past: at once
    }
}
