//! Backends for the shared test bodies: a local directory and a real moto S3 server.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod overwrite;

use std::sync::Arc;

use bytes::Bytes;
use shardstream_storage::object_store::ObjectStore;
use shardstream_storage::testing::MotoServer;
use shardstream_storage::{Env, Location, StorageOptions};

/// Where a test's location lives.
pub enum Backend {
    /// A temporary local directory.
    Local(tempfile::TempDir),
    /// A moto server with a bucket named `test`.
    S3(MotoServer),
}

impl Backend {
    pub async fn local() -> Self {
        Self::Local(tempfile::tempdir().unwrap())
    }

    pub async fn s3() -> Self {
        let moto = MotoServer::start()
            .await
            .unwrap_or_else(|e| panic!("S3 tests need moto_server: {e}"));
        moto.create_bucket("test").await.unwrap();
        Self::S3(moto)
    }

    /// The test location, with options adjusted by `tweak`.
    pub fn location_with(&self, tweak: impl FnOnce(StorageOptions) -> StorageOptions) -> Location {
        match self {
            Self::Local(dir) => {
                let root = dir.path().join("root");
                let options = tweak(StorageOptions::default());
                Location::open_with(root.to_str().unwrap(), &options, &Env::default()).unwrap()
            }
            Self::S3(moto) => {
                let options = tweak(moto.storage_options());
                Location::open_with("s3://test/root", &options, &moto.env()).unwrap()
            }
        }
    }

    pub fn location(&self) -> Location {
        self.location_with(|o| o)
    }

    pub fn is_s3(&self) -> bool {
        matches!(self, Self::S3(_))
    }
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
pub fn data(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// Wraps a location's store with `decorator`, returning both the decorator and the location.
pub fn decorate<D: ObjectStore>(
    loc: &Location,
    make: impl FnOnce(Arc<dyn ObjectStore>) -> D,
) -> (Arc<D>, Location) {
    let decorated = Arc::new(make(Arc::clone(loc.store())));
    let as_store: Arc<dyn ObjectStore> = decorated.clone();
    (decorated, loc.map_store(|_| as_store))
}

/// Runs each named `async fn(Backend)` once per backend, as `NAME::local` and `NAME::s3`.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn local() {
                super::$name($crate::common::Backend::local().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn s3() {
                super::$name($crate::common::Backend::s3().await).await
            }
        }
    )*};
}
