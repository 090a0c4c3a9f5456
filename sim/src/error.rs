//! The scale model's one error type.

use thiserror::Error;

/// What can go wrong while modelling.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SimError {
    /// A shape or setting is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidConfig {
        /// The setting (e.g. `cluster.nodes`).
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A size or count does not fit in its integer type.
    #[error("{what} overflows")]
    Overflow {
        /// The quantity.
        what: &'static str,
    },
    /// The order or planning code refused the shape.
    #[error(transparent)]
    Streamer(#[from] shardstream_streamer::StreamerError),
    /// The checkpoint code refused the shape.
    #[error(transparent)]
    Checkpoint(#[from] shardstream_checkpoint::CheckpointError),
    /// A modelled document could not be serialized.
    #[error("cannot serialize {what}: {reason}")]
    Serialize {
        /// The document.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A dataset index could not be read.
    #[error("cannot read index {path}: {reason}")]
    Index {
        /// The index file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Result of the scale model.
pub type Result<T> = std::result::Result<T, SimError>;

/// `a * b`, or an overflow error naming `what`.
pub(crate) fn mul(a: u64, b: u64, what: &'static str) -> Result<u64> {
    a.checked_mul(b).ok_or(SimError::Overflow { what })
}

/// `a + b`, or an overflow error naming `what`.
pub(crate) fn add(a: u64, b: u64, what: &'static str) -> Result<u64> {
    a.checked_add(b).ok_or(SimError::Overflow { what })
}
