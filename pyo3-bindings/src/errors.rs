//! The Python exception tree. Every message names the file (or object) and the problem.
//!
//! `ShardstreamError` is the base; subclasses say what kind of failure it was so that callers
//! can catch, say, a hash mismatch without parsing messages.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    shardstream,
    ShardstreamError,
    PyException,
    "Base class of every shardstream error."
);
create_exception!(
    shardstream,
    CorruptDataError,
    ShardstreamError,
    "A shard, index or checkpoint file is malformed or truncated."
);
create_exception!(
    shardstream,
    HashMismatchError,
    CorruptDataError,
    "A file's bytes do not match the hash or size recorded for it."
);
create_exception!(
    shardstream,
    NotFoundError,
    ShardstreamError,
    "An object or file that should exist does not."
);
create_exception!(
    shardstream,
    BudgetExceededError,
    ShardstreamError,
    "A memory or disk budget is too small for what was asked."
);
create_exception!(
    shardstream,
    StorageError,
    ShardstreamError,
    "The object store or filesystem failed (after retries)."
);
create_exception!(
    shardstream,
    CheckpointError,
    ShardstreamError,
    "A checkpoint could not be saved, found or loaded."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ShardstreamError", py.get_type::<ShardstreamError>())?;
    m.add("CorruptDataError", py.get_type::<CorruptDataError>())?;
    m.add("HashMismatchError", py.get_type::<HashMismatchError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("BudgetExceededError", py.get_type::<BudgetExceededError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    Ok(())
}

/// Maps a formats-crate error to the Python exception of its kind; the message (which names the
/// file and the problem) is kept verbatim.
pub fn from_format(err: shardstream_sharding::FormatError) -> PyErr {
    use shardstream_sharding::FormatError as F;
    let msg = err.to_string();
    match err {
        F::HashMismatch { .. } | F::SizeMismatch { .. } => HashMismatchError::new_err(msg),
        F::InvalidIndex { .. }
        | F::UnsupportedVersion { .. }
        | F::CorruptShard { .. }
        | F::Decompress { .. }
        | F::UnsafePath { .. }
        | F::Decode { .. }
        | F::Tar { .. }
        | F::ShardTooLarge { .. } => CorruptDataError::new_err(msg),
        F::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            NotFoundError::new_err(msg)
        }
        F::Io { .. } => StorageError::new_err(msg),
        F::Unknown { .. }
        | F::UnsafeEncoding { .. }
        | F::Encode { .. }
        | F::InvalidArgument(_)
        | F::Unsupported { .. }
        | F::InvalidInput { .. } => pyo3::exceptions::PyValueError::new_err(msg),
        _ => ShardstreamError::new_err(msg),
    }
}

/// Maps a storage-layer error to the Python exception of its kind.
pub fn from_storage(err: shardstream_storage::StorageError) -> PyErr {
    use shardstream_storage::StorageError as S;
    let msg = err.to_string();
    match err {
        S::NotFound { .. } => NotFoundError::new_err(msg),
        S::SizeMismatch { .. } => HashMismatchError::new_err(msg),
        S::InvalidUrl { .. } | S::UnsafePath { .. } | S::Config { .. } => {
            pyo3::exceptions::PyValueError::new_err(msg)
        }
        _ => StorageError::new_err(msg),
    }
}

/// Maps a streamer error (which wraps the formats, storage and cache errors) to the Python
/// exception of its kind.
pub fn from_streamer(err: shardstream_streamer::StreamerError) -> PyErr {
    use shardstream_streamer::cache::CacheError as C;
    use shardstream_streamer::StreamerError as E;
    let msg = err.to_string();
    match err {
        E::Format(e) => from_format(e),
        E::Storage(e) => from_storage(e),
        E::NotFound { .. } => NotFoundError::new_err(msg),
        E::Corrupt { .. } => CorruptDataError::new_err(msg),
        E::HashMismatch { .. } => HashMismatchError::new_err(msg),
        E::BudgetExceeded { .. } | E::LimitTooSmall { .. } => BudgetExceededError::new_err(msg),
        E::OutOfRange { .. } => pyo3::exceptions::PyIndexError::new_err(msg),
        E::InvalidConfig { .. }
        | E::InvalidWeights { .. }
        | E::RankOutOfRange { .. }
        | E::ShapeMismatch { .. }
        | E::UnsupportedStateVersion { .. } => pyo3::exceptions::PyValueError::new_err(msg),
        E::Cache(C::HashMismatch { .. } | C::SizeMismatch { .. }) => {
            HashMismatchError::new_err(msg)
        }
        E::Cache(C::LimitTooSmall { .. }) => BudgetExceededError::new_err(msg),
        // A download that failed after its retries, raised to the readers that waited for it.
        E::Cache(_) | E::Io { .. } | E::FetchFailed { .. } => StorageError::new_err(msg),
        _ => ShardstreamError::new_err(msg),
    }
}
