//! FNV-1a: the plugin's hash where a value must come out the same in every VM, build and run
//! (the configuration's fingerprint, a host's place in the subset, a table's list of hosts).
//! Never fed a client's bytes.

/// Where every hash starts.
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// What each step multiplies by.
pub(crate) const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a of `bytes`, going on from `h` (start from [`FNV_OFFSET`]).
pub(crate) fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// [`fnv1a`] as a `Hasher`, for the plugin's maps (`crate::map`): their keys are short (host
/// addresses, cluster names), and SipHash's rounds were 2 % of the fleet simulator's time.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(FNV_OFFSET)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = fnv1a(self.0, bytes);
    }
}
