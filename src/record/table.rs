//! The table: what a VM needs of a cluster's record to pick, published beside the record by
//! the VM that refreshed it. The record holds a host's whole smoothing state, which only the
//! refreshing VM uses; every other VM adopting a new table reads this instead: a third of the
//! bytes, and no state it would throw away.
//!
//! It is written and read through a borrowed view ([`TableView`]): the refresher encodes it
//! straight from the record, and a VM reading it keeps the names it already holds
//! ([`Table::adopt`]), so adopting a table of unchanged hosts allocates no name.

use std::cmp::Ordering;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::record::state::ClusterState;

/// A table as stored in shared data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TableView<'a> {
    /// The record's `table_version` this table is.
    pub table_version: u64,
    /// The cluster's endpoint count as Envoy last reported it; 0 before any report.
    pub num_endpoints: u32,
    /// Endpoints the table does not know (`ClusterState::unknown_endpoints`).
    pub unknown_endpoints: u32,
    /// The weights cannot tell the hosts apart (`ClusterState::hosts_indistinguishable`).
    pub hosts_indistinguishable: bool,
    /// Sorted by address, as in the record.
    #[serde(borrow)]
    pub hosts: Vec<HostView<'a>>,
}

/// One host of a [`TableView`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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

/// One version of a cluster's weight table, as a VM holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub table_version: u64,
    pub num_endpoints: u32,
    pub unknown_endpoints: u32,
    pub hosts_indistinguishable: bool,
    /// Sorted by address.
    pub hosts: Vec<TableHost>,
}

/// One host of a [`Table`].
#[derive(Clone, Debug, PartialEq)]
pub struct TableHost {
    pub address: Rc<str>,
    pub zone: Rc<str>,
    pub share: f64,
    pub latency_ms: Option<f64>,
}

impl Table {
    /// `view`, taking the names `previous` holds where they are the same.
    pub fn adopt(view: &TableView, previous: &Table) -> Table {
        // Both are sorted by address: one walk finds every host already held.
        let mut held = previous.hosts.iter().peekable();
        // Hosts share few zones: a new name takes the zone of the host before it when equal.
        let mut last_zone: Rc<str> = Rc::from("");
        let hosts = view
            .hosts
            .iter()
            .map(|h| {
                // One comparison a host: most are held, and equal names compare in full.
                let mut same = None;
                while let Some(p) = held.peek() {
                    match (*p.address).cmp(h.address) {
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
                    Some(p) => Rc::clone(&p.address),
                    None => Rc::from(h.address),
                };
                let zone = match same {
                    Some(p) if &*p.zone == h.zone => Rc::clone(&p.zone),
                    _ if &*last_zone == h.zone => Rc::clone(&last_zone),
                    _ => Rc::from(h.zone),
                };
                last_zone = Rc::clone(&zone);
                TableHost {
                    address,
                    zone,
                    share: h.share,
                    latency_ms: h.latency_ms,
                }
            })
            .collect();
        Table {
            table_version: view.table_version,
            num_endpoints: view.num_endpoints,
            unknown_endpoints: view.unknown_endpoints,
            hosts_indistinguishable: view.hosts_indistinguishable,
            hosts,
        }
    }

    pub fn host(&self, address: &str) -> Option<&TableHost> {
        self.hosts
            .binary_search_by(|h| (*h.address).cmp(address))
            .ok()
            .and_then(|i| self.hosts.get(i))
    }

    /// Whether both tables list the same hosts (both are sorted by address).
    pub fn same_hosts(&self, other: &Table) -> bool {
        self.hosts.len() == other.hosts.len()
            && self
                .hosts
                .iter()
                .zip(&other.hosts)
                .all(|(x, y)| x.address == y.address)
    }
}
