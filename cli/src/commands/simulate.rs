//! `simulate`: the scale model (`shardstream-sim`, `docs/scale.md`). Takes a JSON file of the
//! cluster, dataset, store, shaping, checkpoint and resize shapes and/or flags that override
//! it; prints a table, or the whole report with `--json`.
//!
//! Two helpers measure what the model takes as inputs: `--write-index DIR` writes a synthetic
//! Mosaic `index.json` of the configured shape, and `--open-index DIR` opens a dataset with the
//! streamer's own loader and reports the process's peak RSS and the time it took.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use shardstream_sim::config::Resize;
use shardstream_sim::SimConfig;
use shardstream_streamer::{StreamingConfig, StreamingDataset};

use crate::output::outln;
use crate::units::ByteSize;

/// `simulate`: model a cluster, dataset and store.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// JSON file with any of the sections cluster, dataset, order, store, shaping, checkpoint,
    /// resize, model (docs/scale.md); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Nodes.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Processes (GPUs) per node.
    #[arg(long)]
    pub ranks_per_node: Option<u32>,
    /// DataLoader workers per process.
    #[arg(long)]
    pub workers: Option<u32>,
    /// Samples per batch per process.
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// Download bandwidth of one node, bytes/s (e.g. 2GB).
    #[arg(long)]
    pub node_bandwidth: Option<ByteSize>,
    /// Node cache limit.
    #[arg(long)]
    pub cache_limit: Option<ByteSize>,
    /// Samples per second each process consumes (default: as fast as the network allows).
    #[arg(long)]
    pub samples_per_second: Option<f64>,
    /// Shards of a uniform dataset.
    #[arg(long)]
    pub shards: Option<u32>,
    /// Bytes of each shard.
    #[arg(long)]
    pub shard_bytes: Option<ByteSize>,
    /// Samples of each shard.
    #[arg(long)]
    pub samples_per_shard: Option<u64>,
    /// A local MDS index.json to take the shards from instead.
    #[arg(long)]
    pub index: Option<String>,
    /// Key prefixes the shards are spread over.
    #[arg(long)]
    pub prefixes: Option<u32>,
    /// Lanes of the order (default: the node count).
    #[arg(long)]
    pub lanes: Option<u32>,
    /// Shards per shuffle block.
    #[arg(long)]
    pub window: Option<u32>,
    /// GET/s one prefix serves.
    #[arg(long)]
    pub get_limit: Option<f64>,
    /// PUT/s one prefix serves.
    #[arg(long)]
    pub put_limit: Option<f64>,
    /// Shaping's starting rate per prefix and process.
    #[arg(long)]
    pub start_rate: Option<f64>,
    /// The prefix's request limit declared to the limiters, GET/s for the whole job
    /// (`SHARDSTREAM_SHAPING_PREFIX_LIMIT`; default: none declared).
    #[arg(long)]
    pub prefix_limit: Option<f64>,
    /// Resize to this many nodes mid-epoch.
    #[arg(long)]
    pub resize_to: Option<u32>,
    /// Fraction of the epoch before the resize.
    #[arg(long, default_value_t = 0.5)]
    pub resize_at: f64,
    /// Bytes each rank saves in a checkpoint.
    #[arg(long)]
    pub checkpoint_bytes: Option<ByteSize>,
    /// Nodes played in full (the rest scaled from them).
    #[arg(long)]
    pub sample_nodes: Option<u32>,
    /// Seconds over which the nodes start.
    #[arg(long)]
    pub start_spread: Option<f64>,
    /// Write a synthetic index.json of the dataset shape into this folder and exit.
    #[arg(long, conflicts_with = "open_index")]
    pub write_index: Option<PathBuf>,
    /// Open the dataset at this location with the streamer's loader, report peak RSS, exit.
    #[arg(long)]
    pub open_index: Option<String>,
    /// Print the whole report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn config_of(args: &SimulateArgs) -> anyhow::Result<SimConfig> {
    let mut c: SimConfig = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => SimConfig::default(),
    };
    macro_rules! set {
        ($field:expr, $value:expr) => {
            if let Some(v) = $value {
                $field = v;
            }
        };
    }
    set!(c.cluster.nodes, args.nodes);
    set!(c.cluster.ranks_per_node, args.ranks_per_node);
    set!(c.cluster.workers, args.workers);
    set!(c.cluster.batch_size, args.batch_size);
    set!(
        c.cluster.node_bandwidth,
        args.node_bandwidth.map(|b| b.0 as f64)
    );
    set!(c.cluster.cache_limit, args.cache_limit.map(|b| b.0));
    if args.samples_per_second.is_some() {
        c.cluster.samples_per_second_per_rank = args.samples_per_second;
    }
    set!(c.dataset.shards, args.shards);
    set!(c.dataset.shard_bytes, args.shard_bytes.map(|b| b.0));
    set!(c.dataset.samples_per_shard, args.samples_per_shard);
    set!(c.dataset.prefixes, args.prefixes);
    if args.index.is_some() {
        c.dataset.index = args.index.clone();
    }
    if args.lanes.is_some() {
        c.order.lanes = args.lanes;
    }
    set!(c.order.window, args.window);
    set!(c.store.get_limit, args.get_limit);
    set!(c.store.put_limit, args.put_limit);
    set!(c.shaping.start_rate, args.start_rate);
    if args.prefix_limit.is_some() {
        c.shaping.prefix_limit = args.prefix_limit;
    }
    set!(
        c.checkpoint.bytes_per_rank,
        args.checkpoint_bytes.map(|b| b.0)
    );
    set!(c.model.sample_nodes, args.sample_nodes);
    set!(c.model.start_spread, args.start_spread);
    if let Some(to) = args.resize_to {
        c.resize = Some(Resize {
            to_nodes: to,
            at: args.resize_at,
        });
    }
    Ok(c)
}

/// Peak resident set size (`VmHWM`) of this process.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

fn open_index(location: &str, json: bool) -> anyhow::Result<()> {
    let before = peak_rss_bytes();
    let started = Instant::now();
    let cache = tempfile::tempdir().context("creating a scratch cache folder")?;
    let ds = StreamingDataset::open(StreamingConfig {
        remote: location.to_string(),
        local: Some(cache.path().to_path_buf()),
        ..StreamingConfig::default()
    })
    .with_context(|| format!("opening {location}"))?;
    let seconds = started.elapsed().as_secs_f64();
    let after = peak_rss_bytes();
    // After the peak is taken: a dataset opened from its index.ssx reads index.json only now.
    let index_bytes = ds.index_json().map(|j| j.len()).ok();
    let report = serde_json::json!({
        "location": location,
        "shards": ds.num_shards(),
        "samples": ds.num_samples(),
        "index_bytes": index_bytes,
        "open_seconds": seconds,
        "peak_rss_before_bytes": before,
        "peak_rss_bytes": after,
    });
    if json {
        outln!("{report}")
    } else {
        outln!(
            "{} shards, {} samples, index {} bytes: opened in {seconds:.2} s, peak RSS {} (before: {})",
            ds.num_shards(),
            ds.num_samples(),
            index_bytes.map_or("?".into(), |b| b.to_string()),
            after.map_or("?".into(), |b| ByteSize(b).to_string()),
            before.map_or("?".into(), |b| ByteSize(b).to_string()),
        )
    }
}

/// Runs `simulate`.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let config = config_of(&args)?;
    if let Some(dir) = &args.write_index {
        let d = &config.dataset;
        let bytes =
            shardstream_sim::shards::synthetic_index(d.shards, d.samples_per_shard, d.shard_bytes)?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("index.json");
        std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
        return outln!("wrote {} ({} bytes)", path.display(), bytes.len());
    }
    if let Some(location) = &args.open_index {
        return open_index(location, args.json);
    }
    let report = shardstream_sim::simulate(&config)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)
    } else {
        outln!("{}", report.table().trim_end())
    }
}
