//! The `latest` pointer: a small object at `<root>/.shardstream-latest.json` that each commit
//! writes after its manifest, naming the checkpoint it committed. [`CheckpointRoot::latest`]
//! reads it first (one GET, then the manifest it names), so that finding the newest of
//! thousands of checkpoints does not list the root and read every manifest.
//!
//! The pointer is a hint, never the truth: the checkpoint it names must have a manifest of the
//! same attempt (a checkpoint without its manifest does not exist), else `latest` falls back to
//! the listing ([`CheckpointRoot::list`]). A commit that dies between its manifest and the
//! pointer leaves the pointer on the previous checkpoint, which `latest` then reports until the
//! next commit; `ckpt ls` (the listing) shows every committed one. The pointer is not a
//! directory, so it is never taken for a checkpoint, and `gc` leaves it alone (a pointer to a
//! deleted checkpoint falls back to the listing).

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::catalog::CheckpointInfo;
use crate::error::{CheckpointError, Result};
use crate::layout::validate_checkpoint_id;
use crate::manifest::Manifest;
use crate::CheckpointRoot;

/// Name of the pointer object under the root.
pub const LATEST_POINTER: &str = ".shardstream-latest.json";
/// Largest pointer read (an untrusted size).
const MAX_POINTER_BYTES: u64 = 4096;

#[derive(Debug, Serialize, Deserialize)]
struct Pointer {
    id: String,
    attempt: String,
}

impl CheckpointRoot {
    fn pointer_path(&self) -> Path {
        self.root().clone().join(LATEST_POINTER)
    }

    /// Points `latest` at the checkpoint `manifest` just committed. A failure is logged, not
    /// returned: the checkpoint is committed, and `latest` falls back to the listing.
    pub(crate) async fn write_latest_pointer(&self, manifest: &Manifest) {
        let pointer = Pointer {
            id: manifest.checkpoint_id.clone(),
            attempt: manifest.attempt.clone(),
        };
        let body = match serde_json::to_vec(&pointer) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "cannot encode the latest pointer");
                return;
            }
        };
        let path = self.pointer_path();
        if let Err(e) = self.store().put(&path, PutPayload::from(body)).await {
            warn!(pointer = %path, error = %e, "cannot write the latest pointer; latest lists the root");
        }
    }

    /// The checkpoint the pointer names, if it names a committed one of the same attempt.
    pub(crate) async fn latest_from_pointer(&self) -> Result<Option<CheckpointInfo>> {
        let path = self.pointer_path();
        let got = match self.store().get(&path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(CheckpointError::store("get", &path, e)),
        };
        if got.meta.size > MAX_POINTER_BYTES {
            warn!(pointer = %path, size = got.meta.size, "latest pointer too large; ignored");
            return Ok(None);
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| CheckpointError::store("get", &path, e))?;
        let pointer: Pointer = match serde_json::from_slice(&bytes) {
            Ok(p) => p,
            Err(e) => {
                warn!(pointer = %path, error = %e, "latest pointer does not read; ignored");
                return Ok(None);
            }
        };
        if validate_checkpoint_id(&pointer.id).is_err() {
            warn!(pointer = %path, "latest pointer names an invalid id; ignored");
            return Ok(None);
        }
        match self.read_manifest_stored(&pointer.id).await {
            Ok((m, stored)) if m.attempt == pointer.attempt => {
                debug!(id = %pointer.id, "latest read from its pointer");
                Ok(Some(CheckpointInfo::from_manifest(&m, stored)))
            }
            Ok(_)
            | Err(CheckpointError::NotCommitted { .. })
            | Err(CheckpointError::InvalidManifest { .. }) => {
                debug!(id = %pointer.id, "latest pointer is stale; listing the root");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{memory_root, save, tick};
    use object_store::ObjectStoreExt;

    #[tokio::test]
    async fn latest_reads_the_pointer_and_falls_back_when_it_is_stale() {
        let root = memory_root();
        assert!(root.latest().await.unwrap().is_none());
        save(&root, "step_1", Some(1), &[("a", b"x")]).await;
        tick();
        save(&root, "step_2", Some(2), &[("a", b"y")]).await;
        let from_pointer = root.latest_from_pointer().await.unwrap().unwrap();
        assert_eq!(from_pointer.id, "step_2");
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_2");
        // The pointer's checkpoint is deleted: the listing answers.
        root.store()
            .delete(&root.manifest_path("step_2"))
            .await
            .unwrap();
        assert!(root.latest_from_pointer().await.unwrap().is_none());
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_1");
        // A pointer that does not read is ignored, and never taken for a checkpoint.
        root.store()
            .put(&root.pointer_path(), PutPayload::from_static(b"garbage"))
            .await
            .unwrap();
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_1");
        let ids: Vec<_> = root
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(ids, vec!["step_1"]);
    }
}
