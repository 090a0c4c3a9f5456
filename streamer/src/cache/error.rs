//! The cache's error type.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What can go wrong in the cache. Variants carry the shard key or file they are about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The folder is not safe to keep a cache in (a planted link, another user's folder, a
    /// folder of someone's files): see `shardstream_identity::prepare_node_folder`.
    #[error(transparent)]
    Folder(#[from] shardstream_identity::FolderError),
    /// A file-system call failed.
    #[error("cache: {op} {path}: {source}")]
    Io {
        /// What the cache was doing (`"rename"`, `"fsync"`, ...).
        op: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The disk limit cannot hold what is needed: a shard larger than the limit, a window of
    /// shards that does not fit (see [`super::Cache::check_fits`]), or a cache full of shards
    /// that readers still hold for longer than [`super::CacheConfig::space_wait`].
    #[error(
        "cache limit too small: need {need} bytes, limit is {limit} bytes and {pinned} bytes are \
         held by readers or downloads in progress; raise cache_limit or lower the prefetch window"
    )]
    LimitTooSmall {
        /// Bytes the request needed.
        need: u64,
        /// The configured limit.
        limit: u64,
        /// Bytes that could not be evicted because they were in use.
        pinned: u64,
    },
    /// A downloaded or cached file has the wrong size.
    #[error("shard {key}: expected {expected} bytes, found {actual}")]
    SizeMismatch {
        /// The shard key.
        key: String,
        /// The size the caller expected.
        expected: u64,
        /// The size on disk.
        actual: u64,
    },
    /// A downloaded file does not match its expected hash.
    #[error("shard {key}: {algorithm} is {actual}, expected {expected}")]
    HashMismatch {
        /// The shard key.
        key: String,
        /// The algorithm's name.
        algorithm: String,
        /// The expected hex digest.
        expected: String,
        /// The digest of the bytes on disk.
        actual: String,
    },
    /// The caller's fetch failed; its error is kept as the source.
    #[error("shard {key}: fetch failed: {source}")]
    Fetch {
        /// The shard key.
        key: String,
        /// The fetcher's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file the cache did not create is where the cache would write; it is left alone.
    #[error(
        "{path} was not created by the shardstream cache; remove it or use another cache folder"
    )]
    Foreign {
        /// The file in the way.
        path: PathBuf,
    },
    /// A shard key the cache cannot record.
    #[error("invalid shard key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A run id or other path component that would escape or blur the cache layout.
    #[error("invalid {what} {value:?} for a cache path: {reason}")]
    InvalidName {
        /// Which component (`"run id"`).
        what: &'static str,
        /// The value as given.
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Another process held a lock for longer than [`super::CacheConfig::lock_wait`].
    #[error("timed out after {waited:?} waiting for {path} (another process is fetching or checking this shard)")]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The cache was opened before a `fork`; lock descriptors inherited by a child are shared
    /// with the parent, so each process must open its own.
    #[error("cache {path} was opened by process {opened_by}; open it again in process {current}")]
    Forked {
        /// The cache folder.
        path: PathBuf,
        /// The process that opened it.
        opened_by: u32,
        /// The calling process.
        current: u32,
    },
    /// The folder holds a cache layout this version does not know.
    #[error("{path}: unknown cache layout {found:?}; use another cache folder")]
    Layout {
        /// The marker file.
        path: PathBuf,
        /// What it says.
        found: String,
    },
}

/// The cache's result type.
pub type Result<T, E = CacheError> = std::result::Result<T, E>;

/// `map_err` helper naming the operation and path.
pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CacheError {
    let path = path.to_path_buf();
    move |source| CacheError::Io { op, path, source }
}
