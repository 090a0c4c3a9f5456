//! How far a download in `tmp/` has come, readable by the other processes of the node.
//!
//! A fetcher that serves a shard while it arrives may share its progress: it keeps the complete
//! prefix in an extended attribute of the temp file, `user.shardstream.progress` (a
//! little-endian `u64`), rewritten as it grows (`dataset::growing::Publisher::advance` says how
//! often). A process that finds the shard's fetch lock taken opens the temp file, and if it
//! carries the attribute, reads the prefix from there instead of waiting for the commit
//! (`dataset::engine` has the joining side).
//!
//! The attribute belongs to the temp file's inode, not to a file beside it: a reader's
//! descriptor and the progress it reads are always the same file, whatever happens to the name
//! afterwards, and the attribute takes no room in the file (the cache's disk limit counts file
//! lengths). Setting an attribute is atomic, so a read never sees half a value. A file system
//! without user attributes (older tmpfs) refuses to set it: the download is then not shared,
//! and other processes wait for the commit.

use std::fs::File;
use std::io;

const NAME: &str = "user.shardstream.progress";
/// The version (ETag) of the object the temp file's bytes come from, set before the first of
/// them is written: a process that finishes a download whose writer died asks for the rest of
/// that version only (`If-Match`), never a newer object's bytes after the old ones.
const VERSION: &str = "user.shardstream.version";
/// Longest version kept (S3 ETags are 34 bytes, multipart ones a few more).
const VERSION_MAX: usize = 1024;

/// Sets the shared prefix of a temp file: its first `prefix` bytes are written.
pub(crate) fn write(file: &File, prefix: u64) -> io::Result<()> {
    rustix::fs::fsetxattr(
        file,
        NAME,
        &prefix.to_le_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(io::Error::from)
}

/// The shared prefix of a temp file: `None` if its writer does not share one (yet).
pub(crate) fn read(file: &File) -> io::Result<Option<u64>> {
    let mut value = [0u8; 8];
    match rustix::fs::fgetxattr(file, NAME, &mut value[..]) {
        Ok(8) => Ok(Some(u64::from_le_bytes(value))),
        Ok(_) => Ok(None),
        Err(e) if e == rustix::io::Errno::NODATA || e == rustix::io::Errno::NOTSUP => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Records the version (ETag) of the object a temp file is a download of.
pub(crate) fn write_version(file: &File, version: &str) -> io::Result<()> {
    if version.len() > VERSION_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "object version too long to record",
        ));
    }
    rustix::fs::fsetxattr(
        file,
        VERSION,
        version.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(io::Error::from)
}

/// The version a temp file's writer recorded: `None` if it recorded none (it died before its
/// first response, or the file system keeps no user attributes).
pub(crate) fn read_version(file: &File) -> io::Result<Option<String>> {
    let mut value = [0u8; VERSION_MAX];
    match rustix::fs::fgetxattr(file, VERSION, &mut value[..]) {
        Ok(n) => Ok(value
            .get(..n)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_string)),
        Err(e) if e == rustix::io::Errno::NODATA || e == rustix::io::Errno::NOTSUP => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_round_trips_on_the_file_and_costs_no_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(100).unwrap();
        assert_eq!(read(&file).unwrap(), None);
        write(&file, 0).unwrap();
        assert_eq!(read(&file).unwrap(), Some(0));
        write(&file, 64).unwrap();
        // Another descriptor on the same file sees it; the file keeps its length.
        let other = File::open(&path).unwrap();
        assert_eq!(read(&other).unwrap(), Some(64));
        assert_eq!(other.metadata().unwrap().len(), 100);
        // It follows the inode through a rename.
        std::fs::rename(&path, dir.path().join("u")).unwrap();
        write(&file, 100).unwrap();
        assert_eq!(read(&other).unwrap(), Some(100));
    }

    #[test]
    fn the_version_round_trips_beside_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let file = File::create(&path).unwrap();
        assert_eq!(read_version(&file).unwrap(), None);
        write_version(&file, "\"0123abcd\"").unwrap();
        write(&file, 7).unwrap();
        let other = File::open(&path).unwrap();
        assert_eq!(
            read_version(&other).unwrap().as_deref(),
            Some("\"0123abcd\"")
        );
        assert_eq!(read(&other).unwrap(), Some(7));
        assert!(write_version(&file, &"x".repeat(VERSION_MAX + 1)).is_err());
    }
}
