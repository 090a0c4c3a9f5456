//! The hash algorithms an MDS index can record, with the hex digests mosaicml-streaming writes
//! (`base/hashing.py`: every `hashlib` constructor except `shake_*`, plus every `xxhash` one).
//!
//! Digests are `hexdigest()` strings: lowercase hex of the digest bytes; for xxhash that is the
//! canonical big-endian form (`format(intdigest, '016x')` for 64-bit). `xxh128` is xxhash's alias
//! of `xxh3_128`.
//!
//! ```
//! use shardstream_sharding::hashing::{hash_hex, HashAlgorithm};
//! assert_eq!(hash_hex(HashAlgorithm::Xxh64, b"abc"), "44bc2cf5ad770999");
//! let algs = HashAlgorithm::parse_list(&["sha1", "xxh64"]).unwrap();
//! assert_eq!(algs, vec![HashAlgorithm::Sha1, HashAlgorithm::Xxh64]);
//! ```

use std::fmt;

use sha2::Digest;

use crate::error::{FormatError, Result};

/// One hash algorithm, named as Mosaic names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashAlgorithm {
    /// `blake2b` (64-byte digest).
    Blake2b,
    /// `blake2s` (32-byte digest).
    Blake2s,
    /// `md5`
    Md5,
    /// `sha1`
    Sha1,
    /// `sha224`
    Sha224,
    /// `sha256`
    Sha256,
    /// `sha384`
    Sha384,
    /// `sha3_224`
    Sha3_224,
    /// `sha3_256`
    Sha3_256,
    /// `sha3_384`
    Sha3_384,
    /// `sha3_512`
    Sha3_512,
    /// `sha512`
    Sha512,
    /// `xxh128` (same digest as `xxh3_128`).
    Xxh128,
    /// `xxh32`
    Xxh32,
    /// `xxh3_128`
    Xxh3_128,
    /// `xxh3_64`
    Xxh3_64,
    /// `xxh64`
    Xxh64,
}

impl HashAlgorithm {
    /// Every algorithm, sorted by name.
    pub const ALL: [HashAlgorithm; 17] = [
        HashAlgorithm::Blake2b,
        HashAlgorithm::Blake2s,
        HashAlgorithm::Md5,
        HashAlgorithm::Sha1,
        HashAlgorithm::Sha224,
        HashAlgorithm::Sha256,
        HashAlgorithm::Sha384,
        HashAlgorithm::Sha3_224,
        HashAlgorithm::Sha3_256,
        HashAlgorithm::Sha3_384,
        HashAlgorithm::Sha3_512,
        HashAlgorithm::Sha512,
        HashAlgorithm::Xxh128,
        HashAlgorithm::Xxh32,
        HashAlgorithm::Xxh3_128,
        HashAlgorithm::Xxh3_64,
        HashAlgorithm::Xxh64,
    ];

    /// Mosaic's name (`sha1`, `xxh3_64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Blake2b => "blake2b",
            HashAlgorithm::Blake2s => "blake2s",
            HashAlgorithm::Md5 => "md5",
            HashAlgorithm::Sha1 => "sha1",
            HashAlgorithm::Sha224 => "sha224",
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Sha384 => "sha384",
            HashAlgorithm::Sha3_224 => "sha3_224",
            HashAlgorithm::Sha3_256 => "sha3_256",
            HashAlgorithm::Sha3_384 => "sha3_384",
            HashAlgorithm::Sha3_512 => "sha3_512",
            HashAlgorithm::Sha512 => "sha512",
            HashAlgorithm::Xxh128 => "xxh128",
            HashAlgorithm::Xxh32 => "xxh32",
            HashAlgorithm::Xxh3_128 => "xxh3_128",
            HashAlgorithm::Xxh3_64 => "xxh3_64",
            HashAlgorithm::Xxh64 => "xxh64",
        }
    }

    /// Parses a name; unknown names are [`FormatError::Unknown`].
    pub fn parse(name: &str) -> Result<HashAlgorithm> {
        HashAlgorithm::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| FormatError::Unknown {
                kind: "hash",
                name: name.to_string(),
            })
    }

    /// Parses a writer's hash list, which Mosaic requires to be sorted (by name) and which we also
    /// require to be free of duplicates.
    pub fn parse_list<S: AsRef<str>>(names: &[S]) -> Result<Vec<HashAlgorithm>> {
        let mut out = Vec::with_capacity(names.len());
        for pair in names.windows(2) {
            if pair[0].as_ref() >= pair[1].as_ref() {
                return Err(FormatError::InvalidArgument(format!(
                    "hashes must be unique and in sorted order, got {:?} before {:?}",
                    pair[0].as_ref(),
                    pair[1].as_ref()
                )));
            }
        }
        for name in names {
            out.push(HashAlgorithm::parse(name.as_ref())?);
        }
        Ok(out)
    }

    /// A streaming hasher for this algorithm.
    pub fn hasher(self) -> Hasher {
        let state = match self {
            HashAlgorithm::Blake2b => State::Blake2b(Box::default()),
            HashAlgorithm::Blake2s => State::Blake2s(Box::default()),
            HashAlgorithm::Md5 => State::Md5(Box::default()),
            HashAlgorithm::Sha1 => State::Sha1(Box::default()),
            HashAlgorithm::Sha224 => State::Sha224(Box::default()),
            HashAlgorithm::Sha256 => State::Sha256(Box::default()),
            HashAlgorithm::Sha384 => State::Sha384(Box::default()),
            HashAlgorithm::Sha512 => State::Sha512(Box::default()),
            HashAlgorithm::Sha3_224 => State::Sha3_224(Box::default()),
            HashAlgorithm::Sha3_256 => State::Sha3_256(Box::default()),
            HashAlgorithm::Sha3_384 => State::Sha3_384(Box::default()),
            HashAlgorithm::Sha3_512 => State::Sha3_512(Box::default()),
            HashAlgorithm::Xxh32 => State::Xxh32(xxhash_rust::xxh32::Xxh32::new(0)),
            HashAlgorithm::Xxh64 => State::Xxh64(xxhash_rust::xxh64::Xxh64::new(0)),
            HashAlgorithm::Xxh3_64 => State::Xxh3_64(Box::default()),
            HashAlgorithm::Xxh3_128 | HashAlgorithm::Xxh128 => State::Xxh3_128(Box::default()),
        };
        Hasher(state)
    }
}

impl fmt::Display for HashAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for HashAlgorithm {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self> {
        HashAlgorithm::parse(s)
    }
}

enum State {
    Blake2b(Box<blake2::Blake2b512>),
    Blake2s(Box<blake2::Blake2s256>),
    Md5(Box<md5::Md5>),
    Sha1(Box<sha1::Sha1>),
    Sha224(Box<sha2::Sha224>),
    Sha256(Box<sha2::Sha256>),
    Sha384(Box<sha2::Sha384>),
    Sha512(Box<sha2::Sha512>),
    Sha3_224(Box<sha3::Sha3_224>),
    Sha3_256(Box<sha3::Sha3_256>),
    Sha3_384(Box<sha3::Sha3_384>),
    Sha3_512(Box<sha3::Sha3_512>),
    Xxh32(xxhash_rust::xxh32::Xxh32),
    Xxh64(xxhash_rust::xxh64::Xxh64),
    Xxh3_64(Box<xxhash_rust::xxh3::Xxh3>),
    Xxh3_128(Box<xxhash_rust::xxh3::Xxh3>),
}

/// An incremental hasher (for files too large to hold in memory at once).
pub struct Hasher(State);

impl Hasher {
    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            State::Blake2b(h) => h.update(data),
            State::Blake2s(h) => h.update(data),
            State::Md5(h) => h.update(data),
            State::Sha1(h) => h.update(data),
            State::Sha224(h) => h.update(data),
            State::Sha256(h) => h.update(data),
            State::Sha384(h) => h.update(data),
            State::Sha512(h) => h.update(data),
            State::Sha3_224(h) => h.update(data),
            State::Sha3_256(h) => h.update(data),
            State::Sha3_384(h) => h.update(data),
            State::Sha3_512(h) => h.update(data),
            State::Xxh32(h) => h.update(data),
            State::Xxh64(h) => h.update(data),
            State::Xxh3_64(h) | State::Xxh3_128(h) => h.update(data),
        }
    }

    /// The hex digest, as Python's `hexdigest()` prints it.
    pub fn finish_hex(self) -> String {
        match self.0 {
            State::Blake2b(h) => hex::encode((*h).finalize()),
            State::Blake2s(h) => hex::encode((*h).finalize()),
            State::Md5(h) => hex::encode((*h).finalize()),
            State::Sha1(h) => hex::encode((*h).finalize()),
            State::Sha224(h) => hex::encode((*h).finalize()),
            State::Sha256(h) => hex::encode((*h).finalize()),
            State::Sha384(h) => hex::encode((*h).finalize()),
            State::Sha512(h) => hex::encode((*h).finalize()),
            State::Sha3_224(h) => hex::encode((*h).finalize()),
            State::Sha3_256(h) => hex::encode((*h).finalize()),
            State::Sha3_384(h) => hex::encode((*h).finalize()),
            State::Sha3_512(h) => hex::encode((*h).finalize()),
            State::Xxh32(h) => format!("{:08x}", h.digest()),
            State::Xxh64(h) => format!("{:016x}", h.digest()),
            State::Xxh3_64(h) => format!("{:016x}", h.digest()),
            State::Xxh3_128(h) => format!("{:032x}", h.digest128()),
        }
    }
}

/// The hex digest of `data` under `algorithm`, equal to Mosaic's `get_hash(algo, data)`.
pub fn hash_hex(algorithm: HashAlgorithm, data: &[u8]) -> String {
    match algorithm {
        // One-shot xxhash is faster than the streaming state for whole buffers.
        HashAlgorithm::Xxh64 => format!("{:016x}", xxhash_rust::xxh64::xxh64(data, 0)),
        HashAlgorithm::Xxh32 => format!("{:08x}", xxhash_rust::xxh32::xxh32(data, 0)),
        HashAlgorithm::Xxh3_64 => format!("{:016x}", xxhash_rust::xxh3::xxh3_64(data)),
        HashAlgorithm::Xxh3_128 | HashAlgorithm::Xxh128 => {
            format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data))
        }
        _ => {
            let mut h = algorithm.hasher();
            h.update(data);
            h.finish_hex()
        }
    }
}

/// Checks `data` (the bytes of `path`) against an expected hex digest, case-insensitively.
pub fn verify_hash(
    path: &str,
    algorithm: HashAlgorithm,
    data: &[u8],
    expected: &str,
) -> Result<()> {
    let actual = hash_hex(algorithm, data);
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(FormatError::HashMismatch {
            path: path.to_string(),
            algorithm: algorithm.name().to_string(),
            expected: expected.to_string(),
            actual,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digests of b"abc" printed by mosaicml-streaming's `get_hash` (Python 3.11, xxhash 3).
    const ABC: [(&str, &str); 17] = [
        ("blake2b", "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923"),
        ("blake2s", "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982"),
        ("md5", "900150983cd24fb0d6963f7d28e17f72"),
        ("sha1", "a9993e364706816aba3e25717850c26c9cd0d89d"),
        ("sha224", "23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7"),
        ("sha256", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("sha384", "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed8086072ba1e7cc2358baeca134c825a7"),
        ("sha3_224", "e642824c3f8cf24ad09234ee7d3c766fc9a3a5168d0c94ad73b46fdf"),
        ("sha3_256", "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532"),
        ("sha3_384", "ec01498288516fc926459f58e2c6ad8df9b473cb0fc08c2596da7cf0e49be4b298d88cea927ac7f539f1edf228376d25"),
        ("sha3_512", "b751850b1a57168a5693cd924b6b096e08f621827444f70d884f5d0240d2712e10e116e9192af3c91a7ec57647e3934057340b4cf408d5a56592f8274eec53f0"),
        ("sha512", "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"),
        ("xxh128", "06b05ab6733a618578af5f94892f3950"),
        ("xxh32", "32d153ff"),
        ("xxh3_128", "06b05ab6733a618578af5f94892f3950"),
        ("xxh3_64", "78af5f94892f3950"),
        ("xxh64", "44bc2cf5ad770999"),
    ];

    #[test]
    fn digests_match_python() {
        for (name, want) in ABC {
            let alg = HashAlgorithm::parse(name).unwrap();
            assert_eq!(hash_hex(alg, b"abc"), want, "{name}");
            let mut h = alg.hasher();
            h.update(b"a");
            h.update(b"bc");
            assert_eq!(h.finish_hex(), want, "{name} streaming");
        }
    }

    #[test]
    fn names_are_sorted_and_round_trip() {
        let names: Vec<&str> = HashAlgorithm::ALL.iter().map(|a| a.name()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert_eq!(
            HashAlgorithm::parse_list(&names).unwrap(),
            HashAlgorithm::ALL
        );
    }

    #[test]
    fn hash_lists_must_be_sorted_unique_and_known() {
        assert!(HashAlgorithm::parse_list(&["xxh64", "sha1"]).is_err());
        assert!(HashAlgorithm::parse_list(&["sha1", "sha1"]).is_err());
        assert!(HashAlgorithm::parse_list(&["crc32"]).is_err());
        assert!(HashAlgorithm::parse_list::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn verify_reports_both_digests() {
        let err =
            verify_hash("f.mds", HashAlgorithm::Xxh64, b"abd", "44bc2cf5ad770999").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("f.mds") && text.contains("44bc2cf5ad770999"),
            "{text}"
        );
        verify_hash("f.mds", HashAlgorithm::Xxh64, b"abc", "44BC2CF5AD770999").unwrap();
    }
}
