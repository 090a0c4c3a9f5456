//! Which checkpoints exist: the directories under the root whose manifest reads and validates.
//! Order is by step (checkpoints without a step first), then commit time, then id.

use crate::error::{CheckpointError, Result};
use crate::layout::validate_checkpoint_id;
use crate::manifest::Manifest;
use crate::CheckpointRoot;
use futures::StreamExt;
use std::cmp::Ordering;
use tracing::{info_span, warn, Instrument};

/// Manifests fetched at once while listing.
const LIST_CONCURRENCY: usize = 32;

/// A committed checkpoint as `list` and `latest` report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The checkpoint id.
    pub id: String,
    /// Its step (explicit, or from the id's trailing digits).
    pub step: Option<u64>,
    /// Commit time, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Ranks that saved it.
    pub world_size: u32,
    /// Number of data files.
    pub files: usize,
    /// Total bytes of its data files.
    pub total_bytes: u64,
    /// The attempt directory that holds its files.
    pub attempt: String,
}

impl CheckpointInfo {
    pub(crate) fn from_manifest(m: &Manifest) -> Self {
        Self {
            id: m.checkpoint_id.clone(),
            step: m.step,
            created_unix_ms: m.created_unix_ms,
            world_size: m.world_size,
            files: m.files.len(),
            total_bytes: m.total_bytes(),
            attempt: m.attempt.clone(),
        }
    }

    /// The order of `list`: step (none first), then commit time, then id.
    pub fn order(&self, other: &Self) -> Ordering {
        self.step
            .cmp(&other.step)
            .then(self.created_unix_ms.cmp(&other.created_unix_ms))
            .then_with(|| self.id.cmp(&other.id))
    }
}

/// What one directory under the root turned out to be.
pub(crate) enum Entry {
    Committed(Box<Manifest>),
    /// No manifest.
    Uncommitted(String),
    /// A manifest that does not read (a newer format, corruption): never touched by gc.
    Unreadable(String),
}

impl CheckpointRoot {
    /// The checkpoint ids present as directories under the root (committed or not).
    pub(crate) async fn directory_ids(&self) -> Result<Vec<String>> {
        let listing = match self.store().list_with_delimiter(Some(self.root())).await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::store("list", self.root(), e)),
        };
        Ok(listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .filter(|id| validate_checkpoint_id(id).is_ok())
            .collect())
    }

    pub(crate) async fn entries(&self) -> Result<Vec<Entry>> {
        let ids = self.directory_ids().await?;
        let entries: Vec<Result<Entry>> = futures::stream::iter(ids)
            .map(|id| async move {
                match self.read_manifest(&id).await {
                    Ok(m) => Ok(Entry::Committed(Box::new(m))),
                    Err(CheckpointError::NotCommitted { .. }) => Ok(Entry::Uncommitted(id)),
                    Err(e @ CheckpointError::InvalidManifest { .. }) => {
                        warn!(id, error = %e, "ignoring a checkpoint whose manifest does not read");
                        Ok(Entry::Unreadable(id))
                    }
                    Err(e) => Err(e),
                }
            })
            .buffer_unordered(LIST_CONCURRENCY)
            .collect()
            .await;
        entries.into_iter().collect()
    }

    /// Committed checkpoints, oldest first (see [`CheckpointInfo::order`]).
    pub async fn list(&self) -> Result<Vec<CheckpointInfo>> {
        let span = info_span!("checkpoint.list", root = %self.root());
        async {
            let mut infos: Vec<CheckpointInfo> = self
                .entries()
                .await?
                .iter()
                .filter_map(|e| match e {
                    Entry::Committed(m) => Some(CheckpointInfo::from_manifest(m)),
                    _ => None,
                })
                .collect();
            infos.sort_by(CheckpointInfo::order);
            Ok(infos)
        }
        .instrument(span)
        .await
    }

    /// The newest committed checkpoint, if any.
    pub async fn latest(&self) -> Result<Option<CheckpointInfo>> {
        Ok(self.list().await?.pop())
    }
}
