//! The one error type of the formats crate. Every variant names the file (or column) it is about,
//! so a user reading a CLI or Python error knows where to look.

use std::path::Path;

/// Errors raised while reading or writing dataset formats.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// An index file (MDS `index.json`, LitData `index.json`, a merged index) is not valid.
    #[error("{path}: invalid index: {reason}")]
    InvalidIndex {
        /// The index file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An index or shard declares a format version this build does not read.
    #[error("{path}: unsupported version {version} (this build reads version 2)")]
    UnsupportedVersion {
        /// The file that declares it.
        path: String,
        /// The version found.
        version: String,
    },
    /// A shard's bytes do not follow the format (bad header, offsets out of range, bad sample).
    #[error("{path}: corrupt shard: {reason}")]
    CorruptShard {
        /// The shard file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file is shorter (or longer) than its index or header says.
    #[error("{path}: size mismatch: expected {expected} bytes, found {actual}")]
    SizeMismatch {
        /// The file.
        path: String,
        /// The size recorded in the index or header.
        expected: u64,
        /// The size found.
        actual: u64,
    },
    /// A file's hash does not equal the one recorded in the index.
    #[error("{path}: {algorithm} hash mismatch: expected {expected}, got {actual}")]
    HashMismatch {
        /// The file.
        path: String,
        /// The hash algorithm (`sha1`, `xxh64`, ...).
        algorithm: String,
        /// The hash recorded in the index.
        expected: String,
        /// The hash of the bytes found.
        actual: String,
    },
    /// Decompressing a file failed (corrupt frame, truncated stream).
    #[error("{path}: {algorithm} decompression failed: {reason}")]
    Decompress {
        /// The compressed file.
        path: String,
        /// The compression algorithm.
        algorithm: String,
        /// The decoder's message.
        reason: String,
    },
    /// A name inside a dataset (a basename, a tar member) would escape the dataset's folder.
    #[error("{path}: unsafe name {name:?}: {reason}")]
    UnsafePath {
        /// The file that holds the name (index, tar).
        path: String,
        /// The offending name.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// An encoding, compression or hash name that does not exist.
    #[error("unknown {kind} {name:?}")]
    Unknown {
        /// What kind of name (`encoding`, `compression`, `hash`).
        kind: &'static str,
        /// The name given.
        name: String,
    },
    /// `pkl` (pickle) data, refused unless the user opts in, as Mosaic does.
    #[error("{path}: column {column:?} uses the unsafe encoding {encoding:?}; pass allow_unsafe_types to read it")]
    UnsafeEncoding {
        /// The file.
        path: String,
        /// The column.
        column: String,
        /// The encoding.
        encoding: String,
    },
    /// A value could not be encoded for its column.
    #[error("column {column:?} ({encoding}): {reason}")]
    Encode {
        /// The column.
        column: String,
        /// Its encoding.
        encoding: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// A sample's bytes could not be decoded for its column.
    #[error("{path}: sample {sample}, column {column:?} ({encoding}): {reason}")]
    Decode {
        /// The shard file.
        path: String,
        /// The sample's index inside the shard.
        sample: u64,
        /// The column.
        column: String,
        /// Its encoding.
        encoding: String,
        /// What is wrong with the bytes.
        reason: String,
    },
    /// A tar archive is malformed or truncated.
    #[error("{path}: invalid tar: {reason}")]
    Tar {
        /// The tar file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A valid file uses a feature this build does not read (an encrypted LitData dataset, an
    /// xz-compressed tar, a `bfloat16` tensor, ...).
    #[error("{path}: unsupported: {what}")]
    Unsupported {
        /// The file.
        path: String,
        /// The feature, and where possible what to do instead.
        what: String,
    },
    /// An input record (a JSONL line, a file) cannot be turned into a sample.
    #[error("{path}: {reason}")]
    InvalidInput {
        /// The input file, with a line number where there is one (`data.jsonl:17`).
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard would exceed the format's hard limit (MDS offsets are u32: 4 GiB).
    #[error("{path}: shard of {size} bytes exceeds the format limit of {limit} bytes")]
    ShardTooLarge {
        /// The shard being written.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// An argument (column spec, size limit, hash list) is not valid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An I/O error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

impl FormatError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// A corrupt-shard error for `path`.
    pub fn corrupt(path: impl Into<String>, reason: impl Into<String>) -> Self {
        FormatError::CorruptShard {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// An invalid-index error for `path`.
    pub fn invalid_index(path: impl Into<String>, reason: impl Into<String>) -> Self {
        FormatError::InvalidIndex {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
