//! A store that overwrites an object right after its first GET, to race a chunked read.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use shardstream_storage::decorate::Decorator;
use shardstream_storage::object_store::path::Path;
use shardstream_storage::object_store::{
    GetOptions, GetResult, GetResultPayload, ObjectStore, ObjectStoreExt, Result,
};

/// Overwrites the object with `replacement` once, right after the first GET returns.
#[derive(Debug)]
pub struct OverwriteAfterFirstGet {
    inner: Arc<dyn ObjectStore>,
    replacement: Bytes,
    done: AtomicBool,
}

impl OverwriteAfterFirstGet {
    pub fn new(inner: Arc<dyn ObjectStore>, replacement: Bytes) -> Self {
        Self {
            inner,
            replacement,
            done: AtomicBool::new(false),
        }
    }
}

impl fmt::Display for OverwriteAfterFirstGet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OverwriteAfterFirstGet({})", self.inner)
    }
}

#[async_trait]
impl Decorator for OverwriteAfterFirstGet {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn get_opts(&self, p: &Path, o: GetOptions) -> Result<GetResult> {
        let head = o.head;
        let result = self.inner.get_opts(p, o).await?;
        let (meta, range) = (result.meta.clone(), result.range.clone());
        let (attributes, extensions) = (result.attributes.clone(), result.extensions.clone());
        let bytes = result.bytes().await?;
        if !head && !self.done.swap(true, Ordering::SeqCst) {
            self.inner.put(p, self.replacement.clone().into()).await?;
        }
        // The caller gets the first version's bytes and metadata, read before the overwrite.
        let body = futures::stream::once(async move { Ok(bytes) });
        Ok(GetResult {
            payload: GetResultPayload::Stream(Box::pin(body)),
            meta,
            range,
            attributes,
            extensions,
        })
    }
}

shardstream_storage::object_store_decorator!(OverwriteAfterFirstGet);
