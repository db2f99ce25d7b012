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

use crate::clock::RecordClock;
use crate::state::{ClusterBatch, ClusterState, Policy};

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

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::CasMismatch => f.write_str("compare-and-swap mismatch"),
            StoreError::Other(why) => f.write_str(why),
        }
    }
}

/// The shared-data key of a cluster's record. One key per cluster keeps the key count bounded:
/// proxy-wasm shared data has no reliable delete. The key names the format version and a
/// fingerprint of the settings that shape the record (`namespace`), so a listener with another
/// configuration, or a plugin of another format version during an upgrade, keeps its own record
/// instead of fighting over one.
pub fn key(namespace: &str, cluster: &str) -> String {
    format!("ewma_lb.v{FORMAT_VERSION}.{namespace}.cluster.{cluster}")
}

/// The namespace of records written under `policy`: a stable hash (FNV-1a, the same in every VM
/// of a build) of every setting that changes what merging and refreshing do, in postcard's
/// encoding (a field added to the policy is fingerprinted without anyone remembering to).
pub fn namespace(policy: &Policy) -> String {
    let bytes = postcard::to_allocvec(policy).unwrap_or_default();
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

// === Codec ===

/// Leading bytes of every encoded record; a different prefix means "not ours".
pub const MAGIC: &[u8; 4] = b"EWLB";
/// Bumped whenever the encoded layout changes; it is part of the key, so records of other
/// versions live beside ours.
pub const FORMAT_VERSION: u8 = 3;
/// Most hosts a record may hold, whatever a configuration allows; more means it is not a record.
pub const MAX_RECORD_HOSTS: usize = 16_384;

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
            DecodeError::OtherVersion(v) => {
                write!(f, "record format {v}, expected {FORMAT_VERSION}")
            }
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
    let max_hosts = max_hosts.min(MAX_RECORD_HOSTS);
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or(DecodeError::NotOurs)?;
    let (&version, body) = body.split_first().ok_or(DecodeError::NotOurs)?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::OtherVersion(version));
    }
    let state: ClusterState =
        postcard::from_bytes(body).map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    if state.hosts.len() > max_hosts {
        return Err(DecodeError::Corrupt(format!(
            "{} hosts, limit {max_hosts}",
            state.hosts.len()
        )));
    }
    Ok(state)
}

// === The merge loop ===

/// Compare-and-swap attempts per cluster per tick; samples of a tick that lost every attempt are
/// kept by the caller and merged on the next one.
pub const MAX_CAS_ATTEMPTS: usize = 8;

/// The version token a create-if-missing write carries. proxy-wasm ignores the token of a key
/// that does not exist yet and requires a match for one that does, so a write with a token no
/// record holds creates the key only if nobody else has: two VMs that find a cluster's key
/// missing in the same tick never overwrite each other. (Envoy hands out tokens from a counter
/// starting at 1: this one would be current only after four billion writes, and then only for
/// one of them.)
pub const CREATE_CAS: u32 = u32::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncError {
    /// Every compare-and-swap attempt lost to another worker.
    Contended,
    Store(String),
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Contended => write!(
                f,
                "every one of {MAX_CAS_ATTEMPTS} compare-and-swaps lost to another VM"
            ),
            SyncError::Store(why) => write!(f, "shared data: {why}"),
        }
    }
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
    /// Set when the stored bytes were not a record this configuration can read: they were
    /// replaced by a fresh record, and the caller reports why.
    pub replaced: Option<DecodeError>,
}

/// What a sync needs to know besides the store and the batch.
pub struct SyncContext<'a> {
    pub key: &'a str,
    pub static_hosts: &'a [String],
    pub policy: &'a Policy,
    /// The proxy's own zone.
    pub local_zone: Option<&'a str>,
    /// This VM's steady time (`clock::VmClock`).
    pub steady_ns: u64,
}

/// Folds `batch` into the record at `ctx.key`, refreshes it when due, and writes it back under
/// compare-and-swap, retrying on a lost swap. On `Ok` the samples are in shared state and the
/// caller may drop them; on `Err` it must keep them for the next tick. `clock` is this VM's view
/// of the record's clock; every time written into the record is record time.
pub fn sync_cluster(
    store: &mut dyn SharedStore,
    ctx: &SyncContext,
    batch: &ClusterBatch,
    clock: &mut RecordClock,
) -> Result<Synced, SyncError> {
    let policy = ctx.policy;
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (bytes, cas) = store
            .get(ctx.key)
            .map_err(|e| SyncError::Store(e.to_string()))?;
        let (mut state, replaced) = match bytes.map(|b| decode(&b, policy.max_hosts)) {
            Some(Ok(state)) => (state, None),
            // Not a record this build can read in our own key: corrupt. Rebuilt, and reported.
            Some(Err(e)) => (ClusterState::default(), Some(e)),
            None => {
                // Create the key empty first, so the merge below is always a compare-and-swap.
                match store.set(ctx.key, &encode(&ClusterState::default()), Some(CREATE_CAS)) {
                    Ok(()) | Err(StoreError::CasMismatch) => continue,
                    Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
                }
            }
        };
        // A fresh record has no time yet: this VM's own clock starts it.
        let now_ns = clock.now(
            ctx.steady_ns,
            (state.clock_ns > 0).then_some(state.clock_ns),
        );
        state.clock_ns = now_ns;
        let merged = state.merge(batch, now_ns, policy);
        let mut ejected = merged.ejected;
        let refreshed = merged.membership_changed() || state.refresh_due(now_ns, policy);
        if refreshed {
            ejected += state.refresh(now_ns, policy, ctx.static_hosts, ctx.local_zone);
        }
        if batch.is_empty() && !refreshed && ejected == 0 && replaced.is_none() {
            return Ok(Synced {
                state,
                refreshed,
                ejected,
                replaced,
            });
        }
        match store.set(ctx.key, &encode(&state), cas) {
            Ok(()) => {
                return Ok(Synced {
                    state,
                    refreshed,
                    ejected,
                    replaced,
                })
            }
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
        }
    }
    Err(SyncError::Contended)
}
