//! [`FailingStore`]: fails the requests that match its rules, forwards the others.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::decorate::Decorator;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

use super::OpKind;

/// The error a matching request gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `NotFound`.
    NotFound,
    /// A server error after retries (as a 503 `SlowDown` that never ended would give).
    Unavailable,
    /// A transport timeout (maps to [`StorageError::Timeout`](crate::StorageError::Timeout)).
    Timeout,
    /// `PermissionDenied`.
    PermissionDenied,
}

impl Fault {
    fn error(&self, path: &Path) -> object_store::Error {
        let path = path.to_string();
        match self {
            Self::NotFound => object_store::Error::NotFound {
                path,
                source: "injected fault".into(),
            },
            Self::Unavailable => object_store::Error::Generic {
                store: "FailingStore",
                source: format!("injected 503 SlowDown for {path}").into(),
            },
            Self::Timeout => object_store::Error::Generic {
                store: "FailingStore",
                source: Box::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("injected timeout for {path}"),
                )),
            },
            Self::PermissionDenied => object_store::Error::PermissionDenied {
                path,
                source: "injected fault".into(),
            },
        }
    }
}

/// Which requests fail: by kind, by path, and by position among the matching requests.
#[derive(Debug, Clone)]
pub struct FailRule {
    kinds: Vec<OpKind>,
    path_contains: Option<String>,
    skip: usize,
    times: Option<usize>,
    fault: Fault,
}

impl FailRule {
    /// Every request fails with `fault` (narrow it with the other methods).
    pub fn new(fault: Fault) -> Self {
        Self {
            kinds: Vec::new(),
            path_contains: None,
            skip: 0,
            times: None,
            fault,
        }
    }

    /// Only requests of kind `kind` (may be called several times to add kinds).
    pub fn on(mut self, kind: OpKind) -> Self {
        self.kinds.push(kind);
        self
    }

    /// Only requests whose path contains `needle`.
    pub fn path_contains(mut self, needle: impl Into<String>) -> Self {
        self.path_contains = Some(needle.into());
        self
    }

    /// Let the first `n` matching requests through.
    pub fn after(mut self, n: usize) -> Self {
        self.skip = n;
        self
    }

    /// Fail only `n` matching requests, then let the rest through.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, kind: OpKind, path: &Path) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&kind))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|needle| path.as_ref().contains(needle))
    }

    /// Counts the request against the rule; true if it must fail.
    fn fire(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        match &mut self.times {
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
            None => true,
        }
    }
}

#[derive(Debug, Default)]
struct Rules {
    rules: Vec<FailRule>,
    injected: usize,
}

impl Rules {
    /// The fault for this request, if a rule fires (first matching rule decides).
    fn check(&mut self, kind: OpKind, path: &Path) -> Option<object_store::Error> {
        let rule = self.rules.iter_mut().find(|r| r.matches(kind, path))?;
        let fault = rule.fire().then(|| rule.fault.error(path))?;
        self.injected += 1;
        tracing::debug!(?kind, %path, "injecting fault");
        Some(fault)
    }
}

/// Fails the requests chosen by its rules; forwards everything else to the inner store.
#[derive(Debug, Clone)]
pub struct FailingStore {
    inner: Arc<dyn ObjectStore>,
    rules: Arc<Mutex<Rules>>,
}

impl FailingStore {
    /// Wraps `inner` with no rules (everything passes).
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            rules: Arc::default(),
        }
    }

    /// Adds a rule (builder style).
    pub fn with_rule(self, rule: FailRule) -> Self {
        self.add_rule(rule);
        self
    }

    /// Adds a rule to a store already in use.
    pub fn add_rule(&self, rule: FailRule) {
        self.lock().rules.push(rule);
    }

    /// Removes all rules.
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> usize {
        self.lock().injected
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self, kind: OpKind, path: &Path) -> object_store::Result<()> {
        match self.lock().check(kind, path) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl fmt::Display for FailingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FailingStore({})", self.inner)
    }
}

#[async_trait]
impl Decorator for FailingStore {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check(OpKind::Put, location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check(OpKind::PutMultipart, location)?;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FailingUpload {
            inner,
            store: self.clone(),
            path: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check(OpKind::of_get(&options), location)?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        let checked = locations
            .map(move |p| {
                let p = p?;
                this.check(OpKind::Delete, &p)?;
                Ok(p)
            })
            .boxed();
        self.inner.delete_stream(checked)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let root = Path::default();
        match self.check(OpKind::List, prefix.unwrap_or(&root)) {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.check(OpKind::List, prefix.unwrap_or(&Path::default()))?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check(OpKind::Copy, to)?;
        self.inner.copy_opts(from, to, options).await
    }
}

crate::object_store_decorator!(FailingStore);

#[derive(Debug)]
struct FailingUpload {
    inner: Box<dyn MultipartUpload>,
    store: FailingStore,
    path: Path,
}

#[async_trait]
impl MultipartUpload for FailingUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        match self.store.check(OpKind::PutPart, &self.path) {
            Ok(()) => self.inner.put_part(data),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.store.check(OpKind::Complete, &self.path)?;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_positions() {
        let mut rule = FailRule::new(Fault::Unavailable).after(1).times(2);
        let fired: Vec<bool> = (0..5).map(|_| rule.fire()).collect();
        assert_eq!(fired, vec![false, true, true, false, false]);
    }

    #[test]
    fn rule_filters() {
        let rule = FailRule::new(Fault::NotFound)
            .on(OpKind::Get)
            .path_contains("shard.00002");
        assert!(rule.matches(OpKind::Get, &Path::from("d/shard.00002.mds")));
        assert!(!rule.matches(OpKind::Head, &Path::from("d/shard.00002.mds")));
        assert!(!rule.matches(OpKind::Get, &Path::from("d/shard.00001.mds")));
    }
}
