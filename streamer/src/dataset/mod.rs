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
mod config;
mod decode;
mod engine;
mod fetch;
mod format;
mod growing;
mod index;
mod inner;
mod manage;
mod metrics;
mod prefetch;
mod proc;
mod shard;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardstream_identity::{
    cache_root, derived_run_id, locate, os_env, stable_hash, stable_hash_from, CacheOverrides,
    Overrides, STABLE_HASH_START,
};
use shardstream_storage::Location;
use tracing::{debug, info};

use crate::cache::{CacheConfig, LocalSources, VerifyMode};
use crate::error::{Result, StreamerError};
use crate::order::{DatasetShape, StreamShape, Weight};

pub use fetch::{parts as fetch_parts, PART_BYTES, WRITE_BYTES};
pub use format::{LitFields, SampleSchema, ShardFormat, WdsFields};
pub use manage::{SampleFile, ShardInfo};
pub use metrics::{
    node_metrics, node_sum, publishing_enabled, Counters, MetricsSnapshot, NamedCounters, NodeSum,
    ProcessCounters, Publisher, METRICS_DIR, NODE_METRICS_ENV,
};
pub use prefetch::{Prefetch, PrefetchReport};
pub(crate) use proc::hold_proc_slots;
pub use shard::{RawSample, ShardHandle};
pub use stream::{DeferredSample, SampleStream, StreamItem, StreamPlan, StreamedSample};

use config::open_url;
pub use config::StreamingConfig;
use index::Loaded;
pub use index::StreamSpec;
use index::{IndexCopy, MdsIndex};
use inner::IndexJson;
pub(crate) use inner::Inner;
use metrics::Metrics;
use proc::ProcSlot;
use shardstream_sharding::mds::index_bin;

use crate::memory::MemoryPlan;
pub use crate::memory::{DEFAULT_MEMORY_LIMIT, MAX_CHUNK_BYTES, RUN_BYTES};
use crate::settings;
pub use crate::settings::{DEFAULT_RETRY_WINDOW, RETRY_WINDOW_ENV};

/// A dataset opened for streaming. `Send + Sync`; share it with `Arc`.
#[derive(Debug, Clone)]
pub struct StreamingDataset {
    inner: Arc<Inner>,
}

impl StreamingDataset {
    /// Opens a dataset: reads and checks `index.json` (no shard is downloaded), and works out
    /// the cache folder. Blocking.
    pub fn open(config: StreamingConfig) -> Result<Self> {
        let url = format::split_url(&config.remote)?;
        let location = open_url(&url.root, &config.storage_options, config.retry_window())?;
        let reopen = Some((
            url.root,
            config.split.clone(),
            config.storage_options.clone(),
        ));
        let split = config.split.clone();
        Self::open_streams_at(
            config,
            vec![(location, split, Weight::Natural, reopen, url.tars)],
            None,
        )
    }

    /// [`StreamingDataset::open`] with a [`Location`] built by the caller (custom storage
    /// options, a test server); `config.remote` is then only used in messages.
    pub fn open_at(config: StreamingConfig, location: Location) -> Result<Self> {
        let split = config.split.clone();
        Self::open_streams_at(
            config,
            vec![(location, split, Weight::Natural, None, None)],
            None,
        )
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
            let (location, reopen, tars) = match spec.location {
                Some(l) => (l, None, None),
                None => {
                    let options: shardstream_storage::named_options::NamedOptions = config
                        .storage_options
                        .iter()
                        .chain(spec.storage_options.iter())
                        .cloned()
                        .collect::<Vec<_>>()
                        .into();
                    let url = format::split_url(&spec.remote)?;
                    (
                        open_url(&url.root, &options, config.retry_window())?,
                        Some((url.root, spec.split.clone(), options)),
                        url.tars,
                    )
                }
            };
            opened.push((location, spec.split, spec.weight, reopen, tars));
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
        let mut index_json = IndexJson::loaded(Vec::new());
        let mut columns = Vec::new();
        let mut opened = Vec::with_capacity(streams.len());
        for (location, split, weight, again, tars) in streams {
            reopen.push(again);
            let location = match &split {
                Some(split) => location.join(split)?,
                None => location,
            };
            opened.push((location, weight, tars));
        }
        // The node's folder, when a stream is remote: resolved without the index (`local`, or a
        // run id), it keeps copies of the remote indexes. Resolved once, and used below too.
        let any_remote = opened.iter().any(|(l, _, _)| l.local_root().is_none());
        // What names the run when no launcher does (a plain script, a notebook): the datasets'
        // URLs, so that the next run of the same script finds this one's cache.
        let urls: Vec<&str> = opened.iter().map(|(l, _, _)| l.url()).collect();
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
        for (i, (location, weight, tars)) in opened.into_iter().enumerate() {
            let (index, from_store) = match format::open_stream(
                &location,
                tars,
                config.format,
                copies,
                config.allow_unsafe_types,
            )? {
                format::Opened::Mds(index, from_store) => (index, from_store),
                format::Opened::LitData(json, index, fields) => {
                    if local_only {
                        indexes_hash = stable_hash_from(indexes_hash, &json);
                    }
                    let counts = loaded.add_lit_stream(&config, &location, i, &index, &fields)?;
                    if i == 0 {
                        index_json = IndexJson::loaded(json);
                    }
                    shapes.push((StreamShape::new(counts)?, weight));
                    locations.push(location);
                    continue;
                }
                format::Opened::Wds(tars) => {
                    // What the stream is: its tars' names, sizes and counts.
                    let json = serde_json::to_vec(&tars).unwrap_or_default();
                    if local_only {
                        indexes_hash = stable_hash_from(indexes_hash, &json);
                    }
                    let counts = loaded.add_wds_stream(&config, &location, i, &tars)?;
                    if i == 0 {
                        index_json = IndexJson::loaded(json);
                    }
                    shapes.push((StreamShape::new(counts)?, weight));
                    locations.push(location);
                    continue;
                }
            };
            if local_only {
                indexes_hash = stable_hash_from(indexes_hash, index.bytes());
            }
            let counts = loaded.add_stream(&config, &location, i, &index)?;
            // The file's bytes only from here on: the parse is dropped.
            let basename = index.basename();
            let binary = matches!(index, MdsIndex::Binary(_));
            let bytes = index.into_bytes();
            if i == 0 {
                columns = loaded.first_columns.clone();
                index_json = if binary {
                    IndexJson::lazy(
                        location.clone(),
                        &index_bin::header(&location.url_of(basename), &bytes)?,
                    )
                } else {
                    IndexJson::loaded(bytes.clone())
                };
            }
            let remote = location.local_root().is_none();
            if let (true, true, Some(dir)) = (from_store, remote, copies) {
                index_copies.push(IndexCopy {
                    dir: dir.to_path_buf(),
                    url: location.url_of(basename),
                    bytes,
                });
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
        if any_remote {
            // The node's processes share their throttling through this folder (request
            // shaping's node signal), as they share its cache.
            shardstream_storage::shaping::use_node_folder(&cache_dir);
        }
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

    /// The first stream's raw `index.json` bytes as stored. A dataset opened from its
    /// `index.ssx` fetches them on the first call (checked against what `index.ssx` mirrors).
    pub fn index_json(&self) -> Result<Arc<[u8]>> {
        self.inner.index_json.get()
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

    fn proc(&self) -> Result<Arc<proc::ProcState>> {
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

/// A stream as `open_streams_at` takes it: location, split, weight, how to reopen it, and the
/// WebDataset tars its URL named.
type Stream = (
    Location,
    Option<String>,
    Weight,
    Option<inner::Reopen>,
    Option<Vec<String>>,
);

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
