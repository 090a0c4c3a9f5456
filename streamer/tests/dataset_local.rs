//! Local datasets need no run id (nothing is downloaded), whether read in place or decompressed
//! into a folder of their own; the error when one is needed names every way to give it, and
//! `validate_hash` checks in-place shards.
//!
//! One test in this binary: it clears the run id variables of its own process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{stream_checked, write_dataset, Spec};
use shardstream_identity::{CACHE_DIR_ENV, RUN_ID_SOURCES};
use shardstream_streamer::order::OrderConfig;
use shardstream_streamer::{StreamPlan, StreamerError, StreamingConfig, StreamingDataset};

fn plan() -> StreamPlan {
    StreamPlan::single_process(
        OrderConfig {
            seed: 3,
            shuffle: true,
            window: 2,
            lanes: 1,
            ..OrderConfig::default()
        },
        0,
    )
}

fn local(remote: &std::path::Path, cache_root: &std::path::Path) -> StreamingConfig {
    StreamingConfig {
        remote: remote.display().to_string(),
        cache_root: Some(cache_root.to_path_buf()),
        memory_limit: Some(4 << 20),
        ..StreamingConfig::default()
    }
}

#[test]
fn local_datasets_in_place_need_no_run_id_and_are_hash_checked() {
    // Edition 2021: `remove_var` is safe; this binary runs only this test.
    for var in RUN_ID_SOURCES.iter().copied().chain([CACHE_DIR_ENV]) {
        std::env::remove_var(var);
    }
    let cache = tempfile::tempdir().unwrap();

    // 1. A raw local dataset read in place opens and streams without any run id.
    let raw = tempfile::tempdir().unwrap();
    let spec = Spec {
        hashes: true,
        ..Spec::small(400)
    };
    write_dataset(raw.path(), &spec);
    let ds = StreamingDataset::open(local(raw.path(), cache.path())).unwrap();
    let dir = ds.cache_dir().to_path_buf();
    assert!(dir.starts_with(cache.path()), "{}", dir.display());
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("in-place-"), "{name}");
    assert_eq!(stream_checked(&ds, plan(), spec.sample_bytes), spec.samples);
    // Nothing was downloaded or copied: the folder holds no shard.
    assert_eq!(ds.metrics().fetch_bytes, 0);
    assert_eq!(ds.cache_usage().unwrap(), 0);
    // The folder is deterministic: the same dataset gets the same one.
    let again = StreamingDataset::open(local(raw.path(), cache.path())).unwrap();
    assert_eq!(again.cache_dir(), dir);

    // 2. A compressed local dataset (Mosaic's `local=` without a `remote`) also opens without a
    //    run id: its shards are decompressed into a folder of its own, named by its paths and
    //    index, so that a dataset rewritten under the same paths never gets the old copies.
    let zipped = tempfile::tempdir().unwrap();
    let zspec = Spec {
        compression: Some("zstd"),
        ..Spec::small(300)
    };
    write_dataset(zipped.path(), &zspec);
    let ds = StreamingDataset::open(local(zipped.path(), cache.path())).unwrap();
    let zdir = ds.cache_dir().to_path_buf();
    let name = zdir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        zdir.starts_with(cache.path()) && name.starts_with("in-place-"),
        "{}",
        zdir.display()
    );
    assert_ne!(zdir, dir, "a folder of its own");
    assert_eq!(
        stream_checked(&ds, plan(), zspec.sample_bytes),
        zspec.samples
    );
    assert!(
        ds.cache_usage().unwrap() > 0,
        "the decompressed shards are in it"
    );
    let again = StreamingDataset::open(local(zipped.path(), cache.path())).unwrap();
    assert_eq!(again.cache_dir(), zdir, "the same files, the same folder");
    drop((ds, again));
    for entry in std::fs::read_dir(zipped.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let rewritten = Spec {
        samples: 250,
        ..zspec
    };
    write_dataset(zipped.path(), &rewritten);
    let ds = StreamingDataset::open(local(zipped.path(), cache.path())).unwrap();
    assert_ne!(ds.cache_dir(), zdir, "a rewritten dataset, a new folder");
    assert_eq!(
        stream_checked(&ds, plan(), rewritten.sample_bytes),
        rewritten.samples
    );

    // 3. A dataset that must be copied into the cache (here: `copy_local`) opened by no
    //    launcher gets a run id derived from its location and the user: the same folder on
    //    the next open (the next run of the script reuses its cache), another for another
    //    dataset.
    let derived = StreamingDataset::open(StreamingConfig {
        copy_local: true,
        ..local(raw.path(), cache.path())
    })
    .unwrap();
    let folder = derived.cache_dir().to_path_buf();
    assert!(
        folder.starts_with(cache.path()) && folder.ends_with("0"),
        "{}",
        folder.display()
    );
    let run = folder.parent().and_then(|p| p.file_name()).unwrap();
    assert!(run.to_string_lossy().starts_with("auto-"), "{run:?}");
    let again = StreamingDataset::open(StreamingConfig {
        copy_local: true,
        ..local(raw.path(), cache.path())
    })
    .unwrap();
    assert_eq!(again.cache_dir(), folder);
    let other = StreamingDataset::open(StreamingConfig {
        copy_local: true,
        ..local(zipped.path(), cache.path())
    })
    .unwrap();
    assert_ne!(other.cache_dir(), folder);
    // With a run id it opens under <root>/<run>/<node>/.
    let copied = StreamingDataset::open(StreamingConfig {
        copy_local: true,
        run_id: Some("r1".into()),
        node_rank: Some(0),
        ..local(raw.path(), cache.path())
    })
    .unwrap();
    assert_eq!(copied.cache_dir(), cache.path().join("r1").join("0"));

    // 4. validate_hash checks shards read in place: a flipped byte (same size) in shard 1 is
    //    an error naming it; without validate_hash only the size is checked.
    let shard1 = raw.path().join("shard.00001.mds");
    let mut bytes = std::fs::read(&shard1).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x5a;
    std::fs::write(&shard1, &bytes).unwrap();
    let checked = StreamingDataset::open(StreamingConfig {
        validate_hash: true,
        ..local(raw.path(), cache.path())
    })
    .unwrap();
    let good = checked.shard(0).unwrap();
    assert_eq!(good.num_samples(), checked.shard(0).unwrap().num_samples());
    let err = checked.shard(1).unwrap_err();
    assert!(matches!(err, StreamerError::HashMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("shard.00001.mds"), "{err}");
    let unchecked = StreamingDataset::open(local(raw.path(), cache.path())).unwrap();
    assert!(unchecked.shard(1).is_ok());
}
