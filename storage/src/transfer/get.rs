//! Reads: whole objects and byte ranges as parallel ranged GETs, and downloads to files.
//!
//! Every request asks for at most one chunk, so each has its own bounded timeout (see
//! [`crate::options`]). Requests after the first carry `If-Match: <etag>` of the first, so an
//! object overwritten mid-read fails with [`StorageError::Changed`] instead of mixing two
//! versions.

use std::ops::Range;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{stream, Stream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStoreExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{chunk_ranges, TempFile};
use crate::error::{Result, StorageError};
use crate::location::{object_info, Location};
use crate::ObjectInfo;

/// One ranged GET; checks that the whole range came back.
async fn fetch_chunk(
    loc: &Location,
    rel: &str,
    path: &Path,
    range: Range<u64>,
    etag: Option<String>,
) -> Result<Bytes> {
    let expected = range.end - range.start;
    let opts = GetOptions {
        range: Some(GetRange::Bounded(range)),
        if_match: etag,
        ..GetOptions::default()
    };
    let result = loc.store().get_opts(path, opts).await;
    let bytes = match result {
        Ok(r) => r.bytes().await,
        Err(e) => Err(e),
    }
    .map_err(|e| loc.backend_error(rel, e))?;
    let actual = bytes.len() as u64;
    if actual != expected {
        return Err(StorageError::SizeMismatch {
            url: loc.url_of(rel),
            expected,
            actual,
        });
    }
    Ok(bytes)
}

/// The first ranged GET of a read, which also learns the object's size and ETag.
///
/// A range that starts at or past the end cannot be asked for (S3 answers 416, and no range
/// addresses an empty object), so on failure a HEAD tells "nothing there" from a real error.
async fn first_request(
    loc: &Location,
    rel: &str,
    path: &Path,
    range: Range<u64>,
) -> Result<(Bytes, ObjectMeta)> {
    let opts = GetOptions {
        range: Some(GetRange::Bounded(range.clone())),
        ..GetOptions::default()
    };
    let attempt = match loc.store().get_opts(path, opts).await {
        Ok(r) => {
            let meta = r.meta.clone();
            r.bytes().await.map(|b| (b, meta))
        }
        Err(e) => Err(e),
    };
    match attempt {
        Ok(found) => Ok(found),
        Err(e) if !is_range_error(&e) => Err(loc.backend_error(rel, e)),
        Err(e) => match loc.store().head(path).await {
            Ok(meta) if meta.size <= range.start => Ok((Bytes::new(), meta)),
            _ => Err(loc.backend_error(rel, e)),
        },
    }
}

/// True for "range not satisfiable" errors (S3's 416, the local store's invalid range).
///
/// `object_store` exposes neither the status nor a dedicated variant, hence the text match;
/// the tests on empty objects over S3 and local files guard it. A throttled or failed GET
/// must not fall through to a HEAD, which would only double the failing requests.
fn is_range_error(e: &object_store::Error) -> bool {
    if !matches!(e, object_store::Error::Generic { .. }) {
        return false;
    }
    let text = e.to_string().to_ascii_lowercase();
    [
        "range not satisfiable",
        "invalidrange",
        "requested range",
        "range starting at",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Ranged GETs of `ranges` in order, at most `concurrency` in flight and one `permits`
/// permit per chunk held until the consumer drops it.
///
/// Permits are taken one after the other in chunk order (not by the concurrent requests),
/// so the chunks holding permits are always a prefix of what is left to deliver; streams
/// sharing one semaphore thus cannot deadlock on it.
fn chunk_stream<'a>(
    loc: &'a Location,
    rel: &'a str,
    path: &'a Path,
    ranges: Vec<Range<u64>>,
    etag: Option<String>,
    permits: Arc<Semaphore>,
    concurrency: usize,
) -> impl Stream<Item = Result<(Bytes, OwnedSemaphorePermit)>> + 'a {
    stream::iter(ranges)
        .then(move |range| {
            let permits = Arc::clone(&permits);
            async move {
                let permit = permits.acquire_owned().await;
                (range, permit)
            }
        })
        .map(move |(range, permit)| {
            let etag = etag.clone();
            async move {
                let permit = permit.map_err(|_| cancelled(loc, rel))?;
                let bytes = fetch_chunk(loc, rel, path, range, etag).await?;
                Ok((bytes, permit))
            }
        })
        .buffered(concurrency.max(1))
}

/// Bytes `range` of `rel`: a first request, then the remaining chunks in parallel.
pub(crate) async fn ranges_to_bytes(
    loc: &Location,
    rel: &str,
    path: &Path,
    range: Range<u64>,
) -> Result<Bytes> {
    let opts = loc.options();
    let chunk = opts.chunk_size.max(1) as u64;
    let first_end = range.end.min(range.start.saturating_add(chunk));
    let (head, meta) = first_request(loc, rel, path, range.start..first_end).await?;
    if meta.size < range.end {
        return Err(StorageError::SizeMismatch {
            url: loc.url_of(rel),
            expected: range.end - range.start,
            actual: meta.size.saturating_sub(range.start),
        });
    }
    let fetched = range.start + head.len() as u64;
    if fetched >= range.end {
        return Ok(head);
    }
    let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let ranges = chunk_ranges(fetched..range.end, chunk);
    let rest = chunk_stream(
        loc,
        rel,
        path,
        ranges,
        meta.e_tag,
        permits,
        opts.concurrency,
    );
    collect(rest, head, range.end - range.start).await
}

async fn collect(
    chunks: impl Stream<Item = Result<(Bytes, OwnedSemaphorePermit)>>,
    head: Bytes,
    total: u64,
) -> Result<Bytes> {
    // The size comes from the server; do not let a bogus one reserve unbounded memory.
    const MAX_RESERVE: u64 = 256 * 1024 * 1024;
    let capacity = usize::try_from(total.min(MAX_RESERVE)).unwrap_or(0);
    let mut buf = BytesMut::with_capacity(capacity);
    buf.extend_from_slice(&head);
    let mut chunks = std::pin::pin!(chunks);
    while let Some((bytes, _permit)) = chunks.try_next().await? {
        buf.extend_from_slice(&bytes);
    }
    Ok(buf.freeze())
}

impl Location {
    /// Bytes `range` of `rel`, fetched as parallel chunks when larger than one chunk.
    pub async fn get_range(&self, rel: &str, range: Range<u64>) -> Result<Bytes> {
        if range.start > range.end {
            return Err(StorageError::InvalidUrl {
                url: self.url_of(rel),
                reason: format!("invalid byte range {}..{}", range.start, range.end),
            });
        }
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let path = self.path(rel)?;
        ranges_to_bytes(self, rel, &path, range).await
    }

    /// The whole object `rel`, as parallel ranged GETs of the location's chunk size.
    pub async fn get(&self, rel: &str) -> Result<Bytes> {
        let opts = self.options();
        self.get_parallel(rel, opts.chunk_size, opts.concurrency)
            .await
    }

    /// [`Location::get`] of an object whose size is untrusted (an index, a manifest): an object
    /// over `limit` bytes is [`StorageError::TooLarge`], known from the first response's size,
    /// before the rest of it is fetched or any buffer for it is allocated.
    pub async fn get_at_most(&self, rel: &str, limit: u64) -> Result<Bytes> {
        Ok(self.get_at_most_with_info(rel, limit).await?.0)
    }

    /// [`Self::get_at_most`], with what the first response said of the object (size, ETag,
    /// last modified): one request less than a HEAD before the GET.
    pub async fn get_at_most_with_info(
        &self,
        rel: &str,
        limit: u64,
    ) -> Result<(Bytes, ObjectInfo)> {
        let opts = self.options();
        self.get_bounded(rel, opts.chunk_size, opts.concurrency, Some(limit))
            .await
    }

    /// The whole object `rel`, as ranged GETs of `chunk_size` bytes, `concurrency` at a time.
    ///
    /// The first request learns the size; the rest go in parallel, pinned to the first
    /// one's ETag.
    pub async fn get_parallel(
        &self,
        rel: &str,
        chunk_size: usize,
        concurrency: usize,
    ) -> Result<Bytes> {
        Ok(self
            .get_bounded(rel, chunk_size, concurrency, None)
            .await?
            .0)
    }

    async fn get_bounded(
        &self,
        rel: &str,
        chunk_size: usize,
        concurrency: usize,
        limit: Option<u64>,
    ) -> Result<(Bytes, ObjectInfo)> {
        let path = self.path(rel)?;
        let chunk = limit.map_or(chunk_size.max(1) as u64, |l| {
            (chunk_size.max(1) as u64).min(l.saturating_add(1))
        });
        let (head, meta) = first_request(self, rel, &path, 0..chunk).await?;
        if let Some(limit) = limit.filter(|&l| meta.size > l) {
            return Err(StorageError::TooLarge {
                url: self.url_of(rel),
                size: meta.size,
                limit,
            });
        }
        let info = object_info(rel.to_string(), meta);
        let fetched = head.len() as u64;
        if fetched >= info.size {
            return Ok((head, info));
        }
        let permits = Arc::new(Semaphore::new(concurrency.max(1)));
        let ranges = chunk_ranges(fetched..info.size, chunk);
        let etag = info.e_tag.clone();
        let rest = chunk_stream(self, rel, &path, ranges, etag, permits, concurrency);
        Ok((collect(rest, head, info.size).await?, info))
    }

    /// Downloads `rel` to `dest`: chunks are written to a temporary file in `dest`'s folder,
    /// which is fsynced and renamed, so `dest` appears only complete. Returns the size.
    ///
    /// Memory is bounded by `concurrency x chunk_size`, whatever the object's size.
    pub async fn download_to_file(&self, rel: &str, dest: &FsPath) -> Result<u64> {
        let permits = Arc::new(Semaphore::new(self.options().concurrency.max(1)));
        self.download_with(rel, dest, permits, None).await
    }

    /// [`Self::download_to_file`] drawing chunk permits from `permits` and adding the bytes
    /// written to `progress`.
    pub(crate) async fn download_with(
        &self,
        rel: &str,
        dest: &FsPath,
        permits: Arc<Semaphore>,
        progress: Option<&AtomicU64>,
    ) -> Result<u64> {
        let path = self.path(rel)?;
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| StorageError::io(dir, e))?;
        }
        let chunk = self.options().chunk_size.max(1) as u64;
        let first_permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .map_err(|_| cancelled(self, rel))?;
        let (head, meta) = first_request(self, rel, &path, 0..chunk).await?;
        let tmp = TempFile::beside(dest)?;
        let mut file = tokio::fs::File::create(tmp.path())
            .await
            .map_err(|e| StorageError::io(tmp.path(), e))?;
        let write_err = |e| StorageError::io(tmp.path(), e);
        file.write_all(&head).await.map_err(write_err)?;
        let mut written = head.len() as u64;
        add(progress, written);
        drop((head, first_permit));

        let ranges = chunk_ranges(written..meta.size, chunk);
        let concurrency = self.options().concurrency;
        let chunks = chunk_stream(self, rel, &path, ranges, meta.e_tag, permits, concurrency);
        let mut chunks = std::pin::pin!(chunks);
        while let Some((bytes, permit)) = chunks.try_next().await? {
            file.write_all(&bytes).await.map_err(write_err)?;
            written += bytes.len() as u64;
            add(progress, bytes.len() as u64);
            drop(permit);
        }
        if written != meta.size {
            return Err(StorageError::SizeMismatch {
                url: self.url_of(rel),
                expected: meta.size,
                actual: written,
            });
        }
        file.flush().await.map_err(write_err)?;
        file.sync_all().await.map_err(write_err)?;
        drop(file);
        tmp.commit(dest).await?;
        tracing::debug!(url = %self.url_of(rel), dest = %dest.display(), bytes = written, "downloaded");
        Ok(written)
    }
}

pub(crate) fn cancelled(loc: &Location, rel: &str) -> StorageError {
    StorageError::Cancelled {
        url: loc.url_of(rel),
    }
}

pub(crate) fn add(progress: Option<&AtomicU64>, n: u64) {
    if let Some(p) = progress {
        p.fetch_add(n, Ordering::Relaxed);
    }
}
