//! The public face of the streamer: [`StreamingDataset`] opens a dataset (MDS `index.json`)
//! anywhere the storage layer reaches, serves shards and samples through the node cache, and
//! streams one rank's part of an epoch with prefetch under one memory budget.
//!
//! ```no_run
//! use shardstream_streamer::dataset::{StreamingConfig, StreamingDataset, StreamPlan};
//! use shardstream_streamer::order::OrderConfig;
//! let ds = StreamingDataset::open(StreamingConfig {
//!     remote: "s3://bucket/my-mds".into(),
//!     run_id: Some("run1".into()),
//!     memory_limit: Some(256 << 20),
//!     ..StreamingConfig::default()
//! })?;
//! // One process reading the whole epoch; a rank of a larger world sets `world` and `rank`.
//! let plan = StreamPlan::single_process(OrderConfig { shuffle: true, ..OrderConfig::default() }, 0);
//! for item in ds.stream(plan)? {
//!     let item = item?;
//!     let _columns = item.sample.columns();
//! }
//! # Ok::<(), shardstream_streamer::StreamerError>(())
//! ```
//!
//! Threads and processes: the dataset is `Send + Sync`; share it with `Arc`. Its tokio runtime
//! and cache handle are made on first use in each process, so a dataset opened before `fork`
//! works in the children (see `engine`). `docs/streaming.md` describes the engine and its knobs.

mod budget;
mod decode;
mod engine;
mod fetch;
mod growing;
mod metrics;
mod prefetch;
mod shard;
mod stream;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardstream_identity::{
    cache_root, derived_run_id, locate, os_env, stable_hash, stable_hash_from, CacheOverrides,
    Overrides, STABLE_HASH_START,
};
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::{Columns, FileInfo, Index};
use shardstream_storage::{Env, Location, StorageError, StorageOptions};
use tracing::{debug, info, warn};

use crate::cache::{
    read_index_copy, remove_index_copy, save_index_copy, CacheConfig, ExpectedHash, LocalSources,
    VerifyMode,
};
use crate::error::{Result, StreamerError};
use crate::order::{DatasetShape, Sampling, StreamShape, Weight};

pub(crate) use engine::hold_proc_slots;
pub use fetch::{PART_BYTES, WRITE_BYTES};
pub use metrics::{node_metrics, MetricsSnapshot, METRICS_DIR};
pub use prefetch::{Prefetch, PrefetchReport};
pub use shard::{RawSample, ShardHandle};
pub use stream::{DeferredSample, SampleStream, StreamItem, StreamPlan, StreamedSample};

use engine::{ProcSlot, ShardSource};
use metrics::{Metrics, Publisher};

use crate::memory::MemoryPlan;
pub use crate::memory::{DEFAULT_MEMORY_LIMIT, MAX_CHUNK_BYTES, RUN_BYTES};
use crate::settings;
pub use crate::settings::{DEFAULT_RETRY_WINDOW, RETRY_WINDOW_ENV};

/// How to open a dataset. Field names follow mosaicml-streaming's `StreamingDataset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamingConfig {
    /// Dataset root: a local path, `file://`, `s3://`, `gs://` or `az://` URL holding an MDS
    /// `index.json`.
    pub remote: String,
    /// Subfolder of `remote` (Mosaic's `split`).
    pub split: Option<String>,
    /// Explicit cache folder (Mosaic's `local`). Else `<cache_root>/<run_id>/<node_rank>/` when a
    /// root is given, else `SHARDSTREAM_CACHE_DIR` as is (the folder `shardstream run` or the pod's
    /// volume keyed), else `<SHARDSTREAM_CACHE_ROOT or the default root>/<run_id>/<node_rank>/`.
    pub local: Option<PathBuf>,
    /// Cache root; see `local` (default root: `$XDG_CACHE_HOME/shardstream`,
    /// `$HOME/.cache/shardstream`, else `/tmp/shardstream-cache`).
    pub cache_root: Option<PathBuf>,
    /// Run id; else resolved as DESIGN §4 says (`SHARDSTREAM_RUN_ID`, job names,
    /// `TORCHELASTIC_RUN_ID`), else an error.
    pub run_id: Option<String>,
    /// Node rank; else resolved from the environment.
    pub node_rank: Option<u64>,
    /// Bytes of RAM for everything in flight and buffered; else `SHARDSTREAM_MEMORY_LIMIT`, else
    /// [`DEFAULT_MEMORY_LIMIT`].
    pub memory_limit: Option<u64>,
    /// Bytes of disk for the node's cache; else `SHARDSTREAM_CACHE_LIMIT`, else the shards the
    /// folder holds plus 80 % of its file system's free space at open
    /// ([`crate::cache::default_limit`]): always a real limit.
    pub cache_limit: Option<u64>,
    /// Copy `file://` and plain-path sources into the cache instead of reading them in place.
    pub copy_local: bool,
    /// Check the hashes the index records when a shard is fetched (and on reuse after a
    /// restart); sizes are always checked.
    pub validate_hash: bool,
    /// Allow `pkl` columns.
    pub allow_unsafe_types: bool,
    /// Which samples a stream whose epoch share is not a whole number of passes keeps: a fresh
    /// subset each epoch (Mosaic's default `sampling_method="balanced"`) or the same one.
    pub sampling: Sampling,
}

impl StreamingConfig {
    /// How long transient storage failures (5xx, `SlowDown`, timeouts, a server that is down)
    /// of one shard are retried, counted from the first failed request since the last one that
    /// succeeded, before the fetch fails: `SHARDSTREAM_RETRY_WINDOW` (seconds), else
    /// [`DEFAULT_RETRY_WINDOW`] (120 s). It bounds all retry levels together: the storage
    /// client's own retries inside one request are clamped to it, and the streamer's retries
    /// of a range or a shard count against the same window, so an outage ends in an error
    /// after about one window. [`StreamingDataset::set_retry_window`] overrides it.
    pub fn retry_window(&self) -> Duration {
        crate::settings::retry_window(&os_env)
    }
}

/// Shared state of a dataset (behind the `Arc` every stream and task holds).
#[derive(Debug)]
pub(crate) struct Inner {
    /// One per stream (a single dataset has one).
    pub locations: Vec<Location>,
    /// How to open each stream's location again in a new process: `(url, split)` when the
    /// dataset was opened by URL, `None` when the caller gave the location.
    pub reopen: Vec<Option<(String, Option<String>)>>,
    pub index_json: Vec<u8>,
    pub columns: Vec<(String, String)>,
    pub shape: DatasetShape,
    pub shards: Vec<ShardSource>,
    pub cache_dir: PathBuf,
    pub cache_config: CacheConfig,
    /// How `memory_limit` is divided; each process that streams holds at most `memory.engine`
    /// (the budget that enforces it is per process, [`engine::ProcState::budget`]).
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

/// A remote index to keep in the node's cache folder (see `crate::cache::save_index_copy`).
#[derive(Debug)]
pub(crate) struct IndexCopy {
    dir: PathBuf,
    url: String,
    json: Vec<u8>,
}

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
    fn save_index_copies(&self, state: &engine::ProcState) {
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

/// A dataset opened for streaming. `Send + Sync`; share it with `Arc`.
#[derive(Debug, Clone)]
pub struct StreamingDataset {
    inner: Arc<Inner>,
}

impl StreamingDataset {
    /// Opens a dataset: reads and checks `index.json` (no shard is downloaded), and works out
    /// the cache folder. Blocking.
    pub fn open(config: StreamingConfig) -> Result<Self> {
        let location = open_url(&config.remote, config.retry_window())?;
        let reopen = Some((config.remote.clone(), config.split.clone()));
        let split = config.split.clone();
        Self::open_streams_at(
            config,
            vec![(location, split, Weight::Natural, reopen)],
            None,
        )
    }

    /// [`StreamingDataset::open`] with a [`Location`] built by the caller (custom storage
    /// options, a test server); `config.remote` is then only used in messages.
    pub fn open_at(config: StreamingConfig, location: Location) -> Result<Self> {
        let split = config.split.clone();
        Self::open_streams_at(config, vec![(location, split, Weight::Natural, None)], None)
    }

    /// Opens several datasets mixed as one, like mosaicml-streaming's `streams`: each
    /// [`StreamSpec`] names a dataset and its weight (proportion, repeat or choose), and
    /// `epoch_size` (Mosaic's `epoch_size`) sets the samples per epoch when weights are
    /// relative. The order (`order::DatasetShape::mixed`) is deterministic and resumable like a
    /// single dataset's. Global shard and sample ids number the streams one after the other.
    /// `config.remote` and `config.split` are ignored; the other settings apply to all streams.
    pub fn open_streams(
        config: StreamingConfig,
        streams: Vec<StreamSpec>,
        epoch_size: Option<u64>,
    ) -> Result<Self> {
        let mut opened = Vec::with_capacity(streams.len());
        for spec in streams {
            let (location, reopen) = match spec.location {
                Some(l) => (l, None),
                None => (
                    open_url(&spec.remote, config.retry_window())?,
                    Some((spec.remote.clone(), spec.split.clone())),
                ),
            };
            opened.push((location, spec.split, spec.weight, reopen));
        }
        Self::open_streams_at(config, opened, epoch_size)
    }

    fn open_streams_at(
        config: StreamingConfig,
        streams: Vec<Stream>,
        epoch_size: Option<u64>,
    ) -> Result<Self> {
        if streams.is_empty() {
            return Err(StreamerError::InvalidConfig {
                setting: "streams",
                reason: "at least one dataset is needed".into(),
            });
        }
        let retry_window = config.retry_window();
        let memory = MemoryPlan::new(settings::byte_size(
            config.memory_limit,
            settings::MEMORY_LIMIT_ENV,
            &os_env,
        )?);

        let mut loaded = Loaded::default();
        let mut locations = Vec::with_capacity(streams.len());
        let mut reopen = Vec::with_capacity(streams.len());
        let mut shapes = Vec::with_capacity(streams.len());
        let mut index_json = Vec::new();
        let mut columns = Vec::new();
        let mut opened = Vec::with_capacity(streams.len());
        for (location, split, weight, again) in streams {
            reopen.push(again);
            let location = match &split {
                Some(split) => location.join(split)?,
                None => location,
            };
            opened.push((location, weight));
        }
        // The node's folder, when a stream is remote: resolved without the index (`local`, or a
        // run id), it keeps copies of the remote indexes. Resolved once, and used below too.
        let any_remote = opened.iter().any(|(l, _)| l.local_root().is_none());
        // What names the run when no launcher does (a plain script, a notebook): the datasets'
        // URLs, so that the next run of the same script finds this one's cache.
        let urls: Vec<&str> = opened.iter().map(|(l, _)| l.url()).collect();
        let dataset_key = urls.join("\n");
        let node_folder =
            any_remote.then(|| resolve_cache_dir(&config, CacheKey::Dataset(&dataset_key)));
        // A dataset made only of local files downloads nothing, so it needs no run id (see
        // `resolve_cache_dir`). `copy_local` asks for copies in the run's cache, so it does.
        let local_only = !any_remote && !config.copy_local;
        let copies = node_folder.as_ref().and_then(|r| r.as_deref().ok());
        let mut index_copies = Vec::new();
        // What a dataset of local files only is, for the folder it gets without a run id: its
        // indexes, so that a dataset rewritten under the same paths gets a new folder instead
        // of the decompressed shards of the old one (hashed only for such a dataset).
        let mut indexes_hash = STABLE_HASH_START;
        for (i, (location, weight)) in opened.into_iter().enumerate() {
            let (json, index, from_store) = load_index(&location, copies)?;
            if local_only {
                indexes_hash = stable_hash_from(indexes_hash, &json);
            }
            let counts = loaded.add_stream(&config, &location, i, &index)?;
            let remote = location.local_root().is_none();
            if let (true, true, Some(dir)) = (from_store, remote, copies) {
                index_copies.push(IndexCopy {
                    dir: dir.to_path_buf(),
                    url: location.url_of("index.json"),
                    json: json.clone(),
                });
            }
            if i == 0 {
                columns = loaded.first_columns.clone();
                index_json = json;
            }
            shapes.push((StreamShape::new(counts)?, weight));
            locations.push(location);
        }
        let shape = DatasetShape::mixed(shapes, epoch_size, config.sampling)?;
        // Read in place, a local-only dataset's folder holds only lock files and is named by its
        // paths; compressed, it holds the shards decompressed from those files (as Mosaic's
        // `local=` without a `remote` decompresses next to them) and is named by its paths and
        // indexes.
        let in_place_key = local_only.then(|| {
            let urls: Vec<&str> = locations.iter().map(|l| l.url()).collect();
            let mut key = urls.join("\n");
            if loaded.max_shard_bytes > 0 {
                key.push_str(&format!("\n{indexes_hash:016x}"));
            }
            key
        });
        let cache_dir = match (in_place_key, node_folder) {
            (None, Some(resolved)) => resolved?,
            (Some(key), _) => resolve_cache_dir(&config, CacheKey::InPlace(&key))?,
            (None, None) => resolve_cache_dir(&config, CacheKey::Dataset(&dataset_key))?,
        };
        let cache_limit =
            match settings::byte_size(config.cache_limit, settings::CACHE_LIMIT_ENV, &os_env)? {
                Some(limit) => limit,
                None => crate::cache::default_limit(&cache_dir)?,
            };
        let mut cache_config = CacheConfig::new(cache_limit);
        cache_config.verify = if config.validate_hash {
            VerifyMode::Hash
        } else {
            VerifyMode::Size
        };
        cache_config.local_sources = if config.copy_local {
            LocalSources::Copy
        } else {
            LocalSources::InPlace
        };
        info!(
            dataset = %locations.first().map(|l| l.url()).unwrap_or_default(),
            streams = locations.len(), shards = loaded.shards.len(),
            samples = shape.num_samples(), epoch = shape.epoch_len(),
            cache = %cache_dir.display(), memory_limit = memory.engine, "dataset opened"
        );
        Ok(StreamingDataset {
            inner: Arc::new(Inner {
                locations,
                reopen,
                index_json,
                columns,
                shape,
                shards: loaded.shards,
                cache_dir,
                cache_config,
                memory,
                metrics: Metrics::default(),
                publisher: Publisher::default(),
                proc: ProcSlot::default(),
                max_shard_bytes: loaded.max_shard_bytes,
                retry_window_ms: AtomicU64::new(retry_window.as_millis() as u64),
                verified_local: Mutex::default(),
                read_buffers: crate::buffers::BufferPool::for_read_pool(memory.read_pool),
                index_copies: Mutex::new(index_copies),
                recent: Mutex::default(),
            }),
        })
    }

    /// Samples in the dataset.
    pub fn num_samples(&self) -> u64 {
        self.inner.shape.num_samples()
    }

    /// Shards in the dataset.
    pub fn num_shards(&self) -> usize {
        self.inner.shards.len()
    }

    /// The per-shard sample counts, as the sample order needs them.
    pub fn shape(&self) -> &DatasetShape {
        &self.inner.shape
    }

    /// `(name, encoding)` of each column, in index order.
    pub fn columns(&self) -> &[(String, String)] {
        &self.inner.columns
    }

    /// The raw `index.json` bytes as stored.
    pub fn index_json(&self) -> &[u8] {
        &self.inner.index_json
    }

    /// `(shard, index within shard)` of a global sample id.
    pub fn shard_of(&self, sample: u64) -> Option<(usize, u64)> {
        let shards = &self.inner.shards;
        let i = shards
            .partition_point(|s| s.first_sample <= sample)
            .checked_sub(1)?;
        let s = shards.get(i)?;
        (sample < s.first_sample + s.samples).then(|| (i, sample - s.first_sample))
    }

    /// The node's cache folder for this dataset.
    pub fn cache_dir(&self) -> &Path {
        &self.inner.cache_dir
    }

    /// The shard's name in messages (its URL, or its path when local).
    pub fn shard_name(&self, shard: usize) -> Option<&str> {
        self.inner.shards.get(shard).map(|s| &*s.name)
    }

    /// Largest bytes one shard takes in the cache (decompressed, plus compressed while it is
    /// being decompressed; 0 when read in place).
    pub fn max_shard_cache_bytes(&self) -> u64 {
        self.inner.max_shard_bytes
    }

    /// Shard `shard`, fetched once per node through the cache and decompressed; pinned (never
    /// evicted) while the handle lives. Blocking. When this process downloads it and no hash is
    /// to be checked, the handle comes back once the header and offset table are on disk, and
    /// its reads wait for the bytes they need ([`ShardHandle::is_complete`]).
    pub fn shard(&self, shard: usize) -> Result<ShardHandle> {
        let ps = self.proc()?;
        let fut = engine::open_shard(Arc::clone(&self.inner), Arc::clone(&ps), shard);
        ps.block_on(fut)
    }

    /// Sample `index` (global id), fetching its shard if needed. Blocking.
    ///
    /// The shard stays open for the next calls (up to [`RECENT_SHARDS`] of them, and no more
    /// than a sixteenth of the cache limit, pinned meanwhile; see `Inner::keep_recent`), and a
    /// shard that needs no download (read in place, or complete in the node's cache) is opened
    /// on the calling thread: through the engine, an open cost about 180 µs of thread hops,
    /// where reading a 10 KB sample costs a few µs.
    pub fn sample(&self, index: u64) -> Result<RawSample> {
        let (shard, i) = self.shard_of(index).ok_or(StreamerError::OutOfRange {
            what: "sample",
            index,
            len: self.num_samples(),
        })?;
        if let Some(kept) = self.inner.recent_shard(shard) {
            match kept.sample(i) {
                Ok(sample) => return Ok(sample),
                // A download that failed under it, or a file gone bad: opened afresh below.
                Err(_) => self.inner.forget_recent(Some(shard)),
            }
        }
        let handle = match self.open_now(shard) {
            Some(h) => h,
            None => {
                // This may fetch, and so need cache space: this process's kept pins go first.
                self.inner.forget_recent(None);
                let h = self.shard(shard)?;
                self.inner.keep_recent(h.clone());
                h
            }
        };
        handle.sample(i)
    }

    /// Sample `index` if that needs neither the network nor a wait for another process: its
    /// shard kept open by [`Self::sample`] with the sample's bytes on disk, or openable on this
    /// thread (read in place, or complete in the node's cache). `None` otherwise, for an index
    /// out of range, and on an error: [`Self::sample`] then does what it takes and reports it.
    pub fn sample_now(&self, index: u64) -> Option<RawSample> {
        let (shard, i) = self.shard_of(index)?;
        let handle = match self.inner.recent_shard(shard) {
            Some(h) => h,
            None => self.open_now(shard)?,
        };
        let range = handle.sample_range(i).ok()?;
        if handle.readable() < range.end {
            return None;
        }
        let sample = handle.sample(i).ok();
        if sample.is_none() {
            self.inner.forget_recent(Some(shard));
        }
        sample
    }

    /// [`engine::open_now`] in this process's engine, if it has started (starting one opens
    /// the cache folder, which may wait for another process's recovery of it); the handle is
    /// kept for the next calls.
    fn open_now(&self, shard: usize) -> Option<ShardHandle> {
        let ps = self.inner.proc.peek()?;
        let handle = engine::open_now(&self.inner, &ps, shard)?;
        self.inner.keep_recent(handle.clone());
        Some(handle)
    }

    /// A prefetching iterator over one rank's part of an epoch. Lets go of the shards random
    /// access kept open in this process: the stream needs the cache's room.
    pub fn stream(&self, plan: StreamPlan) -> Result<SampleStream> {
        self.inner.forget_recent(None);
        SampleStream::new(Arc::clone(&self.inner), self.proc()?, plan)
    }

    /// Starts downloading, in the background of this process, the shards that the first
    /// samples of `plan`'s part need, in the order it needs them: at most `max_shards`, and
    /// within the disk allowance a stream prefetches in (`cache_limit / 2`, at least one shard).
    /// Whatever streams that part later (this process, or DataLoader workers forked or spawned
    /// after this call) finds them in the node's cache or joins them as they arrive. Returns at
    /// once; a plan with nothing to download (a cache-free local dataset) starts no thread.
    /// See the `prefetch` module for the details.
    pub fn prefetch(&self, plan: StreamPlan, max_shards: usize) -> Result<Prefetch> {
        self.inner.forget_recent(None); // as `stream`: the downloads need the room
        let allowance = (self.inner.cache_config.limit_bytes / 2).max(self.inner.max_shard_bytes);
        let shards = prefetch::shards_for(&self.inner, &plan, max_shards, allowance)?;
        if shards.is_empty() {
            return Ok(prefetch::nothing());
        }
        let ps = self.proc()?;
        Ok(prefetch::start(Arc::clone(&self.inner), ps, shards))
    }

    /// Sets the retry window ([`StreamingConfig::retry_window`]) for fetches started from now
    /// on. The storage client's own per-request retries keep the window the dataset was opened
    /// with.
    pub fn set_retry_window(&self, window: Duration) {
        self.inner
            .retry_window_ms
            .store(window.as_millis() as u64, Ordering::Relaxed);
    }

    /// The counters of this process.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.snapshot()
    }

    /// Bytes of shard files in the node's cache folder now (counts the folder).
    pub fn cache_usage(&self) -> Result<u64> {
        Ok(self.proc()?.cache.usage()?)
    }

    fn proc(&self) -> Result<Arc<engine::ProcState>> {
        let inner = &self.inner;
        let engine =
            inner
                .proc
                .get(&inner.cache_dir, &inner.cache_config, &inner.memory, || {
                    inner.fresh_locations()
                })?;
        inner.save_index_copies(&engine);
        if inner.publisher.start(&inner.cache_dir, || inner.snapshot()) {
            engine.spawn(metrics::publish_every_second(Arc::downgrade(inner)));
        }
        Ok(engine)
    }
}

impl Inner {
    /// The kept handle of `shard`, if any. `try_lock`: a list locked at a fork stays locked in
    /// the child, which then opens shards afresh.
    fn recent_shard(&self, shard: usize) -> Option<ShardHandle> {
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
    fn keep_recent(&self, handle: ShardHandle) {
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
    fn forget_recent(&self, shard: Option<usize>) {
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
    fn fresh_locations(&self) -> Result<Vec<Location>> {
        self.locations
            .iter()
            .zip(&self.reopen)
            .map(|(loc, again)| match again {
                Some((url, split)) => {
                    let fresh = open_url(url, self.retry_window())?;
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

/// A stream as `open_streams_at` takes it: location, split, weight, and how to reopen it.
type Stream = (
    Location,
    Option<String>,
    Weight,
    Option<(String, Option<String>)>,
);

/// One dataset of a mix, for [`StreamingDataset::open_streams`] (Mosaic's `Stream`).
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Its root (as [`StreamingConfig::remote`]).
    pub remote: String,
    /// Its subfolder.
    pub split: Option<String>,
    /// How much of each epoch it gives.
    pub weight: Weight,
    /// A location built by the caller (custom options, a test server); else `remote` is opened.
    pub location: Option<Location>,
}

/// The shards of the streams read so far.
#[derive(Default)]
struct Loaded {
    shards: Vec<ShardSource>,
    first_sample: u64,
    max_shard_bytes: u64,
    first_columns: Vec<(String, String)>,
}

impl Loaded {
    /// Adds stream `stream` from its `index.json` bytes; returns its per-shard sample counts.
    fn add_stream(
        &mut self,
        config: &StreamingConfig,
        location: &Location,
        stream: usize,
        index: &Index,
    ) -> Result<Vec<u64>> {
        let index_name = location.url_of("index.json");
        let in_place = location.local_root().is_some() && !config.copy_local;
        if let Some(s) = index.shards.first() {
            let cols = s
                .column_names
                .iter()
                .cloned()
                .zip(s.column_encodings.iter().cloned())
                .collect();
            if stream == 0 {
                self.first_columns = cols;
            }
        }
        let mut counts = Vec::with_capacity(index.shards.len());
        let mut prev_columns: Option<Arc<Columns>> = None;
        for info in &index.shards {
            let columns = Columns::from_shard_info(&index_name, info, config.allow_unsafe_types)?;
            let columns = match prev_columns {
                Some(prev) if *prev == columns => prev,
                _ => Arc::new(columns),
            };
            prev_columns = Some(Arc::clone(&columns));
            let compression = info.compression()?;
            let hash =
                |file: &FileInfo| config.validate_hash.then(|| expected_hash(file)).flatten();
            let raw_local = match location.local_path(&info.raw_data.basename)? {
                Some(p) if p.is_file() => Some(p),
                _ => None,
            };
            let (stored, algorithm) = match (&info.zip_data, compression) {
                (Some(zip), Some(c)) if raw_local.is_none() => (zip, Some(c.algorithm())),
                _ => (&info.raw_data, None),
            };
            let local_stored = location.local_path(&stored.basename)?;
            let name: Arc<str> = match &local_stored {
                Some(p) => Arc::from(p.display().to_string()),
                None => Arc::from(location.url_of(&stored.basename)),
            };
            // Bytes the shard takes in the cache: decompressed, plus compressed while it is
            // being decompressed; nothing when it is read in place.
            let cached = match (in_place, raw_local.is_some(), algorithm) {
                (true, true, _) => 0,
                (true, false, _) => info.raw_data.bytes,
                (false, _, Some(_)) => info.raw_data.bytes + stored.bytes,
                (false, _, None) => info.raw_data.bytes,
            };
            self.max_shard_bytes = self.max_shard_bytes.max(cached);
            self.shards.push(ShardSource {
                name,
                stream,
                stored_rel: stored.basename.clone(),
                stored_size: stored.bytes,
                stored_hash: hash(stored),
                algorithm,
                raw_size: info.raw_data.bytes,
                raw_hash: hash(&info.raw_data),
                local_raw: raw_local.filter(|_| in_place),
                local_stored: local_stored.filter(|_| in_place),
                samples: info.samples,
                first_sample: self.first_sample,
                cache_bytes: cached,
                columns,
            });
            counts.push(info.samples);
            self.first_sample += info.samples;
        }
        Ok(counts)
    }
}

/// A stream's `index.json`, as bytes, parsed, and whether it came from the store. A remote
/// index comes from its copy in the node's cache folder `copies` when there is one that parses
/// (see `crate::cache::read_index_copy`), else from the store. A local index is always read
/// where it is.
fn load_index(location: &Location, copies: Option<&Path>) -> Result<(Vec<u8>, Index, bool)> {
    let name = location.url_of("index.json");
    let copies = copies.filter(|_| location.local_root().is_none());
    if let Some(dir) = copies {
        match read_index_copy(dir, &name) {
            Ok(Some(json)) => match Index::from_json(&name, &json) {
                Ok(index) => {
                    debug!(index = %name, cache = %dir.display(), "index read from its copy");
                    return Ok((json, index, false));
                }
                Err(e) => {
                    warn!(index = %name, cache = %dir.display(), error = %e,
                        "the copy of the index does not parse; reading the store again");
                    if let Err(e) = remove_index_copy(dir, &name) {
                        warn!(error = %e, "cannot remove the copy of the index");
                    }
                }
            },
            Ok(None) => {}
            Err(e) => warn!(index = %name, error = %e, "cannot read the copy of the index"),
        }
    }
    let json = read_index(location)?;
    let index = Index::from_json(&name, &json)?;
    Ok((json, index, true))
}

/// Keeps a remote index read from the store in the node's cache folder for the next opens,
/// unless the folder has that copy already (a forked DataLoader worker of a parent that never
/// iterated saves what its siblings saved); a failure only costs those opens a GET.
fn keep_index_copy(copy: &IndexCopy) {
    if read_index_copy(&copy.dir, &copy.url).is_ok_and(|kept| kept.as_ref() == Some(&copy.json)) {
        return;
    }
    match save_index_copy(&copy.dir, &copy.url, &copy.json) {
        Ok(()) => debug!(index = %copy.url, cache = %copy.dir.display(), "index copied"),
        Err(e) => warn!(index = %copy.url, cache = %copy.dir.display(), error = %e,
            "cannot keep a copy of the index; the next open reads the store again"),
    }
}

fn read_index(location: &Location) -> Result<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StreamerError::Engine(format!("cannot start a runtime: {e}")))?;
    // A runtime of this thread only, dropped before returning: no thread outlives `open`, so a
    // fork right after it is safe.
    let location = location.clone();
    rt.block_on(async move {
        // The index is read whole: its size (untrusted) is checked against the cap from the
        // first response, before the rest is fetched.
        let url = location.url_of("index.json");
        let limit = shardstream_sharding::index_file::max_index_bytes();
        match location.get_at_most("index.json", limit).await {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(StorageError::TooLarge { size, limit, .. }) => {
                Err(shardstream_sharding::index_file::oversized_index(&url, size, limit).into())
            }
            Err(StorageError::NotFound { url }) => Err(StreamerError::NotFound { what: url }),
            Err(e) => Err(e.into()),
        }
    })
}

/// Opens a dataset URL with the storage client's own retries clamped to the retry window, so
/// that the two retry levels do not add up (see [`StreamingConfig::retry_window`]).
fn open_url(url: &str, retry_window: Duration) -> Result<Location> {
    let mut options = StorageOptions::default();
    options.retry.retry_timeout = options.retry.retry_timeout.min(retry_window);
    Ok(Location::open_with(url, &options, &Env::from_process())?)
}

/// What keys a dataset's cache folder when no launcher names the run.
#[derive(Debug, Clone, Copy)]
enum CacheKey<'a> {
    /// The datasets' URLs: the run id is derived from them and the user
    /// (`shardstream_identity::derived_run_id`), `<root>/auto-<hash>/<node_rank>/`.
    Dataset(&'a str),
    /// A dataset made only of local paths, read in place: it downloads nothing, so it needs no
    /// run at all: `<root>/in-place-<hash>/`, which holds the cache's lock files and, for
    /// compressed shards, their decompressed copies (shared by the runs of the node that read the
    /// same files).
    InPlace(&'a str),
}

/// The node's cache folder: `local`, else `<root>/<run_id>/<node_rank>/` as
/// `shardstream_identity::locate` finds it (docs/cache.md), with `key` naming the run when
/// nothing else does.
fn resolve_cache_dir(config: &StreamingConfig, key: CacheKey<'_>) -> Result<PathBuf> {
    let node_rank = match config.node_rank {
        Some(r) => Some(u32::try_from(r).map_err(|_| StreamerError::InvalidConfig {
            setting: "node_rank",
            reason: format!("{r} is larger than 2^32 - 1"),
        })?),
        None => None,
    };
    let overrides = CacheOverrides {
        cache_dir: config.local.clone(),
        cache_root: config.cache_root.clone(),
        run: Overrides {
            run_id: config.run_id.clone(),
            node_rank,
            fallback_run_id: match key {
                CacheKey::Dataset(urls) => Some(derived_run_id(urls, &os_env)),
                CacheKey::InPlace(_) => None,
            },
        },
    };
    match locate(&overrides, &os_env) {
        Ok(dir) => Ok(dir),
        Err(e) => {
            if let CacheKey::InPlace(key) = key {
                let root =
                    cache_root(&overrides, &os_env).map_err(|e| StreamerError::InvalidConfig {
                        setting: "cache_root",
                        reason: e.to_string(),
                    })?;
                let dir = root.join(format!("in-place-{:016x}", stable_hash(key.as_bytes())));
                debug!(dir = %dir.display(), reason = %e, "local dataset read in place: no run id needed");
                return Ok(dir);
            }
            Err(StreamerError::InvalidConfig {
                setting: "run_id / node_rank",
                reason: e.to_string(),
            })
        }
    }
}

fn expected_hash(file: &FileInfo) -> Option<ExpectedHash> {
    file.hashes.iter().find_map(|(name, hex)| {
        HashAlgorithm::parse(name)
            .ok()
            .map(|algorithm| ExpectedHash {
                algorithm,
                hex: hex.clone(),
            })
    })
}
