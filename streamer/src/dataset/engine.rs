//! The fetch engine: the per-process tokio runtime and cache handle, and the steps that put one
//! shard, decompressed, on the node's disk.
//!
//! - The runtime and the cache handle are created lazily, per process: a dataset opened before
//!   `fork` (Python DataLoader workers) builds new ones in the child on first use. The parent's
//!   copies are leaked in the child, never dropped there: dropping them would join threads that
//!   do not exist in the child and unlock the parent's `flock`s, which the child shares.
//! - A download is a series of ranged GETs of `chunk` bytes, `concurrency` at a time, each chunk
//!   taking its size from the memory budget before its request is sent and giving it back once
//!   its bytes are written (`pwrite`) at their offset of the cache's temp file. So a shard of
//!   any size costs at most `concurrency x chunk` bytes of RAM, and never more than the budget.
//! - Compressed shards (zstd, gzip) are decompressed as a stream from the cached compressed file
//!   into the decompressed entry's temp file; other algorithms decompress in memory, charged to
//!   the budget.
//! - Transient storage failures are retried with backoff for up to [`RETRY_WINDOW`]; a download
//!   whose size or hash is wrong is retried [`DAMAGED_ATTEMPTS`] times, then reported naming the
//!   shard.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use shardstream_sharding::compression::Algorithm;
use shardstream_storage::Location;
use tokio::runtime::Runtime;
use tracing::{debug, warn};

use super::budget::Budget;
use super::metrics::Metrics;
use super::shard::ShardHandle;
use super::Inner;
use crate::cache::{Begin, Cache, CacheConfig, CacheError, ExpectedHash, ShardLease, ShardSpec};
use crate::error::{Result, StreamerError};

/// How long transient storage failures of one shard are retried before the error is returned.
pub(crate) const RETRY_WINDOW: Duration = Duration::from_secs(120);
/// Attempts at a shard whose download had the wrong size or hash.
pub(crate) const DAMAGED_ATTEMPTS: u32 = 3;
/// Bytes charged to the budget for a streaming decompressor's buffers and window.
const DECODER_BYTES: u64 = 4 << 20;

/// What one process needs to fetch: its runtime, its cache handle, and its storage clients.
#[derive(Debug)]
pub(crate) struct ProcState {
    pub pid: u32,
    pub rt: Runtime,
    pub cache: Cache,
    /// One per stream. Opened again in each process when the dataset was opened by URL: an
    /// HTTP connection pool inherited through fork holds the parent's sockets and tasks.
    pub locations: Vec<Location>,
}

/// The per-process state slot of a dataset.
#[derive(Debug, Default)]
pub(crate) struct ProcSlot {
    slot: Mutex<Option<Arc<ProcState>>>,
}

impl ProcSlot {
    /// This process's state if it exists already (for metrics: never starts an engine).
    pub(crate) fn peek(&self) -> Option<Arc<ProcState>> {
        let slot = self.slot.lock().ok()?;
        slot.as_ref()
            .filter(|s| s.pid == std::process::id())
            .map(Arc::clone)
    }

    /// This process's state, created on first use and again after a fork.
    pub(crate) fn get(
        &self,
        dir: &Path,
        config: &CacheConfig,
        locations: impl FnOnce() -> Result<Vec<Location>>,
    ) -> Result<Arc<ProcState>> {
        let pid = std::process::id();
        let mut slot = self
            .slot
            .lock()
            .map_err(|_| StreamerError::Engine("state lock poisoned".into()))?;
        if let Some(state) = slot.as_ref() {
            if state.pid == pid {
                return Ok(Arc::clone(state));
            }
        }
        if let Some(stale) = slot.take() {
            // Inherited from the parent: see the module docs for why it is leaked.
            debug!(
                parent = stale.pid,
                pid, "forked: starting a new fetch engine"
            );
            std::mem::forget(stale);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardstream-fetch")
            .enable_all()
            .build()
            .map_err(|e| StreamerError::Engine(format!("cannot start the runtime: {e}")))?;
        let cache = Cache::open(dir, config.clone())?;
        let locations = locations()?;
        let state = Arc::new(ProcState {
            pid,
            rt,
            cache,
            locations,
        });
        *slot = Some(Arc::clone(&state));
        Ok(state)
    }
}

impl ProcState {
    /// Runs `fut` on the engine's runtime and waits for it from a plain thread.
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let task = self.rt.spawn(fut);
        futures::executor::block_on(task)
            .map_err(|e| StreamerError::Engine(format!("fetch task failed: {e}")))?
    }
}

/// Where one shard's bytes come from, resolved at open from the index.
#[derive(Debug, Clone)]
pub(crate) struct ShardSource {
    /// The shard's URL (or local path), for messages and as its cache key.
    pub name: Arc<str>,
    /// The stream (dataset) it belongs to: an index into the dataset's locations.
    pub stream: usize,
    /// The file to fetch, relative to the dataset location (compressed when `algorithm` is set).
    pub stored_rel: String,
    pub stored_size: u64,
    pub stored_hash: Option<ExpectedHash>,
    /// Set when the stored file must be decompressed.
    pub algorithm: Option<Algorithm>,
    pub raw_size: u64,
    pub raw_hash: Option<ExpectedHash>,
    /// The decompressed file, when it is local and read in place.
    pub local_raw: Option<PathBuf>,
    /// The compressed file, when it is local.
    pub local_stored: Option<PathBuf>,
    pub samples: u64,
    pub first_sample: u64,
    /// Bytes it takes in the cache (0 when read in place).
    pub cache_bytes: u64,
    pub columns: Arc<shardstream_sharding::mds::Columns>,
}

/// Fetches (or finds) shard `shard` and opens it, retrying as the module docs say.
pub(crate) async fn open_shard(
    ds: Arc<Inner>,
    ps: Arc<ProcState>,
    shard: usize,
) -> Result<ShardHandle> {
    let src = ds
        .shards
        .get(shard)
        .cloned()
        .ok_or(StreamerError::OutOfRange {
            what: "shard",
            index: shard as u64,
            len: ds.shards.len() as u64,
        })?;
    let start = Instant::now();
    let mut damaged = 0u32;
    let mut backoff = Duration::from_millis(200);
    loop {
        match try_open(&ds, &ps, shard, &src).await {
            Ok(handle) => return Ok(handle),
            Err(e) if e.is_transient() && start.elapsed() < RETRY_WINDOW => {
                warn!(shard = %src.name, error = %e, "fetch failed; retrying");
            }
            Err(e) if is_damaged(&e) => {
                damaged += 1;
                if damaged >= DAMAGED_ATTEMPTS {
                    return Err(named(e, &src.name));
                }
                warn!(shard = %src.name, error = %e, attempt = damaged, "damaged download; fetching again");
            }
            Err(e) => return Err(named(e, &src.name)),
        }
        Metrics::add(&ds.metrics.fetch_retries, 1);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn is_damaged(e: &StreamerError) -> bool {
    matches!(
        e,
        StreamerError::Cache(CacheError::SizeMismatch { .. } | CacheError::HashMismatch { .. })
    ) || matches!(e, StreamerError::Cache(CacheError::Fetch { source, .. })
        if source.downcast_ref::<StreamerError>().is_some_and(|s| matches!(s, StreamerError::Corrupt { .. })))
}

/// Turns cache-level damage reports into errors that name the shard as the index does.
fn named(e: StreamerError, name: &str) -> StreamerError {
    match e {
        StreamerError::Cache(CacheError::HashMismatch {
            algorithm,
            expected,
            actual,
            ..
        }) => StreamerError::HashMismatch {
            what: name.to_string(),
            algorithm,
            expected,
            actual,
        },
        StreamerError::Cache(CacheError::SizeMismatch {
            expected, actual, ..
        }) => StreamerError::Corrupt {
            what: name.to_string(),
            reason: format!("expected {expected} bytes, got {actual}"),
        },
        StreamerError::Storage(shardstream_storage::StorageError::NotFound { url }) => {
            StreamerError::NotFound { what: url }
        }
        StreamerError::Cache(CacheError::Fetch { source, key }) => {
            match source.downcast::<StreamerError>() {
                Ok(inner) => named(*inner, name),
                Err(source) => StreamerError::Cache(CacheError::Fetch { key, source }),
            }
        }
        other => other,
    }
}

async fn try_open(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    shard: usize,
    src: &ShardSource,
) -> Result<ShardHandle> {
    let lease = match (&src.local_raw, src.algorithm) {
        (Some(path), _) => {
            let (cache, path, size, hash) = (
                ps.cache.clone(),
                path.clone(),
                src.raw_size,
                src.raw_hash.clone(),
            );
            blocking(move || Ok(cache.acquire_local(&path, size, hash)?)).await?
        }
        (None, None) => acquire_stored(ds, ps, src).await?,
        (None, Some(algorithm)) => {
            let spec = ShardSpec {
                key: format!("{}#raw", src.name),
                size: src.raw_size,
                hash: src.raw_hash.clone(),
            };
            match begin(ps, spec).await? {
                Begin::Hit(lease) => lease,
                Begin::Fetch(guard) => {
                    let stored = acquire_stored(ds, ps, src).await?;
                    let tmp = guard.tmp_path().to_path_buf();
                    let what = src.name.clone();
                    let raw_size = src.raw_size;
                    let budget = ds.budget.clone();
                    let result = blocking(move || {
                        decompress(algorithm, stored.path(), &tmp, raw_size, &what, &budget)
                    })
                    .await;
                    match result {
                        Ok(()) => blocking(move || Ok(guard.commit()?)).await?,
                        Err(e) => {
                            drop(guard);
                            return Err(e);
                        }
                    }
                }
            }
        }
    };
    let (name, columns) = (src.name.clone(), Arc::clone(&src.columns));
    let (samples, first) = (src.samples, src.first_sample);
    blocking(move || ShardHandle::open(shard, name, lease, columns, samples, first)).await
}

async fn begin(ps: &Arc<ProcState>, spec: ShardSpec) -> Result<Begin> {
    let cache = ps.cache.clone();
    blocking(move || Ok(cache.begin(&spec)?)).await
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StreamerError::Engine(format!("blocking task failed: {e}")))?
}

/// The stored file (compressed or not) in the cache, or in place when it is local.
async fn acquire_stored(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    src: &ShardSource,
) -> Result<ShardLease> {
    if let Some(path) = &src.local_stored {
        let (cache, path, size, hash) = (
            ps.cache.clone(),
            path.clone(),
            src.stored_size,
            src.stored_hash.clone(),
        );
        return blocking(move || Ok(cache.acquire_local(&path, size, hash)?)).await;
    }
    let spec = ShardSpec {
        key: src.name.to_string(),
        size: src.stored_size,
        hash: src.stored_hash.clone(),
    };
    match begin(ps, spec).await? {
        Begin::Hit(lease) => Ok(lease),
        Begin::Fetch(guard) => {
            let location = ps.locations.get(src.stream).ok_or_else(|| {
                StreamerError::Engine(format!("shard {} has no stream {}", src.name, src.stream))
            })?;
            download(
                ds,
                location,
                &src.stored_rel,
                src.stored_size,
                guard.tmp_path(),
            )
            .await?;
            Metrics::add(&ds.metrics.shards_fetched, 1);
            blocking(move || Ok(guard.commit()?)).await
        }
    }
}

/// Writes `rel` (of `size` bytes) to `dest` with parallel ranged GETs under the memory budget.
pub(crate) async fn download(
    ds: &Arc<Inner>,
    location: &Location,
    rel: &str,
    size: u64,
    dest: &Path,
) -> Result<()> {
    let io = |op, source| StreamerError::Io {
        op,
        path: dest.to_path_buf(),
        source,
    };
    let file = File::options()
        .write(true)
        .open(dest)
        .map_err(|e| io("open download", e))?;
    file.set_len(size).map_err(|e| io("size download", e))?;
    let file = Arc::new(file);
    let chunk = ds.chunk_bytes.max(1);
    let ranges: Vec<(u64, u64)> = (0..size.div_ceil(chunk))
        .map(|i| (i * chunk, ((i + 1) * chunk).min(size)))
        .collect();
    let concurrency = location.options().concurrency.max(1);
    futures::stream::iter(ranges)
        .map(|(lo, hi)| {
            let (ds, file, rel) = (Arc::clone(ds), Arc::clone(&file), rel.to_string());
            let location = location.clone();
            let dest = dest.to_path_buf();
            async move {
                let what = || format!("a {}-byte chunk of {rel}", hi - lo);
                let lease = ds.budget.acquire(&what, hi - lo).await?;
                let bytes = get_range(&location, &rel, lo..hi, &ds.metrics).await?;
                if bytes.len() as u64 != hi - lo {
                    return Err(StreamerError::Corrupt {
                        what: location.url_of(&rel),
                        reason: format!(
                            "range {lo}..{hi} returned {} bytes; the object is shorter than the index says",
                            bytes.len()
                        ),
                    });
                }
                Metrics::add(&ds.metrics.fetch_bytes, bytes.len() as u64);
                blocking(move || {
                    file.write_all_at(&bytes, lo).map_err(|source| StreamerError::Io {
                        op: "write download",
                        path: dest,
                        source,
                    })?;
                    drop(lease);
                    Ok(())
                })
                .await
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// One ranged GET, retried through transient failures (a server that is down for a while).
async fn get_range(
    location: &Location,
    rel: &str,
    range: std::ops::Range<u64>,
    metrics: &Metrics,
) -> Result<bytes::Bytes> {
    let start = Instant::now();
    let mut backoff = Duration::from_millis(200);
    loop {
        Metrics::add(&metrics.fetch_requests, 1);
        match location.get_range(rel, range.clone()).await {
            Ok(bytes) => return Ok(bytes),
            Err(e) if e.is_transient() && start.elapsed() < RETRY_WINDOW => {
                warn!(url = %location.url_of(rel), error = %e, "ranged GET failed; retrying");
                Metrics::add(&metrics.fetch_retries, 1);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Decompresses `src` into `dst`, producing exactly `raw_size` bytes.
fn decompress(
    algorithm: Algorithm,
    src: &Path,
    dst: &Path,
    raw_size: u64,
    what: &str,
    budget: &Budget,
) -> Result<()> {
    let io = |op, path: &Path| {
        let path = path.to_path_buf();
        move |source| StreamerError::Io { op, path, source }
    };
    let corrupt = |reason: String| StreamerError::Corrupt {
        what: what.to_string(),
        reason,
    };
    let input = File::open(src).map_err(io("open", src))?;
    let mut out = File::options()
        .write(true)
        .truncate(true)
        .open(dst)
        .map_err(io("open", dst))?;
    let label = || format!("decompressing {what}");
    let written = match algorithm {
        Algorithm::Zstd | Algorithm::Gzip => {
            let _lease = budget.acquire_blocking(&label, DECODER_BYTES.min(budget.limit()))?;
            let reader = BufReader::with_capacity(1 << 20, input);
            let mut decoder: Box<dyn Read> = match algorithm {
                Algorithm::Zstd => Box::new(
                    zstd::stream::read::Decoder::with_buffer(reader)
                        .map_err(|e| corrupt(format!("zstd: {e}")))?,
                ),
                _ => Box::new(flate2::bufread::MultiGzDecoder::new(reader)),
            };
            let mut limited = (&mut decoder).take(raw_size + 1);
            std::io::copy(&mut limited, &mut out)
                .map_err(|e| corrupt(format!("decompress: {e}")))?
        }
        other => {
            let stored_len = input.metadata().map_err(io("stat", src))?.len();
            let _lease = budget.acquire_blocking(&label, stored_len + raw_size)?;
            let mut data = Vec::new();
            BufReader::new(input)
                .read_to_end(&mut data)
                .map_err(io("read", src))?;
            let raw = shardstream_sharding::compression::decompress(other, &data, what, raw_size)?;
            out.write_all(&raw).map_err(io("write", dst))?;
            raw.len() as u64
        }
    };
    if written != raw_size {
        return Err(corrupt(format!(
            "decompresses to {written} bytes or more, the index records {raw_size}"
        )));
    }
    Ok(())
}
