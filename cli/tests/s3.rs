//! The CLI against a real S3 server (moto on 127.0.0.1): `shard` straight to `s3://`, then
//! `verify`, `cat`, `inspect`, `merge-index`, `upload` and `download` on it.

use crate::common;
use bytes::Bytes;
use common::*;
use serde_json::Value;
use shardstream_storage::testing::MotoServer;

struct S3 {
    runtime: tokio::runtime::Runtime,
    server: MotoServer,
}

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
impl S3 {
    fn start(bucket: &str) -> S3 {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let server = runtime.block_on(MotoServer::start()).unwrap();
        runtime.block_on(server.create_bucket(bucket)).unwrap();
        S3 { runtime, server }
    }

    /// The environment the binary needs to reach the server.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.server.endpoint()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    fn run(&self, args: &[&str]) -> Run {
        run_env(args, &self.env())
    }

    fn keys(&self, url: &str) -> Vec<String> {
        let location = self.server.open(url).unwrap();
        self.runtime
            .block_on(location.list(""))
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect()
    }

    fn put(&self, url: &str, rel: &str, data: &[u8]) {
        let location = self.server.open(url).unwrap();
        self.runtime
            .block_on(location.put(rel, Bytes::copy_from_slice(data)))
            .unwrap();
    }
}

#[test]
fn shard_to_s3_then_verify_inspect_and_cat_from_s3() {
    let s3 = S3::start("data");
    let dir = tempfile::tempdir().unwrap();
    let (input, local) = (dir.path().join("in"), dir.path().join("local"));
    files_tree(&input, 60, 700);
    let url = "s3://data/sets/files";
    s3.run(&[
        "shard",
        s(&input),
        url,
        "--shard-size",
        "8kb",
        "--workers",
        "4",
    ])
    .ok();
    let keys = s3.keys(url);
    assert!(keys.contains(&"index.json".to_string()), "{keys:?}");
    assert!(
        keys.iter().filter(|k| k.ends_with(".mds.zstd")).count() > 3,
        "{keys:?}"
    );
    assert!(s3.run(&["verify", url]).ok().stdout.starts_with("ok:"));
    let report: Value =
        serde_json::from_str(&s3.run(&["inspect", url, "--json"]).ok().stdout).unwrap();
    assert_eq!(report["samples"], 60);

    run(&["shard", s(&input), s(&local), "--shard-size", "8kb"]).ok();
    let from_s3 = cat_json(url, &s3.env());
    assert_eq!(from_s3.len(), 60);
    assert_eq!(from_s3, cat_json(s(&local), &[]));

    // A remote dataset as `shard` input is fetched first, then converted like a local one.
    let copy = dir.path().join("copy");
    s3.run(&["shard", url, s(&copy), "--compression", "none"])
        .ok();
    assert_eq!(cat_json(s(&copy), &[]), from_s3);

    // A corrupt remote shard is named by its URL.
    let victim = keys.iter().find(|k| k.ends_with(".mds.zstd")).unwrap();
    s3.put(url, victim, b"not zstd at all");
    let failed = s3.run(&["verify", url]).failed();
    assert!(
        failed.stderr.contains(&format!("{url}/{victim}")),
        "{}",
        failed.stderr
    );
}

#[test]
fn parts_written_to_s3_merge_there() {
    let s3 = S3::start("parts");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("d.jsonl");
    let lines: String = (0..45)
        .map(|i| format!("{{\"id\": {i}, \"v\": [{i}, 1]}}\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let url = "s3://parts/ds";
    for part in ["0/3", "1/3", "2/3"] {
        s3.run(&[
            "shard",
            s(&input),
            url,
            "--part",
            part,
            "--shard-size",
            "300",
        ])
        .ok();
    }
    let merged: Value =
        serde_json::from_str(&s3.run(&["merge-index", url, "--json"]).ok().stdout).unwrap();
    assert_eq!(merged["parts"], serde_json::json!(["0", "1", "2"]));
    assert_eq!(merged["samples"], 45);
    let rows = cat_json(url, &s3.env());
    let ids: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, (0..45).collect::<Vec<_>>());
    s3.run(&["verify", url]).ok();
}

#[test]
fn upload_and_download_are_resumable_and_verified() {
    let s3 = S3::start("sync");
    let dir = tempfile::tempdir().unwrap();
    let (input, ds, back) = (
        dir.path().join("in"),
        dir.path().join("ds"),
        dir.path().join("back"),
    );
    files_tree(&input, 30, 900);
    run(&["shard", s(&input), s(&ds), "--shard-size", "6kb"]).ok();
    let url = "s3://sync/copy";
    let first: Value =
        serde_json::from_str(&s3.run(&["upload", s(&ds), url, "--json"]).ok().stdout).unwrap();
    let files = listing(&ds).len() as u64;
    assert_eq!(first["transferred"], files);
    assert_eq!(first["verified_mds"], true);
    let again: Value =
        serde_json::from_str(&s3.run(&["upload", s(&ds), url, "--json"]).ok().stdout).unwrap();
    // Only index.json (always sent last) goes again.
    assert_eq!(again["transferred"], 1);
    assert_eq!(again["skipped"], files - 1);

    let down: Value =
        serde_json::from_str(&s3.run(&["download", url, s(&back), "--json"]).ok().stdout).unwrap();
    assert_eq!(down["transferred"], files);
    assert_eq!(listing(&back), listing(&ds));
    for f in listing(&ds) {
        assert_eq!(
            std::fs::read(ds.join(&f)).unwrap(),
            std::fs::read(back.join(&f)).unwrap(),
            "{f}"
        );
    }
    // Resume: a deleted file comes back, the rest is skipped.
    let gone = listing(&back)
        .into_iter()
        .find(|f| f.starts_with("shard."))
        .unwrap();
    std::fs::remove_file(back.join(&gone)).unwrap();
    let resumed: Value =
        serde_json::from_str(&s3.run(&["download", url, s(&back), "--json"]).ok().stdout).unwrap();
    assert_eq!(resumed["transferred"], 1);
    assert!(back.join(&gone).exists());

    // A corrupt local shard is never uploaded.
    let victim = ds.join(&gone);
    std::fs::write(&victim, b"corrupt").unwrap();
    let failed = s3.run(&["upload", s(&ds), "s3://sync/other"]).failed();
    assert!(
        failed.stderr.contains(&gone) && failed.stderr.contains("not uploading"),
        "{}",
        failed.stderr
    );
    assert!(s3.keys("s3://sync/other").is_empty());
}

#[test]
fn webdataset_output_on_s3_reads_back() {
    let s3 = S3::start("wds");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("d.jsonl");
    let lines: String = (0..25)
        .map(|i| format!("{{\"txt\": \"row {i}\", \"cls\": {i}}}\n"))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let url = "s3://wds/tars";
    s3.run(&[
        "shard",
        s(&input),
        url,
        "--format",
        "wds",
        "--shard-size",
        "60",
    ])
    .ok();
    let keys = s3.keys(url);
    assert!(
        keys.len() > 2 && keys.iter().all(|k| k.ends_with(".tar")),
        "{keys:?}"
    );
    let rows = cat_json(url, &s3.env());
    assert_eq!(rows.len(), 25);
    assert_eq!(rows[3]["__key__"], "000003");
    assert_eq!(rows[3]["cls"]["hex"], "33");
    let pattern = format!("{url}/shard-{{000000..000001}}.tar");
    assert!(cat_json(&pattern, &s3.env()).len() < 25);
    s3.run(&["verify", url]).ok();
}
