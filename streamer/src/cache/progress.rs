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
}
