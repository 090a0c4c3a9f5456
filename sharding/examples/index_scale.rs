//! Index cost at scale: memory and time to parse `index.json` and `index.ssx` for a synthetic
//! dataset of N shards. Each parse runs in its own process, so that peak RSS is its own.
//!
//! ```text
//! cargo run --release -p shardstream-sharding --example index_scale -- gen /tmp/idx 1000000
//! cargo run --release -p shardstream-sharding --example index_scale -- json /tmp/idx
//! cargo run --release -p shardstream-sharding --example index_scale -- bin /tmp/idx
//! cargo run --release -p shardstream-sharding --example index_scale -- view /tmp/idx
//! cargo run --release -p shardstream-sharding --example index_scale -- json-view /tmp/idx
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use shardstream_sharding::mds::index_bin::{self, BINARY_INDEX_BASENAME};
use shardstream_sharding::mds::{FileInfo, Index, ShardInfo};

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn synthetic(n: usize) -> Index {
    let shards = (0..n)
        .map(|i| {
            let file = |name: String, bytes: u64| FileInfo {
                basename: name,
                bytes,
                hashes: BTreeMap::from([("xxh64".to_string(), format!("{:016x}", i * 7919))]),
            };
            ShardInfo {
                column_encodings: vec!["jpeg".into(), "int".into(), "str".into()],
                column_names: vec!["image".into(), "label".into(), "text".into()],
                column_sizes: vec![None, Some(8), None],
                compression: Some("zstd".into()),
                format: "mds".into(),
                hashes: vec!["xxh64".into()],
                raw_data: file(format!("shard.{i:07}.mds"), 67_000_000),
                samples: 1000,
                size_limit: Some(67_108_864),
                version: 2,
                zip_data: Some(file(format!("shard.{i:07}.mds.zstd"), 60_000_000)),
            }
        })
        .collect();
    Index { version: 2, shards }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (mode, dir) = match (args.get(1), args.get(2)) {
        (Some(m), Some(d)) => (m.as_str(), Path::new(d)),
        _ => return Err("usage: index_scale gen|json|json-view|bin|view DIR [SHARDS]".into()),
    };
    match mode {
        "gen" => {
            let n: usize = args.get(3).map_or(Ok(1_000_000), |s| s.parse())?;
            std::fs::create_dir_all(dir)?;
            let index = synthetic(n);
            let json = index.to_json();
            let bin = index_bin::to_bytes(&index, json.as_bytes())?;
            std::fs::write(dir.join("index.json"), &json)?;
            std::fs::write(dir.join(BINARY_INDEX_BASENAME), &bin)?;
            println!(
                "{n} shards: index.json {} bytes, index.ssx {} bytes",
                json.len(),
                bin.len()
            );
        }
        "json-view" => {
            let start = Instant::now();
            let bytes = std::fs::read(dir.join("index.json"))?;
            let view = index_bin::view_from_json("index.json", &bytes)?;
            drop(bytes);
            println!(
                "index.json streamed into a view: {} shards, read+parse+check {:.2} s, peak RSS {:.0} MiB",
                view.len(),
                start.elapsed().as_secs_f64(),
                peak_rss_mib()
            );
        }
        "view" => {
            let start = Instant::now();
            let bytes = std::fs::read(dir.join(BINARY_INDEX_BASENAME))?;
            let view = index_bin::IndexView::parse(BINARY_INDEX_BASENAME, bytes)?;
            println!(
                "index.ssx as a view: {} shards, {} samples, read+check {:.2} s, peak RSS {:.0} MiB",
                view.len(),
                view.num_samples(),
                start.elapsed().as_secs_f64(),
                peak_rss_mib()
            );
        }
        "json" | "bin" => {
            let name = if mode == "json" {
                "index.json"
            } else {
                BINARY_INDEX_BASENAME
            };
            let start = Instant::now();
            let bytes = std::fs::read(dir.join(name))?;
            let read = start.elapsed();
            let index = if mode == "json" {
                Index::from_json(name, &bytes)?
            } else {
                index_bin::from_bytes(name, &bytes)?
            };
            let parsed = start.elapsed();
            drop(bytes);
            println!(
                "{name}: {} shards, read {:.2} s, read+parse+validate {:.2} s, peak RSS {:.0} MiB",
                index.shards.len(),
                read.as_secs_f64(),
                parsed.as_secs_f64(),
                peak_rss_mib()
            );
        }
        _ => return Err(format!("unknown mode {mode}").into()),
    }
    Ok(())
}
