//! The Python exception tree. Every message names the file (or object) and the problem.
//!
//! `ShardstreamError` is the base; subclasses say what kind of failure it was so that callers
//! can catch, say, a hash mismatch without parsing messages.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    shardstream,
    ShardstreamError,
    PyException,
    "Base class of every shardstream error."
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

/// An exception class with two bases, made when the module is imported: a shardstream class and
/// the built-in one that Python code catches for the same failure (`except FileNotFoundError`
/// around a load; `except ValueError`, which Mosaic raises for a checksum failure). `create_exception!`
/// takes one base, hence a class built by `type(name, bases, namespace)`.
pub struct TwoBaseException {
    name: &'static str,
    doc: &'static str,
    bases: fn(Python<'_>) -> PyResult<Bound<'_, PyTuple>>,
    class: PyOnceLock<Py<PyType>>,
}

impl TwoBaseException {
    const fn new(
        name: &'static str,
        doc: &'static str,
        bases: fn(Python<'_>) -> PyResult<Bound<'_, PyTuple>>,
    ) -> Self {
        TwoBaseException {
            name,
            doc,
            bases,
            class: PyOnceLock::new(),
        }
    }

    /// The class (made on first use).
    pub fn class<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyType>> {
        self.class
            .get_or_try_init(py, || {
                let namespace = PyDict::new(py);
                namespace.set_item("__module__", "shardstream")?;
                namespace.set_item("__doc__", self.doc)?;
                let class =
                    py.get_type::<PyType>()
                        .call1((self.name, (self.bases)(py)?, namespace))?;
                Ok::<_, PyErr>(class.cast_into::<PyType>()?.unbind())
            })
            .map(|c| c.bind(py))
    }

    /// An error of this class with `msg` (the GIL is taken if this thread does not hold it).
    pub fn new_err(&self, msg: String) -> PyErr {
        Python::attach(|py| match self.class(py) {
            Ok(class) => PyErr::from_type(class.clone(), msg),
            Err(e) => e,
        })
    }
}

/// `CorruptDataError(ShardstreamError, ValueError)`.
pub static CORRUPT_DATA: TwoBaseException = TwoBaseException::new(
    "CorruptDataError",
    "A shard, index or checkpoint file is malformed or truncated (also a ValueError).",
    |py| {
        PyTuple::new(
            py,
            [
                py.get_type::<ShardstreamError>(),
                py.get_type::<PyValueError>(),
            ],
        )
    },
);

/// `HashMismatchError(CorruptDataError)`.
pub static HASH_MISMATCH: TwoBaseException = TwoBaseException::new(
    "HashMismatchError",
    "A file's bytes do not match the hash or size recorded for it.",
    |py| PyTuple::new(py, [CORRUPT_DATA.class(py)?.clone()]),
);

/// `NotFoundError(ShardstreamError, FileNotFoundError)`.
pub static NOT_FOUND: TwoBaseException = TwoBaseException::new(
    "NotFoundError",
    "An object or file that should exist does not (also a FileNotFoundError).",
    |py| {
        PyTuple::new(
            py,
            [
                py.get_type::<ShardstreamError>(),
                py.get_type::<PyFileNotFoundError>(),
            ],
        )
    },
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ShardstreamError", py.get_type::<ShardstreamError>())?;
    m.add("CorruptDataError", CORRUPT_DATA.class(py)?)?;
    m.add("HashMismatchError", HASH_MISMATCH.class(py)?)?;
    m.add("NotFoundError", NOT_FOUND.class(py)?)?;
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
        F::HashMismatch { .. } | F::SizeMismatch { .. } => HASH_MISMATCH.new_err(msg),
        F::InvalidIndex { .. }
        | F::UnsupportedVersion { .. }
        | F::CorruptShard { .. }
        | F::Decompress { .. }
        | F::UnsafePath { .. }
        | F::Decode { .. }
        | F::Tar { .. }
        | F::ShardTooLarge { .. } => CORRUPT_DATA.new_err(msg),
        F::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            NOT_FOUND.new_err(msg)
        }
        F::Io { .. } => StorageError::new_err(msg),
        F::Unknown { .. }
        | F::UnsafeEncoding { .. }
        | F::Encode { .. }
        | F::InvalidArgument(_)
        | F::Unsupported { .. }
        | F::InvalidInput { .. } => PyValueError::new_err(msg),
        _ => ShardstreamError::new_err(msg),
    }
}

/// Maps a storage-layer error to the Python exception of its kind.
pub fn from_storage(err: shardstream_storage::StorageError) -> PyErr {
    use shardstream_storage::StorageError as S;
    let msg = err.to_string();
    match err {
        S::NotFound { .. } => NOT_FOUND.new_err(msg),
        S::SizeMismatch { .. } => HASH_MISMATCH.new_err(msg),
        S::InvalidUrl { .. } | S::UnsafePath { .. } | S::Config { .. } => {
            PyValueError::new_err(msg)
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
        E::NotFound { .. } => NOT_FOUND.new_err(msg),
        E::Corrupt { .. } => CORRUPT_DATA.new_err(msg),
        E::HashMismatch { .. } => HASH_MISMATCH.new_err(msg),
        E::BudgetExceeded { .. } | E::LimitTooSmall { .. } => BudgetExceededError::new_err(msg),
        E::OutOfRange { .. } => pyo3::exceptions::PyIndexError::new_err(msg),
        E::InvalidConfig { .. }
        | E::InvalidWeights { .. }
        | E::RankOutOfRange { .. }
        | E::ShapeMismatch { .. }
        | E::UnsupportedStateVersion { .. } => PyValueError::new_err(msg),
        E::Cache(C::HashMismatch { .. } | C::SizeMismatch { .. }) => HASH_MISMATCH.new_err(msg),
        E::Cache(C::LimitTooSmall { .. }) => BudgetExceededError::new_err(msg),
        // A download that failed after its retries, raised to the readers that waited for it.
        E::Cache(_) | E::Io { .. } | E::FetchFailed { .. } => StorageError::new_err(msg),
        _ => ShardstreamError::new_err(msg),
    }
}
