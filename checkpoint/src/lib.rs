//! Sharded distributed checkpoints on an object store (S3, GCS, Azure, or a POSIX directory
//! through `object_store`), never half-written.
//!
//! A save runs in three steps:
//! 1. the coordinator calls [`CheckpointRoot::begin_save`], which refuses an id that is already
//!    committed and names a fresh attempt directory, and sends the two names to every rank;
//! 2. every rank uploads its files with a [`RankWriter`] (parallel, multipart above one part,
//!    host memory capped by a byte budget, CRC32C per part computed while streaming) and sends
//!    the returned [`FileRecord`]s to the coordinator;
//! 3. the coordinator calls [`CheckpointRoot::commit`]: a HEAD of every file, then the manifest
//!    `_shardstream_manifest.json` created with a create-if-absent put. That put is the commit
//!    point; a checkpoint without a manifest does not exist for [`CheckpointRoot::latest`],
//!    [`CheckpointRoot::list`] or [`CheckpointRoot::open`].
//!
//! Reads go through [`CheckpointReader::read_range`], which fetches only the bytes asked for and
//! checks every whole part it fetches against the manifest; [`CheckpointRoot::verify`] checks
//! every byte. [`CheckpointRoot::gc`] applies a [`RetentionPolicy`] and sweeps leftovers of
//! dead saves. `docs/checkpoints.md` has the layout, the crash analysis and the request-rate
//! arithmetic.
//!
//! ```
//! use bytes::Bytes;
//! use object_store::{memory::InMemory, path::Path};
//! use shardstream_checkpoint::{CheckpointRoot, CommitRequest, UploadConfig};
//! use std::sync::Arc;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), shardstream_checkpoint::CheckpointError> {
//! let root = CheckpointRoot::new(Arc::new(InMemory::new()), Path::from("runs/llama/ckpt"));
//!
//! // Coordinator: start a save of step 100 and tell every rank the attempt.
//! let attempt = root.begin_save("step_100").await?;
//!
//! // Each rank (here: two, in one process) uploads its files.
//! let mut records = Vec::new();
//! for rank in 0..2u32 {
//!     let w = root.rank_writer(&attempt, rank, &UploadConfig::default())?;
//!     let data = Bytes::from(vec![rank as u8; 1000]);
//!     records.push(w.upload_bytes(&format!("__{rank}_0.distcp"), data).await?);
//! }
//!
//! // Coordinator: commit.
//! root.commit(&attempt, CommitRequest { records, world_size: 2, ..Default::default() }).await?;
//!
//! // Anyone: find and read it.
//! let latest = root.latest().await?.expect("one committed checkpoint");
//! assert_eq!((latest.id.as_str(), latest.step), ("step_100", Some(100)));
//! let reader = root.open("step_100").await?;
//! let path = &reader.manifest().files[1].path; // sorted: __0_0, __1_0
//! assert_eq!(reader.read_range(path, 10..20).await?, Bytes::from(vec![1u8; 10]));
//! assert!(root.verify("step_100").await?.is_ok());
//! # Ok(())
//! # }
//! ```

mod budget;
mod catalog;
pub mod checksum;
mod commit;
pub mod config;
mod download;
mod error;
pub mod fetch;
mod gc;
mod latest;
pub mod layout;
mod local_sweep;
pub mod manifest;
pub mod metrics;
mod rank;
mod read;
#[cfg(test)]
mod test_util;
#[cfg(feature = "testing")]
pub mod testing;
mod upload;

pub use catalog::CheckpointInfo;
pub use commit::{CommitRequest, ATOMIC_SETTLE, SETTLE};
pub use config::{RatePlan, UploadConfig};
pub use download::DownloadReport;
pub use error::{CheckpointError, Result};
pub use gc::{GcOptions, GcReport, RetentionPolicy};
pub use latest::LATEST_POINTER;
pub use manifest::{Alias, FileRecord, Manifest};
pub use metrics::{CheckpointMetrics, MetricsSnapshot};
pub use rank::{RankWriter, SaveAttempt, UploadSource};
pub use read::{CheckpointReader, ReadConfig, VerifyReport};
pub use upload::FileWriter;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use shardstream_storage::Location;
use std::path::PathBuf;
use std::sync::Arc;
use tracing::info;

/// A directory of checkpoints (`<root>/<checkpoint-id>/…`) in an object store: the entry point
/// for saving, committing, listing, reading and collecting. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointRoot {
    store: Arc<dyn ObjectStore>,
    root: Path,
    local_root: Option<PathBuf>,
    metrics: Arc<CheckpointMetrics>,
    create_is_atomic: bool,
}

impl CheckpointRoot {
    /// Checkpoints under `root` in `store`, counted in the process-wide metrics.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        Self {
            store,
            root,
            local_root: None,
            metrics: CheckpointMetrics::global(),
            create_is_atomic: false,
        }
    }

    /// Checkpoints at a storage location (its store, prefix and, for a local directory, its
    /// path, which `gc` uses to sweep staging files of killed uploads).
    pub fn from_location(location: &Location) -> Self {
        Self {
            local_root: location.local_root().map(PathBuf::from),
            create_is_atomic: location.create_is_atomic(),
            ..Self::new(location.store().clone(), location.prefix().clone())
        }
    }

    /// Opens a root given as a URL (`s3://bucket/prefix`, `gs://…`, `az://…`, `file://…`) or
    /// a plain path, with the environment rules of `shardstream-storage`.
    pub fn open_url(url: &str) -> Result<Self> {
        let location = Location::open(url).map_err(|source| CheckpointError::Location {
            url: url.to_owned(),
            source: Box::new(source),
        })?;
        Ok(Self::from_location(&location))
    }

    /// Counts into `metrics` instead of the process-wide counters.
    pub fn with_metrics(mut self, metrics: Arc<CheckpointMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The root prefix.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the store's create-only put is known to be atomic
    /// (`shardstream_storage::Location::create_is_atomic`; false for a root built with
    /// [`CheckpointRoot::new`]): the commit then reads its manifest back without waiting
    /// a short settle first.
    pub fn create_is_atomic(&self) -> bool {
        self.create_is_atomic
    }

    /// The local directory of the root, when the store is a POSIX directory.
    pub fn local_root(&self) -> Option<&std::path::Path> {
        self.local_root.as_deref()
    }

    /// The counters this handle adds to.
    pub fn metrics(&self) -> &Arc<CheckpointMetrics> {
        &self.metrics
    }

    /// `<root>/<id>`.
    pub fn checkpoint_dir(&self, id: &str) -> Path {
        layout::checkpoint_dir(&self.root, id)
    }

    /// `<root>/<id>/_shardstream_manifest.json`.
    pub fn manifest_path(&self, id: &str) -> Path {
        layout::manifest_path(&self.root, id)
    }

    /// Starts a save of checkpoint `id` (coordinator only): fails with
    /// [`CheckpointError::AlreadyCommitted`] if `id` is committed, else returns a fresh attempt.
    /// Leftovers of earlier, uncommitted attempts of the same id are left alone (a rank of a
    /// dead attempt may still be writing them); the commit ignores them and [`CheckpointRoot::gc`]
    /// removes them once they are old.
    pub async fn begin_save(&self, id: &str) -> Result<SaveAttempt> {
        layout::validate_checkpoint_id(id)?;
        let mpath = self.manifest_path(id);
        match self.store.head(&mpath).await {
            Ok(_) => {
                return Err(CheckpointError::AlreadyCommitted {
                    id: id.to_owned(),
                    path: mpath,
                })
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(CheckpointError::store("head", &mpath, e)),
        }
        let attempt = SaveAttempt::new(id, layout::new_attempt_name())?;
        info!(id, attempt = attempt.attempt(), "checkpoint save started");
        Ok(attempt)
    }

    /// A writer for `rank`'s files of `attempt`.
    pub fn rank_writer(
        &self,
        attempt: &SaveAttempt,
        rank: u32,
        config: &UploadConfig,
    ) -> Result<RankWriter> {
        RankWriter::new(self, attempt, rank, config)
    }

    /// Reads and validates the manifest of `id`; [`CheckpointError::NotCommitted`] if absent.
    pub async fn read_manifest(&self, id: &str) -> Result<Manifest> {
        Ok(self.read_manifest_stored(id).await?.0)
    }

    /// [`CheckpointRoot::read_manifest`], with the time the store recorded for the manifest
    /// object (ms since the Unix epoch): the commit time as the store saw it, which the
    /// manifest's bytes cannot claim (see [`CheckpointInfo::committed_unix_ms`]).
    pub(crate) async fn read_manifest_stored(&self, id: &str) -> Result<(Manifest, u64)> {
        layout::validate_checkpoint_id(id)?;
        let mpath = self.manifest_path(id);
        let got = match self.store.get(&mpath).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(CheckpointError::NotCommitted {
                    id: id.to_owned(),
                    path: mpath,
                })
            }
            Err(e) => return Err(CheckpointError::store("get", &mpath, e)),
        };
        if got.meta.size > manifest::MAX_MANIFEST_BYTES as u64 {
            return Err(CheckpointError::InvalidManifest {
                path: mpath,
                reason: format!("{} bytes is larger than the limit", got.meta.size),
            });
        }
        metrics::add(&self.metrics.get_requests, 1);
        let stored_unix_ms = u64::try_from(got.meta.last_modified.timestamp_millis()).unwrap_or(0);
        let bytes = got
            .bytes()
            .await
            .map_err(|e| CheckpointError::store("get", &mpath, e))?;
        let m = Manifest::parse_at(&bytes, &mpath)?;
        if m.checkpoint_id != id {
            return Err(CheckpointError::InvalidManifest {
                path: mpath,
                reason: format!("it names checkpoint {:?}", m.checkpoint_id),
            });
        }
        Ok((m, stored_unix_ms))
    }

    /// Opens committed checkpoint `id` for reading, with default read settings.
    pub async fn open(&self, id: &str) -> Result<CheckpointReader> {
        self.open_with(id, ReadConfig::default()).await
    }

    /// Opens committed checkpoint `id` for reading.
    pub async fn open_with(&self, id: &str, config: ReadConfig) -> Result<CheckpointReader> {
        let manifest = self.read_manifest(id).await?;
        Ok(CheckpointReader::new(self.clone(), manifest, config))
    }

    /// Reads every byte of checkpoint `id` and checks sizes and checksums (of aliases too).
    pub async fn verify(&self, id: &str) -> Result<VerifyReport> {
        self.open(id).await?.verify().await
    }
}
