//! Copies of remote `index.json` files in the cache folder, so that opening a dataset again on
//! the same node (the next epoch's dataset object, a restarted rank, the node's other ranks and
//! spawned DataLoader workers) reads the index from disk instead of from the store, as
//! mosaicml-streaming reuses `local/index.json`.
//!
//! A copy is written to a temp name and renamed, so it is either absent or whole; a copy that
//! does not parse (a disk fault, a power cut before the data reached the disk) is the caller's
//! cue to read the store again and replace it. The copies are small and are not counted
//! against `cache_limit`, which bounds the shard files.

use std::fs;
use std::io;
use std::path::Path;

use super::error::{io_err, Result};
use super::layout::{remove_if_present, KeyId, Layout};

/// The copy of the index at `url` kept in cache folder `dir`, if there is one.
pub fn read_index_copy(dir: &Path, url: &str) -> Result<Option<Vec<u8>>> {
    let path = Layout::new(dir.to_path_buf()).index_copy(&KeyId::of(url));
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", &path)(e)),
    }
}

/// Keeps `bytes`, the index read from `url`, in cache folder `dir` (made if missing). Several
/// processes may save the same index at once: each writes its own temp file, and the last
/// rename wins with the same bytes.
pub fn save_index_copy(dir: &Path, url: &str, bytes: &[u8]) -> Result<()> {
    let layout = Layout::new(dir.to_path_buf());
    layout.create()?;
    let path = layout.index_copy(&KeyId::of(url));
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    // No fsync: a copy cut short by a power failure does not parse, and is then read again
    // from the store, so durability is not worth the milliseconds at every cold open.
    let written = fs::write(&tmp, bytes)
        .map_err(io_err("write", &tmp))
        .and_then(|()| fs::rename(&tmp, &path).map_err(io_err("rename", &tmp)));
    if written.is_err() {
        let _ = remove_if_present(&tmp);
    }
    written
}

/// Removes the copy of the index at `url` (one that failed to parse).
pub fn remove_index_copy(dir: &Path, url: &str) -> Result<()> {
    let path = Layout::new(dir.to_path_buf()).index_copy(&KeyId::of(url));
    remove_if_present(&path).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let names = super::super::layout::list_names(&dir.path().join("indexes")).unwrap();
        assert_eq!(names.len(), 2, "{names:?}");
        remove_index_copy(dir.path(), a).unwrap();
        assert_eq!(read_index_copy(dir.path(), a).unwrap(), None);
        remove_index_copy(dir.path(), a).unwrap();
    }

    #[test]
    fn a_folder_of_another_layout_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("SHARDSTREAM-CACHE"), "{\"layout\":99}\n").unwrap();
        assert!(save_index_copy(dir.path(), "s3://b/index.json", b"{}").is_err());
        assert_eq!(
            read_index_copy(dir.path(), "s3://b/index.json").unwrap(),
            None
        );
    }
}
