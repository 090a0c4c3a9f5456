//! `StreamingDataset::prefetch` against a real moto S3 server: it downloads the first shards a
//! part of an epoch needs, in the order the part needs them, within its limits; a stream of that
//! part started afterwards (here, through another dataset object, as a DataLoader worker would
//! open one) reads them from the cache without a request of its own; a local dataset read in
//! place plans nothing and starts no download.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::outage::StallProxy;
use common::{check_sample, moto_with, runtime, write_dataset, Spec};
use shardstream_storage::testing::{options_for, test_env, MotoServer};
use shardstream_storage::{Location, Timeouts};
use shardstream_streamer::order::{EpochOrder, OrderConfig, Rank, World};
use shardstream_streamer::{PrefetchReport, StreamPlan, StreamingConfig, StreamingDataset};

const SAMPLE_BYTES: usize = 4 << 10;

fn spec() -> Spec {
    // 600 samples of 4 KiB in shards of ~64 KiB: about 40 shards.
    Spec {
        samples: 600,
        sample_bytes: SAMPLE_BYTES,
        shard_limit: 64 << 10,
        compression: None,
        hashes: false,
    }
}

fn config(endpoint_dir: &Path, cache_limit: Option<u64>) -> StreamingConfig {
    StreamingConfig {
        remote: "s3://bucket/ds".into(),
        cache_root: Some(endpoint_dir.to_path_buf()),
        run_id: Some("run".into()),
        node_rank: Some(0),
        memory_limit: Some(8 << 20),
        cache_limit,
        ..StreamingConfig::default()
    }
}

/// Rank `local_process` of 2 processes (one node), shuffled in windows of 4 shards.
fn plan(local_process: u32) -> StreamPlan {
    StreamPlan {
        order: OrderConfig {
            seed: 11,
            shuffle: true,
            window: 4,
            lanes: 1,
            ..OrderConfig::default()
        },
        epoch: 2,
        world: World::new(1, 2, 1, 8).unwrap(),
        rank: Rank {
            node: 0,
            local_process,
            worker: 0,
        },
        start: 0,
    }
}

/// The shards the first `n` samples of `plan`'s part come from, in order of first use.
fn first_used(ds: &StreamingDataset, plan: StreamPlan, n: usize) -> Vec<usize> {
    let order = EpochOrder::new(ds.shape(), &plan.order, plan.epoch).unwrap();
    let mut seen = Vec::new();
    for s in order
        .rank_iter(plan.world, plan.rank, plan.start)
        .unwrap()
        .take(n)
    {
        let shard = s.sample.shard as usize;
        if !seen.contains(&shard) {
            seen.push(shard);
        }
    }
    seen
}

/// The test dataset on a fresh moto server (the runtime and the data folder must outlive it).
fn served() -> (tokio::runtime::Runtime, tempfile::TempDir, MotoServer) {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &spec());
    let server = moto_with(data.path(), &rt);
    (rt, data, server)
}

/// The report of a prefetch of `n` shards that all arrived.
fn all_ready(n: u64) -> PrefetchReport {
    PrefetchReport {
        planned: n,
        ready: n,
        failed: 0,
    }
}

/// Streams `plan`'s part through `ds`, checking every sample; returns how many came.
fn stream_checked(ds: &StreamingDataset, plan: StreamPlan) -> usize {
    let mut n = 0;
    for item in ds.stream(plan).unwrap() {
        let item = item.unwrap();
        check_sample(item.index, &item.sample.decode().unwrap(), SAMPLE_BYTES);
        n += 1;
    }
    n
}

fn open_on(
    server: &shardstream_storage::testing::MotoServer,
    config: StreamingConfig,
) -> StreamingDataset {
    let location = server.open("s3://bucket/ds").unwrap();
    StreamingDataset::open_at(config, location).unwrap()
}

#[test]
fn a_prefetch_fills_the_cache_with_the_parts_first_shards_and_the_stream_then_hits_them() {
    let (_rt, _data, server) = served();
    let cache = tempfile::tempdir().unwrap();

    let warmer = open_on(&server, config(cache.path(), None));
    let shards = warmer.num_shards();
    assert!(shards >= 20, "{shards} shards");
    // Blocks of 1, 2 and 4 shards (the ramp) make the part's first 7 shards.
    let mut prefetch = warmer.prefetch(plan(1), 7).unwrap();
    let report = prefetch.wait().unwrap();
    assert_eq!(report, all_ready(7));
    assert!(prefetch.is_finished());
    let m = warmer.metrics();
    assert_eq!(m.shards_fetched, 7, "{m:?}");
    assert_eq!(m.samples, 0, "a prefetch reads no sample");
    assert_eq!(cache_files(&warmer), 7);

    // They are the shards rank 1 reads first, in the order it first reads them.
    let chosen = prefetch.shards().to_vec();
    let used = first_used(&warmer, plan(1), 300);
    assert_eq!(chosen[0], used[0], "the first shard needed comes first");
    let first_seven: BTreeSet<usize> = used.iter().take(7).copied().collect();
    assert_eq!(chosen.iter().copied().collect::<BTreeSet<_>>(), first_seven);

    // A fresh dataset object (as a DataLoader worker opens one) streams rank 1's part: the
    // prefetched shards are hits, and only the others are fetched.
    let reader = open_on(&server, config(cache.path(), None));
    assert_eq!(stream_checked(&reader, plan(1)), 300);
    let m = reader.metrics();
    assert_eq!(m.shards_fetched, shards as u64 - 7, "{m:?}");
    assert!(m.cache_hits >= 7, "{m:?}");

    // Rank 0's part starts elsewhere in the same blocks: its first shard is one of them.
    let other = first_used(&warmer, plan(0), 1);
    assert!(chosen.contains(&other[0]));

    // On a warm cache a prefetch only looks: no request, no open.
    let again = open_on(&server, config(cache.path(), None));
    let report = again.prefetch(plan(1), 7).unwrap().wait().unwrap();
    assert_eq!(report, all_ready(7));
    let m = again.metrics();
    assert_eq!(
        (m.fetch_requests, m.cache_hits, m.cache_misses),
        (0, 0, 0),
        "{m:?}"
    );
}

#[test]
fn a_prefetch_stays_within_the_disk_allowance_and_a_cancelled_one_starts_nothing_more() {
    let (_rt, _data, server) = served();

    // A cache limit of 6 shards: the allowance is half of it, 3 shards, whatever is asked.
    let cache = tempfile::tempdir().unwrap();
    let probe = open_on(&server, config(cache.path(), None));
    let limit = probe.max_shard_cache_bytes() * 6;
    let ds = open_on(&server, config(cache.path(), Some(limit)));
    let report = ds.prefetch(plan(0), 100).unwrap().wait().unwrap();
    assert_eq!((report.planned, report.ready), (3, 3), "{report:?}");
    assert!(ds.cache_usage().unwrap() <= limit / 2);

    // Cancelled before it could run: it ends, having started at most its first downloads.
    let cache = tempfile::tempdir().unwrap();
    let ds = open_on(&server, config(cache.path(), None));
    let mut prefetch = ds.prefetch(plan(0), 30).unwrap();
    prefetch.cancel();
    let report = prefetch.wait().unwrap();
    assert_eq!(report.planned, 30);
    assert!(report.ready + report.failed <= 8, "{report:?}");
    assert_eq!(report.failed, 0);
    // Dropping an unfinished one is fine too, and leaves the cache usable.
    drop(ds.prefetch(plan(1), 30).unwrap());
    assert_eq!(stream_checked(&ds, plan(1)), 300);
}

#[test]
fn the_first_shard_has_the_link_alone_only_until_it_is_open() {
    // Shards of ~256 KiB behind a proxy that passes each connection's first 96 KiB of response
    // and then stalls: the first shard opens (its first write comes after 64 KiB) but never
    // completes. Had it kept the link until committed, no other download would ever start.
    // The last shard is smaller (~133 KiB): the limit must stay below it, or that download
    // completes and leaves the folder before all of them can be seen at once.
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    write_dataset(
        data.path(),
        &Spec {
            shard_limit: 256 << 10,
            ..spec()
        },
    );
    let server = moto_with(data.path(), &rt);
    const PASSED: u64 = 96 << 10;
    let smallest = std::fs::read_dir(data.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".mds"))
        .map(|e| e.metadata().unwrap().len())
        .min()
        .unwrap();
    assert!(smallest > PASSED, "a {smallest}-byte shard would complete");
    let proxy = rt.block_on(StallProxy::start(server.addr(), PASSED));
    let cache = tempfile::tempdir().unwrap();
    // The tests' usual 10 s stall timeout would retry the stalled downloads within the loop's
    // bound below, and the retry of the smallest shard (the rest is under `PASSED`) completes.
    let never_retried = options_for(&proxy.endpoint()).with_timeouts(Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(300),
        stall: Duration::from_secs(120),
    });
    let location = Location::open_with("s3://bucket/ds", &never_retried, &test_env()).unwrap();
    let ds = StreamingDataset::open_at(config(cache.path(), None), location).unwrap();
    let prefetch = ds.prefetch(plan(0), 8).unwrap();
    assert!(prefetch.shards().len() >= 3, "{:?}", prefetch.shards());
    let tmp = ds.cache_dir().join("tmp");
    let started = Instant::now();
    // A download's temp file is `<key id>.<reserved bytes>`.
    let in_flight = || {
        std::fs::read_dir(&tmp).map_or(0, |d| {
            d.flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    !name.starts_with('.')
                        && name
                            .rsplit_once('.')
                            .is_some_and(|(_, n)| n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        })
    };
    let mut most = 0;
    while most < prefetch.shards().len() {
        most = most.max(in_flight());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "at most {most} of the {} downloads ran at once while the first one was open \
             ({} now; prefetch {:?}; {:?}; temp files {:?})",
            prefetch.shards().len(),
            in_flight(),
            prefetch.report(),
            ds.metrics(),
            std::fs::read_dir(&tmp).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>()),
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(prefetch.report().ready, 0, "nothing can complete");
    prefetch.cancel();
    drop(proxy);
}

#[test]
fn a_dataset_read_in_place_plans_nothing_to_prefetch() {
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &spec());
    let cache = tempfile::tempdir().unwrap();
    let ds = StreamingDataset::open(StreamingConfig {
        remote: data.path().display().to_string(),
        cache_root: Some(cache.path().to_path_buf()),
        ..StreamingConfig::default()
    })
    .unwrap();
    let mut prefetch = ds.prefetch(plan(0), 8).unwrap();
    assert!(prefetch.is_finished());
    assert_eq!(prefetch.wait().unwrap().planned, 0);
    assert_eq!(ds.metrics().fetch_bytes, 0);
}

/// Shard files committed to the cache folder of `ds`.
fn cache_files(ds: &StreamingDataset) -> usize {
    std::fs::read_dir(ds.cache_dir().join("data")).map_or(0, |d| d.count())
}
