//! Where a request's time goes inside the VM, by callback and by host call: compiled in only with
//! the `callback-timing` feature (`./wasm-build.sh --timing`), for `ewma-bench overhead`, which
//! keeps the lines this logs (one a second per VM, while requests come). Without the feature a span is an empty value and `timed` calls its
//! closure, so the shipped module is the same as without this file.
//!
//! A span reads the monotonic clock twice (WASI's clock, about 0.05 µs a read in Envoy's V8);
//! an empty callback's span is the price of the measurement itself.

/// What a span times. Callbacks first, then the parts of them.
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
    const NAMES: [&str; SLOTS] = [
        "create_context",
        "request_headers",
        "request_body",
        "response_headers",
        "response_body",
        "response_trailers",
        "log",
        "tick",
        "path",
        "cluster_name",
        "route",
        "filter_state",
        "override_header",
        "upstream_address",
        "response_code",
        "zone",
        "finish",
    ];
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
            let callbacks: u64 = t.ns.iter().take(Slot::Path as usize).sum();
            let mut line = format!(
                "ewma-lb timing: {} requests, callbacks {:.2} µs a request;",
                t.requests,
                per_request(callbacks)
            );
            for ((name, ns), calls) in NAMES.iter().zip(t.ns).zip(t.calls) {
                line.push_str(&format!(" {name} {:.2} ({calls})", per_request(ns)));
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
