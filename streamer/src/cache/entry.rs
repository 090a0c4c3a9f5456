//! The cache's per-shard record and the checks a cached file passes before it is served.
//!
//! A record (`entries/<id>.json`) is written, fsynced and renamed into place before the data
//! file is renamed into `data/`, and removed only after the data file is gone. So a data file
//! with a record is always one this cache downloaded, and a data file without one is not ours
//! and is never deleted.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shardstream_sharding::hashing::HashAlgorithm;

use super::config::{ExpectedHash, ShardSpec, VerifyMode};
use super::error::{io_err, Result};
use super::layout::{write_atomically, KeyId, Layout};
use super::metrics::CacheMetrics;

/// What the cache knows about one shard it downloaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) key: String,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) hash: Option<RecordHash>,
    /// The cache generation in which `hash` was last checked against the bytes.
    pub(crate) verified_generation: u64,
}

/// A digest the bytes were checked against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordHash {
    pub(crate) algorithm: String,
    pub(crate) hex: String,
}

impl RecordHash {
    fn from_expected(e: &ExpectedHash) -> RecordHash {
        RecordHash {
            algorithm: e.algorithm.name().to_string(),
            hex: e.hex.to_ascii_lowercase(),
        }
    }

    fn matches(&self, e: &ExpectedHash) -> bool {
        self.algorithm == e.algorithm.name() && self.hex.eq_ignore_ascii_case(&e.hex)
    }
}

impl Record {
    pub(crate) fn new(spec: &ShardSpec, generation: u64) -> Record {
        Record {
            key: spec.key.clone(),
            size: spec.size,
            hash: spec.hash.as_ref().map(RecordHash::from_expected),
            verified_generation: generation,
        }
    }
}

/// A record file as found on disk.
pub(crate) enum RecordState {
    Absent,
    /// Present but not a record we can read (a torn write cannot happen, so this is damage).
    Unreadable,
    Present(Record),
}

pub(crate) fn read_record(path: &Path) -> Result<RecordState> {
    match fs::read(path) {
        Ok(bytes) => Ok(match serde_json::from_slice(&bytes) {
            Ok(r) => RecordState::Present(r),
            Err(_) => RecordState::Unreadable,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(RecordState::Absent),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Writes a record; the caller holds the shard's fetch lock, which makes the fixed temp name safe.
pub(crate) fn write_record(layout: &Layout, id: &KeyId, record: &Record) -> Result<()> {
    let path = layout.record(id);
    let bytes = serde_json::to_vec(record).map_err(|e| io_err("encode", &path)(e.into()))?;
    write_atomically(&path, &layout.record_tmp(id), &bytes)
}

/// The hex digest of a file's bytes.
pub(crate) fn hash_file(path: &Path, algorithm: HashAlgorithm) -> Result<String> {
    let mut f = File::open(path).map_err(io_err("open", path))?;
    let mut hasher = algorithm.hasher();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("read", path)(e)),
        };
        hasher.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hasher.finish_hex())
}

/// The outcome of looking at a cached shard.
#[derive(Debug)]
pub(crate) enum Found {
    /// Complete and checked: serve it.
    Valid,
    /// No data file.
    Missing,
    /// The data or its record is wrong; delete both and fetch again.
    Invalid(String),
    /// The hash must be checked, which happens under the fetch lock so that the node hashes
    /// each file once per generation.
    NeedsHash,
    /// A data file without a record: not ours.
    Foreign(PathBuf),
}

/// What [`inspect`] needs to know.
pub(crate) struct Check<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) spec: &'a ShardSpec,
    pub(crate) id: &'a KeyId,
    pub(crate) mode: VerifyMode,
    pub(crate) generation: u64,
    /// The caller holds the fetch lock, so it may hash and rewrite the record.
    pub(crate) exclusive: bool,
    pub(crate) metrics: &'a CacheMetrics,
}

/// Checks the cached copy of a shard against the caller's spec and the cache's record.
pub(crate) fn inspect(c: &Check<'_>) -> Result<Found> {
    let data = c.layout.data(c.id);
    let meta = match fs::metadata(&data) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(io_err("stat", &data)(e)),
    };
    let record = match read_record(&c.layout.record(c.id))? {
        RecordState::Absent => return Ok(Found::Foreign(data)),
        RecordState::Unreadable => return Ok(Found::Invalid("unreadable record".into())),
        RecordState::Present(r) => r,
    };
    if record.key != c.spec.key {
        return Ok(Found::Invalid(format!("record names key {:?}", record.key)));
    }
    let actual = meta.len();
    if actual != c.spec.size || record.size != c.spec.size {
        return Ok(Found::Invalid(format!(
            "size on disk {actual}, recorded {}, expected {}",
            record.size, c.spec.size
        )));
    }
    let Some(expected) = c.spec.hash.as_ref() else {
        return Ok(Found::Valid);
    };
    if c.mode == VerifyMode::Size {
        return Ok(Found::Valid);
    }
    let checked_now = record.verified_generation == c.generation
        && record.hash.as_ref().is_some_and(|h| h.matches(expected));
    if checked_now && c.mode == VerifyMode::Hash {
        return Ok(Found::Valid);
    }
    if c.mode == VerifyMode::Hash && !c.exclusive {
        return Ok(Found::NeedsHash);
    }
    let digest = hash_file(&data, expected.algorithm)?;
    c.metrics.add_hashed(actual);
    if !digest.eq_ignore_ascii_case(&expected.hex) {
        return Ok(Found::Invalid(format!(
            "{} is {digest}, expected {}",
            expected.algorithm, expected.hex
        )));
    }
    if c.exclusive && !checked_now {
        write_record(c.layout, c.id, &Record::new(c.spec, c.generation))?;
    }
    Ok(Found::Valid)
}
