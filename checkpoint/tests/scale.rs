//! A commit at 4,096 ranks: every rank writes its DCP file (`__{rank}_0.distcp`), the
//! coordinator commits one manifest of 4,096 file records. Measures what the commit costs (the
//! manifest's size, its requests, the time) on an in-memory store — the files are checked by
//! listing the attempt, not by a HEAD each — and that `latest` then needs two GETs (the
//! pointer and the manifest), no listing.
//!
//! `cargo test -p shardstream-checkpoint --test it scale -- --nocapture` prints the figures.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use shardstream_checkpoint::{CheckpointRoot, CommitRequest, UploadConfig};
use shardstream_storage::object_store::memory::InMemory;
use shardstream_storage::object_store::path::Path;
use shardstream_storage::testing::CountingStore;

const RANKS: u32 = 4096;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_of_4096_ranks_is_measured_and_latest_reads_no_listing() {
    let counting = Arc::new(CountingStore::new(Arc::new(InMemory::new())));
    let root = CheckpointRoot::new(counting.clone(), Path::from("ckpt"));
    let attempt = root.begin_save("step_1000").await.unwrap();
    let mut records = Vec::with_capacity(RANKS as usize);
    for rank in 0..RANKS {
        let w = root
            .rank_writer(&attempt, rank, &UploadConfig::default())
            .unwrap();
        let record = w
            .upload_bytes(&format!("__{rank}_0.distcp"), Bytes::from_static(b"tensor"))
            .await
            .unwrap();
        records.push(record);
    }
    let before = counting.counts();
    let started = Instant::now();
    let manifest = root
        .commit(
            &attempt,
            CommitRequest {
                records,
                world_size: RANKS,
                step: Some(1000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let took = started.elapsed();
    let after = counting.counts();
    let manifest_bytes = manifest.to_json().unwrap().len();
    let heads = after.head - before.head;
    let puts = after.put - before.put;
    let lists = after.list - before.list;
    eprintln!(
        "commit of {RANKS} ranks: {:.3} s, manifest {manifest_bytes} bytes \
         ({} B per rank), {lists} listings, {heads} HEADs, {puts} PUTs",
        took.as_secs_f64(),
        manifest_bytes / RANKS as usize
    );
    assert_eq!(manifest.files.len(), RANKS as usize);
    // Every file confirmed by the attempt's listing: no HEAD per file.
    assert_eq!(heads, 0);
    assert!((1..=2).contains(&lists), "{lists} listings");

    let before = counting.counts();
    let latest = root.latest().await.unwrap().unwrap();
    let after = counting.counts();
    assert_eq!(latest.id, "step_1000");
    assert_eq!(after.list, before.list, "latest listed the root");
    assert_eq!(after.get - before.get, 2);
}
