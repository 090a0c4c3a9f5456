//! LitData datasets streamed through the same engine as MDS: chunk files have the MDS shard
//! layout, so plain chunks are read in place and whole-file zstd chunks inflated into the
//! cache; items decode by their leaves' serializers; a stream mixes with MDS; framed zstd
//! (`compression_level="batch"`) is refused by name. The Python tests
//! (`tests/python/test_formats_litdata.py`) compare with litdata's own reading of data its
//! writer wrote; these use chunks built here, byte for byte as litdata's writer lays them out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use shardstream_sharding::Value;
use shardstream_streamer::order::{OrderConfig, Weight};
use shardstream_streamer::{SampleSchema, StreamPlan, StreamSpec, StreamingDataset};

use crate::common::{write_dataset, Spec};
use crate::formats_wds::config;

const N: u64 = 17;
const PER_CHUNK: u64 = 5;

/// Item `i`: leaves `id` (int: i64 LE) and `s` (str), each after its u32 size.
fn item(i: u64) -> Vec<u8> {
    let s = format!("item {i}");
    let mut out = Vec::new();
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(&(i as i64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out
}

/// A classic chunk: u32 count, u32 absolute offsets, items.
fn chunk(ids: std::ops::Range<u64>) -> Vec<u8> {
    let items: Vec<Vec<u8>> = ids.map(item).collect();
    let n = items.len() as u32;
    let mut offset = 4 + 4 * (n + 1);
    let mut out = n.to_le_bytes().to_vec();
    out.extend_from_slice(&offset.to_le_bytes());
    for it in &items {
        offset += it.len() as u32;
        out.extend_from_slice(&offset.to_le_bytes());
    }
    for it in items {
        out.extend_from_slice(&it);
    }
    out
}

/// Writes the dataset; `zstd` compresses each chunk file whole (`chunk-0-I.zstd.bin`).
fn write(dir: &Path, zstd: bool, level: Option<&str>) {
    let mut chunks = Vec::new();
    let mut first = 0;
    let mut i = 0;
    while first < N {
        let last = (first + PER_CHUNK).min(N);
        let bytes = chunk(first..last);
        let (name, stored) = if zstd && level.is_none() {
            (
                format!("chunk-0-{i}.zstd.bin"),
                zstd::encode_all(&bytes[..], 3).unwrap(),
            )
        } else {
            (format!("chunk-0-{i}.bin"), bytes.clone())
        };
        std::fs::write(dir.join(&name), stored).unwrap();
        chunks.push(serde_json::json!({
            "chunk_bytes": bytes.len(), "chunk_size": last - first, "dim": null, "filename": name,
        }));
        first = last;
        i += 1;
    }
    let spec = r#"[1, {"type": "builtins.dict", "context": "[\"id\", \"s\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]"#;
    let index = serde_json::json!({
        "chunks": chunks,
        "config": {
            "chunk_bytes": null, "chunk_size": PER_CHUNK,
            "compression": if zstd { serde_json::json!("zstd") } else { serde_json::Value::Null },
            "compression_level": level,
            "data_format": ["int", "str"], "data_spec": spec, "encryption": null,
            "item_loader": "PyTreeLoader",
        },
        "updated_at": "1",
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

fn order() -> OrderConfig {
    OrderConfig {
        seed: 9,
        shuffle: true,
        ..OrderConfig::default()
    }
}

fn ids(ds: &StreamingDataset) -> Vec<i64> {
    ds.stream(StreamPlan::single_process(order(), 0))
        .unwrap()
        .map(|item| {
            let s = item.unwrap().sample.decode().unwrap();
            let Some(Value::Int(id)) = s.get("id") else {
                panic!("{s:?}")
            };
            assert_eq!(s.get("s"), Some(&Value::Str(format!("item {id}"))));
            *id
        })
        .collect()
}

#[test]
fn plain_and_zstd_chunks_stream_every_item_once() {
    for zstd in [false, true] {
        let data = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        write(data.path(), zstd, None);
        let ds = StreamingDataset::open(config(data.path().display().to_string(), cache.path()))
            .unwrap();
        assert_eq!((ds.num_samples(), ds.num_shards()), (N, 4));
        let mut got = ids(&ds);
        got.sort_unstable();
        assert_eq!(got, (0..N as i64).collect::<Vec<_>>(), "zstd {zstd}");
        let s = ds.sample(7).unwrap();
        assert!(matches!(s.schema(), SampleSchema::LitData(_)));
        assert_eq!(s.column_names(), ["id", "s"]);
        assert_eq!(s.column(1), Some(&b"item 7"[..]));
        // Plain chunks are read in place, zstd ones inflated into the cache.
        assert_eq!(ds.max_shard_cache_bytes() > 0, zstd);
    }
}

#[test]
fn litdata_mixes_with_mds_and_framed_zstd_is_refused() {
    let lit = tempfile::tempdir().unwrap();
    let mds = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write(lit.path(), false, None);
    write_dataset(mds.path(), &Spec::small(30));
    let spec = |p: &Path| StreamSpec {
        remote: p.display().to_string(),
        split: None,
        weight: Weight::Natural,
        location: None,
        storage_options: Default::default(),
    };
    let ds = StreamingDataset::open_streams(
        config(String::new(), cache.path()),
        vec![spec(mds.path()), spec(lit.path())],
        None,
    )
    .unwrap();
    assert_eq!(ds.num_samples(), 30 + N);
    let kinds = ds
        .stream(StreamPlan::single_process(order(), 0))
        .unwrap()
        .map(|i| matches!(i.unwrap().sample.schema(), SampleSchema::LitData(_)))
        .filter(|lit| *lit)
        .count();
    assert_eq!(kinds as u64, N);

    let framed = tempfile::tempdir().unwrap();
    write(framed.path(), true, Some("batch"));
    let err = StreamingDataset::open(config(framed.path().display().to_string(), cache.path()))
        .unwrap_err();
    assert!(err.to_string().contains("Batch"), "{err}");
}
