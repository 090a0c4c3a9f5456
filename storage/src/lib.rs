//! Storage layer of shardstream: one [`Location`] type over S3, GCS, Azure and local or
//! network filesystems, built on the `object_store` crate.
//!
//! - Locations are URLs or paths: `s3://bucket/prefix`, `gs://bucket/prefix`,
//!   `az://container/prefix` (`azure://`, `abfs[s]://`), `file:///abs/path`, or a plain path
//!   (relative or absolute: local disk, NFS, EFS). See [`StorageUrl`].
//! - Configuration comes from the standard environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`, plus
//!   `S3_ENDPOINT_URL` as MosaicML Streaming reads it) and explicit [`StorageOptions`]; the
//!   rules are in [`env`]. Without keys, S3 uses the AWS credential chain ([`aws_chain`]:
//!   profiles, SSO, web identity, container, instance metadata). Per-call options by the
//!   names fsspec and `object_store` users know are mapped in [`named_options`].
//! - Transient failures (5xx, 429, `SlowDown`, timeouts, refused connections) are retried
//!   with exponential backoff and jitter. No request moves more than one chunk or part, so
//!   every request has a bounded timeout while a large transfer may take as long as it needs
//!   (the arithmetic is in [`options`]). Every attempt, retries included, is paced per key
//!   prefix by an adaptive limiter that backs off when the store throttles ([`shaping`]).
//! - Large objects are read as parallel ranged GETs and written as parallel multipart
//!   uploads, with memory bounded by `concurrency x chunk size`. Downloads land in files that
//!   appear only complete; [`Location::put_if_absent`] is a create-only conditional put.
//! - Names inside a location are relative and checked ([`key`]): `..`, absolute names and
//!   empty components are refused, whatever file they were read from.
//! - A key the store holds but `object_store` cannot represent (`ds//x`, `ds/../x`) is
//!   skipped with a warning, never fatal to a listing; [`listing`] is the one listing helper.
//! - Errors are one enum, [`StorageError`], whose variants carry the object's URL or path.
//!   Secrets (SAS tokens, signatures, session tokens, keys) never appear in errors, logs or
//!   `Debug` output: see [`redact`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), shardstream_storage::StorageError> {
//! use bytes::Bytes;
//! use shardstream_storage::{Location, PutOutcome};
//!
//! let data = Location::open("s3://my-bucket/datasets/c4")?;
//! let index = data.get("index.json").await?;
//! let shard = data.join("train")?;
//! let bytes = shard.download_to_file("shard.00000.mds", "/cache/shard.00000.mds".as_ref()).await?;
//! assert!(bytes > 0 && !index.is_empty());
//!
//! let ckpt = Location::open("/mnt/efs/ckpt")?; // a plain path works the same way
//! match ckpt.put_if_absent("step-100/manifest.json", Bytes::from_static(b"{}")).await? {
//!     PutOutcome::Created => {}
//!     PutOutcome::AlreadyExists => eprintln!("someone committed step 100 first"),
//! }
//! # Ok(()) }
//! ```
//!
//! Test support (store decorators that count, fail or slow requests; a fault-injecting proxy;
//! a moto S3 server) is in [`testing`], behind the `testing` cargo feature.

#![deny(missing_docs)]

pub mod aws_chain;
mod backend;
pub mod decorate;
pub mod env;
mod error;
mod etag;
pub mod key;
pub mod listing;
mod location;
pub mod named_options;
pub mod options;
pub mod redact;
pub mod shaping;
mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transfer;
pub mod url;

pub use env::{AwsCredentials, Env, S3Settings};
pub use error::{Result, StorageError};
pub use listing::{Listing, SkippedKey};
pub use location::{Location, ObjectInfo, PutOutcome};
pub use options::{RetryPolicy, StorageOptions, Timeouts};
pub use sync::{sync_down, sync_down_with, sync_up, sync_up_with, SyncOptions, SyncReport};
pub use url::StorageUrl;

/// Re-export of the `object_store` crate, for callers that need its types (paths, stores).
pub use object_store;
