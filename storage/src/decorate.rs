//! Store decorators written once. A decorator (a fault injector, a counter, a throttle, the
//! listing guard of [`crate::listing`]) wraps an `Arc<dyn ObjectStore>` and acts on some requests;
//! every other request goes to the store it wraps. [`Decorator`] holds that forwarding as the
//! default of each method, so a decorator writes only what it changes, and
//! [`object_store_decorator!`](crate::object_store_decorator) makes it an `ObjectStore`.
//!
//! ```text
//! #[async_trait]
//! impl Decorator for CountingStore {
//!     fn inner(&self) -> &Arc<dyn ObjectStore> { &self.inner }
//!     async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
//!         self.count(OpKind::Copy);
//!         self.inner.copy_opts(from, to, options).await
//!     }
//! }
//! object_store_decorator!(CountingStore);
//! ```

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What a decorator does to each request: by default, hand it to [`Decorator::inner`].
#[async_trait]
pub trait Decorator: fmt::Display + fmt::Debug + Send + Sync + 'static {
    /// The store this one wraps.
    fn inner(&self) -> &Arc<dyn ObjectStore>;

    /// A single PUT.
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner().put_opts(location, payload, opts).await
    }

    /// The start of a multipart upload.
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner().put_multipart_opts(location, opts).await
    }

    /// A GET (or HEAD, `options.head`).
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.inner().get_opts(location, options).await
    }

    /// DELETEs.
    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner().delete_stream(locations)
    }

    /// A recursive LIST.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner().list(prefix)
    }

    /// A recursive LIST after `offset`: by default this decorator's own [`Decorator::list`],
    /// filtered (as `ObjectStore`'s default does), so that a decorator acting on listings sees
    /// these too.
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let offset = offset.clone();
        self.list(prefix)
            .try_filter(move |meta| futures::future::ready(meta.location > offset))
            .boxed()
    }

    /// A LIST by delimiter.
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner().list_with_delimiter(prefix).await
    }

    /// A server-side copy.
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner().copy_opts(from, to, options).await
    }
}

/// The crates [`object_store_decorator!`](crate::object_store_decorator) names, so that a crate
/// using it needs none of them itself.
#[doc(hidden)]
pub mod __deps {
    pub use async_trait::async_trait;
    pub use futures;
    pub use object_store;
}

/// Implements `ObjectStore` for a [`Decorator`]: the one place requests are routed to a
/// decorator's methods.
#[macro_export]
macro_rules! object_store_decorator {
    ($t:ty) => {
        #[$crate::decorate::__deps::async_trait]
        impl $crate::decorate::__deps::object_store::ObjectStore for $t {
            async fn put_opts(
                &self,
                location: &$crate::decorate::__deps::object_store::path::Path,
                payload: $crate::decorate::__deps::object_store::PutPayload,
                opts: $crate::decorate::__deps::object_store::PutOptions,
            ) -> $crate::decorate::__deps::object_store::Result<
                $crate::decorate::__deps::object_store::PutResult,
            > {
                $crate::decorate::Decorator::put_opts(self, location, payload, opts).await
            }

            async fn put_multipart_opts(
                &self,
                location: &$crate::decorate::__deps::object_store::path::Path,
                opts: $crate::decorate::__deps::object_store::PutMultipartOptions,
            ) -> $crate::decorate::__deps::object_store::Result<
                Box<dyn $crate::decorate::__deps::object_store::MultipartUpload>,
            > {
                $crate::decorate::Decorator::put_multipart_opts(self, location, opts).await
            }

            async fn get_opts(
                &self,
                location: &$crate::decorate::__deps::object_store::path::Path,
                options: $crate::decorate::__deps::object_store::GetOptions,
            ) -> $crate::decorate::__deps::object_store::Result<
                $crate::decorate::__deps::object_store::GetResult,
            > {
                $crate::decorate::Decorator::get_opts(self, location, options).await
            }

            fn delete_stream(
                &self,
                locations: $crate::decorate::__deps::futures::stream::BoxStream<
                    'static,
                    $crate::decorate::__deps::object_store::Result<
                        $crate::decorate::__deps::object_store::path::Path,
                    >,
                >,
            ) -> $crate::decorate::__deps::futures::stream::BoxStream<
                'static,
                $crate::decorate::__deps::object_store::Result<
                    $crate::decorate::__deps::object_store::path::Path,
                >,
            > {
                $crate::decorate::Decorator::delete_stream(self, locations)
            }

            fn list(
                &self,
                prefix: Option<&$crate::decorate::__deps::object_store::path::Path>,
            ) -> $crate::decorate::__deps::futures::stream::BoxStream<
                'static,
                $crate::decorate::__deps::object_store::Result<
                    $crate::decorate::__deps::object_store::ObjectMeta,
                >,
            > {
                $crate::decorate::Decorator::list(self, prefix)
            }

            fn list_with_offset(
                &self,
                prefix: Option<&$crate::decorate::__deps::object_store::path::Path>,
                offset: &$crate::decorate::__deps::object_store::path::Path,
            ) -> $crate::decorate::__deps::futures::stream::BoxStream<
                'static,
                $crate::decorate::__deps::object_store::Result<
                    $crate::decorate::__deps::object_store::ObjectMeta,
                >,
            > {
                $crate::decorate::Decorator::list_with_offset(self, prefix, offset)
            }

            async fn list_with_delimiter(
                &self,
                prefix: Option<&$crate::decorate::__deps::object_store::path::Path>,
            ) -> $crate::decorate::__deps::object_store::Result<
                $crate::decorate::__deps::object_store::ListResult,
            > {
                $crate::decorate::Decorator::list_with_delimiter(self, prefix).await
            }

            async fn copy_opts(
                &self,
                from: &$crate::decorate::__deps::object_store::path::Path,
                to: &$crate::decorate::__deps::object_store::path::Path,
                options: $crate::decorate::__deps::object_store::CopyOptions,
            ) -> $crate::decorate::__deps::object_store::Result<()> {
                $crate::decorate::Decorator::copy_opts(self, from, to, options).await
            }
        }
    };
}
