//! Downloads one stored shard file into the cache's temp file: a few streamed GETs under the
//! memory budget, written as their bytes arrive, with the complete prefix published as it
//! grows, and transient failures retried inside one bounded window ([`Outage`]).
//!
//! - A shard of up to [`PART_BYTES`] is one GET; a larger one is split into parts of at most
//!   that size, `concurrency` at a time, front to back. Each GET's body is consumed as a
//!   stream: its frames are written with `pwrite` at their offset as they arrive, at least
//!   [`GATHER_BYTES`] at a time, and a GET holds at most [`WRITE_BYTES`] of them (its share of
//!   the memory budget, taken before the request is sent). So a request's size is not its
//!   memory: few, large requests (fewer round trips, and much cheaper for servers that answer
//!   a range by reading the whole object) cost one buffer each, and the header and first
//!   samples are on disk one round trip after the request, long before the part ends.
//! - Frames are written as soon as they make [`GATHER_BYTES`], not gathered further: a frame
//!   is a slice of the HTTP client's read buffer, and while any frame of it is held the client
//!   reads the next bytes into a freshly allocated buffer (fresh pages, each faulted in). And
//!   they are written on the downloading task's thread (a worker of the runtime): a write to
//!   the page cache takes tens of microseconds, less than handing it to the blocking pool and
//!   back (10 KB cold `DataLoader(2)` epochs: 4,400-4,700 instead of 6,200-7,100 page faults
//!   in the downloading process, and about 10 % less of its CPU). A write that took longer than
//!   [`SLOW_WRITE`] (a disk throttling its writers) sends the process's writes to the blocking
//!   pool for [`SLOW_SPELL`], gathered up to [`WRITE_BYTES`] again (see [`Writes`]).
//! - A GET that fails after it delivered some bytes is resumed from the first byte not yet
//!   written, never restarted.
//! - Every GET of a download after the first response carries `If-Match` with that response's
//!   ETag, and every response's ETag must equal it: an object replaced mid-download (a resumed
//!   GET, or another part) fails with [`StorageError::Changed`] instead of leaving a file made of
//!   two versions (or, for a shrunken object, a `416` retried as if transient for the whole
//!   window).
//! - Retries: `object_store` retries inside each request (its `retry_timeout` is clamped to the
//!   window when the streamer opens the location); this module retries a failed GET while the
//!   outage, counted from the last byte received (or the start of the first failed attempt)
//!   since the last success, is shorter than the window. Callers share one [`Outage`] per
//!   shard, so the levels do not multiply: an outage ends in an error after about one window,
//!   and a slow but progressing download is never cut.

use std::fs::File;
use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use shardstream_storage::object_store::{GetOptions, GetRange};
use shardstream_storage::{Location, StorageError};
use tracing::warn;

use super::budget::Budget;
use super::growing::Publisher;
use super::inner::Inner;
use super::metrics::Metrics;
use crate::error::{Result, StreamerError};

/// Largest part of a shard one GET asks for: shards up to this size come in one request.
pub const PART_BYTES: u64 = 64 << 20;
/// Most bytes of a GET's body held at once (its share of the memory budget): one frame, or
/// the frames gathered for a write.
pub const WRITE_BYTES: u64 = 1 << 20;
/// Bytes a GET gathers before it writes them (a frame this size or larger is written alone).
const GATHER_BYTES: u64 = 64 << 10;
/// A write slower than this sends the process's writes to the blocking pool for [`SLOW_SPELL`].
const SLOW_WRITE: Duration = Duration::from_millis(5);
/// How long writes stay in the blocking pool after a slow one.
const SLOW_SPELL: Duration = Duration::from_secs(10);

/// Where this process's download writes run (see the module doc and [`Writes`]).
static WRITES: Writes = Writes::new(SLOW_WRITE, SLOW_SPELL);

/// The failures of one shard's fetch, and how long they may go on.
#[derive(Debug)]
pub(crate) struct Outage {
    window: Duration,
    /// Start of the first failed attempt since the last success.
    since: Mutex<Option<Instant>>,
}

impl Outage {
    pub(crate) fn new(window: Duration) -> Outage {
        Outage {
            window,
            since: Mutex::new(None),
        }
    }

    /// A request succeeded: the outage, if any, is over.
    pub(crate) fn succeeded(&self) {
        if let Ok(mut since) = self.since.lock() {
            *since = None;
        }
    }

    /// An attempt started at `attempt` failed transiently: whether to try again.
    pub(crate) fn may_retry(&self, attempt: Instant) -> bool {
        let Ok(mut since) = self.since.lock() else {
            return false;
        };
        let start = *since.get_or_insert(attempt);
        let start = start.min(attempt);
        *since = Some(start);
        start.elapsed() < self.window
    }

    /// Whether the window has run out (no retry is started any more).
    pub(crate) fn expired(&self) -> bool {
        self.since
            .lock()
            .map(|s| s.is_some_and(|t| t.elapsed() >= self.window))
            .unwrap_or(true)
    }
}

/// The parts of a file of `size` bytes: as few as [`PART_BYTES`] allows, of even size. One GET
/// each: a shard's download is these requests (the scale model counts them, `sim/`).
pub fn parts(size: u64) -> Vec<(u64, u64)> {
    let n = size.div_ceil(PART_BYTES);
    if n == 0 {
        return Vec::new();
    }
    let part = size.div_ceil(n);
    (0..n)
        .map(|i| (i * part, ((i + 1) * part).min(size)))
        .filter(|(lo, hi)| lo < hi)
        .collect()
}

/// How far each part has been written, and so the complete prefix of the file.
struct Written {
    parts: Vec<(u64, u64)>,
    at: Mutex<Vec<u64>>,
}

impl Written {
    fn new(parts: Vec<(u64, u64)>) -> Written {
        let at = Mutex::new(parts.iter().map(|p| p.0).collect());
        Written { parts, at }
    }

    /// Part `i` is written up to `to`; returns the complete prefix (parts are written front to
    /// back, so a part's written bytes are contiguous from its start).
    fn wrote(&self, i: usize, to: u64) -> u64 {
        let Ok(mut at) = self.at.lock() else {
            return 0;
        };
        if let Some(a) = at.get_mut(i) {
            *a = to;
        }
        for (&(_, hi), &a) in self.parts.iter().zip(at.iter()) {
            if a < hi {
                return a;
            }
        }
        self.end()
    }

    /// The end of the last part: the file's size.
    fn end(&self) -> u64 {
        self.parts.last().map_or(0, |p| p.1)
    }
}

/// What one download of a stored file reads, under which budget, and whom it tells: the
/// context every GET of the download shares.
pub(crate) struct Fetch<'a> {
    /// The dataset (metrics, the memory plan's chunk size).
    pub ds: &'a Arc<Inner>,
    /// The process's memory budget.
    pub budget: &'a Budget,
    /// The stream's location.
    pub location: &'a Location,
    /// The file's path inside the location.
    pub rel: &'a str,
    /// Where the complete prefix is published as it grows, if anywhere.
    pub progress: Option<&'a Publisher>,
    /// The shard's retry window, shared by every level of retry.
    pub outage: &'a Arc<Outage>,
}

impl Fetch<'_> {
    /// Writes the file (of `size` bytes) to `dest` with streamed GETs under the memory budget,
    /// advancing the progress (if any) as the complete prefix grows.
    pub(crate) async fn download(&self, size: u64, dest: &Path) -> Result<()> {
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
        if let Some(p) = self.progress.filter(|p| p.wants_sharing()) {
            p.share_through(Arc::clone(&file));
        }
        let target = Target {
            file: &file,
            dest,
            ranges: parts(size),
            version: None,
        };
        self.fill(target).await
    }

    /// Finishes a download another process started and abandoned: writes bytes `from..size`
    /// into `file` (which holds the first `from` already), advancing the progress. With the
    /// `version` (ETag) its writer recorded, every GET must be of that version: an object
    /// replaced since is [`StorageError::Changed`], not a file made of both.
    pub(crate) async fn resume(
        &self,
        (size, from): (u64, u64),
        version: Option<String>,
        file: &Arc<File>,
        dest: &Path,
    ) -> Result<()> {
        let ranges = parts(size.saturating_sub(from))
            .into_iter()
            .map(|(lo, hi)| (lo + from, hi + from))
            .collect();
        let target = Target {
            file,
            dest,
            ranges,
            version,
        };
        self.fill(target).await
    }

    /// Streams the target's ranges (front to back, contiguous) into its file.
    async fn fill(
        &self,
        Target {
            file,
            dest,
            ranges,
            version,
        }: Target<'_>,
    ) -> Result<()> {
        let part = Part {
            fetch: self,
            file: Arc::clone(file),
            dest,
            written: Written::new(ranges.clone()),
            version: Mutex::new(version),
        };
        let concurrency = self.location.options().concurrency.max(1);
        futures::stream::iter(ranges.into_iter().enumerate())
            .map(|(i, range)| part.fetch(i, range))
            .buffer_unordered(concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// Where a download's bytes go, which of them it fetches, and the version they must be of
/// (`None`: whichever the first response is).
struct Target<'a> {
    file: &'a Arc<File>,
    dest: &'a Path,
    ranges: Vec<(u64, u64)>,
    version: Option<String>,
}

/// What every part of one download shares.
struct Part<'a> {
    fetch: &'a Fetch<'a>,
    file: Arc<File>,
    dest: &'a Path,
    written: Written,
    /// The ETag of the download's first response: the version every other response must be.
    version: Mutex<Option<String>>,
}

impl Part<'_> {
    /// Streams part `i` (`lo..hi`) into the file, resuming after transient failures.
    async fn fetch(&self, i: usize, (lo, hi): (u64, u64)) -> Result<()> {
        let ds = self.fetch.ds;
        let url = || self.fetch.location.url_of(self.fetch.rel);
        let cap = WRITE_BYTES.min(ds.memory.chunk).min(hi - lo).max(1);
        let what = || format!("a {cap}-byte download buffer of {}", self.fetch.rel);
        let _lease = self.fetch.budget.acquire_fetch(&what, cap).await?;
        let path = self.fetch.location.path(self.fetch.rel)?;
        let mut buf = Gathered::default();
        let mut at = lo;
        // How much to gather before the next write, decided after each write (not per frame).
        // The first write comes after GATHER_BYTES whatever the mode, so that a shard's header
        // and first samples are readable one round trip after the request.
        let gather_for = || {
            if WRITES.inline() {
                GATHER_BYTES.min(cap) as usize
            } else {
                // Writes in the blocking pool gather up to `cap` again: fewer hand-offs.
                cap as usize
            }
        };
        let mut gather = GATHER_BYTES.min(cap) as usize;
        let mut backoff = Duration::from_millis(200);
        while at < hi {
            Metrics::add(&ds.metrics.fetch_requests, 1);
            let mut last = Instant::now();
            // Every range asked for lies within the index's size, so a 416 means the object
            // is shorter than that. Once a response gave its size (a later request of the
            // download, or `object_store`'s own resumption of a cut body) it shrank meanwhile:
            // S3 and moto check the range before `If-Match`, so that is not a 412. Before, it
            // is what an object shorter than its index answering 206 is: damaged.
            let backend = |e, size_known: bool| match StorageError::from_backend(url(), e) {
                StorageError::Rejected { status: 416, .. } if size_known => {
                    StreamerError::from(StorageError::Changed { url: url() })
                }
                StorageError::Rejected { status: 416, .. } => StreamerError::Corrupt {
                    what: url(),
                    reason: format!(
                        "the object is shorter than the {} bytes its index says (a range \
                         within them was refused: HTTP 416)",
                        self.written.end()
                    ),
                },
                other => StreamerError::from(other),
            };
            let result: Result<()> = async {
                let options = GetOptions {
                    range: Some(GetRange::Bounded(at..hi)),
                    if_match: self.version(),
                    ..GetOptions::default()
                };
                let pinned = options.if_match.is_some();
                let body = self.fetch.location.store().get_opts(&path, options).await;
                let body = body.map_err(|e| backend(e, pinned))?;
                self.same_version(body.meta.e_tag.as_deref(), url)?;
                // An object of another size than the index says is damaged (or replaced): an
                // error before any of its bytes is written. (A range of a longer object would
                // otherwise pass as the shard; the size is the whole object's, also for a range.)
                let size = self.written.end();
                if body.meta.size != size {
                    return Err(StreamerError::Corrupt {
                        what: url(),
                        reason: format!(
                            "the object is {} bytes, {} than the {size} its index says",
                            body.meta.size,
                            if body.meta.size > size {
                                "longer"
                            } else {
                                "shorter"
                            }
                        ),
                    });
                }
                let mut body = body.into_stream();
                let mut first = true;
                while let Some(frame) = body.next().await {
                    let mut rest = frame.map_err(|e| backend(e, true))?;
                    last = Instant::now();
                    if first {
                        self.fetch.outage.succeeded();
                        first = false;
                    }
                    while !rest.is_empty() {
                        let take = rest.len().min(cap as usize - buf.len);
                        buf.push(rest.split_to(take));
                        if buf.len >= gather || buf.frames.len() >= MAX_FRAMES {
                            (buf, at) = self.write(i, std::mem::take(&mut buf), at, hi).await?;
                            gather = gather_for();
                        }
                    }
                }
                if buf.len > 0 {
                    (buf, at) = self.write(i, std::mem::take(&mut buf), at, hi).await?;
                }
                Ok(())
            }
            .await;
            match result {
                Ok(()) if at < hi => {
                    return Err(StreamerError::Corrupt {
                        what: url(),
                        reason: format!(
                            "range {lo}..{hi} ended at {at}; the object is shorter than the \
                             index says"
                        ),
                    });
                }
                Ok(()) => {}
                Err(e) if e.is_transient() && self.fetch.outage.may_retry(last) => {
                    // Bytes gathered but not written are fetched again with the rest.
                    buf.clear();
                    warn!(url = %url(), error = %e, resume_at = at, "GET failed; resuming");
                    Metrics::add(&ds.metrics.fetch_retries, 1);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The ETag later requests must match (`None` before the first response).
    fn version(&self) -> Option<String> {
        self.version.lock().ok().and_then(|v| v.clone())
    }

    /// Records the first response's ETag; a later response of another one is an object
    /// replaced mid-download (a server that ignores `If-Match`, or parts whose first requests
    /// crossed the replacement).
    fn same_version(&self, etag: Option<&str>, url: impl Fn() -> String) -> Result<()> {
        let (Some(etag), Ok(mut version)) = (etag, self.version.lock()) else {
            return Ok(());
        };
        match version.as_deref() {
            None => {
                *version = Some(etag.to_string());
                // Before any byte is written (`Publisher::record_version`).
                if let Some(Err(e)) = self.fetch.progress.map(|p| p.record_version(etag)) {
                    // Its progress is shared anyway: a process that finishes it after this one
                    // dies then cannot check the version of what it fetches.
                    warn!(url = %url(), error = %e, "download version not recorded");
                }
            }
            Some(first) if first == etag => {}
            Some(_) => return Err(StorageError::Changed { url: url() }.into()),
        }
        Ok(())
    }

    /// Writes `buf` at `at` of part `i` (which ends at `hi`); returns the emptied buffer and
    /// the new position.
    async fn write(&self, i: usize, buf: Gathered, at: u64, hi: u64) -> Result<(Gathered, u64)> {
        let len = buf.len as u64;
        if at + len > hi {
            return Err(StreamerError::Corrupt {
                what: self.fetch.location.url_of(self.fetch.rel),
                reason: format!(
                    "a GET of bytes up to {hi} returned bytes up to {}",
                    at + len
                ),
            });
        }
        let mut buf = WRITES.write(&self.file, self.dest, buf, at).await?;
        buf.clear();
        Metrics::add(&self.fetch.ds.metrics.fetch_bytes, len);
        let prefix = self.written.wrote(i, at + len);
        if let Some(p) = self.fetch.progress {
            p.advance(prefix, prefix == self.written.end());
        }
        Ok((buf, at + len))
    }
}

/// Where download writes run: on the downloading task's thread (one of the runtime's workers),
/// unless a write slower than `slow` was seen in the last `spell`; then in the blocking pool,
/// so that a disk that throttles its writers stalls no other download, timer or reader of the
/// runtime. Kept for the process (the cache's disk is the process's), not per download, so
/// that each new download does not try the slow disk inline again.
struct Writes {
    slow: Duration,
    spell: Duration,
    /// The wall clock, in milliseconds, until which writes go to the pool. An atomic rather
    /// than a lock, so that a process forked mid-update cannot inherit it held; a wall clock
    /// that steps only makes one spell shorter or longer.
    pooled_until_ms: AtomicU64,
}

impl Writes {
    const fn new(slow: Duration, spell: Duration) -> Writes {
        Writes {
            slow,
            spell,
            pooled_until_ms: AtomicU64::new(0),
        }
    }

    fn now_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// Whether writes run inline now.
    fn inline(&self) -> bool {
        Writes::now_ms() >= self.pooled_until_ms.load(Ordering::Relaxed)
    }

    /// Writes `buf`'s frames at `at` of `file` (named `dest` in errors); returns `buf`.
    async fn write(
        &self,
        file: &Arc<File>,
        dest: &Path,
        buf: Gathered,
        at: u64,
    ) -> Result<Gathered> {
        let failed = |path: PathBuf, source| StreamerError::Io {
            op: "write download",
            path,
            source,
        };
        if self.inline() {
            let started = Instant::now();
            write_frames_at(file, &buf.frames, at).map_err(|e| failed(dest.to_path_buf(), e))?;
            if started.elapsed() >= self.slow {
                let until = Writes::now_ms().saturating_add(self.spell.as_millis() as u64);
                self.pooled_until_ms.fetch_max(until, Ordering::Relaxed);
            }
            return Ok(buf);
        }
        let (file, dest) = (Arc::clone(file), dest.to_path_buf());
        crate::runtime::blocking(move || {
            write_frames_at(&file, &buf.frames, at).map_err(|e| failed(dest, e))?;
            Ok(buf)
        })
        .await
    }
}

/// Most frames gathered for one write (well under the kernel's `IOV_MAX` of 1024).
const MAX_FRAMES: usize = 512;

/// A GET's bytes waiting to be written: the body's own frames, held rather than copied into a
/// buffer of our own. So a download costs no allocation and no copy beyond the HTTP client's,
/// and the memory it holds goes back to the allocator frame by frame as it is written.
#[derive(Debug, Default)]
struct Gathered {
    frames: Vec<Bytes>,
    len: usize,
}

impl Gathered {
    fn push(&mut self, frame: Bytes) {
        self.len += frame.len();
        self.frames.push(frame);
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.len = 0;
    }
}

/// Writes `frames`, back to back, at `at` of `file` (`pwritev`, resumed after a short write).
fn write_frames_at(file: &File, frames: &[Bytes], mut at: u64) -> std::io::Result<()> {
    let (mut first, mut skip) = (0usize, 0usize);
    while first < frames.len() {
        let slices: Vec<IoSlice<'_>> = frames[first..]
            .iter()
            .enumerate()
            .map(|(k, f)| IoSlice::new(if k == 0 { &f[skip..] } else { &f[..] }))
            .collect();
        let mut wrote = match rustix::io::pwritev(file, &slices, at) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(e) => return Err(e.into()),
        };
        at += wrote as u64;
        // Step past what was written: whole frames, then into the next one.
        while first < frames.len() {
            let left = frames[first].len() - skip;
            if wrote < left {
                skip += wrote;
                break;
            }
            wrote -= left;
            first += 1;
            skip = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_come_in_few_even_parts_and_the_prefix_follows_them() {
        assert_eq!(parts(0), Vec::<(u64, u64)>::new());
        assert_eq!(parts(100), vec![(0, 100)]);
        assert_eq!(parts(PART_BYTES), vec![(0, PART_BYTES)]);
        let p = parts(3 * PART_BYTES - 7);
        assert_eq!(p.len(), 3);
        assert!(p.windows(2).all(|w| w[0].1 == w[1].0));
        assert_eq!(p.last().map(|x| x.1), Some(3 * PART_BYTES - 7));

        let w = Written::new(vec![(0, 10), (10, 20), (20, 30)]);
        assert_eq!(w.wrote(1, 15), 0); // the first part has nothing yet
        assert_eq!(w.wrote(0, 4), 4);
        assert_eq!(w.wrote(0, 10), 15);
        assert_eq!(w.wrote(2, 30), 15);
        assert_eq!(w.wrote(1, 20), 30);
    }

    #[test]
    fn gathered_frames_are_written_back_to_back_at_their_offset() {
        use std::os::unix::fs::FileExt;
        let file = tempfile::tempfile().unwrap();
        let whole: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let mut all = Bytes::from(whole.clone());
        let mut frames = Vec::new();
        for size in [1, 4095, 8192, 0, 30_000, 27_712] {
            frames.push(all.split_to(size));
        }
        assert!(all.is_empty());
        write_frames_at(&file, &frames, 10).unwrap();
        let mut got = vec![1u8; 10 + whole.len()];
        file.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[..10], &[0u8; 10]);
        assert_eq!(&got[10..], &whole[..]);
        write_frames_at(&file, &[], 5).unwrap();
    }

    #[test]
    fn writes_leave_the_download_thread_after_a_slow_one() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("shard.tmp");
        let mut options = File::options();
        options.read(true).write(true).create(true).truncate(true);
        let file = Arc::new(options.open(&dest).unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let gathered = |bytes: &'static [u8]| {
            let mut g = Gathered::default();
            g.push(Bytes::from_static(bytes));
            g
        };
        // Every write counts as slow: the first runs inline, the next ones in the blocking pool
        // for the spell.
        let hour = Duration::from_secs(3600);
        let writes = Writes::new(Duration::ZERO, hour);
        rt.block_on(async {
            assert!(writes.inline());
            let first = writes.write(&file, &dest, gathered(b"abc"), 0).await;
            assert_eq!(first.unwrap().len, 3);
            assert!(
                !writes.inline(),
                "a slow write sends the next ones to the pool"
            );
            writes
                .write(&file, &dest, gathered(b"def"), 3)
                .await
                .unwrap();
            assert!(!writes.inline());
        });
        let mut got = [0u8; 6];
        file.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"abcdef");

        // Fast writes stay inline; after the spell, writes are tried inline again.
        let writes = Writes::new(hour, hour);
        rt.block_on(writes.write(&file, &dest, gathered(b"g"), 6))
            .unwrap();
        assert!(writes.inline());
        let writes = Writes::new(Duration::ZERO, Duration::ZERO);
        rt.block_on(writes.write(&file, &dest, gathered(b"h"), 7))
            .unwrap();
        assert!(writes.inline(), "a spell of zero is over at once");
        let mut got = [0u8; 8];
        file.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"abcdefgh");

        // A failed write names the file, on either path.
        let read_only = Arc::new(File::open(&dest).unwrap());
        for pooled in [false, true] {
            let writes = Writes::new(hour, hour);
            if pooled {
                writes.pooled_until_ms.store(u64::MAX, Ordering::Relaxed);
            }
            assert_eq!(writes.inline(), !pooled);
            let err = rt
                .block_on(writes.write(&read_only, &dest, gathered(b"x"), 0))
                .unwrap_err();
            assert!(err.to_string().contains("shard.tmp"), "{err}");
        }
    }

    #[test]
    fn an_outage_is_retried_for_one_window_from_its_first_failed_attempt() {
        let outage = Outage::new(Duration::from_secs(60));
        let now = Instant::now();
        assert!(outage.may_retry(now));
        assert!(!outage.expired());
        // An attempt that began long ago (inside a request's own retries) counts from there.
        let long_ago = now.checked_sub(Duration::from_secs(61)).unwrap_or(now);
        if long_ago < now {
            assert!(!outage.may_retry(long_ago));
            assert!(outage.expired());
        }
        outage.succeeded();
        assert!(!outage.expired());
        assert!(outage.may_retry(Instant::now()));
    }
}
