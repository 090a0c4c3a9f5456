//! Errors of the filesystem and their one mapping to errno values.

use std::fmt;

/// What went wrong below the filesystem, in the shard source (streamer, cache, storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceErrorKind {
    /// The object store or the network failed, after the storage layer's bounded retries.
    Unavailable,
    /// A shard's bytes do not match the index (size, hash, header).
    Corrupt,
    /// The cache or memory budget cannot hold the shard now (everything is pinned).
    NoSpace,
    /// A local file could not be read.
    Io,
    /// The dataset is not readable as asked (unsafe encodings, bad configuration).
    Invalid,
}

/// An error from a [`DatasetSource`](crate::DatasetSource), with the shard it concerns.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?} error on shard {shard}: {message}")]
pub struct SourceError {
    /// What kind of failure this is; decides the errno.
    pub kind: SourceErrorKind,
    /// The shard number, or `usize::MAX` for an error not about one shard.
    pub shard: usize,
    /// The underlying error, as text.
    pub message: String,
}

impl SourceError {
    /// An error of `kind` about `shard`.
    pub fn new(kind: SourceErrorKind, shard: usize, message: impl fmt::Display) -> Self {
        SourceError {
            kind,
            shard,
            message: message.to_string(),
        }
    }
}

/// Every error the filesystem returns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// No entry of this name in the directory.
    #[error("no entry {name:?} in directory inode {parent}")]
    NotFound {
        /// The directory's inode.
        parent: u64,
        /// The name looked up.
        name: String,
    },
    /// The inode number is not one this filesystem gave out.
    #[error("unknown inode {ino}")]
    UnknownInode {
        /// The inode.
        ino: u64,
    },
    /// A directory operation on a file.
    #[error("inode {ino} is not a directory")]
    NotADirectory {
        /// The inode.
        ino: u64,
    },
    /// A file operation on a directory.
    #[error("inode {ino} is a directory")]
    IsADirectory {
        /// The inode.
        ino: u64,
    },
    /// Any attempt to change the filesystem.
    #[error("read-only filesystem: {op} refused")]
    ReadOnly {
        /// The refused operation.
        op: &'static str,
    },
    /// A file handle this filesystem did not hand out (or already released).
    #[error("unknown file handle {fh}")]
    BadHandle {
        /// The handle.
        fh: u64,
    },
    /// The index could not be parsed or does not describe a readable dataset.
    #[error("dataset index: {0}")]
    Index(#[from] shardstream_sharding::FormatError),
    /// A shard's content contradicts the index.
    #[error("shard {shard} is corrupt: {reason}")]
    Corrupt {
        /// The shard.
        shard: usize,
        /// What is wrong.
        reason: String,
    },
    /// The shard source failed (fetch, cache, disk).
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// `Result` with [`FsError`].
pub type Result<T, E = FsError> = std::result::Result<T, E>;

impl FsError {
    /// The errno the kernel passes to the caller: the one mapping, exhaustive over every variant.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound { .. } | FsError::UnknownInode { .. } => libc::ENOENT,
            FsError::NotADirectory { .. } => libc::ENOTDIR,
            FsError::IsADirectory { .. } => libc::EISDIR,
            FsError::ReadOnly { .. } => libc::EROFS,
            FsError::BadHandle { .. } => libc::EBADF,
            FsError::Index(_) | FsError::Corrupt { .. } => libc::EIO,
            FsError::Source(e) => match e.kind {
                SourceErrorKind::Unavailable | SourceErrorKind::Corrupt | SourceErrorKind::Io => {
                    libc::EIO
                }
                SourceErrorKind::NoSpace => libc::ENOBUFS,
                SourceErrorKind::Invalid => libc::EINVAL,
            },
        }
    }

    /// Whether the error is an expected answer (a missing name) rather than a failure worth a
    /// warning in the log.
    pub fn is_expected(&self) -> bool {
        matches!(
            self,
            FsError::NotFound { .. } | FsError::ReadOnly { .. } | FsError::IsADirectory { .. }
        )
    }
}
