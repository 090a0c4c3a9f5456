//! The node's shard cache: `<cache-root>/<run-id>/<node-rank>/`, shared by every process of a
//! node (ranks and their DataLoader workers), coordinated only through `flock` locks on files in
//! that folder, which the kernel releases when a process dies. No shared memory, no lock that
//! outlives its owner, nothing to clean by hand after a crash. `docs/cache.md` has the design.
//!
//! - A shard is fetched once per node: the first process to miss takes the shard's fetch lock
//!   and downloads; the others wait on the same lock and then read its file, or join the
//!   download while it grows when its writer shares its progress (`cache::progress`).
//! - Files appear only complete (temp file, fsync, check, rename) and are checked again before
//!   reuse after a restart: size always, hash where the index has one.
//! - The folder never holds more than `limit_bytes` of shards: space is reserved before a fetch,
//!   and shards nobody holds a [`ShardLease`] on are evicted, least recently used first. Files
//!   the cache did not create are never deleted.
//! - Local sources are read in place by default ([`Cache::acquire_local`]).
//!
//! The core is synchronous. An async fetch engine calls [`Cache::begin`] in a blocking task,
//! writes the shard to [`FetchGuard::tmp_path`] however it likes, and calls
//! [`FetchGuard::commit`]; [`Cache::acquire`] does the same with a closure.
//!
//! ```
//! use shardstream_streamer::cache::{Cache, CacheConfig, ShardSpec};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let root = tempfile::tempdir()?;
//! let dir = shardstream_streamer::cache::node_dir(root.path(), "run1", 0)?;
//! let cache = Cache::open(&dir, CacheConfig::new(1 << 20))?;
//! let spec = ShardSpec::new("shard.00000.mds", 5);
//! let lease = cache.acquire(&spec, |tmp| std::fs::write(tmp, b"hello").map(|()| 5))?;
//! assert_eq!(std::fs::read(lease.path())?, b"hello");
//! // A second acquire is a hit: the closure does not run.
//! let again = cache.acquire(&spec, |_| -> std::io::Result<u64> { unreachable!() })?;
//! assert_eq!(again.path(), lease.path());
//! # Ok(()) }
//! ```

mod config;
mod disk_limit;
mod entry;
mod error;
mod index_copy;
mod layout;
mod lease;
mod lock;
mod metrics;
pub(crate) mod progress;
mod space;

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tracing::{debug, info, warn};

pub use config::{node_dir, CacheConfig, ExpectedHash, LocalSources, ShardSpec, VerifyMode};
pub use disk_limit::default_limit;
pub use error::{CacheError, Result};
pub(crate) use index_copy::{read_index_copy, remove_index_copy, save_index_copy};
pub use lease::{Begin, FetchGuard, LeaseOrigin, ShardLease};
pub use metrics::{CacheMetrics, MetricsSnapshot};

use entry::{inspect, read_record, Check, Found, RecordState};
use error::io_err;
use layout::{list_names, remove_if_present, KeyId, Layout};
pub(crate) use lock::{hold_table, TableHold};
use lock::{LockGuard, Mode};
use space::{space_lock, Reserve};

/// A handle on one node's cache folder. Cheap to clone; clones share metrics and locks. Open one
/// per process (after `fork`, open again: see [`CacheError::Forked`]).
#[derive(Debug, Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    layout: Layout,
    config: CacheConfig,
    /// New whenever the folder is opened with no other process holding it open: files
    /// verified in another generation are hashed again before reuse.
    generation: u64,
    pid: u32,
    metrics: CacheMetrics,
    _open: LockGuard,
}

impl Cache {
    /// Opens (creating if needed) the cache in `dir` and recovers from any crash before: temp
    /// files of dead downloads are removed, locks of dead processes are already free.
    pub fn open(dir: impl AsRef<Path>, config: CacheConfig) -> Result<Cache> {
        let dir = dir.as_ref();
        shardstream_identity::prepare_node_folder(dir, &shardstream_identity::os_env)?;
        let root = fs::canonicalize(dir).map_err(io_err("resolve", dir))?;
        let layout = Layout::new(root);
        layout.create()?;
        let open_path = layout.open_lock();
        let first = lock::try_exclusive(&open_path).map_err(io_err("lock", &open_path))?;
        let is_first = first.is_some();
        let open = match first {
            Some(excl) => {
                // Nobody else has the folder open: start a new generation and clean up after
                // any crash now, before another process can use the folder. Later openers
                // wait for the downgrade and skip both; leftovers of a process that dies
                // while others keep the folder open are reclaimed by the space count and by
                // the next fetch of the same shard.
                let generation = layout.new_generation()?;
                recover(&layout, generation)?;
                excl.downgrade().map_err(io_err("lock", &open_path))?
            }
            None => lock_for(&open_path, Mode::Shared, None)?,
        };
        // Read again even by the first opener: the downgrade is unlock-then-lock, and a
        // process that slipped in between started its own generation.
        let generation = layout.read_generation()?;
        info!(dir = %layout.root().display(), generation, first = is_first, limit = config.limit_bytes, "cache opened");
        Ok(Cache {
            inner: Arc::new(Inner {
                layout,
                config,
                generation,
                pid: std::process::id(),
                metrics: CacheMetrics::default(),
                _open: open,
            }),
        })
    }

    /// Opens the cache of one node of one run: `<root>/<run_id>/<node_rank>/`.
    pub fn open_run(
        root: &Path,
        run_id: &str,
        node_rank: u32,
        config: CacheConfig,
    ) -> Result<Cache> {
        Cache::open(node_dir(root, run_id, node_rank)?, config)
    }

    /// The cache folder (canonical).
    pub fn dir(&self) -> &Path {
        self.inner.layout.root()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.config
    }

    /// This handle's counters.
    pub fn metrics(&self) -> &CacheMetrics {
        &self.inner.metrics
    }

    /// The cache generation this handle belongs to.
    pub fn generation(&self) -> u64 {
        self.inner.generation
    }

    /// Fails at start, not mid-run, when `window` shards of up to `max_shard_bytes` each (what
    /// the sample order may hold at once on this node) cannot fit in the limit.
    pub fn check_fits(&self, max_shard_bytes: u64, window: u64) -> Result<()> {
        let need = max_shard_bytes.saturating_mul(window.max(1));
        let limit = self.inner.config.limit_bytes;
        if need > limit {
            return Err(CacheError::LimitTooSmall {
                need,
                limit,
                pinned: 0,
            });
        }
        Ok(())
    }

    /// Bytes of shard files in the folder now (complete and in progress), for all processes;
    /// also removes temp files of dead downloads.
    pub fn usage(&self) -> Result<u64> {
        let _space = space_lock(&self.inner.layout)?;
        let bytes = space::count(&self.inner.layout, self.inner.generation)?;
        self.inner
            .metrics
            .cache_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(bytes)
    }

    /// Returns a lease on `spec`'s shard, running `fetch` to write it to the given temp path if
    /// no process on the node has it yet. `fetch` returns the bytes it wrote. Blocks while
    /// another process fetches or checks the same shard.
    pub fn acquire<F, E>(&self, spec: &ShardSpec, fetch: F) -> Result<ShardLease>
    where
        F: FnOnce(&Path) -> std::result::Result<u64, E>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match self.begin(spec)? {
            Begin::Hit(lease) => Ok(lease),
            Begin::Fetch(guard) => match fetch(guard.tmp_path()) {
                Ok(_) => guard.commit(),
                Err(e) => Err(CacheError::Fetch {
                    key: spec.key.clone(),
                    source: e.into(),
                }),
            },
        }
    }

    /// Serves a local shard (`file://` or a plain path): in place by default, checked for size
    /// (and hash under [`VerifyMode::Always`]); copied through the cache under
    /// [`LocalSources::Copy`]. In-place files are never counted, evicted or deleted.
    pub fn acquire_local(
        &self,
        src: &Path,
        size: u64,
        hash: Option<ExpectedHash>,
    ) -> Result<ShardLease> {
        match self.inner.config.local_sources {
            LocalSources::InPlace => {
                let actual = fs::metadata(src).map_err(io_err("stat", src))?.len();
                let key = src.display().to_string();
                if actual != size {
                    return Err(CacheError::SizeMismatch {
                        key,
                        expected: size,
                        actual,
                    });
                }
                if let Some(h) = hash.filter(|_| self.inner.config.verify == VerifyMode::Always) {
                    let digest = entry::hash_file(src, h.algorithm)?;
                    self.inner.metrics.add_hashed(actual);
                    if !digest.eq_ignore_ascii_case(&h.hex) {
                        return Err(CacheError::HashMismatch {
                            key,
                            algorithm: h.algorithm.name().to_string(),
                            expected: h.hex,
                            actual: digest,
                        });
                    }
                }
                Ok(ShardLease::new(
                    src.to_path_buf(),
                    actual,
                    LeaseOrigin::InPlace,
                    None,
                ))
            }
            LocalSources::Copy => {
                let abs = fs::canonicalize(src).map_err(io_err("resolve", src))?;
                let spec = ShardSpec {
                    key: format!("file://{}", abs.display()),
                    size,
                    hash,
                };
                self.acquire(&spec, |tmp| fs::copy(&abs, tmp))
            }
        }
    }

    /// Checks a local file read in place against `hash` (the caller decides how often; see
    /// [`Cache::acquire_local`] for the size check).
    pub fn verify_local(&self, src: &Path, hash: &ExpectedHash) -> Result<()> {
        let digest = entry::hash_file(src, hash.algorithm)?;
        let size = fs::metadata(src).map_err(io_err("stat", src))?.len();
        self.inner.metrics.add_hashed(size);
        if !digest.eq_ignore_ascii_case(&hash.hex) {
            return Err(CacheError::HashMismatch {
                key: src.display().to_string(),
                algorithm: hash.algorithm.name().to_string(),
                expected: hash.hex.clone(),
                actual: digest,
            });
        }
        Ok(())
    }

    /// Starts an acquire: a [`Begin::Hit`] when the shard is cached (and checked), else a
    /// [`Begin::Fetch`] that makes the caller the node's fetcher. Blocks (up to
    /// [`CacheConfig::lock_wait`]) while another process fetches or checks the shard, and (up
    /// to [`CacheConfig::space_wait`]) while the cache is full of shards in use.
    pub fn begin(&self, spec: &ShardSpec) -> Result<Begin> {
        match self.start(spec, true)? {
            Some(begin) => Ok(begin),
            // Unreachable: a waiting start always decides.
            None => Err(CacheError::LockTimeout {
                path: self.inner.layout.fetch_lock(&KeyId::of(&spec.key)),
                waited: std::time::Duration::ZERO,
            }),
        }
    }

    /// [`Cache::begin`] without waiting for another process's fetch: `None` while another
    /// process (or another handle in this one) holds the shard's fetch lock. Its download may
    /// then be joined while it grows (`cache::progress`).
    pub fn try_begin(&self, spec: &ShardSpec) -> Result<Option<Begin>> {
        self.start(spec, false)
    }

    /// The fast path of [`Cache::begin`] alone: a lease when the shard is cached and checked,
    /// `None` otherwise (the caller then begins, fetching or waiting as needed). Takes no fetch
    /// lock, so it never makes the caller a fetcher and never waits for one.
    pub fn lookup(&self, spec: &ShardSpec) -> Result<Option<ShardLease>> {
        let inner = &self.inner;
        inner.check_process()?;
        spec.validate()?;
        let id = KeyId::of(&spec.key);
        let check = inner.shared_check(spec, &id);
        let pin = inner.lock(&inner.layout.pin_lock(&id), Mode::Shared)?;
        Ok(match inspect(&check)? {
            Found::Valid => Some(self.hit(&id, spec, pin)),
            _ => None,
        })
    }

    /// Deletes `key`'s shard from the folder now, as eviction does, if no process reads,
    /// fetches or checks it: `Some(bytes freed)` (0 when it was not in the folder), `None` when
    /// it is in use and was left alone.
    pub fn evict(&self, key: &str) -> Result<Option<u64>> {
        let inner = &self.inner;
        inner.check_process()?;
        let id = KeyId::of(key);
        Ok(
            match space::evict_key(&inner.layout, &inner.metrics, inner.generation, &id)? {
                space::Removal::Removed(bytes) => Some(bytes),
                space::Removal::Absent => Some(0),
                space::Removal::InUse => None,
            },
        )
    }

    /// When `key`'s shard was last used (its file's modification time, which eviction orders
    /// by), if it is in the folder.
    pub fn last_use(&self, key: &str) -> Option<SystemTime> {
        fs::metadata(self.inner.layout.data(&KeyId::of(key)))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Whether `key`'s data file is in the folder now: one `stat`, no lock and no check (an
    /// acquire still checks it). For callers that only want to skip work for a cached shard.
    pub(crate) fn holds(&self, key: &str) -> bool {
        self.inner.layout.data(&KeyId::of(key)).exists()
    }

    /// Where a fetcher of `spec` writes it while it downloads.
    pub(crate) fn download_path(&self, spec: &ShardSpec) -> std::path::PathBuf {
        self.inner.layout.tmp(&KeyId::of(&spec.key), spec.size)
    }

    /// Whether some handle, in this process or another, holds `spec`'s fetch lock now.
    pub(crate) fn fetch_in_progress(&self, spec: &ShardSpec) -> Result<bool> {
        let path = self.inner.layout.fetch_lock(&KeyId::of(&spec.key));
        Ok(lock::try_exclusive(&path)
            .map_err(io_err("lock", &path))?
            .is_none())
    }

    fn start(&self, spec: &ShardSpec, wait: bool) -> Result<Option<Begin>> {
        let inner = &self.inner;
        inner.check_process()?;
        spec.validate()?;
        if spec.size > inner.config.limit_bytes {
            return Err(CacheError::LimitTooSmall {
                need: spec.size,
                limit: inner.config.limit_bytes,
                pinned: 0,
            });
        }
        let layout = &inner.layout;
        let id = KeyId::of(&spec.key);
        let pin_path = layout.pin_lock(&id);
        let mut check = inner.shared_check(spec, &id);

        // Fast path: pin, then look. Pinning first means no evictor can delete the file
        // between our check and our read.
        let pin = inner.lock(&pin_path, Mode::Shared)?;
        match inspect(&check)? {
            Found::Valid => return Ok(Some(Begin::Hit(self.hit(&id, spec, pin)))),
            Found::Foreign(path) => return Err(CacheError::Foreign { path }),
            Found::Missing | Found::Invalid(_) | Found::NeedsHash => drop(pin),
        }

        // Slow path: become the shard's one fetcher (or checker). The pin is released first:
        // a fetcher replacing a bad file waits for pins, so holding one here could deadlock.
        let fetch_path = layout.fetch_lock(&id);
        let fetch = if wait {
            inner.lock(&fetch_path, Mode::Exclusive)?
        } else {
            match lock::try_exclusive(&fetch_path).map_err(io_err("lock", &fetch_path))? {
                Some(fetch) => fetch,
                None => return Ok(None),
            }
        };
        check.exclusive = true;
        let mut replace = false;
        match inspect(&check)? {
            Found::Valid => {
                // Someone else fetched it while we waited, or we just checked its hash.
                let pin = inner.lock(&pin_path, Mode::Shared)?;
                drop(fetch);
                return Ok(Some(Begin::Hit(self.hit(&id, spec, pin))));
            }
            Found::Foreign(path) => return Err(CacheError::Foreign { path }),
            Found::Invalid(reason) => {
                warn!(key = %spec.key, %reason, "cached shard is damaged; fetching it again");
                CacheMetrics::inc(&inner.metrics.corrupt, 1);
                // Delete the bad copy unless someone holds a lease on it. A held copy is
                // replaced by the commit's rename instead, so its readers never find the path
                // missing; waiting for them could deadlock, as one may be this very thread.
                match lock::try_exclusive(&pin_path).map_err(io_err("lock", &pin_path))? {
                    Some(_unpinned) => {
                        remove_if_present(&layout.data(&id))?;
                        remove_if_present(&layout.record(&id))?;
                    }
                    None => replace = true,
                }
            }
            Found::Missing | Found::NeedsHash => {
                // A record without data is what a crash mid-eviction leaves.
                remove_if_present(&layout.record(&id))?;
            }
        }
        // Any temp file for this key is a dead download: we hold its fetch lock.
        for name in list_names(&layout.tmp_dir())? {
            if layout::parse_tmp_name(&name).is_some_and(|(tid, _)| tid == id) {
                remove_if_present(&layout.tmp_dir().join(name))?;
            }
        }
        CacheMetrics::inc(&inner.metrics.misses, 1);
        let tmp = space::reserve(
            &Reserve {
                layout,
                metrics: &inner.metrics,
                generation: inner.generation,
                limit: inner.config.limit_bytes,
                space_wait: inner.config.space_wait,
            },
            &id,
            spec.size,
        )?;
        debug!(key = %spec.key, bytes = spec.size, "cache miss; fetching");
        Ok(Some(Begin::Fetch(FetchGuard::new(
            self.clone(),
            spec.clone(),
            id,
            tmp,
            fetch,
            replace,
        ))))
    }

    fn hit(&self, id: &KeyId, spec: &ShardSpec, pin: LockGuard) -> ShardLease {
        let data = self.inner.layout.data(id);
        // Last use for LRU. Best effort: a failure only makes eviction order less exact.
        if let Err(e) = fs::File::open(&data).and_then(|f| f.set_modified(SystemTime::now())) {
            debug!(error = %e, "could not record last use");
        }
        CacheMetrics::inc(&self.inner.metrics.hits, 1);
        ShardLease::new(data, spec.size, LeaseOrigin::Hit, Some(pin))
    }
}

impl Inner {
    /// A check of `spec`'s cached copy by a caller without the fetch lock.
    fn shared_check<'a>(&'a self, spec: &'a ShardSpec, id: &'a KeyId) -> Check<'a> {
        Check {
            layout: &self.layout,
            spec,
            id,
            mode: self.config.verify,
            generation: self.generation,
            exclusive: false,
            metrics: &self.metrics,
        }
    }

    fn check_process(&self) -> Result<()> {
        let current = std::process::id();
        if current != self.pid {
            return Err(CacheError::Forked {
                path: self.layout.root().to_path_buf(),
                opened_by: self.pid,
                current,
            });
        }
        Ok(())
    }

    fn lock(&self, path: &Path, mode: Mode) -> Result<LockGuard> {
        lock_for(path, mode, self.config.lock_wait)
    }
}

fn lock_for(path: &Path, mode: Mode, wait: Option<std::time::Duration>) -> Result<LockGuard> {
    let start = Instant::now();
    match lock::lock(path, mode, wait.map(|w| start + w)) {
        Ok(Some(g)) => Ok(g),
        Ok(None) => Err(CacheError::LockTimeout {
            path: path.to_path_buf(),
            waited: start.elapsed(),
        }),
        Err(e) => Err(io_err("lock", path)(e)),
    }
}

/// Clears what crashed processes left behind. Everything here is decided by a lock the kernel
/// has already freed, never by age or process ids, and touches only names the cache creates.
fn recover(layout: &Layout, generation: u64) -> Result<()> {
    {
        // The count removes temp files whose fetch lock is free (their writer is gone).
        let _space = space_lock(layout)?;
        space::count(layout, generation)?;
    }
    let entries = layout.entries_dir();
    for name in list_names(&entries)? {
        let (stem, is_tmp) = match name.strip_suffix(".json.tmp") {
            Some(stem) => (stem, true),
            None => match name.strip_suffix(".json") {
                Some(stem) => (stem, false),
                None => continue,
            },
        };
        let Some(id) = KeyId::parse(stem) else {
            continue;
        };
        let fetch = layout.fetch_lock(&id);
        let Some(_fetch) = lock::try_exclusive(&fetch).map_err(io_err("lock", &fetch))? else {
            continue;
        };
        if is_tmp {
            remove_if_present(&entries.join(&name))?;
        } else if !layout.data(&id).exists() {
            if let RecordState::Present(_) | RecordState::Unreadable =
                read_record(&layout.record(&id))?
            {
                remove_if_present(&layout.record(&id))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
