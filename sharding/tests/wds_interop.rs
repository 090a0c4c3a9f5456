//! WebDataset interop with the real `webdataset` package: its writer → our reader, our writer → its
//! `WebDataset` pipeline, gzipped shards, brace lists, and malformed tars.
//!
//! Python comes from `SHARDSTREAM_PYTHON` (default: the workspace's `.venv/bin/python`).

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value as Json;
use shardstream_sharding::wds::{
    expand_urls_with, ShardWriter, ShardWriterOptions, TarWriter, WdsReadOptions, WdsReader,
    WdsSample, DEFAULT_MTIME,
};
use shardstream_sharding::FormatError;

const PYTHON_DEADLINE: Duration = Duration::from_secs(180);

fn python() -> String {
    std::env::var("SHARDSTREAM_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python").into())
}

/// Runs a Python script with `args`, waiting at most [`PYTHON_DEADLINE`]; returns stdout.
fn run_python(script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
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
    // stderr closes when the process exits: wait for that, with a deadline.
    if rx.recv_timeout(PYTHON_DEADLINE).is_err() {
        child.kill().ok();
        panic!("python did not finish within {PYTHON_DEADLINE:?}");
    }
    let status = child.wait().unwrap();
    let (out, err) = (out_thread.join().unwrap(), err_thread.join().unwrap());
    assert!(status.success(), "python failed: {status}\n{err}");
    out
}

/// What both sides compare: key, url, ext → bytes.
type Flat = (String, String, BTreeMap<String, Vec<u8>>);

fn from_python_dump(dump: &str) -> Vec<Flat> {
    let json: Json = serde_json::from_str(dump.lines().last().unwrap()).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let fields = s["fields"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), hex::decode(v.as_str().unwrap()).unwrap()))
                .collect();
            (
                s["key"].as_str().unwrap().to_string(),
                s["url"].as_str().unwrap().to_string(),
                fields,
            )
        })
        .collect()
}

fn flat(s: &WdsSample) -> Flat {
    (
        s.key.clone(),
        s.url.clone(),
        s.fields.iter().cloned().collect(),
    )
}

fn read_ours(urls: &[String], options: &WdsReadOptions) -> Vec<WdsSample> {
    let mut out = Vec::new();
    for url in urls {
        for s in WdsReader::open(url, options.clone()).unwrap() {
            out.push(s.unwrap());
        }
    }
    out
}

/// Reads shards with `webdataset.WebDataset` (no decoding) and prints the samples as JSON.
const PY_READ: &str = r#"
import json, sys
import webdataset as wds
ds = wds.WebDataset(sys.argv[1], shardshuffle=False, empty_check=False)
out = []
for s in ds:
    out.append({"key": s["__key__"], "url": s["__url__"],
                "fields": {k: bytes(v).hex() for k, v in s.items() if not k.startswith("__")}})
print(json.dumps(out))
"#;

const PY_WRITE: &str = r#"
import sys, numpy as np
import webdataset as wds
pattern, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(7)
with wds.ShardWriter(pattern, maxcount=3, verbose=0, mtime=0) as w:
    for i in range(n):
        w.write({
            "__key__": f"part/sample{i:04d}",
            "txt": f"caption {i} é",
            "cls": i % 5,
            "jpg": rng.bytes(100 + 37 * i),
            "seg.png": rng.bytes(11),
            "json": {"i": i, "tags": ["a", "b"]},
            "npy": np.arange(i + 1, dtype=np.int16),
            "Upper.BIN": b"upper",
            "txt.gz": f"compressed {i}",
        })
"#;

#[test]
fn webdataset_shardwriter_output_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for (pattern, count) in [
        ("plain-%06d.tar", "000000..000002"),
        ("gz-%06d.tar.gz", "000000..000002"),
    ] {
        let full = dir.path().join(pattern);
        run_python(PY_WRITE, &[full.to_str().unwrap(), "8"], &[]);
        let ext = if pattern.ends_with(".gz") {
            "tar.gz"
        } else {
            "tar"
        };
        let prefix = pattern.split('-').next().unwrap();
        let spec = format!("{}/{prefix}-{{{count}}}.{ext}", dir.path().display());
        let urls = expand_urls_with(&spec, |_| None).unwrap();
        assert_eq!(urls.len(), 3);
        let theirs = from_python_dump(&run_python(PY_READ, &[&spec], &[]));
        let ours = read_ours(&urls, &WdsReadOptions::default());
        assert_eq!(theirs.len(), 8);
        assert_eq!(
            ours.iter().map(flat).collect::<Vec<_>>(),
            theirs,
            "{pattern}"
        );
        let first = &ours[0];
        assert_eq!(first.key, "part/sample0000");
        assert_eq!(first.get("cls"), Some(&b"0"[..]));
        assert_eq!(first.get("txt"), Some("caption 0 é".as_bytes()));
        assert_eq!(first.get("upper.bin"), Some(&b"upper"[..]));
        assert!(first
            .get("txt.gz")
            .is_some_and(|b| b.starts_with(&[0x1f, 0x8b])));

        let mut expected = String::new();
        flate2::read::GzDecoder::new(ours[3].get("txt.gz").unwrap())
            .read_to_string(&mut expected)
            .unwrap();
        assert_eq!(expected, "compressed 3");
        // Inflating `txt.gz` would give a second `txt` field: that is refused, not overwritten.
        let opts = WdsReadOptions {
            gunzip_members: true,
            ..WdsReadOptions::default()
        };
        let err = WdsReader::open(&urls[0], opts)
            .unwrap()
            .find_map(Result::err)
            .unwrap();
        assert!(err.to_string().contains("duplicate"), "{err}");
    }
}

#[test]
fn gunzip_option_inflates_gz_members() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("z.tar");
    let script = r#"
import sys, webdataset as wds
with wds.TarWriter(sys.argv[1], mtime=0) as w:
    for i in range(3):
        w.write({"__key__": f"k{i}", "json.gz": {"i": i}, "cls": i})
"#;
    run_python(script, &[path.to_str().unwrap()], &[]);
    let opts = WdsReadOptions {
        gunzip_members: true,
        ..WdsReadOptions::default()
    };
    let samples: Vec<WdsSample> = WdsReader::open(&path, opts)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[2].get("json"), Some(&br#"{"i": 2}"#[..]));
    assert_eq!(samples[2].fields.len(), 2);
}

#[test]
fn metadata_and_non_regular_members_are_skipped_as_webdataset_skips_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.tar");
    let script = r#"
import io, sys, tarfile
def add(t, name, data=b"", kind=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(name); ti.type = kind; ti.linkname = link; ti.size = len(data)
    t.addfile(ti, io.BytesIO(data) if data else None)
with tarfile.open(sys.argv[1], "w", format=tarfile.GNU_FORMAT) as t:
    add(t, "__meta__", b"meta")
    add(t, "__info__/stats.json", b"{}")
    add(t, "d", kind=tarfile.DIRTYPE)
    add(t, "d/a.txt", b"A")
    add(t, "d/a.link", kind=tarfile.SYMTYPE, link="a.txt")
    add(t, "d/a.CLS", b"1")
    add(t, "noext", b"skipped")
    add(t, "d/b.txt", b"B")
    add(t, "d/%s.txt" % ("x" * 150), b"long")
    add(t, "./c.txt", b"C")
"#;
    run_python(script, &[path.to_str().unwrap()], &[]);
    let url = path.display().to_string();
    let theirs = from_python_dump(&run_python(PY_READ, &[&url], &[]));
    let ours: Vec<Flat> = read_ours(&[url], &WdsReadOptions::default())
        .iter()
        .map(flat)
        .collect();
    assert_eq!(ours, theirs);
    let keys: Vec<&str> = ours.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(keys[..2], ["d/a", "d/b"]);
    assert_eq!(keys[3], "./c");
    assert_eq!(ours[0].2.keys().collect::<Vec<_>>(), ["cls", "txt"]);
}

fn our_samples(n: usize) -> Vec<WdsSample> {
    (0..n)
        .map(|i| WdsSample {
            key: if i == 4 {
                format!("deep/{}/k{i:03}", "d".repeat(120))
            } else {
                format!("k{i:03}")
            },
            url: String::new(),
            fields: vec![
                ("txt".into(), format!("text {i}").into_bytes()),
                ("cls".into(), i.to_string().into_bytes()),
                (
                    "bin".into(),
                    (0..(i * 300) as u32).map(|v| (v * 7) as u8).collect(),
                ),
                ("seg.png".into(), vec![i as u8; 3]),
            ],
        })
        .collect()
}

#[test]
fn our_shards_read_the_same_in_webdataset() {
    let dir = tempfile::tempdir().unwrap();
    let samples = our_samples(7);
    for gzip in [false, true] {
        let pattern = if gzip {
            "ours-%03d.tar.gz"
        } else {
            "ours-%03d.tar"
        };
        let mut writer = ShardWriter::to_dir(
            dir.path(),
            pattern,
            ShardWriterOptions {
                maxcount: 3,
                gzip,
                ..ShardWriterOptions::default()
            },
        )
        .unwrap();
        for s in &samples {
            writer.write(s).unwrap();
        }
        let shards = writer.finish().unwrap();
        assert_eq!(
            shards.iter().map(|s| s.samples).collect::<Vec<_>>(),
            [3, 3, 1]
        );
        let ext = if gzip { "tar.gz" } else { "tar" };
        let spec = format!("{}/ours-{{000..002}}.{ext}", dir.path().display());
        let theirs = from_python_dump(&run_python(PY_READ, &[&spec], &[]));
        let urls = expand_urls_with(&spec, |_| None).unwrap();
        let expected: Vec<Flat> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.key.clone(),
                    urls[i / 3].clone(),
                    s.fields.iter().cloned().collect(),
                )
            })
            .collect();
        assert_eq!(theirs, expected, "gzip={gzip}");
        for shard in &shards {
            let len = std::fs::metadata(dir.path().join(&shard.name))
                .unwrap()
                .len();
            assert_eq!(len, shard.file_bytes);
        }
    }
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn our_tar_headers_follow_webdataset_conventions() {
    let mut w = TarWriter::new(Vec::new());
    w.write(&our_samples(1)[0]).unwrap();
    let tar = w.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.tar");
    std::fs::write(&path, &tar).unwrap();
    let script = r#"
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    print(json.dumps([[m.name, oct(m.mode), m.uname, m.gname, m.mtime, m.uid, m.gid] for m in t]))
"#;
    let out: Json =
        serde_json::from_str(run_python(script, &[path.to_str().unwrap()], &[]).trim()).unwrap();
    let names: Vec<&str> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m[0].as_str().unwrap())
        .collect();
    assert_eq!(names, ["k000.bin", "k000.cls", "k000.seg.png", "k000.txt"]);
    for m in out.as_array().unwrap() {
        assert_eq!(m[1], "0o444");
        assert_eq!(m[2], "bigdata");
        assert_eq!(m[3], "bigdata");
        assert_eq!(m[4].as_u64(), Some(DEFAULT_MTIME));
    }
    // Reproducible: the same samples give the same bytes.
    let mut again = TarWriter::new(Vec::new());
    again.write(&our_samples(1)[0]).unwrap();
    assert_eq!(again.finish().unwrap(), tar);
}

#[test]
fn brace_expansion_matches_webdataset() {
    let specs = [
        "data-{000000..000012}.tar",
        "a-{0..3}.tar::b-{x,y{1..2},}.tar",
        "s3://bucket/${ROOT}/{07..10}-{a..c}.tar",
        "p{2.{5..7},3.{2,3}}",
        "{-3..3..2}/{Z..b}/{z..x}",
        "lit{x}eral{}",
        r"esc\{a,b\}-{c\,d,e}",
        "{0001..3}-{1..010..3}",
    ];
    let script = r#"
import json, sys
from webdataset.shardlists import expand_urls
print(json.dumps([expand_urls(s) for s in json.loads(sys.argv[1])]))
"#;
    let arg = serde_json::to_string(&specs).unwrap();
    let theirs: Vec<Vec<String>> =
        serde_json::from_str(run_python(script, &[&arg], &[("WDS_ROOT", "train")]).trim()).unwrap();
    for (spec, expected) in specs.iter().zip(theirs) {
        let ours = expand_urls_with(spec, |name| (name == "ROOT").then(|| "train".to_string()));
        assert_eq!(ours.unwrap(), expected, "{spec}");
    }
    assert!(expand_urls_with("a{1,2", |_| None).is_err());
}

fn ustar(name: &str, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    h.as_bytes().to_vec()
}

fn read_err(bytes: &[u8], url: &str) -> FormatError {
    let reader = WdsReader::new(bytes, url).unwrap();
    let results: Vec<_> = reader.collect();
    results.into_iter().find_map(Result::err).expect("an error")
}

#[test]
fn truncated_member_names_the_file_and_member() {
    let mut w = TarWriter::new(Vec::new());
    for s in our_samples(3) {
        w.write(&s).unwrap();
    }
    let tar = w.finish().unwrap();
    // Cut inside the data of k002.bin (600 bytes).
    let cut = tar.len() - 1024 - 1536 - 200;
    let err = read_err(&tar[..cut], "cut.tar");
    let text = err.to_string();
    assert!(matches!(err, FormatError::Tar { .. }), "{text}");
    assert!(
        text.contains("cut.tar") && text.contains("truncated"),
        "{text}"
    );
    assert!(text.contains("k002."), "{text}");
}

#[test]
fn size_field_larger_than_the_file_or_the_limit() {
    let mut bytes = ustar("big.bin", 1 << 36);
    bytes.extend_from_slice(&[5u8; 100]);
    let text = read_err(&bytes, "big.tar").to_string();
    assert!(
        text.contains("big.tar") && text.contains("big.bin") && text.contains("limit"),
        "{text}"
    );

    let mut bytes = ustar("big.bin", 1 << 20);
    bytes.extend_from_slice(&[5u8; 100]);
    let text = read_err(&bytes, "big.tar").to_string();
    assert!(
        text.contains("big.bin") && text.contains("truncated"),
        "{text}"
    );

    let opts = WdsReadOptions {
        max_member_size: 10,
        ..WdsReadOptions::default()
    };
    let mut bytes = ustar("k.bin", 11);
    bytes.extend_from_slice(&[0u8; 512 + 1024]);
    let err = WdsReader::with_options(&bytes[..], "small.tar", opts)
        .unwrap()
        .find_map(Result::err)
        .unwrap();
    assert!(err.to_string().contains("exceeds the limit of 10"), "{err}");
}

#[test]
fn escaping_member_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (i, name) in ["../evil.txt", "/abs.txt", "a/../../x.txt"]
        .iter()
        .enumerate()
    {
        let path = dir.path().join(format!("bad{i}.tar"));
        let script = r#"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w") as t:
    ti = tarfile.TarInfo(sys.argv[2]); ti.size = 1
    t.addfile(ti, io.BytesIO(b"x"))
"#;
        run_python(script, &[path.to_str().unwrap(), name], &[]);
        let err = WdsReader::open(&path, WdsReadOptions::default())
            .unwrap()
            .find_map(Result::err)
            .unwrap();
        assert!(
            matches!(&err, FormatError::UnsafePath { name: n, .. } if n == name),
            "{err}"
        );
        assert!(err.to_string().contains(&format!("bad{i}.tar")), "{err}");
    }
}

#[test]
fn duplicate_extension_in_a_sample_is_an_error() {
    let mut bytes = Vec::new();
    for _ in 0..2 {
        bytes.extend_from_slice(&ustar("k.txt", 1));
        bytes.push(b'x');
        bytes.resize(bytes.len() + 511, 0);
    }
    bytes.resize(bytes.len() + 1024, 0);
    let text = read_err(&bytes, "dup.tar").to_string();
    assert!(
        text.contains("dup.tar") && text.contains("duplicate"),
        "{text}"
    );
}

#[test]
fn garbage_and_xz_inputs_are_clear_errors() {
    let text = read_err(&[7u8; 2048], "junk.tar").to_string();
    assert!(
        text.contains("junk.tar") && text.contains("checksum"),
        "{text}"
    );
    let xz = [0xfd, b'7', b'z', b'X', b'Z', 0, 0, 0];
    let err = WdsReader::new(&xz[..], "x.tar.xz").err().unwrap();
    assert!(matches!(err, FormatError::Unsupported { .. }), "{err}");
    // An empty stream is an empty shard.
    assert_eq!(WdsReader::new(&[][..], "empty.tar").unwrap().count(), 0);
}

#[test]
fn zstd_compressed_shards_are_read() {
    let mut w = TarWriter::new(Vec::new());
    for s in our_samples(2) {
        w.write(&s).unwrap();
    }
    let tar = w.finish().unwrap();
    let compressed = zstd::encode_all(&tar[..], 3).unwrap();
    let samples: Vec<WdsSample> = WdsReader::new(&compressed[..], "z.tar.zst")
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[1].get("txt"), Some(&b"text 1"[..]));
}
