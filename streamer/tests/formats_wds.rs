//! WebDataset tar sets streamed through the same engine as MDS: found from a brace pattern, a
//! single tar or a folder of tars, plain or gzip-compressed, local or on the S3 server; every
//! sample exactly once per epoch, each with the members `WdsReader` reads from the same tar;
//! mixed with an MDS stream, each stream decoding its own schema; a resumed epoch continues
//! exactly; a bad tar and an empty folder give errors that name them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use shardstream_sharding::wds::{DirSink, ShardWriter, ShardWriterOptions, WdsReader, WdsSample};
use shardstream_sharding::{Sample, Value};
use shardstream_streamer::order::{OrderConfig, Weight};
use shardstream_streamer::{
    SampleSchema, StreamPlan, StreamSpec, StreamerError, StreamingConfig, StreamingDataset,
};

use crate::common::{moto_with, node_config, payload, runtime, s3_location, write_dataset, Spec};

/// 23 samples over 4 tars (7 per tar), members `cls`, `txt` and `bin`.
const N: u64 = 23;

/// A sample's members: `(extension, bytes)` in archive order.
type Fields = Vec<(String, Vec<u8>)>;

fn wds_sample(i: u64) -> WdsSample {
    WdsSample {
        key: format!("d/s{i:05}"),
        url: String::new(),
        fields: vec![
            ("bin".into(), payload(i, 300 + i as usize)),
            ("cls".into(), (i % 5).to_string().into_bytes()),
            ("txt".into(), format!("sample {i}").into_bytes()),
        ],
    }
}

fn write_tars(dir: &Path) {
    let options = ShardWriterOptions {
        maxcount: 7,
        ..ShardWriterOptions::default()
    };
    let mut w = ShardWriter::new(DirSink::new(dir), "shard-%06d.tar", options).unwrap();
    for i in 0..N {
        w.write(&wds_sample(i)).unwrap();
    }
    w.finish().unwrap();
}

/// Every sample of the tars in `dir` as `WdsReader` reads them, by key.
fn peer(dir: &Path) -> BTreeMap<String, Fields> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut out = BTreeMap::new();
    for p in names {
        for s in WdsReader::open(&p, Default::default()).unwrap() {
            let s = s.unwrap();
            out.insert(s.key, s.fields);
        }
    }
    out
}

fn key_and_fields(sample: &Sample) -> (String, Fields) {
    let key = match sample.get("__key__") {
        Some(Value::Str(k)) => k.clone(),
        other => panic!("no key: {other:?}"),
    };
    let fields = sample
        .iter()
        .filter(|(k, _)| !k.starts_with("__"))
        .map(|(k, v)| match v {
            Value::Bytes(b) => (k.clone(), b.clone()),
            other => panic!("{k}: {other:?}"),
        })
        .collect();
    (key, fields)
}

fn order() -> OrderConfig {
    OrderConfig {
        seed: 7,
        shuffle: true,
        window: 2,
        lanes: 1,
        ..OrderConfig::default()
    }
}

/// Streams an epoch; returns the samples by key (each must come once).
fn stream_all(ds: &StreamingDataset, start: u64) -> Vec<(String, Fields)> {
    let mut plan = StreamPlan::single_process(order(), 0);
    plan.start = start;
    ds.stream(plan)
        .unwrap()
        .map(|item| key_and_fields(&item.unwrap().sample.decode().unwrap()))
        .collect()
}

pub(crate) fn config(remote: String, cache: &Path) -> StreamingConfig {
    StreamingConfig {
        remote,
        cache_root: Some(cache.to_path_buf()),
        memory_limit: Some(8 << 20),
        run_id: Some("run".into()),
        node_rank: Some(0),
        ..StreamingConfig::default()
    }
}

fn check_epoch(ds: &StreamingDataset, want: &BTreeMap<String, Fields>) {
    assert_eq!(ds.num_samples(), N);
    assert_eq!(ds.num_shards(), 4);
    let got = stream_all(ds, 0);
    assert_eq!(got.len() as u64, N);
    let by_key: BTreeMap<_, _> = got.into_iter().collect();
    assert_eq!(&by_key, want);
}

#[test]
fn wds_tars_stream_from_a_pattern_a_folder_and_one_file() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_tars(data.path());
    let want = peer(data.path());
    assert_eq!(want.len() as u64, N);

    let pattern = format!("{}/shard-{{000000..000003}}.tar", data.path().display());
    let ds = StreamingDataset::open(config(pattern, cache.path())).unwrap();
    check_epoch(&ds, &want);
    // Read in place: nothing copied.
    assert_eq!(ds.metrics().fetch_bytes, 0);

    let folder =
        StreamingDataset::open(config(data.path().display().to_string(), cache.path())).unwrap();
    check_epoch(&folder, &want);

    let one = format!("{}/shard-000001.tar", data.path().display());
    let one = StreamingDataset::open(config(one, cache.path())).unwrap();
    assert_eq!(one.num_samples(), 7);
    // Random access gives the members, the key and the tar.
    let s = one.sample(2).unwrap();
    assert_eq!(s.key(), Some("d/s00009"));
    assert_eq!(s.column_names(), ["bin", "cls", "txt"]);
    match s.schema() {
        SampleSchema::Wds(f) => assert!(f.url.ends_with("shard-000001.tar"), "{}", f.url),
        other => panic!("{other:?}"),
    }
}

#[test]
fn wds_resumes_mid_epoch_exactly() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_tars(data.path());
    let ds =
        StreamingDataset::open(config(data.path().display().to_string(), cache.path())).unwrap();
    let whole = stream_all(&ds, 0);
    let rest = stream_all(&ds, 9);
    assert_eq!(rest, whole[9..]);
}

#[test]
fn gzipped_tars_are_inflated_into_the_cache() {
    let plain = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_tars(plain.path());
    let want = peer(plain.path());
    for e in std::fs::read_dir(plain.path()).unwrap() {
        let p = e.unwrap().path();
        let name = format!("{}.gz", p.file_name().unwrap().to_string_lossy());
        let out = std::fs::File::create(data.path().join(name)).unwrap();
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        gz.write_all(&std::fs::read(&p).unwrap()).unwrap();
        gz.finish().unwrap();
    }
    let pattern = format!("{}/shard-{{000000..000003}}.tar.gz", data.path().display());
    let ds = StreamingDataset::open(config(pattern, cache.path())).unwrap();
    assert!(ds.max_shard_cache_bytes() > 0);
    check_epoch(&ds, &want);
}

#[test]
fn remote_wds_streams_through_the_node_cache_and_keeps_its_counts() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_tars(data.path());
    let want = peer(data.path());
    let rt = runtime();
    let server = moto_with(data.path(), &rt);
    let open = || {
        StreamingDataset::open_at(
            node_config(cache.path()),
            s3_location(&server.endpoint(), "ds"),
        )
        .unwrap()
    };
    let ds = open();
    check_epoch(&ds, &want);
    assert!(ds.metrics().fetch_bytes > 0);
    // The counts are kept in the node folder: the next open finds them.
    let kept = walk(ds.cache_dir())
        .into_iter()
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains("\"samples\":7")))
        .count();
    assert!(kept >= 3, "{kept} kept counts");
    drop(ds);
    check_epoch(&open(), &want);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn mds_and_wds_streams_mix_each_with_its_own_schema() {
    let wds = tempfile::tempdir().unwrap();
    let mds = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write_tars(wds.path());
    write_dataset(mds.path(), &Spec::small(40));
    let spec = |p: &Path| StreamSpec {
        remote: p.display().to_string(),
        split: None,
        weight: Weight::Natural,
        location: None,
        storage_options: Default::default(),
    };
    let ds = StreamingDataset::open_streams(
        config(String::new(), cache.path()),
        vec![spec(mds.path()), spec(wds.path())],
        None,
    )
    .unwrap();
    assert_eq!(ds.num_samples(), 40 + N);
    let (mut from_mds, mut from_wds) = (0, 0);
    for item in ds.stream(StreamPlan::single_process(order(), 0)).unwrap() {
        let s = item.unwrap().sample;
        match s.schema() {
            SampleSchema::Mds(_) => {
                assert_eq!(s.column_names(), ["data", "id"]);
                from_mds += 1;
            }
            SampleSchema::Wds(_) => {
                assert_eq!(s.column_names(), ["bin", "cls", "txt"]);
                from_wds += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((from_mds, from_wds), (40, N));
}

#[test]
fn a_bad_tar_and_an_empty_folder_give_errors_naming_them() {
    let cache = tempfile::tempdir().unwrap();
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(bad.path().join("x.tar"), vec![7u8; 700]).unwrap();
    let err =
        StreamingDataset::open(config(bad.path().display().to_string(), cache.path())).unwrap_err();
    assert!(err.to_string().contains("x.tar"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let err = StreamingDataset::open(config(empty.path().display().to_string(), cache.path()))
        .unwrap_err();
    assert!(matches!(err, StreamerError::NotFound { .. }), "{err}");
}
