//! Helpers shared by the integration tests: backends, deterministic data, a one-call save.
#![allow(dead_code, clippy::unwrap_used)]

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use shardstream_checkpoint::{
    CheckpointMetrics, CheckpointRoot, CommitRequest, FileRecord, Manifest, SaveAttempt,
    UploadConfig,
};
use std::sync::Arc;

/// A checkpoint root over one backend; the temp dir (if any) lives as long as it.
pub struct Backend {
    pub name: &'static str,
    pub root: CheckpointRoot,
    pub metrics: Arc<CheckpointMetrics>,
    pub dir: Option<tempfile::TempDir>,
}

/// The same root over an in-memory store and over a local directory.
pub fn backends() -> Vec<Backend> {
    let mem_metrics = Arc::new(CheckpointMetrics::default());
    let mem = CheckpointRoot::new(Arc::new(InMemory::new()), Path::from("jobs/run1/ckpt"))
        .with_metrics(mem_metrics.clone());
    let dir = tempfile::tempdir().unwrap();
    let fs = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let fs_metrics = Arc::new(CheckpointMetrics::default());
    let fs_root =
        CheckpointRoot::new(Arc::new(fs), Path::from("ckpt")).with_metrics(fs_metrics.clone());
    vec![
        Backend {
            name: "memory",
            root: mem,
            metrics: mem_metrics,
            dir: None,
        },
        Backend {
            name: "localfs",
            root: fs_root,
            metrics: fs_metrics,
            dir: Some(dir),
        },
    ]
}

/// Deterministic bytes.
pub fn data(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Small parts so that multipart paths run on small data.
pub fn small_parts() -> UploadConfig {
    UploadConfig {
        part_size: 4096,
        memory_budget: 4 * 4096,
        max_concurrent_requests: 4,
        max_concurrent_files: 2,
        max_requests_per_second: None,
        // Multipart paths are what these small parts are for, even for files of known size.
        single_put_max: 0,
    }
}

/// Uploads `files_per_rank` files of `size` bytes for each of `world` ranks.
pub async fn upload(
    root: &CheckpointRoot,
    attempt: &SaveAttempt,
    world: u32,
    files_per_rank: u32,
    size: usize,
) -> Vec<FileRecord> {
    let mut records = Vec::new();
    for rank in 0..world {
        let w = root.rank_writer(attempt, rank, &small_parts()).unwrap();
        for k in 0..files_per_rank {
            let seed = u64::from(rank * 1000 + k) + 7;
            let rec = w
                .upload_bytes(&format!("__{rank}_{k}.distcp"), data(seed, size))
                .await
                .unwrap();
            records.push(rec);
        }
    }
    records
}

/// A complete save of `id`: `world` ranks, 2 files each of `size` bytes.
pub async fn save(root: &CheckpointRoot, id: &str, world: u32, size: usize) -> Manifest {
    let attempt = root.begin_save(id).await.unwrap();
    let records = upload(root, &attempt, world, 2, size).await;
    root.commit(
        &attempt,
        CommitRequest {
            records,
            world_size: world,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}
