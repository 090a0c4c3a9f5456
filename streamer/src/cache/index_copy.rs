//! Copies of remote indexes (`index.json`, or `index.ssx` when that is what was read) in the
//! cache folder, keyed by their URL, so that opening a dataset again on
//! the same node (the next epoch's dataset object, the node's other ranks and spawned DataLoader
//! workers, a restarted rank) reads the index from disk instead of from the store, as
//! mosaicml-streaming reuses `local/index.json`.
//!
//! A copy is written to a temp name and renamed. The temp name is fixed and written only under
//! the copy's lock (`locks/<id>.index`), so writers of any thread, process or PID namespace never
//! share a half-written file, and a temp file left by a crash is simply overwritten by the next
//! save. Unlike the shard files a copy is not fsynced: what a power cut can leave of it does not
//! parse, and a copy that does not parse is the caller's cue to read the store again and
//! replace it. Only a folder that holds
//! this cache's layout marker is read, written or cleaned. The copies are small and are not
//! counted against `cache_limit`, which bounds the shard files.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::error::{io_err, CacheError, Result};
use super::layout::{remove_if_present, KeyId, Layout};
use super::lock::{self, Mode};

/// How long a save waits for another writer of the same copy before giving up (the caller then
/// goes on without saving).
const SAVE_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The copy of the index at `url` kept in cache folder `dir`, if there is one (never read from
/// a folder that is not this cache's).
pub(crate) fn read_index_copy(dir: &Path, url: &str) -> Result<Option<Vec<u8>>> {
    let layout = Layout::new(dir.to_path_buf());
    if !layout.is_ours() {
        return Ok(None);
    }
    let path = layout.index_copy(&KeyId::of(url));
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", &path)(e)),
    }
}

/// Keeps `bytes`, the index read from `url`, in cache folder `dir` (made if missing; a folder
/// of another layout is refused).
pub(crate) fn save_index_copy(dir: &Path, url: &str, bytes: &[u8]) -> Result<()> {
    let layout = Layout::new(dir.to_path_buf());
    layout.create()?;
    let id = KeyId::of(url);
    let lock_path = layout.index_lock(&id);
    let _writing = match lock::lock(
        &lock_path,
        Mode::Exclusive,
        Some(Instant::now() + SAVE_LOCK_WAIT),
    ) {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            return Err(CacheError::LockTimeout {
                path: lock_path,
                waited: SAVE_LOCK_WAIT,
            })
        }
        Err(e) => return Err(io_err("lock", &lock_path)(e)),
    };
    // Not fsynced, unlike the shard files: a copy cut short by a power cut is an unclosed JSON
    // document (or one with a tail of zeros), which does not parse, so it is read from the store
    // again; and an fsync here stalls the shard downloads' own commits on the same disk.
    let (path, tmp) = (layout.index_copy(&id), layout.index_copy_tmp(&id));
    fs::write(&tmp, bytes).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("rename", &tmp))
}

/// Removes the copy of the index at `url` (one that failed to parse); nothing is removed from a
/// folder that is not this cache's.
pub(crate) fn remove_index_copy(dir: &Path, url: &str) -> Result<()> {
    let layout = Layout::new(dir.to_path_buf());
    if !layout.is_ours() {
        return Ok(());
    }
    remove_if_present(&layout.index_copy(&KeyId::of(url))).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cache::layout::list_names;

    #[test]
    fn a_saved_copy_reads_back_per_url_and_can_be_removed() {
        let dir = tempfile::tempdir().unwrap();
        let a = "s3://bucket/a/index.json";
        let b = "s3://bucket/b/index.json";
        assert_eq!(read_index_copy(dir.path(), a).unwrap(), None);
        save_index_copy(dir.path(), a, b"{\"version\":2}").unwrap();
        save_index_copy(dir.path(), b, b"{}").unwrap();
        assert_eq!(
            read_index_copy(dir.path(), a).unwrap().as_deref(),
            Some(&b"{\"version\":2}"[..])
        );
        assert_eq!(
            read_index_copy(dir.path(), b).unwrap().as_deref(),
            Some(&b"{}"[..])
        );
        // The folder became a cache folder, with no temp file left behind.
        assert!(dir.path().join("SHARDSTREAM-CACHE").is_file());
        let mut names = list_names(&dir.path().join("indexes")).unwrap();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| n.ends_with(".json")), "{names:?}");
        remove_index_copy(dir.path(), a).unwrap();
        assert_eq!(read_index_copy(dir.path(), a).unwrap(), None);
        remove_index_copy(dir.path(), a).unwrap();
    }

    #[test]
    fn a_folder_of_another_layout_is_neither_read_written_nor_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let url = "s3://b/index.json";
        let theirs = Layout::new(dir.path().to_path_buf()).index_copy(&KeyId::of(url));
        fs::create_dir_all(theirs.parent().unwrap()).unwrap();
        fs::write(&theirs, b"someone else's file").unwrap();
        fs::write(dir.path().join("SHARDSTREAM-CACHE"), "{\"layout\":99}\n").unwrap();
        assert!(save_index_copy(dir.path(), url, b"{}").is_err());
        assert_eq!(read_index_copy(dir.path(), url).unwrap(), None);
        remove_index_copy(dir.path(), url).unwrap();
        assert_eq!(fs::read(&theirs).unwrap(), b"someone else's file");
    }

    #[test]
    fn concurrent_saves_never_expose_a_partial_copy() {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let url = "s3://bucket/ds/index.json";
        let body: Arc<Vec<u8>> = Arc::new((0..200_000u32).map(|i| (i % 251) as u8).collect());
        save_index_copy(dir.path(), url, &body).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (dir, body) = (Arc::clone(&dir), Arc::clone(&body));
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        if t % 2 == 0 {
                            save_index_copy(dir.path(), url, &body).unwrap();
                        } else {
                            let got = read_index_copy(dir.path(), url).unwrap().unwrap();
                            assert!(got == *body, "a reader saw {} bytes", got.len());
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let names = list_names(&dir.path().join("indexes")).unwrap();
        assert_eq!(names.len(), 1, "{names:?}");
    }
}
