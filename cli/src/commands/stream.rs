//! `shardstream stream`: stream one epoch of one rank through the streamer, to pre-warm a node's
//! cache or to measure throughput. Prints samples/s, MB/s, time to first sample, peak RSS and
//! bytes fetched (`--json` for one JSON object), and can serve the streamer's metrics for
//! Prometheus while it runs (`--metrics-addr`).

use std::time::{Duration, Instant};

use anyhow::Context;
use shardstream_launcher::identity::{os_env, resolve_node_rank_with};
use shardstream_streamer::order::{OrderConfig, Rank, World};
use shardstream_streamer::{StreamPlan, StreamingConfig, StreamingDataset};

use crate::exit::ConfigError;
use crate::node_args::{streaming_config, BudgetArgs, NodeArgs};
use crate::output::outln;
use crate::units::ByteSize;
use crate::{metrics_server, progress, Global};

/// `stream DATASET`: stream one epoch (pre-warm a cache, or measure throughput).
#[derive(Debug, clap::Args)]
pub struct StreamArgs {
    /// Dataset location (local path or s3://, gs://, az:// URL).
    pub dataset: String,
    /// Subfolder of the dataset (Mosaic's `split`).
    #[arg(long)]
    pub split: Option<String>,
    /// Which node's cache.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Number of nodes.
    #[arg(long)]
    pub num_nodes: Option<u64>,
    /// Processes per node.
    #[arg(long)]
    pub nproc_per_node: Option<u64>,
    /// The process on this node to stream for (0-based).
    #[arg(long, default_value_t = 0)]
    pub local_rank: u64,
    /// DataLoader workers per process.
    #[arg(long)]
    pub num_workers: Option<u64>,
    /// The worker to stream for (0-based).
    #[arg(long, default_value_t = 0)]
    pub worker: u64,
    /// Batch size per process.
    #[arg(long)]
    pub batch_size: Option<u64>,
    /// Shuffle the sample order.
    #[arg(long)]
    pub shuffle: bool,
    /// Shuffle seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Shards per shuffle block.
    #[arg(long)]
    pub window: Option<u32>,
    /// Full-size shuffle blocks from the start of each lane, without the ramp of 1, 2, 4, ...
    /// shards (and of halving parts of the first shard) that gets the first samples out
    /// sooner (see docs/sample-order.md).
    #[arg(long)]
    pub no_ramp: bool,
    /// Lanes of the order (like Mosaic's num_canonical_nodes); default: the number of nodes.
    #[arg(long)]
    pub lanes: Option<u32>,
    /// Epoch.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// RAM and disk budgets.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Check the hashes the index records.
    #[arg(long)]
    pub validate_hash: bool,
    /// Copy local sources into the cache instead of reading them in place.
    #[arg(long)]
    pub copy_local: bool,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400) while streaming.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Keep serving metrics this many seconds after the epoch (so a scraper sees the end).
    #[arg(long, default_value_t = 0)]
    pub metrics_linger: u64,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn u32_arg(name: &str, value: Option<u64>, default: u32) -> anyhow::Result<u32> {
    match value {
        None => Ok(default),
        Some(v) => {
            u32::try_from(v).map_err(|_| ConfigError(format!("--{name} {v} is too large")).into())
        }
    }
}

/// Runs `stream`.
pub fn run(args: StreamArgs, global: &Global) -> anyhow::Result<()> {
    let started = Instant::now();
    let config = StreamingConfig {
        copy_local: args.copy_local,
        validate_hash: args.validate_hash,
        ..streaming_config(&args.dataset, args.split.clone(), &args.node, &args.budget)
    };
    let dataset = StreamingDataset::open(config)
        .with_context(|| format!("cannot open dataset {}", args.dataset))?;
    let nodes = u32_arg("num-nodes", args.num_nodes, 1)?;
    let world = World::new(
        nodes,
        u32_arg("nproc-per-node", args.nproc_per_node, 1)?,
        u32_arg("num-workers", args.num_workers, 1)?,
        u32_arg("batch-size", args.batch_size, 1)?,
    )?;
    let node = node_rank(&args.node)?;
    let rank = Rank {
        node,
        local_process: u32_arg("local-rank", Some(args.local_rank), 0)?,
        worker: u32_arg("worker", Some(args.worker), 0)?,
    };
    let order = OrderConfig {
        seed: args.seed.unwrap_or(OrderConfig::DEFAULT_SEED),
        shuffle: args.shuffle,
        window: args.window.unwrap_or(OrderConfig::DEFAULT_WINDOW),
        lanes: args.lanes.unwrap_or(nodes),
        ramp: !args.no_ramp,
        sample_ramp: !args.no_ramp,
        ..OrderConfig::default()
    };
    let plan = StreamPlan {
        order,
        epoch: args.epoch,
        world,
        rank,
        start: 0,
    };

    // The metrics server runs on its own runtime, owned here: dropping it stops the server.
    let server = match &args.metrics_addr {
        Some(addr) => {
            let counted = dataset.clone();
            let server = metrics_server::serve(addr, move || counted.metrics().to_prometheus())?;
            eprintln!("serving metrics on http://{}/metrics", server.addr);
            Some(server)
        }
        None => None,
    };

    let mut stream = dataset.stream(plan)?;
    let bar = progress::items(stream.total(), "samples", global.progress());
    let stream_start = Instant::now();
    let mut first_sample: Option<Duration> = None;
    let (mut samples, mut bytes) = (0u64, 0u64);
    for item in &mut stream {
        let item = item?;
        if first_sample.is_none() {
            first_sample = Some(started.elapsed());
        }
        samples += 1;
        bytes += item.sample.bytes().len() as u64;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let elapsed = stream_start.elapsed().as_secs_f64().max(1e-9);
    let m = dataset.metrics();
    let peak_rss = peak_rss_bytes();
    let report = serde_json::json!({
        "dataset": args.dataset,
        "cache_dir": dataset.cache_dir().display().to_string(),
        "samples": samples,
        "bytes": bytes,
        "seconds": elapsed,
        "samples_per_sec": samples as f64 / elapsed,
        "mb_per_sec": bytes as f64 / 1e6 / elapsed,
        "time_to_first_sample_sec": first_sample.map(|d| d.as_secs_f64()),
        "peak_rss_bytes": peak_rss,
        "fetch_bytes": m.fetch_bytes,
        "fetch_requests": m.fetch_requests,
        "shards_fetched": m.shards_fetched,
        "shards_joined": m.shards_joined,
        "cache_hits": m.cache_hits,
        "cache_misses": m.cache_misses,
        "stall_seconds": m.stall_seconds,
        "metrics_addr": server.as_ref().map(|s| s.addr.to_string()),
    });
    if args.json {
        outln!("{report}")?;
    } else {
        outln!(
            "{samples} samples, {} in {elapsed:.2} s: {:.0} samples/s, {:.1} MB/s",
            ByteSize(bytes),
            samples as f64 / elapsed,
            bytes as f64 / 1e6 / elapsed
        )?;
        match first_sample {
            Some(t) => outln!("time to first sample: {:.3} s", t.as_secs_f64())?,
            None => outln!("time to first sample: - (no samples)")?,
        }
        outln!(
            "fetched {} in {} shards ({} requests); cache hits {}, misses {}; stalled {:.2} s",
            ByteSize(m.fetch_bytes),
            m.shards_fetched,
            m.fetch_requests,
            m.cache_hits,
            m.cache_misses,
            m.stall_seconds
        )?;
        match peak_rss {
            Some(rss) => outln!("peak RSS: {}", ByteSize(rss))?,
            None => outln!("peak RSS: unknown (no /proc/self/status)")?,
        }
    }
    crate::output::flush()?;
    if server.is_some() && args.metrics_linger > 0 {
        std::thread::sleep(Duration::from_secs(args.metrics_linger));
    }
    drop(server);
    Ok(())
}

/// This node's rank: `--node-rank`, else the environment's (`SHARDSTREAM_NODE_RANK`,
/// `JOB_COMPLETION_INDEX`, ...), else 0 where nothing suggests several nodes: the rank the
/// dataset's cache folder was resolved with, also for a local dataset read in place, whose
/// folder names no rank.
fn node_rank(node: &NodeArgs) -> anyhow::Result<u32> {
    let (rank, _) = resolve_node_rank_with(&node.overrides().run, &os_env)
        .context("resolving the node rank")?;
    Ok(rank)
}

/// Peak resident set size (`VmHWM`) of this process.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
