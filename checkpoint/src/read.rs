//! Reading a committed checkpoint: ranged reads that fetch only the bytes asked for, checking
//! every part they cover whole, and a streaming verify of everything.

use crate::checksum::{combine_parts, crc32c, Crc32c};
use crate::error::{CheckpointError, Result};
use crate::fetch::{cut, read_pieces, ReadTarget};
use crate::layout::join;
use crate::manifest::{FileRecord, Manifest};
use crate::metrics::add;
use crate::CheckpointRoot;
use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use tracing::{info_span, Instrument};

/// Read settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadConfig {
    /// Largest single ranged GET of a local file or a file without parts; ranges are also cut
    /// at part boundaries.
    pub chunk_size: u64,
    /// Largest part of a multipart file, or single-PUT file, in a store that is fetched with
    /// one GET rather than in `chunk_size` pieces (0: always in pieces).
    pub whole_part_max: u64,
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
            // 16 MiB: large enough for full-speed GETs, small enough that one file is read
            // by several requests (or threads, for a local directory) at once.
            chunk_size: 16 << 20,
            // The largest default single PUT (a planned file, see `UploadConfig::
            // single_put_max`; parts are at most 64 MiB): what went up as one PUT comes back as
            // one GET.
            whole_part_max: crate::config::DEFAULT_SINGLE_PUT_MAX,
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
                whole_part_max: config.whole_part_max,
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

    /// The root this checkpoint was opened from.
    pub(crate) fn checkpoint_root(&self) -> &CheckpointRoot {
        &self.root
    }

    /// The read settings.
    pub(crate) fn config(&self) -> &ReadConfig {
        &self.config
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
        let align = if rec.parts.is_empty() {
            0
        } else {
            rec.part_size
        };
        let local = self.local_file(rec);
        // From a store, what went up as one request comes back as one GET: each part of a
        // multipart file, or a whole single-PUT file (up to `whole_part_max`). Fewer requests
        // keep a load inside the store's request rates, and some servers (moto) answer a
        // ranged GET by reading the whole object, so 16 MiB ranges of a 64 MiB object cost
        // four whole-object reads. A local file keeps `chunk_size` preads in parallel threads.
        let unit = if align > 0 { align } else { rec.size };
        let chunk = if local.is_none() && unit <= self.config.whole_part_max {
            self.config.chunk_size.max(unit)
        } else {
            self.config.chunk_size
        };
        let pieces = cut(range.clone(), chunk, align);
        let target = ReadTarget {
            store: self.root.store(),
            path: &full,
            local: local.as_deref(),
        };
        let (bytes, crcs) = read_pieces(
            target,
            &pieces,
            self.config.max_concurrent_requests,
            self.root.metrics(),
        )
        .await?;

        // Check every part covered whole by combining its pieces' checksums.
        let mut i = 0;
        while i < pieces.len() {
            let pi = part_index(rec, pieces[i].start);
            let mut j = i;
            while j < pieces.len() && part_index(rec, pieces[j].start) == pi {
                j += 1;
            }
            if let (Some(pr), Some(expected)) = (rec.part_range(pi), rec.part_crc(pi)) {
                if range.start <= pr.start && range.end >= pr.end {
                    let actual = combine_parts(
                        pieces[i..j]
                            .iter()
                            .zip(&crcs[i..j])
                            .map(|(r, c)| (*c, r.end - r.start)),
                    );
                    if actual != expected {
                        let part = (!rec.parts.is_empty()).then_some(pi);
                        return Err(self.mismatch(full, part, expected, actual));
                    }
                }
            }
            i = j;
        }
        Ok(bytes)
    }

    /// The bytes of `range` of file `path` that [`CheckpointReader::read_range`] checks against
    /// the manifest: the parts the range covers whole. A caller with finer checksums of its own
    /// (per DCP item) needs to check only what lies outside it.
    pub fn checked_within(&self, path: &str, range: Range<u64>) -> Result<Range<u64>> {
        let rec = self.record(path)?;
        if range.is_empty() || range.end > rec.size {
            return Ok(range.start..range.start);
        }
        let first = part_index(rec, range.start);
        let last = part_index(rec, range.end - 1);
        let start_part = match rec.part_range(first) {
            Some(r) if r.start >= range.start => first,
            _ => first + 1,
        };
        let end_part = match rec.part_range(last) {
            Some(r) if r.end <= range.end => Some(last),
            _ => last.checked_sub(1),
        };
        match (
            end_part.and_then(|e| (e >= start_part).then_some(e)),
            rec.part_range(start_part),
        ) {
            (Some(e), Some(s)) => Ok(s.start..rec.part_range(e).map_or(s.start, |r| r.end)),
            _ => Ok(range.start..range.start),
        }
    }

    /// The local file behind `rec` when the root is a POSIX directory (read with `pread`).
    pub(crate) fn local_file(&self, rec: &FileRecord) -> Option<PathBuf> {
        let root = self.root.local_root()?;
        let mut p = root.join(&self.manifest.checkpoint_id);
        for part in rec.path.split('/') {
            p.push(part);
        }
        Some(p)
    }

    pub(crate) fn mismatch(
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
        check_size(&self.root, &full, rec).await?;
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
/// Fails unless the object at `full` has the size its manifest record claims (a HEAD), before
/// any of its bytes are read or any buffer is sized from the record.
pub(crate) async fn check_size(root: &CheckpointRoot, full: &Path, rec: &FileRecord) -> Result<()> {
    let metrics = root.metrics();
    add(&metrics.get_requests, 1);
    let meta = root
        .store()
        .head(full)
        .await
        .map_err(|e| CheckpointError::store("head", full, e))?;
    if meta.size != rec.size {
        add(&metrics.integrity_failures, 1);
        return Err(CheckpointError::SizeMismatch {
            path: full.clone(),
            expected: rec.size,
            actual: meta.size,
        });
    }
    Ok(())
}

fn part_index(rec: &FileRecord, offset: u64) -> usize {
    if rec.parts.is_empty() || rec.part_size == 0 {
        0
    } else {
        usize::try_from(offset / rec.part_size).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use crate::{CheckpointRoot, CommitRequest, UploadConfig};
    use bytes::Bytes;
    use object_store::{memory::InMemory, path::Path};
    use std::sync::Arc;

    #[tokio::test]
    async fn checked_within_is_the_whole_parts_of_a_range() {
        let root = CheckpointRoot::new(Arc::new(InMemory::new()), Path::from("r"));
        let attempt = root.begin_save("step_1").await.unwrap();
        let config = UploadConfig {
            part_size: 1024,
            memory_budget: 4096,
            ..Default::default()
        };
        let w = root.rank_writer(&attempt, 0, &config).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let rec = w
            .upload_bytes("f", Bytes::from(data.clone()))
            .await
            .unwrap();
        let small = w
            .upload_bytes("g", Bytes::from_static(b"tiny"))
            .await
            .unwrap();
        let req = CommitRequest {
            records: vec![rec.clone(), small.clone()],
            world_size: 1,
            ..Default::default()
        };
        root.commit(&attempt, req).await.unwrap();
        let r = root.open("step_1").await.unwrap();
        assert_eq!(r.checked_within(&rec.path, 100..3000).unwrap(), 1024..2048);
        assert_eq!(r.checked_within(&rec.path, 0..5000).unwrap(), 0..5000);
        assert_eq!(r.checked_within(&rec.path, 4096..5000).unwrap(), 4096..5000);
        assert!(r.checked_within(&rec.path, 10..1000).unwrap().is_empty());
        assert_eq!(r.checked_within(&small.path, 0..4).unwrap(), 0..4);
        assert!(r.checked_within(&small.path, 1..4).unwrap().is_empty());
        // Reads across part boundaries return the bytes asked for.
        let got = r.read_range(&rec.path, 100..3000).await.unwrap();
        assert_eq!(&got[..], &data[100..3000]);
    }
}
