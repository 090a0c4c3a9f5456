//! [`CountingStore`]: counts requests by kind, bytes moved and the peak of concurrent GETs.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::decorate::Decorator;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

use super::OpKind;

/// A snapshot of a [`CountingStore`]'s counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// GET requests (whole or ranged).
    pub get: u64,
    /// HEAD requests.
    pub head: u64,
    /// Single PUTs.
    pub put: u64,
    /// Multipart uploads started.
    pub put_multipart: u64,
    /// Multipart parts uploaded.
    pub put_part: u64,
    /// Multipart uploads completed.
    pub complete: u64,
    /// LIST requests.
    pub list: u64,
    /// Objects deleted.
    pub delete: u64,
    /// Copies.
    pub copy: u64,
    /// Body bytes received by GETs.
    pub bytes_read: u64,
    /// Payload bytes sent by PUTs and parts.
    pub bytes_written: u64,
    /// Most GETs open at the same time (from request to end or drop of the body).
    pub max_concurrent_gets: usize,
}

#[derive(Debug, Default)]
struct Counters {
    by_kind: [AtomicU64; 9],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    open_gets: AtomicUsize,
    max_open_gets: AtomicUsize,
}

impl Counters {
    fn bump(&self, kind: OpKind) {
        if let Some(c) = self.by_kind.get(kind as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn kind(&self, kind: OpKind) -> u64 {
        self.by_kind
            .get(kind as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// Decrements the open-GET gauge when a GET's body ends or is dropped.
struct OpenGet(Arc<Counters>);

impl OpenGet {
    fn new(counters: &Arc<Counters>) -> Self {
        let open = counters.open_gets.fetch_add(1, Ordering::SeqCst) + 1;
        counters.max_open_gets.fetch_max(open, Ordering::SeqCst);
        Self(Arc::clone(counters))
    }
}

impl Drop for OpenGet {
    fn drop(&mut self) {
        self.0.open_gets.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts the requests made through it; forwards everything to the inner store.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    counters: Arc<Counters>,
}

impl CountingStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            counters: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        let c = &self.counters;
        Counts {
            get: c.kind(OpKind::Get),
            head: c.kind(OpKind::Head),
            put: c.kind(OpKind::Put),
            put_multipart: c.kind(OpKind::PutMultipart),
            put_part: c.kind(OpKind::PutPart),
            complete: c.kind(OpKind::Complete),
            list: c.kind(OpKind::List),
            delete: c.kind(OpKind::Delete),
            copy: c.kind(OpKind::Copy),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            max_concurrent_gets: c.max_open_gets.load(Ordering::SeqCst),
        }
    }
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountingStore({})", self.inner)
    }
}

#[async_trait]
impl Decorator for CountingStore {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.counters.bump(OpKind::Put);
        let len = payload.content_length() as u64;
        self.counters
            .bytes_written
            .fetch_add(len, Ordering::Relaxed);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.counters.bump(OpKind::PutMultipart);
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(CountingUpload {
            inner,
            counters: Arc::clone(&self.counters),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let kind = OpKind::of_get(&options);
        self.counters.bump(kind);
        if kind == OpKind::Head {
            return self.inner.get_opts(location, options).await;
        }
        let open = OpenGet::new(&self.counters);
        let result = self.inner.get_opts(location, options).await?;
        let counters = Arc::clone(&self.counters);
        Ok(map_body(result, move |stream| {
            stream
                .map(move |chunk| {
                    let _still_open = &open;
                    if let Ok(bytes) = &chunk {
                        counters
                            .bytes_read
                            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
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
        let counters = Arc::clone(&self.counters);
        let counted = locations
            .inspect(move |_| counters.bump(OpKind::Delete))
            .boxed();
        self.inner.delete_stream(counted)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counters.bump(OpKind::List);
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.counters.bump(OpKind::List);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.counters.bump(OpKind::Copy);
        self.inner.copy_opts(from, to, options).await
    }
}

crate::object_store_decorator!(CountingStore);

/// Replaces a GET's body by `f(body)`, turning file payloads (local store) into streams.
pub(crate) fn map_body(
    result: GetResult,
    f: impl FnOnce(
        BoxStream<'static, object_store::Result<bytes::Bytes>>,
    ) -> BoxStream<'static, object_store::Result<bytes::Bytes>>,
) -> GetResult {
    let meta = result.meta.clone();
    let range = result.range.clone();
    let attributes = result.attributes.clone();
    let extensions = result.extensions.clone();
    let stream = result.into_stream();
    GetResult {
        payload: GetResultPayload::Stream(f(stream)),
        meta,
        range,
        attributes,
        extensions,
    }
}

#[derive(Debug)]
struct CountingUpload {
    inner: Box<dyn MultipartUpload>,
    counters: Arc<Counters>,
}

#[async_trait]
impl MultipartUpload for CountingUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.counters.bump(OpKind::PutPart);
        let len = data.content_length() as u64;
        self.counters
            .bytes_written
            .fetch_add(len, Ordering::Relaxed);
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.counters.bump(OpKind::Complete);
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}
