//! Datasets written by the real peers (`webdataset`, `litdata`) through the workspace's Python,
//! and what those peers' files hold, for the format tests of both views (also included by
//! `cli/tests/mount_formats.rs`, which uses part of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python with `webdataset` and `litdata`: `SHARDSTREAM_PYTHON`, else the workspace's
/// `.venv`.
pub fn python() -> PathBuf {
    std::env::var_os("SHARDSTREAM_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"),
        PathBuf::from,
    )
}

/// Runs `script` with `args`; returns its stdout.
pub fn run_python(script: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Writes, with `webdataset.TarWriter`, a plain `a-000.tar` (keys `s00000`..`s00003`) and a
/// gzipped `b-001.tar.gz` (keys `d/s00004`..`d/s00006`, in a folder inside the tar) into
/// `argv[1]`, members `cls`, `txt`, `seg.png`, `jpg`; prints, per tar in name order, its served
/// name, the sha256 and size of the (inflated) tar, and every regular member's name and bytes
/// (hex) in archive order, as `tarfile` reads them.
pub const WDS_WRITE_PY: &str = r#"
import gzip, hashlib, io, json, os, sys, tarfile
import webdataset as wds
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
def sample(key, i):
    return {"__key__": key, "cls": i % 3, "txt": f"sample {i} é",
            "seg.png": b"png-ish" + bytes([i]) * (i + 3), "jpg": bytes([255 - i]) * (100 * i + 1)}
with wds.TarWriter(os.path.join(root, "a-000.tar")) as w:
    for i in range(4):
        w.write(sample(f"s{i:05d}", i))
with wds.TarWriter(os.path.join(root, "b-001.tar.gz")) as w:
    for i in range(4, 7):
        w.write(sample(f"d/s{i:05d}", i))
out = []
for name in sorted(os.listdir(root)):
    raw = open(os.path.join(root, name), "rb").read()
    if name.endswith(".gz"):
        raw, name = gzip.decompress(raw), name[:-3]
    with tarfile.open(fileobj=io.BytesIO(raw)) as t:
        members = [[m.name, t.extractfile(m).read().hex()] for m in t if m.isfile()]
    out.append({"name": name, "sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw),
                "members": members})
print(json.dumps(out))
"#;

/// Writes 7 items `{"i": int, "s": str, "raw": bytes}` with litdata's `BinaryWriter` (what
/// `optimize` uses), 3 per chunk, into `argv[1]`.
pub const LITDATA_WRITE_PY: &str = r#"
import os, sys
from litdata.streaming.writer import BinaryWriter
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
w = BinaryWriter(root, chunk_size=3)
for i in range(7):
    w[i] = {"i": i, "s": f"item {i} é", "raw": bytes([i]) * (i + 1)}
w.done()
w.merge()
"#;

/// One tar as [`WDS_WRITE_PY`] reports it.
#[derive(Debug, serde::Deserialize)]
pub struct TarReport {
    pub name: String,
    pub sha256: String,
    pub size: u64,
    /// `(member name, bytes as hex)` in archive order.
    pub members: Vec<(String, String)>,
}

/// Writes the WebDataset set into `dir`; returns what its tars hold.
pub fn write_wds(dir: &Path) -> Vec<TarReport> {
    let dir = dir.to_str().unwrap();
    serde_json::from_str(&run_python(WDS_WRITE_PY, &[dir])).unwrap()
}

/// Writes the LitData dataset into `dir`.
pub fn write_litdata(dir: &Path) {
    run_python(LITDATA_WRITE_PY, &[dir.to_str().unwrap()]);
}
