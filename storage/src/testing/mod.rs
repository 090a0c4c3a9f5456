//! Test support (cargo feature `testing`): store decorators and real S3 servers.
//!
//! Faults and limits are decorators around any `Arc<dyn ObjectStore>`, applied with
//! [`Location::map_store`](crate::Location::map_store), so the code under test is the real
//! code over a real backend:
//! - [`CountingStore`]: requests by kind, bytes moved, peak concurrent GETs;
//! - [`FailingStore`]: fails requests chosen by [`FailRule`]s (kind, path, which ones);
//! - [`SlowStore`]: adds per-request latency and a bandwidth cap.
//!
//! Faults *below* `object_store`'s HTTP client (where its retries live) need a real socket:
//! [`FaultProxy`] sits between the client and a server and answers `503 SlowDown` or never
//! answers at all. [`MotoServer`] runs moto's S3 server on a free loopback port; [`TestServer`]
//! runs any of the servers the conformance suite covers (moto, s3s-fs, fake-gcs-server, Azurite).
//!
//! Other crates use this as a dev-dependency:
//! ```toml
//! [dev-dependencies]
//! shardstream-storage = { workspace = true, features = ["testing"] }
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), shardstream_storage::StorageError> {
//! use std::sync::Arc;
//! use shardstream_storage::testing::{CountingStore, MotoServer};
//!
//! let moto = MotoServer::start().await?; // fails (not skips) if moto is not installed
//! moto.create_bucket("data").await?;
//! let loc = moto.open("s3://data/run1")?;
//! let counting = Arc::new(CountingStore::new(Arc::clone(loc.store())));
//! let loc = loc.map_store(|_| counting.clone());
//! loc.put("a.bin", bytes::Bytes::from_static(b"hello")).await?;
//! assert_eq!(counting.counts().put, 1);
//! # Ok(()) }
//! ```

mod capabilities;
mod counting;
mod failing;
mod gate;
mod moto;
mod proxy;
mod servers;
mod slow;

pub use capabilities::{probe, Capabilities};
pub use counting::{CountingStore, Counts};
pub use failing::{FailRule, FailingStore, Fault};
pub use gate::{GateCounts, GateStore};
pub use moto::{free_port, options_for, test_env, MotoServer, MOTO_ENV};
pub use proxy::{FaultProxy, WindowCount};
pub use servers::{require, ServerKind, TestServer, AZURITE_ACCOUNT, AZURITE_KEY};
pub use slow::SlowStore;

use object_store::GetOptions;

/// The kinds of request a decorator tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// GET of an object or a byte range.
    Get,
    /// HEAD (metadata only).
    Head,
    /// Single PUT.
    Put,
    /// Start of a multipart upload.
    PutMultipart,
    /// One part of a multipart upload.
    PutPart,
    /// Completion of a multipart upload.
    Complete,
    /// LIST (recursive or by delimiter).
    List,
    /// DELETE of one object.
    Delete,
    /// Server-side copy.
    Copy,
}

impl OpKind {
    /// `Head` for metadata-only GETs, else `Get`.
    pub(crate) fn of_get(options: &GetOptions) -> Self {
        if options.head {
            Self::Head
        } else {
            Self::Get
        }
    }
}
