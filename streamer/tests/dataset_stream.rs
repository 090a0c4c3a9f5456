//! The dataset API end to end, one test body over every source: a local folder read in place,
//! the same folder copied into the cache, compressed shards (zstd, gzip), and a real moto S3
//! server with and without hash checks. Every configuration streams a full epoch over a world of
//! 2 nodes x 2 processes x 2 workers, shuffled, and must give every sample exactly once with the
//! bytes the writer wrote; then random access and the shard handle are checked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // the shared body is a helper, not a #[test] fn

use crate::common;
use std::path::Path;

use common::{
    check_sample, moto_with, runtime, s3_location, small_node_config as config, stream_world,
    upload, write_dataset, Spec,
};
use shardstream_storage::testing::MotoServer;
use shardstream_streamer::order::{OrderConfig, World};
use shardstream_streamer::{StreamPlan, StreamerError, StreamingConfig, StreamingDataset};

/// Opens the dataset `moto_with` uploaded under `ds`, with `config` (its `remote` set to it).
fn open_on_moto(server: &MotoServer, config: StreamingConfig) -> StreamingDataset {
    StreamingDataset::open_at(
        StreamingConfig {
            remote: "s3://bucket/ds".into(),
            ..config
        },
        s3_location(&server.endpoint(), "ds"),
    )
    .unwrap()
}

fn shuffled() -> OrderConfig {
    OrderConfig {
        seed: 11,
        shuffle: true,
        window: 3,
        lanes: 2,
        ..OrderConfig::default()
    }
}

/// The one body: full epoch, random access, shard handle reads.
fn check_dataset(ds: &StreamingDataset, spec: &Spec) {
    assert_eq!(ds.num_samples(), spec.samples);
    assert!(ds.num_shards() > 3, "the test needs several shards");
    let names: Vec<&str> = ds.columns().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["data", "id"]);
    assert!(ds.index_json().unwrap().starts_with(b"{"));

    let world = World::new(2, 2, 2, 4).unwrap();
    let positions = stream_world(ds, shuffled(), world, spec.sample_bytes);
    assert!(positions >= spec.samples && positions < spec.samples + world.processes());

    for id in [0, spec.samples / 2, spec.samples - 1] {
        let raw = ds.sample(id).unwrap();
        check_sample(id, &raw.decode().unwrap(), spec.sample_bytes);
        let (shard, i) = ds.shard_of(id).unwrap();
        assert_eq!(raw.shard(), shard);
        let handle = ds.shard(shard).unwrap();
        assert_eq!(handle.sample(i).unwrap().bytes(), raw.bytes());
        // read_at sees the decompressed file: its header counts the shard's samples.
        let mut head = [0u8; 4];
        assert_eq!(handle.read_at(0, &mut head).unwrap(), 4);
        assert_eq!(u64::from(u32::from_le_bytes(head)), handle.num_samples());
        assert_eq!(
            std::fs::metadata(handle.path()).unwrap().len(),
            handle.len()
        );
    }
    assert!(ds.shard_of(spec.samples).is_none());
    assert!(matches!(
        ds.sample(spec.samples),
        Err(StreamerError::OutOfRange { .. })
    ));
}

#[test]
fn local_folder_read_in_place() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let spec = Spec::small(600);
    write_dataset(data.path(), &spec);
    let ds = StreamingDataset::open(StreamingConfig {
        remote: data.path().display().to_string(),
        ..config(cache.path())
    })
    .unwrap();
    check_dataset(&ds, &spec);
    // Read in place: the shard files are the dataset's own, nothing was copied.
    let handle = ds.shard(0).unwrap();
    assert!(
        handle
            .path()
            .starts_with(data.path().canonicalize().unwrap())
            || handle.path().starts_with(data.path())
    );
    assert_eq!(ds.metrics().fetch_bytes, 0);
    assert_eq!(ds.cache_usage().unwrap(), 0);
}

#[test]
fn local_folder_copied_and_compressed() {
    for compression in [None, Some("zstd:3"), Some("gz")] {
        let data = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let spec = Spec {
            compression,
            hashes: true,
            ..Spec::small(500)
        };
        write_dataset(data.path(), &spec);
        let ds = StreamingDataset::open(StreamingConfig {
            remote: format!("file://{}", data.path().display()),
            copy_local: true,
            validate_hash: true,
            ..config(cache.path())
        })
        .unwrap();
        check_dataset(&ds, &spec);
        let handle = ds.shard(1).unwrap();
        assert!(
            handle
                .path()
                .starts_with(ds.cache_dir().canonicalize().unwrap()),
            "{compression:?}: {} is not in the cache",
            handle.path().display()
        );
        assert!(ds.cache_usage().unwrap() > 0);
    }
}

#[test]
fn s3_moto_raw_and_compressed_with_hashes() {
    let rt = runtime();
    for (compression, hashes) in [(None, false), (Some("zstd"), true)] {
        let data = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let spec = Spec {
            compression,
            hashes,
            ..Spec::small(700)
        };
        write_dataset(data.path(), &spec);
        let server = moto_with(data.path(), &rt);
        let ds = open_on_moto(
            &server,
            StreamingConfig {
                validate_hash: hashes,
                ..config(cache.path())
            },
        );
        check_dataset(&ds, &spec);
        let m = ds.metrics();
        let stored: u64 = std::fs::read_dir(data.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name() != "index.json")
            .map(|e| e.metadata().unwrap().len())
            .sum();
        // Each shard once: the bytes fetched are exactly the dataset's stored bytes.
        assert_eq!(m.fetch_bytes, stored, "{compression:?}");
        assert_eq!(m.shards_fetched as usize, ds.num_shards());
        assert!(m.cache_hits > 0);
    }
}

#[test]
fn missing_dataset_and_bad_index_are_named() {
    let cache = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let err = StreamingDataset::open(StreamingConfig {
        remote: data.path().join("nope").display().to_string(),
        ..config(cache.path())
    })
    .unwrap_err();
    assert!(matches!(err, StreamerError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("nope"), "{err}");

    std::fs::write(
        data.path().join("index.json"),
        b"{\"version\": 2, \"shards\": 7}",
    )
    .unwrap();
    let err = StreamingDataset::open(StreamingConfig {
        remote: data.path().display().to_string(),
        ..config(cache.path())
    })
    .unwrap_err();
    assert!(err.to_string().contains("index.json"), "{err}");
}

/// Two datasets mixed as Mosaic's streams: A repeated twice, 100 samples chosen from B. The
/// epoch holds exactly that, in the same order on every run, and a resume from the middle
/// continues it exactly.
#[test]
fn two_streams_mixed_by_repeat_and_choose_deterministic_and_resumable() {
    use shardstream_streamer::order::{Rank, Weight};
    use shardstream_streamer::{StreamPlan, StreamSpec};
    use std::collections::BTreeMap;

    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cache = tempfile::tempdir().unwrap();
    let (spec_a, spec_b) = (Spec::small(300), Spec::small(200));
    write_dataset(a.path(), &spec_a);
    write_dataset(b.path(), &spec_b);
    let stream = |dir: &Path, weight| StreamSpec {
        remote: dir.display().to_string(),
        split: None,
        weight,
        location: None,
        storage_options: Default::default(),
    };
    let ds = StreamingDataset::open_streams(
        config(cache.path()),
        vec![
            stream(a.path(), Weight::Repeat(2.0)),
            stream(b.path(), Weight::Choose(100)),
        ],
        None,
    )
    .unwrap();
    assert_eq!(ds.num_samples(), 500);
    assert_eq!(ds.shape().epoch_len(), 700);
    let world = World::new(1, 2, 1, 1).unwrap();
    let run = |start: u64| -> Vec<(u64, u64)> {
        let mut all = Vec::new();
        for local_process in 0..2 {
            let plan = StreamPlan {
                order: shuffled(),
                epoch: 4,
                world,
                rank: Rank {
                    node: 0,
                    local_process,
                    worker: 0,
                },
                start,
            };
            for item in ds.stream(plan).unwrap() {
                let item = item.unwrap();
                // Stream B's samples carry their own ids (0..200) after A's 300.
                let own = if item.index >= 300 {
                    item.index - 300
                } else {
                    item.index
                };
                check_sample(own, &item.sample.decode().unwrap(), 1000);
                all.push((item.position, item.index));
            }
        }
        all.sort();
        all
    };
    let first = run(0);
    assert_eq!(first.len(), 700);
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    for (_, id) in &first {
        *counts.entry(*id).or_default() += 1;
    }
    assert!((0..300).all(|id| counts.get(&id) == Some(&2)), "A twice");
    let from_b: Vec<_> = counts.iter().filter(|(id, _)| **id >= 300).collect();
    assert_eq!(from_b.len(), 100, "100 distinct samples of B");
    assert!(from_b.iter().all(|(_, n)| **n == 1));
    assert_eq!(run(0), first, "same order on every run");
    assert_eq!(run(350), first[350..].to_vec(), "resume continues exactly");
}

/// One rank's shuffled epoch, checked as `stream_world` checks (every sample once, with its
/// bytes); returns the `pread`s the stream made.
fn shuffled_epoch_reads(ds: &StreamingDataset, spec: &Spec) -> u64 {
    let order = OrderConfig {
        window: 4,
        lanes: 1,
        ..shuffled()
    };
    let before = ds.metrics().sample_reads;
    stream_world(
        ds,
        order,
        World::new(1, 1, 1, 1).unwrap(),
        spec.sample_bytes,
    );
    assert_eq!(ds.metrics().memory_in_use, 0, "the budget is given back");
    ds.metrics().sample_reads - before
}

/// A shuffled stream reads a small complete shard whole, once, and serves its samples from
/// memory (within an eighth of the budget; its first batch, one sample here, is read sample by
/// sample); with a budget too small for that it reads one sample at a time. Cold from moto with a tight budget it still completes: the kept shards
/// are given back before the stream waits on a download that may need their bytes.
#[test]
fn shuffled_stream_reads_small_shards_whole_within_the_budget() {
    let data = tempfile::tempdir().unwrap();
    let spec = Spec::small(600); // 1000-byte samples in 64 KiB shards
    write_dataset(data.path(), &spec);
    let open = |limit: u64, cache: &Path| {
        StreamingDataset::open(StreamingConfig {
            remote: data.path().display().to_string(),
            memory_limit: Some(limit),
            ..config(cache)
        })
        .unwrap()
    };
    // 4 MiB: an eighth is 512 KiB, room for every shard of a 4-shard window.
    let cache = tempfile::tempdir().unwrap();
    let ds = open(4 << 20, cache.path());
    let shards = ds.num_shards() as u64;
    let reads = shuffled_epoch_reads(&ds, &spec);
    assert!(reads <= shards + 1, "{reads} reads for {shards} shards");
    // 256 KiB: an eighth (32 KiB) holds no 64 KiB shard, so samples are read one by one.
    let cache = tempfile::tempdir().unwrap();
    let tight = open(256 << 10, cache.path());
    let reads = shuffled_epoch_reads(&tight, &spec);
    assert!(reads > spec.samples / 2, "{reads} reads of single samples");

    let rt = runtime();
    let server = moto_with(data.path(), &rt);
    let cache = tempfile::tempdir().unwrap();
    let cold = open_on_moto(
        &server,
        StreamingConfig {
            memory_limit: Some(1 << 20),
            ..config(cache.path())
        },
    );
    let reads = shuffled_epoch_reads(&cold, &spec);
    assert!(
        reads < spec.samples,
        "{reads} reads: some shards were read whole"
    );
    assert_eq!(cold.metrics().shards_fetched, shards);
}

/// A shuffled stream opens each shard once per epoch, also when the block ahead holds more
/// shards than the stream has fetch slots: the planner's lookahead then halves, and it used to
/// release the shards it had just started for that block, reopening every one of them at each
/// replan (104 opens for 12 shards with the ramp's blocks of 1, 2 and 9).
#[test]
fn a_shuffled_epoch_opens_each_shard_once() {
    let data = tempfile::tempdir().unwrap();
    let spec = Spec::small(40 * 63); // 1000-byte samples, 63 per 64 KiB shard: 40 shards
    write_dataset(data.path(), &spec);
    let rt = runtime();
    let server = moto_with(data.path(), &rt);
    let cache = tempfile::tempdir().unwrap();
    let ds = open_on_moto(&server, config(cache.path()));
    let shards = ds.num_shards() as u64;
    assert_eq!(shards, 40);
    for (window, ramp) in [(16, true), (16, false), (12, true), (40, true)] {
        let order = OrderConfig {
            window,
            ramp,
            lanes: 1,
            ..shuffled()
        };
        let m = ds.metrics();
        let before = m.cache_hits + m.cache_misses;
        stream_world(
            &ds,
            order,
            World::new(1, 1, 1, 1).unwrap(),
            spec.sample_bytes,
        );
        let m = ds.metrics();
        let opens = m.cache_hits + m.cache_misses - before;
        assert_eq!(
            opens, shards,
            "window {window}, ramp {ramp}: {opens} opens of {shards} shards"
        );
    }
}

/// A remote `index.json` is read from the store once per cache folder: later opens read the copy
/// kept there, a copy that does not parse is read from the store again, and a local dataset's
/// index is always read where it is.
#[test]
fn a_remote_index_is_read_from_the_store_once_per_cache_folder() {
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let spec = Spec::small(300);
    write_dataset(data.path(), &spec);
    let original = std::fs::read(data.path().join("index.json")).unwrap();
    let server = moto_with(data.path(), &rt);

    // `open` starts no thread: the copy is saved in the background of the first stream, and
    // the stream's end waits for it.
    let first = open_on_moto(&server, config(cache.path()));
    let copies = first.cache_dir().join("indexes");
    assert!(copies_in(&copies).is_empty());
    check_dataset(&first, &spec);
    let names = copies_in(&copies);
    assert_eq!(names.len(), 1, "{names:?}");
    let copy = copies.join(&names[0]);
    assert_eq!(std::fs::read(&copy).unwrap(), original);
    drop(first);

    // A damaged copy (a disk fault) is replaced from the store.
    std::fs::write(&copy, &original[..original.len() / 2]).unwrap();
    let again = open_on_moto(&server, config(cache.path()));
    assert_eq!(again.num_samples(), spec.samples);
    check_dataset(&again, &spec);
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        original,
        "the copy was not replaced"
    );
    drop(again);

    // With the index gone from the store, the folder's copy still opens the dataset and streams
    // every sample; a new folder reads the store and is told the index is missing.
    rt.block_on(s3_location(&server.endpoint(), "ds").delete("index.json"))
        .unwrap();
    let from_copy = open_on_moto(&server, config(cache.path()));
    check_dataset(&from_copy, &spec);
    let other = tempfile::tempdir().unwrap();
    let err = StreamingDataset::open_at(
        StreamingConfig {
            remote: "s3://bucket/ds".into(),
            ..config(other.path())
        },
        s3_location(&server.endpoint(), "ds"),
    )
    .unwrap_err();
    assert!(matches!(err, StreamerError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("index.json"), "{err}");

    // Mixed streams: each remote index (a split is part of its URL) gets its own copy, a local
    // one none; the second open reads both copies.
    use shardstream_streamer::order::Weight;
    use shardstream_streamer::StreamSpec;
    let mixed = tempfile::tempdir().unwrap();
    upload(&server, data.path(), "again/train", &rt);
    upload(&server, data.path(), "again/val", &rt);
    let streams = || {
        let remote = |split: &str| StreamSpec {
            remote: "s3://bucket/again".into(),
            split: Some(split.into()),
            weight: Weight::Natural,
            location: Some(s3_location(&server.endpoint(), "again")),
            storage_options: Default::default(),
        };
        let local = StreamSpec {
            remote: data.path().display().to_string(),
            split: None,
            weight: Weight::Natural,
            location: None,
            storage_options: Default::default(),
        };
        vec![remote("train"), remote("val"), local]
    };
    let first = StreamingDataset::open_streams(config(mixed.path()), streams(), None).unwrap();
    stream_epoch(&first);
    let kept = copies_in(&first.cache_dir().join("indexes"));
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept.iter().all(|name| name.ends_with(".json")), "{kept:?}");
    for split in ["train", "val"] {
        rt.block_on(
            s3_location(&server.endpoint(), "again").delete(&format!("{split}/index.json")),
        )
        .unwrap();
    }
    let again = StreamingDataset::open_streams(config(mixed.path()), streams(), None).unwrap();
    assert_eq!(again.num_samples(), 3 * spec.samples);
    drop((first, again));

    // A local dataset's index is the file itself: no copy is made.
    let local = StreamingDataset::open(StreamingConfig {
        remote: data.path().display().to_string(),
        copy_local: true,
        ..config(other.path())
    })
    .unwrap();
    stream_epoch(&local);
    assert!(copies_in(&local.cache_dir().join("indexes")).is_empty());
}

/// `StreamingConfig::sampling`: with [`Sampling::Fixed`] a stream whose epoch share is a part of
/// it (100 of B's 200) yields the same samples every epoch, in a new order; with the default
/// (balanced) a fresh subset each epoch.
#[test]
fn fixed_sampling_keeps_a_partial_streams_subset_every_epoch() {
    use shardstream_streamer::order::{Sampling, Weight};
    use shardstream_streamer::StreamSpec;
    use std::collections::BTreeSet;

    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_dataset(a.path(), &Spec::small(120));
    write_dataset(b.path(), &Spec::small(200));
    let stream = |dir: &Path, weight| StreamSpec {
        remote: dir.display().to_string(),
        split: None,
        weight,
        location: None,
        storage_options: Default::default(),
    };
    // B's samples of `epoch` (global indexes after A's 120), in the order streamed.
    let epoch_of_b = |ds: &StreamingDataset, epoch: u64| -> Vec<u64> {
        let plan = StreamPlan::single_process(shuffled(), epoch);
        let indexes = ds.stream(plan).unwrap().map(|item| item.unwrap().index);
        indexes.filter(|&i| i >= 120).collect()
    };
    for sampling in [Sampling::Fixed, Sampling::Balanced] {
        let cache = tempfile::tempdir().unwrap();
        let ds = StreamingDataset::open_streams(
            StreamingConfig {
                sampling,
                ..config(cache.path())
            },
            vec![
                stream(a.path(), Weight::Natural),
                stream(b.path(), Weight::Choose(100)),
            ],
            None,
        )
        .unwrap();
        assert_eq!(ds.shape().sampling(), sampling);
        let epochs: Vec<Vec<u64>> = (0..3).map(|e| epoch_of_b(&ds, e)).collect();
        let subsets: BTreeSet<BTreeSet<u64>> =
            epochs.iter().map(|e| e.iter().copied().collect()).collect();
        assert!(epochs.iter().all(|e| e.len() == 100));
        assert_ne!(epochs[0], epochs[1], "each epoch has its own order");
        let want = if sampling == Sampling::Fixed { 1 } else { 3 };
        assert_eq!(subsets.len(), want, "{sampling:?}");
    }
}

/// Streams one whole epoch of `ds` as a single process (the stream's end waits for the index
/// copy it saves).
fn stream_epoch(ds: &StreamingDataset) {
    let plan = StreamPlan::single_process(shuffled(), 1);
    let mut n = 0u64;
    for item in ds.stream(plan).unwrap() {
        item.unwrap();
        n += 1;
    }
    assert_eq!(n, ds.num_samples());
}

/// The names of the index copies in `dir` (none when it does not exist).
fn copies_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
