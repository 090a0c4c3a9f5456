//! LitData datasets streamed through the same engine as MDS: chunk files have the MDS shard
//! layout, so plain chunks are read in place and whole-file zstd chunks inflated into the
//! cache; items decode by their leaves' serializers; a stream mixes with MDS; framed zstd chunks
//! (`compression_level="batch"`) are turned into the classic layout in the cache, and a damaged
//! one is an error naming its file. The Python tests
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

/// Items per zstd frame in framed chunks (litdata's `compression_batch_size`; 256 by default).
const FRAME_ROWS: usize = 2;

/// A classic chunk packed as litdata's `pack_framed_zstd` packs it: the prefix, offsets relative
/// to the items, the frame table, then a zstd frame per `FRAME_ROWS` items.
fn framed(classic: &[u8]) -> Vec<u8> {
    let word = |at: usize| u32::from_le_bytes(classic[at..at + 4].try_into().unwrap());
    let n = word(0) as usize;
    let abs: Vec<u32> = (0..=n).map(|i| word(4 + 4 * i)).collect();
    let rel: Vec<u32> = abs.iter().map(|o| o - abs[0]).collect();
    let n_frames = n.div_ceil(FRAME_ROWS);
    let mut at = (24 + 4 * (n + 1) + 24 * n_frames) as u64;
    let (mut table, mut frames) = (Vec::new(), Vec::new());
    for f in 0..n_frames {
        let (a, b) = (f * FRAME_ROWS, ((f + 1) * FRAME_ROWS).min(n));
        let raw = &classic[abs[a] as usize..abs[b] as usize];
        let z = zstd::encode_all(raw, 3).unwrap();
        table.extend_from_slice(&(a as u32).to_le_bytes());
        table.extend_from_slice(&((b - a) as u32).to_le_bytes());
        table.extend_from_slice(&at.to_le_bytes());
        table.extend_from_slice(&(z.len() as u32).to_le_bytes());
        table.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        at += z.len() as u64;
        frames.extend_from_slice(&z);
    }
    let mut out = b"LDFZ01\0\0".to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    for w in [n, FRAME_ROWS, n_frames] {
        out.extend_from_slice(&(w as u32).to_le_bytes());
    }
    for o in rel {
        out.extend_from_slice(&o.to_le_bytes());
    }
    out.extend_from_slice(&table);
    out.extend_from_slice(&frames);
    out
}

/// Writes the dataset; `zstd` compresses each chunk file whole (`chunk-0-I.zstd.bin`), or with
/// `level` "batch" frames it (`chunk-0-I.bin`, its framed size as `chunk_bytes`, as litdata
/// records it).
fn write(dir: &Path, zstd: bool, level: Option<&str>) {
    let mut chunks = Vec::new();
    let mut first = 0;
    let mut i = 0;
    while first < N {
        let last = (first + PER_CHUNK).min(N);
        let bytes = chunk(first..last);
        let (name, stored) = match (zstd, level) {
            (true, None) => (
                format!("chunk-0-{i}.zstd.bin"),
                zstd::encode_all(&bytes[..], 3).unwrap(),
            ),
            (true, Some("batch")) => (format!("chunk-0-{i}.bin"), framed(&bytes)),
            _ => (format!("chunk-0-{i}.bin"), bytes.clone()),
        };
        let recorded = match level {
            Some("batch") => stored.len(),
            _ => bytes.len(),
        };
        std::fs::write(dir.join(&name), stored).unwrap();
        chunks.push(serde_json::json!({
            "chunk_bytes": recorded, "chunk_size": last - first, "dim": null, "filename": name,
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
    ids_from(ds, 0)
}

fn ids_from(ds: &StreamingDataset, start: u64) -> Vec<i64> {
    let mut plan = StreamPlan::single_process(order(), 0);
    plan.start = start;
    ds.stream(plan)
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
fn framed_zstd_chunks_stream_every_item_once_and_resume_exactly() {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write(data.path(), true, Some("batch"));
    let first = std::fs::read(data.path().join("chunk-0-0.bin")).unwrap();
    assert!(first.starts_with(b"LDFZ01"));
    let ds =
        StreamingDataset::open(config(data.path().display().to_string(), cache.path())).unwrap();
    assert_eq!((ds.num_samples(), ds.num_shards()), (N, 4));
    // Inflated into the cache, to the classic size: count, 6 offsets, 5 items of 22-23 bytes.
    assert_eq!(ds.max_shard_cache_bytes(), 4 + 4 * 6 + 5 * 23);
    let whole = ids(&ds);
    let mut sorted = whole.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..N as i64).collect::<Vec<_>>());
    let s = ds.sample(7).unwrap();
    assert_eq!(s.column_names(), ["id", "s"]);
    assert_eq!(s.column(1), Some(&b"item 7"[..]));
    // A second open reads the chunks from the cache; resuming mid-epoch yields the rest exactly.
    let again =
        StreamingDataset::open(config(data.path().display().to_string(), cache.path())).unwrap();
    assert_eq!(ids_from(&again, 9), whole[9..]);
}

/// Chunk 1 of a framed dataset damaged by `damage`; the error streaming (or opening) it gives.
fn framed_damage(damage: impl Fn(&mut Vec<u8>)) -> String {
    let data = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    write(data.path(), true, Some("batch"));
    let path = data.path().join("chunk-0-1.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    damage(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    let ds = match StreamingDataset::open(config(data.path().display().to_string(), cache.path())) {
        Ok(ds) => ds,
        Err(e) => return e.to_string(),
    };
    let err = ds
        .stream(StreamPlan::single_process(order(), 0))
        .unwrap()
        .find_map(|item| item.err());
    err.expect("a damaged chunk streamed").to_string()
}

#[test]
fn a_damaged_framed_header_or_frame_is_an_error_naming_the_chunk() {
    // Prefix: 5 items, 3 frames; offsets at 24..48; frame table at 48..120; frames from 120.
    let huge_frames = framed_damage(|b| b[20..24].copy_from_slice(&u32::MAX.to_le_bytes()));
    let wrong_count = framed_damage(|b| b[12..16].copy_from_slice(&4u32.to_le_bytes()));
    let bad_version = framed_damage(|b| b[8] = 9);
    let frame_outside = framed_damage(|b| b[56..64].copy_from_slice(&u64::MAX.to_le_bytes()));
    let bad_frame = framed_damage(|b| b[120] ^= 0xff);
    let short_frame = framed_damage(|b| {
        let ulen = u32::from_le_bytes(b[68..72].try_into().unwrap());
        b[68..72].copy_from_slice(&(ulen - 1).to_le_bytes());
    });
    for (what, err) in [
        ("frame count", &huge_frames),
        ("item count", &wrong_count),
        ("version", &bad_version),
        ("frame offset", &frame_outside),
        ("frame bytes", &bad_frame),
        ("inflated size", &short_frame),
    ] {
        assert!(err.contains("chunk-0-1.bin"), "{what}: {err}");
    }
    assert!(huge_frames.contains("4294967295 frames"), "{huge_frames}");
    assert!(wrong_count.contains("the index says 5"), "{wrong_count}");
    assert!(bad_version.contains("version 9"), "{bad_version}");
    assert!(bad_frame.contains("frame 0"), "{bad_frame}");
}

#[test]
fn litdata_mixes_with_mds_plain_and_framed() {
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
    let ds = StreamingDataset::open_streams(
        config(String::new(), cache.path()),
        vec![spec(mds.path()), spec(lit.path()), spec(framed.path())],
        None,
    )
    .unwrap();
    assert_eq!(ds.num_samples(), 30 + 2 * N);
    let mut lit_ids: Vec<i64> = ds
        .stream(StreamPlan::single_process(order(), 0))
        .unwrap()
        .filter_map(|i| {
            let sample = i.unwrap().sample;
            match sample.schema() {
                SampleSchema::LitData(_) => match sample.decode().unwrap().get("id") {
                    Some(Value::Int(id)) => Some(*id),
                    other => panic!("{other:?}"),
                },
                _ => None,
            }
        })
        .collect();
    lit_ids.sort_unstable();
    let want: Vec<i64> = (0..N as i64).flat_map(|i| [i, i]).collect();
    assert_eq!(lit_ids, want);
}
