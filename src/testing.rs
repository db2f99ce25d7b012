//! proxy-wasm shared data in memory, for the tests and the fleet simulator: several workers over
//! one store, and the contention a test needs to provoke; and one steered request as the adapter
//! runs it. Only with the `testing` feature, which the plugin's own build never enables.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::balance::outcome::Outcome;
use crate::record::state::ClusterState;
use crate::record::sync::{self, SharedStore, StoreError};
use crate::worker::telemetry::Update;
use crate::worker::{Decision, Finished, Request, TickReport, Worker};

/// One request as the adapter runs it: routed, and when the plugin steers it, finished at its
/// pick as a success in `latency_ms` (in flight, one attempt). Returns the host picked.
pub fn steered_request(
    worker: &mut Worker,
    cluster: &str,
    request: &Request,
    latency_ms: f64,
) -> Option<Rc<str>> {
    steered_request_by(worker, cluster, request, |_| latency_ms)
}

/// Every metric update of a tick as the filter applies them: the report's, then the per-host
/// gauges of the clusters it names as due, which `worker` makes until its next tick.
pub fn tick_updates(worker: &Worker, report: &TickReport) -> Vec<Update> {
    let mut all = report.metrics.clone();
    for cluster in &report.gauges_due {
        worker.host_gauges(cluster, |u| all.push(u));
    }
    all
}

/// [`steered_request`], the latency a function of the host picked.
pub fn steered_request_by(
    worker: &mut Worker,
    cluster: &str,
    request: &Request,
    latency_ms: impl Fn(&str) -> f64,
) -> Option<Rc<str>> {
    let Decision::Override(pick) = worker.route(request, || None) else {
        return None;
    };
    let done = Finished {
        picked: Some(&pick.host),
        in_flight: true,
        served_by: Some(&pick.host),
        attempts: 1,
        latency_ms: latency_ms(&pick.host),
        ended_ns: request.now_ns + (latency_ms(&pick.host) * 1e6) as u64,
        outcome: Some(Outcome::Success),
        ..Finished::default()
    };
    worker.finish(cluster, &done);
    Some(pick.host)
}

/// What another VM does between two of this one's calls, to the store's keys.
pub type Hook = Box<dyn FnMut(&mut HashMap<String, (Vec<u8>, u32)>)>;
/// Whether a write to a key fails.
pub type Refusal = Box<dyn FnMut(&str) -> bool>;

/// Values with a version per key, bumped on every write, as Envoy keeps them. Envoy ignores the
/// version a write carries for a key that does not exist yet; so does this store.
#[derive(Default)]
pub struct MemoryStore {
    pub data: HashMap<String, (Vec<u8>, u32)>,
    /// Every n-th write to an existing key loses its compare-and-swap, as if another VM had
    /// written first (the key's version moves, as that write would move it).
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

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        Ok(match self.data.get(key) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        })
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        if self.refuse.as_mut().is_some_and(|refuse| refuse(key)) {
            return Err(StoreError::Other("refused".into()));
        }
        self.writes = self.writes.wrapping_add(1);
        let current = self.data.get(key).map(|(_, v)| *v);
        let writes = self.writes;
        let lose = current.is_some() && self.lose_every.is_some_and(|n| writes % n == 0);
        if lose {
            // The other VM's write moved the version, as Envoy's would.
            if let Some((_, v)) = self.data.get_mut(key) {
                *v += 1;
            }
            return Err(StoreError::CasMismatch);
        }
        if current.is_some() && cas.is_some() && cas != current {
            return Err(StoreError::CasMismatch);
        }
        let slot = self.data.entry(key.to_owned()).or_default();
        slot.0.clear();
        slot.0.extend_from_slice(value);
        slot.1 = current.unwrap_or(0) + 1;
        Ok(())
    }
}

impl MemoryStore {
    /// Reads `key` and runs the hooks that wait for that read.
    fn read(&mut self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        let found = match self.data.get(key) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        };
        if found.0.is_none() {
            if let Some(mut hook) = self.after_missing_read.take() {
                hook(&mut self.data);
            }
        }
        if self
            .after_read_of
            .as_ref()
            .is_some_and(|(k, _)| key.contains(k.as_str()))
        {
            if let Some((_, mut hook)) = self.after_read_of.take() {
                hook(&mut self.data);
            }
        }
        found
    }
}

/// One [`MemoryStore`] for several workers (one Envoy process): clones share it, and a read runs
/// the store's hooks.
#[derive(Clone, Default)]
pub struct SharedMemory(pub Rc<RefCell<MemoryStore>>);

impl SharedStore for SharedMemory {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        Ok(self.0.borrow_mut().read(key))
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.0.borrow_mut().set(key, value, cas)
    }
}

impl SharedMemory {
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

    /// The record of `cluster`, whatever namespace the configuration gave it (one configuration).
    pub fn record_of(&self, cluster: &str) -> ClusterState {
        let suffix = format!(".cluster.{cluster}");
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
