//! `index.ssx` beside `index.json`: a dataset opened from it streams what the same dataset
//! opened from `index.json` streams (in place and from S3, where the node folder keeps the
//! binary copy); a stale or corrupt `index.ssx` is ignored and `index.json` read; the
//! `index.json` bytes a dataset opened from `index.ssx` serves are fetched on first use and
//! checked against what `index.ssx` mirrors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use crate::common;
use common::{
    check_sample, moto_with, runtime, s3_location, small_node_config as config, stream_world,
    write_dataset, Spec,
};
use shardstream_sharding::mds::index_bin::{self, BINARY_INDEX_BASENAME};
use shardstream_sharding::mds::Index;
use shardstream_streamer::order::{OrderConfig, World};
use shardstream_streamer::{StreamingConfig, StreamingDataset};

/// Writes `index.ssx` mirroring the `index.json` in `dir`.
fn write_binary_index(dir: &Path) {
    let json = std::fs::read(dir.join("index.json")).unwrap();
    let index = Index::from_json("index.json", &json).unwrap();
    let bin = index_bin::to_bytes(&index, &json).unwrap();
    std::fs::write(dir.join(BINARY_INDEX_BASENAME), bin).unwrap();
}

fn open_local(data: &Path, cache: &Path) -> StreamingDataset {
    StreamingDataset::open(StreamingConfig {
        remote: data.display().to_string(),
        ..config(cache)
    })
    .unwrap()
}

/// Every sample of `a` and `b` is the same, and a full shuffled epoch of `b` over a small world
/// gives every sample once.
fn same_dataset(a: &StreamingDataset, b: &StreamingDataset, spec: &Spec) {
    assert_eq!(a.num_samples(), spec.samples);
    assert_eq!(b.num_samples(), spec.samples);
    assert_eq!(a.num_shards(), b.num_shards());
    assert_eq!(a.columns(), b.columns());
    for id in 0..spec.samples {
        let (x, y) = (a.sample(id).unwrap(), b.sample(id).unwrap());
        assert_eq!(x.bytes(), y.bytes(), "sample {id}");
        check_sample(id, &y.decode().unwrap(), spec.sample_bytes);
    }
    let order = OrderConfig {
        seed: 5,
        shuffle: true,
        ..OrderConfig::default()
    };
    let world = World::new(2, 1, 2, 4).unwrap();
    let positions = stream_world(b, order, world, spec.sample_bytes);
    assert!(positions >= spec.samples);
}

#[test]
fn a_dataset_with_index_ssx_streams_as_one_without() {
    let spec = Spec::small(400);
    let (plain, binary) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_dataset(plain.path(), &spec);
    write_dataset(binary.path(), &spec);
    write_binary_index(binary.path());
    let cache = tempfile::tempdir().unwrap();
    let from_json = open_local(plain.path(), &cache.path().join("a"));
    let from_bin = open_local(binary.path(), &cache.path().join("b"));
    same_dataset(&from_json, &from_bin, &spec);
    // index.json is served byte for byte, read on first use.
    let json = std::fs::read(binary.path().join("index.json")).unwrap();
    assert_eq!(&*from_bin.index_json().unwrap(), &json[..]);
}

#[test]
fn index_json_of_a_dataset_opened_from_index_ssx_is_checked_when_fetched() {
    let spec = Spec::small(300);
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &spec);
    write_binary_index(data.path());
    let cache = tempfile::tempdir().unwrap();
    let ds = open_local(data.path(), cache.path());
    // Opened from index.ssx: index.json is not read yet, so a change to it after the open is
    // seen when it is fetched, and refused rather than served beside the old shards.
    let mut json = std::fs::read(data.path().join("index.json")).unwrap();
    json.push(b'\n');
    std::fs::write(data.path().join("index.json"), &json).unwrap();
    let err = ds.index_json().unwrap_err();
    assert!(err.to_string().contains("index.ssx"), "{err}");
}

#[test]
fn a_stale_index_ssx_is_ignored() {
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &Spec::small(500));
    write_binary_index(data.path());
    // The dataset is written again (fewer samples): index.json changes, index.ssx does not.
    let spec = Spec::small(200);
    for entry in std::fs::read_dir(data.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != BINARY_INDEX_BASENAME) {
            std::fs::remove_file(path).unwrap();
        }
    }
    write_dataset(data.path(), &spec);
    let cache = tempfile::tempdir().unwrap();
    let ds = open_local(data.path(), cache.path());
    assert_eq!(ds.num_samples(), spec.samples);
    let json = std::fs::read(data.path().join("index.json")).unwrap();
    assert_eq!(&*ds.index_json().unwrap(), &json[..]);
}

#[test]
fn a_corrupt_index_ssx_falls_back_to_index_json() {
    let spec = Spec::small(300);
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &spec);
    write_binary_index(data.path());
    let path = data.path().join(BINARY_INDEX_BASENAME);
    let good = std::fs::read(&path).unwrap();
    let plain = tempfile::tempdir().unwrap();
    write_dataset(plain.path(), &spec);
    let cache = tempfile::tempdir().unwrap();
    let reference = open_local(plain.path(), &cache.path().join("ref"));
    // Truncated, a record's string reference past the table, bad magic.
    let mut out_of_table = good.clone();
    out_of_table[64 + 8 + 32..64 + 8 + 36].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    for (i, bytes) in [good[..good.len() - 1].to_vec(), out_of_table, bad_magic]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&path, bytes).unwrap();
        let ds = open_local(data.path(), &cache.path().join(format!("c{i}")));
        same_dataset(&reference, &ds, &spec);
    }
}

#[test]
fn s3_dataset_with_index_ssx_streams_and_keeps_its_binary_copy() {
    let rt = runtime();
    let spec = Spec::small(400);
    let data = tempfile::tempdir().unwrap();
    write_dataset(data.path(), &spec);
    write_binary_index(data.path());
    let server = moto_with(data.path(), &rt);
    let cache = tempfile::tempdir().unwrap();
    let open = || {
        StreamingDataset::open_at(
            StreamingConfig {
                remote: "s3://bucket/ds".into(),
                ..config(cache.path())
            },
            s3_location(&server.endpoint(), "ds"),
        )
        .unwrap()
    };
    let plain = tempfile::tempdir().unwrap();
    write_dataset(plain.path(), &spec);
    let reference = open_local(plain.path(), &cache.path().join("ref"));
    let first = open();
    same_dataset(&reference, &first, &spec);
    // The node folder now holds index.ssx's copy: the next open reads it, not the store.
    let second = open();
    same_dataset(&reference, &second, &spec);
    let json = std::fs::read(data.path().join("index.json")).unwrap();
    assert_eq!(&*second.index_json().unwrap(), &json[..]);
}
