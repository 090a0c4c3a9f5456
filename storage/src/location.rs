//! [`Location`]: a store plus a prefix, and the single-request operations on objects below it.
//!
//! Every operation takes a *relative* name (`"index.json"`, `"ckpt-7/rank0.distcp"`), checked
//! by [`crate::key::components`] so that nothing read from a file can address an object
//! outside the location.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::backend;
use crate::env::Env;
use crate::error::{Result, StorageError};
use crate::key;
use crate::listing;
use crate::options::StorageOptions;
use crate::shaping::{Shaper, ShapingConfig};
use crate::url::StorageUrl;

/// An object's metadata, with its name relative to the location it was listed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Name relative to the location (`a/b.bin`).
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Entity tag, when the store has one (S3: the MD5 of a single-part object).
    pub e_tag: Option<String>,
    /// Last modification time.
    pub last_modified: SystemTime,
}

/// What [`Location::put_if_absent`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object did not exist and was written.
    Created,
    /// The object already existed and was left unchanged.
    AlreadyExists,
}

/// A storage location: a backend store and a prefix inside it.
///
/// Cheap to clone (the store is shared).
#[derive(Debug, Clone)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
    local_root: Option<PathBuf>,
    options: Arc<StorageOptions>,
    atomic_create: bool,
    shaper: Option<Arc<Shaper>>,
}

impl Location {
    /// Opens `url` with the process environment and default options.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, &StorageOptions::default(), &Env::from_process())
    }

    /// Opens `url` with explicit options and environment.
    pub fn open_with(url: &str, options: &StorageOptions, env: &Env) -> Result<Self> {
        let parsed = StorageUrl::parse(url)?;
        Self::from_url(&parsed, options, env)
    }

    /// Opens an already parsed URL.
    pub fn from_url(url: &StorageUrl, options: &StorageOptions, env: &Env) -> Result<Self> {
        let backend::Built {
            store,
            atomic_create,
            shaper,
        } = backend::build(url, env, options)?;
        let (prefix, local_root) = match url {
            StorageUrl::S3 { prefix, .. }
            | StorageUrl::Gcs { prefix, .. }
            | StorageUrl::Azure { prefix, .. } => (parse_path(url, prefix)?, None),
            StorageUrl::Local { root } => {
                let prefix =
                    Path::from_absolute_path(root).map_err(|e| StorageError::InvalidUrl {
                        url: root.display().to_string(),
                        reason: e.to_string(),
                    })?;
                (prefix, Some(root.clone()))
            }
        };
        Ok(Self {
            store,
            prefix,
            url: url.to_string(),
            local_root,
            options: Arc::new(options.clone()),
            atomic_create,
            shaper,
        })
    }

    /// The same location over another store, e.g. the current one wrapped in a test
    /// decorator: `loc.map_store(|s| Arc::new(CountingStore::new(s)))`.
    pub fn map_store(
        &self,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> Self {
        Self {
            store: wrap(Arc::clone(&self.store)),
            // A wrapped store is another store: its create-only puts are not vouched for.
            atomic_create: false,
            ..self.clone()
        }
    }

    /// The same location with other transfer options (chunk size, concurrency...).
    ///
    /// Retry and timeout settings are baked into the store when it is opened; changing them
    /// here has no effect on an already opened remote store.
    pub fn with_options(&self, options: StorageOptions) -> Self {
        Self {
            options: Arc::new(options),
            ..self.clone()
        }
    }

    /// The location `rel` below this one. `rel` must be a safe relative name.
    pub fn join(&self, rel: &str) -> Result<Self> {
        Ok(Self {
            prefix: self.path(rel)?,
            url: self.url_of(rel),
            local_root: self.local_path(rel)?,
            ..self.clone()
        })
    }

    /// Whether this store's create-only put (`If-None-Match: *`) is one atomic step, so that of
    /// two racing creates exactly one is told it succeeded: true for a local directory and for
    /// Amazon S3's own endpoint, false where it is not known (custom endpoints, emulators, GCS
    /// and Azure, a wrapped store). Checkpoint commits wait a little before their read-back
    /// where it is false.
    pub fn create_is_atomic(&self) -> bool {
        self.atomic_create
    }

    /// The backend store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix inside the store.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The location as a URL (`s3://bucket/prefix`) or, for local locations, a path.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The parameters of the request limiter this location's store was opened with (see
    /// [`crate::shaping`]): its options' `shaping`, else the environment's
    /// ([`ShapingConfig::from_env`]); `None` for a local directory (not shaped) and when
    /// shaping is off. Read-only: a limiter is fixed when the store is opened.
    pub fn shaping(&self) -> Option<&ShapingConfig> {
        self.shaper.as_deref().map(Shaper::config)
    }

    /// The transfer options.
    pub fn options(&self) -> &StorageOptions {
        &self.options
    }

    /// The directory of a local location (`None` for remote stores).
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// The local file behind `rel`, for reading local sources in place (`None` when remote).
    pub fn local_path(&self, rel: &str) -> Result<Option<PathBuf>> {
        let parts = key::components(rel)?;
        Ok(self
            .local_root
            .as_ref()
            .map(|root| parts.iter().fold(root.clone(), |p, part| p.join(part))))
    }

    /// The store path of `rel`.
    pub fn path(&self, rel: &str) -> Result<Path> {
        key::components(rel)?;
        let full = match self.prefix.as_ref() {
            "" => rel.to_string(),
            prefix => format!("{prefix}/{rel}"),
        };
        Path::parse(&full).map_err(|e| StorageError::UnsafePath {
            name: rel.to_string(),
            reason: match e {
                object_store::path::Error::BadSegment { .. } => {
                    "component not allowed by the store"
                }
                _ => "not a valid object path",
            },
        })
    }

    /// The full URL of `rel`, for messages.
    pub fn url_of(&self, rel: &str) -> String {
        format!("{}/{}", self.url.trim_end_matches('/'), rel)
    }

    pub(crate) fn backend_error(&self, rel: &str, e: object_store::Error) -> StorageError {
        StorageError::from_backend(self.url_of(rel), e)
    }

    /// Metadata of `rel`.
    pub async fn head(&self, rel: &str) -> Result<ObjectInfo> {
        let path = self.path(rel)?;
        let meta = self
            .store
            .head(&path)
            .await
            .map_err(|e| self.backend_error(rel, e))?;
        Ok(object_info(rel.to_string(), meta))
    }

    /// True if `rel` exists.
    pub async fn exists(&self, rel: &str) -> Result<bool> {
        match self.head(rel).await {
            Ok(_) => Ok(true),
            Err(StorageError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Objects below `prefix` (relative; `""` for the whole location), recursively, sorted.
    /// Keys `object_store` cannot represent are skipped with a warning ([`crate::listing`]).
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let dir = self.dir_path(prefix)?;
        let listing = listing::list(&*self.store, &dir)
            .await
            .map_err(|e| self.backend_error(prefix, e))?;
        let mut out: Vec<ObjectInfo> = listing
            .objects
            .into_iter()
            .filter_map(|m| {
                let key = self.relative_key(&m.location)?;
                Some(object_info(key, m))
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Names (relative to the location) of the "directories" directly below `prefix`.
    pub async fn list_dirs(&self, prefix: &str) -> Result<Vec<String>> {
        let dir = self.dir_path(prefix)?;
        let listing = listing::list_dirs(&*self.store, &dir)
            .await
            .map_err(|e| self.backend_error(prefix, e))?;
        let mut out: Vec<String> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| self.relative_key(p))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Writes `data` to `rel`, replacing any existing object, atomically (readers see the
    /// old object or the new one, never a part).
    pub async fn put(&self, rel: &str, data: Bytes) -> Result<()> {
        let path = self.path(rel)?;
        self.store
            .put(&path, PutPayload::from(data))
            .await
            .map_err(|e| self.backend_error(rel, e))?;
        Ok(())
    }

    /// Writes `data` to `rel` only if no object is there (S3 `If-None-Match: *`, a
    /// no-clobber link on local filesystems).
    ///
    /// A create-only PUT is not idempotent, so `object_store` does not retry it after a
    /// timeout; if a retried attempt (after a 5xx) reports `AlreadyExists`, the first attempt
    /// may have written the object. Callers that must tell these apart (the checkpoint
    /// commit) compare the stored content with what they wrote.
    pub async fn put_if_absent(&self, rel: &str, data: Bytes) -> Result<PutOutcome> {
        let path = self.path(rel)?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&path, PutPayload::from(data), opts)
            .await
        {
            Ok(_) => Ok(PutOutcome::Created),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(PutOutcome::AlreadyExists),
            Err(e) => Err(self.backend_error(rel, e)),
        }
    }

    /// Deletes `rel`; deleting a missing object succeeds (as on S3).
    pub async fn delete(&self, rel: &str) -> Result<()> {
        let path = self.path(rel)?;
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend_error(rel, e)),
        }
    }

    /// Copies `from` to `to` inside this location (server-side where the store can).
    pub async fn copy(&self, from: &str, to: &str) -> Result<()> {
        let (src, dst) = (self.path(from)?, self.path(to)?);
        self.store
            .copy(&src, &dst)
            .await
            .map_err(|e| self.backend_error(from, e))
    }

    fn dir_path(&self, prefix: &str) -> Result<Path> {
        let parts = key::optional_components(prefix)?;
        if parts.is_empty() {
            Ok(self.prefix.clone())
        } else {
            self.path(&parts.join("/"))
        }
    }

    /// `location` relative to this location's prefix, if it is below it.
    fn relative_key(&self, location: &Path) -> Option<String> {
        let parts: Vec<String> = location
            .prefix_match(&self.prefix)?
            .map(|p| p.as_ref().to_string())
            .collect();
        (!parts.is_empty()).then(|| parts.join("/"))
    }
}

pub(crate) fn object_info(key: String, meta: ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        key,
        size: meta.size,
        e_tag: meta.e_tag,
        last_modified: SystemTime::from(meta.last_modified),
    }
}

fn parse_path(url: &StorageUrl, prefix: &str) -> Result<Path> {
    Path::parse(prefix).map_err(|e| StorageError::InvalidUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })
}
