//! The dataset across real processes sharing one node cache, streaming from a real moto S3
//! server: each test re-runs this test binary as child processes (see `common::child`).
//!
//! - 8 processes (the 8 ranks of one node) stream an epoch at the same time: together they see
//!   every sample exactly once, and the node downloads each shard exactly once (the processes'
//!   download counters add up to the dataset's shard count and bytes).
//! - A process is killed with SIGKILL in the middle of a download; a new process on the same
//!   cache streams the whole epoch with correct bytes (no partial file served), finds no stale
//!   lock (it finishes), and no temp file is left.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::child::{run_child, spawn, wait, ChildSpec};
use common::{moto_with, runtime, write_dataset, Spec};
use shardstream_storage::testing::FaultProxy;

fn stored_bytes(dir: &Path) -> (u64, u64) {
    let mut shards = 0;
    let mut bytes = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "index.json" {
            shards += 1;
            bytes += e.metadata().unwrap().len();
        }
    }
    (shards, bytes)
}

#[test]
fn eight_processes_on_a_node_fetch_each_shard_once() {
    if run_child() {
        return;
    }
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let spec = Spec::small(2400);
    write_dataset(data.path(), &spec);
    let (shards, bytes) = stored_bytes(data.path());
    let server = moto_with(data.path(), &rt);
    let children: Vec<_> = (0..8)
        .map(|rank| {
            let child = ChildSpec {
                endpoint: server.endpoint(),
                prefix: "ds".into(),
                cache_root: cache.path().to_path_buf(),
                processes: 8,
                rank,
                memory_limit: 2 << 20,
                cache_limit: None,
                shuffle: true,
                sample_bytes: spec.sample_bytes,
                out: out.path().join(format!("{rank}.json")),
            };
            (spawn(TEST_EIGHT, &child), child.out)
        })
        .collect();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let (mut fetched, mut fetched_bytes, mut hits) = (0, 0, 0);
    for (child, out) in children {
        let report = wait(child, &out);
        for id in report["ids"].as_array().unwrap() {
            *seen.entry(id.as_u64().unwrap()).or_default() += 1;
        }
        fetched += report["shards_fetched"].as_u64().unwrap();
        fetched_bytes += report["fetch_bytes"].as_u64().unwrap();
        hits += report["cache_hits"].as_u64().unwrap();
    }
    assert_eq!(seen.len() as u64, spec.samples, "every sample seen");
    assert!(seen.values().all(|&n| n == 1), "a sample was seen twice");
    assert_eq!(
        fetched, shards,
        "each shard downloaded exactly once per node"
    );
    assert_eq!(fetched_bytes, bytes, "download amplification must be 1");
    // Every process read every shard (lanes = 1): the other 7 found it in the cache.
    assert!(hits >= 7 * shards, "{hits} hits");
}
const TEST_EIGHT: &str = "eight_processes_on_a_node_fetch_each_shard_once";

#[test]
fn sigkill_mid_download_then_restart_on_the_same_cache() {
    if run_child() {
        return;
    }
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    // Four shards of about 4 MiB: large enough to kill a download in the middle.
    let spec = Spec {
        samples: 64,
        sample_bytes: 256 * 1024,
        shard_limit: 4 << 20,
        compression: None,
        hashes: true,
    };
    write_dataset(data.path(), &spec);
    let server = moto_with(data.path(), &rt);
    // The first process downloads through a 1 MiB/s link, so it is surely mid-download.
    let proxy = rt.block_on(FaultProxy::start(server.addr())).unwrap();
    proxy.set_bandwidth(1 << 20);
    let first = ChildSpec {
        endpoint: proxy.endpoint(),
        prefix: "ds".into(),
        cache_root: cache.path().to_path_buf(),
        processes: 1,
        rank: 0,
        memory_limit: 4 << 20,
        cache_limit: None,
        shuffle: false,
        sample_bytes: spec.sample_bytes,
        out: out.path().join("first.json"),
    };
    let mut victim = spawn(TEST_KILL, &first);
    let tmp = cache.path().join("run/0/tmp");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Wait until the download's temp file (sized up front, so its length says nothing) holds
    // real data: at least 256 KiB of allocated blocks, far from the 4 MiB of a whole shard at
    // 1 MiB/s, so the kill surely lands mid-download.
    loop {
        if allocated_in(&tmp) >= 256 << 10 {
            break;
        }
        assert!(Instant::now() < deadline, "no download got under way");
        assert!(
            victim.try_wait().unwrap().is_none(),
            "the victim exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    assert!(
        std::fs::read_dir(&tmp).unwrap().next().is_some(),
        "the kill left a temp file"
    );

    // Restart on the same cache, at full speed: every sample's bytes are checked in the child.
    let second = ChildSpec {
        endpoint: server.endpoint(),
        out: out.path().join("second.json"),
        ..first
    };
    let started = Instant::now();
    let report = wait(spawn(TEST_KILL, &second), &second.out);
    assert_eq!(report["ids"].as_array().unwrap().len() as u64, spec.samples);
    assert!(report["shards_fetched"].as_u64().unwrap() >= 1);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a stale lock held the restart"
    );
    assert!(
        std::fs::read_dir(&tmp).unwrap().next().is_none(),
        "a temp file outlived the restart"
    );
}
const TEST_KILL: &str = "sigkill_mid_download_then_restart_on_the_same_cache";

/// Bytes of disk actually allocated to the files in `dir` (0 while it does not exist).
fn allocated_in(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}
