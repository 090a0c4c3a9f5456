//! WebDataset, MDS and LitData datasets as inputs: columns, order, ranges and blocks.

use std::path::Path;
use std::sync::Arc;

use shardstream_sharding::input::{open, part_range, Input, InputFormat, InputOptions};
use shardstream_sharding::mds::Encoding;
use shardstream_sharding::mds::{LocalDirSink, MdsWriter, MdsWriterOptions};
use shardstream_sharding::value::Value;
use shardstream_sharding::wds::{TarWriter, WdsSample};
use shardstream_sharding::Sample;

/// A sample's `(extension, bytes)` members.
type Fields<'a> = &'a [(&'a str, &'a [u8])];

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn read_range(input: &dyn Input, range: std::ops::Range<u64>) -> Vec<Sample> {
    input.read(range).unwrap().map(|s| s.unwrap()).collect()
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn write_tar(path: &Path, samples: &[(&str, Fields<'_>)]) {
    let mut writer = TarWriter::new(Vec::new());
    for (key, fields) in samples {
        let sample = WdsSample {
            key: key.to_string(),
            url: String::new(),
            fields: fields
                .iter()
                .map(|(e, b)| (e.to_string(), b.to_vec()))
                .collect(),
        };
        writer.write(&sample).unwrap();
    }
    std::fs::write(path, writer.finish().unwrap()).unwrap();
}

/// Every block boundary reported while walking the input from 0 to its end.
fn blocks(input: &dyn Input) -> Vec<u64> {
    let mut ends = Vec::new();
    let mut at = 0;
    while at < input.len() {
        at = input.block_end(at);
        ends.push(at);
    }
    ends
}

#[test]
fn wds_tars_in_a_folder_become_key_and_bytes_columns() {
    let dir = tempfile::tempdir().unwrap();
    write_tar(
        &dir.path().join("b.tar"),
        &[("k3", &[("txt", b"c"), ("cls", b"3")])],
    );
    write_tar(
        &dir.path().join("a.tar"),
        &[
            ("k1", &[("txt", b"a"), ("cls", b"1")]),
            ("k2", &[("txt", b"b"), ("cls", b"2")]),
        ],
    );
    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default()).unwrap();
    assert_eq!(input.format(), InputFormat::Wds);
    let cols: Vec<(&str, &str)> = input
        .columns()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        cols,
        [("__key__", "str"), ("cls", "bytes"), ("txt", "bytes")]
    );
    assert_eq!(input.len(), 3);
    assert_eq!(blocks(input.as_ref()), [2, 3]);
    let keys: Vec<Value> = read_range(input.as_ref(), 0..3)
        .into_iter()
        .map(|s| s["__key__"].clone())
        .collect();
    assert_eq!(keys, ["k1", "k2", "k3"].map(|k| Value::Str(k.into())));
    let middle = read_range(input.as_ref(), 1..3);
    assert_eq!(middle[0]["txt"], Value::Bytes(b"b".to_vec()));
    assert_eq!(middle[1]["cls"], Value::Bytes(b"3".to_vec()));
}

#[test]
fn wds_brace_patterns_and_missing_members() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        let key = format!("s{i}");
        write_tar(
            &dir.path().join(format!("d-{i:02}.tar")),
            &[(&key, &[("txt", b"x")])],
        );
    }
    let pattern = dir.path().join("d-{00..02}.tar");
    let input = open(&pattern, InputFormat::Auto, &InputOptions::default()).unwrap();
    assert_eq!(input.len(), 3);
    let pattern = dir.path().join("d-{01..02}.tar");
    let input = open(&pattern, InputFormat::Wds, &InputOptions::default()).unwrap();
    let keys: Vec<Value> = read_range(input.as_ref(), 0..2)
        .into_iter()
        .map(|s| s["__key__"].clone())
        .collect();
    assert_eq!(keys, ["s1", "s2"].map(|k| Value::Str(k.into())));

    write_tar(&dir.path().join("d-03.tar"), &[("s3", &[("json", b"{}")])]);
    let input = open(dir.path(), InputFormat::Wds, &InputOptions::default()).unwrap();
    let err = input
        .read(0..4)
        .unwrap()
        .find_map(|s| s.err())
        .unwrap()
        .to_string();
    assert!(
        err.contains("d-00.tar") && err.contains("\"json\""),
        "{err}"
    );
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn write_mds(dir: &Path, n: i64, size_limit: u64) {
    let columns = vec![
        ("id".to_string(), "int".to_string()),
        ("txt".to_string(), "str".to_string()),
    ];
    let options = MdsWriterOptions {
        size_limit: Some(size_limit),
        ..MdsWriterOptions::default()
    };
    let mut writer =
        MdsWriter::new(&columns, options, Arc::new(LocalDirSink::new(dir).unwrap())).unwrap();
    for i in 0..n {
        let mut s = Sample::new();
        s.insert("id".into(), Value::Int(i));
        s.insert("txt".into(), Value::Str(format!("sample {i}")));
        writer.write(&s).unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn mds_datasets_read_by_shard_blocks_and_parts() {
    let dir = tempfile::tempdir().unwrap();
    write_mds(dir.path(), 50, 400);
    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default()).unwrap();
    assert_eq!(input.format(), InputFormat::Mds);
    assert_eq!(input.columns()["id"], "int");
    assert_eq!(input.len(), 50);
    let ends = blocks(input.as_ref());
    assert!(ends.len() > 3, "{ends:?}");
    assert_eq!(ends.last(), Some(&50));
    let all = read_range(input.as_ref(), 0..50);
    let ids: Vec<Value> = all.iter().map(|s| s["id"].clone()).collect();
    assert_eq!(ids, (0..50).map(Value::Int).collect::<Vec<_>>());
    let mut joined = Vec::new();
    for part in 0..4 {
        joined.extend(read_range(input.as_ref(), part_range(50, part, 4)));
    }
    assert_eq!(joined, all);
    assert_eq!(read_range(input.as_ref(), 17..19), all[17..19]);
}

#[test]
fn litdata_datasets_keep_litdatas_order_and_map_leaf_formats() {
    let dir = tempfile::tempdir().unwrap();
    let script = "import sys\n\
                  from litdata.streaming.writer import BinaryWriter\n\
                  w = BinaryWriter(sys.argv[1], chunk_size=3)\n\
                  for i in range(7):\n    \
                      w[i] = {'id': i, 'name': f'n{i}', 'score': i / 2, 'ok': i % 2 == 0, 'blob': bytes([i]) * 3}\n\
                  w.done()\n\
                  w.merge(1)\n";
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let input = open(dir.path(), InputFormat::Auto, &InputOptions::default()).unwrap();
    assert_eq!(input.format(), InputFormat::LitData);
    let cols: Vec<(&str, &str)> = input
        .columns()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        cols,
        [
            ("blob", "bytes"),
            ("id", "int"),
            ("name", "str"),
            ("ok", "uint8"),
            ("score", "float64")
        ]
    );
    assert_eq!(input.len(), 7);
    assert_eq!(blocks(input.as_ref()), [3, 6, 7]);
    let samples = read_range(input.as_ref(), 2..5);
    assert_eq!(samples[0]["id"], Value::Int(2));
    assert_eq!(samples[2]["name"], Value::Str("n4".into()));
    assert_eq!(samples[1]["blob"], Value::Bytes(vec![3, 3, 3]));
    assert_eq!(samples[1]["score"], Value::Float(1.5));
    // Every value encodes with the MDS encoding its column names (what `shard` will do).
    for sample in &samples {
        for (name, encoding) in input.columns() {
            let encoding = Encoding::parse(encoding).unwrap();
            assert!(
                encoding.encode(&sample[name]).is_ok(),
                "{name}: {:?}",
                sample[name]
            );
        }
    }
    let ok = Encoding::parse("uint8")
        .unwrap()
        .encode(&samples[0]["ok"])
        .unwrap();
    assert_eq!(ok, [1]);
}
