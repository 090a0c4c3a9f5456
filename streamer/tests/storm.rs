//! The 503 storm: four nodes (child processes, each with its own cache and its own request
//! shaper) stream one epoch of a dataset whose shards share one prefix, through a proxy that
//! plays S3's per-prefix request limit (`LIMIT` requests per second, `503 SlowDown` past it)
//! in front of moto.
//!
//! With shaping on, the epoch completes with every sample exactly once and, after a warm-up,
//! the requests reaching the proxy (forwarded and throttled together) average under the limit
//! with few throttled. The same epoch with shaping off is run for the record (printed): the
//! nodes send several times the limit, and most of it is throttled.

#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers outside #[test] fns

use crate::common;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{check_sample, moto_with, runtime, write_dataset, Spec};
use serde_json::{json, Value as Json};
use shardstream_storage::shaping::ShapingConfig;
use shardstream_storage::testing::{options_for, test_env, FaultProxy};
use shardstream_storage::Location;
use shardstream_streamer::order::{OrderConfig, Rank, World};
use shardstream_streamer::{StreamPlan, StreamingConfig, StreamingDataset};

const ROLE: &str = "SHARDSTREAM_STORM_ROLE";
const NODES: u32 = 4;
/// Requests per second the proxy forwards per prefix.
const LIMIT: u64 = 30;
const WARM_UP: u64 = 3;
const TEST: &str = "storm::an_epoch_through_a_503_storm_completes_under_the_prefix_limit";

fn spec() -> Spec {
    Spec {
        shard_limit: 8 * 1024,
        ..Spec::small(1200)
    }
}

fn spawn_node(endpoint: &str, node: u32, shaping: bool, cache: &Path, out: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, "node")
        .env("STORM_ENDPOINT", endpoint)
        .env("STORM_NODE", node.to_string())
        .env("STORM_SHAPING", if shaping { "1" } else { "0" })
        .env("STORM_CACHE", cache)
        .env("STORM_OUT", out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The child: one node's share of the epoch; writes the ids it saw as JSON.
fn node_main() {
    let var = |name: &str| std::env::var(name).unwrap();
    let node: u32 = var("STORM_NODE").parse().unwrap();
    let shaping = if var("STORM_SHAPING") == "1" {
        ShapingConfig {
            start_rate: 200.0,
            // Four nodes' additive increases add up: 4/s per second in all.
            increase: 1.0,
            ..ShapingConfig::default()
        }
    } else {
        ShapingConfig {
            enabled: false,
            ..ShapingConfig::default()
        }
    };
    let options = options_for(&var("STORM_ENDPOINT")).with_shaping(shaping);
    let location = Location::open_with("s3://bucket/ds", &options, &test_env()).unwrap();
    let config = StreamingConfig {
        remote: "s3://bucket/ds".into(),
        cache_root: Some(PathBuf::from(var("STORM_CACHE"))),
        run_id: Some("storm".into()),
        node_rank: Some(node.into()),
        ..StreamingConfig::default()
    };
    let report = (|| -> Result<Json, shardstream_streamer::StreamerError> {
        let ds = StreamingDataset::open_at(config, location)?;
        let plan = StreamPlan {
            order: OrderConfig {
                seed: 5,
                shuffle: true,
                ..OrderConfig::default()
            },
            epoch: 0,
            world: World::new(NODES, 1, 1, 4)?,
            rank: Rank {
                node,
                local_process: 0,
                worker: 0,
            },
            start: 0,
        };
        let mut ids = Vec::new();
        for item in ds.stream(plan)? {
            let item = item?;
            check_sample(item.index, &item.sample.decode()?, spec().sample_bytes);
            if !item.padding {
                ids.push(item.index);
            }
        }
        Ok(json!({ "ids": ids }))
    })()
    .unwrap_or_else(|e| json!({ "error": e.to_string() }));
    std::fs::write(var("STORM_OUT"), report.to_string()).unwrap();
}

struct Epoch {
    reports: Vec<Json>,
    seconds: Vec<(u64, u64)>,
    took: Duration,
}

fn run_epoch(proxy: &FaultProxy, shaping: bool, deadline: Duration) -> Epoch {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let first = proxy.second();
    let started = Instant::now();
    let mut children: Vec<_> = (0..NODES)
        .map(|node| {
            let path = out.path().join(format!("{node}.json"));
            let child = spawn_node(&proxy.endpoint(), node, shaping, cache.path(), &path);
            (child, path)
        })
        .collect();
    for (child, _) in &mut children {
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > deadline {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let took = started.elapsed();
    let last = proxy.second();
    let windows = proxy.windows();
    let seconds = (first + WARM_UP..last)
        .map(|s| {
            windows
                .iter()
                .find(|w| w.second == s && w.prefix == "/bucket/ds/")
                .map_or((0, 0), |w| (w.forwarded + w.throttled, w.throttled))
        })
        .collect();
    let reports = children
        .iter()
        .map(|(_, path)| {
            std::fs::read_to_string(path)
                .map(|t| serde_json::from_str(&t).unwrap())
                .unwrap_or_else(|e| json!({ "error": format!("no report: {e}") }))
        })
        .collect();
    Epoch {
        reports,
        seconds,
        took,
    }
}

#[test]
fn an_epoch_through_a_503_storm_completes_under_the_prefix_limit() {
    if std::env::var(ROLE).is_ok() {
        node_main();
        return;
    }
    let rt = runtime();
    let data = tempfile::tempdir().unwrap();
    let spec = spec();
    write_dataset(data.path(), &spec);
    let server = moto_with(data.path(), &rt);
    let proxy = rt.block_on(FaultProxy::start(server.addr())).unwrap();
    proxy.set_rate_limit(LIMIT);

    let on = run_epoch(&proxy, true, Duration::from_secs(300));
    let off = run_epoch(&proxy, false, Duration::from_secs(30));
    let summary = |e: &Epoch| {
        let attempted: u64 = e.seconds.iter().map(|s| s.0).sum();
        let throttled: u64 = e.seconds.iter().map(|s| s.1).sum();
        let errors: Vec<_> = e.reports.iter().filter_map(|r| r.get("error")).collect();
        format!(
            "{:.1} s, {:.1} attempted/s, {throttled} of {attempted} throttled, errors {errors:?}\n    \
             (attempted, throttled) per second after {WARM_UP} s: {:?}",
            e.took.as_secs_f64(),
            attempted as f64 / e.seconds.len().max(1) as f64,
            e.seconds
        )
    };
    eprintln!(
        "{NODES} nodes, limit {LIMIT}/s per prefix\n  shaping on:  {}\n  shaping off: {}",
        summary(&on),
        summary(&off)
    );

    let mut seen = BTreeSet::new();
    for report in &on.reports {
        assert!(report.get("error").is_none(), "a node failed: {report}");
        for id in report["ids"].as_array().unwrap() {
            assert!(seen.insert(id.as_u64().unwrap()), "sample {id} twice");
        }
    }
    assert_eq!(seen.len() as u64, spec.samples, "samples missing");

    assert!(
        on.seconds.len() >= 2,
        "epoch too short to measure: {}",
        summary(&on)
    );
    let attempted: u64 = on.seconds.iter().map(|s| s.0).sum();
    let throttled: u64 = on.seconds.iter().map(|s| s.1).sum();
    let mean = attempted as f64 / on.seconds.len() as f64;
    assert!(
        mean <= LIMIT as f64 * 1.3,
        "shaped nodes averaged {mean:.1} requests/s over a limit of {LIMIT}/s: {}",
        summary(&on)
    );
    let tail = &on.seconds[on.seconds.len() / 2..];
    let tail_mean = tail.iter().map(|s| s.0).sum::<u64>() as f64 / tail.len() as f64;
    assert!(
        tail_mean <= LIMIT as f64,
        "the second half of the shaped epoch averaged {tail_mean:.1} requests/s, over the \
         limit of {LIMIT}/s: {}",
        summary(&on)
    );
    assert!(
        throttled * 4 <= attempted,
        "over a quarter of the shaped requests throttled: {}",
        summary(&on)
    );
}
