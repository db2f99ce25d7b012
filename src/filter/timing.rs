//! Where a request's time goes inside the VM, by callback and by host call: compiled in only with
//! the `callback-timing` feature (`./wasm-build.sh --timing`), for `ewma-bench overhead`, which
//! keeps the lines this logs (one a second per VM, while requests come). Without the feature a
//! span is an empty value and `timed` calls its closure, so the shipped module is the same as
//! without this file.
//!
//! A span reads the monotonic clock twice and adds to a per-VM total; the span of a callback
//! that does nothing else (`response_body`) is the price of the measurement itself.

/// What a span times. Callbacks first, then the parts of them, from `Path` on (the log line's
/// callback total and `ewma-bench overhead`'s table rely on that order).
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "callback-timing"), allow(dead_code))]
pub enum Slot {
    CreateContext,
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
    ResponseBody,
    ResponseTrailers,
    Log,
    Tick,
    Path,
    ClusterName,
    Route,
    FilterState,
    OverrideHeader,
    UpstreamAddress,
    ResponseCode,
    Zone,
    Finish,
}

#[cfg(feature = "callback-timing")]
mod on {
    use std::cell::RefCell;

    use super::Slot;

    const SLOTS: usize = Slot::Finish as usize + 1;

    impl Slot {
        const ALL: [Slot; SLOTS] = [
            Slot::CreateContext,
            Slot::RequestHeaders,
            Slot::RequestBody,
            Slot::ResponseHeaders,
            Slot::ResponseBody,
            Slot::ResponseTrailers,
            Slot::Log,
            Slot::Tick,
            Slot::Path,
            Slot::ClusterName,
            Slot::Route,
            Slot::FilterState,
            Slot::OverrideHeader,
            Slot::UpstreamAddress,
            Slot::ResponseCode,
            Slot::Zone,
            Slot::Finish,
        ];

        fn name(self) -> &'static str {
            match self {
                Slot::CreateContext => "create_context",
                Slot::RequestHeaders => "request_headers",
                Slot::RequestBody => "request_body",
                Slot::ResponseHeaders => "response_headers",
                Slot::ResponseBody => "response_body",
                Slot::ResponseTrailers => "response_trailers",
                Slot::Log => "log",
                Slot::Tick => "tick",
                Slot::Path => "path",
                Slot::ClusterName => "cluster_name",
                Slot::Route => "route",
                Slot::FilterState => "filter_state",
                Slot::OverrideHeader => "override_header",
                Slot::UpstreamAddress => "upstream_address",
                Slot::ResponseCode => "response_code",
                Slot::Zone => "zone",
                Slot::Finish => "finish",
            }
        }
    }
    /// Time between two lines: long enough for thousands of requests at saturation, short
    /// enough for a smoke run's second.
    const LINE_NS: u64 = 1_000_000_000;

    #[derive(Default)]
    struct Totals {
        ns: [u64; SLOTS],
        calls: [u64; SLOTS],
        requests: u64,
        since_ns: u64,
    }

    thread_local! {
        static TOTALS: RefCell<Totals> = RefCell::new(Totals::default());
    }

    pub struct Span(Slot, u64);

    pub fn span(slot: Slot) -> Span {
        Span(slot, crate::filter::host::monotonic_ns())
    }

    impl Drop for Span {
        fn drop(&mut self) {
            let ns = crate::filter::host::monotonic_ns().saturating_sub(self.1);
            TOTALS.with(|t| {
                if let Ok(mut t) = t.try_borrow_mut() {
                    let t = &mut *t;
                    let i = self.0 as usize;
                    if let (Some(total), Some(calls)) = (t.ns.get_mut(i), t.calls.get_mut(i)) {
                        *total = total.saturating_add(ns);
                        *calls += 1;
                    }
                }
            });
        }
    }

    /// Counts a request; a second after the last line, logs each slot's µs per request and its
    /// calls.
    pub fn request_logged() {
        let now_ns = crate::filter::host::monotonic_ns();
        TOTALS.with(|t| {
            let Ok(mut t) = t.try_borrow_mut() else {
                return;
            };
            t.requests += 1;
            if t.requests == 1 {
                t.since_ns = now_ns;
            }
            if now_ns.saturating_sub(t.since_ns) < LINE_NS {
                return;
            }
            let per_request = |ns: u64| ns as f64 / t.requests as f64 / 1000.0;
            // The callbacks: the slots before the first part.
            let callbacks: u64 = t.ns.iter().take(Slot::Path as usize).sum();
            let mut line = format!(
                "ewma-lb timing: {} requests, callbacks {:.2} µs a request;",
                t.requests,
                per_request(callbacks)
            );
            for slot in Slot::ALL {
                let i = slot as usize;
                let (ns, calls) = (t.ns.get(i), t.calls.get(i));
                let (ns, calls) = (ns.copied().unwrap_or(0), calls.copied().unwrap_or(0));
                line.push_str(&format!(
                    " {} {:.2} ({calls})",
                    slot.name(),
                    per_request(ns)
                ));
            }
            log::info!("{line}");
            *t = Totals {
                since_ns: now_ns,
                ..Totals::default()
            };
        });
    }
}

#[cfg(feature = "callback-timing")]
pub use on::{request_logged, span};

#[cfg(not(feature = "callback-timing"))]
pub struct Span;

#[cfg(not(feature = "callback-timing"))]
#[inline(always)]
pub fn span(_: Slot) -> Span {
    Span
}

#[cfg(not(feature = "callback-timing"))]
#[inline(always)]
pub fn request_logged() {}

/// `f`, timed as `slot`.
#[inline(always)]
pub fn timed<T>(slot: Slot, f: impl FnOnce() -> T) -> T {
    let _span = span(slot);
    f()
}
