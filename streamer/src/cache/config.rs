//! What a cache is told: its limit and checks ([`CacheConfig`]), what a caller asks for
//! ([`ShardSpec`]), and where a run's cache lives ([`node_dir`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use shardstream_sharding::hashing::HashAlgorithm;

use super::error::{CacheError, Result};

/// How much checking a cached file gets before it is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// Size only: a truncated or extended file is caught, a flipped byte is not.
    Size,
    /// Size every time, and the hash (where the caller gives one) once per cache generation:
    /// after each download and on the first reuse after a restart of all the node's processes.
    #[default]
    Hash,
    /// Size and hash on every acquire, also for in-place local sources.
    Always,
}

/// What to do with `file://` and plain-path sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LocalSources {
    /// Read them where they are; no copy, no disk accounting, never deleted.
    #[default]
    InPlace,
    /// Copy them into the cache like remote shards (for a slow NFS share, say).
    Copy,
}

/// How a [`super::Cache`] behaves. `CacheConfig::new(limit)` gives the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Hard limit on the bytes of shard files (complete and in progress) in the folder, for all
    /// processes of the node together.
    pub limit_bytes: u64,
    /// How cached files are checked before reuse.
    pub verify: VerifyMode,
    /// How local sources are served.
    pub local_sources: LocalSources,
    /// How long to wait for another process that is fetching or checking the same shard;
    /// `None` waits as long as it takes (the kernel frees the lock if that process dies).
    pub lock_wait: Option<Duration>,
    /// How long a fetch waits for readers to release shards when everything evictable is in
    /// use, before it fails with [`CacheError::LimitTooSmall`].
    pub space_wait: Duration,
}

impl CacheConfig {
    /// Defaults for a limit of `limit_bytes`: hash verification, local sources read in place,
    /// no lock timeout, and 60 s of waiting for space.
    pub fn new(limit_bytes: u64) -> CacheConfig {
        CacheConfig {
            limit_bytes,
            verify: VerifyMode::default(),
            local_sources: LocalSources::default(),
            lock_wait: None,
            space_wait: Duration::from_secs(60),
        }
    }
}

/// An expected digest, as an index records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedHash {
    /// The algorithm.
    pub algorithm: HashAlgorithm,
    /// The lowercase or uppercase hex digest.
    pub hex: String,
}

/// One shard as the caller knows it from the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// A name unique within the run, e.g. the shard's URL or its path relative to the dataset.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its hash, where the index has one.
    pub hash: Option<ExpectedHash>,
}

impl ShardSpec {
    /// A shard with a known size and no hash.
    pub fn new(key: impl Into<String>, size: u64) -> ShardSpec {
        ShardSpec {
            key: key.into(),
            size,
            hash: None,
        }
    }

    /// Adds the expected hash.
    pub fn with_hash(mut self, algorithm: HashAlgorithm, hex: impl Into<String>) -> ShardSpec {
        self.hash = Some(ExpectedHash {
            algorithm,
            hex: hex.into(),
        });
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let reason = if self.key.is_empty() {
            Some("empty")
        } else if self.key.len() > 4096 {
            Some("longer than 4096 bytes")
        } else if self.key.contains('\0') {
            Some("contains NUL")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(CacheError::InvalidKey {
                key: self.key.chars().take(200).collect(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// The folder of one node of one run: `<root>/<run_id>/<node_rank>/` (docs/cache.md), built
/// and checked by the one owner of that rule, `shardstream_identity::node_dir`; a run id that
/// could escape `root` or name another run's folder (`..`, `a/b`) is refused.
pub fn node_dir(root: &Path, run_id: &str, node_rank: u32) -> Result<PathBuf> {
    use shardstream_identity::IdentityError;
    shardstream_identity::node_dir(root, run_id, node_rank).map_err(|e| CacheError::InvalidName {
        what: "run id",
        value: run_id.to_string(),
        reason: match e {
            IdentityError::InvalidRunId { reason, .. } => reason,
            _ => "not usable as a folder name",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_dir_keys_by_run_and_rank_and_refuses_escapes() {
        let root = Path::new("/cache");
        assert_eq!(
            node_dir(root, "run1", 3).unwrap(),
            PathBuf::from("/cache/run1/3")
        );
        for bad in ["", ".", "..", "a/b", "../x", "a\0b"] {
            assert!(
                matches!(node_dir(root, bad, 0), Err(CacheError::InvalidName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn keys_are_validated() {
        assert!(ShardSpec::new("shard.00000.mds", 1).validate().is_ok());
        assert!(ShardSpec::new("", 1).validate().is_err());
        assert!(ShardSpec::new("a\0b", 1).validate().is_err());
        assert!(ShardSpec::new("x".repeat(5000), 1).validate().is_err());
    }
}
