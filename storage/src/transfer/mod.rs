//! Multi-request transfers: parallel ranged GETs, downloads to files, multipart uploads.
//!
//! Memory is bounded by permits of a [`tokio::sync::Semaphore`]: one permit per chunk or part
//! in memory (in flight, or received and waiting to be written), so a transfer never holds
//! more than `permits x chunk size` bytes, whatever the object's size. The `sync_*` helpers
//! share one semaphore across all the files they move.

pub(crate) mod get;
pub(crate) mod put;

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{Result, StorageError};

/// Marker inside the names of temporary files; local walks skip such files.
pub(crate) const TEMP_MARKER: &str = ".shardstream-tmp-";

/// Splits `range` into consecutive ranges of at most `chunk` bytes.
pub(crate) fn chunk_ranges(range: Range<u64>, chunk: u64) -> Vec<Range<u64>> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let mut start = range.start;
    while start < range.end {
        let end = range.end.min(start.saturating_add(chunk));
        out.push(start..end);
        start = end;
    }
    out
}

/// A temporary file next to its final name, removed on drop unless committed.
///
/// Dropping covers errors and cancellation (a dropped future) alike, so no partial file is
/// left under either the final or the temporary name.
pub(crate) struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl TempFile {
    /// A fresh temporary name in the folder of `dest` (same filesystem, so rename is atomic).
    pub(crate) fn beside(dest: &Path) -> Result<Self> {
        let name =
            dest.file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| StorageError::UnsafePath {
                    name: dest.display().to_string(),
                    reason: "destination has no UTF-8 file name",
                })?;
        let suffix: u64 = rand::random();
        let tmp = format!(".{name}{TEMP_MARKER}{suffix:016x}");
        Ok(Self {
            path: dest.with_file_name(tmp),
            armed: true,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file to `dest` and makes the rename durable.
    pub(crate) async fn commit(mut self, dest: &Path) -> Result<()> {
        tokio::fs::rename(&self.path, dest)
            .await
            .map_err(|e| StorageError::io(dest, e))?;
        self.armed = false;
        if let Some(dir) = dest.parent() {
            sync_dir(dir).await?;
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = std::fs::remove_file(&self.path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot remove temporary file");
                }
            }
        }
    }
}

/// fsyncs a directory so that a rename inside it survives a crash.
async fn sync_dir(dir: &Path) -> Result<()> {
    let owned = dir.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::File::open(&owned).and_then(|f| f.sync_all()))
        .await
        .map_err(|e| StorageError::io(dir, std::io::Error::other(e)))?
        .map_err(|e| StorageError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_ranges_cover_exactly_once() {
        assert_eq!(chunk_ranges(0..10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(chunk_ranges(0..8, 4), vec![0..4, 4..8]);
        assert_eq!(chunk_ranges(3..4, 4), vec![3..4]);
        assert!(chunk_ranges(5..5, 4).is_empty());
    }

    #[test]
    fn temp_file_is_removed_unless_committed() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x.bin");
        let tmp = TempFile::beside(&dest).unwrap();
        std::fs::write(tmp.path(), b"partial").unwrap();
        assert!(tmp
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .contains(TEMP_MARKER));
        drop(tmp);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
