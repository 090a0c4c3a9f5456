//! Save and load throughput of the checkpoint core, against a local directory and an in-memory
//! store (the latter isolates this crate's own cost: checksums, copies, scheduling).
//!
//! `cargo bench -p shardstream-checkpoint --bench save_load`
//! Environment: `SHARDSTREAM_BENCH_RANKS` (4), `SHARDSTREAM_BENCH_FILES` (2 per rank),
//! `SHARDSTREAM_BENCH_MIB` (64 per file), `SHARDSTREAM_BENCH_DIR` (a temp dir).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use shardstream_checkpoint::checksum::crc32c;
use shardstream_checkpoint::{CheckpointRoot, CommitRequest, UploadConfig, UploadSource};
use std::sync::Arc;
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

struct Shape {
    ranks: u32,
    files: u32,
    file_bytes: usize,
}

async fn bench(name: &str, store: Arc<dyn ObjectStore>, shape: &Shape, payload: &[Bytes]) {
    let root = CheckpointRoot::new(store, Path::from("bench"));
    let total = u64::from(shape.ranks * shape.files) * shape.file_bytes as u64;
    let config = UploadConfig::default();

    for round in 0..2 {
        let id = format!("step_{round}");
        let t = Instant::now();
        let attempt = root.begin_save(&id).await.unwrap();
        let mut tasks = Vec::new();
        for rank in 0..shape.ranks {
            let w = root.rank_writer(&attempt, rank, &config).unwrap();
            let files: Vec<(String, UploadSource)> = (0..shape.files)
                .map(|k| {
                    let data = payload[((rank * shape.files + k) as usize) % payload.len()].clone();
                    (format!("__{rank}_{k}.distcp"), UploadSource::Bytes(data))
                })
                .collect();
            tasks.push(tokio::spawn(
                async move { w.upload_all(files).await.unwrap() },
            ));
        }
        let mut records = Vec::new();
        for t in tasks {
            records.extend(t.await.unwrap());
        }
        let uploaded = t.elapsed().as_secs_f64();
        root.commit(
            &attempt,
            CommitRequest {
                records,
                world_size: shape.ranks,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let saved = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let reader = root.open(&id).await.unwrap();
        let mut reads = Vec::new();
        for f in reader.manifest().files.clone() {
            let r = reader.clone();
            reads.push(tokio::spawn(async move {
                r.read_file(&f.path).await.unwrap().len() as u64
            }));
        }
        let mut read = 0;
        for r in reads {
            read += r.await.unwrap();
        }
        assert_eq!(read, total);
        let loaded = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let report = reader.verify().await.unwrap();
        assert!(report.is_ok());
        let verified = t.elapsed().as_secs_f64();
        println!(
            "{name:<8} round {round}: save {:6.2} GB/s ({saved:.3} s, commit {:.1} ms) | load {:6.2} GB/s ({loaded:.3} s) | verify {:6.2} GB/s",
            gbps(total, saved),
            (saved - uploaded) * 1e3,
            gbps(total, loaded),
            gbps(total, verified),
        );
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too, so keep that short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let shape = Shape {
        ranks: env("SHARDSTREAM_BENCH_RANKS", 4) as u32,
        files: env("SHARDSTREAM_BENCH_FILES", 2) as u32,
        file_bytes: if quick {
            1 << 20
        } else {
            env("SHARDSTREAM_BENCH_MIB", 64) << 20
        },
    };
    let payload: Vec<Bytes> = (0..4u8)
        .map(|s| {
            (0..shape.file_bytes)
                .map(|i| (i as u8).wrapping_mul(131).wrapping_add(s))
                .collect::<Vec<u8>>()
                .into()
        })
        .collect();
    let total = u64::from(shape.ranks * shape.files) * shape.file_bytes as u64;
    println!(
        "checkpoint save/load: {} ranks x {} files x {} MiB = {} MiB, part 64 MiB, {} CPUs",
        shape.ranks,
        shape.files,
        shape.file_bytes >> 20,
        total >> 20,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    let t = Instant::now();
    let mut sink = 0u32;
    for p in &payload {
        sink ^= crc32c(p);
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "crc32c   {:6.2} GB/s (single thread, {sink:08x})",
        gbps(payload.len() as u64 * shape.file_bytes as u64, secs)
    );

    bench("memory", Arc::new(InMemory::new()), &shape, &payload).await;
    let dir = match std::env::var("SHARDSTREAM_BENCH_DIR") {
        Ok(d) => tempfile::tempdir_in(d).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let fs = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    bench("localfs", Arc::new(fs), &shape, &payload).await;
}
