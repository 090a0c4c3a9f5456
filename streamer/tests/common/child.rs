//! Child processes for the multi-process tests: the test binary re-runs itself with a role in
//! the environment, streams one rank's part of an epoch from a moto server, checks every
//! sample's bytes, and writes what it saw (ids, metrics, peak RSS) as one JSON file.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value as Json};
use shardstream_streamer::order::{OrderConfig, Rank, World};
use shardstream_streamer::{StreamPlan, StreamingConfig, StreamingDataset};

use super::{check_sample, s3_location};

pub const ROLE: &str = "SHARDSTREAM_DS_TEST_ROLE";

/// What a child is told.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub endpoint: String,
    pub prefix: String,
    pub cache_root: PathBuf,
    pub processes: u32,
    pub rank: u32,
    pub memory_limit: u64,
    pub cache_limit: Option<u64>,
    pub shuffle: bool,
    pub sample_bytes: usize,
    pub out: PathBuf,
}

/// Starts the test `test` of this binary as a child streaming per `spec`.
pub fn spawn(test: &str, spec: &ChildSpec) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--nocapture", "--test-threads", "1"])
        .env(ROLE, "stream")
        .env("DS_ENDPOINT", &spec.endpoint)
        .env("DS_PREFIX", &spec.prefix)
        .env("DS_CACHE_ROOT", &spec.cache_root)
        .env("DS_PROCESSES", spec.processes.to_string())
        .env("DS_RANK", spec.rank.to_string())
        .env("DS_MEMORY", spec.memory_limit.to_string())
        .env("DS_SHUFFLE", if spec.shuffle { "1" } else { "0" })
        .env("DS_SAMPLE_BYTES", spec.sample_bytes.to_string())
        .env("DS_OUT", &spec.out)
        .stdout(Stdio::null());
    if let Some(limit) = spec.cache_limit {
        cmd.env("DS_CACHE_LIMIT", limit.to_string());
    }
    cmd.spawn().unwrap()
}

/// Waits for a child and reads its report.
pub fn wait(mut child: Child, out: &Path) -> Json {
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(out)
        .unwrap_or_else(|e| panic!("child exited {status} without a report ({e})"));
    let report: Json = serde_json::from_str(&text).unwrap();
    assert!(status.success(), "child failed ({status}): {report}");
    report
}

/// Peak resident set of this process (`VmHWM`), in bytes.
pub fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// Runs the child role if this process is a child; returns whether it was.
pub fn run_child() -> bool {
    if std::env::var(ROLE).is_err() {
        return false;
    }
    let var = |name: &str| std::env::var(name).unwrap();
    let out = PathBuf::from(var("DS_OUT"));
    let report = match stream(&var) {
        Ok(report) => report,
        Err(e) => json!({"error": e.to_string()}),
    };
    let failed = report.get("error").is_some();
    let mut f = std::fs::File::create(&out).unwrap();
    f.write_all(report.to_string().as_bytes()).unwrap();
    f.sync_all().unwrap();
    if failed {
        std::process::exit(3);
    }
    true
}

fn stream(var: &dyn Fn(&str) -> String) -> Result<Json, shardstream_streamer::StreamerError> {
    let sample_bytes: usize = var("DS_SAMPLE_BYTES").parse().unwrap();
    let config = StreamingConfig {
        remote: format!("s3://bucket/{}", var("DS_PREFIX")),
        cache_root: Some(PathBuf::from(var("DS_CACHE_ROOT"))),
        run_id: Some("run".into()),
        node_rank: Some(0),
        memory_limit: Some(var("DS_MEMORY").parse().unwrap()),
        cache_limit: std::env::var("DS_CACHE_LIMIT")
            .ok()
            .map(|v| v.parse().unwrap()),
        ..StreamingConfig::default()
    };
    let location = s3_location(&var("DS_ENDPOINT"), &var("DS_PREFIX"));
    let ds = StreamingDataset::open_at(config, location)?;
    let processes: u32 = var("DS_PROCESSES").parse().unwrap();
    let plan = StreamPlan {
        order: OrderConfig {
            seed: 3,
            shuffle: var("DS_SHUFFLE") == "1",
            window: 2,
            lanes: 1,
            ..OrderConfig::default()
        },
        epoch: 0,
        world: World::new(1, processes, 1, 4)?,
        rank: Rank {
            node: 0,
            local_process: var("DS_RANK").parse().unwrap(),
            worker: 0,
        },
        start: 0,
    };
    let mut ids = Vec::new();
    for item in ds.stream(plan)? {
        let item = item?;
        let sample = item.sample.decode()?;
        check_sample(item.index, &sample, sample_bytes);
        if !item.padding {
            ids.push(item.index);
        }
    }
    let m = ds.metrics();
    Ok(json!({
        "ids": ids,
        "fetch_bytes": m.fetch_bytes,
        "fetch_requests": m.fetch_requests,
        "shards_fetched": m.shards_fetched,
        "shards_joined": m.shards_joined,
        "cache_hits": m.cache_hits,
        "peak_rss": peak_rss(),
    }))
}
