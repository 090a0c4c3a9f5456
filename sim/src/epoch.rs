//! One epoch over the whole cluster: per-node downloads, amplification, cache need, and the
//! request rate each prefix sees.
//!
//! Nodes are played with [`run_node`]; above `model.sample_nodes` nodes, only that many
//! (evenly spread) are, and cluster totals are their mean times the node count. Time: every
//! node consumes its part at the same pace (lock step), either the configured samples per
//! second or, without one, as fast as the busiest node's link allows (the worst case for
//! request rates); the prefetch spreads a step's downloads over the step.

use serde::Serialize;

use shardstream_streamer::order::EpochOrder;

use crate::config::SimConfig;
use crate::error::Result;
use crate::plan::{run_node, NodeCache, NodeRun, Steps};
use crate::shards::Shards;

/// Spread of a per-node quantity.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (zeros when empty).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Spread {
        let (mut min, mut max, mut sum, mut n) = (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0u64);
        for v in values {
            min = min.min(v);
            max = max.max(v);
            sum += v;
            n += 1;
        }
        if n == 0 {
            return Spread::default();
        }
        Spread {
            min,
            mean: sum / n as f64,
            max,
        }
    }
}

/// One node's epoch, as reported.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeReport {
    /// The node.
    pub node: u32,
    /// Bytes it downloaded.
    pub bytes: u64,
    /// GET requests for shards.
    pub requests: u64,
    /// Shard downloads.
    pub downloads: u64,
    /// Downloads of shards it had evicted.
    pub refetches: u64,
    /// Peak bytes it needs cached at once.
    pub peak_need: u64,
}

/// The epoch's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EpochReport {
    /// Nodes played (all, or the sample).
    pub nodes_played: u32,
    /// Planning steps per process and samples per step.
    pub steps: u64,
    /// Samples of one process per step.
    pub step_samples: u64,
    /// Bytes of the dataset.
    pub dataset_bytes: u64,
    /// Bytes downloaded by all nodes (scaled from the sample).
    pub fetched_bytes: f64,
    /// `fetched_bytes / dataset_bytes`.
    pub amplification: f64,
    /// Shard GETs per node.
    pub requests_per_node: Spread,
    /// Bytes per node.
    pub bytes_per_node: Spread,
    /// Peak cache need per node, bytes.
    pub cache_need_per_node: Spread,
    /// Nodes whose need exceeds the cache limit.
    pub nodes_over_cache_limit: u32,
    /// Shard downloads repeated after an eviction, all nodes (scaled).
    pub refetches: f64,
    /// Epoch duration, seconds.
    pub seconds: f64,
    /// Whether the pace was set by the network (no consumption rate given, or a slower one).
    pub io_bound: bool,
    /// Mean GET/s per prefix over the epoch (busiest prefix).
    pub get_per_s_per_prefix_mean: f64,
    /// Highest GET/s of a prefix over any one shuffle block's time.
    pub get_per_s_per_prefix_peak: f64,
    /// Mean bytes/s per prefix (busiest prefix).
    pub bytes_per_s_per_prefix_mean: f64,
    /// Every played node (first 64).
    pub nodes: Vec<NodeReport>,
}

/// The nodes to play: all of `nodes`, or `sample` of them evenly spread (first and last
/// included).
pub fn sampled_nodes(nodes: u32, sample: u32) -> Vec<u32> {
    if sample >= nodes {
        return (0..nodes).collect();
    }
    let s = u64::from(sample.max(2));
    let n = u64::from(nodes);
    let mut out: Vec<u32> = (0..s)
        .map(|i| u32::try_from(i * (n - 1) / (s - 1)).unwrap_or(nodes - 1))
        .collect();
    out.dedup();
    out
}

/// Plays the epoch of `order` over `config`'s cluster.
pub fn model_epoch(config: &SimConfig, order: &EpochOrder, shards: &Shards) -> Result<EpochReport> {
    let c = &config.cluster;
    let steps = Steps::new(
        order,
        c.nodes,
        c.ranks_per_node,
        c.batch_size,
        0,
        config.model.steps_per_block,
    )?;
    let played = sampled_nodes(c.nodes, config.model.sample_nodes);
    let mut runs: Vec<(u32, NodeRun)> = Vec::with_capacity(played.len());
    for &node in &played {
        let mut cache = NodeCache::new(c.cache_limit);
        runs.push((node, run_node(&steps, shards, node, 0, &mut cache)?));
    }
    let scale = f64::from(c.nodes) / played.len().max(1) as f64;
    let fetched: f64 = runs.iter().map(|(_, r)| r.bytes as f64).sum::<f64>() * scale;
    let busiest_bytes = runs.iter().map(|(_, r)| r.bytes).max().unwrap_or(0);
    let io_seconds = busiest_bytes as f64 / c.node_bandwidth;
    let per_process = steps.partition().per_process() as f64;
    let (seconds, io_bound) = match c.samples_per_second_per_rank {
        Some(rate) if per_process / rate >= io_seconds => (per_process / rate, false),
        _ => (io_seconds, true),
    };
    let seconds = seconds.max(f64::MIN_POSITIVE);
    let prefixes = shards.prefixes as usize;
    let mut per_prefix_total = vec![0f64; prefixes];
    let n_steps = usize::try_from(steps.count).unwrap_or(usize::MAX);
    let mut per_step = vec![vec![0f64; prefixes]; n_steps];
    for (_, r) in &runs {
        for (k, reqs) in r.step_requests.iter().enumerate() {
            for (p, &n) in reqs.iter().enumerate() {
                per_step[k][p] += n as f64 * scale;
                per_prefix_total[p] += n as f64 * scale;
            }
        }
    }
    let step_seconds = seconds / steps.count.max(1) as f64;
    let window = config.model.steps_per_block.max(1) as usize;
    let mut peak = 0f64;
    for start in 0..per_step.len() {
        let end = (start + window).min(per_step.len());
        for p in 0..prefixes {
            let sum: f64 = per_step[start..end].iter().map(|s| s[p]).sum();
            peak = peak.max(sum / ((end - start) as f64 * step_seconds));
        }
    }
    let busiest_prefix = per_prefix_total.iter().copied().fold(0.0, f64::max);
    let prefix_bytes = fetched / f64::from(shards.prefixes);
    Ok(EpochReport {
        nodes_played: played.len() as u32,
        steps: steps.count,
        step_samples: steps.step,
        dataset_bytes: shards.total_bytes,
        fetched_bytes: fetched,
        amplification: fetched / (shards.total_bytes.max(1) as f64),
        requests_per_node: Spread::of(runs.iter().map(|(_, r)| r.requests as f64)),
        bytes_per_node: Spread::of(runs.iter().map(|(_, r)| r.bytes as f64)),
        cache_need_per_node: Spread::of(runs.iter().map(|(_, r)| r.peak_need as f64)),
        nodes_over_cache_limit: (runs.iter().filter(|(_, r)| r.over_limit).count() as f64 * scale)
            .round() as u32,
        refetches: runs.iter().map(|(_, r)| r.refetches as f64).sum::<f64>() * scale,
        seconds,
        io_bound,
        get_per_s_per_prefix_mean: busiest_prefix / seconds,
        get_per_s_per_prefix_peak: peak,
        bytes_per_s_per_prefix_mean: prefix_bytes / seconds,
        nodes: runs
            .iter()
            .take(64)
            .map(|(node, r)| NodeReport {
                node: *node,
                bytes: r.bytes,
                requests: r.requests,
                downloads: r.downloads,
                refetches: r.refetches,
                peak_need: r.peak_need,
            })
            .collect(),
    })
}
