//! Shards spread over hashed prefixes (`shard --prefixes N`): the files land under `pXX/`
//! folders, the index's basenames carry the folder, our reader and mosaicml-streaming (the
//! `$SHARDSTREAM_PYTHON` venv's) read every sample back, and the binary index beside
//! `index.json` mirrors it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use shardstream_sharding::compression::Compression;
use shardstream_sharding::mds::index_bin::{self, BINARY_INDEX_BASENAME};
use shardstream_sharding::mds::{
    DatasetOptions, LocalDirSink, MdsDataset, MdsWriter, MdsWriterOptions, ShardSink,
};
use shardstream_sharding::{Sample, Value};

const SAMPLES: i64 = 300;

fn python() -> PathBuf {
    std::env::var_os("SHARDSTREAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(".venv/bin/python")
        })
}

#[test]
fn shards_under_hashed_prefixes_read_back_here_and_in_mosaic() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let sink = Arc::new(LocalDirSink::new(&out).unwrap());
    let columns = [
        ("data".to_string(), "bytes".to_string()),
        ("id".to_string(), "int".to_string()),
    ];
    let options = MdsWriterOptions {
        compression: Some(Compression::parse("zstd").unwrap()),
        size_limit: Some(4096),
        ..MdsWriterOptions::default()
    };
    let mut writer = MdsWriter::new(&columns, options, sink.clone()).unwrap();
    writer.spread_over_prefixes(4);
    for id in 0..SAMPLES {
        let mut s = Sample::new();
        s.insert("id".into(), Value::Int(id));
        s.insert("data".into(), Value::Bytes(vec![id as u8; 100]));
        writer.write(&s).unwrap();
    }
    let index = writer.finish().unwrap();
    let json = index.to_json();
    sink.put(
        BINARY_INDEX_BASENAME,
        index_bin::to_bytes(&index, json.as_bytes()).unwrap(),
    )
    .unwrap();

    let mut folders: Vec<&str> = index
        .shards
        .iter()
        .map(|s| s.raw_data.basename.split_once('/').unwrap().0)
        .collect();
    folders.sort_unstable();
    folders.dedup();
    assert!(index.shards.len() >= 8, "{} shards", index.shards.len());
    assert_eq!(folders, ["p00", "p01", "p02", "p03"]);
    let on_disk = std::fs::read(out.join("index.json")).unwrap();
    let bin = std::fs::read(out.join(BINARY_INDEX_BASENAME)).unwrap();
    index_bin::verify_against_json("index.ssx", &bin, &on_disk).unwrap();

    let ds = MdsDataset::open(&out, DatasetOptions::default()).unwrap();
    let mut ids: Vec<i64> = ds
        .iter()
        .map(|s| match s.unwrap().get("id") {
            Some(Value::Int(i)) => *i,
            other => panic!("id is {other:?}"),
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..SAMPLES).collect::<Vec<_>>());

    let script = "import sys\n\
        from streaming import StreamingDataset\n\
        ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], shuffle=False, batch_size=1)\n\
        ids = sorted(int(s['id']) for s in ds)\n\
        assert ids == list(range(int(sys.argv[3]))), ids[:10]\n\
        print('ok', len(ids))\n";
    let py = python();
    let run = Command::new(&py)
        .arg("-c")
        .arg(script)
        .arg(&out)
        .arg(dir.path().join("mosaic-cache"))
        .arg(SAMPLES.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (set SHARDSTREAM_PYTHON): {e}", py.display()));
    assert!(
        run.status.success(),
        "mosaicml-streaming did not read the dataset: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}
