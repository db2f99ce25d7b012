//! The steered per-request path allocates nothing: `Worker::route` and `Worker::finish` on a hot
//! table, counted by a global allocator that counts this thread's allocations while asked to.
//!
//! "Hot" is the steady state a busy VM lives in: the table is adopted, every host has a batch
//! entry (at each tick it is emptied and kept as a spare, which the host's next sample takes
//! back), the in-flight map has room for every host, and the per-cluster counters exist. The
//! first sample of a host in a VM does allocate (its batch entry, its in-flight entry); so does a
//! path that needs normalising. Those are not the steady state.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)] // tests fail by panicking
#![cfg(not(target_arch = "wasm32"))] // a global allocator of the test binary: native only

mod store;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::rc::Rc;

use ewma_lb::balance::outcome::Outcome;
use ewma_lb::testing::steered_request;
use ewma_lb::worker::{Finished, Request, Worker};
use store::{ticked, CLUSTER, SEC};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; counting touches only
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(Cell::get)
}

/// One steered request: route, then finish as the adapter's `on_log` does. Returns the host the
/// plugin picked, if it steered the request.
fn request(w: &mut Worker, path: &str, latency_ms: f64) -> Option<Rc<str>> {
    let request = Request {
        path: path.as_bytes(),
        cluster: Some(CLUSTER),
        now_ns: 0,
        body_pending: false,
    };
    steered_request(w, CLUSTER, &request, latency_ms)
}

/// A worker over `hosts` (static endpoints, no exploration) after ten ticks of `per_tick`
/// requests each: every host picked and sampled, samples merged, a few tables adopted.
fn hot(hosts: &[String], per_tick: usize) -> (store::Shared, Worker) {
    let cfg = format!(
        r#"{{"exploration_share": 0, "clusters": {{"{CLUSTER}": {{"endpoints": {hosts:?}}}}}}}"#
    );
    let (store, mut w) = ticked(&cfg, 3);
    for t in 2..12u64 {
        for _ in 0..per_tick {
            request(&mut w, "/", 20.0);
        }
        w.tick(t * SEC, &mut store.clone());
    }
    (store, w)
}

#[test]
fn the_steered_request_path_allocates_nothing_on_a_hot_table() {
    let hosts: Vec<String> = (1..=4).map(|i| format!("10.0.0.{i}:80")).collect();
    let (store, mut w) = hot(&hosts, 200);
    let paths = ["/", "/api/v1/items/42?sort=asc", "/orders/7"];
    let mut steered = 0;
    let n = allocations(|| {
        for i in 0..3_000 {
            steered += usize::from(
                request(&mut w, paths[i % paths.len()], 15.0 + (i % 7) as f64).is_some(),
            );
        }
    });
    assert_eq!(
        steered, 3_000,
        "every request steered (no exploration configured)"
    );
    assert_eq!(n, 0, "allocations on the steered path over 3,000 requests");
    // The counter counts: a tick (merge, encode, adopt) allocates.
    let tick = allocations(|| {
        w.tick(12 * SEC, &mut store.clone());
    });
    assert!(tick > 0, "the counting allocator saw nothing");
}

#[test]
fn a_host_joining_the_record_costs_the_other_hosts_no_allocation() {
    // When the record's hosts change, a worker forgets the entries of hosts that left; the
    // entries of those that stayed must survive, or their next request allocates them again.
    let hosts: Vec<String> = (1..=16).map(|i| format!("10.0.0.{i}:80")).collect();
    let (store, mut w) = hot(&hosts, 800);
    // Envoy sent one request to an endpoint the table does not know (the fallback's choice).
    let newcomer = "10.0.0.99:80";
    w.finish(
        CLUSTER,
        &Finished {
            served_by: Some(newcomer),
            attempts: 1,
            latency_ms: 20.0,
            outcome: Some(Outcome::Success),
            ..Finished::default()
        },
    );
    w.tick(12 * SEC, &mut store.clone());
    assert!(
        w.tables().any(|(_, s)| s.host(newcomer).is_some()),
        "the record learned the newcomer"
    );
    // Every request to the sixteen that stayed: no allocation.
    let mut old = 0;
    for _ in 0..1_600 {
        let mut picked = None;
        let n = allocations(|| picked = request(&mut w, "/", 20.0));
        if picked.as_deref().is_some_and(|p| p != newcomer) {
            old += 1;
            assert_eq!(
                n, 0,
                "a request to {picked:?} allocated after the newcomer joined"
            );
        }
    }
    assert!(old > 1_000, "the sixteen got the requests: {old}");
}
