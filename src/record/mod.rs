//! A cluster's shared record: what it holds (`state`), what VMs adopt of it (`table`), how a host's batches are taken in
//! (`persistence`), and the shared-data protocol that folds every VM's batches into it (`sync`).

pub(crate) mod persistence;
pub mod state;
pub mod sync;
pub mod table;
