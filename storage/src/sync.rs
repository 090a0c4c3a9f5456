//! Whole-folder transfers for `shardstream upload` / `download`: parallel, resumable, verified.
//!
//! A file is skipped when the other side already has it: same size, and, where the ETag is
//! an S3 MD5 ETag, the same content digest (see [`crate::etag`]). Re-running an interrupted
//! sync therefore moves only what is missing or different. Downloads land through temporary
//! files and renames, uploads are single atomic PUTs or completed multipart uploads, so an
//! interruption never leaves a file that a re-run would wrongly skip.
//!
//! All files of one sync share one budget of `concurrency` requests (and as many chunks or
//! parts in memory), however many files are in flight.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use futures::{stream, StreamExt, TryStreamExt};
use tokio::sync::Semaphore;

use crate::error::{Result, StorageError};
use crate::etag::{self, Md5Etag};
use crate::location::{Location, ObjectInfo};
use crate::transfer::TEMP_MARKER;

/// Options of a folder sync.
#[derive(Debug, Clone, Default)]
pub struct SyncOptions {
    /// Incremented by the bytes moved, as they move (for progress bars).
    pub progress: Option<Arc<AtomicU64>>,
    /// Skip on size alone, without comparing content digests.
    pub size_only: bool,
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Files transferred.
    pub transferred: usize,
    /// Files skipped because the destination already matched.
    pub skipped: usize,
    /// Bytes transferred.
    pub bytes: u64,
}

impl SyncReport {
    fn add(mut self, moved: Option<u64>) -> Self {
        match moved {
            Some(n) => {
                self.transferred += 1;
                self.bytes += n;
            }
            None => self.skipped += 1,
        }
        self
    }
}

/// Uploads every file below `local_dir` to `dest`, keeping relative paths.
pub async fn sync_up(local_dir: &Path, dest: &Location) -> Result<SyncReport> {
    sync_up_with(local_dir, dest, &SyncOptions::default()).await
}

/// [`sync_up`] with options.
pub async fn sync_up_with(
    local_dir: &Path,
    dest: &Location,
    options: &SyncOptions,
) -> Result<SyncReport> {
    let files = walk(local_dir).await?;
    let remote = by_key(dest.list("").await?);
    let concurrency = dest.options().concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    stream::iter(files)
        .map(|(key, local)| {
            let existing = remote.get(&key).cloned();
            let permits = Arc::clone(&permits);
            async move {
                let part_size = dest
                    .options()
                    .part_size_for(existing.as_ref().map_or(0, |o| o.size));
                if same_content(&local, existing.as_ref(), part_size, options).await? {
                    return Ok(None);
                }
                let progress = options.progress.as_deref();
                dest.upload_with(&local, &key, permits, progress)
                    .await
                    .map(Some)
            }
        })
        .buffer_unordered(concurrency)
        .try_fold(SyncReport::default(), |report, moved| async move {
            Ok(report.add(moved))
        })
        .await
}

/// Downloads every object below `src` into `local_dir`, keeping relative paths.
pub async fn sync_down(src: &Location, local_dir: &Path) -> Result<SyncReport> {
    sync_down_with(src, local_dir, &SyncOptions::default()).await
}

/// [`sync_down`] with options.
pub async fn sync_down_with(
    src: &Location,
    local_dir: &Path,
    options: &SyncOptions,
) -> Result<SyncReport> {
    let objects = without_folder_markers(src.list("").await?);
    let concurrency = src.options().concurrency.max(1);
    let permits = Arc::new(Semaphore::new(concurrency));
    stream::iter(objects)
        .map(|object| {
            let permits = Arc::clone(&permits);
            async move {
                let dest = local_target(local_dir, &object.key)?;
                let part_size = src.options().part_size_for(object.size);
                if same_content(&dest, Some(&object), part_size, options).await? {
                    return Ok(None);
                }
                let progress = options.progress.as_deref();
                src.download_with(&object.key, &dest, permits, progress)
                    .await
                    .map(Some)
            }
        })
        .buffer_unordered(concurrency)
        .try_fold(SyncReport::default(), |report, moved| async move {
            Ok(report.add(moved))
        })
        .await
}

/// The local file for an object key, refusing keys that would escape `local_dir`.
fn local_target(local_dir: &Path, key: &str) -> Result<PathBuf> {
    let parts = crate::key::components(key)?;
    Ok(parts
        .iter()
        .fold(local_dir.to_path_buf(), |p, part| p.join(part)))
}

/// True if `local` exists and matches `object` (size, then MD5 ETag where there is one).
async fn same_content(
    local: &Path,
    object: Option<&ObjectInfo>,
    part_size: usize,
    options: &SyncOptions,
) -> Result<bool> {
    let Some(object) = object else {
        return Ok(false);
    };
    let size = match tokio::fs::metadata(local).await {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(StorageError::io(local, e)),
    };
    if size != object.size {
        return Ok(false);
    }
    let md5 = object.e_tag.as_deref().and_then(Md5Etag::parse);
    let Some(md5) = md5.filter(|_| !options.size_only) else {
        return Ok(true);
    };
    let path = local.to_path_buf();
    tokio::task::spawn_blocking(move || etag::file_matches(&path, &md5, part_size))
        .await
        .map_err(|e| StorageError::io(local, std::io::Error::other(e)))?
}

/// Drops empty "folder marker" objects (`dir/`, as S3 consoles create them, listed as `dir`)
/// that would otherwise become files where directories must go.
fn without_folder_markers(objects: Vec<ObjectInfo>) -> Vec<ObjectInfo> {
    let is_dir: std::collections::BTreeSet<&str> = objects
        .iter()
        .filter_map(|o| o.key.rsplit_once('/').map(|(dir, _)| dir))
        .flat_map(|dir| {
            dir.match_indices('/')
                .filter_map(|(i, _)| dir.get(..i))
                .chain([dir])
        })
        .collect();
    let markers: Vec<bool> = objects
        .iter()
        .map(|o| o.size == 0 && is_dir.contains(o.key.as_str()))
        .collect();
    objects
        .into_iter()
        .zip(markers)
        .filter_map(|(o, marker)| (!marker).then_some(o))
        .collect()
}

fn by_key(objects: Vec<ObjectInfo>) -> BTreeMap<String, ObjectInfo> {
    objects.into_iter().map(|o| (o.key.clone(), o)).collect()
}

/// Regular files below `root` as (relative key with `/` separators, path), sorted by key.
/// Symbolic links to files are followed, links to directories are not (no cycles);
/// temporary files of interrupted downloads are skipped.
async fn walk(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let root = root.to_path_buf();
    let err_root = root.clone();
    tokio::task::spawn_blocking(move || walk_blocking(&root))
        .await
        .map_err(|e| StorageError::io(err_root, std::io::Error::other(e)))?
}

fn walk_blocking(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut dirs = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, key_prefix)) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| StorageError::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io(&dir, e))?;
            let path = entry.path();
            let name = entry
                .file_name()
                .into_string()
                .map_err(|n| StorageError::UnsafePath {
                    name: n.to_string_lossy().into_owned(),
                    reason: "file name is not UTF-8",
                })?;
            if name.contains(TEMP_MARKER) {
                continue;
            }
            let key = format!("{key_prefix}{name}");
            let file_type = entry.file_type().map_err(|e| StorageError::io(&path, e))?;
            if file_type.is_dir() {
                dirs.push((path, format!("{key}/")));
            } else if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                out.push((key, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_lists_nested_files_and_skips_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/c.bin"), b"c").unwrap();
        std::fs::write(dir.path().join("top"), b"t").unwrap();
        std::fs::write(dir.path().join(format!(".x{TEMP_MARKER}0001")), b"partial").unwrap();
        let keys: Vec<String> = walk_blocking(dir.path())
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec!["a/b/c.bin".to_string(), "top".to_string()]);
    }

    #[test]
    fn folder_markers_are_dropped_but_empty_files_kept() {
        let info = |key: &str, size| ObjectInfo {
            key: key.into(),
            size,
            e_tag: None,
            last_modified: std::time::SystemTime::UNIX_EPOCH,
        };
        let kept = without_folder_markers(vec![
            info("a", 0),
            info("a/b", 0),
            info("a/b/c", 5),
            info("empty", 0),
            info("x", 3),
            info("x/y", 1),
        ]);
        let keys: Vec<&str> = kept.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a/b/c", "empty", "x", "x/y"]);
    }

    #[test]
    fn local_target_refuses_escaping_keys() {
        assert!(local_target(Path::new("/d"), "../x").is_err());
        assert_eq!(
            local_target(Path::new("/d"), "a/b").unwrap(),
            PathBuf::from("/d/a/b")
        );
    }
}
