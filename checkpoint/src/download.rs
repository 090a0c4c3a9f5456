//! Copying a committed checkpoint into a local directory (`shardstream ckpt download`), in a
//! layout that torch's `FileSystemReader` and this crate's reader both load.
//!
//! Every size in a manifest is a claim made by whoever wrote the bucket. So each object is
//! HEADed and its real size compared with the manifest's before a byte is allocated or a file
//! created; then it is streamed in bounded pieces (at most [`IN_FLIGHT_BYTES`] in memory,
//! whatever the file's size) into `<name>.partial`, every part checked against its CRC32C on the
//! way, and the file is synced and renamed into place. A `.partial` is removed on any error and
//! on cancellation (it is owned by a guard). The manifest is written last, so an interrupted
//! download is never a loadable checkpoint.

use crate::checksum::{crc32c, crc32c_combine};
use crate::error::{CheckpointError, Result};
use crate::fetch::{read_pieces, ReadTarget};
use crate::layout::MANIFEST_NAME;
use crate::manifest::FileRecord;
use crate::CheckpointReader;
use futures::{StreamExt, TryStreamExt};
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use tokio::io::AsyncWriteExt;
use tracing::{debug, info_span, warn, Instrument};

/// Most bytes of one download held in memory at once (pieces fetched and not yet written).
pub const IN_FLIGHT_BYTES: u64 = 256 << 20;

/// What [`CheckpointReader::download_to`] wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DownloadReport {
    /// Files written (data files and root aliases; not the manifest).
    pub files: usize,
    /// Bytes of those files.
    pub bytes: u64,
}

impl CheckpointReader {
    /// Writes every file and alias of the checkpoint under `local` (each checked part by part,
    /// through a `.partial` file renamed into place), then the manifest.
    ///
    /// Errors: [`CheckpointError::SizeMismatch`] naming the object and both sizes when an
    /// object is not the size its manifest claims (checked before anything is allocated),
    /// [`CheckpointError::ChecksumMismatch`], [`CheckpointError::Local`] for local I/O. No
    /// `.partial` file is left behind by a failed download.
    pub async fn download_to(&self, local: &FsPath) -> Result<DownloadReport> {
        let span = info_span!(
            "checkpoint.download",
            id = %self.manifest().checkpoint_id,
            local = %local.display()
        );
        async {
            let manifest = self.manifest();
            let targets = manifest
                .files
                .iter()
                .map(|f| f.path.as_str())
                .chain(manifest.aliases.iter().map(|a| a.path.as_str()));
            let mut report = DownloadReport::default();
            for rel in targets {
                let rec = self.record(rel)?;
                self.download_file(rel, rec, &local_path(local, rel))
                    .await?;
                report.files += 1;
                report.bytes = report.bytes.saturating_add(rec.size);
            }
            let json = manifest.to_json()?;
            let mut out = Partial::create(&local.join(MANIFEST_NAME)).await?;
            out.write(&json).await?;
            out.publish().await?;
            Ok(report)
        }
        .instrument(span)
        .await
    }

    async fn download_file(&self, rel: &str, rec: &FileRecord, dest: &FsPath) -> Result<()> {
        let full = self.object_path(rel)?;
        let root = self.checkpoint_root();
        let metrics = root.metrics();
        crate::read::check_size(root, &full, rec).await?;
        let mut out = Partial::create(dest).await?;
        if rec.size == 0 {
            if crc32c(&[]) != rec.crc32c {
                return Err(self.mismatch(full, None, rec.crc32c, crc32c(&[])));
            }
            return out.publish().await;
        }

        let local = self.local_file(rec);
        let config = self.config();
        // Like `read_range`: from a store, what went up as one request comes back as one GET
        // when it is small enough; a local file is read in `chunk_size` preads. Either way no
        // piece is larger than the in-flight bound.
        let unit = if rec.parts.is_empty() {
            rec.size
        } else {
            rec.part_size
        };
        let chunk = if local.is_none() && unit <= config.whole_part_max {
            config.chunk_size.max(unit)
        } else {
            config.chunk_size
        }
        .clamp(1, IN_FLIGHT_BYTES);
        let in_flight = usize::try_from(IN_FLIGHT_BYTES / chunk)
            .unwrap_or(1)
            .clamp(1, config.max_concurrent_requests.max(1));
        let target = ReadTarget {
            store: root.store(),
            path: &full,
            local: local.as_deref(),
        };
        let mut pieces = futures::stream::iter(Pieces::new(rec, chunk))
            .map(|r| async move {
                let (bytes, crcs) =
                    read_pieces(target, std::slice::from_ref(&r), 1, metrics).await?;
                let crc = crcs.first().copied().unwrap_or_else(|| crc32c(&bytes));
                Ok::<_, CheckpointError>((r, bytes, crc))
            })
            .buffered(in_flight);

        let mut part = PartCheck::default();
        while let Some((r, bytes, crc)) = pieces.try_next().await? {
            out.write(&bytes).await?;
            if let Some((index, expected, actual)) = part.add(rec, &r, crc) {
                if expected != actual {
                    let index = (!rec.parts.is_empty()).then_some(index);
                    return Err(self.mismatch(full.clone(), index, expected, actual));
                }
            }
        }
        debug!(path = %full, bytes = rec.size, "downloaded");
        out.publish().await
    }
}

/// `local/<rel>` for a relative path the manifest validated (no `..`, no empty segment).
fn local_path(local: &FsPath, rel: &str) -> PathBuf {
    rel.split('/')
        .fold(local.to_path_buf(), |p, seg| p.join(seg))
}

/// The consecutive pieces of a file, at most `chunk` bytes each and never crossing a part
/// boundary, produced lazily: a file of any size costs no memory up front.
struct Pieces<'a> {
    rec: &'a FileRecord,
    chunk: u64,
    offset: u64,
}

impl<'a> Pieces<'a> {
    fn new(rec: &'a FileRecord, chunk: u64) -> Self {
        Self {
            rec,
            chunk: chunk.max(1),
            offset: 0,
        }
    }
}

impl Iterator for Pieces<'_> {
    type Item = Range<u64>;

    fn next(&mut self) -> Option<Range<u64>> {
        let start = self.offset;
        if start >= self.rec.size {
            return None;
        }
        let mut end = self.rec.size.min(start.saturating_add(self.chunk));
        if let Some(part) = part_of(self.rec, start).and_then(|i| self.rec.part_range(i)) {
            end = end.min(part.end);
        }
        self.offset = end;
        Some(start..end)
    }
}

/// The part holding byte `offset` (0 for a single-PUT file).
fn part_of(rec: &FileRecord, offset: u64) -> Option<usize> {
    match offset.checked_div(rec.part_size) {
        Some(i) if !rec.parts.is_empty() => usize::try_from(i).ok(),
        _ => Some(0),
    }
}

/// The CRC32C of the part being streamed, combined from its pieces' CRCs.
#[derive(Default)]
struct PartCheck {
    crc: Option<u32>,
}

impl PartCheck {
    /// Adds piece `r` with CRC `crc`; when it ends a part, returns (part index, recorded CRC,
    /// CRC of the bytes read).
    fn add(&mut self, rec: &FileRecord, r: &Range<u64>, crc: u32) -> Option<(usize, u32, u32)> {
        let len = r.end - r.start;
        let acc = match self.crc {
            None => crc,
            Some(prev) => crc32c_combine(prev, crc, len),
        };
        let index = part_of(rec, r.start)?;
        let part = rec.part_range(index)?;
        if r.end < part.end {
            self.crc = Some(acc);
            return None;
        }
        self.crc = None;
        Some((index, rec.part_crc(index)?, acc))
    }
}

/// A `.partial` file next to its destination, removed on drop unless published: an error or
/// a cancelled future never leaves it behind.
struct Partial {
    tmp: PathBuf,
    dest: PathBuf,
    file: Option<tokio::fs::File>,
}

impl Partial {
    async fn create(dest: &FsPath) -> Result<Self> {
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|source| local("creating", dir, source))?;
        }
        let mut name = dest.file_name().unwrap_or_default().to_os_string();
        name.push(".partial");
        let tmp = dest.with_file_name(name);
        let file = tokio::fs::File::create(&tmp)
            .await
            .map_err(|source| local("creating", &tmp, source))?;
        Ok(Self {
            tmp,
            dest: dest.to_path_buf(),
            file: Some(file),
        })
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        f.write_all(bytes)
            .await
            .map_err(|source| local("writing", &self.tmp, source))
    }

    /// Syncs the file and renames it to its destination.
    async fn publish(mut self) -> Result<()> {
        if let Some(f) = self.file.take() {
            f.sync_all()
                .await
                .map_err(|source| local("writing", &self.tmp, source))?;
        }
        tokio::fs::rename(&self.tmp, &self.dest)
            .await
            .map_err(|source| local("renaming", &self.tmp, source))?;
        // Published: nothing left for the guard to remove.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.tmp.as_os_str().is_empty() {
            return;
        }
        drop(self.file.take());
        match std::fs::remove_file(&self.tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %self.tmp.display(), error = %e, "removing a .partial file"),
        }
    }
}

fn local(op: &'static str, path: &FsPath, source: std::io::Error) -> CheckpointError {
    CheckpointError::Local {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::MAX_FILE_SIZE;
    use crate::test_util::{memory_root, plant_manifest, save};
    use crate::{CheckpointRoot, CommitRequest, ReadConfig, UploadConfig};
    use bytes::Bytes;
    use object_store::ObjectStoreExt;

    fn partials(dir: &FsPath) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.to_string_lossy().ends_with(".partial") {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Issue 40, row 1: a manifest listing a single-PUT file of 2^50 bytes made `ckpt
    /// download` allocate the whole size up front (SIGABRT) and leave a `.partial` behind.
    #[tokio::test]
    async fn hostile_file_size_fails_naming_file_and_size_and_leaves_no_partial() {
        let store_dir = tempfile::tempdir().unwrap();
        let roots = [
            memory_root(),
            CheckpointRoot::open_url(&store_dir.path().to_string_lossy()).unwrap(),
        ];
        for root in roots {
            let mut m = save(&root, "step_1", None, &[("a", b"ok"), ("big", b"tiny")]).await;
            let big = m
                .files
                .iter_mut()
                .find(|f| f.path.ends_with("/big"))
                .unwrap();
            big.size = MAX_FILE_SIZE;
            let big_path = big.path.clone();
            plant_manifest(&root, "step_1", &m).await;

            let reader = root.open("step_1").await.unwrap();
            let out = tempfile::tempdir().unwrap();
            let e = reader.download_to(out.path()).await.unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&big_path), "{msg}");
            assert!(msg.contains("1125899906842624"), "{msg}");
            assert!(
                matches!(e, CheckpointError::SizeMismatch { expected, actual: 4, .. } if expected == MAX_FILE_SIZE),
                "{e:?}"
            );
            assert_eq!(partials(out.path()), Vec::<PathBuf>::new());
            assert!(!out.path().join(MANIFEST_NAME).exists());
        }
    }

    /// A big file is read in pieces no larger than the in-flight bound, lazily.
    #[test]
    fn pieces_are_bounded_and_lazy() {
        let rec = FileRecord {
            path: "attempt-1/f".into(),
            size: 64 << 30,
            crc32c: 0,
            part_size: 0,
            parts: vec![],
            rank: None,
        };
        let mut pieces = Pieces::new(&rec, IN_FLIGHT_BYTES);
        assert_eq!(pieces.next(), Some(0..IN_FLIGHT_BYTES));
        assert_eq!(pieces.count() as u64, (64 << 30) / IN_FLIGHT_BYTES - 1);
        let multipart = FileRecord {
            size: 25,
            part_size: 10,
            parts: vec![0, 0, 0],
            ..rec
        };
        let got: Vec<_> = Pieces::new(&multipart, 4).collect();
        assert_eq!(
            got,
            vec![0..4, 4..8, 8..10, 10..14, 14..18, 18..20, 20..24, 24..25]
        );
    }

    /// Pieces smaller than a part are checked part by part; a corrupt part fails the file
    /// (naming the part) and removes its `.partial`.
    #[tokio::test]
    async fn streams_in_pieces_and_checks_every_part() {
        let root = memory_root();
        let attempt = root.begin_save("step_2").await.unwrap();
        let config = UploadConfig {
            part_size: 1024,
            memory_budget: 4096,
            ..Default::default()
        };
        let w = root.rank_writer(&attempt, 0, &config).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let rec = w
            .upload_bytes(".metadata", Bytes::from(data.clone()))
            .await
            .unwrap();
        let empty = w.upload_bytes("empty", Bytes::new()).await.unwrap();
        let req = CommitRequest {
            records: vec![rec.clone(), empty],
            world_size: 1,
            aliases: vec![(".metadata".into(), ".metadata".into())],
            ..Default::default()
        };
        root.commit(&attempt, req).await.unwrap();
        let small = ReadConfig {
            chunk_size: 300,
            whole_part_max: 0,
            ..Default::default()
        };
        let reader = root.open_with("step_2", small.clone()).await.unwrap();
        let out = tempfile::tempdir().unwrap();
        let report = reader.download_to(out.path()).await.unwrap();
        assert_eq!(
            report,
            DownloadReport {
                files: 3,
                bytes: 10_000
            }
        );
        assert_eq!(std::fs::read(out.path().join(&rec.path)).unwrap(), data);
        assert_eq!(std::fs::read(out.path().join(".metadata")).unwrap(), data);
        assert!(out.path().join(MANIFEST_NAME).exists());

        // Same size, one byte changed in part 2.
        let mut bad = data.clone();
        bad[2500] ^= 1;
        let key = reader.object_path(&rec.path).unwrap();
        root.store().put(&key, bad.into()).await.unwrap();
        let out = tempfile::tempdir().unwrap();
        let e = reader.download_to(out.path()).await.unwrap_err();
        assert!(
            matches!(e, CheckpointError::ChecksumMismatch { part: Some(2), .. }),
            "{e:?}"
        );
        assert_eq!(partials(out.path()), Vec::<PathBuf>::new());
        assert!(!out.path().join(&rec.path).exists());
    }
}
