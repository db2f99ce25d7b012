//! proxy-wasm shared data in memory, for tests that run several workers over one store.

#![allow(dead_code)] // each test binary uses its own part

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use ewma_lb::config::Config;
use ewma_lb::record::state::ClusterState;
use ewma_lb::record::sync::{self, SharedStore, StoreError};
use ewma_lb::worker::Worker;

pub const SEC: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;
pub const CLUSTER: &str = "backend";

type Hook = Box<dyn FnMut(&mut HashMap<String, (Vec<u8>, u32)>)>;
type Refusal = Box<dyn FnMut(&str) -> bool>;

/// Values with a version per key, bumped on every write, as Envoy keeps them.
#[derive(Default)]
pub struct Memory {
    pub data: HashMap<String, (Vec<u8>, u32)>,
    /// Every n-th write to an existing key loses its compare-and-swap, as if another VM had
    /// written first.
    pub lose_every: Option<u32>,
    writes: u32,
    /// Runs once, right after the next read that finds a key missing: what another VM did in
    /// between.
    pub after_missing_read: Option<Hook>,
    /// Runs once, right after the next read of a key containing the string: what another VM did
    /// in between.
    pub after_read_of: Option<(String, Hook)>,
    /// Writes to keys for which it says yes fail as a VM that died there would never write.
    pub refuse: Option<Refusal>,
}

#[derive(Clone, Default)]
pub struct Shared(pub Rc<RefCell<Memory>>);

impl SharedStore for Shared {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        let mut m = self.0.borrow_mut();
        let found = match m.data.get(key) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        };
        if found.0.is_none() {
            if let Some(mut hook) = m.after_missing_read.take() {
                hook(&mut m.data);
            }
        }
        if m.after_read_of
            .as_ref()
            .is_some_and(|(k, _)| key.contains(k.as_str()))
        {
            if let Some((_, mut hook)) = m.after_read_of.take() {
                hook(&mut m.data);
            }
        }
        Ok(found)
    }

    /// As Envoy: the token of a key that does not exist yet is not checked.
    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut m = self.0.borrow_mut();
        if m.refuse.as_mut().is_some_and(|refuse| refuse(key)) {
            return Err(StoreError::Other("refused".into()));
        }
        m.writes += 1;
        let current = m.data.get(key).map(|(_, v)| *v);
        let lose = current.is_some() && m.lose_every.is_some_and(|n| m.writes % n == 0);
        if lose || (current.is_some() && cas.is_some() && cas != current) {
            if let Some((_, v)) = m.data.get_mut(key) {
                *v += 1;
            }
            return Err(StoreError::CasMismatch);
        }
        m.data
            .insert(key.to_owned(), (value.to_vec(), current.unwrap_or(0) + 1));
        Ok(())
    }
}

impl Shared {
    /// The record at `key`, or an empty one.
    pub fn record(&self, key: &str) -> ClusterState {
        let bytes = self
            .0
            .borrow()
            .data
            .get(key)
            .map(|(b, _)| b.clone())
            .unwrap_or_default();
        sync::decode(&bytes, sync::MAX_RECORD_HOSTS).unwrap_or_default()
    }

    /// The record of [`CLUSTER`], whatever namespace the configuration gave it (one configuration).
    pub fn state(&self) -> ClusterState {
        let suffix = format!(".cluster.{CLUSTER}");
        let key = self
            .0
            .borrow()
            .data
            .keys()
            .find(|k| k.ends_with(&suffix))
            .cloned()
            .unwrap_or_default();
        self.record(&key)
    }
}

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
        outcome: Some(ewma_lb::worker::outcome::Outcome::Success),
        num_endpoints: Some(2),
        ..Default::default()
    };
    w.finish(CLUSTER, &done);
}

/// The number of samples of `host` in [`CLUSTER`]'s record.
pub fn samples(store: &Shared, host: &str) -> u64 {
    store.state().host(host).map_or(0, |h| h.samples)
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
