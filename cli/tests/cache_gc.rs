//! `shardstream cache gc` against folders made by real `shardstream run` processes: a finished
//! run's folder goes, a live run's (its `shardstream run` holds the lease) stays, whatever
//! `--older-than` says; `--older-than`, `--dry-run` and foreign folders.

#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up helpers outside #[test] fns

use crate::support;
use std::fs;
use std::time::Duration;

use serde_json::Value;
use support::{next_line, output, s, sh_wait_for_file, shardstream, spawn_piped, wait_for};

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `run --run-id RUN -- sh -c 'write a file into the cache; exit 0'` to completion.
fn finished_run(root: &std::path::Path, run_id: &str) {
    let (code, _, stderr) = output(&mut shardstream(&[
        "run",
        "--run-id",
        run_id,
        "--cache-root",
        &s(root),
        "--",
        "sh",
        "-c",
        r#"head -c 4096 /dev/zero > "$SHARDSTREAM_CACHE_DIR/shard.bin""#,
    ]));
    assert_eq!(code, 0, "{stderr}");
}

fn gc_json(root: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec!["cache", "gc", "--json"];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = output(shardstream(&args).env("SHARDSTREAM_CACHE_ROOT", root));
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

fn run_ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| match e {
            Value::String(s) => s.clone(),
            other => other["run_id"].as_str().unwrap().to_string(),
        })
        .collect()
}

#[test]
fn gc_removes_a_finished_run_and_keeps_a_live_one() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), "done");
    let go = root.path().join("go");
    let (mut live, mut lines) = spawn_piped(&mut shardstream(&[
        "run",
        "--run-id",
        "live",
        "--cache-root",
        &s(root.path()),
        "--",
        "sh",
        "-c",
        &format!(
            r#"head -c 4096 /dev/zero > "$SHARDSTREAM_CACHE_DIR/shard.bin"; echo ready; {}"#,
            sh_wait_for_file(&go)
        ),
    ]));
    assert_eq!(next_line(&mut lines), "ready");

    // No age limit: every run not in use goes; the live one is reported busy and stays.
    let report = gc_json(root.path(), &[]);
    assert_eq!(run_ids(&report["removed"]), vec!["done"]);
    assert!(report["removed"][0]["bytes"].as_u64().unwrap() >= 4096);
    assert_eq!(run_ids(&report["busy"]), vec!["live"]);
    assert!(!root.path().join("done").exists());
    assert!(root.path().join("live/0/shard.bin").exists());

    // Once the run is over, its folder can go too.
    fs::write(&go, "").unwrap();
    assert_eq!(wait_for(&mut live, LIMIT).code(), Some(0));
    let report = gc_json(root.path(), &[]);
    assert_eq!(run_ids(&report["removed"]), vec!["live"]);
    assert!(run_ids(&report["busy"]).is_empty());
    // Only the go file is left at the root: no leftovers of the gc.
    let left: Vec<_> = fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("go")]);
}

#[test]
fn older_than_keeps_recent_runs_dry_run_removes_nothing_foreign_stays() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path(), "recent");
    fs::create_dir_all(root.path().join("someone-elses/0")).unwrap();

    // Just finished: younger than a day, kept.
    let report = gc_json(root.path(), &["--older-than", "1d"]);
    assert!(run_ids(&report["removed"]).is_empty());
    assert_eq!(run_ids(&report["kept"]), vec!["recent"]);
    assert!(root.path().join("recent/0/shard.bin").exists());

    // A dry run reports it and removes nothing.
    let report = gc_json(root.path(), &["--dry-run"]);
    assert_eq!(report["dry_run"], true);
    assert_eq!(run_ids(&report["removed"]), vec!["recent"]);
    assert!(root.path().join("recent/0/shard.bin").exists());
    assert_eq!(
        report["foreign"],
        serde_json::json!([s(&root.path().join("someone-elses"))])
    );

    // The text report, for a person; the folder that is not ours survives a real gc.
    let (code, stdout, stderr) = output(&mut shardstream(&[
        "cache",
        "gc",
        "--cache-root",
        &s(root.path()),
        "--older-than",
        "0s",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed recent ("), "{stdout}");
    assert!(stdout.contains("left alone"), "{stdout}");
    assert!(!root.path().join("recent").exists());
    assert!(root.path().join("someone-elses/0").exists());

    // A bad duration is refused by the argument parser.
    let (code, _, stderr) = output(&mut shardstream(&[
        "cache",
        "gc",
        "--cache-root",
        &s(root.path()),
        "--older-than",
        "7 parsecs",
    ]));
    assert_eq!(code, 2);
    assert!(stderr.contains("--older-than"), "{stderr}");
}
