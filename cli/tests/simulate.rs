//! The scale model against real runs: 8 "nodes" × 2 ranks (and 12 × 1 on 8 lanes) as
//! `shardstream stream` processes against moto, each node's processes behind their own request-counting proxy and
//! sharing their node's cache folder. The model (`shardstream-sim`, fed the same index.json and
//! world) must predict every node's shard GETs and bytes, and the amplification, within the
//! tolerance below; and `simulate` must print its report.

#![allow(clippy::unwrap_used, clippy::expect_used)] // the proxy and set-up helpers outside #[test] fns

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::common::*;
use shardstream_sim::SimConfig;
use shardstream_storage::testing::MotoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Requests (method and path) and the body bytes of their replies, seen by one proxy.
#[derive(Default, Debug)]
struct Seen {
    requests: Vec<(String, String, u64)>,
}

/// A TCP proxy that records every HTTP request line it forwards and the body bytes of its
/// reply. Requests here have no body (GETs of a read-only dataset) and replies carry a
/// `Content-Length`, so heads and bodies can be told apart on both sides of a connection,
/// and replies come in the order of their requests.
struct CountingProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_proxy(upstream: SocketAddr) -> CountingProxy {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shared = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let seen = Arc::clone(&shared);
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(upstream).await {
                    forward(client, server, seen).await;
                }
            });
        }
    });
    CountingProxy { addr, seen, task }
}

fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

fn content_length(head: &str) -> u64 {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn forward(client: TcpStream, server: TcpStream, seen: Arc<Mutex<Seen>>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Indices into `seen.requests` of this connection's requests still awaiting a reply.
    let queue = Arc::new(Mutex::new(std::collections::VecDeque::new()));
    let (up_seen, up_queue) = (Arc::clone(&seen), Arc::clone(&queue));
    let up = async move {
        let mut buf = vec![0u8; 64 << 10];
        let mut pending = Vec::new();
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = head_end(&pending) {
                let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                let mut line = head.lines().next().unwrap_or("").split(' ');
                let method = line.next().unwrap_or("").to_string();
                let path = line.next().unwrap_or("").to_string();
                let mut seen = up_seen.lock().unwrap();
                up_queue.lock().unwrap().push_back(seen.requests.len());
                seen.requests.push((method, path, 0));
                pending.drain(..end + 4);
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 << 10];
        let mut pending: Vec<u8> = Vec::new();
        let mut body_left = 0u64;
        while let Ok(n) = sr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&buf[..n]);
            loop {
                if body_left > 0 {
                    let take = body_left.min(pending.len() as u64);
                    pending.drain(..take as usize);
                    body_left -= take;
                    if body_left > 0 {
                        break;
                    }
                }
                let Some(end) = head_end(&pending) else {
                    break;
                };
                let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                pending.drain(..end + 4);
                body_left = content_length(&head);
                if let Some(i) = queue.lock().unwrap().pop_front() {
                    seen.lock().unwrap().requests[i].2 = body_left;
                }
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

const BATCH: u32 = 4;
const SEED: &str = "7";
/// Largest relative difference allowed between predicted and measured shard GETs and bytes,
/// per node and in total.
const TOLERANCE: f64 = 0.05;

#[test]
fn the_scale_model_predicts_what_8_nodes_of_2_ranks_fetch() {
    validate(8, 2, None);
}

/// 12 nodes on 8 lanes: each lane is read by 3 nodes (`nodes / gcd(nodes, lanes)`), the
/// shape a resize from 8 to 12 nodes leaves, so shards are downloaded about 3 times.
#[test]
fn the_scale_model_predicts_what_12_nodes_on_8_lanes_fetch() {
    validate(12, 1, Some(8));
}

/// Runs `NODES x RANKS` stream processes (lanes: the node count unless given) against moto
/// and compares each node's counts with the model's.
#[allow(non_snake_case)]
fn validate(NODES: u32, RANKS: u32, lanes: Option<u32>) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MotoServer::start()).unwrap();
    runtime.block_on(server.create_bucket("data")).unwrap();
    let dir = tempfile::tempdir().unwrap();

    // 3,000 samples of ~1 KB in 48 KiB shards (about 60 shards), uploaded to moto.
    let input = dir.path().join("data.jsonl");
    // Text that does not compress away: letters from a small LCG.
    let mut x = 12345u64;
    let mut text = |len: usize| -> String {
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                char::from(b'a' + (x >> 59) as u8 % 26)
            })
            .collect()
    };
    let lines: String = (0..3000)
        .map(|i| format!("{{\"id\": {i}, \"text\": \"{}\"}}\n", text(1000 + i % 97)))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let local = dir.path().join("ds");
    run(&["shard", s(&input), s(&local), "--shard-size", "48KiB"]).ok();
    let env = vec![
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    let mut up_env = env.clone();
    up_env.push(("AWS_ENDPOINT_URL", server.endpoint()));
    run_env(&["upload", s(&local), "s3://data/ds"], &up_env).ok();

    // 8 nodes x 2 ranks, each node behind its own counting proxy, all 16 at once.
    let proxies: Vec<CountingProxy> = (0..NODES)
        .map(|_| runtime.block_on(start_proxy(server.addr())))
        .collect();
    let cache_root = dir.path().join("cache");
    let mut children = Vec::new();
    for node in 0..NODES {
        for rank in 0..RANKS {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardstream"));
            for (k, _) in std::env::vars() {
                if k.starts_with("AWS_") || k.starts_with("SHARDSTREAM_") {
                    cmd.env_remove(k);
                }
            }
            cmd.envs(env.iter().map(|(k, v)| (k, v)))
                .env(
                    "AWS_ENDPOINT_URL",
                    format!("http://{}", proxies[node as usize].addr),
                )
                .args([
                    "stream",
                    "s3://data/ds",
                    "--cache-root",
                    s(&cache_root),
                    "--run-id",
                    "scale",
                    "--node-rank",
                    &node.to_string(),
                    "--num-nodes",
                    &NODES.to_string(),
                    "--nproc-per-node",
                    &RANKS.to_string(),
                    "--local-rank",
                    &rank.to_string(),
                    "--batch-size",
                    &BATCH.to_string(),
                    "--shuffle",
                    "--seed",
                    SEED,
                    "--json",
                ])
                .args(lanes.map(|l| format!("--lanes={l}")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            children.push(cmd.spawn().unwrap());
        }
    }
    let mut samples = 0u64;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "stream failed: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        samples += report["samples"].as_u64().unwrap();
    }
    assert!(
        samples >= 3000,
        "every sample once (plus padding): {samples}"
    );

    // Measured: per node, GETs of shard files, requests for the index, and shard bytes.
    let mut measured = Vec::new();
    for p in &proxies {
        let seen = p.seen.lock().unwrap();
        let (mut shard_gets, mut shard_bytes, mut index_gets, mut other) = (0u64, 0u64, 0u64, 0u64);
        for (method, path, bytes) in &seen.requests {
            // A GET of index.ssx (a 404 here), then a GET of index.json.
            if path.ends_with("/index.json") || path.ends_with("/index.ssx") {
                index_gets += 1;
            } else if path.contains(".mds") && method == "GET" {
                shard_gets += 1;
                shard_bytes += bytes;
            } else {
                other += 1;
            }
        }
        measured.push((shard_gets, shard_bytes, index_gets, other));
    }

    // Predicted, from the same index and world.
    let mut config = SimConfig::default();
    config.cluster.nodes = NODES;
    config.cluster.ranks_per_node = RANKS;
    config.cluster.workers = 1;
    config.cluster.batch_size = BATCH;
    config.dataset.index = Some(s(&local.join("index.json")).to_string());
    config.order.seed = SEED.parse().unwrap();
    config.order.lanes = lanes;
    config.model.sample_nodes = NODES;
    config.model.seconds = 2.0;
    let report = shardstream_sim::simulate(&config).unwrap();
    let dataset_bytes = report.epoch.dataset_bytes as f64;

    let mut table = String::from("| node | GETs predicted | GETs measured | MB predicted | MB measured | index requests |\n|---|---|---|---|---|---|\n");
    let (mut p_bytes, mut m_bytes, mut p_gets, mut m_gets) = (0f64, 0f64, 0u64, 0u64);
    for (node, &(gets, bytes, index_gets, other)) in measured.iter().enumerate() {
        let predicted = &report.epoch.nodes[node];
        let shard_bytes = bytes as f64;
        assert_eq!(
            other, 0,
            "node {node}: requests other than GETs of shards and of the index"
        );
        table.push_str(&format!(
            "| {node} | {} | {gets} | {:.3} | {:.3} | {index_gets} |\n",
            predicted.requests,
            predicted.bytes as f64 / 1e6,
            shard_bytes / 1e6
        ));
        let rel = |p: f64, m: f64| (p - m).abs() / m.max(1.0);
        assert!(
            rel(predicted.requests as f64, gets as f64) <= TOLERANCE,
            "node {node}: predicted {} shard GETs, measured {gets}\n{table}",
            predicted.requests
        );
        assert!(
            rel(predicted.bytes as f64, shard_bytes) <= TOLERANCE,
            "node {node}: predicted {} bytes, measured {shard_bytes}\n{table}",
            predicted.bytes
        );
        // The model has every process of a cold node fetch the index itself; a process that
        // finds the node's copy fetches nothing.
        let predicted_index = report.startup.index_requests / u64::from(NODES);
        assert_eq!(predicted_index, 2 * u64::from(RANKS));
        assert!(
            index_gets <= predicted_index,
            "node {node}: {index_gets} index requests, predicted {predicted_index}"
        );
        p_bytes += predicted.bytes as f64;
        m_bytes += shard_bytes;
        p_gets += predicted.requests;
        m_gets += gets;
    }
    let measured_amplification = m_bytes / dataset_bytes;
    table.push_str(&format!(
        "| all | {p_gets} | {m_gets} | {:.3} | {:.3} | |\n\namplification: predicted {:.4}, measured {:.4}\n",
        p_bytes / 1e6,
        m_bytes / 1e6,
        report.epoch.amplification,
        measured_amplification
    ));
    eprintln!("{NODES} nodes x {RANKS} ranks, lanes {:?}:\n{table}", lanes);
    assert!(
        (report.epoch.amplification - measured_amplification).abs() <= TOLERANCE,
        "{table}"
    );
}

#[test]
fn simulate_prints_a_table_and_json() {
    let out = run(&[
        "simulate",
        "--nodes",
        "4",
        "--ranks-per-node",
        "2",
        "--workers",
        "2",
        "--shards",
        "64",
        "--resize-to",
        "3",
    ])
    .ok();
    assert!(out.stdout.contains("amplification"), "{}", out.stdout);
    assert!(out.stdout.contains("resize"), "{}", out.stdout);
    let out = run(&["simulate", "--nodes", "4", "--shards", "64", "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v["epoch"]["amplification"].as_f64().unwrap() >= 1.0);
    assert_eq!(v["checkpoint"]["ranks"], 32);
    let bad = run(&["simulate", "--nodes", "0"]).failed();
    assert!(bad.stderr.contains("cluster.nodes"), "{}", bad.stderr);
}
