//! Interop with the real mosaicml-streaming package, both ways.
//!
//! `tests/mds_interop.py write` has Mosaic's `MDSWriter` write datasets covering every column
//! encoding, every compression, every hash, several shards, the empty-shard quirk, a split and a
//! merged index, and describes their samples in canonical JSON. Then:
//! (a) our reader decodes every sample of Mosaic's datasets equal to those values and verifies
//!     every size and hash;
//! (b) our writer, given the same values, writes byte-identical shards and `index.json` (for
//!     uncompressed and zstd; for gz/bz2/br/snappy the raw shards and the rest of the index are
//!     identical, the compressed bytes come from other library builds) and our merge equals
//!     Mosaic's `merge_index` output byte for byte;
//! (c) `tests/mds_interop.py read` checks our output with Mosaic's own hashing, decompression and
//!     `StreamingDataset`, which must yield the same values.
//!
//! The interpreter is `$SHARDSTREAM_PYTHON`, else the workspace's `.venv/bin/python`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value as Json;
use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::{
    merge_indexes, DatasetOptions, Index, LocalDirSink, MdsDataset, MdsWriter, MdsWriterOptions,
};
use shardstream_sharding::value::{
    sample_to_canonical_json, DType, ImageFormat, NdArray, PilImage, Sample, Scalar, Value,
};
use shardstream_sharding::FormatError;

fn python() -> PathBuf {
    std::env::var_os("SHARDSTREAM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // Resolve the workspace folder (not the interpreter, whose symlink marks the venv).
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            std::fs::canonicalize(&workspace)
                .unwrap_or(workspace)
                .join(".venv/bin/python")
        })
}

fn run_helper(cmd: &str, root: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mds_interop.py");
    let py = python();
    let out = Command::new(&py)
        .arg(&script)
        .arg(cmd)
        .arg(root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (set SHARDSTREAM_PYTHON): {e}", py.display()));
    assert!(
        out.status.success(),
        "mds_interop.py {cmd} failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn float(j: &Json) -> f64 {
    match j {
        Json::String(s) if s == "nan" => f64::NAN,
        Json::String(s) if s == "inf" => f64::INFINITY,
        Json::String(s) if s == "-inf" => f64::NEG_INFINITY,
        other => other.as_f64().unwrap(),
    }
}

fn element_bytes(dtype: DType, j: &Json) -> Vec<u8> {
    let int = || {
        j.as_i64()
            .map(i128::from)
            .or(j.as_u64().map(i128::from))
            .unwrap()
    };
    match dtype {
        DType::U8 => u8::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::U16 => u16::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::U32 => u32::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::U64 => u64::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::I8 => i8::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::I16 => i16::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::I32 => i32::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::I64 => i64::try_from(int()).unwrap().to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(float(j)).to_le_bytes().to_vec(),
        DType::F32 => (float(j) as f32).to_le_bytes().to_vec(),
        DType::F64 => float(j).to_le_bytes().to_vec(),
        DType::Bool => vec![u8::from(j.as_bool().unwrap())],
    }
}

/// The inverse of `Value::to_canonical_json` for the shapes MDS produces.
fn value_of(j: &Json) -> Value {
    let text = |m: &serde_json::Map<String, Json>, k: &str| m[k].as_str().unwrap().to_string();
    let bytes =
        |m: &serde_json::Map<String, Json>| hex::decode(m["hex"].as_str().unwrap()).unwrap();
    match j {
        Json::String(s) => Value::Str(s.clone()),
        Json::Number(n) => Value::Int(n.as_i64().unwrap()),
        Json::Object(m) => match m["$type"].as_str().unwrap() {
            "bytes" => Value::Bytes(bytes(m)),
            "str_int" => Value::StrInt(text(m, "text")),
            "str_decimal" => Value::StrDecimal(text(m, "text")),
            "str_float" => Value::StrFloat(float(&m["value"])),
            "json" => Value::Json(m["value"].clone()),
            "pkl" => Value::Pickle(bytes(m)),
            "jpeg" => Value::Image(ImageFormat::Jpeg, bytes(m)),
            "png" => Value::Image(ImageFormat::Png, bytes(m)),
            "pil" => Value::Pil(PilImage {
                width: m["width"].as_u64().unwrap() as u32,
                height: m["height"].as_u64().unwrap() as u32,
                mode: text(m, "mode"),
                data: bytes(m),
            }),
            "list" => Value::List(
                m["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(value_of)
                    .collect(),
            ),
            "ndarray" => {
                let dtype = DType::from_name(m["dtype"].as_str().unwrap()).unwrap();
                Value::NdArray(NdArray {
                    dtype,
                    shape: m["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_u64().unwrap())
                        .collect(),
                    data: m["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .flat_map(|v| element_bytes(dtype, v))
                        .collect(),
                })
            }
            scalar => {
                let dtype =
                    DType::from_name(scalar).unwrap_or_else(|| panic!("unknown tag {scalar}"));
                Value::Scalar(Scalar {
                    dtype,
                    bytes: element_bytes(dtype, &m["value"]),
                })
            }
        },
        other => panic!("unexpected canonical value {other}"),
    }
}

struct Case {
    name: String,
    columns: Vec<(String, String)>,
    compression: Option<String>,
    hashes: Vec<String>,
    size_limit: Option<u64>,
    split: Option<String>,
    samples: Vec<Json>,
}

fn load_cases(root: &Path) -> Vec<Case> {
    let text = std::fs::read(root.join("cases.json")).unwrap();
    let cases: Vec<Json> = serde_json::from_slice(&text).unwrap();
    cases
        .into_iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            columns: c["columns"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect(),
            compression: c["compression"].as_str().map(str::to_string),
            hashes: c["hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap().to_string())
                .collect(),
            size_limit: c["size_limit"].as_u64(),
            split: c["split"].as_str().map(str::to_string),
            samples: c["samples"].as_array().unwrap().clone(),
        })
        .collect()
}

fn options(case: &Case) -> MdsWriterOptions {
    MdsWriterOptions {
        compression: case
            .compression
            .as_deref()
            .map(|c| Compression::parse(c).unwrap()),
        hashes: HashAlgorithm::parse_list(&case.hashes).unwrap(),
        size_limit: case.size_limit,
        threads: 2,
    }
}

fn write_rust(case: &Case, out: &Path, samples: &[Json]) -> Index {
    let sink = Arc::new(LocalDirSink::new(out).unwrap());
    let mut writer = MdsWriter::new(&case.columns, options(case), sink).unwrap();
    for s in samples {
        let sample: Sample = s
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), value_of(v)))
            .collect();
        writer.write(&sample).unwrap();
    }
    writer.finish().unwrap()
}

fn files_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn read_all(dir: &Path, split: Option<&str>) -> Vec<Json> {
    let options = DatasetOptions {
        split: split.map(str::to_string),
        allow_unsafe_types: true,
        ..Default::default()
    };
    let ds = MdsDataset::open(dir, options).unwrap();
    ds.verify().unwrap();
    ds.iter()
        .map(|s| sample_to_canonical_json(&s.unwrap()))
        .collect()
}

fn assert_same_samples(name: &str, got: &[Json], want: &[Json]) {
    assert_eq!(got.len(), want.len(), "{name}: sample count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{name}: sample {i} differs");
    }
}

/// Compares our output folder with Mosaic's: identical bytes where the compressor is
/// deterministic across builds, otherwise identical raw shards and index apart from the
/// compressed files' sizes and hashes.
fn compare_outputs(case: &Case, py: &Path, rs: &Path) {
    let py_files = files_under(py);
    let rs_files = files_under(rs);
    assert_eq!(
        py_files.keys().collect::<Vec<_>>(),
        rs_files.keys().collect::<Vec<_>>(),
        "{}: file names",
        case.name
    );
    let exact = case
        .compression
        .as_deref()
        .is_none_or(|c| c.starts_with("zstd"));
    if exact {
        for (name, bytes) in &py_files {
            assert!(
                bytes == &rs_files[name],
                "{}: {name} differs from Mosaic's",
                case.name
            );
        }
        return;
    }
    let strip = |bytes: &[u8]| {
        let mut index = Index::from_json("index.json", bytes).unwrap();
        for s in &mut index.shards {
            let zip = s.zip_data.as_mut().unwrap();
            zip.bytes = 0;
            zip.hashes.clear();
        }
        index
    };
    let py_index = strip(&py_files["index.json"]);
    assert_eq!(
        py_index,
        strip(&rs_files["index.json"]),
        "{}: index",
        case.name
    );
    for shard in &py_index.shards {
        let zip = shard.zip_data.as_ref().unwrap();
        let c = Compression::parse(shard.compression.as_deref().unwrap()).unwrap();
        let raw = |files: &BTreeMap<String, Vec<u8>>| {
            c.decompress(&files[&zip.basename], &zip.basename, shard.raw_data.bytes)
                .unwrap()
        };
        assert!(
            raw(&py_files) == raw(&rs_files),
            "{}: raw {} differs",
            case.name,
            zip.basename
        );
    }
}

#[test]
fn mosaic_interop_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    run_helper("write", root);
    let cases = load_cases(root);
    assert!(cases.len() >= 15, "helper described {} cases", cases.len());

    for case in &cases {
        let py_dir = root.join("py").join(&case.name);
        let rs_dir = root.join("rs").join(&case.name);
        // (a) We read Mosaic's output.
        assert_same_samples(
            &case.name,
            &read_all(&py_dir, case.split.as_deref()),
            &case.samples,
        );

        // (b) We write what Mosaic writes.
        if case.name == "merge" {
            let mut parts = Vec::new();
            for (i, chunk) in case.samples.chunks(20).enumerate() {
                let index = write_rust(case, &rs_dir.join(i.to_string()), chunk);
                parts.push((i.to_string(), index));
            }
            let merged = merge_indexes(&parts).to_merged_json();
            std::fs::write(rs_dir.join("index.json"), &merged).unwrap();
            let py_merged = std::fs::read(py_dir.join("index.json")).unwrap();
            assert_eq!(
                merged.as_bytes(),
                py_merged.as_slice(),
                "merged index differs"
            );
            assert_same_samples("merge (ours)", &read_all(&rs_dir, None), &case.samples);
        } else {
            let (py_out, rs_out) = match &case.split {
                Some(split) => (py_dir.join(split), rs_dir.join(split)),
                None => (py_dir.clone(), rs_dir.clone()),
            };
            let index = write_rust(case, &rs_out, &case.samples);
            if case.name == "empty_shard_quirk" {
                assert_eq!(index.shards[0].samples, 0, "Mosaic's empty first shard");
            }
            compare_outputs(case, &py_out, &rs_out);
        }
    }

    // pkl is refused unless the reader opts in.
    let err = MdsDataset::open(root.join("py/all_raw"), DatasetOptions::default()).unwrap_err();
    assert!(
        matches!(err, FormatError::UnsafeEncoding { ref column, .. } if column == "pk"),
        "{err}"
    );

    // (c) Mosaic reads our output (and checks its sizes and hashes with its own code).
    run_helper("read", root);
}
