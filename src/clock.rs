//! Time: a clock for one VM that never steps, and the shared clock of a cluster's record.
//!
//! The host offers two clocks: the wall clock (`proxy_get_current_time`), which NTP or an
//! operator can step back or forward, and WASI's monotonic clock, which Rust's `Instant` reads
//! (docs/architecture.md, "Time"). Every timer of the plugin must survive steps either way: a step back must
//! not freeze refreshes or stretch ejections, a step forward must not become a latency sample.
//!
//! - [`VmClock`] turns whatever the adapter reads into steady time: it never goes back, and a
//!   reading more than `max_gap_ns` after the previous one is a step, not elapsed time, and
//!   advances it by nothing (a VM reads its clock on every tick and request, so only a step, or
//!   a worker thread stalled that long, leaves such a gap).
//! - A cluster's record carries its own clock, advanced by the VMs that share it. Each VM keeps
//!   the offset between its steady time and the record's, so timestamps written by one VM mean
//!   the same thing to every other, whatever epoch each VM's clock has.

/// Steady time for one VM, from raw readings that may step.
#[derive(Clone, Debug)]
pub struct VmClock {
    last_raw_ns: Option<u64>,
    steady_ns: u64,
    max_gap_ns: u64,
}

impl VmClock {
    /// `max_gap_ns`: the largest advance one reading may bring; larger ones are steps.
    pub fn new(max_gap_ns: u64) -> Self {
        VmClock {
            last_raw_ns: None,
            steady_ns: 0,
            max_gap_ns: max_gap_ns.max(1),
        }
    }

    /// Steady time at raw reading `raw_ns`: what the raw clock advanced since the last reading,
    /// or nothing if it went back or jumped ahead by more than `max_gap_ns`.
    pub fn now(&mut self, raw_ns: u64) -> u64 {
        if let Some(last) = self.last_raw_ns {
            let advance = raw_ns.saturating_sub(last);
            if advance <= self.max_gap_ns {
                self.steady_ns = self.steady_ns.saturating_add(advance);
            }
        }
        self.last_raw_ns = Some(raw_ns);
        self.steady_ns
    }

    /// The last steady time handed out.
    pub fn last(&self) -> u64 {
        self.steady_ns
    }
}

/// One VM's view of a cluster record's clock: the offset from its steady time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordClock {
    /// `record time - steady time`, once this VM has seen the record.
    offset_ns: Option<i128>,
}

impl RecordClock {
    /// Record time now, given this VM's steady time and the clock stored in the record (`None`:
    /// there is no record yet). Record time is the latest any VM has seen: it never goes back,
    /// and it advances as real time does, whichever VM ticks.
    pub fn now(&mut self, steady_ns: u64, stored_ns: Option<u64>) -> u64 {
        let mine = self.offset_ns.map(|o| clamp_u64(i128::from(steady_ns) + o));
        let now = match (mine, stored_ns) {
            (Some(mine), Some(stored)) => mine.max(stored),
            (Some(mine), None) => mine,
            (None, Some(stored)) => stored,
            (None, None) => steady_ns,
        };
        self.offset_ns = Some(i128::from(now) - i128::from(steady_ns));
        now
    }

    /// Record time at `steady_ns` by the offset last learned; `None` before any record was seen.
    pub fn estimate(&self, steady_ns: u64) -> Option<u64> {
        self.offset_ns.map(|o| clamp_u64(i128::from(steady_ns) + o))
    }
}

fn clamp_u64(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}
