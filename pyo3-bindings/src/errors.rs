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
