//! Bad input gives a clear error naming the file: truncated and corrupt shards, hash and size
//! mismatches, broken indexes, corrupt compressed frames, unsafe basenames.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::{
    decode_stored_shard, Columns, DatasetOptions, Index, LocalDirSink, MdsDataset, MdsWriter,
    MdsWriterOptions, ShardReader,
};
use shardstream_sharding::value::{Sample, Value};
use shardstream_sharding::FormatError;

/// Writes a small dataset (2 shards of 3 samples) and returns its folder.
fn dataset(dir: &Path, compression: Option<&str>) -> Index {
    let options = MdsWriterOptions {
        compression: compression.map(|c| Compression::parse(c).unwrap()),
        hashes: vec![HashAlgorithm::Sha1, HashAlgorithm::Xxh64],
        size_limit: Some(600),
        threads: 1,
    };
    let sink = Arc::new(LocalDirSink::new(dir).unwrap());
    let columns = [
        ("id".to_string(), "int".to_string()),
        ("txt".to_string(), "str".to_string()),
    ];
    let mut w = MdsWriter::new(&columns, options, sink).unwrap();
    for i in 0..6 {
        let mut s = Sample::new();
        s.insert("id".into(), Value::Int(i));
        s.insert("txt".into(), Value::Str("x".repeat(100)));
        w.write(&s).unwrap();
    }
    let index = w.finish().unwrap();
    assert_eq!(index.shards.len(), 2);
    index
}

fn first_error(dir: &Path) -> FormatError {
    let ds = match MdsDataset::open(dir, DatasetOptions::default()) {
        Ok(ds) => ds,
        Err(e) => return e,
    };
    let found = ds.iter().find_map(Result::err);
    found.expect("expected an error")
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut data = std::fs::read(path).unwrap();
    f(&mut data);
    std::fs::write(path, data).unwrap();
}

#[test]
fn truncated_shard_is_a_size_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), None);
    let shard = dir.path().join("shard.00001.mds");
    edit(&shard, |d| d.truncate(d.len() - 10));
    let err = first_error(dir.path());
    assert!(matches!(err, FormatError::SizeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("shard.00001.mds"), "{err}");
}

#[test]
fn hash_mismatch_names_file_and_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), None);
    edit(&dir.path().join("shard.00000.mds"), |d| {
        let last = d.len() - 1;
        d[last] ^= 1;
    });
    let err = first_error(dir.path());
    let text = err.to_string();
    assert!(matches!(err, FormatError::HashMismatch { .. }), "{text}");
    assert!(
        text.contains("shard.00000.mds") && text.contains("sha1"),
        "{text}"
    );
    // verify() reports it too, and skip_hash_check lets the bytes through to the decoder.
    let ds = MdsDataset::open(dir.path(), DatasetOptions::default()).unwrap();
    assert!(ds.verify_shard(0).is_err());
    ds.verify_shard(1).unwrap();
    let lenient = MdsDataset::open(
        dir.path(),
        DatasetOptions {
            skip_hash_check: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(lenient.iter().filter(|s| s.is_ok()).count(), 6);
}

#[test]
fn invalid_json_index() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), None);
    edit(&dir.path().join("index.json"), |d| d.truncate(d.len() / 2));
    let err = first_error(dir.path());
    let text = err.to_string();
    assert!(matches!(err, FormatError::InvalidIndex { .. }), "{text}");
    assert!(
        text.contains("index.json") && text.contains("invalid JSON"),
        "{text}"
    );
}

#[test]
fn unknown_versions() {
    for (text, version) in [
        (r#"{"version": 3, "shards": []}"#, "3"),
        (r#"{"version": "2", "shards": []}"#, "\"2\""),
    ] {
        let err = Index::from_json("a/index.json", text.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, FormatError::UnsupportedVersion { path, version: v } if path == "a/index.json" && v == version),
            "{err}"
        );
    }
    // Python compares with ==, so 2.0 is version 2.
    Index::from_json("index.json", br#"{"version": 2.0, "shards": []}"#).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), None);
    let text = index.to_json().replacen(
        "\"version\": 2, \"zip_data\"",
        "\"version\": 1, \"zip_data\"",
        1,
    );
    let err = Index::from_json("index.json", text.as_bytes()).unwrap_err();
    assert!(
        matches!(err, FormatError::UnsupportedVersion { .. }),
        "{err}"
    );
}

#[test]
fn corrupt_zstd_frame() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), Some("zstd"));
    let zip = dir.path().join("shard.00000.mds.zstd");
    edit(&zip, |d| {
        for b in d.iter_mut().skip(12) {
            *b = 0xAA;
        }
    });
    let stored = std::fs::read(&zip).unwrap();
    // With hashes checked the hash catches it; without, the decoder does.
    let err = decode_stored_shard(
        "shard.00000.mds.zstd",
        &index.shards[0],
        stored,
        true,
        false,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, FormatError::Decompress { .. }), "{text}");
    assert!(
        text.starts_with("shard.00000.mds.zstd: zstd decompression failed"),
        "{text}"
    );
    let err = first_error(dir.path());
    assert!(matches!(err, FormatError::HashMismatch { .. }), "{err}");
}

#[test]
fn decompression_stops_at_the_recorded_raw_size() {
    let bomb = Compression::parse("zstd")
        .unwrap()
        .compress(&vec![0u8; 10 << 20])
        .unwrap();
    let err = Compression::parse("zstd")
        .unwrap()
        .decompress(&bomb, "bomb.zstd", 1 << 20)
        .unwrap_err();
    assert!(err.to_string().contains("bomb.zstd"), "{err}");
    // Same through a shard whose index claims a small raw size.
    let dir = tempfile::tempdir().unwrap();
    let mut index = dataset(dir.path(), Some("zstd"));
    index.shards[0].raw_data.bytes = 50;
    let stored = std::fs::read(dir.path().join("shard.00000.mds.zstd")).unwrap();
    let err = decode_stored_shard("s.zstd", &index.shards[0], stored, true, false).unwrap_err();
    assert!(matches!(err, FormatError::Decompress { .. }), "{err}");
}

fn reader_error(bytes: Vec<u8>, expected: Option<u64>) -> String {
    let columns = Arc::new(Columns::new(&[("txt".into(), "str".into())]).unwrap());
    ShardReader::new("bad.mds", bytes, columns, expected)
        .unwrap_err()
        .to_string()
}

#[test]
fn shard_headers_are_checked() {
    let columns = Arc::new(Columns::new(&[("txt".into(), "str".into())]).unwrap());
    let mut sample = Sample::new();
    sample.insert("txt".into(), Value::Str("hello".into()));
    let mut body = Vec::new();
    columns.encode_sample(&sample, &mut body).unwrap();
    let good =
        shardstream_sharding::mds::encode_shard("bad.mds", b"{}", &[body.len() as u32], &body)
            .unwrap();
    ShardReader::new("bad.mds", good.clone(), Arc::clone(&columns), Some(1)).unwrap();

    // Count field larger than the file.
    let mut huge = good.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(reader_error(huge, None).contains("bad.mds: size mismatch"));
    // Header count disagrees with the index.
    assert!(reader_error(good.clone(), Some(2)).contains("index says 2"));
    // Last offset past the end of the file.
    let mut past = good.clone();
    past[8..12].copy_from_slice(&(good.len() as u32 + 100).to_le_bytes());
    assert!(reader_error(past, None).contains("size mismatch"));
    // Offsets going backwards / into the offset table.
    let mut back = good.clone();
    back[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert!(reader_error(back, None).contains("offset 0"));
    // Too short for a header at all.
    assert!(reader_error(vec![1, 0], None).contains("too short"));

    // A sample whose size field claims more than the sample holds.
    let mut lying = good.clone();
    let at = lying.len() - body.len();
    lying[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
    let reader = ShardReader::new("bad.mds", lying, columns, None).unwrap();
    let err = reader.decode_sample(0).unwrap_err().to_string();
    assert!(
        err.contains("bad.mds") && err.contains("sample 0") && err.contains("1000"),
        "{err}"
    );
    assert!(reader.sample_bytes(1).is_err());
}

#[test]
fn escaping_basenames_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), None);
    for bad in ["../shard.00000.mds", "/etc/passwd", "a/../../b", ""] {
        let mut evil = index.clone();
        evil.shards[1].raw_data.basename = bad.to_string();
        let err = Index::from_json("index.json", evil.to_json().as_bytes()).unwrap_err();
        assert!(
            matches!(&err, FormatError::UnsafePath { path, name, .. } if path == "index.json" && name == bad),
            "{bad:?}: {err}"
        );
    }
    let mut dup = index.clone();
    dup.shards[1].raw_data.basename = "shard.00000.mds".into();
    let err = Index::from_json("index.json", dup.to_json().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
}

#[test]
fn inconsistent_index_entries() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), Some("zstd"));
    let check = |f: &dyn Fn(&mut Index), needle: &str| {
        let mut bad = index.clone();
        f(&mut bad);
        let err = Index::from_json("index.json", bad.to_json().as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("index.json") && err.contains(needle),
            "{needle}: {err}"
        );
    };
    check(&|i| i.shards[0].column_sizes[0] = None, "implies");
    check(
        &|i| i.shards[0].column_encodings[0] = "int128".into(),
        "int128",
    );
    check(
        &|i| i.shards[0].column_names.push("extra".into()),
        "column names",
    );
    check(&|i| i.shards[0].compression = Some("lz4".into()), "lz4");
    check(&|i| i.shards[0].zip_data = None, "no zip_data");
    check(&|i| i.shards[0].format = "json".into(), "not supported");
    check(&|i| i.shards[0].raw_data.bytes = 5, "cannot hold");
    check(&|i| i.shards[0].raw_data.bytes = 1 << 33, "cannot hold");
    let err = Index::from_json("index.json", br#"{"version": 2, "shards": [{}]}"#).unwrap_err();
    assert!(err.to_string().contains("missing field"), "{err}");
}

#[test]
fn missing_shard_file_and_pickle_refusal() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), Some("zstd"));
    std::fs::remove_file(dir.path().join("shard.00001.mds.zstd")).unwrap();
    let err = first_error(dir.path());
    assert!(err.to_string().contains("shard.00001.mds.zstd"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(LocalDirSink::new(dir.path()).unwrap());
    let mut w = MdsWriter::new(
        &[("p".into(), "pkl".into())],
        MdsWriterOptions::default(),
        sink,
    )
    .unwrap();
    let mut s = Sample::new();
    s.insert("p".into(), Value::Pickle(vec![0x80, 4, b'N', b'.']));
    w.write(&s).unwrap();
    w.finish().unwrap();
    let err = MdsDataset::open(dir.path(), DatasetOptions::default()).unwrap_err();
    assert!(matches!(err, FormatError::UnsafeEncoding { .. }), "{err}");
    assert!(err.to_string().contains("allow_unsafe_types"), "{err}");
    let ds = MdsDataset::open(
        dir.path(),
        DatasetOptions {
            allow_unsafe_types: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(ds.iter().next().unwrap().unwrap(), s);
}

#[test]
fn writer_arguments_are_checked() {
    let sink = Arc::new(LocalDirSink::new(tempfile::tempdir().unwrap().path()).unwrap());
    let cols = [("a".to_string(), "int".to_string())];
    let bad_hashes = MdsWriterOptions {
        hashes: vec![HashAlgorithm::Xxh64, HashAlgorithm::Sha1],
        ..Default::default()
    };
    assert!(MdsWriter::new(&cols, bad_hashes, sink.clone()).is_err());
    let too_big = MdsWriterOptions {
        size_limit: Some(1 << 32),
        ..Default::default()
    };
    let err = MdsWriter::new(&cols, too_big, sink.clone())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("2**32"), "{err}");
    assert!(MdsWriter::new(
        &[("a".into(), "nope".into())],
        MdsWriterOptions::default(),
        sink.clone()
    )
    .is_err());
    assert!(MdsWriter::new(&[], MdsWriterOptions::default(), sink.clone()).is_err());
    let mut w = MdsWriter::new(&cols, MdsWriterOptions::default(), sink).unwrap();
    let err = w.write(&Sample::new()).unwrap_err().to_string();
    assert!(err.contains("\"a\"") && err.contains("missing"), "{err}");
}

/// A sink that fails for shard names, to check that a storage error surfaces.
struct FailingSink;

impl shardstream_sharding::mds::ShardSink for FailingSink {
    fn put(&self, name: &str, _data: Vec<u8>) -> shardstream_sharding::Result<()> {
        Err(FormatError::io(name, std::io::Error::other("disk on fire")))
    }
}

#[test]
fn sink_failures_surface_from_write_or_finish() {
    for threads in [0, 2] {
        let options = MdsWriterOptions {
            size_limit: Some(200),
            threads,
            ..Default::default()
        };
        let mut w = MdsWriter::new(
            &[("b".into(), "bytes".into())],
            options,
            Arc::new(FailingSink),
        )
        .unwrap();
        let mut s = Sample::new();
        s.insert("b".into(), Value::Bytes(vec![1; 150]));
        let mut failed = None;
        for _ in 0..20 {
            if let Err(e) = w.write(&s) {
                failed = Some(e);
                break;
            }
        }
        let err = match failed {
            Some(e) => e,
            None => w.finish().unwrap_err(),
        };
        assert!(
            err.to_string().contains("disk on fire"),
            "threads {threads}: {err}"
        );
    }
}
