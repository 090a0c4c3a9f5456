//! The one error type of the streamer crate. Variants carry the values that were wrong, so a
//! message read in a CLI or a Python traceback says what to change.

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
}

/// Result alias for the streamer crate.
pub type Result<T, E = StreamerError> = std::result::Result<T, E>;
