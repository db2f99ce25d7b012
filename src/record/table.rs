//! The table: what a VM needs of a cluster's record to pick, published beside the record by
//! the VM that refreshed it. The record holds a host's whole smoothing state, which only the
//! refreshing VM uses; every other VM adopting a new table reads this instead: a third of the
//! bytes, and no state it would throw away.
//!
//! It is written and read through a borrowed view ([`TableView`]): the refresher encodes it
//! straight from the record, and a VM reading it keeps the names it already holds
//! ([`Table::adopt`]), so adopting a table of unchanged hosts allocates no name. The stored table
//! puts the shares before the names, with a hash of the names ([`TableView::hosts_hash`]): a VM
//! whose table lists the same hosts, as it does between two changes of membership, reads the
//! shares and stops there (`sync::decode_table_onto`).

use std::cmp::Ordering;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::hash::{fnv1a, FNV_OFFSET};
use crate::names::same as same_name;
use crate::record::state::ClusterState;

/// A table as stored in shared data (`sync::encode_table` gives the layout).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableView<'a> {
    /// The record's `table_version` this table is.
    pub table_version: u64,
    /// The cluster's endpoint count as Envoy last reported it; 0 before any report.
    pub num_endpoints: u32,
    /// Endpoints the table does not know (`ClusterState::unknown_endpoints`).
    pub unknown_endpoints: u32,
    /// The weights cannot tell the hosts apart (`ClusterState::hosts_indistinguishable`).
    pub hosts_indistinguishable: bool,
    /// Names the list of hosts, addresses and zones in order ([`hosts_hash`]); 0 when not
    /// computed yet.
    pub hosts_hash: u64,
    /// Sorted by address, as in the record.
    pub hosts: Vec<HostView<'a>>,
}

/// One host of a [`TableView`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostView<'a> {
    pub address: &'a str,
    /// `upstream.locality.zone`; empty until reported.
    pub zone: &'a str,
    /// Share of steered traffic; 0 for hosts out of the table (ejected, absent, not weighted).
    pub share: f64,
    /// The smoothed latency; `None` before any sample.
    pub latency_ms: Option<f64>,
}

impl<'a> TableView<'a> {
    /// The table of `state`.
    pub fn of(state: &'a ClusterState) -> Self {
        TableView {
            table_version: state.table_version,
            num_endpoints: state.num_endpoints,
            unknown_endpoints: if state.num_endpoints > 0 {
                state.unknown_endpoints()
            } else {
                0
            },
            hosts_indistinguishable: state.hosts_indistinguishable,
            hosts_hash: 0,
            hosts: state
                .hosts
                .iter()
                .map(|h| HostView {
                    address: &h.address,
                    zone: &h.zone,
                    share: h.share,
                    latency_ms: h.latency.value_ms(),
                })
                .collect(),
        }
    }
}

/// What a stored table holds before the names: all a VM that holds the same hosts reads.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Shares {
    pub table_version: u64,
    pub num_endpoints: u32,
    pub unknown_endpoints: u32,
    pub hosts_indistinguishable: bool,
    pub hosts_hash: u64,
    /// Each host's share and latency, in the order of the names.
    pub hosts: Vec<(f64, Option<f64>)>,
}

/// A hash of the hosts' addresses and zones, in order; never 0. FNV-1a over each name's length
/// and bytes: not for an adversary (the names are the control plane's), only to tell two lists
/// apart.
pub fn hosts_hash<'a>(hosts: impl IntoIterator<Item = (&'a str, &'a str)>) -> u64 {
    let eat = |h, name: &str| {
        let h = fnv1a(h, &(name.len() as u64).to_le_bytes());
        fnv1a(h, name.as_bytes())
    };
    hosts
        .into_iter()
        .fold(FNV_OFFSET, |h, (address, zone)| eat(eat(h, address), zone))
        .max(1)
}

/// One version of a cluster's weight table, as a VM holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub table_version: u64,
    pub num_endpoints: u32,
    pub unknown_endpoints: u32,
    pub hosts_indistinguishable: bool,
    /// [`TableView::hosts_hash`] of these hosts; 0 for the empty table a VM starts with.
    pub hosts_hash: u64,
    /// The hosts' names, sorted by address: one list shared by the tables of the same hosts
    /// and by the pick tables made from them, so a new table of 10,000 known hosts takes the
    /// list, not 20,000 names one by one (each a count on its own cache line, bench/README.md).
    addresses: Rc<[Rc<str>]>,
    /// Each host's zone, index for index with `addresses`.
    zones: Rc<[Rc<str>]>,
    /// Each host's share and latency, index for index with `addresses`.
    values: Vec<(f64, Option<f64>)>,
}

/// One host of a [`Table`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TableHost<'a> {
    pub address: &'a Rc<str>,
    pub zone: &'a Rc<str>,
    pub share: f64,
    pub latency_ms: Option<f64>,
}

impl Table {
    /// `view`, taking the names `previous` holds where they are the same. Its `hosts_hash` is
    /// the view's, or when the view has none, `previous`'s if it lists the same hosts.
    pub fn adopt(view: &TableView, previous: &Table) -> Table {
        // Both are sorted by address: one walk finds every host already held.
        let mut held = previous.hosts().peekable();
        let mut all_held = view.hosts.len() == previous.len();
        // Hosts share few zones: a new name takes the zone of the host before it when equal.
        let mut last_zone: Rc<str> = Rc::from("");
        let (mut addresses, mut zones) = (
            Vec::with_capacity(view.hosts.len()),
            Vec::with_capacity(view.hosts.len()),
        );
        for h in &view.hosts {
            // One comparison a host: most are held, and equal names compare in full.
            let mut same = None;
            while let Some(p) = held.peek() {
                match (**p.address).cmp(h.address) {
                    Ordering::Less => {
                        held.next();
                    }
                    Ordering::Equal => {
                        same = held.next();
                        break;
                    }
                    Ordering::Greater => break,
                }
            }
            let address = match same {
                Some(p) => Rc::clone(p.address),
                None => {
                    all_held = false;
                    Rc::from(h.address)
                }
            };
            let zone = match same {
                Some(p) if **p.zone == *h.zone => Rc::clone(p.zone),
                _ if *last_zone == *h.zone => {
                    all_held = false;
                    Rc::clone(&last_zone)
                }
                _ => {
                    all_held = false;
                    Rc::from(h.zone)
                }
            };
            last_zone = Rc::clone(&zone);
            addresses.push(address);
            zones.push(zone);
        }
        let hosts_hash = match view.hosts_hash {
            0 if all_held && previous.hosts_hash != 0 => previous.hosts_hash,
            0 => hosts_hash(view.hosts.iter().map(|h| (h.address, h.zone))),
            stored => stored,
        };
        // Every host held, with its zone: the list held is this one.
        let (addresses, zones) = match all_held {
            true => (Rc::clone(&previous.addresses), Rc::clone(&previous.zones)),
            false => (addresses.into(), zones.into()),
        };
        Table {
            table_version: view.table_version,
            num_endpoints: view.num_endpoints,
            unknown_endpoints: view.unknown_endpoints,
            hosts_indistinguishable: view.hosts_indistinguishable,
            hosts_hash,
            addresses,
            zones,
            values: view.hosts.iter().map(|h| (h.share, h.latency_ms)).collect(),
        }
    }

    /// The table of `shares` over the hosts this one holds: `shares` names the same list
    /// (`hosts_hash`) with as many hosts.
    pub(crate) fn with_shares(&self, shares: &Shares) -> Table {
        Table {
            table_version: shares.table_version,
            num_endpoints: shares.num_endpoints,
            unknown_endpoints: shares.unknown_endpoints,
            hosts_indistinguishable: shares.hosts_indistinguishable,
            hosts_hash: shares.hosts_hash,
            addresses: Rc::clone(&self.addresses),
            zones: Rc::clone(&self.zones),
            values: shares.hosts.clone(),
        }
    }

    /// The table of `view` over the hosts this one holds: the caller knows `view` lists the
    /// same hosts (addresses and zones, in order), so no name is read.
    pub(crate) fn with_view_shares(&self, view: &TableView) -> Table {
        Table {
            table_version: view.table_version,
            num_endpoints: view.num_endpoints,
            unknown_endpoints: view.unknown_endpoints,
            hosts_indistinguishable: view.hosts_indistinguishable,
            hosts_hash: self.hosts_hash,
            addresses: Rc::clone(&self.addresses),
            zones: Rc::clone(&self.zones),
            values: view.hosts.iter().map(|v| (v.share, v.latency_ms)).collect(),
        }
    }

    /// How many hosts the table lists.
    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// The hosts, sorted by address.
    pub fn hosts(&self) -> impl ExactSizeIterator<Item = TableHost<'_>> + Clone {
        self.addresses
            .iter()
            .zip(self.zones.iter())
            .zip(&self.values)
            .map(|((address, zone), &(share, latency_ms))| TableHost {
                address,
                zone,
                share,
                latency_ms,
            })
    }

    /// The hosts' addresses, sorted: the list the pick table shares (`PickTable::over`).
    pub fn addresses(&self) -> &Rc<[Rc<str>]> {
        &self.addresses
    }

    /// The host at `index` in address order.
    pub fn host_at(&self, index: usize) -> Option<TableHost<'_>> {
        let (&(share, latency_ms), zone) = self.values.get(index).zip(self.zones.get(index))?;
        Some(TableHost {
            address: self.addresses.get(index)?,
            zone,
            share,
            latency_ms,
        })
    }

    pub fn host(&self, address: &str) -> Option<TableHost<'_>> {
        self.position(address).and_then(|i| self.host_at(i))
    }

    /// Where `address` is in the table's address order.
    pub fn position(&self, address: &str) -> Option<usize> {
        self.addresses.binary_search_by(|h| (**h).cmp(address)).ok()
    }

    /// Whether `newer` lacks a host this table lists (both are sorted by address). Hosts a table
    /// shares with the one it was adopted onto are the same `Rc`s, compared without reading the
    /// strings; a table over the same list lacks none.
    pub fn lost_hosts(&self, newer: &Table) -> bool {
        if Rc::ptr_eq(&self.addresses, &newer.addresses) {
            return false;
        }
        let mut newer = newer.addresses.iter().peekable();
        self.addresses.iter().any(|h| {
            while newer.next_if(|n| !same_name(n, h) && *n < h).is_some() {}
            newer.next_if(|n| same_name(n, h)).is_none()
        })
    }

    /// Whether both tables list the same hosts (both are sorted by address).
    pub fn same_hosts(&self, other: &Table) -> bool {
        Rc::ptr_eq(&self.addresses, &other.addresses)
            || (self.len() == other.len()
                && self
                    .addresses
                    .iter()
                    .zip(other.addresses.iter())
                    .all(|(x, y)| same_name(x, y)))
    }
}
