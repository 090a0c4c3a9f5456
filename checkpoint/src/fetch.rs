//! Ranged reads of one object into one buffer. The pieces of a read are fetched in parallel
//! straight into their own slices of a single allocation (ranged GETs for a remote store,
//! `pread`s when the checkpoint root is a local directory), and each piece's CRC32C is computed
//! where it lands. A read therefore costs one copy of the bytes and one checksum pass, with no
//! concatenation afterwards, and a local read runs on several threads as torch's own
//! `FileSystemReader` cannot.

use crate::checksum::{crc32c, Crc32c};
use crate::error::{CheckpointError, Result};
use crate::metrics::{add, CheckpointMetrics};
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};
use std::ops::Range;
use std::sync::Arc;

/// Where an object's bytes are read from.
#[derive(Debug, Clone, Copy)]
pub struct ReadTarget<'a> {
    /// The store and the object's key in it.
    pub store: &'a Arc<dyn ObjectStore>,
    /// The object's key (named in errors).
    pub path: &'a Path,
    /// The same object as a local file, when the store is a POSIX directory: read with `pread`.
    pub local: Option<&'a std::path::Path>,
}

/// Cuts `range` into pieces of at most `chunk` bytes that never cross a multiple of `align`
/// (the part size, so that each part's checksum can be combined from whole pieces; 0: none).
pub fn cut(range: Range<u64>, chunk: u64, align: u64) -> Vec<Range<u64>> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let mut off = range.start;
    while off < range.end {
        let mut end = range.end.min(off.saturating_add(chunk));
        if let Some(part) = off.checked_div(align) {
            end = end.min(part.saturating_add(1).saturating_mul(align));
        }
        out.push(off..end);
        off = end;
    }
    out
}

/// Reads `pieces` (contiguous, ascending) of `target` with at most `concurrency` in flight and
/// returns their bytes as one buffer, with the CRC32C of each piece in order.
pub async fn read_pieces(
    target: ReadTarget<'_>,
    pieces: &[Range<u64>],
    concurrency: usize,
    metrics: &CheckpointMetrics,
) -> Result<(Bytes, Vec<u32>)> {
    let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
        return Ok((Bytes::new(), Vec::new()));
    };
    let total = usize::try_from(last.end.saturating_sub(first.start)).map_err(|_| {
        CheckpointError::InvalidConfig(format!("a {}-byte read", last.end - first.start))
    })?;
    let (file, concurrency) = match target.local {
        // A local read is a page-cache copy, bound by CPU rather than latency: more threads
        // than cores would only take turns (and take them from the caller decoding the bytes).
        Some(p) => (
            Some(Arc::new(open_local(target.path, p).await?)),
            concurrency.min(std::thread::available_parallelism().map_or(1, |n| n.get())),
        ),
        None => (None, concurrency),
    };
    // `zeroed` is calloc: fresh pages come zeroed from the kernel, so this is not a memset.
    let mut buf = BytesMut::zeroed(total);
    advise_huge_pages(&mut buf);
    let mut slots = Vec::with_capacity(pieces.len());
    for r in pieces {
        let n = usize::try_from(r.end - r.start)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        slots.push((r.clone(), buf.split_to(n)));
    }
    let filled: Vec<(BytesMut, u32)> = futures::stream::iter(slots)
        .map(|(r, mut slot)| {
            let file = file.clone();
            async move {
                add(&metrics.get_requests, 1);
                let crc = match file {
                    Some(f) => {
                        let path = target.path.clone();
                        let (s, crc) = tokio::task::spawn_blocking(move || {
                            pread(&f, &mut slot, r.start)
                                .map_err(|e| local_error(&path, e))
                                .map(|()| {
                                    let crc = crc32c(&slot);
                                    (slot, crc)
                                })
                        })
                        .await
                        .map_err(|source| CheckpointError::Store {
                            op: "pread",
                            path: target.path.clone(),
                            source: object_store::Error::JoinError { source },
                        })??;
                        slot = s;
                        add(&metrics.bytes_read, slot.len() as u64);
                        crc
                    }
                    None => read_remote_into(target, r, &mut slot, metrics).await?,
                };
                Ok::<_, CheckpointError>((slot, crc))
            }
        })
        .buffered(concurrency.max(1))
        .try_collect()
        .await?;
    let mut out = BytesMut::new();
    let mut crcs = Vec::with_capacity(filled.len());
    for (slot, crc) in filled {
        // The slots are consecutive pieces of one allocation: this re-joins them in place.
        out.unsplit(slot);
        crcs.push(crc);
    }
    Ok((out.freeze(), crcs))
}

/// Streams the ranged GET of `r` straight into `slot` (exactly `r`'s length) and returns its
/// CRC32C. Each body chunk is copied once, into its final place, and checksummed while it is
/// still in cache: collecting the body first would cost a second copy of every byte and a
/// fresh allocation per GET whose page faults show at checkpoint sizes.
async fn read_remote_into(
    target: ReadTarget<'_>,
    r: Range<u64>,
    slot: &mut [u8],
    metrics: &CheckpointMetrics,
) -> Result<u32> {
    let options = GetOptions {
        range: Some(GetRange::Bounded(r.clone())),
        ..Default::default()
    };
    let mut body = target
        .store
        .get_opts(target.path, options)
        .await
        .map_err(|e| CheckpointError::store("get", target.path, e))?
        .into_stream();
    let mismatch = |actual: u64| CheckpointError::SizeMismatch {
        path: target.path.clone(),
        expected: r.end - r.start,
        actual,
    };
    let mut crc = Crc32c::new();
    let mut filled = 0usize;
    while let Some(chunk) = body
        .try_next()
        .await
        .map_err(|e| CheckpointError::store("get", target.path, e))?
    {
        // A server that sends more than the range asked for is refused before the copy.
        let end = filled
            .checked_add(chunk.len())
            .filter(|&end| end <= slot.len())
            .ok_or_else(|| mismatch(filled as u64 + chunk.len() as u64))?;
        slot[filled..end].copy_from_slice(&chunk);
        crc.update(&chunk);
        filled = end;
    }
    if filled != slot.len() {
        return Err(mismatch(filled as u64));
    }
    add(&metrics.bytes_read, filled as u64);
    Ok(crc.value())
}

/// Smallest buffer worth backing with transparent huge pages: a few of them, so that the
/// unaligned head and tail (left in small pages) are a small share of it.
const HUGE_PAGE_MIN_BUFFER: usize = 8 << 20;

/// Asks the kernel to back the 2 MiB-aligned interior of a large, freshly allocated (untouched)
/// buffer with transparent huge pages. A checkpoint load fills buffers of up to a whole file
/// (136 MiB) that were never touched: in 4 KiB pages every one of them costs a page fault (a
/// 1 GiB load took 262,144 faults, about half of the I/O threads' CPU in `perf`), in 2 MiB pages
/// 512 times fewer. Only a hint: where THP is off (`never`) or no huge page is free, the kernel
/// uses small pages as before; with THP `always` it is what already happens.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn advise_huge_pages(buf: &mut [u8]) {
    const HUGE_PAGE: usize = 2 << 20;
    if buf.len() < HUGE_PAGE_MIN_BUFFER {
        return;
    }
    let start = buf.as_mut_ptr() as usize;
    let Some(end) = start.checked_add(buf.len()) else {
        return;
    };
    let Some(lo) = start.checked_next_multiple_of(HUGE_PAGE) else {
        return;
    };
    let hi = end - end % HUGE_PAGE;
    if hi <= lo {
        return;
    }
    // SAFETY: [lo, hi) lies inside `buf`, which this function borrows mutably, and is page
    // aligned; MADV_HUGEPAGE changes how the kernel backs those pages, never their contents
    // (untouched pages read as zero either way) or the mapping's lifetime. A failure (EINVAL
    // where THP is compiled out) leaves the buffer as it was, so its result is not needed.
    let rc = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        tracing::trace!(len = hi - lo, "madvise(MADV_HUGEPAGE) refused; small pages");
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_buf: &mut [u8]) {}

async fn open_local(path: &Path, local: &std::path::Path) -> Result<std::fs::File> {
    let owned = local.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::File::open(owned))
        .await
        .map_err(|source| CheckpointError::Store {
            op: "open",
            path: path.clone(),
            source: object_store::Error::JoinError { source },
        })?
        .map_err(|e| local_error(path, e))
}

fn local_error(path: &Path, e: std::io::Error) -> CheckpointError {
    let source = if e.kind() == std::io::ErrorKind::NotFound {
        object_store::Error::NotFound {
            path: path.to_string(),
            source: Box::new(e),
        }
    } else {
        object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        }
    };
    CheckpointError::store("pread", path, source)
}

#[cfg(unix)]
fn pread(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn pread(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    #[test]
    fn huge_page_advice_keeps_a_buffer_zeroed_and_writable_at_any_alignment() {
        // Unaligned starts and ends (the head and tail stay in small pages), a buffer below
        // the minimum (no advice) and one exactly at it.
        for (len, skip) in [
            (20 << 20, 0),
            (20 << 20, 4097),
            (1 << 20, 0),
            (HUGE_PAGE_MIN_BUFFER, 1),
        ] {
            let mut buf = BytesMut::zeroed(len + skip);
            let tail = &mut buf[skip..];
            advise_huge_pages(tail);
            assert!(
                tail.iter().all(|&b| b == 0),
                "{len} bytes at +{skip}: not zero"
            );
            for (i, b) in tail.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            assert!(tail.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
    }

    #[test]
    fn cut_respects_chunk_and_alignment() {
        assert_eq!(cut(0..10, 4, 0), vec![0..4, 4..8, 8..10]);
        assert_eq!(cut(3..13, 100, 5), vec![3..5, 5..10, 10..13]);
        assert_eq!(cut(3..13, 3, 5), vec![3..5, 5..8, 8..10, 10..13]);
        assert!(cut(7..7, 4, 2).is_empty());
    }

    async fn check_both_ways(
        store: Arc<dyn ObjectStore>,
        path: Path,
        local: Option<&std::path::Path>,
    ) {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        store
            .put(&path, PutPayload::from(data.clone()))
            .await
            .unwrap();
        let metrics = CheckpointMetrics::default();
        let target = ReadTarget {
            store: &store,
            path: &path,
            local,
        };
        for (range, chunk) in [(0..100_000u64, 7_000u64), (123..99_999, 100_000), (5..6, 1)] {
            let pieces = cut(range.clone(), chunk, 16_384);
            let (got, crcs) = read_pieces(target, &pieces, 4, &metrics).await.unwrap();
            let want = &data[range.start as usize..range.end as usize];
            assert_eq!(&got[..], want);
            assert_eq!(crcs.len(), pieces.len());
            for (p, c) in pieces.iter().zip(&crcs) {
                let lo = (p.start - range.start) as usize;
                let hi = (p.end - range.start) as usize;
                assert_eq!(*c, crc32c(&want[lo..hi]));
            }
        }
        // Past the end: a size error, never short data.
        let past_end = cut(99_000..100_001, 1 << 20, 0);
        assert!(read_pieces(target, &past_end, 1, &metrics).await.is_err());
    }

    #[tokio::test]
    async fn reads_remote_pieces_into_one_buffer() {
        check_both_ways(Arc::new(InMemory::new()), Path::from("a/b.bin"), None).await;
    }

    #[tokio::test]
    async fn reads_local_pieces_with_pread() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let local = dir.path().join("a").join("b.bin");
        check_both_ways(store, Path::from("a/b.bin"), Some(&local)).await;
    }
}
