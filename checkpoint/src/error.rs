//! The crate's one error type. Every variant that concerns an object carries its path
//! (the full object-store key), so a log line or a Python exception names the object to look at.

use object_store::path::Path;

/// Result alias used throughout the crate.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// Everything that can go wrong while saving, committing, reading or collecting checkpoints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A checkpoint id or file name is not usable as one path segment of an object key.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A checkpoint root URL or path could not be opened.
    #[error("opening checkpoint root {:?}: {source}", shardstream_storage::redact::redact_url(.url))]
    Location {
        /// The URL or path as given.
        url: String,
        /// The storage layer's error (boxed: it is large and rare).
        #[source]
        source: Box<shardstream_storage::StorageError>,
    },

    /// A configuration value is out of its allowed range.
    #[error("invalid checkpoint configuration: {0}")]
    InvalidConfig(String),

    /// The checkpoint id already has a committed manifest; committed checkpoints are never
    /// overwritten in place.
    #[error("checkpoint {id:?} is already committed ({path})")]
    AlreadyCommitted {
        /// The checkpoint id.
        id: String,
        /// The manifest that exists.
        path: Path,
    },

    /// The checkpoint id has no (valid) manifest, so for readers it does not exist.
    #[error("checkpoint {id:?} is not committed: no manifest at {path}")]
    NotCommitted {
        /// The checkpoint id.
        id: String,
        /// The manifest path that was looked up.
        path: Path,
    },

    /// An object the manifest or a commit request lists is missing from the store.
    #[error("object {path} is missing")]
    MissingObject {
        /// The missing object.
        path: Path,
    },

    /// An object's size differs from the size recorded for it.
    #[error("object {path} has {actual} bytes, expected {expected}")]
    SizeMismatch {
        /// The object.
        path: Path,
        /// The recorded size.
        expected: u64,
        /// The size found.
        actual: u64,
    },

    /// Bytes read back do not match the recorded CRC32C.
    #[error("checksum mismatch in {path}{}: expected crc32c {expected:08x}, got {actual:08x}",
        part.map(|p| format!(" (part {p})")).unwrap_or_default())]
    ChecksumMismatch {
        /// The object.
        path: Path,
        /// The part index when a single part was checked, `None` for the whole object.
        part: Option<usize>,
        /// The recorded CRC32C.
        expected: u32,
        /// The CRC32C of the bytes read.
        actual: u32,
    },

    /// A byte range asked of a file lies outside it.
    #[error("range {start}..{end} is outside {path} ({size} bytes)")]
    RangeOutOfBounds {
        /// The object.
        path: Path,
        /// Range start.
        start: u64,
        /// Range end (exclusive).
        end: u64,
        /// The file size.
        size: u64,
    },

    /// A path asked of a checkpoint is not listed in its manifest.
    #[error("{path} is not a file of checkpoint {id:?}")]
    UnknownFile {
        /// The checkpoint id.
        id: String,
        /// The relative path asked for.
        path: String,
    },

    /// The manifest bytes are not a valid manifest.
    #[error("invalid manifest {path}: {reason}")]
    InvalidManifest {
        /// The manifest object (empty when parsed from bare bytes).
        path: Path,
        /// What is wrong with it.
        reason: String,
    },

    /// The records handed to `commit` do not describe one consistent attempt.
    #[error("invalid commit for checkpoint {id:?}: {reason}")]
    InvalidCommit {
        /// The checkpoint id.
        id: String,
        /// What is inconsistent.
        reason: String,
    },

    /// An earlier error aborted this file's upload; the writer cannot be used any more.
    #[error("the upload of {path} was aborted by an earlier error")]
    Aborted {
        /// The object.
        path: Path,
    },

    /// A data source handed to the writer failed (local file, reader).
    #[error("reading the source for {path}: {source}")]
    Source {
        /// The object being written.
        path: Path,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A local file operation failed (while downloading a checkpoint into a directory).
    #[error("{op} {}: {source}", path.display())]
    Local {
        /// What was being done (`creating`, `writing`, `renaming`, ...).
        op: &'static str,
        /// The local file or folder.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The store ignored the create-only condition (`If-None-Match: *`) on the manifest, and
    /// the manifest read back after this commit's put is another save's: that save holds the
    /// id, this one is not committed.
    #[error(
        "checkpoint {id:?} is not committed by this save: the store ignored the create-only \
         condition (If-None-Match) on {path}, and another save's manifest (attempt {winner}) \
         replaced ours"
    )]
    ConditionalPutIgnored {
        /// The checkpoint id.
        id: String,
        /// The manifest's path.
        path: Path,
        /// The attempt whose manifest the store holds.
        winner: String,
    },

    /// The object store returned an error for an operation on `path`.
    #[error("object store {op} on {path}: {source}")]
    Store {
        /// The operation (`put`, `get`, `head`, `list`, `delete`, `copy`, `complete`, ...).
        op: &'static str,
        /// The object or prefix.
        path: Path,
        /// The object store's error (its retries, e.g. on SlowDown, already happened).
        #[source]
        source: object_store::Error,
    },

    /// Serialising the manifest failed (only possible with unrepresentable user metadata).
    #[error("serialising the manifest of {id:?}: {source}")]
    Serialize {
        /// The checkpoint id.
        id: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

impl CheckpointError {
    /// Wraps an object store error, keeping `NotFound` as [`CheckpointError::MissingObject`].
    /// The error is scrubbed of secrets (a SAS token in a request URL, a reply echoing a
    /// session token): it is printed, with its whole source chain, by the CLI and Python.
    pub fn store(op: &'static str, path: &Path, source: object_store::Error) -> Self {
        match source {
            object_store::Error::NotFound { .. } => Self::MissingObject { path: path.clone() },
            source => Self::Store {
                op,
                path: path.clone(),
                source: shardstream_storage::redact::scrub(source),
            },
        }
    }
}
