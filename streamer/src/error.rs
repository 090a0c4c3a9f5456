//! The one error type of the streamer crate. Variants carry the values that were wrong (and the
//! file or object they concern), so a message read in a CLI or a Python traceback says what to
//! change.

use std::path::PathBuf;

use crate::cache::CacheError;
use shardstream_sharding::FormatError;
use shardstream_storage::StorageError;

/// Errors raised by the streamer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamerError {
    /// An order or partition setting is out of its range (a zero window, zero lanes, a world
    /// with zero processes, ...).
    #[error("invalid {setting}: {reason}")]
    InvalidConfig {
        /// The setting, as the user spells it (`window`, `lanes`, `batch_size`, ...).
        setting: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// The stream weights (`proportion`, `repeat`, `choose`, `epoch_size`) do not describe a mix.
    #[error("invalid stream weights: {reason}")]
    InvalidWeights {
        /// What is wrong with them.
        reason: String,
    },
    /// A dataset is too large for the order's integer types (more than 2^32 shards, or more than
    /// 2^64 samples in an epoch).
    #[error("dataset too large: {reason}")]
    TooLarge {
        /// Which limit was passed.
        reason: String,
    },
    /// A rank does not belong to the world it was given.
    #[error(
        "rank (node {node}, local process {local_process}, worker {worker}) is outside the world \
         ({nodes} nodes x {processes_per_node} processes x {workers} workers)"
    )]
    RankOutOfRange {
        /// The rank's node.
        node: u32,
        /// The rank's process on its node.
        local_process: u32,
        /// The rank's DataLoader worker.
        worker: u32,
        /// Nodes in the world.
        nodes: u32,
        /// Processes per node in the world.
        processes_per_node: u32,
        /// Workers per process in the world.
        workers: u32,
    },
    /// A saved stream state does not belong to this dataset (its shard counts or weights differ),
    /// so resuming from it could not be sample-exact.
    #[error(
        "stream state was saved for another dataset: shape fingerprint {saved}, this dataset has \
         {current}"
    )]
    ShapeMismatch {
        /// The fingerprint recorded in the state.
        saved: String,
        /// The fingerprint of the dataset it is being applied to.
        current: String,
    },
    /// A saved stream state has a version this build does not read.
    #[error(
        "stream state version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedStateVersion {
        /// The version in the state.
        found: u32,
        /// The version this build writes and reads.
        supported: u32,
    },
    /// The dataset's index or one of its shards does not exist.
    #[error("not found: {what}")]
    NotFound {
        /// The URL or path that is missing.
        what: String,
    },
    /// A shard or index is damaged: its bytes do not parse, or its size is not what the index
    /// records. Raised after the fetch was retried.
    #[error("corrupt {what}: {reason}")]
    Corrupt {
        /// The shard (URL or path) or index.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A shard's bytes do not match the hash its index records (after retries).
    #[error("shard {what}: {algorithm} is {actual}, the index records {expected}")]
    HashMismatch {
        /// The shard (URL or path).
        what: String,
        /// The hash algorithm.
        algorithm: String,
        /// The digest in the index.
        expected: String,
        /// The digest of the fetched bytes.
        actual: String,
    },
    /// A single buffer (one sample, one chunk) needs more than the whole memory budget.
    #[error(
        "memory_limit too small: {what} needs {need} bytes at once, memory_limit is {limit} \
         bytes; raise memory_limit"
    )]
    BudgetExceeded {
        /// What needed the memory.
        what: String,
        /// Bytes needed at once.
        need: u64,
        /// The configured budget.
        limit: u64,
    },
    /// The disk limit cannot hold what the sample order needs at once (checked at start).
    #[error(
        "cache_limit too small: the order needs {need} bytes of shards at once ({reason}), \
         cache_limit is {limit} bytes; raise cache_limit or lower the shuffle window"
    )]
    LimitTooSmall {
        /// Bytes needed.
        need: u64,
        /// The configured limit.
        limit: u64,
        /// Where the need comes from.
        reason: String,
    },
    /// A shard or sample index past the end of the dataset.
    #[error("{what} {index} is out of range (the dataset has {len})")]
    OutOfRange {
        /// `"shard"` or `"sample"`.
        what: &'static str,
        /// The index asked for.
        index: u64,
        /// How many there are.
        len: u64,
    },
    /// A dataset format error (index or shard bytes), naming the file.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// An object-store error, naming the object.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A cache error (disk limit, locks, cache folder I/O), naming the file or shard.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// A local file operation outside the cache failed.
    #[error("{op} {path}: {source}", path = path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A shard that was being served while it downloaded could not be completed (the download
    /// failed after its retries); raised to the readers that were waiting for its bytes.
    #[error("fetching {what} failed: {reason}")]
    FetchFailed {
        /// The shard (URL or path).
        what: String,
        /// The download's error.
        reason: String,
        /// Whether that error was a transient storage failure (see
        /// [`StreamerError::is_transient`]).
        transient: bool,
    },
    /// The fetch engine's runtime could not start or a background task died.
    #[error("fetch engine: {0}")]
    Engine(String),
}

impl StreamerError {
    /// Whether retrying the same request later may succeed (a transient storage failure).
    pub fn is_transient(&self) -> bool {
        match self {
            StreamerError::Storage(e) => e.is_transient(),
            StreamerError::FetchFailed { transient, .. } => *transient,
            StreamerError::Cache(CacheError::Fetch { source, .. }) => source
                .downcast_ref::<StorageError>()
                .is_some_and(StorageError::is_transient),
            _ => false,
        }
    }
}

/// Result alias for the streamer crate.
pub type Result<T, E = StreamerError> = std::result::Result<T, E>;
