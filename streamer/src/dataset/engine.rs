//! The fetch engine: the per-process tokio runtime and cache handle, and the steps that put one
//! shard, decompressed, on the node's disk.
//!
//! - The cache handle is created lazily, per dataset and process, and the runtime once per
//!   process for all its datasets ([`crate::runtime`]): a dataset opened before `fork` (Python
//!   DataLoader workers) builds new ones in the child on first use. The parent's
//!   copies are leaked in the child, never dropped there: dropping them would join threads that
//!   do not exist in the child and unlock the parent's `flock`s, which the child shares.
//! - A shard is fetched ([`super::fetch`]) into the cache's temp file and decompressed
//!   ([`super::decode`]) if it is stored compressed. When the index records no hash to check
//!   (`validate_hash` off, the default), the shard is served while it arrives: [`open_shard`]
//!   returns once its header and offset table are on disk, a background task finishes the
//!   download and commits the file, and each read waits for the bytes it needs
//!   ([`super::growing`]). With `validate_hash` on, a shard is served only after its hash was
//!   checked, so never before it has fully arrived. Other processes of the node join such a
//!   download through the progress its temp file carries ([`crate::cache::progress`]): they
//!   read the same prefix instead of waiting for the commit, and fetch the rest themselves if
//!   the writer dies. Other shards they wait for on the shard's fetch lock.
//! - Transient storage failures are retried inside one window ([`super::fetch::Outage`],
//!   `StreamingConfig::retry_window`); a download whose size or hash is wrong, or whose object
//!   was replaced before its header was readable, is fetched again from its start
//!   [`DAMAGED_ATTEMPTS`] times, then reported naming the shard. One replaced after a reader
//!   got its handle fails that reader's waits with the error: its first samples were of the
//!   old version.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shardstream_sharding::compression::Algorithm;
use tracing::{debug, warn};

use super::decode::{self, decompress, read_head};
use super::fetch::{Fetch, Outage};
use super::growing::{self, Landing, Publisher};
use super::index::ShardSource;
use super::inner::Inner;
use super::metrics::Metrics;
use super::proc::{InFlight, ProcState};
use super::shard::ShardHandle;
use crate::cache::{progress, Begin, CacheError, ExpectedHash, FetchGuard, ShardLease, ShardSpec};
use crate::error::{Result, StreamerError};
use crate::runtime::blocking;

/// Attempts at a shard whose download had the wrong size or hash.
pub(crate) const DAMAGED_ATTEMPTS: u32 = 3;

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
    let outage = Arc::new(Outage::new(ds.retry_window()));
    let mut damaged = 0u32;
    let mut backoff = Duration::from_millis(200);
    loop {
        match try_open(&ds, &ps, shard, &src, &outage).await {
            Ok(handle) => return Ok(handle),
            // The ranged GETs retried already, under the same window: this only catches
            // failures outside them, and never restarts the window.
            Err(e) if e.is_transient() && !outage.expired() => {
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

/// A download that ended with bytes not to be kept (damaged, or of an object replaced while it
/// was read): fetched again from its start, a bounded number of times.
fn is_damaged(e: &StreamerError) -> bool {
    let refetch = |s: &StreamerError| {
        matches!(
            s,
            StreamerError::Corrupt { .. }
                | StreamerError::Storage(shardstream_storage::StorageError::Changed { .. })
        )
    };
    matches!(
        e,
        StreamerError::Cache(CacheError::SizeMismatch { .. } | CacheError::HashMismatch { .. })
    ) || matches!(
        e,
        StreamerError::Storage(shardstream_storage::StorageError::Changed { .. })
    ) || matches!(e, StreamerError::Cache(CacheError::Fetch { source, .. })
        if source.downcast_ref::<StreamerError>().is_some_and(refetch))
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
    outage: &Arc<Outage>,
) -> Result<ShardHandle> {
    if let Some(job) = ps.joinable(shard) {
        return open_growing(src, shard, job).await;
    }
    // With a hash to check, nothing is served before the check (at commit).
    let growable = src.stored_hash.is_none() && src.raw_hash.is_none();
    let lease = match (&src.local_raw, src.algorithm) {
        (Some(path), _) => local_lease(ds, ps, path, src.raw_size, &src.raw_hash).await?,
        (None, None) if growable && src.local_stored.is_none() => {
            match begin_or_join(ps, src).await? {
                Opening::Begin(Begin::Hit(lease)) => lease,
                Opening::Begin(Begin::Fetch(guard)) => {
                    return serve_growing(ds, ps, shard, src, Job::Plain(guard), outage).await;
                }
                Opening::Join(file, tmp) => {
                    return join_growing(ds, ps, shard, src, (file, tmp), outage).await;
                }
            }
        }
        (None, None) => match begin_stored(ds, ps, src).await? {
            Begin::Hit(lease) => lease,
            Begin::Fetch(guard) if growable => {
                return serve_growing(ds, ps, shard, src, Job::Plain(guard), outage).await;
            }
            Begin::Fetch(guard) => fetch_stored(ds, ps, src, guard, None, outage).await?,
        },
        (None, Some(algorithm)) => {
            let spec = ShardSpec {
                key: format!("{}#raw", src.name),
                size: src.raw_size,
                hash: src.raw_hash.clone(),
            };
            match begin(ps, spec).await? {
                Begin::Hit(lease) => lease,
                Begin::Fetch(raw) if growable => {
                    let job = Job::Decompress { raw, algorithm };
                    return serve_growing(ds, ps, shard, src, job, outage).await;
                }
                Begin::Fetch(raw) => fill_raw(ds, ps, src, raw, algorithm, None, outage).await?,
            }
        }
    };
    let (name, columns) = (src.name.clone(), src.schema.clone());
    let (samples, first) = (src.samples, src.first_sample);
    blocking(move || ShardHandle::open(shard, name, lease, columns, samples, first)).await
}

/// Opens `shard` on the calling thread when that needs neither the network nor another fetch:
/// read in place, or complete in the node's cache. `None` when it does, or on any error: the
/// caller then goes through [`open_shard`], which retries, fetches and names errors. For random
/// access, where the runtime's thread hops of [`open_shard`] cost more than the open itself
/// (about 150 µs against 20).
pub(crate) fn open_now(ds: &Inner, ps: &ProcState, shard: usize) -> Option<ShardHandle> {
    let src = ds.shards.get(shard)?;
    if ps.joinable(shard).is_some() {
        return None;
    }
    let in_place = |path: &Path, size: u64, hash: &Option<ExpectedHash>| {
        let verified = ds
            .verified_local
            .lock()
            .map(|set| set.contains(path))
            .unwrap_or(false);
        if hash.is_some() && !verified {
            return None; // the first read of a file checks its hash: the full path does it
        }
        ps.cache.acquire_local(path, size, None).ok()
    };
    let lease = match (&src.local_raw, src.algorithm, &src.local_stored) {
        (Some(path), _, _) => in_place(path, src.raw_size, &src.raw_hash)?,
        (None, None, Some(path)) => in_place(path, src.stored_size, &src.stored_hash)?,
        (None, None, None) => ps.cache.lookup(&stored_spec(src)).ok()??,
        (None, Some(_), _) => {
            let spec = ShardSpec {
                key: format!("{}#raw", src.name),
                size: src.raw_size,
                hash: src.raw_hash.clone(),
            };
            ps.cache.lookup(&spec).ok()??
        }
    };
    let (name, columns) = (src.name.clone(), src.schema.clone());
    ShardHandle::open(shard, name, lease, columns, src.samples, src.first_sample).ok()
}

/// How long a process that finds a shard's fetch lock taken looks for the fetcher's progress
/// record before it waits for the commit instead (a fetcher that does not share its progress:
/// one checking a hash, or one waiting for disk space).
const JOIN_LOOK: Duration = Duration::from_millis(50);
/// How often a joined download's progress record is read.
const JOIN_POLL: Duration = Duration::from_millis(1);
/// How often a joined download's writer is checked for life while it makes no progress.
const JOIN_LIVENESS: Duration = Duration::from_millis(20);

/// The outcome of [`begin_or_join`].
enum Opening {
    Begin(Begin),
    /// Another process downloads the shard and shares its progress: its temp file (opened for
    /// reading and writing, in case its writer dies) and path.
    Join(Arc<File>, PathBuf),
}

/// The stored (uncompressed) shard: a hit, the right to fetch it, or another process's
/// download of it to join.
async fn begin_or_join(ps: &Arc<ProcState>, src: &ShardSource) -> Result<Opening> {
    let spec = stored_spec(src);
    let started = std::time::Instant::now();
    loop {
        let (cache, s) = (ps.cache.clone(), spec.clone());
        if let Some(begin) = blocking(move || Ok(cache.try_begin(&s)?)).await? {
            return Ok(Opening::Begin(begin));
        }
        let tmp = ps.cache.download_path(&spec);
        if let Some(file) = open_shared(&tmp, spec.size)? {
            debug!(shard = %src.name, "joining another process's download");
            return Ok(Opening::Join(Arc::new(file), tmp));
        }
        if started.elapsed() >= JOIN_LOOK {
            return begin(ps, spec).await.map(Opening::Begin);
        }
        tokio::time::sleep(JOIN_POLL).await;
    }
}

/// Opens the temp file at `tmp` if it holds a progress record (a download shared while it
/// grows).
fn open_shared(tmp: &Path, size: u64) -> Result<Option<File>> {
    let file = match File::options().read(true).write(true).open(tmp) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StreamerError::Io {
                op: "open download",
                path: tmp.to_path_buf(),
                source,
            })
        }
    };
    let found = progress::read(&file).map_err(|source| StreamerError::Io {
        op: "read download progress",
        path: tmp.to_path_buf(),
        source,
    })?;
    // Only the size the index gives: a file left by another version of the dataset is not
    // joined (it is a different download, and its writer's lock says nothing of ours).
    let sized = file.metadata().map(|m| m.len() == size).unwrap_or(false);
    Ok((found.is_some() && sized).then_some(file))
}

/// Serves a shard that another process downloads, from its temp file, as its progress record
/// grows. A background task follows the record, pins the file once its writer commits it, and
/// finishes the download itself if the writer dies.
async fn join_growing(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    shard: usize,
    src: &ShardSource,
    (file, tmp): (Arc<File>, PathBuf),
    outage: &Arc<Outage>,
) -> Result<ShardHandle> {
    let (publisher, growing) = growing::channel(Arc::clone(&src.name));
    let inflight = InFlight {
        file: Arc::clone(&file),
        tmp: tmp.clone(),
        growing,
        landing: Arc::new(Landing::default()),
    };
    if let Ok(mut map) = ps.inflight.lock() {
        map.insert(shard, inflight.clone());
    }
    Metrics::add(&ds.metrics.shards_joined, 1);
    {
        let (ds, ps, src) = (Arc::clone(ds), Arc::clone(ps), src.clone());
        let (landing, outage) = (Arc::clone(&inflight.landing), Arc::clone(outage));
        ps.clone().spawn(async move {
            let joined = Joined {
                ds: &ds,
                ps: &ps,
                src: &src,
                file: &file,
                tmp: &tmp,
            };
            match joined.follow(&publisher, &landing, &outage).await {
                Ok(()) => {
                    publisher.done();
                    ps.forget_inflight(shard);
                }
                Err(e) => {
                    let e = named(e, &src.name);
                    warn!(shard = %src.name, error = %e, "a joined download failed");
                    // Before `fail`, as in `serve_growing`.
                    ps.forget_inflight(shard);
                    publisher.fail(e.to_string(), e.is_transient());
                }
            }
        });
    }
    open_growing(src, shard, inflight).await
}

/// Another process's download that this one reads.
struct Joined<'a> {
    ds: &'a Arc<Inner>,
    ps: &'a Arc<ProcState>,
    src: &'a ShardSource,
    file: &'a Arc<File>,
    tmp: &'a Path,
}

impl Joined<'_> {
    /// Publishes the writer's progress until every byte is written, then pins the committed
    /// file; finishes the download in this process if the writer is gone first.
    async fn follow(
        &self,
        publisher: &Publisher,
        landing: &Landing,
        outage: &Arc<Outage>,
    ) -> Result<()> {
        let size = self.src.stored_size;
        let spec = stored_spec(self.src);
        let mut seen = 0u64;
        let mut checked = std::time::Instant::now();
        loop {
            if let Some(n) = self.progress()?.filter(|&n| n > seen) {
                seen = n.min(size);
                publisher.advance(seen, false);
                checked = std::time::Instant::now();
            }
            if seen >= size {
                break;
            }
            if checked.elapsed() >= JOIN_LIVENESS {
                checked = std::time::Instant::now();
                if !self.writer_alive(&spec).await? {
                    // It may have finished between the last look and the check.
                    seen = seen.max(self.progress()?.unwrap_or(0).min(size));
                    if seen >= size {
                        publisher.advance(size, true);
                        break;
                    }
                    return self.finish(seen, publisher, outage).await;
                }
            }
            tokio::time::sleep(JOIN_POLL).await;
        }
        // Every byte is in the file; the writer commits it under its fetch lock. Pin the
        // committed file like any hit. A writer that died before its commit leaves a new
        // fetch to us: decline it, the bytes we need are in our descriptor.
        match begin(self.ps, spec).await? {
            Begin::Hit(lease) => landing.land(lease),
            Begin::Fetch(guard) => drop(guard),
        }
        Ok(())
    }

    fn progress(&self) -> Result<Option<u64>> {
        progress::read(self.file).map_err(|source| StreamerError::Io {
            op: "read download progress",
            path: self.tmp.to_path_buf(),
            source,
        })
    }

    /// Whether the writer still holds the shard's fetch lock on this very file (a file
    /// unlinked by a cleanup or a new fetch has no writer any more).
    async fn writer_alive(&self, spec: &ShardSpec) -> Result<bool> {
        let linked = self
            .file
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::nlink(&m) > 0)
            .unwrap_or(false);
        if !linked {
            return Ok(false);
        }
        let (cache, spec) = (self.ps.cache.clone(), spec.clone());
        blocking(move || Ok(cache.fetch_in_progress(&spec)?)).await
    }

    /// The writer is gone with `from` bytes written: fetch the rest into the same file.
    async fn finish(&self, from: u64, publisher: &Publisher, outage: &Arc<Outage>) -> Result<()> {
        warn!(
            shard = %self.src.name,
            written = from,
            "the process downloading this shard stopped; fetching the rest"
        );
        Metrics::add(&self.ds.metrics.fetch_retries, 1);
        let location = self.ps.locations.get(self.src.stream).ok_or_else(|| {
            StreamerError::Engine(format!(
                "shard {} has no stream {}",
                self.src.name, self.src.stream
            ))
        })?;
        // The version the writer was downloading, so that the rest is of it too (an older
        // writer, or a file system without user attributes, recorded none).
        let version = progress::read_version(self.file).unwrap_or_else(|e| {
            debug!(shard = %self.src.name, error = %e, "no download version to resume");
            None
        });
        Fetch {
            ds: self.ds,
            budget: &self.ps.budget,
            location,
            rel: &self.src.stored_rel,
            progress: Some(publisher),
            outage,
        }
        .resume((self.src.stored_size, from), version, self.file, self.tmp)
        .await
    }
}

/// Whether the file a shard is read from (its decompressed entry for a compressed shard) is in
/// the cache folder now: a `stat`, not a check (opening the shard checks it).
pub(crate) fn is_cached(ps: &ProcState, src: &ShardSource) -> bool {
    if src.algorithm.is_some() {
        ps.cache.holds(&format!("{}#raw", src.name))
    } else {
        ps.cache.holds(&src.name)
    }
}

/// The cache entry of a shard's stored file.
fn stored_spec(src: &ShardSource) -> ShardSpec {
    ShardSpec {
        key: src.name.to_string(),
        size: src.stored_size,
        hash: src.stored_hash.clone(),
    }
}

/// What a growing shard's background task does.
enum Job {
    /// Download the (uncompressed) stored file into this guard's temp file.
    Plain(FetchGuard),
    /// Get the compressed file, then decompress it into this guard's temp file.
    Decompress {
        raw: FetchGuard,
        algorithm: Algorithm,
    },
}

/// Starts `job` in the background and returns a handle on its output as soon as the header
/// and offset table are written; reads wait for the rest (see the module docs).
async fn serve_growing(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    shard: usize,
    src: &ShardSource,
    job: Job,
    outage: &Arc<Outage>,
) -> Result<ShardHandle> {
    let tmp = match &job {
        Job::Plain(guard) | Job::Decompress { raw: guard, .. } => guard.tmp_path().to_path_buf(),
    };
    // Opened before the task starts: the descriptor outlives the rename at commit.
    let file = File::open(&tmp).map_err(|source| StreamerError::Io {
        op: "open download",
        path: tmp.clone(),
        source,
    })?;
    // Only a plain download's temp file is the shard itself, readable by other processes.
    let (publisher, growing) = match &job {
        Job::Plain(_) => growing::shared_channel(Arc::clone(&src.name)),
        Job::Decompress { .. } => growing::channel(Arc::clone(&src.name)),
    };
    let publisher = Arc::new(publisher);
    let inflight = InFlight {
        file: Arc::new(file),
        tmp,
        growing,
        landing: Arc::new(Landing::default()),
    };
    if let Ok(mut map) = ps.inflight.lock() {
        map.insert(shard, inflight.clone());
    }
    {
        let (ds, ps, src) = (Arc::clone(ds), Arc::clone(ps), src.clone());
        let (landing, outage) = (Arc::clone(&inflight.landing), Arc::clone(outage));
        ps.clone().spawn(async move {
            let result = match job {
                Job::Plain(guard) => {
                    fetch_stored(&ds, &ps, &src, guard, Some(&publisher), &outage).await
                }
                Job::Decompress { raw, algorithm } => {
                    let publisher = Some(Arc::clone(&publisher));
                    fill_raw(&ds, &ps, &src, raw, algorithm, publisher, &outage).await
                }
            };
            match result {
                Ok(lease) => {
                    landing.land(lease);
                    publisher.done();
                    // After `done`: `settle` waits for what is in the map.
                    ps.forget_inflight(shard);
                }
                Err(e) => {
                    let e = named(e, &src.name);
                    warn!(shard = %src.name, error = %e, "fetch of a shard being served failed");
                    // Before `fail`: a caller told of the failure that opens the shard again
                    // must start a new download, not join this ended one and get its error.
                    ps.forget_inflight(shard);
                    publisher.fail(e.to_string(), e.is_transient());
                }
            }
        });
    }
    open_growing(src, shard, inflight).await
}

/// A handle on a shard this process is downloading.
async fn open_growing(src: &ShardSource, shard: usize, job: InFlight) -> Result<ShardHandle> {
    let file = job.file.try_clone().map_err(|source| StreamerError::Io {
        op: "open download",
        path: job.tmp.clone(),
        source,
    })?;
    let (name, columns) = (src.name.clone(), src.schema.clone());
    let (samples, first, len) = (src.samples, src.first_sample, src.raw_size);
    blocking(move || {
        ShardHandle::open_growing(
            shard,
            name,
            (file, job.tmp, len),
            job.growing,
            job.landing,
            columns,
            samples,
            first,
        )
    })
    .await
}

/// Decompresses the stored file (fetched first if needed) into `raw`'s temp file and commits it.
async fn fill_raw(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    src: &ShardSource,
    raw: FetchGuard,
    algorithm: Algorithm,
    progress: Option<Arc<Publisher>>,
    outage: &Arc<Outage>,
) -> Result<ShardLease> {
    let stored = match begin_stored(ds, ps, src).await? {
        Begin::Hit(lease) => lease,
        Begin::Fetch(guard) => fetch_stored(ds, ps, src, guard, None, outage).await?,
    };
    let tmp = raw.tmp_path().to_path_buf();
    let what = src.name.clone();
    let (raw_size, stored_size, framed) = (src.raw_size, src.stored_size, src.framed);
    let budget = ps.budget.clone();
    let result = blocking(move || {
        let path = stored.path();
        let input = File::open(path).map_err(|source| StreamerError::Io {
            op: "open",
            path: path.to_path_buf(),
            source,
        })?;
        let head = read_head(&input, path, stored_size)?;
        let job = decode::Job {
            algorithm,
            input: Box::new(input),
            head: &head,
            stored_size,
            dst: &tmp,
            raw_size,
            framed,
            what: &what,
            progress: progress.as_deref(),
        };
        decompress(job, &budget)
    })
    .await;
    match result {
        Ok(()) => blocking(move || Ok(raw.commit()?)).await,
        Err(e) => {
            drop(raw);
            Err(e)
        }
    }
}

async fn begin(ps: &Arc<ProcState>, spec: ShardSpec) -> Result<Begin> {
    let cache = ps.cache.clone();
    blocking(move || Ok(cache.begin(&spec)?)).await
}

/// The stored file (compressed or not): in place when it is local, a hit when the node has it,
/// else the right to fetch it.
async fn begin_stored(ds: &Arc<Inner>, ps: &Arc<ProcState>, src: &ShardSource) -> Result<Begin> {
    if let Some(path) = &src.local_stored {
        let lease = local_lease(ds, ps, path, src.stored_size, &src.stored_hash).await?;
        return Ok(Begin::Hit(lease));
    }
    begin(ps, stored_spec(src)).await
}

/// A local file read in place: its size checked on every open, its hash (where the index has
/// one and `validate_hash` is on) on the first open in this process.
async fn local_lease(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    path: &Path,
    size: u64,
    hash: &Option<ExpectedHash>,
) -> Result<ShardLease> {
    let verified = |p: &Path| {
        ds.verified_local
            .lock()
            .map(|set| set.contains(p))
            .unwrap_or(false)
    };
    let check = hash.clone().filter(|_| !verified(path));
    let (cache, owned) = (ps.cache.clone(), path.to_path_buf());
    let lease = blocking(move || {
        let lease = cache.acquire_local(&owned, size, None)?;
        if let Some(h) = check {
            cache.verify_local(&owned, &h)?;
        }
        Ok(lease)
    })
    .await?;
    if hash.is_some() {
        if let Ok(mut set) = ds.verified_local.lock() {
            set.insert(path.to_path_buf());
        }
    }
    Ok(lease)
}

/// Downloads the stored file into `guard`'s temp file and commits it.
async fn fetch_stored(
    ds: &Arc<Inner>,
    ps: &Arc<ProcState>,
    src: &ShardSource,
    guard: FetchGuard,
    progress: Option<&Publisher>,
    outage: &Arc<Outage>,
) -> Result<ShardLease> {
    let location = ps.locations.get(src.stream).ok_or_else(|| {
        StreamerError::Engine(format!("shard {} has no stream {}", src.name, src.stream))
    })?;
    let tmp = guard.tmp_path().to_path_buf();
    Fetch {
        ds,
        budget: &ps.budget,
        location,
        rel: &src.stored_rel,
        progress,
        outage,
    }
    .download(src.stored_size, &tmp)
    .await?;
    Metrics::add(&ds.metrics.shards_fetched, 1);
    blocking(move || Ok(guard.commit()?)).await
}
