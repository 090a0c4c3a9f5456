//! Shared parts of the dataset tests: MDS datasets written with the real sharding writer,
//! uploaded to a real moto S3 server, and the checks every configuration runs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod child;
pub mod outage;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::{LocalDirSink, MdsWriter, MdsWriterOptions};
use shardstream_sharding::{Sample, Value};
use shardstream_storage::testing::{options_for, test_env, MotoServer};
use shardstream_storage::Location;
use shardstream_streamer::order::{OrderConfig, Rank, World};
use shardstream_streamer::{StreamPlan, StreamingConfig, StreamingDataset};

/// The bytes of sample `id`'s `data` column: pseudo-random (incompressible), so a sample read
/// from the wrong place is caught and compression cannot shrink a "large" shard.
pub fn payload(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// How to write a test dataset.
#[derive(Debug, Clone)]
pub struct Spec {
    pub samples: u64,
    pub sample_bytes: usize,
    pub shard_limit: u64,
    pub compression: Option<&'static str>,
    pub hashes: bool,
}

impl Spec {
    pub fn small(samples: u64) -> Spec {
        Spec {
            samples,
            sample_bytes: 1000,
            shard_limit: 64 * 1024,
            compression: None,
            hashes: false,
        }
    }
}

/// Writes an MDS dataset (`id: int`, `data: bytes`) into `dir`.
pub fn write_dataset(dir: &Path, spec: &Spec) {
    let options = MdsWriterOptions {
        compression: spec.compression.map(|c| Compression::parse(c).unwrap()),
        hashes: if spec.hashes {
            vec![HashAlgorithm::Xxh64]
        } else {
            Vec::new()
        },
        size_limit: Some(spec.shard_limit),
        threads: 0,
    };
    let columns = [
        ("data".to_string(), "bytes".to_string()),
        ("id".to_string(), "int".to_string()),
    ];
    let sink = Arc::new(LocalDirSink::new(dir).unwrap());
    let mut writer = MdsWriter::new(&columns, options, sink).unwrap();
    for id in 0..spec.samples {
        let mut s = Sample::new();
        s.insert("id".into(), Value::Int(id as i64));
        s.insert("data".into(), Value::Bytes(payload(id, spec.sample_bytes)));
        writer.write(&s).unwrap();
    }
    writer.finish().unwrap();
}

/// Checks a decoded sample against what the writer wrote for global id `index`.
pub fn check_sample(index: u64, sample: &Sample, len: usize) {
    assert_eq!(
        sample.get("id"),
        Some(&Value::Int(index as i64)),
        "sample {index}"
    );
    match sample.get("data") {
        Some(Value::Bytes(b)) => assert!(*b == payload(index, len), "data of sample {index}"),
        other => panic!("sample {index}: data column is {other:?}"),
    }
}

/// Streams `plan` of `ds` to its end, checking each sample (`check_sample`); returns how many came.
pub fn stream_checked(ds: &StreamingDataset, plan: StreamPlan, len: usize) -> u64 {
    let mut n = 0;
    for item in ds.stream(plan).unwrap() {
        let item = item.unwrap();
        check_sample(item.index, &item.sample.decode().unwrap(), len);
        n += 1;
    }
    n
}

/// A moto server holding `dir` under `s3://bucket/ds`.
pub fn moto_with(dir: &Path, rt: &tokio::runtime::Runtime) -> MotoServer {
    let server = rt.block_on(async {
        let server = MotoServer::start().await.unwrap();
        server.create_bucket("bucket").await.unwrap();
        server
    });
    upload(&server, dir, "ds", rt);
    server
}

/// Uploads `dir` to `s3://bucket/<prefix>` on `server`. Set-up, not what is tested: moto is
/// given minutes per part (a loaded CI machine took more than the tests' 30 s for parts of
/// the 256 MiB shards).
pub fn upload(server: &MotoServer, dir: &Path, prefix: &str, rt: &tokio::runtime::Runtime) {
    rt.block_on(async {
        let mut options = options_for(&server.endpoint());
        options.timeouts.request = std::time::Duration::from_secs(180);
        options.retry.retry_timeout = std::time::Duration::from_secs(180);
        let loc =
            Location::open_with(&format!("s3://bucket/{prefix}"), &options, &test_env()).unwrap();
        shardstream_storage::sync_up(dir, &loc).await.unwrap();
    });
}

/// Opens `s3://bucket/<prefix>` at a test endpoint (moto or a proxy in front of it).
pub fn s3_location(endpoint: &str, prefix: &str) -> Location {
    Location::open_with(
        &format!("s3://bucket/{prefix}"),
        &options_for(endpoint),
        &test_env(),
    )
    .unwrap()
}

/// A dataset of `s3://bucket/ds` cached for node 0 of run `run` under `cache`.
pub fn node_config(cache: &Path) -> StreamingConfig {
    StreamingConfig {
        remote: "s3://bucket/ds".into(),
        cache_root: Some(cache.to_path_buf()),
        run_id: Some("run".into()),
        node_rank: Some(0),
        ..StreamingConfig::default()
    }
}

/// Node 0 of run `run` cached under `cache_root`, with a 4 MiB memory budget; no dataset.
pub fn small_node_config(cache_root: &Path) -> StreamingConfig {
    StreamingConfig {
        cache_root: Some(cache_root.to_path_buf()),
        run_id: Some("run".into()),
        node_rank: Some(0),
        memory_limit: Some(4 << 20),
        ..StreamingConfig::default()
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Streams an epoch over every rank of `world` and checks the contract: every sample exactly
/// once (padding aside), with the bytes the writer wrote. Returns the positions seen.
pub fn stream_world(ds: &StreamingDataset, order: OrderConfig, world: World, len: usize) -> u64 {
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut positions = 0;
    for node in 0..world.nodes() {
        for local_process in 0..world.processes_per_node() {
            for worker in 0..world.workers() {
                let plan = StreamPlan {
                    order,
                    epoch: 1,
                    world,
                    rank: Rank {
                        node,
                        local_process,
                        worker,
                    },
                    start: 0,
                };
                for item in ds.stream(plan).unwrap() {
                    let item = item.unwrap();
                    positions += 1;
                    check_sample(item.index, &item.sample.decode().unwrap(), len);
                    assert_eq!(item.sample.index(), item.index);
                    if !item.padding {
                        *seen.entry(item.index).or_default() += 1;
                    }
                }
            }
        }
    }
    assert_eq!(seen.len() as u64, ds.num_samples(), "every sample seen");
    assert!(seen.values().all(|&n| n == 1), "no sample twice");
    positions
}

/// `spec`'s dataset on a fresh moto server (`s3://bucket/ds`), and an empty cache folder.
pub struct Served {
    pub location: Location,
    pub cache: tempfile::TempDir,
    pub server: MotoServer,
    pub data: tempfile::TempDir,
    pub rt: tokio::runtime::Runtime,
}

pub fn served(spec: &Spec) -> Served {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), spec);
    let server = moto_with(data.path(), &rt);
    Served {
        location: s3_location(&server.endpoint(), "ds"),
        cache: tempfile::tempdir().unwrap(),
        server,
        data,
        rt,
    }
}
