//! Which checkpoints exist: the directories under the root whose manifest reads and validates.
//!
//! Order (and so `latest` and gc's `keep_last`) is by commit time, then step, then id. The commit
//! time is the manifest's `created_unix_ms` capped at the time the store recorded for the
//! manifest object ([`CheckpointInfo::committed_unix_ms`]). Not the step: a step is whatever a
//! manifest or an id claims (`step_18446744073709551615`), and a checkpoint without one
//! (`final`) saved after `step_100` is newer, not older. The cap keeps a manifest that claims a
//! future time from outranking checkpoints committed after it; the manifest's own time, when
//! earlier, keeps the order of a root copied by a tool that resets every object's time.
//! Manifests of every version carry `created_unix_ms`, so old checkpoints order the same way.

use crate::error::{CheckpointError, Result};
use crate::layout::validate_checkpoint_id;
use crate::manifest::Manifest;
use crate::CheckpointRoot;
use futures::StreamExt;
use shardstream_storage::listing;
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
    /// Commit time the manifest records, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Commit time used for ordering: `created_unix_ms`, but never later than the time the
    /// store recorded for the manifest object (its last-modified time).
    pub committed_unix_ms: u64,
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
    /// `stored_unix_ms`: the store's last-modified time of the manifest object.
    pub(crate) fn from_manifest(m: &Manifest, stored_unix_ms: u64) -> Self {
        Self {
            id: m.checkpoint_id.clone(),
            step: m.step,
            created_unix_ms: m.created_unix_ms,
            committed_unix_ms: m.created_unix_ms.min(stored_unix_ms),
            world_size: m.world_size,
            files: m.files.len(),
            total_bytes: m.total_bytes(),
            attempt: m.attempt.clone(),
        }
    }

    /// The order of `list`: commit time ([`CheckpointInfo::committed_unix_ms`]), then step
    /// (none first; it only separates commits within the same millisecond), then id.
    pub fn order(&self, other: &Self) -> Ordering {
        self.committed_unix_ms
            .cmp(&other.committed_unix_ms)
            .then(self.step.cmp(&other.step))
            .then_with(|| self.id.cmp(&other.id))
    }
}

/// What one directory under the root turned out to be.
pub(crate) enum Entry {
    /// The manifest, and the store's last-modified time of it (ms since the Unix epoch).
    Committed(Box<Manifest>, u64),
    /// No manifest.
    Uncommitted(String),
    /// A manifest that does not read (a newer format, corruption): never touched by gc.
    Unreadable(String),
}

impl CheckpointRoot {
    /// The checkpoint ids present as directories under the root (committed or not).
    pub(crate) async fn directory_ids(&self) -> Result<Vec<String>> {
        // The storage helper skips (and names) keys object_store cannot represent, so one
        // stray `root//x` does not hide every checkpoint.
        let listing = match listing::list_dirs(&**self.store(), self.root()).await {
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
                match self.read_manifest_stored(&id).await {
                    Ok((m, stored)) => Ok(Entry::Committed(Box::new(m), stored)),
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
                    Entry::Committed(m, stored) => Some(CheckpointInfo::from_manifest(m, *stored)),
                    _ => None,
                })
                .collect();
            infos.sort_by(CheckpointInfo::order);
            Ok(infos)
        }
        .instrument(span)
        .await
    }

    /// The newest committed checkpoint, if any: the last committed (see the module docs), not
    /// the highest step. Read from the pointer the last commit wrote when it names a committed
    /// checkpoint, else by listing the root (see `latest.rs`).
    pub async fn latest(&self) -> Result<Option<CheckpointInfo>> {
        if let Some(info) = self.latest_from_pointer().await? {
            return Ok(Some(info));
        }
        Ok(self.list().await?.pop())
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{memory_root, plant_manifest, save, tick};
    use crate::{GcOptions, RetentionPolicy};
    use std::time::Duration;

    /// Issue 40, row 9: a manifest claiming step 2^64-1 (and a commit time far in the future)
    /// became `latest`, and a `final` checkpoint saved after `step_100` sorted first, so
    /// `gc --keep 1` would have deleted it.
    #[tokio::test]
    async fn latest_is_the_last_committed_not_the_highest_claimed_step() {
        let root = memory_root();
        let hostile_id = "evil_18446744073709551615";
        let mut hostile = save(&root, hostile_id, None, &[("a", b"x")]).await;
        assert_eq!(hostile.step, Some(u64::MAX));
        hostile.created_unix_ms = u64::MAX;
        plant_manifest(&root, hostile_id, &hostile).await;
        tick();
        save(&root, "step_100", None, &[("a", b"y")]).await;
        tick();
        save(&root, "final", None, &[("a", b"z")]).await;

        let ids: Vec<String> = root
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, vec![hostile_id, "step_100", "final"]);
        assert_eq!(root.latest().await.unwrap().unwrap().id, "final");

        let opts = GcOptions {
            policy: RetentionPolicy {
                keep_last: 1,
                keep_every: None,
            },
            leftovers_older_than: Duration::ZERO,
            dry_run: true,
            local_root: None,
        };
        let report = root.gc(&opts).await.unwrap();
        assert_eq!(report.kept, vec!["final"]);
        assert_eq!(report.deleted, vec![hostile_id, "step_100"]);
    }
}
