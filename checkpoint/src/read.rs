//! Reading a committed checkpoint: ranged reads that fetch only the bytes asked for, checking
//! every part they cover whole, and a streaming verify of everything.

use crate::checksum::{combine_parts, crc32c, Crc32c};
use crate::error::{CheckpointError, Result};
use crate::layout::join;
use crate::manifest::{FileRecord, Manifest};
use crate::metrics::add;
use crate::CheckpointRoot;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use tracing::{info_span, Instrument};

/// Read settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadConfig {
    /// Largest single ranged GET; ranges are also cut at part boundaries.
    pub chunk_size: u64,
    /// Ranged GETs in flight for one `read_range`.
    pub max_concurrent_requests: usize,
    /// Files checked at once by `verify`.
    pub max_concurrent_files: usize,
    /// Size of each ranged GET of `verify` (memory per file checked at once).
    pub verify_chunk_size: u64,
}

impl Default for ReadConfig {
    fn default() -> Self {
        Self {
            chunk_size: 64 << 20,
            max_concurrent_requests: 16,
            max_concurrent_files: 8,
            verify_chunk_size: 16 << 20,
        }
    }
}

/// The result of [`CheckpointReader::verify`].
#[derive(Debug, Default)]
pub struct VerifyReport {
    /// Objects read (files and aliases).
    pub files_checked: usize,
    /// Bytes read.
    pub bytes_checked: u64,
    /// Every problem found, each naming its object.
    pub failures: Vec<CheckpointError>,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// A committed checkpoint opened for reading. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointReader {
    root: CheckpointRoot,
    dir: Path,
    manifest: Arc<Manifest>,
    index: Arc<HashMap<String, usize>>,
    config: ReadConfig,
}

impl CheckpointReader {
    pub(crate) fn new(root: CheckpointRoot, manifest: Manifest, config: ReadConfig) -> Self {
        let dir = root.checkpoint_dir(&manifest.checkpoint_id);
        let index = manifest
            .files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.path.clone(), i))
            .collect();
        Self {
            root,
            dir,
            manifest: Arc::new(manifest),
            index: Arc::new(index),
            config: ReadConfig {
                chunk_size: config.chunk_size.max(1),
                max_concurrent_requests: config.max_concurrent_requests.max(1),
                max_concurrent_files: config.max_concurrent_files.max(1),
                verify_chunk_size: config.verify_chunk_size.max(1),
            },
        }
    }

    /// The validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The record of file `path` (relative to the checkpoint directory; an alias resolves to
    /// its target).
    pub fn record(&self, path: &str) -> Result<&FileRecord> {
        let target = self
            .manifest
            .aliases
            .iter()
            .find(|a| a.path == path)
            .map_or(path, |a| a.target.as_str());
        self.index
            .get(target)
            .and_then(|&i| self.manifest.files.get(i))
            .ok_or_else(|| CheckpointError::UnknownFile {
                id: self.manifest.checkpoint_id.clone(),
                path: path.to_owned(),
            })
    }

    /// The object path of file `path`.
    pub fn object_path(&self, path: &str) -> Result<Path> {
        Ok(join(&self.dir, &self.record(path)?.path))
    }

    /// Reads all of file `path`, verified.
    pub async fn read_file(&self, path: &str) -> Result<Bytes> {
        let size = self.record(path)?.size;
        self.read_range(path, 0..size).await
    }

    /// Reads `range` of file `path`, fetching only those bytes (in part- and chunk-sized ranged
    /// GETs, in parallel). Every part the range covers whole is checked against its CRC32C, and
    /// so is the whole file when the range is the whole file; bytes of partly covered parts are
    /// returned unchecked (use [`CheckpointReader::read_range_verified`] to check them too).
    pub async fn read_range(&self, path: &str, range: Range<u64>) -> Result<Bytes> {
        let rec = self.record(path)?;
        let full = join(&self.dir, &rec.path);
        if range.start > range.end || range.end > rec.size {
            return Err(CheckpointError::RangeOutOfBounds {
                path: full,
                start: range.start,
                end: range.end,
                size: rec.size,
            });
        }
        if range.is_empty() {
            if rec.size == 0 && crc32c(&[]) != rec.crc32c {
                return Err(self.mismatch(full, None, rec.crc32c, crc32c(&[])));
            }
            return Ok(Bytes::new());
        }
        let span =
            info_span!("checkpoint.read_range", path = %full, start = range.start, end = range.end);
        self.fetch(rec, full, range).instrument(span).await
    }

    /// Like [`CheckpointReader::read_range`], but widens the fetch to whole parts so that every
    /// returned byte is checked (reads up to two extra part fragments).
    pub async fn read_range_verified(&self, path: &str, range: Range<u64>) -> Result<Bytes> {
        let rec = self.record(path)?;
        if range.is_empty() || range.end > rec.size || range.start > range.end {
            return self.read_range(path, range).await;
        }
        let first = rec.part_range(part_index(rec, range.start));
        let last = rec.part_range(part_index(rec, range.end - 1));
        let (Some(first), Some(last)) = (first, last) else {
            return self.read_range(path, range).await;
        };
        let wide = self.read_range(path, first.start..last.end).await?;
        let lo = usize::try_from(range.start - first.start).unwrap_or(usize::MAX);
        let hi = usize::try_from(range.end - first.start).unwrap_or(usize::MAX);
        if hi > wide.len() || lo > hi {
            return Err(CheckpointError::RangeOutOfBounds {
                path: join(&self.dir, &rec.path),
                start: range.start,
                end: range.end,
                size: rec.size,
            });
        }
        Ok(wide.slice(lo..hi))
    }

    async fn fetch(&self, rec: &FileRecord, full: Path, range: Range<u64>) -> Result<Bytes> {
        let mut pieces = Vec::new();
        let mut off = range.start;
        while off < range.end {
            let pi = part_index(rec, off);
            let pend = rec.part_range(pi).map_or(range.end, |r| r.end);
            let end = range
                .end
                .min(pend)
                .min(off.saturating_add(self.config.chunk_size));
            if end <= off {
                break;
            }
            pieces.push((pi, off..end));
            off = end;
        }
        let store = self.root.store();
        let metrics = self.root.metrics();
        let fetched: Vec<(usize, Range<u64>, Bytes, u32)> = futures::stream::iter(pieces)
            .map(|(pi, r)| {
                let full = &full;
                async move {
                    add(&metrics.get_requests, 1);
                    let b = store
                        .get_range(full, r.clone())
                        .await
                        .map_err(|e| CheckpointError::store("get", full, e))?;
                    if b.len() as u64 != r.end - r.start {
                        return Err(CheckpointError::SizeMismatch {
                            path: full.clone(),
                            expected: r.end - r.start,
                            actual: b.len() as u64,
                        });
                    }
                    add(&metrics.bytes_read, b.len() as u64);
                    let crc = crc32c(&b);
                    Ok((pi, r, b, crc))
                }
            })
            .buffered(self.config.max_concurrent_requests)
            .try_collect()
            .await?;

        // Check every part covered whole by combining its pieces' checksums.
        let mut i = 0;
        while i < fetched.len() {
            let pi = fetched[i].0;
            let mut j = i;
            while j < fetched.len() && fetched[j].0 == pi {
                j += 1;
            }
            if let (Some(pr), Some(expected)) = (rec.part_range(pi), rec.part_crc(pi)) {
                if range.start <= pr.start && range.end >= pr.end {
                    let actual = combine_parts(
                        fetched[i..j]
                            .iter()
                            .map(|(_, r, _, c)| (*c, r.end - r.start)),
                    );
                    if actual != expected {
                        let part = (!rec.parts.is_empty()).then_some(pi);
                        return Err(self.mismatch(full, part, expected, actual));
                    }
                }
            }
            i = j;
        }

        if fetched.len() == 1 {
            if let Some((_, _, b, _)) = fetched.into_iter().next() {
                return Ok(b);
            }
            return Ok(Bytes::new());
        }
        let total = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        let mut out = BytesMut::with_capacity(total);
        for (_, _, b, _) in &fetched {
            out.extend_from_slice(b);
        }
        Ok(out.freeze())
    }

    fn mismatch(
        &self,
        path: Path,
        part: Option<usize>,
        expected: u32,
        actual: u32,
    ) -> CheckpointError {
        add(&self.root.metrics().integrity_failures, 1);
        CheckpointError::ChecksumMismatch {
            path,
            part,
            expected,
            actual,
        }
    }

    /// Reads every file and alias of the checkpoint in bounded chunks and checks its size and
    /// every part checksum.
    pub async fn verify(&self) -> Result<VerifyReport> {
        let span = info_span!("checkpoint.verify", id = %self.manifest.checkpoint_id);
        async {
            let targets = self
                .manifest
                .files
                .iter()
                .map(|f| (f.path.as_str(), f))
                .chain(
                    self.manifest
                        .aliases
                        .iter()
                        .filter_map(|a| Some((a.path.as_str(), self.record(&a.target).ok()?))),
                );
            let results: Vec<Result<u64>> = futures::stream::iter(targets)
                .map(|(path, rec)| self.verify_object(join(&self.dir, path), rec))
                .buffer_unordered(self.config.max_concurrent_files)
                .collect()
                .await;
            let mut report = VerifyReport::default();
            for r in results {
                report.files_checked += 1;
                match r {
                    Ok(n) => report.bytes_checked += n,
                    Err(e) => report.failures.push(e),
                }
            }
            Ok(report)
        }
        .instrument(span)
        .await
    }

    async fn verify_object(&self, full: Path, rec: &FileRecord) -> Result<u64> {
        let metrics = self.root.metrics();
        let store = self.root.store();
        add(&metrics.get_requests, 1);
        let meta = store
            .head(&full)
            .await
            .map_err(|e| CheckpointError::store("head", &full, e))?;
        if meta.size != rec.size {
            add(&metrics.integrity_failures, 1);
            return Err(CheckpointError::SizeMismatch {
                path: full,
                expected: rec.size,
                actual: meta.size,
            });
        }
        let part_len = |i: usize| rec.part_range(i).map_or(0, |r| r.end - r.start);
        let check = |i: usize, crc: &Crc32c| -> Result<()> {
            let expected = rec.part_crc(i).unwrap_or(rec.crc32c);
            let actual = crc.value();
            if actual == expected {
                Ok(())
            } else {
                let part = (!rec.parts.is_empty()).then_some(i);
                Err(self.mismatch(full.clone(), part, expected, actual))
            }
        };
        if rec.size == 0 {
            check(0, &Crc32c::new())?;
            return Ok(0);
        }
        // Sequential ranged GETs of a bounded size: memory per file is one chunk, and local
        // stores read in large blocks instead of their 8 KiB streaming chunks.
        let (mut idx, mut left, mut crc) = (0usize, part_len(0), Crc32c::new());
        let mut offset = 0u64;
        while offset < rec.size {
            let end = rec
                .size
                .min(offset.saturating_add(self.config.verify_chunk_size));
            add(&metrics.get_requests, 1);
            let chunk = store
                .get_range(&full, offset..end)
                .await
                .map_err(|e| CheckpointError::store("get", &full, e))?;
            add(&metrics.bytes_read, chunk.len() as u64);
            if chunk.len() as u64 != end - offset {
                add(&metrics.integrity_failures, 1);
                return Err(CheckpointError::SizeMismatch {
                    path: full,
                    expected: rec.size,
                    actual: offset + chunk.len() as u64,
                });
            }
            let mut c: &[u8] = &chunk;
            while !c.is_empty() {
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(c.len());
                let (head, rest) = c.split_at(n);
                crc.update(head);
                left -= n as u64;
                c = rest;
                if left == 0 {
                    check(idx, &crc)?;
                    idx += 1;
                    crc = Crc32c::new();
                    left = part_len(idx);
                }
            }
            offset = end;
        }
        Ok(rec.size)
    }
}

/// The part holding byte `offset` (0 for a single-PUT file).
fn part_index(rec: &FileRecord, offset: u64) -> usize {
    if rec.parts.is_empty() || rec.part_size == 0 {
        0
    } else {
        usize::try_from(offset / rec.part_size).unwrap_or(usize::MAX)
    }
}
