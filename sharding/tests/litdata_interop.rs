//! LitData interop with the real `litdata` package: datasets written by `litdata.optimize()` (plain,
//! whole-file zstd, framed zstd, per-item zstd; dict, tuple and token samples) read by our reader
//! give the values, in the order, that litdata's own `StreamingDataset` gives; malformed datasets
//! give errors that name the file.
//!
//! Python comes from `SHARDSTREAM_PYTHON` (default: the workspace's `.venv/bin/python`).

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value as Json};
use shardstream_sharding::litdata::{LitDataIndex, LitDataOptions, LitDataReader};
use shardstream_sharding::value::{sample_to_canonical_json, Value};
use shardstream_sharding::{FormatError, Sample};

const PYTHON_DEADLINE: Duration = Duration::from_secs(240);

const GEN: &str = r#"
import os, sys, decimal
import numpy as np
import torch
from PIL import Image
import litdata as ld

IMG = sys.argv[2]

def dict_sample(i):
    return {
        "idx": i,
        "name": f"sample-{i} é",
        "score": i * 0.25 - 1.0,
        "flag": i % 3 == 0,
        "raw": bytes([i % 256, 0, 255]) * (i % 4),
        "arr": (np.arange(6, dtype=np.int16).reshape(2, 3) * (i + 1)),
        "vec": np.linspace(0, 1, 3, dtype=np.float32) + i,
        "img": Image.new("L", (3, 2), i % 256),
        "photo": Image.open(f"{IMG}/{i}.jpg"),
        "meta": {"id": i * 10, "tag": f"t{i}"},
        "lst": [i, i + 1, i + 2],
        "t2": torch.arange(4, dtype=torch.float64).reshape(2, 2) + i,
        "t1": torch.tensor([i, -i], dtype=torch.int64),
    }

def tuple_sample(i):
    return (f"s{i}", i, np.full((2, 2), i, dtype=np.uint8))

def tokens_sample(i):
    return torch.arange(i * 10, i * 10 + 7 + i, dtype=torch.int32)

def flat_sample(i):
    return {"name": f"n{i}", "idx": i, "score": i / 4}

def pickle_sample(i):
    return (i, decimal.Decimal(i) / 3)

if __name__ == "__main__":
    out, kind, n, workers = sys.argv[1], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    comp = None if sys.argv[6] == "none" else sys.argv[6]
    level = None if sys.argv[7] == "none" else sys.argv[7]
    kw = dict(compression=comp, compression_level=level, num_workers=workers)
    if kind == "dict":
        os.makedirs(IMG, exist_ok=True)
        for i in range(n):
            Image.new("RGB", (5, 4), (i * 9 % 256, 20, 30)).save(f"{IMG}/{i}.jpg", quality=90)
        ld.optimize(fn=dict_sample, inputs=list(range(n)), output_dir=out, chunk_size=4, **kw)
    elif kind == "tuple":
        ld.optimize(fn=tuple_sample, inputs=list(range(n)), output_dir=out, chunk_bytes=120, **kw)
    elif kind == "tokens":
        from litdata.streaming.item_loader import TokensLoader
        ld.optimize(fn=tokens_sample, inputs=list(range(n)), output_dir=out, chunk_size=40,
                    item_loader=TokensLoader(), **kw)
    elif kind == "flat":
        ld.optimize(fn=flat_sample, inputs=list(range(n)), output_dir=out, chunk_size=2, **kw)
    elif kind == "pickle":
        ld.optimize(fn=pickle_sample, inputs=list(range(n)), output_dir=out, chunk_size=2, **kw)
"#;

/// Reads a dataset back with litdata's `StreamingDataset` and prints canonical JSON samples.
const DUMP: &str = r#"
import json, sys
import numpy as np, torch
from litdata import StreamingDataset
out, img = sys.argv[1], sys.argv[2]
if sys.argv[3] == "tokens":
    from litdata.streaming.item_loader import TokensLoader
    ds = StreamingDataset(out, shuffle=False, item_loader=TokensLoader(block_size=1))
    print(json.dumps([int(ds[i][0]) for i in range(len(ds))]))
    sys.exit(0)
ds = StreamingDataset(out, shuffle=False)
def conv(v):
    if isinstance(v, (bool, int, float, str)): return v
    if isinstance(v, memoryview): v = bytes(v)
    if isinstance(v, bytes): return {"$type": "bytes", "hex": v.hex()}
    if isinstance(v, torch.Tensor): v = v.numpy()
    if isinstance(v, np.ndarray):
        return {"$type": "ndarray", "dtype": str(v.dtype), "shape": list(v.shape),
                "values": v.reshape(-1).tolist()}
    if hasattr(v, "tobytes") and hasattr(v, "mode"):
        return {"$type": "pil", "width": v.size[0], "height": v.size[1], "mode": v.mode,
                "hex": v.tobytes().hex()}
    raise TypeError(type(v))
res = []
for i in range(len(ds)):
    s = ds[i]
    if isinstance(s, dict):
        row = {}
        for k, v in s.items():
            if k == "photo":
                # litdata decodes JPEG leaves to pixels; the stored bytes are the source file's.
                row[k] = {"$type": "jpeg", "hex": open(f"{img}/{s['idx']}.jpg", "rb").read().hex()}
            elif isinstance(v, dict):
                row.update({f"{k}.{k2}": conv(v2) for k2, v2 in v.items()})
            elif isinstance(v, list):
                row[k] = {"$type": "json", "value": v}
            else:
                row[k] = conv(v)
    else:
        row = {str(j): conv(v) for j, v in enumerate(s)}
    res.append(row)
print(json.dumps(res))
"#;

fn python() -> String {
    std::env::var("SHARDSTREAM_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python").into())
}

/// Runs the Python file `script` with `args`, waiting at most [`PYTHON_DEADLINE`]; returns stdout.
fn run_python(script: &Path, args: &[&str]) -> String {
    let mut child = Command::new(python())
        .arg(script)
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        tx.send(()).ok();
        s
    });
    if rx.recv_timeout(PYTHON_DEADLINE).is_err() {
        child.kill().ok();
        panic!("python did not finish within {PYTHON_DEADLINE:?}");
    }
    let status = child.wait().unwrap();
    let (out, err) = (out_thread.join().unwrap(), err_thread.join().unwrap());
    assert!(status.success(), "python failed: {status}\n{err}");
    out
}

struct Dataset {
    /// Chunk file names as written (before litdata's reader touched the folder).
    names: Vec<String>,
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    dir: std::path::PathBuf,
    images: std::path::PathBuf,
}

/// Writes a dataset with `litdata.optimize()`.
fn optimize(kind: &str, n: usize, workers: usize, compression: &str, level: &str) -> Dataset {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let dir = root.join("out");
    let images = root.join("img");
    std::fs::write(root.join("gen.py"), GEN).unwrap();
    run_python(
        &root.join("gen.py"),
        &[
            dir.to_str().unwrap(),
            images.to_str().unwrap(),
            kind,
            &n.to_string(),
            &workers.to_string(),
            compression,
            level,
        ],
    );
    let names = filenames(&dir);
    Dataset {
        names,
        _tmp: tmp,
        root,
        dir,
        images,
    }
}

fn litdata_dump(ds: &Dataset, kind: &str) -> Json {
    std::fs::write(ds.root.join("dump.py"), DUMP).unwrap();
    let out = run_python(
        &ds.root.join("dump.py"),
        &[ds.dir.to_str().unwrap(), ds.images.to_str().unwrap(), kind],
    );
    serde_json::from_str(out.lines().last().unwrap()).unwrap()
}

fn read_ours(dir: &Path) -> Vec<Sample> {
    LitDataReader::open(dir, LitDataOptions::default())
        .unwrap()
        .samples()
        .map(Result::unwrap)
        .collect()
}

fn filenames(dir: &Path) -> Vec<String> {
    let index: Json =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    index["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["filename"].as_str().unwrap().to_string())
        .collect()
}

fn same_as_litdata(
    kind: &str,
    n: usize,
    workers: usize,
    compression: &str,
    level: &str,
) -> Dataset {
    let ds = optimize(kind, n, workers, compression, level);
    // Read first: litdata inflates whole-file zstd chunks of a local dataset in place.
    let ours: Vec<Json> = read_ours(&ds.dir)
        .iter()
        .map(sample_to_canonical_json)
        .collect();
    let names = filenames(&ds.dir);
    let theirs = litdata_dump(&ds, kind);
    assert_eq!(ours.len(), n, "{kind} {compression} {level}");
    assert_eq!(
        Json::Array(ours.clone()),
        theirs,
        "{kind} {compression} {level}"
    );
    // Our reader also reads the inflated copies litdata left behind.
    let again: Vec<Json> = read_ours(&ds.dir)
        .iter()
        .map(sample_to_canonical_json)
        .collect();
    assert_eq!(again, ours);
    Dataset { names, ..ds }
}

#[test]
fn dict_samples_uncompressed() {
    let ds = same_as_litdata("dict", 10, 1, "none", "none");
    let reader = LitDataReader::open(&ds.dir, LitDataOptions::default()).unwrap();
    let columns = &reader.index().columns;
    assert_eq!(
        columns,
        &[
            "idx", "name", "score", "flag", "raw", "arr", "vec", "img", "photo", "meta.id",
            "meta.tag", "lst", "t2", "t1"
        ]
    );
    let first = reader.samples().next().unwrap().unwrap();
    assert!(matches!(&first["photo"], Value::Image(_, b) if b.starts_with(&[0xff, 0xd8])));
    assert_eq!(first["meta.tag"], Value::Str("t0".into()));
}

#[test]
fn dict_samples_framed_zstd_two_workers() {
    let ds = same_as_litdata("dict", 16, 2, "zstd", "none");
    let first = std::fs::read(ds.dir.join(&ds.names[0])).unwrap();
    assert!(first.starts_with(b"LDFZ01"), "expected framed chunks");
}

#[test]
fn dict_samples_whole_file_zstd_with_level_in_the_name() {
    let ds = same_as_litdata("dict", 6, 1, "zstd:3", "chunk");
    assert_eq!(ds.names[0], "chunk-0-0.zstd:3.bin");
}

#[test]
fn dict_samples_per_item_zstd() {
    same_as_litdata("dict", 6, 1, "zstd", "sample");
}

#[test]
fn tuple_samples_plain_and_compressed() {
    let ds = same_as_litdata("tuple", 9, 1, "none", "none");
    assert_eq!(
        LitDataReader::open(&ds.dir, LitDataOptions::default())
            .unwrap()
            .index()
            .columns,
        ["0", "1", "2"]
    );
    let ds = same_as_litdata("tuple", 9, 1, "zstd", "chunk");
    assert!(ds.names[0].ends_with(".zstd.bin"));
}

#[test]
fn token_items_concatenate_to_litdatas_token_stream() {
    let ds = optimize("tokens", 6, 1, "none", "none");
    let theirs = litdata_dump(&ds, "tokens");
    let samples = read_ours(&ds.dir);
    assert_eq!(samples.len(), 6);
    let mut tokens = Vec::new();
    for s in &samples {
        let Value::NdArray(a) = &s["0"] else {
            panic!("{s:?}")
        };
        tokens.extend(
            a.data
                .chunks_exact(4)
                .map(|c| json!(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        );
    }
    assert_eq!(Json::Array(tokens), theirs);
}

#[test]
fn unframed_chunks_under_batch_compression_are_read() {
    // litdata 0.2.7x without pyarrow leaves str/int/float-only chunks unframed but still records
    // compression_level="batch" (its own reader then refuses them); we read the items.
    let ds = optimize("flat", 5, 1, "zstd", "none");
    let samples = read_ours(&ds.dir);
    let got: Vec<Json> = samples.iter().map(sample_to_canonical_json).collect();
    let expected: Vec<Json> = (0..5)
        .map(|i| json!({"name": format!("n{i}"), "idx": i, "score": f64::from(i) / 4.0}))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn pickle_is_refused_unless_opted_in() {
    let ds = optimize("pickle", 3, 1, "none", "none");
    let err = LitDataReader::open(&ds.dir, LitDataOptions::default())
        .unwrap()
        .samples()
        .find_map(Result::err)
        .unwrap();
    assert!(
        matches!(&err, FormatError::UnsafeEncoding { column, .. } if column == "1"),
        "{err}"
    );
    assert!(err.to_string().contains("chunk-0-0.bin"), "{err}");
    let opts = LitDataOptions {
        allow_unsafe_types: true,
        ..LitDataOptions::default()
    };
    let samples: Vec<Sample> = LitDataReader::open(&ds.dir, opts)
        .unwrap()
        .samples()
        .map(Result::unwrap)
        .collect();
    assert!(matches!(&samples[2]["1"], Value::Pickle(b) if b.starts_with(&[0x80])));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn first_error(dir: &Path) -> FormatError {
    match LitDataReader::open(dir, LitDataOptions::default()) {
        Err(e) => e,
        Ok(r) => r.samples().find_map(Result::err).expect("an error"),
    }
}

fn edit_index(dir: &Path, edit: impl FnOnce(&mut Json)) {
    let path = dir.join("index.json");
    let mut index: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut index);
    std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
}

#[test]
fn malformed_datasets_give_errors_naming_the_file() {
    let plain = optimize("tuple", 9, 1, "none", "none");
    let zstd = optimize("tuple", 9, 1, "zstd", "chunk");
    let work = tempfile::tempdir().unwrap();

    // Corrupt zstd chunk.
    let dir = work.path().join("corrupt-zstd");
    copy_dir(&zstd.dir, &dir);
    let name = &filenames(&dir)[1];
    let mut bytes = std::fs::read(dir.join(name)).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..] {
        *b ^= 0x5a;
    }
    std::fs::write(dir.join(name), &bytes).unwrap();
    let err = first_error(&dir);
    assert!(
        matches!(
            err,
            FormatError::Decompress { .. } | FormatError::SizeMismatch { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains(name.as_str()), "{err}");

    // Invalid index JSON.
    let dir = work.path().join("bad-index");
    copy_dir(&plain.dir, &dir);
    std::fs::write(dir.join("index.json"), b"{\"chunks\": [").unwrap();
    let err = first_error(&dir);
    assert!(matches!(err, FormatError::InvalidIndex { .. }), "{err}");
    assert!(err.to_string().contains("index.json"), "{err}");

    // An item offset beyond the end of the chunk.
    let dir = work.path().join("bad-offset");
    copy_dir(&plain.dir, &dir);
    let name = filenames(&dir)[0].clone();
    let mut bytes = std::fs::read(dir.join(&name)).unwrap();
    bytes[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(dir.join(&name), &bytes).unwrap();
    let err = first_error(&dir);
    assert!(matches!(err, FormatError::CorruptShard { .. }), "{err}");
    assert!(err.to_string().contains(&name), "{err}");

    // A leaf size larger than its item.
    let dir = work.path().join("bad-leaf");
    copy_dir(&plain.dir, &dir);
    let mut bytes = std::fs::read(dir.join(&name)).unwrap();
    let first_item = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    bytes[first_item..first_item + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
    std::fs::write(dir.join(&name), &bytes).unwrap();
    let err = first_error(&dir);
    assert!(
        err.to_string().contains(&name) && err.to_string().contains("runs past"),
        "{err}"
    );

    // A truncated chunk (its size no longer matches the index).
    let dir = work.path().join("truncated");
    copy_dir(&plain.dir, &dir);
    let bytes = std::fs::read(dir.join(&name)).unwrap();
    std::fs::write(dir.join(&name), &bytes[..bytes.len() - 3]).unwrap();
    let err = first_error(&dir);
    assert!(matches!(err, FormatError::SizeMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&name), "{err}");

    // Encryption is unsupported, clearly.
    let dir = work.path().join("encrypted");
    copy_dir(&plain.dir, &dir);
    edit_index(&dir, |i| {
        i["config"]["encryption"] = json!({"algorithm": "fernet", "level": "chunk"})
    });
    let err = first_error(&dir);
    assert!(matches!(err, FormatError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("encrypted"), "{err}");

    // A chunk name that escapes the dataset folder.
    let dir = work.path().join("escape");
    copy_dir(&plain.dir, &dir);
    edit_index(&dir, |i| {
        i["chunks"][0]["filename"] = json!("../../etc/passwd")
    });
    let err = first_error(&dir);
    assert!(matches!(err, FormatError::UnsafePath { .. }), "{err}");

    // A data_spec whose leaf count does not match data_format.
    let text = std::fs::read_to_string(plain.dir.join("index.json")).unwrap();
    let mut index: Json = serde_json::from_str(&text).unwrap();
    index["config"]["data_format"] = json!(["str"]);
    let err =
        LitDataIndex::parse("x/index.json", &serde_json::to_vec(&index).unwrap()).unwrap_err();
    assert!(
        err.to_string().contains("x/index.json") && err.to_string().contains("leaves"),
        "{err}"
    );
}
