//! The manifest: the one object whose existence makes a checkpoint exist.
//!
//! JSON, so that `aws s3 cp … - | jq` answers questions at 3 a.m. Checksums are 8 lowercase hex
//! digits. [`Manifest::parse`] is the only way bytes become a `Manifest`: it bounds the input
//! size and every count, checks every name, and checks that the part checksums of a multipart
//! file combine to the file's checksum, so a reader can trust the numbers it indexes with.

use crate::checksum::combine_parts;
use crate::error::{CheckpointError, Result};
use crate::layout::{validate_attempt, validate_checkpoint_id, validate_relative_path};
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Value of the `format` field.
pub const FORMAT_NAME: &str = "shardstream-checkpoint";
/// The manifest version this crate writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// Largest manifest accepted, in bytes (about 1.5 million file records).
pub const MAX_MANIFEST_BYTES: usize = 256 << 20;
/// Most files one checkpoint may list.
pub const MAX_FILES: usize = 1_000_000;
/// Most parts one file may have (S3 allows 10,000, Azure 50,000 blocks).
pub const MAX_PARTS: usize = 100_000;
/// Largest file size accepted (1 PiB), which keeps offset arithmetic far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 50;

/// One uploaded file of a checkpoint, as a rank reports it and the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Path relative to the checkpoint directory, e.g. `attempt-…/__0_0.distcp`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC32C of the whole file.
    #[serde(with = "hex32")]
    pub crc32c: u32,
    /// Size of every part but the last, for a file uploaded in parts; 0 for a single PUT.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub part_size: u64,
    /// CRC32C of each part, in order; empty for a single PUT.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "hex32_vec")]
    pub parts: Vec<u32>,
    /// The rank that wrote the file, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

impl FileRecord {
    /// Byte range of part `index` (for a single-PUT file, part 0 is the whole file).
    pub fn part_range(&self, index: usize) -> Option<std::ops::Range<u64>> {
        if self.parts.is_empty() {
            return (index == 0).then_some(0..self.size);
        }
        let start = self.part_size.checked_mul(index as u64)?;
        if index >= self.parts.len() || start >= self.size {
            return None;
        }
        Some(start..self.size.min(start.saturating_add(self.part_size)))
    }

    /// Number of checksummed parts (1 for a single-PUT file).
    pub fn part_count(&self) -> usize {
        self.parts.len().max(1)
    }

    /// CRC32C of part `index` (the file's CRC for a single-PUT file).
    pub fn part_crc(&self, index: usize) -> Option<u32> {
        if self.parts.is_empty() {
            (index == 0).then_some(self.crc32c)
        } else {
            self.parts.get(index).copied()
        }
    }
}

/// A name at the checkpoint root that is a copy of an attempt file, published after the commit
/// (DCP's `.metadata`, so that torch's own `FileSystemReader` finds it where it looks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alias {
    /// Path relative to the checkpoint directory (one segment, e.g. `.metadata`).
    pub path: String,
    /// The [`FileRecord::path`] it is a copy of.
    pub target: String,
}

/// The committed description of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// Format version, [`FORMAT_VERSION`] when written by this crate.
    pub version: u32,
    /// The checkpoint id (the directory name under the root).
    pub checkpoint_id: String,
    /// The attempt directory holding the files.
    pub attempt: String,
    /// Training step, for ordering: given at commit or taken from the id's trailing digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Number of ranks that saved.
    pub world_size: u32,
    /// Commit time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The same time as RFC 3339, for people.
    #[serde(default)]
    pub created: String,
    /// Checksum algorithm of every `crc32c`/`parts` value: always `"crc32c"`.
    pub checksum: String,
    /// Every data file, with size and checksums.
    pub files: Vec<FileRecord>,
    /// Root-level copies published after commit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<Alias>,
    /// User metadata (free-form JSON object).
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

impl Manifest {
    /// Parses and validates manifest bytes. This is the fuzz target's entry point: it never
    /// panics and never allocates more than a small multiple of the input.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::parse_at(bytes, &Path::default())
    }

    /// [`Manifest::parse`], naming `path` in errors.
    pub fn parse_at(bytes: &[u8], path: &Path) -> Result<Self> {
        let err = |reason: String| CheckpointError::InvalidManifest {
            path: path.clone(),
            reason,
        };
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(err(format!(
                "{} bytes is larger than the {MAX_MANIFEST_BYTES}-byte limit",
                bytes.len()
            )));
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| err(e.to_string()))?;
        m.validate().map_err(err)?;
        Ok(m)
    }

    /// Serialises to pretty JSON (after validating, so a bad manifest is never written).
    pub fn to_json(&self) -> Result<Vec<u8>> {
        self.validate()
            .map_err(|reason| CheckpointError::InvalidManifest {
                path: Path::default(),
                reason,
            })?;
        serde_json::to_vec_pretty(self).map_err(|source| CheckpointError::Serialize {
            id: self.checkpoint_id.clone(),
            source,
        })
    }

    /// Total bytes of all files. [`Manifest::parse`] refuses a manifest whose total does not
    /// fit in a `u64`, so this saturates only for a manifest built by hand.
    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |acc, f| acc.saturating_add(f.size))
    }

    /// The record for a relative path.
    pub fn file(&self, path: &str) -> Option<&FileRecord> {
        self.files.iter().find(|f| f.path == path)
    }

    fn validate(&self) -> Result<(), String> {
        if self.format != FORMAT_NAME {
            return Err(format!("format is {:?}, not {FORMAT_NAME:?}", self.format));
        }
        if self.version == 0 || self.version > FORMAT_VERSION {
            return Err(format!(
                "version {} is not supported (this build reads up to {FORMAT_VERSION})",
                self.version
            ));
        }
        validate_checkpoint_id(&self.checkpoint_id).map_err(|e| e.to_string())?;
        validate_attempt(&self.attempt).map_err(|e| e.to_string())?;
        if self.world_size == 0 {
            return Err("world_size is 0".into());
        }
        if self.checksum != "crc32c" {
            return Err(format!("unknown checksum algorithm {:?}", self.checksum));
        }
        if self.files.len() > MAX_FILES {
            return Err(format!("{} files exceed {MAX_FILES}", self.files.len()));
        }
        let mut seen = HashSet::with_capacity(self.files.len());
        // Each size is bounded, but 16,385 files of 1 PiB already overflow a u64: a total that
        // wraps would make `ls` and gc report nonsense, so such a manifest is refused.
        let mut total = 0u64;
        for f in &self.files {
            validate_file(f, self.world_size)?;
            total = total.checked_add(f.size).ok_or_else(|| {
                format!(
                    "the file sizes add up to more than {} bytes (at {:?}, {} bytes)",
                    u64::MAX,
                    f.path,
                    f.size
                )
            })?;
            if !seen.insert(f.path.as_str()) {
                return Err(format!("file {:?} is listed twice", f.path));
            }
        }
        let mut alias_seen = HashSet::new();
        for a in &self.aliases {
            validate_relative_path(&a.path).map_err(|e| e.to_string())?;
            if a.path.contains('/') {
                return Err(format!("alias {:?} is not at the checkpoint root", a.path));
            }
            if a.path.starts_with(crate::layout::ATTEMPT_PREFIX) {
                return Err(format!(
                    "alias {:?} looks like an attempt directory",
                    a.path
                ));
            }
            if seen.contains(a.path.as_str()) || !alias_seen.insert(a.path.as_str()) {
                return Err(format!("alias {:?} collides with another name", a.path));
            }
            if !seen.contains(a.target.as_str()) {
                return Err(format!(
                    "alias {:?} targets unknown file {:?}",
                    a.path, a.target
                ));
            }
        }
        Ok(())
    }
}

fn validate_file(f: &FileRecord, world_size: u32) -> Result<(), String> {
    validate_relative_path(&f.path).map_err(|e| e.to_string())?;
    if f.size > MAX_FILE_SIZE {
        return Err(format!("{:?}: size {} is too large", f.path, f.size));
    }
    if let Some(r) = f.rank {
        if r >= world_size {
            return Err(format!("{:?}: rank {r} >= world_size {world_size}", f.path));
        }
    }
    if f.parts.is_empty() {
        if f.part_size != 0 {
            return Err(format!("{:?}: part_size without parts", f.path));
        }
        return Ok(());
    }
    if f.parts.len() > MAX_PARTS {
        return Err(format!("{:?}: more than {MAX_PARTS} parts", f.path));
    }
    if f.part_size == 0 {
        return Err(format!("{:?}: parts without a part_size", f.path));
    }
    let expected = f.size.div_ceil(f.part_size);
    if expected != f.parts.len() as u64 {
        return Err(format!(
            "{:?}: {} parts listed, {} bytes at {} per part need {expected}",
            f.path,
            f.parts.len(),
            f.size,
            f.part_size
        ));
    }
    let combined = combine_parts((0..f.parts.len()).filter_map(|i| {
        let r = f.part_range(i)?;
        Some((f.parts.get(i).copied()?, r.end - r.start))
    }));
    if combined != f.crc32c {
        return Err(format!(
            "{:?}: part checksums combine to {combined:08x}, the file says {:08x}",
            f.path, f.crc32c
        ));
    }
    Ok(())
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn parse_hex32(s: &str) -> Option<u32> {
    if s.len() != 8 {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

mod hex32 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:08x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        super::parse_hex32(&s).ok_or_else(|| D::Error::custom("expected 8 hex digits"))
    }
}

mod hex32_vec {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u32], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|x| format!("{x:08x}")))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
        let v = <Vec<std::borrow::Cow<'de, str>>>::deserialize(d)?;
        v.iter()
            .map(|s| super::parse_hex32(s).ok_or_else(|| D::Error::custom("expected 8 hex digits")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::crc32c;

    pub(crate) fn sample() -> Manifest {
        let data = vec![7u8; 25];
        let parts: Vec<u32> = data.chunks(10).map(crc32c).collect();
        Manifest {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            checkpoint_id: "step_10".into(),
            attempt: "attempt-0000000000001-00000000000000ab".into(),
            step: Some(10),
            world_size: 2,
            created_unix_ms: 1,
            created: String::new(),
            checksum: "crc32c".into(),
            files: vec![
                FileRecord {
                    path: "attempt-0000000000001-00000000000000ab/__0_0.distcp".into(),
                    size: 25,
                    crc32c: crc32c(&data),
                    part_size: 10,
                    parts,
                    rank: Some(0),
                },
                FileRecord {
                    path: "attempt-0000000000001-00000000000000ab/.metadata".into(),
                    size: 3,
                    crc32c: crc32c(b"abc"),
                    part_size: 0,
                    parts: vec![],
                    rank: Some(0),
                },
            ],
            aliases: vec![Alias {
                path: ".metadata".into(),
                target: "attempt-0000000000001-00000000000000ab/.metadata".into(),
            }],
            metadata: serde_json::Map::new(),
        }
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let json = m.to_json().unwrap();
        assert_eq!(Manifest::parse(&json).unwrap(), m);
        let text = String::from_utf8(json).unwrap();
        assert!(text.contains(&format!("\"{:08x}\"", crc32c(b"abc"))));
    }

    fn rejects(edit: impl FnOnce(&mut Manifest), needle: &str) {
        let mut m = sample();
        edit(&mut m);
        let json = serde_json::to_vec(&m).unwrap();
        let e = Manifest::parse(&json).unwrap_err().to_string();
        assert!(e.contains(needle), "{e} should mention {needle}");
    }

    #[test]
    fn rejects_inconsistent_manifests() {
        rejects(|m| m.version = 2, "version 2");
        rejects(|m| m.format = "dcp".into(), "format");
        rejects(|m| m.world_size = 0, "world_size");
        rejects(|m| m.files[0].parts.truncate(2), "parts listed");
        rejects(|m| m.files[0].parts[1] ^= 1, "combine");
        rejects(|m| m.files[0].part_size = 0, "without a part_size");
        rejects(|m| m.files[1].path = "../x".into(), "'..'");
        rejects(|m| m.files[1].path = m.files[0].path.clone(), "twice");
        rejects(|m| m.files[0].rank = Some(2), "rank 2");
        rejects(|m| m.aliases[0].target = "nope".into(), "unknown file");
        rejects(
            |m| m.aliases[0].path = "a/b".into(),
            "not at the checkpoint root",
        );
        rejects(|m| m.files[0].size = MAX_FILE_SIZE + 1, "too large");
    }

    /// A manifest of `n` single-PUT files of `size` bytes each.
    pub(crate) fn with_files(n: usize, size: u64) -> Manifest {
        let mut m = sample();
        m.aliases.clear();
        m.files = (0..n)
            .map(|i| FileRecord {
                path: format!("{}/f{i}", m.attempt),
                size,
                crc32c: 0,
                part_size: 0,
                parts: vec![],
                rank: None,
            })
            .collect();
        m
    }

    /// Issue 40, row 10: 16,385 files of 2^50 bytes add up to 2^64 + 2^50; the total wrapped
    /// (release) or panicked (debug) in `ls`.
    #[test]
    fn byte_total_that_overflows_u64_is_refused() {
        let ok = with_files(16_383, MAX_FILE_SIZE);
        let parsed = Manifest::parse(&serde_json::to_vec(&ok).unwrap()).unwrap();
        assert_eq!(parsed.total_bytes(), 16_383 * MAX_FILE_SIZE);

        let hostile = with_files(16_385, MAX_FILE_SIZE);
        let e = Manifest::parse(&serde_json::to_vec(&hostile).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("add up to more than"), "{e}");
        assert!(e.contains("1125899906842624"), "{e}");
        // Built by hand (never parsed), the total saturates instead of wrapping.
        assert_eq!(hostile.total_bytes(), u64::MAX);
    }

    #[test]
    fn rejects_bad_hex_and_oversize() {
        let json = String::from_utf8(sample().to_json().unwrap()).unwrap();
        let bad = json.replacen(&format!("{:08x}", crc32c(b"abc")), "xyz", 1);
        assert!(Manifest::parse(bad.as_bytes()).is_err());
        assert!(Manifest::parse(&vec![b' '; MAX_MANIFEST_BYTES + 1]).is_err());
        assert!(Manifest::parse(b"").is_err());
        assert!(Manifest::parse(b"{}").is_err());
    }

    #[test]
    fn part_ranges() {
        let m = sample();
        let f = &m.files[0];
        assert_eq!(f.part_range(0), Some(0..10));
        assert_eq!(f.part_range(2), Some(20..25));
        assert_eq!(f.part_range(3), None);
        assert_eq!(m.files[1].part_range(0), Some(0..3));
        assert_eq!(m.files[1].part_count(), 1);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = Manifest::parse(&bytes);
        }

        #[test]
        fn parse_survives_mutations(pos in 0usize..4096, byte in proptest::num::u8::ANY) {
            let mut json = sample().to_json().unwrap();
            let i = pos % json.len();
            json[i] = byte;
            if let Ok(m) = Manifest::parse(&json) {
                // Whatever still parses is internally consistent.
                for f in &m.files {
                    for p in 0..f.part_count() {
                        proptest::prop_assert!(f.part_range(p).is_some() || f.size == 0);
                    }
                }
            }
        }
    }
}
