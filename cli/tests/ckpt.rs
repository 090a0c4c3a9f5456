//! `shardstream ckpt ls|latest|verify|gc|download`: one test body run against a local directory
//! and against a real S3 server (moto on 127.0.0.1), on checkpoints written by the checkpoint
//! crate, with an unfinished save beside them.

// Set-up steps panic with their message, as the tests themselves do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use bytes::Bytes;
use common::*;
use serde_json::Value;
use shardstream_checkpoint::{CheckpointRoot, CommitRequest, UploadConfig};
use shardstream_storage::testing::MotoServer;
use shardstream_storage::Location;

/// The bytes of file `k` of rank `r` of step `step`; 6 MiB so that with 5 MiB parts (S3's
/// minimum) the files are multipart uploads.
fn payload(step: u64, r: u32, k: u32) -> Vec<u8> {
    (0..6 << 20)
        .map(|i: u32| (i.wrapping_mul(31) ^ (step as u32) ^ (r << 3) ^ k) as u8)
        .collect()
}

/// Saves `step_<n>` for each n in `steps` (2 ranks x 2 files + a `.metadata`), then leaves an
/// uncommitted attempt of `step_99`.
async fn populate(root: &CheckpointRoot, steps: &[u64]) {
    let config = UploadConfig {
        part_size: 5 << 20,
        memory_budget: 16 << 20,
        // Multipart, as real files of this layout would be (a 6 MiB file is one PUT otherwise).
        single_put_max: 0,
        ..Default::default()
    };
    for &step in steps {
        let attempt = root.begin_save(&format!("step_{step}")).await.unwrap();
        let mut records = Vec::new();
        for r in 0..2u32 {
            let w = root.rank_writer(&attempt, r, &config).unwrap();
            for k in 0..2u32 {
                let data = Bytes::from(payload(step, r, k));
                records.push(
                    w.upload_bytes(&format!("__{r}_{k}.distcp"), data)
                        .await
                        .unwrap(),
                );
            }
        }
        let w = root.rank_writer(&attempt, 0, &config).unwrap();
        records.push(
            w.upload_bytes(".metadata", Bytes::from_static(b"dcp metadata"))
                .await
                .unwrap(),
        );
        let req = CommitRequest {
            records,
            world_size: 2,
            aliases: vec![(".metadata".into(), ".metadata".into())],
            ..Default::default()
        };
        root.commit(&attempt, req).await.unwrap();
    }
    // A save killed before its manifest: files only.
    let attempt = root.begin_save("step_99").await.unwrap();
    let w = root.rank_writer(&attempt, 0, &config).unwrap();
    w.upload_bytes("__0_0.distcp", Bytes::from(payload(99, 0, 0)))
        .await
        .unwrap();
}

/// Flips one byte of rank 1's second file of `id` in place (through the storage layer).
async fn corrupt(location: &Location, root: &CheckpointRoot, id: &str) -> String {
    let manifest = root.read_manifest(id).await.unwrap();
    let rec = manifest
        .files
        .iter()
        .find(|f| f.path.ends_with("__1_1.distcp"))
        .unwrap();
    let rel = format!("{id}/{}", rec.path);
    let mut data = location
        .get_range(&rel, 0..rec.size)
        .await
        .unwrap()
        .to_vec();
    data[(1 << 20) + 17] ^= 0x40;
    location.put(&rel, Bytes::from(data)).await.unwrap();
    rec.path.clone()
}

fn json(run: Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// The body both configurations run. `url` is the root as the CLI sees it.
fn exercise(url: &str, location: &Location, env: &[(&str, String)], dl: &std::path::Path) {
    let root = &CheckpointRoot::from_location(location);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cli = |args: &[&str]| run_env(args, env);

    // latest of an empty root: non-zero with a one-line reason.
    let r = cli(&["ckpt", "latest", url]).failed();
    assert!(r.stderr.contains("no committed checkpoint"), "{}", r.stderr);

    rt.block_on(populate(root, &[1, 2, 3]));

    // ls: the three committed checkpoints in step order; the unfinished step_99 is not one.
    let ls = json(cli(&["ckpt", "ls", url, "--json"]).ok());
    let ids: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["step_1", "step_2", "step_3"]);
    assert_eq!(ls[0]["world_size"], 2);
    assert_eq!(ls[0]["total_bytes"], 4 * (6 << 20) + 12);
    let text = cli(&["ckpt", "ls", url]).ok().stdout;
    assert_eq!(text.lines().count(), 3, "{text}");

    // latest
    let latest = cli(&["ckpt", "latest", url]).ok().stdout;
    assert_eq!(
        latest.trim(),
        format!("{}/step_3", url.trim_end_matches('/'))
    );
    assert_eq!(
        json(cli(&["ckpt", "latest", url, "--json"]).ok())["step"],
        3
    );

    // verify: the latest by default, every byte; then a flipped byte is found and named.
    let v = json(cli(&["ckpt", "verify", url, "--json"]).ok());
    assert_eq!(
        (v["id"].as_str(), v["ok"].as_bool()),
        (Some("step_3"), Some(true))
    );
    // the data files, .metadata and its root alias
    assert_eq!(v["bytes_checked"], 4 * (6 << 20) + 12 + 12);
    let bad = rt.block_on(corrupt(location, root, "step_2"));
    let r = cli(&["ckpt", "verify", url, "step_2"]).failed();
    assert!(
        r.stdout.contains(&bad) && r.stdout.contains("checksum mismatch"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("step_2") && r.stderr.contains("1 problem"),
        "{}",
        r.stderr
    );

    // download: every file checked on the way; a corrupt checkpoint is refused...
    let r = cli(&[
        "ckpt",
        "download",
        url,
        dl.join("step_2").to_str().unwrap(),
        "--id",
        "step_2",
    ])
    .failed();
    assert!(r.stderr.contains(&bad), "{}", r.stderr);
    // ...and the latest lands as a committed checkpoint that verifies locally.
    let out = dl.join("step_3");
    let d = json(cli(&["ckpt", "download", url, s(&out), "--json"]).ok());
    assert_eq!(
        (d["id"].as_str(), d["files"].as_u64()),
        (Some("step_3"), Some(6))
    );
    assert!(out.join("_shardstream_manifest.json").is_file() && out.join(".metadata").is_file());
    let manifest = rt.block_on(root.read_manifest("step_3")).unwrap();
    for f in manifest
        .files
        .iter()
        .filter(|f| f.path.ends_with("__1_0.distcp"))
    {
        assert_eq!(std::fs::read(out.join(&f.path)).unwrap(), payload(3, 1, 0));
    }
    assert!(
        json(run(&["ckpt", "verify", s(dl), "step_3", "--json"]).ok())["ok"]
            .as_bool()
            .unwrap()
    );

    // gc: a young unfinished save is kept; with --older-than 0s it goes too. --keep 1
    // --keep-every 2 keeps step_3 (latest) and step_2 (even); step_1 goes. Dry run first.
    let g = json(
        cli(&[
            "ckpt",
            "gc",
            url,
            "--keep",
            "1",
            "--keep-every",
            "2",
            "--dry-run",
            "--json",
        ])
        .ok(),
    );
    assert_eq!(g["deleted"], serde_json::json!(["step_1"]));
    assert_eq!(g["young_leftovers"], 1);
    assert_eq!(
        json(cli(&["ckpt", "ls", url, "--json"]).ok())
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let g = json(
        cli(&[
            "ckpt",
            "gc",
            url,
            "--keep",
            "1",
            "--keep-every",
            "2",
            "--older-than",
            "0s",
            "--json",
        ])
        .ok(),
    );
    assert_eq!(g["deleted"], serde_json::json!(["step_1"]));
    assert_eq!(g["kept"], serde_json::json!(["step_2", "step_3"]));
    assert_eq!(g["leftover_dirs_deleted"].as_array().unwrap().len(), 1);
    let ids: Vec<String> = json(cli(&["ckpt", "ls", url, "--json"]).ok())
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["step_2", "step_3"]);
    // What latest references survived whole.
    assert!(json(cli(&["ckpt", "verify", url, "--json"]).ok())["ok"]
        .as_bool()
        .unwrap());
    let r = cli(&["ckpt", "gc", url, "--older-than", "3x"]).failed();
    assert!(r.stderr.contains("unknown unit"), "{}", r.stderr);
}

#[test]
fn ckpt_commands_on_a_local_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let url = tmp.path().join("ckpts");
    std::fs::create_dir_all(&url).unwrap();
    let location = Location::open(s(&url)).unwrap();
    exercise(s(&url), &location, &[], &tmp.path().join("download"));
}

#[test]
fn ckpt_commands_on_s3() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(MotoServer::start()).unwrap();
    rt.block_on(server.create_bucket("ckpts")).unwrap();
    let url = "s3://ckpts/run/a";
    let location = server.open(url).unwrap();
    let env = vec![
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
    ];
    let tmp = tempfile::tempdir().unwrap();
    exercise(url, &location, &env, tmp.path());
}
