//! proxy-wasm shared data in memory: one per simulated Envoy process, shared by its workers.

use std::collections::HashMap;

use ewma_lb::record::sync::{SharedStore, StoreError};

/// Values with a version per key, bumped on every write, as Envoy keeps them. Envoy ignores the
/// version a write carries for a key that does not exist yet; so does this store.
#[derive(Default)]
pub struct MemoryStore {
    data: HashMap<String, (Vec<u8>, u32)>,
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        Ok(match self.data.get(key) {
            Some((bytes, version)) => (Some(bytes.clone()), Some(*version)),
            None => (None, None),
        })
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let current = self.data.get(key).map(|(_, v)| *v);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_and_swap_as_envoy_does_it() {
        let mut s = MemoryStore::default();
        assert_eq!(s.get("k").unwrap(), (None, None));
        s.set("k", b"a", Some(u32::MAX)).unwrap();
        let (v, cas) = s.get("k").unwrap();
        assert_eq!((v.as_deref(), cas), (Some(&b"a"[..]), Some(1)));
        assert_eq!(s.set("k", b"b", Some(7)), Err(StoreError::CasMismatch));
        s.set("k", b"b", cas).unwrap();
        assert_eq!(s.get("k").unwrap().1, Some(2));
    }
}
