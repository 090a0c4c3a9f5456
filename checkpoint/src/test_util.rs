//! Helpers shared by this crate's unit tests.

use crate::{CheckpointRoot, CommitRequest, Manifest, UploadConfig};
use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use std::sync::Arc;

/// A root in a fresh in-memory store.
pub(crate) fn memory_root() -> CheckpointRoot {
    CheckpointRoot::new(Arc::new(InMemory::new()), Path::from("ckpt"))
}

/// Saves and commits checkpoint `id` with one rank writing `files` (name, bytes).
pub(crate) async fn save(
    root: &CheckpointRoot,
    id: &str,
    step: Option<u64>,
    files: &[(&str, &[u8])],
) -> Manifest {
    let attempt = root.begin_save(id).await.unwrap();
    let w = root
        .rank_writer(&attempt, 0, &UploadConfig::default())
        .unwrap();
    let mut records = Vec::new();
    for (name, data) in files {
        records.push(
            w.upload_bytes(name, Bytes::copy_from_slice(data))
                .await
                .unwrap(),
        );
    }
    let req = CommitRequest {
        records,
        world_size: 1,
        step,
        ..Default::default()
    };
    root.commit(&attempt, req).await.unwrap()
}

/// Replaces the manifest of `id` with `m` (what a hostile writer of the bucket can do).
pub(crate) async fn plant_manifest(root: &CheckpointRoot, id: &str, m: &Manifest) {
    use object_store::ObjectStoreExt;
    let body = serde_json::to_vec(m).unwrap();
    root.store()
        .put(&root.manifest_path(id), body.into())
        .await
        .unwrap();
}

/// Lets the clock move on, so that the next commit has a later time in every store.
pub(crate) fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(5));
}
