//! What the tests that run several workers over one in-memory store share: the store
//! (`ewma_lb::testing`), configurations, and requests through a worker.

#![allow(dead_code)] // each test binary uses its own part

use ewma_lb::config::Config;
use ewma_lb::worker::Worker;

pub const SEC: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;
pub const CLUSTER: &str = "backend";

/// The crate's in-memory store, shared by a test's workers.
pub use ewma_lb::testing::SharedMemory as Shared;

pub fn config(json: &str) -> Config {
    Config::from_json(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

pub fn defaults() -> Config {
    config("{}")
}

/// A worker with `cfg` and a store it has ticked once, so the configured endpoints form a table.
pub fn ticked(cfg: &str, seed: u64) -> (Shared, Worker) {
    let store = Shared::default();
    let mut w = Worker::new(config(cfg), seed);
    w.tick(SEC, &mut store.clone());
    (store, w)
}

/// A request for `/` of [`CLUSTER`] through `w`, as the adapter routes one without a body.
pub fn steer(w: &mut Worker) -> ewma_lb::worker::Decision {
    w.route(
        &ewma_lb::worker::Request {
            path: b"/",
            cluster: Some(CLUSTER),
            ..Default::default()
        },
        || None,
    )
}

/// The end of a request `w` picked `host` for (counted in flight), served by it in `latency_ms`,
/// in a cluster of two endpoints.
pub fn finish_pick(w: &mut Worker, host: &str, latency_ms: f64) {
    let done = ewma_lb::worker::Finished {
        picked: Some(host),
        in_flight: true,
        served_by: Some(host),
        attempts: 1,
        latency_ms,
        outcome: Some(ewma_lb::balance::outcome::Outcome::Success),
        num_endpoints: Some(2),
        ..Default::default()
    };
    w.finish(CLUSTER, &done);
}

/// The number of samples of `host` in [`CLUSTER`]'s record.
pub fn samples(store: &Shared, host: &str) -> u64 {
    store.record_of(CLUSTER).host(host).map_or(0, |h| h.samples)
}

/// How many keys of each kind (`cluster`, `head`, `slot`) the store holds.
pub fn keys_of_kind(store: &Shared, kind: &str) -> usize {
    let kind = format!(".{kind}");
    store
        .0
        .borrow()
        .data
        .keys()
        .filter(|k| k.contains(&kind))
        .count()
}
