//! Sync: the shared-data protocol. Each cluster has one record in proxy-wasm shared data; every
//! worker VM folds its samples into it on its tick, under compare-and-swap, and whoever writes
//! when a refresh is due recomputes the weight table.
//!
//! Everything about that record lives here: its key, its encoding, and the merge loop. The store
//! is a trait, so the protocol runs natively in tests with several workers over one in-memory
//! store, and in the VM over the host's shared data.
//!
//! Decoding never trusts its input: bytes of another plugin or another format version, truncated
//! or random, give an error, never a panic.

use std::collections::BTreeMap;

use crate::state::{Accumulator, ClusterState, Policy};

/// Shared data as proxy-wasm offers it: values with a version token for compare-and-swap.
pub trait SharedStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;
    /// Writes `value` if the stored version still equals `cas` (`None`: unconditionally).
    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    CasMismatch,
    Other(String),
}

/// The shared-data key of a cluster's record. One key per cluster keeps the key count bounded:
/// proxy-wasm shared data has no reliable delete.
pub fn key(cluster: &str) -> String {
    format!("ewma_lb.v1.cluster.{cluster}")
}

// === Codec ===

/// Leading bytes of every encoded record; a different prefix means "not ours".
pub const MAGIC: &[u8; 4] = b"EWLB";
/// Bumped whenever the encoded layout changes; records of another version are rebuilt.
pub const FORMAT_VERSION: u8 = 1;

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    NotOurs,
    OtherVersion(u8),
    Corrupt(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::NotOurs => write!(f, "not an ewma-lb record"),
            DecodeError::OtherVersion(v) => write!(f, "record format {v}, expected {FORMAT_VERSION}"),
            DecodeError::Corrupt(why) => write!(f, "corrupt record: {why}"),
        }
    }
}

/// `MAGIC`, `FORMAT_VERSION`, then the record in postcard (compact, no field names).
pub fn encode(state: &ClusterState) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + state.hosts.len() * 96);
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    // Encoding plain data into a Vec cannot fail; an empty body would decode as corrupt.
    if let Ok(body) = postcard::to_allocvec(state) {
        out.extend_from_slice(&body);
    }
    out
}

/// The record in `bytes`, if it is one of ours, of this format, with at most `max_hosts` hosts.
pub fn decode(bytes: &[u8], max_hosts: usize) -> Result<ClusterState, DecodeError> {
    let body = bytes.strip_prefix(MAGIC.as_slice()).ok_or(DecodeError::NotOurs)?;
    let (&version, body) = body.split_first().ok_or(DecodeError::NotOurs)?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::OtherVersion(version));
    }
    let state: ClusterState = postcard::from_bytes(body).map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    if state.hosts.len() > max_hosts {
        return Err(DecodeError::Corrupt(format!("{} hosts, limit {max_hosts}", state.hosts.len())));
    }
    Ok(state)
}

// === The merge loop ===

/// Compare-and-swap attempts per cluster per tick; samples of a tick that lost every attempt are
/// kept by the caller and merged on the next one.
pub const MAX_CAS_ATTEMPTS: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncError {
    /// Every compare-and-swap attempt lost to another worker.
    Contended,
    Store(String),
}

/// What one sync did to a cluster's record.
#[derive(Debug)]
pub struct Synced {
    /// The record as written (or as read, when there was nothing to write).
    pub state: ClusterState,
    /// Whether this worker recomputed the weights.
    pub refreshed: bool,
    /// Hosts this worker ejected.
    pub ejected: usize,
}

/// Folds `pending` into `cluster`'s record, refreshes it when due, and writes it back under
/// compare-and-swap, retrying on a lost swap. On `Ok` the samples are in shared state and the
/// caller may drop them; on `Err` it must keep them for the next tick.
pub fn sync_cluster(
    store: &mut dyn SharedStore,
    cluster: &str,
    pending: &BTreeMap<String, Accumulator>,
    static_hosts: &[String],
    policy: &Policy,
    now_ns: u64,
) -> Result<Synced, SyncError> {
    let key = key(cluster);
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, cas) = store.get(&key).map_err(|e| SyncError::Store(format!("{e:?}")))?;
        // A record of another version, truncated or foreign is rebuilt from scratch.
        let mut state = bytes.and_then(|b| decode(&b, policy.max_hosts).ok()).unwrap_or_default();
        let mut ejected = state.merge(pending, now_ns, policy);
        let refreshed = state.refresh_due(now_ns, policy);
        if refreshed {
            ejected += state.refresh(now_ns, policy, static_hosts);
        }
        if pending.is_empty() && !refreshed && ejected == 0 {
            return Ok(Synced { state, refreshed, ejected });
        }
        match store.set(&key, &encode(&state), cas) {
            Ok(()) => return Ok(Synced { state, refreshed, ejected }),
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
        }
    }
    Err(SyncError::Contended)
}
