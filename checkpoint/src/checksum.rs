//! CRC32C (Castagnoli), the one checksum of the format.
//!
//! Why CRC32C rather than xxh3-128: it runs at memory speed with SSE4.2/PCLMULQDQ or the ARMv8
//! CRC instructions (`crc-fast` picks the kernel at run time), it *combines*, so per-part
//! checksums computed in parallel fold into the whole-object checksum without a second pass (and
//! a manifest can be checked for internal consistency), and it is the checksum S3 (`x-amz-checksum-crc32c`),
//! GCS (`crc32c`) and Azure's storage offer natively, so a later version can let the server check
//! the same value end to end. 32 bits detect random corruption (every burst up to 32 bits, other
//! errors with probability 1 - 2^-32 per part); they are not a defence against a malicious writer,
//! which has write access to the bucket anyway.

use crc_fast::CrcAlgorithm;

const ALGO: CrcAlgorithm = CrcAlgorithm::Crc32Iscsi;

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    narrow(crc_fast::checksum(ALGO, data))
}

/// The CRC32C of `a ++ b` from the CRC32C of `a`, the CRC32C of `b` and the length of `b`.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    narrow(crc_fast::checksum_combine(
        ALGO,
        u64::from(crc_a),
        u64::from(crc_b),
        len_b,
    ))
}

/// The CRC32C of an object from its parts' CRC32Cs and sizes, in order.
pub fn combine_parts(parts: impl IntoIterator<Item = (u32, u64)>) -> u32 {
    let mut acc: Option<u32> = None;
    for (crc, len) in parts {
        acc = Some(match acc {
            None => crc,
            Some(prev) => crc32c_combine(prev, crc, len),
        });
    }
    acc.unwrap_or_else(|| crc32c(&[]))
}

/// Incremental CRC32C over data that arrives in pieces.
#[derive(Clone)]
pub struct Crc32c {
    digest: crc_fast::Digest,
}

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:08x})", self.value())
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    /// A fresh checksum (of zero bytes).
    pub fn new() -> Self {
        Self {
            digest: crc_fast::Digest::new(ALGO),
        }
    }

    /// Feeds more bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.digest.update(data);
    }

    /// The checksum of everything fed so far.
    pub fn value(&self) -> u32 {
        narrow(self.digest.finalize())
    }
}

/// CRC-32 results live in the low 32 bits of crc-fast's u64.
fn narrow(v: u64) -> u32 {
    (v & 0xffff_ffff) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // The CRC-32C check value (RFC 3720 / the Rocksoft catalogue).
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn combine_equals_whole() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let (a, b) = data.split_at(4321);
        assert_eq!(
            crc32c_combine(crc32c(a), crc32c(b), b.len() as u64),
            crc32c(&data)
        );
        let parts = data.chunks(1000).map(|c| (crc32c(c), c.len() as u64));
        assert_eq!(combine_parts(parts), crc32c(&data));
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data = vec![0xa5u8; 100_003];
        let mut c = Crc32c::new();
        for chunk in data.chunks(777) {
            c.update(chunk);
        }
        assert_eq!(c.value(), crc32c(&data));
    }
}
