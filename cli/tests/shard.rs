//! `shard` from every raw input kind, read back with `cat --json`, `inspect`, `verify`, and by the
//! real mosaicml-streaming, webdataset and torchvision packages.

use crate::common;
use common::*;
use serde_json::{json, Value};

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_folder_of_files_round_trips_through_mds() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("in"), dir.path().join("out"));
    files_tree(&input, 30, 500);
    let summary: Value = serde_json::from_str(
        &run(&[
            "shard",
            s(&input),
            s(&out),
            "--shard-size",
            "4kb",
            "--workers",
            "3",
            "--json",
        ])
        .ok()
        .stdout,
    )
    .unwrap();
    assert_eq!(summary["samples"], 30);
    assert_eq!(summary["input_format"], "files");
    assert!(summary["shards"].as_u64().unwrap() > 3, "{summary}");

    let rows = cat_json(s(&out), &[]);
    let mut expected: Vec<String> = listing(&input);
    expected.sort();
    assert_eq!(rows.len(), 30);
    for (row, rel) in rows.iter().zip(&expected) {
        assert_eq!(row["path"], json!(rel));
        let data = std::fs::read(input.join(rel)).unwrap();
        assert_eq!(row["data"], json!({"$type": "bytes", "hex": hex(&data)}));
    }

    let report: Value =
        serde_json::from_str(&run(&["inspect", s(&out), "--json"]).ok().stdout).unwrap();
    assert_eq!(report["format"], "mds");
    assert_eq!(report["samples"], 30);
    assert_eq!(report["compression"], json!(["zstd"]));
    assert_eq!(report["hashes"], json!(["xxh64"]));
    assert_eq!(
        report["columns"][0],
        json!({"name": "data", "encoding": "bytes", "size": null})
    );
    assert!(run(&["verify", s(&out)]).ok().stdout.starts_with("ok:"));

    // mosaicml-streaming reads the same samples in the same order, checking the xxh64 hashes.
    let script = "import json, sys\n\
                  from streaming import StreamingDataset\n\
                  ds = StreamingDataset(local=sys.argv[1], shuffle=False, validate_hash='xxh64')\n\
                  print(json.dumps([[ds[i]['path'], ds[i]['data'].hex()] for i in range(len(ds))]))\n";
    let mosaic: Vec<(String, String)> =
        serde_json::from_str(&run_python(script, &[s(&out)])).unwrap();
    let ours: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_string(),
                r["data"]["hex"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(mosaic, ours);
}

#[test]
fn an_imagefolder_becomes_jpeg_label_path() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("in"), dir.path().join("out"));
    let jpeg = |i: u8| [&[0xFF, 0xD8, 0xFF, 0xE0][..], &[i; 20]].concat();
    for (rel, i) in [
        ("dog/1.jpg", 1),
        ("cat/2.jpg", 2),
        ("cat/x/3.jpeg", 3),
        ("ant/4.JPG", 4),
    ] {
        write(&input, rel, &jpeg(i));
    }
    run(&["shard", s(&input), s(&out)]).ok();
    let rows = cat_json(s(&out), &[]);
    let got: Vec<(String, i64, String)> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["image"]["$type"], "jpeg");
            (
                r["path"].as_str().unwrap().to_string(),
                r["label"].as_i64().unwrap(),
                r["image"]["hex"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("ant/4.JPG", 0, 4),
        ("cat/2.jpg", 1, 2),
        ("cat/x/3.jpeg", 1, 3),
        ("dog/1.jpg", 2, 1),
    ];
    let want: Vec<(String, i64, String)> = want
        .iter()
        .map(|(p, l, i)| (p.to_string(), *l, hex(&jpeg(*i))))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn jsonl_records_keep_their_types() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("data.jsonl"), dir.path().join("out"));
    std::fs::write(
        &input,
        "{\"id\": 1, \"text\": \"a\", \"score\": 0.5, \"ok\": true, \"tags\": [\"x\"]}\n\
         {\"id\": 2, \"text\": \"\u{e9}\", \"score\": 2, \"ok\": false, \"tags\": []}\n",
    )
    .unwrap();
    run(&["shard", s(&input), s(&out)]).ok();
    let rows = cat_json(s(&out), &[]);
    assert_eq!(
        rows,
        [
            json!({"id": 1, "text": "a", "score": {"$type": "float64", "value": 0.5},
                   "ok": {"$type": "uint8", "value": 1}, "tags": {"$type": "json", "value": ["x"]}}),
            json!({"id": 2, "text": "\u{e9}", "score": {"$type": "float64", "value": 2.0},
                   "ok": {"$type": "uint8", "value": 0}, "tags": {"$type": "json", "value": []}}),
        ]
    );
    let out2 = dir.path().join("out2");
    run(&[
        "shard",
        s(&input),
        s(&out2),
        "--columns",
        "id:str_int,score:float32",
    ])
    .ok();
    let rows = cat_json(s(&out2), &[]);
    assert_eq!(
        rows[1],
        json!({"id": {"$type": "str_int", "text": "2"}, "score": {"$type": "float32", "value": 2.0}})
    );
}

#[test]
fn a_jsonl_line_that_is_not_json_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(&input, "{\"a\": 1}\n{\"a\": 2}\n{\"a\": nope}\n").unwrap();
    let failed = run(&["shard", s(&input), s(&dir.path().join("out"))]).failed();
    let last = failed.stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("shardstream: error:"), "{}", failed.stderr);
    assert!(last.contains("bad.jsonl:3"), "{last}");
}

/// Tars written by the real `webdataset` package.
// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn python_tars(dir: &std::path::Path, shards: usize, per_shard: usize) {
    let script = "import sys, webdataset as wds\n\
                  root, shards, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n\
                  for s in range(shards):\n    \
                      with wds.TarWriter(f'{root}/train-{s:04d}.tar') as w:\n        \
                          for i in range(per):\n            \
                              n = s * per + i\n            \
                              w.write({'__key__': f'k{n:05d}', 'txt': f'text {n}', 'cls': n % 7, 'bin': bytes([n % 256]) * (n % 5 + 1)})\n";
    std::fs::create_dir_all(dir).unwrap();
    run_python(
        script,
        &[s(dir), &shards.to_string(), &per_shard.to_string()],
    );
}

#[test]
fn webdataset_tars_go_to_mds_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let (tars, mds, back) = (
        dir.path().join("tars"),
        dir.path().join("mds"),
        dir.path().join("back"),
    );
    python_tars(&tars, 3, 7);
    run(&["shard", s(&tars), s(&mds), "--shard-size", "1kb"]).ok();
    let rows = cat_json(s(&mds), &[]);
    assert_eq!(rows.len(), 21);
    assert_eq!(rows[8]["__key__"], "k00008");
    assert_eq!(
        rows[8]["txt"],
        json!({"$type": "bytes", "hex": hex(b"text 8")})
    );
    assert_eq!(rows[8]["cls"], json!({"$type": "bytes", "hex": hex(b"1")}));
    // The tars themselves, read by `cat`, give the same rows.
    assert_eq!(cat_json(s(&tars), &[]), rows);
    let pattern = format!("{}/train-{{0000..0002}}.tar", s(&tars));
    assert_eq!(cat_json(&pattern, &[]), rows);

    run(&[
        "shard",
        s(&mds),
        s(&back),
        "--format",
        "wds",
        "--shard-size",
        "100",
    ])
    .ok();
    assert!(listing(&back).len() > 1, "{:?}", listing(&back));
    assert_eq!(cat_json(s(&back), &[]), rows);
    // webdataset reads our tars: same keys and bytes, in order.
    let script = "import sys, glob, json, webdataset as wds\n\
                  urls = sorted(glob.glob(sys.argv[1] + '/*.tar'))\n\
                  print(json.dumps([[s['__key__'], s['txt'].hex(), s['bin'].hex()] for s in wds.WebDataset(urls, shardshuffle=False)]))\n";
    let theirs: Vec<(String, String, String)> =
        serde_json::from_str(&run_python(script, &[s(&back)])).unwrap();
    let ours: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            let h = |c: &str| r[c]["hex"].as_str().unwrap().to_string();
            (
                r["__key__"].as_str().unwrap().to_string(),
                h("txt"),
                h("bin"),
            )
        })
        .collect();
    assert_eq!(theirs, ours);
}

#[test]
fn parts_merged_equal_a_single_run_and_mosaics_merge() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("data.jsonl");
    let lines: String = (0..100)
        .map(|i| format!("{{\"id\": {i}, \"text\": \"row {i}\"}}\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let (single, parts) = (dir.path().join("single"), dir.path().join("parts"));
    run(&["shard", s(&input), s(&single), "--shard-size", "600"]).ok();
    for part in ["0/3", "1/3", "2/3"] {
        run(&[
            "shard",
            s(&input),
            s(&parts),
            "--shard-size",
            "600",
            "--part",
            part,
        ])
        .ok();
    }
    assert!(parts.join("1/index.json").exists());
    run(&["merge-index", s(&parts)]).ok();
    let merged = cat_json(s(&parts), &[]);
    assert_eq!(merged.len(), 100);
    assert_eq!(merged, cat_json(s(&single), &[]));
    run(&["verify", s(&parts)]).ok();

    // Mosaic's merge_index over the same parts writes the same index.json, byte for byte.
    let ours = std::fs::read_to_string(parts.join("index.json")).unwrap();
    std::fs::remove_file(parts.join("index.json")).unwrap();
    run_python(
        "import sys\nfrom streaming.base.util import merge_index\nmerge_index(sys.argv[1])\n",
        &[s(&parts)],
    );
    assert_eq!(
        std::fs::read_to_string(parts.join("index.json")).unwrap(),
        ours
    );
}

/// Parts sharded with `--binary-index` merge into a root `index.ssx` that mirrors the merged
/// `index.json` (so a reader of the root uses it), and the samples read through it are a
/// single run's.
#[test]
fn parts_with_a_binary_index_merge_into_a_root_binary_index() {
    use shardstream_sharding::mds::index_bin;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("data.jsonl");
    let lines: String = (0..60)
        .map(|i| format!("{{\"id\": {i}, \"text\": \"row {i}\"}}\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let (single, parts) = (dir.path().join("single"), dir.path().join("parts"));
    run(&["shard", s(&input), s(&single), "--shard-size", "600"]).ok();
    for part in ["0/2", "1/2"] {
        run(&[
            "shard",
            s(&input),
            s(&parts),
            "--shard-size",
            "600",
            "--part",
            part,
            "--binary-index",
        ])
        .ok();
    }
    assert!(parts.join("0/index.ssx").exists());
    let summary: Value =
        serde_json::from_str(&run(&["merge-index", s(&parts), "--json"]).ok().stdout).unwrap();
    assert_eq!(summary["binary_index"], json!(true));
    let json_bytes = std::fs::read(parts.join("index.json")).unwrap();
    let bin = std::fs::read(parts.join("index.ssx")).unwrap();
    index_bin::verify_against_json("index.ssx", &bin, &json_bytes).unwrap();
    let view = index_bin::IndexView::parse("index.ssx", bin).unwrap();
    assert!(view
        .shard_info("index.ssx", 0)
        .unwrap()
        .raw_data
        .basename
        .starts_with("0/"));
    assert_eq!(cat_json(s(&parts), &[]), cat_json(s(&single), &[]));

    // Without the flag and without a part's index.ssx, no root index.ssx.
    let plain = dir.path().join("plain");
    for part in ["0/2", "1/2"] {
        run(&["shard", s(&input), s(&plain), "--part", part]).ok();
    }
    run(&["merge-index", s(&plain)]).ok();
    assert!(!plain.join("index.ssx").exists());
}

#[test]
fn webdataset_parts_keep_the_single_run_order() {
    let dir = tempfile::tempdir().unwrap();
    let (tars, single, parts) = (
        dir.path().join("tars"),
        dir.path().join("single"),
        dir.path().join("parts"),
    );
    python_tars(&tars, 2, 10);
    run(&["shard", s(&tars), s(&single), "--format", "wds"]).ok();
    for part in ["0/3", "1/3", "2/3"] {
        run(&[
            "shard",
            s(&tars),
            s(&parts),
            "--format",
            "wds",
            "--part",
            part,
        ])
        .ok();
    }
    assert_eq!(cat_json(s(&parts), &[]), cat_json(s(&single), &[]));
    assert_eq!(cat_json(s(&single), &[]), cat_json(s(&tars), &[]));
}

#[test]
fn an_existing_dataset_is_kept_unless_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("in"), dir.path().join("out"));
    files_tree(&input, 3, 10);
    run(&["shard", s(&input), s(&out)]).ok();
    let failed = run(&["shard", s(&input), s(&out)]).failed();
    assert!(failed.stderr.contains("--overwrite"), "{}", failed.stderr);
    run(&[
        "shard",
        s(&input),
        s(&out),
        "--overwrite",
        "--compression",
        "none",
        "--hashes",
        "sha1,xxh64",
    ])
    .ok();
    let report: Value =
        serde_json::from_str(&run(&["inspect", s(&out), "--json"]).ok().stdout).unwrap();
    assert_eq!(report["compression"], json!([]));
    assert_eq!(report["hashes"], json!(["sha1", "xxh64"]));
}

#[test]
fn cat_start_and_limit_select_a_window() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("d.jsonl"), dir.path().join("out"));
    let lines: String = (0..50).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    run(&["shard", s(&input), s(&out), "--shard-size", "200"]).ok();
    let stdout = run(&["cat", s(&out), "--json", "--start", "17", "--limit", "3"])
        .ok()
        .stdout;
    assert_eq!(stdout, "{\"id\":17}\n{\"id\":18}\n{\"id\":19}\n");
    let text = run(&["cat", s(&out), "--start", "49"]).ok().stdout;
    assert_eq!(text, "--- sample 49\nid: 49\n");
}

#[test]
fn a_litdata_dataset_is_read_and_converted() {
    let dir = tempfile::tempdir().unwrap();
    let (lit, mds) = (dir.path().join("lit"), dir.path().join("mds"));
    let script = "import sys\n\
                  from litdata.streaming.writer import BinaryWriter\n\
                  w = BinaryWriter(sys.argv[1], chunk_size=4)\n\
                  for i in range(10):\n    \
                      w[i] = {'id': i, 'name': f'n{i}', 'score': i / 4, 'ok': i % 3 == 0}\n\
                  w.done()\n\
                  w.merge(1)\n";
    run_python(script, &[s(&lit)]);
    let rows = cat_json(s(&lit), &[]);
    assert_eq!(rows.len(), 10);
    assert_eq!(
        rows[6],
        json!({"id": 6, "name": "n6", "score": 1.5, "ok": true})
    );
    let report: Value =
        serde_json::from_str(&run(&["inspect", s(&lit), "--json"]).ok().stdout).unwrap();
    assert_eq!(
        (report["format"].as_str(), report["shards"].as_u64()),
        (Some("litdata"), Some(3))
    );
    run(&["verify", s(&lit)]).ok();

    run(&["shard", s(&lit), s(&mds)]).ok();
    let converted = cat_json(s(&mds), &[]);
    assert_eq!(
        converted[6],
        json!({"id": 6, "name": "n6", "score": {"$type": "float64", "value": 1.5}, "ok": {"$type": "uint8", "value": 1}})
    );
    let chunk = listing(&lit)
        .into_iter()
        .find(|f| f.starts_with("chunk-"))
        .unwrap();
    std::fs::remove_file(lit.join(&chunk)).unwrap();
    let failed = run(&["verify", s(&lit)]).failed();
    assert!(
        failed.stderr.contains(&chunk) && failed.stderr.contains("missing"),
        "{}",
        failed.stderr
    );
}
