//! Host names as a VM holds them: one `Rc<str>` per address, shared by its tables, pick table
//! and probe schedule, so that walking two lists of a cluster's hosts side by side (a new table
//! against the one in force) compares pointers, not strings.

use std::rc::Rc;

/// Whether two shared names are equal: the same allocation without reading either, else by
/// their bytes. `==` on `Rc<str>` always compares the bytes (std looks for one allocation first
/// only for sized types): at 10,000 hosts, a `memcmp` a host, twice, on every adoption of a
/// table (bench/README.md, "Shared state at 10,000 endpoints").
pub fn same(a: &Rc<str>, b: &Rc<str>) -> bool {
    Rc::ptr_eq(a, b) || a == b
}
