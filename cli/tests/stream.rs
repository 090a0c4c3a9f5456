//! `shardstream stream`: one epoch of one rank from a local folder (read in place) and from a
//! real S3 server (moto), with its figures in text and JSON, the Prometheus endpoint scraped
//! while it runs, a warm second run that fetches nothing, and a clear failure on a bad path.

use crate::common;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;
use shardstream_storage::testing::{free_port, MotoServer};

const FILES: u64 = 60;

// A failed set-up step panics with its message, as a test would.
#[allow(clippy::unwrap_used)]
fn dataset(dir: &Path) -> std::path::PathBuf {
    let (input, out) = (dir.join("in"), dir.join("out"));
    files_tree(&input, FILES as usize, 2000);
    run(&["shard", s(&input), s(&out), "--shard-size", "16kb"]).ok();
    out
}

#[allow(clippy::unwrap_used)]
fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap()
}

#[test]
fn local_folder_one_epoch_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = dataset(dir.path());
    let cache = dir.path().join("cache");
    let base = [
        "stream",
        s(&out),
        "--cache-root",
        s(&cache),
        "--run-id",
        "r1",
        "--node-rank",
        "0",
    ];
    let text = run(&base).ok().stdout;
    for needle in [
        "samples/s",
        "MB/s",
        "time to first sample",
        "peak RSS",
        "fetched",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert!(text.starts_with(&format!("{FILES} samples")), "{text}");

    // Two processes, shuffled: together they read every sample once.
    let mut total = 0;
    for rank in ["0", "1"] {
        let mut args = base.to_vec();
        args.extend([
            "--json",
            "--shuffle",
            "--nproc-per-node",
            "2",
            "--local-rank",
            rank,
            "--window",
            "2",
        ]);
        let report = json(&run(&args).ok());
        total += report["samples"].as_u64().unwrap();
        // Read in place: nothing fetched, nothing copied.
        assert_eq!(report["fetch_bytes"], 0);
        assert!(report["peak_rss_bytes"].as_u64().unwrap() > 0);
        assert!(report["time_to_first_sample_sec"].as_f64().unwrap() >= 0.0);
        assert!(report["samples_per_sec"].as_f64().unwrap() > 0.0);
        assert!(report["cache_dir"].as_str().unwrap().ends_with("r1/0"));
    }
    assert_eq!(total, FILES);
}

#[test]
fn missing_dataset_fails_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere");
    let failed = run(&[
        "stream",
        s(&missing),
        "--run-id",
        "r",
        "--cache-root",
        s(dir.path()),
    ])
    .failed();
    let last = failed.stderr.lines().last().unwrap_or_default().to_string();
    assert!(last.contains("nowhere"), "{}", failed.stderr);
}

#[test]
fn s3_cold_then_warm_with_metrics_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dataset(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(MotoServer::start()).unwrap();
    rt.block_on(server.create_bucket("data")).unwrap();
    let env = vec![
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    run_env(&["upload", s(&out), "s3://data/ds"], &env).ok();
    let stored: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "index.json")
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let cache = dir.path().join("cache");
    let port = free_port().unwrap();
    let addr = format!("127.0.0.1:{port}");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardstream"));
    cmd.args([
        "stream",
        "s3://data/ds",
        "--cache-root",
        s(&cache),
        "--run-id",
        "r2",
        "--node-rank",
        "0",
        "--memory-limit",
        "1MiB",
        "--json",
        "--metrics-addr",
        &addr,
        "--metrics-linger",
        "30",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") || k == "S3_ENDPOINT_URL" {
            cmd.env_remove(k);
        }
    }
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let report: Value = serde_json::from_str(&line).unwrap();
    // Scrape while the command lingers.
    let mut conn = TcpStream::connect(&addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    assert_eq!(report["samples"], FILES);
    assert_eq!(
        report["fetch_bytes"].as_u64().unwrap(),
        stored,
        "each shard fetched once"
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        reply.contains(&format!("\nshardstream_fetch_bytes_total {stored}\n")),
        "{reply}"
    );
    assert!(
        reply.contains(&format!("\nshardstream_samples_total {FILES}\n")),
        "{reply}"
    );
    assert!(reply.contains("# TYPE shardstream_consumer_stall_seconds_total counter"));

    // Warm: the same run and node find every shard in the cache.
    let warm = run_env(
        &[
            "stream",
            "s3://data/ds",
            "--cache-root",
            s(&cache),
            "--run-id",
            "r2",
            "--node-rank",
            "0",
            "--json",
        ],
        &env,
    )
    .ok();
    let warm = json(&warm);
    assert_eq!(warm["samples"], FILES);
    assert_eq!(warm["fetch_bytes"], 0);
    assert!(warm["cache_hits"].as_u64().unwrap() > 0);
}
