//! Fault injection for tests of the checkpoint protocol: [`FaultStore`] wraps any object store
//! and fails or freezes chosen requests (the Nth multipart part, a PUT or a copy whose key
//! ends with a suffix), and counts requests. A frozen request never completes, which lets a
//! crash test kill the process at an exact phase of a save. Used by this crate's tests and by
//! the `shardstream-ckpt-fault` binary that the Python crash tests drive.

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, MultipartUpload, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, UploadPart,
};
use shardstream_storage::decorate::Decorator;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Called with a description of the request when a request freezes.
pub type PauseHook = Arc<dyn Fn(&str) + Send + Sync>;

/// What happens to a matched request.
#[derive(Clone)]
pub enum FaultAction {
    /// The request fails with a generic store error.
    Fail,
    /// The hook runs, then the request never completes.
    Pause(PauseHook),
}

impl fmt::Debug for FaultAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fail => f.write_str("Fail"),
            Self::Pause(_) => f.write_str("Pause"),
        }
    }
}

/// Request counts seen by a [`FaultStore`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultStats {
    /// Single PUTs.
    pub puts: u64,
    /// Multipart uploads started.
    pub multipart_started: u64,
    /// Parts sent.
    pub parts: u64,
    /// Multipart uploads completed.
    pub completed: u64,
    /// Multipart uploads aborted.
    pub aborted: u64,
    /// GETs (including HEADs and ranged GETs).
    pub gets: u64,
    /// Most part bytes ever in flight at once (sent, not yet answered).
    pub peak_part_bytes_in_flight: u64,
}

#[derive(Debug, Default)]
struct Shared {
    part_delay: Option<std::time::Duration>,
    part_fault: Option<(u64, FaultAction)>,
    put_fault: Option<(String, FaultAction)>,
    copy_fault: Option<FaultAction>,
    puts: AtomicU64,
    multipart_started: AtomicU64,
    parts: AtomicU64,
    completed: AtomicU64,
    aborted: AtomicU64,
    gets: AtomicU64,
    part_bytes_in_flight: AtomicU64,
    peak_part_bytes_in_flight: AtomicU64,
}

/// An object store decorator that injects faults.
#[derive(Debug, Clone)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    shared: Arc<Shared>,
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

async fn act(action: FaultAction, what: String) -> object_store::Result<()> {
    match action {
        FaultAction::Fail => Err(object_store::Error::Generic {
            store: "FaultStore",
            source: format!("injected failure: {what}").into(),
        }),
        FaultAction::Pause(hook) => {
            hook(&what);
            std::future::pending::<()>().await;
            Ok(())
        }
    }
}

impl FaultStore {
    /// Wraps `inner` with no faults.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            shared: Arc::default(),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Shared)) -> Self {
        let mut s = Shared::default();
        let old = &*self.shared;
        s.part_delay = old.part_delay;
        s.part_fault = old.part_fault.clone();
        s.put_fault = old.put_fault.clone();
        s.copy_fault = old.copy_fault.clone();
        f(&mut s);
        self.shared = Arc::new(s);
        self
    }

    /// Applies `action` to the `n`th part (1-based) sent through this store.
    pub fn on_part(self, n: u64, action: FaultAction) -> Self {
        self.edit(|s| s.part_fault = Some((n, action)))
    }

    /// Makes every part take at least `delay` (so that parts pile up in flight).
    pub fn part_delay(self, delay: std::time::Duration) -> Self {
        self.edit(|s| s.part_delay = Some(delay))
    }

    /// Applies `action` to every single PUT whose key ends with `suffix`.
    pub fn on_put(self, suffix: impl Into<String>, action: FaultAction) -> Self {
        let suffix = suffix.into();
        self.edit(|s| s.put_fault = Some((suffix, action)))
    }

    /// Applies `action` to every copy.
    pub fn on_copy(self, action: FaultAction) -> Self {
        self.edit(|s| s.copy_fault = Some(action))
    }

    /// Request counts so far.
    pub fn stats(&self) -> FaultStats {
        let s = &self.shared;
        let r = |c: &AtomicU64| c.load(Ordering::SeqCst);
        FaultStats {
            puts: r(&s.puts),
            multipart_started: r(&s.multipart_started),
            parts: r(&s.parts),
            completed: r(&s.completed),
            aborted: r(&s.aborted),
            gets: r(&s.gets),
            peak_part_bytes_in_flight: r(&s.peak_part_bytes_in_flight),
        }
    }
}

#[derive(Debug)]
struct FaultUpload {
    inner: Box<dyn MultipartUpload>,
    shared: Arc<Shared>,
    path: Path,
}

#[async_trait]
impl MultipartUpload for FaultUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let n = self.shared.parts.fetch_add(1, Ordering::SeqCst) + 1;
        let action = match &self.shared.part_fault {
            Some((at, a)) if *at == n => Some(a.clone()),
            _ => None,
        };
        match action {
            None => {
                let len = data.content_length() as u64;
                let shared = self.shared.clone();
                let now = shared.part_bytes_in_flight.fetch_add(len, Ordering::SeqCst) + len;
                shared
                    .peak_part_bytes_in_flight
                    .fetch_max(now, Ordering::SeqCst);
                let fut = self.inner.put_part(data);
                let delay = shared.part_delay;
                Box::pin(async move {
                    if let Some(d) = delay {
                        tokio::time::sleep(d).await;
                    }
                    let r = fut.await;
                    shared.part_bytes_in_flight.fetch_sub(len, Ordering::SeqCst);
                    r
                })
            }
            Some(a) => {
                let what = format!("part {n} of {}", self.path);
                Box::pin(act(a, what))
            }
        }
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.shared.completed.fetch_add(1, Ordering::SeqCst);
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.shared.aborted.fetch_add(1, Ordering::SeqCst);
        self.inner.abort().await
    }
}

#[async_trait]
impl Decorator for FaultStore {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.shared.puts.fetch_add(1, Ordering::SeqCst);
        if let Some((suffix, a)) = &self.shared.put_fault {
            if location.as_ref().ends_with(suffix.as_str()) {
                act(a.clone(), format!("put {location}")).await?;
            }
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.shared.multipart_started.fetch_add(1, Ordering::SeqCst);
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultUpload {
            inner,
            shared: self.shared.clone(),
            path: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.shared.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_opts(location, options).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        if let Some(a) = &self.shared.copy_fault {
            act(a.clone(), format!("copy {from} -> {to}")).await?;
        }
        self.inner.copy_opts(from, to, options).await
    }
}

shardstream_storage::object_store_decorator!(FaultStore);
