//! The state a dataset's handles share (behind the `Arc` every stream, prefetch and task
//! holds): its shards and order, the node folder and cache settings, the memory plan, this
//! process's engine slot, metrics, and the shards kept open for random access.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use shardstream_sharding::mds::index_bin;
use shardstream_storage::Location;

use super::config::open_url;
use super::index::ShardSource;
use super::index::{keep_index_copy, read_index, IndexCopy};
use super::metrics::{Metrics, MetricsSnapshot, Publisher};
use super::proc::{ProcSlot, ProcState};
use super::shard::ShardHandle;
use crate::cache::CacheConfig;
use crate::error::{Result, StreamerError};
use crate::memory::MemoryPlan;
use crate::order::DatasetShape;

/// How a stream opened by URL is opened again: URL, split, storage options.
pub(crate) type Reopen = (
    String,
    Option<String>,
    shardstream_storage::named_options::NamedOptions,
);

/// Shared state of a dataset (behind the `Arc` every stream and task holds).
#[derive(Debug)]
pub(crate) struct Inner {
    /// One per stream (a single dataset has one).
    pub locations: Vec<Location>,
    /// How to open each stream's location again in a new process: `(url, split, storage
    /// options)` when the dataset was opened by URL, `None` when the caller gave the location.
    pub reopen: Vec<Option<Reopen>>,
    /// The first stream's `index.json` (or what stands for it), for the mount's `index.json`.
    pub index_json: IndexJson,
    pub columns: Vec<(String, String)>,
    pub shape: DatasetShape,
    pub shards: Vec<ShardSource>,
    pub cache_dir: PathBuf,
    pub cache_config: CacheConfig,
    /// How `memory_limit` is divided; each process that streams holds at most `memory.engine`
    /// (the budget that enforces it is per process, [`ProcState::budget`]).
    pub memory: MemoryPlan,
    pub metrics: Metrics,
    /// Publishes this process's counters into the node folder for the node's sum.
    pub publisher: Publisher,
    pub proc: ProcSlot,
    pub max_shard_bytes: u64,
    /// The retry window in milliseconds (see [`StreamingConfig::retry_window`]).
    pub retry_window_ms: AtomicU64,
    /// Local files read in place whose hash this process has checked.
    pub verified_local: Mutex<HashSet<PathBuf>>,
    /// Read buffers the consumer has let go of, for the next reads of any stream of this
    /// dataset (kept across epochs; see `crate::buffers`).
    pub read_buffers: Arc<crate::buffers::BufferPool>,
    /// Remote indexes read from the store at open, to be copied into the cache folder by the
    /// first engine started (see `Inner::save_index_copies`).
    pub index_copies: Mutex<Vec<IndexCopy>>,
    /// Shards [`StreamingDataset::sample`] opened, kept open for its next calls.
    pub recent: Mutex<RecentShards>,
}

/// The first stream's `index.json` bytes: read at open, or, when the stream was opened from its
/// `index.ssx`, fetched on first use (the mount's `index.json`) and checked against the size
/// and hash the binary index records, so that what is served is what the shards came from.
#[derive(Debug)]
pub(crate) struct IndexJson {
    bytes: OnceLock<Arc<[u8]>>,
    /// Where to fetch it, and the size and xxh64 it must have.
    lazy: Option<(Location, u64, u64)>,
}

impl IndexJson {
    /// Bytes read at open.
    pub(crate) fn loaded(bytes: Vec<u8>) -> Self {
        Self {
            bytes: OnceLock::from(Arc::<[u8]>::from(bytes)),
            lazy: None,
        }
    }

    /// `index.json` of `location`, whose binary index has header `head`, read on first use.
    pub(crate) fn lazy(location: Location, head: &index_bin::Header) -> Self {
        Self {
            bytes: OnceLock::new(),
            lazy: Some((location, head.json_bytes, head.json_xxh64)),
        }
    }

    /// The bytes, fetched now when they were not read at open.
    pub(crate) fn get(&self) -> Result<Arc<[u8]>> {
        if let Some(bytes) = self.bytes.get() {
            return Ok(Arc::clone(bytes));
        }
        let Some((location, size, hash)) = &self.lazy else {
            return Ok(Arc::from(Vec::new()));
        };
        let json = read_index(location)?;
        if json.len() as u64 != *size || xxhash_rust::xxh64::xxh64(&json, 0) != *hash {
            return Err(StreamerError::Format(
                shardstream_sharding::FormatError::invalid_index(
                    location.url_of("index.json"),
                    "changed since the dataset was opened from its index.ssx",
                ),
            ));
        }
        Ok(Arc::clone(self.bytes.get_or_init(|| Arc::from(json))))
    }
}

/// Shard handles kept for random access, and the process that opened them.
#[derive(Debug, Default)]
pub(crate) struct RecentShards {
    pid: u32,
    handles: Vec<ShardHandle>,
}

impl RecentShards {
    /// This process's handles. A forked child's copy of its parent's is forgotten, not dropped
    /// or used: a handle of a shard the parent was downloading would wait for a download that
    /// does not go on in the child.
    fn of_this_process(&mut self) -> &mut Vec<ShardHandle> {
        let pid = std::process::id();
        if self.pid != pid {
            std::mem::forget(std::mem::take(&mut self.handles));
            self.pid = pid;
        }
        &mut self.handles
    }
}

/// Most shards [`StreamingDataset::sample`] keeps open (and pinned) between calls.
const RECENT_SHARDS: usize = 64;
/// Most bytes of offset tables (4 per sample) the kept shards may hold: a 64 MB shard of 100 B
/// samples has 2.5 MB of them.
const RECENT_OFFSET_BYTES: u64 = 16 << 20;

impl Drop for Inner {
    fn drop(&mut self) {
        // The last counters of this handle in this process (a forked child's copy publishes
        // nothing: its publisher belongs to its parent until the child starts its own).
        self.publisher.publish(|| self.snapshot());
    }
}

impl Inner {
    /// Saves the copies of the indexes this dataset read from the store, once, in the
    /// background of this process's engine `state` (a stream's end waits for it, so a process
    /// that streams an epoch and exits leaves the copy behind): `open` starts no thread (a dataset opened before `fork` must
    /// survive it), and the fsync of a copy should not delay a cold dataset's first sample.
    pub(super) fn save_index_copies(&self, state: &ProcState) {
        let pending = match self.index_copies.lock() {
            Ok(mut pending) if !pending.is_empty() => std::mem::take(&mut *pending),
            _ => return,
        };
        state.spawn_settled(crate::runtime::blocking(move || {
            pending.iter().for_each(keep_index_copy);
            Ok(())
        }));
    }
}

impl Inner {
    /// The kept handle of `shard`, if any. `try_lock`: a list locked at a fork stays locked in
    /// the child, which then opens shards afresh.
    pub(super) fn recent_shard(&self, shard: usize) -> Option<ShardHandle> {
        let mut recent = self.recent.try_lock().ok()?;
        recent
            .of_this_process()
            .iter()
            .find(|h| h.shard() == shard)
            .cloned()
    }

    /// Keeps `handle` for the next [`StreamingDataset::sample`] calls, letting the oldest go
    /// past [`RECENT_SHARDS`], [`RECENT_OFFSET_BYTES`] of offset tables, or a sixteenth of the
    /// cache limit in shards that take room in the cache (local files read in place take none).
    /// The bound is per process, and every rank and DataLoader worker doing random access keeps
    /// its own: a sixteenth leaves the node's streams room with many of them (and a process
    /// that fetches lets its kept shards go first, see [`StreamingDataset::sample`]).
    pub(super) fn keep_recent(&self, handle: ShardHandle) {
        let allowance = self.cache_config.limit_bytes / 16;
        let cached = |h: &ShardHandle| if h.in_place() { 0 } else { h.len() };
        let offsets = |h: &ShardHandle| 4 * h.num_samples();
        let released = {
            let Ok(mut guard) = self.recent.try_lock() else {
                return;
            };
            let recent = guard.of_this_process();
            let mut released: Vec<ShardHandle> = Vec::new();
            if let Some(at) = recent.iter().position(|h| h.shard() == handle.shard()) {
                released.push(recent.remove(at));
            }
            recent.push(handle);
            let mut bytes: u64 = recent.iter().map(cached).sum();
            let mut table: u64 = recent.iter().map(offsets).sum();
            let mut cut = 0;
            while cut < recent.len()
                && (recent.len() - cut > RECENT_SHARDS
                    || bytes > allowance
                    || table > RECENT_OFFSET_BYTES)
            {
                bytes -= cached(&recent[cut]);
                table -= offsets(&recent[cut]);
                cut += 1;
            }
            released.extend(recent.drain(..cut));
            released
        };
        // Unpinned outside the lock.
        drop(released);
    }

    /// Lets the kept handle of `shard` go, or all of them (`None`).
    pub(super) fn forget_recent(&self, shard: Option<usize>) {
        let released = match self.recent.try_lock() {
            Ok(mut guard) => {
                let recent = guard.of_this_process();
                let (gone, kept) = std::mem::take(recent)
                    .into_iter()
                    .partition::<Vec<_>, _>(|h| shard.is_none_or(|s| h.shard() == s));
                *recent = kept;
                gone
            }
            Err(_) => Vec::new(),
        };
        drop(released);
    }

    /// This process's storage clients: opened again from the URL where possible.
    pub(super) fn fresh_locations(&self) -> Result<Vec<Location>> {
        self.locations
            .iter()
            .zip(&self.reopen)
            .map(|(loc, again)| match again {
                Some((url, split, options)) => {
                    let fresh = open_url(url, options, self.retry_window())?;
                    Ok(match split {
                        Some(split) => fresh.join(split)?,
                        None => fresh,
                    })
                }
                None => Ok(loc.clone()),
            })
            .collect()
    }

    /// The retry window of fetches starting now.
    pub(crate) fn retry_window(&self) -> Duration {
        Duration::from_millis(self.retry_window_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.metrics;
        let engine = self.proc.peek();
        let cache = engine
            .as_ref()
            .map(|ps| ps.cache.metrics().snapshot())
            .unwrap_or_default();
        MetricsSnapshot {
            fetch_bytes: m.fetch_bytes.load(Relaxed),
            fetch_requests: m.fetch_requests.load(Relaxed),
            fetch_retries: m.fetch_retries.load(Relaxed),
            shards_fetched: m.shards_fetched.load(Relaxed),
            shards_joined: m.shards_joined.load(Relaxed),
            cache_hits: cache.hits,
            cache_misses: cache.misses,
            cache_evictions: cache.evictions,
            cache_corrupt: cache.corrupt,
            cache_bytes: cache.cache_bytes,
            samples: m.samples.load(Relaxed),
            sample_bytes: m.sample_bytes.load(Relaxed),
            sample_reads: m.sample_reads.load(Relaxed),
            deferred_reads: m.deferred_reads.load(Relaxed),
            stall_seconds: m.stall_nanos.load(Relaxed) as f64 / 1e9,
            memory_in_use: engine.as_ref().map_or(0, |ps| ps.budget.in_use()),
            memory_limit: self.memory.engine,
        }
    }
}
