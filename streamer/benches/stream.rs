//! Warm-cache streaming throughput at the Rust level, against the page-cache ceiling.
//!
//! Two MDS datasets are written once into a temp folder with the real writer: 100-byte samples
//! (8 MiB shards) and 1 MB samples (64 MiB shards). Each is read once before measuring, so every
//! read comes from the page cache ("warm"). Measured:
//! - `stream/100B`: samples/s of one rank streaming the whole epoch in order (`SampleStream`),
//!   touching every sample's bytes;
//! - `stream/1MB`: the same in bytes/s;
//! - `ceiling/1MB`: bytes/s of plain `pread`s of the same shard files in 1 MiB reads, the most
//!   any reader of those files can get from the page cache;
//! - `stream_shuffled/100B_in_512KiB_shards` and `.../100B_in_8MiB_shards`: samples/s of one
//!   rank streaming a *shuffled* epoch of 200,000 samples of 100 B: small shards are read whole
//!   once (`SampleStream`'s whole-shard reads), large ones one `pread` per sample.
//!
//! `cargo bench -p shardstream-streamer --bench stream`

#![allow(clippy::unwrap_used)] // a bench has nobody to return an error to

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shardstream_sharding::mds::{LocalDirSink, MdsWriter, MdsWriterOptions};
use shardstream_sharding::{Sample, Value};
use shardstream_streamer::order::OrderConfig;
use shardstream_streamer::{StreamPlan, StreamingConfig, StreamingDataset};

const SMALL_SAMPLES: u64 = 1_000_000;
const LARGE_SAMPLES: u64 = 256;
const SHUFFLED_SAMPLES: u64 = 200_000;

fn write(dir: &Path, samples: u64, sample_bytes: usize, shard: u64) {
    let options = MdsWriterOptions {
        size_limit: Some(shard),
        ..MdsWriterOptions::default()
    };
    let columns = [("data".to_string(), "bytes".to_string())];
    let sink = Arc::new(LocalDirSink::new(dir).unwrap());
    let mut writer = MdsWriter::new(&columns, options, sink).unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut data = vec![0u8; sample_bytes];
    for _ in 0..samples {
        for b in data.iter_mut().step_by(64) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let mut s = Sample::new();
        s.insert("data".into(), Value::Bytes(data.clone()));
        writer.write(&s).unwrap();
    }
    writer.finish().unwrap();
}

fn open(dir: &Path, cache: &Path) -> StreamingDataset {
    StreamingDataset::open(StreamingConfig {
        remote: dir.display().to_string(),
        cache_root: Some(cache.to_path_buf()),
        run_id: Some("bench".into()),
        node_rank: Some(0),
        memory_limit: Some(256 << 20),
        ..StreamingConfig::default()
    })
    .unwrap()
}

fn plan(order: OrderConfig) -> StreamPlan {
    StreamPlan::single_process(order, 0)
}

/// One epoch in order; returns the bytes seen so nothing is optimised away.
fn epoch(ds: &StreamingDataset) -> u64 {
    epoch_in(ds, OrderConfig::default())
}

fn epoch_in(ds: &StreamingDataset, order: OrderConfig) -> u64 {
    let mut bytes = 0u64;
    for item in ds.stream(plan(order)).unwrap() {
        let item = item.unwrap();
        bytes += item.sample.columns()[0].len() as u64;
    }
    bytes
}

/// Reads every shard file of `dir` with 1 MiB `pread`s.
fn ceiling(dir: &Path, buf: &mut [u8]) -> u64 {
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "mds") {
            let f = std::fs::File::open(&path).unwrap();
            let mut off = 0u64;
            loop {
                let n = f.read_at(buf, off).unwrap();
                if n == 0 {
                    break;
                }
                total += black_box(buf[n - 1]) as u64 & 1;
                off += n as u64;
            }
        }
    }
    total
}

fn dataset_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "mds"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

fn warm(c: &mut Criterion) {
    let root = tempfile::tempdir().unwrap();
    let (small, large, cache) = (
        root.path().join("100B"),
        root.path().join("1MB"),
        root.path().join("cache"),
    );
    write(&small, SMALL_SAMPLES, 100, 8 << 20);
    write(&large, LARGE_SAMPLES, 1_000_000, 64 << 20);
    let small_ds = open(&small, &cache);
    let large_ds = open(&large, &cache);
    // Warm the page cache.
    epoch(&small_ds);
    epoch(&large_ds);

    let mut g = c.benchmark_group("stream");
    g.sample_size(10);
    g.throughput(Throughput::Elements(SMALL_SAMPLES));
    g.bench_function("100B", |b| b.iter(|| epoch(&small_ds)));
    g.throughput(Throughput::Bytes(dataset_bytes(&large)));
    g.bench_function("1MB", |b| b.iter(|| epoch(&large_ds)));
    g.finish();

    let mut g = c.benchmark_group("ceiling");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(dataset_bytes(&large)));
    let mut buf = vec![0u8; 1 << 20];
    g.bench_function("1MB", |b| b.iter(|| ceiling(&large, &mut buf)));
    g.finish();

    let shuffled = OrderConfig {
        shuffle: true,
        seed: 7,
        ..OrderConfig::default()
    };
    let mut g = c.benchmark_group("stream_shuffled");
    g.sample_size(10);
    g.throughput(Throughput::Elements(SHUFFLED_SAMPLES));
    for (name, shard) in [
        ("100B_in_512KiB_shards", 512 << 10),
        ("100B_in_8MiB_shards", 8 << 20),
    ] {
        let dir = root.path().join(name);
        write(&dir, SHUFFLED_SAMPLES, 100, shard);
        let ds = open(&dir, &cache);
        epoch_in(&ds, shuffled);
        g.bench_function(name, |b| b.iter(|| epoch_in(&ds, shuffled)));
    }
    g.finish();
}

criterion_group!(benches, warm);
criterion_main!(benches);
