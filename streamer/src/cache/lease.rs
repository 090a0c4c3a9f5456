//! What an acquire hands back: a [`ShardLease`] on a file that stays in place while it lives, or
//! a [`FetchGuard`] that makes the caller the node's one fetcher of a shard.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tracing::{debug, warn};

use super::config::{ShardSpec, VerifyMode};
use super::entry::{hash_file, write_record, Record};
use super::error::{io_err, CacheError, Result};
use super::layout::{remove_if_present, sync_parent, KeyId};
use super::lock::LockGuard;
use super::metrics::CacheMetrics;
use super::space::{ledger_add, space_lock};
use super::Cache;

/// Where a leased file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOrigin {
    /// It was already in the cache.
    Hit,
    /// This call fetched it.
    Fetched,
    /// A local source read where it is.
    InPlace,
}

/// A complete, verified shard file. While the lease lives the file is pinned: no process on the
/// node evicts or replaces it. Dropping the lease unpins it.
#[derive(Debug)]
pub struct ShardLease {
    path: PathBuf,
    size: u64,
    origin: LeaseOrigin,
    _pin: Option<LockGuard>,
}

impl ShardLease {
    pub(crate) fn new(
        path: PathBuf,
        size: u64,
        origin: LeaseOrigin,
        pin: Option<LockGuard>,
    ) -> Self {
        ShardLease {
            path,
            size,
            origin,
            _pin: pin,
        }
    }

    /// The file to read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether it was a hit, a fetch or a local file.
    pub fn origin(&self) -> LeaseOrigin {
        self.origin
    }
}

/// The outcome of [`Cache::begin`].
#[derive(Debug)]
pub enum Begin {
    /// The shard is cached and verified.
    Hit(ShardLease),
    /// The caller must write the shard to [`FetchGuard::tmp_path`] and call
    /// [`FetchGuard::commit`]; every other process asking for it waits until then.
    Fetch(FetchGuard),
}

/// The right and duty to fetch one shard into the cache. Holds the shard's fetch lock and a
/// disk reservation of its size; dropping it without [`FetchGuard::commit`] deletes the temp file
/// and lets the next process try.
#[derive(Debug)]
pub struct FetchGuard {
    cache: Cache,
    spec: ShardSpec,
    id: KeyId,
    tmp: PathBuf,
    fetch_lock: Option<LockGuard>,
    /// A damaged copy that someone still holds stays in place until the rename replaces it.
    replace: bool,
    committed: bool,
}

impl FetchGuard {
    pub(crate) fn new(
        cache: Cache,
        spec: ShardSpec,
        id: KeyId,
        tmp: PathBuf,
        fetch_lock: LockGuard,
        replace: bool,
    ) -> Self {
        FetchGuard {
            cache,
            spec,
            id,
            tmp,
            fetch_lock: Some(fetch_lock),
            replace,
            committed: false,
        }
    }

    /// Where to write the shard: exactly `spec.size` bytes (the reservation), any way the
    /// fetcher likes (create or truncate it; the file exists and is empty).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// The shard being fetched.
    pub fn spec(&self) -> &ShardSpec {
        &self.spec
    }

    /// Checks the written file (size, and hash unless verification is off), makes it durable
    /// and moves it into the cache, returning a lease on it. On a failed check the file is
    /// deleted and the error returned; the next acquire fetches again.
    pub fn commit(mut self) -> Result<ShardLease> {
        let inner = &self.cache.inner;
        let (layout, spec) = (&inner.layout, &self.spec);
        let f = File::options()
            .write(true)
            .open(&self.tmp)
            .map_err(io_err("open", &self.tmp))?;
        f.sync_all().map_err(io_err("fsync", &self.tmp))?;
        let actual = f.metadata().map_err(io_err("stat", &self.tmp))?.len();
        if actual != spec.size {
            return Err(CacheError::SizeMismatch {
                key: spec.key.clone(),
                expected: spec.size,
                actual,
            });
        }
        if let Some(expected) = spec
            .hash
            .as_ref()
            .filter(|_| inner.config.verify != VerifyMode::Size)
        {
            let digest = hash_file(&self.tmp, expected.algorithm)?;
            inner.metrics.add_hashed(actual);
            if !digest.eq_ignore_ascii_case(&expected.hex) {
                return Err(CacheError::HashMismatch {
                    key: spec.key.clone(),
                    algorithm: expected.algorithm.name().to_string(),
                    expected: expected.hex.clone(),
                    actual: digest,
                });
            }
        }
        // The last-use time that LRU reads; set explicitly, since a write's own timestamp comes
        // from a coarse kernel clock.
        f.set_modified(SystemTime::now())
            .map_err(io_err("set mtime", &self.tmp))?;
        drop(f);
        let record = Record::new(spec, inner.generation);
        let data = layout.data(&self.id);
        let rename = |tmp: &Path| -> Result<()> {
            // Under space.lock so that a count never sees the file in both places or neither.
            let _space = space_lock(layout)?;
            ledger_add(layout, inner.generation, actual)?;
            fs::rename(tmp, &data).map_err(io_err("rename", tmp))
        };
        // The record goes first so that a data file never exists without one (which would
        // make it someone else's). A damaged copy being replaced has a record already; there
        // the data goes first, so a reader between the two steps sees the new bytes under the
        // old record (checked again, or matching) rather than the old bytes under a new record
        // that would vouch for them.
        if self.replace {
            rename(&self.tmp)?;
            self.committed = true;
            write_record(layout, &self.id, &record)?;
        } else {
            write_record(layout, &self.id, &record)?;
            rename(&self.tmp)?;
            self.committed = true;
        }
        sync_parent(&data)?;
        // Pin before letting go of the fetch lock: an evictor needs both, so there is no moment
        // in which the new file is unpinned and unlocked.
        let pin = inner.lock(&layout.pin_lock(&self.id), super::lock::Mode::Shared)?;
        self.fetch_lock = None;
        CacheMetrics::inc(&inner.metrics.fetched_bytes, actual);
        debug!(key = %spec.key, bytes = actual, "fetched into cache");
        Ok(ShardLease::new(
            data,
            actual,
            LeaseOrigin::Fetched,
            Some(pin),
        ))
    }
}

impl Drop for FetchGuard {
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = remove_if_present(&self.tmp) {
                // The next fetcher of this key, or the next count, removes it instead.
                warn!(error = %e, "could not remove an abandoned download");
            }
        }
        // Release the fetch lock only after the temp file is gone.
        self.fetch_lock = None;
    }
}
