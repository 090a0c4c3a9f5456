//! Transfer throughput: one whole-object GET versus parallel ranged GETs, and one PUT versus
//! a parallel multipart upload, against a moto S3 server on loopback and a local directory.
//!
//! `cargo bench -p shardstream-storage --bench transfer` (set `SHARDSTREAM_BENCH_MIB` to
//! change the object size, default 64). moto is a single Python process: its figures measure
//! moto's request handling far more than the client, so read them as relative (parallel vs
//! single on the same server), not as S3 numbers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use shardstream_storage::object_store::ObjectStoreExt;
use shardstream_storage::testing::MotoServer;
use shardstream_storage::{Env, Location, StorageOptions};

const RUNS: usize = 3;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let mib: usize = std::env::var("SHARDSTREAM_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let size = mib << 20;
    let content = Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("object.bin");
    std::fs::write(&file, &content).unwrap();

    let moto = MotoServer::start()
        .await
        .expect("the benchmark needs moto_server");
    moto.create_bucket("bench").await.unwrap();
    let tune = |o: StorageOptions| {
        o.with_chunk_size(8 << 20)
            .with_part_size(8 << 20)
            .with_concurrency(8)
    };
    let s3 =
        Location::open_with("s3://bench/b", &tune(moto.storage_options()), &moto.env()).unwrap();
    let local_root = dir.path().join("store");
    let local = Location::open_with(
        local_root.to_str().unwrap(),
        &tune(StorageOptions::default()),
        &Env::default(),
    )
    .unwrap();

    println!("object {mib} MiB, chunk/part 8 MiB, concurrency 8, median of {RUNS} runs");
    println!("{:<8} {:<34} {:>10}", "store", "operation", "MiB/s");
    for (name, loc) in [("moto", &s3), ("local", &local)] {
        bench(name, loc, &file, &content, dir.path()).await;
    }
}

async fn bench(
    name: &str,
    loc: &Location,
    file: &std::path::Path,
    content: &Bytes,
    tmp: &std::path::Path,
) {
    let mib = content.len() as f64 / (1 << 20) as f64;
    let report = |op: &str, secs: f64| println!("{name:<8} {op:<34} {:>10.1}", mib / secs);

    report(
        "PUT, single request",
        median(|| async {
            loc.put("single", content.clone()).await.unwrap();
        })
        .await,
    );
    report(
        "upload_file, multipart x8",
        median(|| async {
            loc.upload_file(file, "multi").await.unwrap();
        })
        .await,
    );
    let path = loc.path("single").unwrap();
    report(
        "GET, single request",
        median(|| async {
            let got = loc.store().get(&path).await.unwrap().bytes().await.unwrap();
            assert_eq!(got.len(), content.len());
        })
        .await,
    );
    report(
        "get_parallel, 8 MiB x8",
        median(|| async {
            let got = loc.get_parallel("single", 8 << 20, 8).await.unwrap();
            assert_eq!(got.len(), content.len());
        })
        .await,
    );
    report(
        "get_parallel, 8 MiB x1",
        median(|| async {
            let got = loc.get_parallel("single", 8 << 20, 1).await.unwrap();
            assert_eq!(got.len(), content.len());
        })
        .await,
    );
    let dest = tmp.join(format!("download-{name}"));
    report(
        "download_to_file, 8 MiB x8",
        median(|| async {
            loc.download_to_file("multi", &dest).await.unwrap();
        })
        .await,
    );
}

async fn median<F, Fut>(mut op: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times: Vec<Duration> = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        op().await;
        times.push(started.elapsed());
    }
    times.sort();
    times[RUNS / 2].as_secs_f64()
}
