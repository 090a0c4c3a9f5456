//! Start-up cost of a dataset at scale: how long opening an MDS `index.json` takes, how long the
//! epoch's order and a rank's first samples take, and the peak RSS of all that, for one index.
//!
//! `benches/streamer_scale.py` runs it once per index size (10^4 .. 10^8 samples), each in its own
//! process so that the peak RSS (`VmHWM`) belongs to that size alone. The shards need not exist:
//! nothing here reads a shard.
//!
//! ```text
//! cargo run --release -p shardstream-streamer --example scale_open -- DIR [--parse-only]
//!     [--nodes 4] [--lanes 4] [--window 16]
//! ```
//!
//! Prints one JSON object: `open_s` (read + parse + check `index.json` and build the dataset),
//! `open_cpu_s` (the CPU time of that, which waits for a core on a shared machine do not
//! inflate), `order_s` (the shuffled epoch order), `first_s` (node 0's first sample and its prefetch plan
//! for 1,000 samples), and `peak_rss_bytes` / `rss_after_*_bytes` from `/proc/self/status`.
//! With `--parse-only` it times only reading and parsing `index.json` (`Index::from_json`), which
//! splits the open time into JSON work and the rest.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use shardstream_sharding::mds::Index;
use shardstream_streamer::order::{EpochOrder, OrderConfig, Rank, World};
use shardstream_streamer::{StreamingConfig, StreamingDataset};

type Res<T> = std::result::Result<T, Box<dyn Error>>;

struct Args {
    dir: PathBuf,
    parse_only: bool,
    nodes: u32,
    lanes: u32,
    window: u32,
}

fn parse_args() -> Res<Args> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        dir: PathBuf::new(),
        parse_only: false,
        nodes: 4,
        lanes: 4,
        window: OrderConfig::DEFAULT_WINDOW,
    };
    let mut dir = None;
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Res<u32> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            Ok(v.parse().map_err(|e| format!("{name} {v}: {e}"))?)
        };
        match a.as_str() {
            "--parse-only" => args.parse_only = true,
            "--nodes" => args.nodes = num("--nodes")?,
            "--lanes" => args.lanes = num("--lanes")?,
            "--window" => args.window = num("--window")?,
            _ if dir.is_none() && !a.starts_with("--") => dir = Some(PathBuf::from(a)),
            _ => return Err(format!("unexpected argument {a:?}").into()),
        }
    }
    args.dir = dir.ok_or("usage: scale_open DIR [--parse-only] [--nodes N] [--lanes L]")?;
    Ok(args)
}

/// A field of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`); 0 where there is none.
fn status_bytes(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time of every thread of this process so far, in seconds (`/proc/self/task/*/schedstat`,
/// nanoseconds on a CPU). Wall time on a shared machine counts the waits for a core; this does not.
fn cpu_s() -> f64 {
    // The kernel adds a running thread's time to schedstat when it next schedules; a yield makes
    // that happen now, so short spans are not read as zero.
    std::thread::yield_now();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

fn main() -> Res<()> {
    let args = parse_args()?;
    let index_path = args.dir.join("index.json");
    if args.parse_only {
        let t = Instant::now();
        let bytes = std::fs::read(&index_path)?;
        let read_s = t.elapsed().as_secs_f64();
        let cpu = cpu_s();
        let index = Index::from_json(&index_path.display().to_string(), &bytes)?;
        let parse_s = t.elapsed().as_secs_f64() - read_s;
        let parse_cpu_s = cpu_s() - cpu;
        let out = serde_json::json!({
            "index_bytes": bytes.len(),
            "shards": index.shards.len(),
            "samples": index.num_samples(),
            "read_s": read_s,
            "parse_s": parse_s,
            "parse_cpu_s": parse_cpu_s,
            "peak_rss_bytes": status_bytes("VmHWM:"),
        });
        println!("{out}");
        return Ok(());
    }

    let rss_base = status_bytes("VmRSS:");
    // An explicit cache folder: open() only works out the path, and nothing is fetched here.
    let cache = std::env::temp_dir().join("shardstream-scale-open-cache");
    let t = Instant::now();
    let cpu = cpu_s();
    let ds = StreamingDataset::open(StreamingConfig {
        remote: args.dir.display().to_string(),
        local: Some(cache),
        ..StreamingConfig::default()
    })?;
    let open_s = t.elapsed().as_secs_f64();
    let open_cpu_s = cpu_s() - cpu;
    let rss_open = status_bytes("VmRSS:");

    let config = OrderConfig {
        shuffle: true,
        window: args.window,
        lanes: args.lanes,
        ..OrderConfig::default()
    };
    let t = Instant::now();
    let order = EpochOrder::new(ds.shape(), &config, 0)?;
    let order_s = t.elapsed().as_secs_f64();
    let rss_order = status_bytes("VmRSS:");

    let world = World::new(args.nodes, 1, 1, 1)?;
    let rank = Rank {
        node: 0,
        local_process: 0,
        worker: 0,
    };
    let t = Instant::now();
    let first = order
        .rank_iter(world, rank, 0)?
        .next()
        .ok_or("the rank has no samples")?;
    let plan = order.shards_needed(&order.partition(world, 0), rank, 0..1000)?;
    let first_s = t.elapsed().as_secs_f64();

    let out = serde_json::json!({
        "shards": ds.num_shards(),
        "samples": ds.num_samples(),
        "open_s": open_s,
        "open_cpu_s": open_cpu_s,
        "order_s": order_s,
        "first_s": first_s,
        "first_sample": first.sample.sample,
        "plan_shards": plan.len(),
        "order_heap_bytes": order.heap_bytes(),
        "rss_base_bytes": rss_base,
        "rss_after_open_bytes": rss_open,
        "rss_after_order_bytes": rss_order,
        "peak_rss_bytes": status_bytes("VmHWM:"),
    });
    println!("{out}");
    Ok(())
}
