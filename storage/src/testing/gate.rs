//! [`GateStore`]: holds the ranged GETs of one object that start at or past an offset until the
//! test opens the gate — a server that stalls after the first part of a large object.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::watch;

/// What the gate has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateCounts {
    /// Requests held (so far, in all).
    pub held: usize,
    /// Held requests let through after the gate opened.
    pub released: usize,
}

#[derive(Debug)]
struct Gate {
    open: watch::Sender<bool>,
    counts: watch::Sender<GateCounts>,
}

/// Holds GETs of objects whose path contains `needle` when their range starts at or past
/// `from` bytes (a GET without a range counts as starting at 0), until [`GateStore::open`].
/// Everything else passes through at once.
#[derive(Debug, Clone)]
pub struct GateStore {
    inner: Arc<dyn ObjectStore>,
    needle: String,
    from: u64,
    gate: Arc<Gate>,
}

impl GateStore {
    /// A closed gate in front of `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, needle: impl Into<String>, from: u64) -> Self {
        Self {
            inner,
            needle: needle.into(),
            from,
            gate: Arc::new(Gate {
                open: watch::Sender::new(false),
                counts: watch::Sender::new(GateCounts::default()),
            }),
        }
    }

    /// Lets the held requests, and all later ones, through.
    pub fn open(&self) {
        self.gate.open.send_replace(true);
    }

    /// What the gate has seen so far.
    pub fn counts(&self) -> GateCounts {
        *self.gate.counts.borrow()
    }

    /// Waits until at least `n` requests have been held.
    pub async fn wait_held(&self, n: usize) {
        let mut rx = self.gate.counts.subscribe();
        // The sender lives in `self`, so this ends only when the condition holds.
        let _ = rx.wait_for(|c| c.held >= n).await;
    }

    fn holds(&self, location: &Path, options: &GetOptions) -> bool {
        let start = match &options.range {
            None => 0,
            Some(GetRange::Bounded(r)) => r.start,
            Some(GetRange::Offset(o)) => *o,
            // A suffix range's start depends on the object's size; treat it as past `from`.
            Some(GetRange::Suffix(_)) => u64::MAX,
        };
        !options.head && start >= self.from && location.as_ref().contains(&self.needle)
    }
}

impl fmt::Display for GateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GateStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for GateStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let mut open = self.gate.open.subscribe();
        if self.holds(location, &options) && !*open.borrow() {
            self.gate.counts.send_modify(|c| c.held += 1);
            let _ = open.wait_for(|o| *o).await;
            self.gate.counts.send_modify(|c| c.released += 1);
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
