//! The stable hash that names folders after what they hold (a dataset's paths or URLs): the
//! same input gives the same name in every process, build and machine. Not a security property.

/// A stable 64-bit name for `bytes` (FNV-1a; names folders, not a security property). Chain
/// calls with [`stable_hash_from`] to hash several parts.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    stable_hash_from(STABLE_HASH_START, bytes)
}

/// FNV-1a's starting state, for [`stable_hash_from`].
pub const STABLE_HASH_START: u64 = 0xcbf2_9ce4_8422_2325;

/// [`stable_hash`] of `bytes` continued from the state `h` (the hash of the bytes before them).
pub fn stable_hash_from(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_names_inputs_apart() {
        assert_eq!(stable_hash(b"/data/a"), stable_hash(b"/data/a"));
        assert_ne!(stable_hash(b"/data/a"), stable_hash(b"/data/b"));
        assert_eq!(
            stable_hash_from(stable_hash(b"ab"), b"c"),
            stable_hash(b"abc")
        );
    }
}
