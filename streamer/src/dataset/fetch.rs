//! Downloads one stored shard file into the cache's temp file: ranged GETs under the memory
//! budget, issued front to back, with the complete prefix published as it grows, and transient
//! failures retried inside one bounded window ([`Outage`]).
//!
//! - The first range is small ([`FIRST_RANGE_BYTES`]) so that the header, the offset table and
//!   the first samples come back after one round trip; the rest go in chunks of
//!   `Inner::chunk_bytes`, `concurrency` at a time. Each chunk takes its size from the memory
//!   budget before its request is sent (in order: the budget's semaphore is fair) and gives it
//!   back once its bytes are written (`pwrite`) at their offset.
//! - Retries: `object_store` retries inside each request (its `retry_timeout` is clamped to the
//!   window when the streamer opens the location); this module retries a failed range while
//!   the outage, counted from the start of the first failed attempt since the last success, is
//!   shorter than the window. Callers share one [`Outage`] per shard, so the levels do not
//!   multiply: an outage ends in an error after about one window.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use shardstream_storage::Location;
use tracing::warn;

use super::growing::Publisher;
use super::metrics::Metrics;
use super::Inner;
use crate::error::{Result, StreamerError};

/// Size of a shard's first ranged GET: small, so it comes back after about one round trip.
pub const FIRST_RANGE_BYTES: u64 = 256 << 10;

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

/// The byte ranges of a file of `size` bytes: a small first one, then `chunk`-sized ones.
pub(crate) fn ranges(size: u64, chunk: u64) -> Vec<(u64, u64)> {
    let chunk = chunk.max(1);
    let first = FIRST_RANGE_BYTES.min(chunk).min(size);
    let mut out = Vec::with_capacity((size / chunk + 2) as usize);
    if first > 0 {
        out.push((0, first));
    }
    let mut lo = first;
    while lo < size {
        let hi = (lo + chunk).min(size);
        out.push((lo, hi));
        lo = hi;
    }
    out
}

/// Writes `rel` (of `size` bytes) to `dest` with parallel ranged GETs under the memory budget,
/// advancing `progress` (if given) as the complete prefix grows.
pub(crate) async fn download(
    ds: &Arc<Inner>,
    location: &Location,
    rel: &str,
    size: u64,
    dest: &Path,
    progress: Option<&Publisher>,
    outage: &Arc<Outage>,
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
    let ranges = ranges(size, ds.chunk_bytes);
    let concurrency = location.options().concurrency.max(1);
    let mut done = vec![false; ranges.len()];
    let mut prefix = 0usize;
    let mut results = futures::stream::iter(ranges.iter().copied().enumerate())
        .map(|(i, (lo, hi))| {
            let (ds, file, rel) = (Arc::clone(ds), Arc::clone(&file), rel.to_string());
            let (location, outage) = (location.clone(), Arc::clone(outage));
            let dest = dest.to_path_buf();
            async move {
                let what = || format!("a {}-byte chunk of {rel}", hi - lo);
                let lease = ds.budget.acquire_fetch(&what, hi - lo).await?;
                let bytes = get_range(&location, &rel, lo..hi, &ds.metrics, &outage).await?;
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
                super::engine::blocking(move || {
                    file.write_all_at(&bytes, lo).map_err(|source| StreamerError::Io {
                        op: "write download",
                        path: dest,
                        source,
                    })?;
                    drop(lease);
                    Ok(i)
                })
                .await
            }
        })
        .buffer_unordered(concurrency);
    while let Some(result) = results.next().await {
        let i = result?;
        if let Some(d) = done.get_mut(i) {
            *d = true;
        }
        while done.get(prefix).copied().unwrap_or(false) {
            prefix += 1;
        }
        if let (Some(p), Some(&(_, hi))) =
            (progress, prefix.checked_sub(1).and_then(|j| ranges.get(j)))
        {
            p.advance(hi);
        }
    }
    Ok(())
}

/// One ranged GET, retried through transient failures while `outage` allows.
async fn get_range(
    location: &Location,
    rel: &str,
    range: std::ops::Range<u64>,
    metrics: &Metrics,
    outage: &Outage,
) -> Result<bytes::Bytes> {
    let mut backoff = Duration::from_millis(200);
    loop {
        Metrics::add(&metrics.fetch_requests, 1);
        let attempt = Instant::now();
        match location.get_range(rel, range.clone()).await {
            Ok(bytes) => {
                outage.succeeded();
                return Ok(bytes);
            }
            Err(e) if e.is_transient() && outage.may_retry(attempt) => {
                warn!(url = %location.url_of(rel), error = %e, "ranged GET failed; retrying");
                Metrics::add(&metrics.fetch_retries, 1);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_range_is_small_and_ranges_tile_the_file() {
        let r = ranges(20 << 20, 8 << 20);
        assert_eq!(r[0], (0, FIRST_RANGE_BYTES));
        assert_eq!(r[1], (FIRST_RANGE_BYTES, FIRST_RANGE_BYTES + (8 << 20)));
        assert_eq!(r.last().map(|x| x.1), Some(20 << 20));
        assert!(r.windows(2).all(|w| w[0].1 == w[1].0));
        assert_eq!(ranges(100, 8 << 20), vec![(0, 100)]);
        assert_eq!(ranges(0, 8), Vec::<(u64, u64)>::new());
        assert_eq!(ranges(10, 4), vec![(0, 4), (4, 8), (8, 10)]);
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
