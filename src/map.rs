//! One map type for the whole plugin.
//!
//! Every distinct map instantiation costs module size, and B-trees cost the most: with the
//! plugin's seven maps as `BTreeMap`s the module was 32 KB larger than with hash maps
//! (bench/README.md, "Module size"). The hasher is std's SipHash with fixed keys, so iteration
//! order depends only on what the map holds: runs over the same inputs (the fleet simulator, the
//! tests) are reproducible. Keys are cluster names and host addresses from Envoy, never a client's
//! bytes, so fixed keys expose nothing to hash flooding.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

pub type Map<K, V> = HashMap<K, V, BuildHasherDefault<DefaultHasher>>;
pub type Set<K> = HashSet<K, BuildHasherDefault<DefaultHasher>>;
