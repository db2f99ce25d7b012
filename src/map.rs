//! One map type for the whole plugin.
//!
//! Every distinct map instantiation costs module size, and B-trees cost the most: with the
//! plugin's seven maps as `BTreeMap`s the module was 32 KB larger than with hash maps
//! (bench/README.md, "Module size"). The hasher is FNV-1a (`crate::hash`), unkeyed, so iteration
//! order depends only on what the map holds: runs over the same inputs (the fleet simulator, the
//! tests) are reproducible. Keys are cluster names and host addresses from Envoy, never a client's
//! bytes, so an unkeyed hash exposes nothing to hash flooding.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

pub type Map<K, V> = HashMap<K, V, BuildHasherDefault<crate::hash::Fnv>>;
pub type Set<K> = HashSet<K, BuildHasherDefault<crate::hash::Fnv>>;
