//! Hot loops of the MDS codec: sample encode/decode at 100 B and 10 KB, a whole shard write,
//! zstd level 3, and the hashes a writer records.
//!
//! Run: `cargo bench -p shardstream-sharding --bench codec -- --quick`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::{hash_hex, HashAlgorithm};
use shardstream_sharding::mds::{
    encode_shard, Columns, MdsWriter, MdsWriterOptions, ShardReader, ShardSink,
};
use shardstream_sharding::value::{DType, NdArray, Sample, Value};

/// A sink that drops everything, so the bench measures the writer, not the disk.
struct NullSink;

impl ShardSink for NullSink {
    fn put(&self, _name: &str, data: Vec<u8>) -> shardstream_sharding::Result<()> {
        black_box(data);
        Ok(())
    }
}

fn columns() -> Arc<Columns> {
    Arc::new(
        Columns::new(&[
            ("id".into(), "int".into()),
            ("label".into(), "uint8".into()),
            ("text".into(), "str".into()),
            ("x".into(), "ndarray:float32".into()),
        ])
        .unwrap(),
    )
}

/// A sample of about `size` encoded bytes: a few fixed columns, text and a float array.
fn sample(i: i64, size: usize) -> Sample {
    let floats = size.saturating_sub(60) / 8;
    let text_len = size.saturating_sub(30 + floats * 4);
    let mut s = Sample::new();
    s.insert("id".into(), Value::Int(i));
    s.insert("label".into(), Value::Int(i % 10));
    s.insert(
        "text".into(),
        Value::Str("lorem ipsum ".repeat(text_len / 12 + 1)[..text_len].to_string()),
    );
    s.insert(
        "x".into(),
        Value::NdArray(NdArray {
            dtype: DType::F32,
            shape: vec![floats.max(1) as u64],
            data: (0..floats.max(1))
                .flat_map(|j| (j as f32 * 0.5).to_le_bytes())
                .collect(),
        }),
    );
    s
}

fn bench_samples(c: &mut Criterion) {
    let cols = columns();
    let mut group = c.benchmark_group("sample");
    for size in [100usize, 10_000] {
        let s = sample(7, size);
        let mut encoded = Vec::new();
        cols.encode_sample(&s, &mut encoded).unwrap();
        group.throughput(Throughput::Bytes(encoded.len() as u64));
        group.bench_with_input(BenchmarkId::new("encode", size), &s, |b, s| {
            let mut out = Vec::with_capacity(encoded.len());
            b.iter(|| {
                out.clear();
                cols.encode_sample(black_box(s), &mut out).unwrap();
                black_box(out.len())
            })
        });
        let shard = encode_shard("bench", b"{}", &[encoded.len() as u32], &encoded).unwrap();
        let reader = ShardReader::new("bench", shard, Arc::clone(&cols), Some(1)).unwrap();
        group.bench_function(BenchmarkId::new("decode", size), |b| {
            b.iter(|| black_box(reader.decode_sample(0).unwrap()))
        });
        group.bench_function(BenchmarkId::new("sample_bytes", size), |b| {
            b.iter(|| black_box(reader.sample_columns(black_box(0)).unwrap().len()))
        });
    }
    group.finish();
}

fn bench_shard_write(c: &mut Criterion) {
    let samples: Vec<Sample> = (0..2000).map(|i| sample(i, 1000)).collect();
    let spec = [
        ("id".to_string(), "int".to_string()),
        ("label".to_string(), "uint8".to_string()),
        ("text".to_string(), "str".to_string()),
        ("x".to_string(), "ndarray:float32".to_string()),
    ];
    let mut group = c.benchmark_group("shard_write");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(2000 * 1000));
    for (name, compression) in [
        ("raw", None),
        ("zstd3", Some(Compression::parse("zstd").unwrap())),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let options = MdsWriterOptions {
                    compression,
                    hashes: vec![HashAlgorithm::Xxh64],
                    size_limit: Some(1 << 20),
                    threads: 1,
                };
                let mut w = MdsWriter::new(&spec, options, Arc::new(NullSink)).unwrap();
                for s in &samples {
                    w.write(s).unwrap();
                }
                black_box(w.finish().unwrap())
            })
        });
    }
    group.finish();
}

fn bench_compress_hash(c: &mut Criterion) {
    let cols = columns();
    let mut shard = Vec::new();
    let mut i = 0;
    while shard.len() < 4 << 20 {
        cols.encode_sample(&sample(i, 1000), &mut shard).unwrap();
        i += 1;
    }
    let zstd = Compression::parse("zstd").unwrap();
    let packed = zstd.compress(&shard).unwrap();
    let mut group = c.benchmark_group("file");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(shard.len() as u64));
    group.bench_function("zstd3_compress", |b| {
        b.iter(|| black_box(zstd.compress(&shard).unwrap()))
    });
    group.bench_function("zstd_decompress", |b| {
        b.iter(|| {
            black_box(
                zstd.decompress(&packed, "bench", shard.len() as u64)
                    .unwrap(),
            )
        })
    });
    for alg in [
        HashAlgorithm::Xxh64,
        HashAlgorithm::Xxh3_64,
        HashAlgorithm::Sha1,
        HashAlgorithm::Sha256,
    ] {
        group.bench_function(format!("hash_{alg}"), |b| {
            b.iter(|| black_box(hash_hex(alg, &shard)))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_samples,
    bench_shard_write,
    bench_compress_hash
);
criterion_main!(benches);
