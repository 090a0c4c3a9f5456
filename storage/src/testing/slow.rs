//! [`SlowStore`]: per-request latency and a bandwidth cap, to test timeouts, prefetch depth and
//! throughput-bound behaviour without a slow network. Sleeps use `tokio::time`, so tests can
//! run them under a paused clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::decorate::Decorator;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use super::counting::map_body;

/// Delays every request by a fixed latency and paces bodies to a byte rate.
#[derive(Debug)]
pub struct SlowStore {
    inner: Arc<dyn ObjectStore>,
    latency: Duration,
    bytes_per_sec: Option<u64>,
}

impl SlowStore {
    /// Wraps `inner`, adding `latency` before every request.
    pub fn new(inner: Arc<dyn ObjectStore>, latency: Duration) -> Self {
        Self {
            inner,
            latency,
            bytes_per_sec: None,
        }
    }

    /// Caps each GET body and PUT payload at `bytes_per_sec` (per request, not overall).
    pub fn with_bandwidth(mut self, bytes_per_sec: u64) -> Self {
        self.bytes_per_sec = Some(bytes_per_sec.max(1));
        self
    }

    fn transfer_time(&self, bytes: usize) -> Duration {
        match self.bytes_per_sec {
            Some(rate) => Duration::from_secs_f64(bytes as f64 / rate as f64),
            None => Duration::ZERO,
        }
    }

    async fn wait(&self) {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}

impl fmt::Display for SlowStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlowStore({})", self.inner)
    }
}

#[async_trait]
impl Decorator for SlowStore {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.wait().await;
        tokio::time::sleep(self.transfer_time(payload.content_length())).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.wait().await;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.wait().await;
        let result = self.inner.get_opts(location, options).await?;
        let Some(rate) = self.bytes_per_sec else {
            return Ok(result);
        };
        Ok(map_body(result, move |stream| {
            stream
                .then(move |chunk| async move {
                    if let Ok(bytes) = &chunk {
                        let secs = bytes.len() as f64 / rate as f64;
                        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    }
                    chunk
                })
                .boxed()
        }))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let latency = self.latency;
        let delayed = locations
            .then(move |p| async move {
                tokio::time::sleep(latency).await;
                p
            })
            .boxed();
        self.inner.delete_stream(delayed)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let latency = self.latency;
        let inner = self.inner.list(prefix);
        futures::stream::once(async move { tokio::time::sleep(latency).await })
            .filter_map(|()| async { None::<object_store::Result<ObjectMeta>> })
            .chain(inner)
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.wait().await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.wait().await;
        self.inner.copy_opts(from, to, options).await
    }
}

crate::object_store_decorator!(SlowStore);
