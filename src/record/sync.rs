//! Sync: the shared-data protocol. Each cluster has, in proxy-wasm shared data:
//!
//! - **slots**, one per worker VM that has samples (claimed under compare-and-swap, reused once
//!   stale, at most [`MAX_SLOTS`]): each VM appends its tick's batch to its own slot, so a tick
//!   costs what the VM sampled, not what the cluster holds;
//! - **the record** (`ClusterState`, the smoothing state and the shares), which only the VM
//!   folding the slots reads and writes;
//! - **the table** (`Table`: each host's share, latency and zone), written beside the record
//!   whenever its version moves, which every other VM reads to adopt it;
//! - **the head**, small, read by every VM on every tick: the table's version, the record's
//!   clock, who is folding, and which slot batches the record holds.
//!
//! Once a refresh interval (or at once, no more than once a tick, for a new host, a new endpoint
//! count or a failing host) one VM takes the head's lease, folds every slot's batches the record
//! does not hold yet into it, refreshes the weights when due, writes the record, then the head.
//! The VM that folded last is the first to find the next fold due: another VM's view of record
//! time caught up with the head's at its own tick after the fold, so it lags by that tick's delay
//! (`clock::RecordClock`). So one VM keeps folding while it lives, and keeps the record it wrote
//! decoded: it decodes the record again only when the record in shared data bears another
//! writer's stamp (`ClusterState::written_by`).
//! Other VMs read the table, not the record, and only when the head names a table version they
//! have not read yet.
//!
//! No batch is lost or folded twice: a slot keeps a batch until the head acknowledges it, and the
//! record itself says which batches it holds (`ClusterState::acked`), so a batch written after
//! the refresher collected is folded next time, and a refresher that died after writing the
//! record but before the head is not repeated by the next one.
//!
//! The store is a trait, so the protocol runs natively in tests with several workers over one
//! in-memory store, and in the VM over the host's shared data.
//!
//! Decoding never trusts its input: bytes of another plugin or another format version, truncated
//! or random, give an error, never a panic.

use serde::{Deserialize, Serialize};

use crate::clock::RecordClock;
use crate::hash::{FNV_OFFSET, FNV_PRIME};
use crate::record::state::{Accumulator, Ack, ClusterBatch, ClusterState, Policy, WORKER_TTL_NS};
use crate::record::table::{HostView, Shares, Table, TableView};

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

/// The shared-data key of a cluster's record. The keys of a cluster are bounded in number
/// (record, head, [`MAX_SLOTS`] slots): proxy-wasm shared data has no reliable delete. Every key
/// names the format version and a fingerprint of the settings that shape the record
/// (`namespace`), so a listener with another configuration, or a plugin of another format
/// version during an upgrade, keeps its own records instead of fighting over one. The kind comes
/// before the cluster's name, which may hold dots, so no cluster's key is another's.
pub fn key(namespace: &str, cluster: &str) -> String {
    format!("ewma_lb.v{FORMAT_VERSION}.{namespace}.cluster.{cluster}")
}

/// The key of a cluster's head.
pub(crate) fn head_key(namespace: &str, cluster: &str) -> String {
    format!("ewma_lb.v{FORMAT_VERSION}.{namespace}.head.{cluster}")
}

/// The key of a cluster's table.
pub(crate) fn table_key(namespace: &str, cluster: &str) -> String {
    format!("ewma_lb.v{FORMAT_VERSION}.{namespace}.table.{cluster}")
}

/// The key of a cluster's slot `slot`.
pub(crate) fn slot_key(namespace: &str, cluster: &str, slot: usize) -> String {
    format!("ewma_lb.v{FORMAT_VERSION}.{namespace}.slot{slot}.{cluster}")
}

/// The keys of one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys {
    pub record: String,
    pub head: String,
    pub table: String,
    namespace: String,
    cluster: String,
}

impl Keys {
    pub fn new(namespace: &str, cluster: &str) -> Self {
        Keys {
            record: key(namespace, cluster),
            head: head_key(namespace, cluster),
            table: table_key(namespace, cluster),
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
        }
    }

    pub fn slot(&self, slot: usize) -> String {
        slot_key(&self.namespace, &self.cluster, slot)
    }
}

// === Codec ===

/// Leading bytes of every encoded record; a different prefix means "not ours".
pub const MAGIC: &[u8; 4] = b"EWLB";
/// Bumped whenever the encoded layout changes; it is part of the key, so records of other
/// versions live beside ours.
pub const FORMAT_VERSION: u8 = 12;
/// Most hosts a record may hold, whatever a configuration allows; more means it is not a record.
pub const MAX_RECORD_HOSTS: usize = 16_384;
/// The largest value this plugin writes to or reads from shared data: the record of
/// [`MAX_RECORD_HOSTS`] hosts fits (a test checks it); a larger value is not ours, and a slot
/// that would grow past it folds its batches into one.
pub const MAX_VALUE_BYTES: usize = 4 << 20;
/// Slots of one cluster: more worker VMs than any Envoy runs.
pub const MAX_SLOTS: usize = 256;
/// Batches one slot holds before the newest are folded into one (a refresher that keeps not
/// coming): their samples are kept, only their separate times are lost.
pub(crate) const MAX_SLOT_BATCHES: usize = 64;
/// A slot not written for this long (record time) may be claimed by another VM, with the batches
/// it still holds.
pub(crate) const SLOT_TTL_NS: u64 = 10 * crate::units::NS_PER_SEC;
/// How long a refresher holds the head's lease: a VM runs a refresh within one tick, so a lease
/// this old belongs to a VM that died or lost its write, and the next one takes over.
pub(crate) const LEASE_NS: u64 = crate::units::NS_PER_SEC;

/// What a value of shared data is, after the format version: a kind of one cluster's key
/// stored in another's is corrupt, not silently misread.
const KIND_RECORD: u8 = b'R';
const KIND_HEAD: u8 = b'H';
const KIND_SLOT: u8 = b'S';
const KIND_TABLE: u8 = b'T';

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

/// `MAGIC`, `FORMAT_VERSION`, the kind, then the value in postcard (compact, no field names).
fn frame<T: Serialize>(kind: u8, value: &T) -> Vec<u8> {
    frame_into(kind, value, 256)
}

/// [`frame`] into a buffer of `capacity` bytes: a record is about as long as the one before it,
/// and growing a buffer of hundreds of kilobytes by doubling copies it several times.
fn frame_into<T: Serialize>(kind: u8, value: &T, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.push(kind);
    // Encoding plain data into a Vec cannot fail; an empty value would decode as not ours.
    postcard::serialize_with_flavor(value, Output(out)).unwrap_or_default()
}

/// postcard's output into a `Vec`. postcard hands over each field's bytes as a slice: a varint
/// of 1 to 10 bytes, a float's 8. Appended as it comes, each slice is a `memcpy` of a length
/// known only at run time, a call per field that made up half of encoding a record; copied at
/// a length known when compiled, it is a few stores (bench/README.md, "Shared state at 10,000
/// endpoints").
struct Output(Vec<u8>);

impl Output {
    fn put<const N: usize>(&mut self, data: &[u8]) {
        match <[u8; N]>::try_from(data) {
            Ok(fixed) => self.0.extend_from_slice(&fixed),
            Err(_) => self.0.extend_from_slice(data),
        }
    }
}

impl postcard::ser_flavors::Flavor for Output {
    type Output = Vec<u8>;

    #[inline(always)]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        match data.len() {
            1 => self.put::<1>(data),
            2 => self.put::<2>(data),
            3 => self.put::<3>(data),
            4 => self.put::<4>(data),
            5 => self.put::<5>(data),
            6 => self.put::<6>(data),
            7 => self.put::<7>(data),
            8 => self.put::<8>(data),
            9 => self.put::<9>(data),
            10 => self.put::<10>(data),
            _ => self.0.extend_from_slice(data),
        }
        Ok(())
    }

    #[inline(always)]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

fn unframe<'a, T: Deserialize<'a>>(bytes: &'a [u8], kind: u8) -> Result<T, DecodeError> {
    postcard::from_bytes(body_of(bytes, kind)?).map_err(corrupt)
}

fn corrupt(e: postcard::Error) -> DecodeError {
    DecodeError::Corrupt(e.to_string())
}

/// The value framed in `bytes`, still encoded, if it is one of ours of kind `kind`.
fn body_of(bytes: &[u8], kind: u8) -> Result<&[u8], DecodeError> {
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or(DecodeError::NotOurs)?;
    let (&version, body) = body.split_first().ok_or(DecodeError::NotOurs)?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::OtherVersion(version));
    }
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(DecodeError::Corrupt(format!(
            "{} bytes, limit {MAX_VALUE_BYTES}",
            bytes.len()
        )));
    }
    match body.split_first() {
        Some((&k, body)) if k == kind => Ok(body),
        Some((&k, _)) => Err(DecodeError::Corrupt(format!("kind {k}, expected {kind}"))),
        None => Err(DecodeError::Corrupt("empty".into())),
    }
}

fn too_many(what: &str, n: usize, limit: usize) -> Result<(), DecodeError> {
    if n > limit {
        return Err(DecodeError::Corrupt(format!("{n} {what}, limit {limit}")));
    }
    Ok(())
}

/// The record of a cluster, encoded into a buffer sized from its host count, as the plugin's
/// folds size it from the record before (`encode_like`): grown from a few hundred bytes, a
/// record of 10,000 hosts took twice as long, in reallocations.
pub fn encode(state: &ClusterState) -> Vec<u8> {
    // About 110 bytes a host (bench/README.md, `record size`).
    encode_like(state, 110 * state.hosts.len())
}

/// [`encode`], into a buffer sized for `previous_len` bytes and a little more.
fn encode_like(state: &ClusterState, previous_len: usize) -> Vec<u8> {
    frame_into(KIND_RECORD, state, previous_len + previous_len / 8 + 256)
}

/// [`ClusterState::written_by`] of the record in `bytes`, read without decoding the rest.
fn written_by(bytes: &[u8]) -> Option<(u64, u64)> {
    let body = body_of(bytes, KIND_RECORD).ok()?;
    postcard::take_from_bytes::<(u64, u64)>(body)
        .ok()
        .map(|(stamp, _)| stamp)
}

/// The record in `bytes`, if it is one of ours, of this format, with at most `max_hosts` hosts.
pub fn decode(bytes: &[u8], max_hosts: usize) -> Result<ClusterState, DecodeError> {
    let state: ClusterState = unframe(bytes, KIND_RECORD)?;
    too_many("hosts", state.hosts.len(), max_hosts.min(MAX_RECORD_HOSTS))?;
    too_many("slots", state.acked.len(), MAX_SLOTS)?;
    Ok(state)
}

/// The table of a cluster, encoded: its [`Shares`] (the versions, the hash of the hosts' names,
/// each host's share and latency), then the hosts' addresses and zones in the same order.
pub fn encode_table(table: &TableView) -> Vec<u8> {
    let shares = Shares {
        table_version: table.table_version,
        num_endpoints: table.num_endpoints,
        unknown_endpoints: table.unknown_endpoints,
        hosts_indistinguishable: table.hosts_indistinguishable,
        hosts_hash: table.hosts_hash,
        hosts: table
            .hosts
            .iter()
            .map(|h| (h.share, h.latency_ms))
            .collect(),
    };
    let names: Vec<(&str, &str)> = table.hosts.iter().map(|h| (h.address, h.zone)).collect();
    frame(KIND_TABLE, &(shares, names))
}

/// The shares of the table in `bytes` and the encoded names after them.
fn decode_shares(bytes: &[u8], max_hosts: usize) -> Result<(Shares, &[u8]), DecodeError> {
    let (shares, names): (Shares, &[u8]) =
        postcard::take_from_bytes(body_of(bytes, KIND_TABLE)?).map_err(corrupt)?;
    too_many("hosts", shares.hosts.len(), max_hosts.min(MAX_RECORD_HOSTS))?;
    Ok((shares, names))
}

/// The table in `bytes`, if it is one of ours, of this format, with at most `max_hosts` hosts.
pub fn decode_table(bytes: &[u8], max_hosts: usize) -> Result<TableView<'_>, DecodeError> {
    let (shares, names) = decode_shares(bytes, max_hosts)?;
    with_names(shares, names)
}

/// The table of `shares` and the `names` encoded after them.
fn with_names(shares: Shares, names: &[u8]) -> Result<TableView<'_>, DecodeError> {
    let names: Vec<(&str, &str)> = postcard::from_bytes(names).map_err(corrupt)?;
    if names.len() != shares.hosts.len() {
        return Err(DecodeError::Corrupt(format!(
            "{} names for {} hosts",
            names.len(),
            shares.hosts.len()
        )));
    }
    Ok(TableView {
        table_version: shares.table_version,
        num_endpoints: shares.num_endpoints,
        unknown_endpoints: shares.unknown_endpoints,
        hosts_indistinguishable: shares.hosts_indistinguishable,
        hosts_hash: shares.hosts_hash,
        hosts: names
            .into_iter()
            .zip(shares.hosts)
            .map(|((address, zone), (share, latency_ms))| HostView {
                address,
                zone,
                share,
                latency_ms,
            })
            .collect(),
    })
}

/// The table in `bytes` as [`decode_table`] reads it, adopted over `held`
/// ([`Table::adopt`]): when it lists the hosts `held` lists (the same `hosts_hash`, as many
/// hosts), its names are not read at all.
pub fn decode_table_onto(
    bytes: &[u8],
    max_hosts: usize,
    held: &Table,
) -> Result<Table, DecodeError> {
    let (shares, names) = decode_shares(bytes, max_hosts)?;
    if shares.hosts_hash != 0
        && shares.hosts_hash == held.hosts_hash
        && shares.hosts.len() == held.len()
    {
        return Ok(held.with_shares(&shares));
    }
    Ok(Table::adopt(&with_names(shares, names)?, held))
}

/// The small value every VM reads on every tick.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Head {
    /// The record's `table_version` as last published.
    pub table_version: u64,
    /// The record's clock at the last fold (`clock`).
    pub clock_ns: u64,
    /// Record time of the last fold; 0 before the first.
    pub folded_ns: u64,
    /// The VM folding now, if any.
    pub lease: Option<Lease>,
    /// Worker VMs that sampled the cluster lately: they share its probes (`probe`).
    pub workers: u32,
    /// The record's `acked` as last published: what each slot's owner may forget.
    pub acked: Vec<Ack>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: u64,
    /// Record time after which the lease is anyone's.
    pub until_ns: u64,
}

impl Head {
    fn acked(&self, slot: u16) -> Option<Ack> {
        find_ack(&self.acked, slot)
    }
}

fn find_ack(acked: &[Ack], slot: u16) -> Option<Ack> {
    acked
        .binary_search_by_key(&slot, |a| a.slot)
        .ok()
        .and_then(|i| acked.get(i).copied())
}

pub fn encode_head(head: &Head) -> Vec<u8> {
    frame(KIND_HEAD, head)
}

pub fn decode_head(bytes: &[u8]) -> Result<Head, DecodeError> {
    let head: Head = unframe(bytes, KIND_HEAD)?;
    too_many("slots", head.acked.len(), MAX_SLOTS)?;
    Ok(head)
}

/// One worker VM's batches not yet acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// The VM writing it.
    pub owner: u64,
    /// Drawn when the slot is created or rebuilt: a record's acknowledgement of an older epoch
    /// says nothing of this one's batches.
    pub epoch: u64,
    /// The number of the last batch written.
    pub seq: u64,
    /// Record time of the last write, and of the last batch with samples.
    pub written_ns: u64,
    pub sampled_ns: u64,
    pub batches: Vec<SlotBatch>,
}

/// One tick's batch of one VM, with the record time it was taken at.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotBatch {
    pub seq: u64,
    pub at_ns: u64,
    pub num_endpoints: Option<u32>,
    pub hosts: Vec<(String, Accumulator)>,
}

pub fn encode_slot(slot: &Slot) -> Vec<u8> {
    frame(KIND_SLOT, slot)
}

/// A slot's leading fields, which [`Slot`] encodes first: enough to tell whether it holds
/// anything a record has not folded yet without decoding its batches. Read wrong (a layout
/// changed under it), it costs only that: a slot is skipped only when its epoch and sequence
/// number are the ones the record acknowledged.
struct SlotHeader {
    owner: u64,
    epoch: u64,
    seq: u64,
    sampled_ns: u64,
}

fn decode_slot_header(bytes: &[u8]) -> Result<SlotHeader, DecodeError> {
    // A tuple, not a derived struct: the same bytes, a smaller deserializer in the module.
    let ((owner, epoch, seq, _written_ns, sampled_ns), _) =
        postcard::take_from_bytes::<(u64, u64, u64, u64, u64)>(body_of(bytes, KIND_SLOT)?)
            .map_err(corrupt)?;
    Ok(SlotHeader {
        owner,
        epoch,
        seq,
        sampled_ns,
    })
}

pub fn decode_slot(bytes: &[u8]) -> Result<Slot, DecodeError> {
    let slot: Slot = unframe(bytes, KIND_SLOT)?;
    too_many("batches", slot.batches.len(), MAX_SLOT_BATCHES)?;
    for b in &slot.batches {
        too_many("hosts", b.hosts.len(), MAX_RECORD_HOSTS)?;
    }
    Ok(slot)
}

impl Slot {
    /// Forgets the batches the head says the record holds.
    fn forget_acked(&mut self, ack: Option<Ack>) {
        if let Some(ack) = ack.filter(|a| a.epoch == self.epoch) {
            self.batches.retain(|b| b.seq > ack.seq);
        }
    }

    /// Appends `batch` taken at `at_ns`, folding the newest batches together when the slot is
    /// full or too large, so a refresher that never comes costs memory, not samples.
    fn push(&mut self, batch: &ClusterBatch, at_ns: u64) {
        self.seq = self.seq.wrapping_add(1);
        let hosts: Vec<(String, Accumulator)> = batch
            .hosts
            .iter()
            .filter(|(_, acc)| !acc.is_empty())
            .map(|(a, acc)| (a.clone(), acc.clone()))
            .collect();
        if hosts.iter().any(|(_, acc)| acc.latency.count > 0) {
            self.sampled_ns = at_ns;
        }
        self.batches.push(SlotBatch {
            seq: self.seq,
            at_ns,
            num_endpoints: batch.num_endpoints,
            hosts,
        });
        if self.batches.len() > MAX_SLOT_BATCHES {
            self.squash();
        }
    }

    /// Folds the two newest batches into one.
    fn squash(&mut self) {
        let (Some(last), Some(prev)) = (self.batches.pop(), self.batches.last_mut()) else {
            return;
        };
        for (address, acc) in last.hosts {
            match prev.hosts.iter_mut().find(|(a, _)| *a == address) {
                Some((_, into)) => into.absorb(&acc),
                None => prev.hosts.push((address, acc)),
            }
        }
        prev.seq = last.seq;
        prev.at_ns = last.at_ns;
        prev.num_endpoints = last.num_endpoints.or(prev.num_endpoints);
    }
}

// === The tick ===

/// Compare-and-swap attempts per key per tick; a batch that lost every attempt is kept by the
/// caller and written on the next one.
pub(crate) const MAX_CAS_ATTEMPTS: usize = 8;

/// The version token a create-if-missing write carries. proxy-wasm ignores the token of a key
/// that does not exist yet and requires a match for one that does, so a write with a token no
/// value holds creates the key only if nobody else has: two VMs that find a key missing in the
/// same tick never overwrite each other. (Envoy hands out tokens from a counter starting at 1:
/// this one would be current only after four billion writes, and then only for one of them.)
pub(crate) const CREATE_CAS: u32 = u32::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncError {
    /// Every compare-and-swap attempt lost to another worker.
    Contended,
    /// Every slot is held by a live VM.
    NoSlot,
    Store(String),
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Contended => write!(
                f,
                "every one of {MAX_CAS_ATTEMPTS} compare-and-swaps lost to another VM"
            ),
            SyncError::NoSlot => write!(f, "all {MAX_SLOTS} slots are held by live VMs"),
            SyncError::Store(why) => write!(f, "shared data: {why}"),
        }
    }
}

fn store_error(e: StoreError) -> SyncError {
    SyncError::Store(e.to_string())
}

/// What one VM's tick did with a cluster's shared data.
#[derive(Debug, Default)]
pub struct Synced {
    pub head: Head,
    /// Whether this VM folded the slots into the record (and published it) this tick: the
    /// record is then `Member::record`.
    pub folded: bool,
    /// The table, when the head named a version other than the one of `SyncContext::table`:
    /// read, or made by this VM's fold.
    pub table: Option<Table>,
    /// Whether this VM recomputed the weights.
    pub refreshed: bool,
    /// Hosts this VM ejected.
    pub ejected: usize,
    /// Set when stored bytes were not a value this configuration can read: they were replaced,
    /// and the caller reports why.
    pub replaced: Option<DecodeError>,
    /// Why the batch could not be written (the caller keeps it); `None`: it is in shared data.
    pub kept: Option<SyncError>,
    /// Why a refresh this VM started did not finish (the next refresher redoes it).
    pub failed: Option<SyncError>,
}

/// What a tick needs to know besides the store and the batch.
pub struct SyncContext<'a> {
    pub keys: &'a Keys,
    pub static_hosts: &'a [String],
    pub policy: &'a Policy,
    /// The proxy's own zone.
    pub local_zone: Option<&'a str>,
    /// This VM's steady time (`clock::VmClock`).
    pub steady_ns: u64,
    /// This VM's identity.
    pub worker: u64,
    /// The tick period: the least time between two refreshes asked for by `urgent`.
    pub tick_ns: u64,
    /// The batch holds what the table should follow now, not at the next refresh: a host the
    /// table does not know, a new endpoint count, a host failing or gone.
    pub urgent: bool,
    /// The table this VM holds.
    pub table: &'a Table,
}

/// This VM's place in one cluster's shared data.
#[derive(Clone, Debug, Default)]
pub struct Member {
    /// This VM's view of the record's clock.
    pub clock: RecordClock,
    /// The slot this VM writes to, once claimed.
    pub slot: Option<u16>,
    /// The record as this VM last wrote it, while no other VM has folded since.
    kept: Option<Kept>,
    /// Folds this VM has written: with its identity, each record's `written_by`.
    folds: u64,
}

/// A record this VM wrote, so that the VM folding refresh after refresh decodes the record only
/// when someone else wrote it (decoding was about a quarter of a refresh, bench/README.md).
/// Shared data still holds it when the record there bears its `written_by`: another writer, or
/// this VM's own write that failed to publish (a fold that fails after writing the record keeps
/// nothing), stamps another. The VM holds the state between folds instead of only during one.
#[derive(Clone, Debug)]
struct Kept {
    state: ClusterState,
    /// The fold's time, as its head says: a head naming another fold means another VM folds now.
    folded_ns: u64,
    /// [`TableView::hosts_hash`] of `state`'s hosts, when this VM made a table of them and
    /// nothing has changed the list since; 0 when not known. A fold that changes no host then
    /// makes its table over the names of the one this VM holds without comparing them, when
    /// that one lists the same hosts (the same hash; what the comparison cost: bench/README.md,
    /// "Shared state at 10,000 endpoints").
    hosts_hash: u64,
}

impl Member {
    /// The record this VM wrote at its last fold, while no other VM has folded since.
    pub fn record(&self) -> Option<&ClusterState> {
        self.kept.as_ref().map(|k| &k.state)
    }
}

/// One tick of one VM for one cluster: reads the head, appends `batch` to this VM's slot, folds
/// every slot into the record when a refresh is due (or `ctx.urgent`) and nobody else is at it,
/// and reads the record when the head names a table this VM has not adopted. Every time written
/// into shared data is record time. `Err`: the head could not be read, nothing was done.
pub fn sync_cluster(
    store: &mut dyn SharedStore,
    ctx: &SyncContext,
    batch: &ClusterBatch,
    member: &mut Member,
) -> Result<Synced, SyncError> {
    let (bytes, head_cas) = store.get(&ctx.keys.head).map_err(store_error)?;
    let mut synced = Synced::default();
    match bytes.map(|b| decode_head(&b)) {
        Some(Ok(head)) => synced.head = head,
        Some(Err(e)) => synced.replaced = Some(e),
        None => {}
    }
    let stored = (synced.head.clock_ns > 0).then_some(synced.head.clock_ns);
    let now_ns = member.clock.now(ctx.steady_ns, stored);
    let mut written = false;
    if !batch.is_empty() {
        match write_batch(store, ctx, &synced.head, batch, now_ns, member) {
            Ok(replaced) => {
                written = true;
                synced.replaced = synced.replaced.take().or(replaced);
            }
            Err(e) => synced.kept = Some(e),
        }
    }
    let head = &synced.head;
    if member
        .kept
        .as_ref()
        .is_some_and(|k| k.folded_ns != head.folded_ns)
    {
        member.kept = None;
    }
    let since = now_ns.saturating_sub(head.folded_ns);
    let due = head_cas.is_none()
        || synced.replaced.is_some()
        || since >= ctx.policy.refresh_interval_ns
        || (ctx.urgent && written && since >= ctx.tick_ns);
    let free = head
        .lease
        .is_none_or(|l| l.until_ns <= now_ns || l.holder == ctx.worker);
    if due && free {
        match fold(store, ctx, head, head_cas, now_ns, member) {
            Ok(Some(folded)) => {
                synced.head = folded.head;
                synced.refreshed = folded.refreshed;
                synced.ejected = folded.ejected;
                synced.replaced = synced.replaced.take().or(folded.replaced);
                synced.folded = true;
                synced.table = folded.table;
                return Ok(synced);
            }
            Ok(None) => {}
            Err(e) => synced.failed = Some(e),
        }
    }
    if synced.head.table_version != ctx.table.table_version {
        synced.table = read_table(store, &ctx.keys.table, ctx.policy.max_hosts, ctx.table);
    }
    Ok(synced)
}

/// The table at `key`, if there is one this configuration can read, sharing the names of
/// `previous`.
fn read_table(
    store: &dyn SharedStore,
    key: &str,
    max_hosts: usize,
    previous: &Table,
) -> Option<Table> {
    let Ok((Some(bytes), _)) = store.get(key) else {
        return None;
    };
    decode_table_onto(&bytes, max_hosts, previous).ok()
}

/// The record at `key`, if there is one this configuration can read.
pub fn read_record(store: &dyn SharedStore, key: &str, max_hosts: usize) -> Option<ClusterState> {
    let Ok((Some(bytes), _)) = store.get(key) else {
        return None;
    };
    decode(&bytes, max_hosts).ok()
}

/// Appends `batch` to this VM's slot, claiming one first if it has none (or lost its own to a VM
/// that found it stale). Returns a decode error when it rebuilt a slot it could not read.
fn write_batch(
    store: &mut dyn SharedStore,
    ctx: &SyncContext,
    head: &Head,
    batch: &ClusterBatch,
    now_ns: u64,
    member: &mut Member,
) -> Result<Option<DecodeError>, SyncError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Some(index) = member.slot else {
            return claim(store, ctx, head, batch, now_ns, member);
        };
        let key = ctx.keys.slot(usize::from(index));
        let (bytes, cas) = store.get(&key).map_err(store_error)?;
        let mut slot = match bytes.map(|b| decode_slot(&b)) {
            Some(Ok(slot)) if slot.owner == ctx.worker => slot,
            // Taken over, rebuilt or never ours: find another.
            _ => {
                member.slot = None;
                continue;
            }
        };
        slot.forget_acked(head.acked(index));
        slot.push(batch, now_ns);
        slot.written_ns = now_ns;
        match put_slot(store, &key, &mut slot, cas.or(Some(CREATE_CAS))) {
            Ok(()) => return Ok(None),
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
        }
    }
    Err(SyncError::Contended)
}

/// Writes a slot, folding its newest batches together while it is larger than a value may be.
fn put_slot(
    store: &mut dyn SharedStore,
    key: &str,
    slot: &mut Slot,
    cas: Option<u32>,
) -> Result<(), StoreError> {
    let mut bytes = encode_slot(slot);
    while bytes.len() > MAX_VALUE_BYTES && slot.batches.len() > 1 {
        slot.squash();
        bytes = encode_slot(slot);
    }
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(StoreError::Other(format!(
            "a slot of {} bytes, limit {MAX_VALUE_BYTES}",
            bytes.len()
        )));
    }
    store.set(key, &bytes, cas)
}

/// Finds this VM a slot: the first missing one (created), or one not written for
/// [`SLOT_TTL_NS`] (its batches kept: the refresher folds them as if its owner had stayed), or one
/// that does not decode (rebuilt, with a new epoch).
fn claim(
    store: &mut dyn SharedStore,
    ctx: &SyncContext,
    head: &Head,
    batch: &ClusterBatch,
    now_ns: u64,
    member: &mut Member,
) -> Result<Option<DecodeError>, SyncError> {
    for index in 0..MAX_SLOTS {
        let Ok(index16) = u16::try_from(index) else {
            break;
        };
        let key = ctx.keys.slot(index);
        let (bytes, cas) = store.get(&key).map_err(store_error)?;
        let fresh = || Slot {
            owner: ctx.worker,
            epoch: epoch(ctx.worker, now_ns, index),
            ..Slot::default()
        };
        let (mut slot, replaced, cas) = match bytes.map(|b| decode_slot(&b)) {
            None => (fresh(), None, CREATE_CAS),
            Some(Ok(slot)) if now_ns.saturating_sub(slot.written_ns) >= SLOT_TTL_NS => {
                (slot, None, cas.unwrap_or(CREATE_CAS))
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => (fresh(), Some(e), cas.unwrap_or(CREATE_CAS)),
        };
        slot.owner = ctx.worker;
        slot.forget_acked(head.acked(index16));
        slot.push(batch, now_ns);
        slot.written_ns = now_ns;
        match put_slot(store, &key, &mut slot, Some(cas)) {
            Ok(()) => {
                member.slot = Some(index16);
                return Ok(replaced);
            }
            // Another VM took it first.
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
        }
    }
    Err(SyncError::NoSlot)
}

/// A new slot's epoch: different for every creation (another VM, another time), never 0.
fn epoch(worker: u64, now_ns: u64, index: usize) -> u64 {
    let mut h = FNV_OFFSET;
    for v in [worker, now_ns, index as u64] {
        h = (h ^ v).wrapping_mul(FNV_PRIME).rotate_left(29);
    }
    h.max(1)
}

struct Folded {
    head: Head,
    table: Option<Table>,
    refreshed: bool,
    ejected: usize,
    replaced: Option<DecodeError>,
}

/// Takes the head's lease, folds every slot's unacknowledged batches into the record, refreshes
/// it when due, writes it, then publishes the head. `None`: another VM holds the lease or wrote
/// the record first; nothing was changed.
fn fold(
    store: &mut dyn SharedStore,
    ctx: &SyncContext,
    head: &Head,
    head_cas: Option<u32>,
    now_ns: u64,
    member: &mut Member,
) -> Result<Option<Folded>, SyncError> {
    let policy = ctx.policy;
    // The lease goes on the head as read (a head this VM could not decode is replaced by it),
    // so the VMs that tick meanwhile keep their table and their slots.
    let lease = Head {
        lease: Some(Lease {
            holder: ctx.worker,
            until_ns: now_ns.saturating_add(LEASE_NS),
        }),
        ..head.clone()
    };
    match store.set(
        &ctx.keys.head,
        &encode_head(&lease),
        Some(head_cas.unwrap_or(CREATE_CAS)),
    ) {
        Ok(()) => {}
        Err(StoreError::CasMismatch) => return Ok(None),
        Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
    }
    let (bytes, record_cas) = store.get(&ctx.keys.record).map_err(store_error)?;
    let kept = member.kept.take();
    let record_len = bytes.as_ref().map_or(0, Vec::len);
    let (mut state, replaced, mut hosts_hash) = match bytes {
        // The record this VM wrote last, so the state it kept: a refresher that died after
        // writing the record, or any other writer, stamped its own.
        Some(b)
            if kept
                .as_ref()
                .is_some_and(|k| written_by(&b) == Some(k.state.written_by)) =>
        {
            kept.map(|k| (k.state, None, k.hosts_hash))
                .unwrap_or_default()
        }
        Some(b) => match decode(&b, policy.max_hosts) {
            Ok(state) => (state, None, 0),
            // Not a record this build can read in our own key: corrupt. Rebuilt, and reported.
            Err(e) => (ClusterState::default(), Some(e), 0),
        },
        None => (ClusterState::default(), None, 0),
    };
    let (batches, acked, workers) = collect(store, ctx, &state, now_ns)?;
    let now_ns = batches
        .iter()
        .map(|b| b.at_ns)
        .fold(now_ns.max(state.clock_ns), u64::max);
    member.clock.now(ctx.steady_ns, Some(now_ns));
    state.clock_ns = now_ns;
    // Every VM's batches of a host since the last fold become one batch, taken in at the fold's
    // time: folded one by one, a batch stamped before a host's last update (a VM that wrote after
    // the previous collect) would carry no weight in a time-decayed estimate, and of two batches
    // at one time the second none either.
    let mut hosts: crate::map::Map<String, Accumulator> = crate::map::Map::default();
    let mut num_endpoints = None;
    for b in &batches {
        for (address, acc) in &b.hosts {
            match hosts.get_mut(address) {
                Some(sum) => sum.absorb(acc),
                None => {
                    hosts.insert(address.clone(), acc.clone());
                }
            }
        }
        num_endpoints = b.num_endpoints.or(num_endpoints);
    }
    let merged = state.merge_hosts(
        hosts.iter().map(|(a, acc)| (a.as_str(), acc)),
        num_endpoints,
        now_ns,
        policy,
    );
    let merged = state.settle(merged, now_ns, policy);
    let mut ejected = merged.ejected;
    let refreshed = merged.membership_changed() || state.refresh_due(now_ns, policy);
    let mut relisted = merged.relisted();
    if refreshed {
        let r = state.refresh(now_ns, policy, ctx.static_hosts, ctx.local_zone);
        ejected += r.ejected;
        relisted |= r.relisted;
    }
    if relisted {
        hosts_hash = 0;
    }
    state.acked = acked;
    state.workers = workers;
    member.folds = member.folds.wrapping_add(1);
    state.written_by = (ctx.worker, member.folds);
    let bytes = encode_like(&state, record_len);
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(SyncError::Store(format!(
            "a record of {} bytes, limit {MAX_VALUE_BYTES}",
            bytes.len()
        )));
    }
    match store.set(
        &ctx.keys.record,
        &bytes,
        Some(record_cas.unwrap_or(CREATE_CAS)),
    ) {
        Ok(()) => {}
        // A refresher whose lease ran out wrote first: its fold stands, this one is dropped.
        Err(StoreError::CasMismatch) => return Ok(None),
        Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
    }
    // The table goes before the head that names its version. Its version moves with anything
    // it holds (the shares, the hosts, the endpoint count): one not named by the head yet is
    // new, or the one a refresher that died before publishing did not write.
    let new_table = state.table_version != head.table_version;
    let mut table = None;
    if new_table || state.table_version != ctx.table.table_version {
        let mut view = TableView::of(&state);
        let same_hosts = hosts_hash != 0
            && hosts_hash == ctx.table.hosts_hash
            && view.hosts.len() == ctx.table.len();
        let adopted = match same_hosts {
            true => ctx.table.with_view_shares(&view),
            false => Table::adopt(&view, ctx.table),
        };
        view.hosts_hash = adopted.hosts_hash;
        hosts_hash = adopted.hosts_hash;
        if new_table {
            write_table(store, ctx, &view)?;
        }
        table = Some(adopted);
    }
    let head = Head {
        table_version: state.table_version,
        clock_ns: now_ns,
        folded_ns: now_ns,
        lease: None,
        workers: u32::try_from(state.active_workers()).unwrap_or(u32::MAX),
        acked: state.acked.clone(),
    };
    publish(store, ctx, &head)?;
    member.kept = Some(Kept {
        state,
        folded_ns: now_ns,
        hosts_hash,
    });
    Ok(Some(Folded {
        head,
        table,
        refreshed,
        ejected,
        replaced,
    }))
}

/// Writes the table of a fold, if this VM still holds the lease: a refresher whose lease ran
/// out (a fold of more than [`LEASE_NS`]) may be followed by another whose newer table it must
/// not overwrite.
fn write_table(
    store: &mut dyn SharedStore,
    ctx: &SyncContext,
    table: &TableView,
) -> Result<(), SyncError> {
    let bytes = encode_table(table);
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(SyncError::Store(format!(
            "a table of {} bytes, limit {MAX_VALUE_BYTES}",
            bytes.len()
        )));
    }
    match holds_lease(store, ctx)? {
        Some(_) => store
            .set(&ctx.keys.table, &bytes, None)
            .map_err(store_error),
        None => Ok(()),
    }
}

/// The head's version token if this VM holds its lease.
fn holds_lease(
    store: &dyn SharedStore,
    ctx: &SyncContext,
) -> Result<Option<Option<u32>>, SyncError> {
    let (bytes, cas) = store.get(&ctx.keys.head).map_err(store_error)?;
    let head = bytes.and_then(|b| decode_head(&b).ok());
    Ok((head.and_then(|h| h.lease).map(|l| l.holder) == Some(ctx.worker)).then_some(cas))
}

/// Batches to fold, in time order; what the record holds once they are; the VMs that sampled.
type Collected = (Vec<SlotBatch>, Vec<Ack>, Vec<(u64, u64)>);

/// Every slot's batches `state` does not hold yet, in time order; what the record will hold
/// once they are folded; and the VMs that sampled within [`WORKER_TTL_NS`].
fn collect(
    store: &dyn SharedStore,
    ctx: &SyncContext,
    state: &ClusterState,
    now_ns: u64,
) -> Result<Collected, SyncError> {
    let mut batches = Vec::new();
    let mut acked = Vec::new();
    let mut workers: Vec<(u64, u64)> = Vec::new();
    for index in 0..MAX_SLOTS {
        let Ok(index16) = u16::try_from(index) else {
            break;
        };
        // Slots are claimed in order and never deleted: the first missing one ends them.
        let (Some(bytes), _) = store.get(&ctx.keys.slot(index)).map_err(store_error)? else {
            break;
        };
        let held = |epoch| find_ack(&state.acked, index16).filter(|a| a.epoch == epoch);
        let (owner, epoch, seq, sampled_ns) = match decode_slot_header(&bytes) {
            // The record holds the slot's last batch: nothing new. An idle VM's slot keeps its
            // batches until it writes again; they are not decoded again at every fold.
            Ok(h) if held(h.epoch).is_some_and(|a| a.seq == h.seq) => {
                (h.owner, h.epoch, h.seq, h.sampled_ns)
            }
            _ => {
                let Ok(slot) = decode_slot(&bytes) else {
                    // Its owner rebuilds it on its next write, under a new epoch.
                    continue;
                };
                let held = held(slot.epoch);
                for b in slot.batches {
                    if held.is_none_or(|a| b.seq > a.seq) {
                        batches.push(b);
                    }
                }
                (slot.owner, slot.epoch, slot.seq, slot.sampled_ns)
            }
        };
        acked.push(Ack {
            slot: index16,
            epoch,
            seq,
        });
        if sampled_ns > 0 && now_ns.saturating_sub(sampled_ns) < WORKER_TTL_NS {
            // By id, as `ClusterState::workers` keeps them; a VM with two slots (one it left
            // after a restart) counts once, seen when it last sampled.
            match workers.binary_search_by_key(&owner, |(id, _)| *id) {
                Ok(i) => {
                    if let Some(w) = workers.get_mut(i) {
                        w.1 = w.1.max(sampled_ns);
                    }
                }
                Err(i) => workers.insert(i, (owner, sampled_ns)),
            }
        }
    }
    batches.sort_by_key(|b| b.at_ns);
    Ok((batches, acked, workers))
}

/// Writes the head of a fold, if this VM still holds the lease (one that ran out may be another
/// refresher's now: it publishes).
fn publish(store: &mut dyn SharedStore, ctx: &SyncContext, head: &Head) -> Result<(), SyncError> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Some(cas) = holds_lease(store, ctx)? else {
            return Ok(());
        };
        match store.set(&ctx.keys.head, &encode_head(head), cas) {
            Ok(()) => return Ok(()),
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other(e)) => return Err(SyncError::Store(e)),
        }
    }
    Err(SyncError::Contended)
}
