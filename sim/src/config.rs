//! The model's inputs: a cluster shape, a dataset shape, a store profile, the request shaping
//! policy, a checkpoint shape and an optional resize. Every field has a default (the 512-node
//! case of `docs/scale.md`), so a JSON file names only what it changes.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardstream_storage::shaping::ShapingConfig;

use crate::error::{Result, SimError};

const MB: f64 = 1e6;
const GIB: u64 = 1 << 30;

/// Everything the model takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Nodes, processes, workers, bandwidth and disk.
    pub cluster: Cluster,
    /// Shards, their sizes and samples.
    pub dataset: Dataset,
    /// The order's run settings.
    pub order: Order,
    /// Per-prefix limits, latency, per-connection speed.
    pub store: Store,
    /// Client-side request shaping (rate limit per prefix with AIMD on throttling).
    pub shaping: Shaping,
    /// One distributed checkpoint save.
    pub checkpoint: Checkpoint,
    /// A change of the node count in the middle of the epoch.
    pub resize: Option<Resize>,
    /// Resolution of the model itself.
    pub model: Model,
}

/// The cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Cluster {
    /// Nodes (each with its own cache).
    pub nodes: u32,
    /// Training processes (GPUs) per node.
    pub ranks_per_node: u32,
    /// DataLoader workers per process (each a process with its own stream and limiter).
    pub workers: u32,
    /// Samples per batch per process.
    pub batch_size: u32,
    /// What one node can download, bytes/s.
    pub node_bandwidth: f64,
    /// The node cache's limit, bytes.
    pub cache_limit: u64,
    /// Samples per second each process consumes (the GPU's pace); `None`: as fast as the
    /// network delivers (the worst case for request rates).
    pub samples_per_second_per_rank: Option<f64>,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            nodes: 512,
            ranks_per_node: 8,
            workers: 8,
            batch_size: 32,
            node_bandwidth: 2_000.0 * MB,
            cache_limit: 500 * GIB,
            samples_per_second_per_rank: None,
        }
    }
}

/// The dataset: uniform shards, or the shards of a real `index.json` (`index`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Dataset {
    /// Number of shards.
    pub shards: u32,
    /// Bytes of each shard as stored (what a download moves).
    pub shard_bytes: u64,
    /// Samples in each shard.
    pub samples_per_shard: u64,
    /// Key prefixes the shards are spread over (shard `i` under prefix `i % prefixes`); 1 is
    /// Mosaic's layout, every shard beside `index.json`.
    pub prefixes: u32,
    /// Bytes of `index.json`; `None`: the size of a Mosaic index of this many shards
    /// (measured per shard from a serialized entry, see `index.rs`).
    pub index_bytes: Option<u64>,
    /// A local MDS `index.json` whose shards replace the uniform shape above.
    pub index: Option<String>,
}

impl Default for Dataset {
    fn default() -> Self {
        Self {
            shards: 1_000_000,
            shard_bytes: 100_000_000,
            samples_per_shard: 1_000,
            prefixes: 1,
            index_bytes: None,
            index: None,
        }
    }
}

/// The order's run settings (`streamer::order::OrderConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Order {
    /// Seed.
    pub seed: u64,
    /// Shuffle.
    pub shuffle: bool,
    /// Shards per shuffle block.
    pub window: u32,
    /// Lanes; `None`: the node count (what `shardstream stream` and the bindings default to).
    pub lanes: Option<u32>,
    /// The ramp of small blocks (and sample parts) at the start of each lane.
    pub ramp: bool,
    /// The epoch.
    pub epoch: u64,
}

impl Default for Order {
    fn default() -> Self {
        Self {
            seed: 9176,
            shuffle: true,
            window: 16,
            lanes: None,
            ramp: true,
            epoch: 0,
        }
    }
}

/// The object store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Store {
    /// GET/HEAD requests per second one prefix serves; above it, `503 SlowDown`.
    pub get_limit: f64,
    /// PUT/POST/DELETE requests per second one prefix serves.
    pub put_limit: f64,
    /// Time to first byte of a request, seconds.
    pub latency: f64,
    /// Bytes/s one GET or PUT stream reaches.
    pub connection_bandwidth: f64,
    /// Bytes/s the index loader parses (`index.json` to the shard table). The default is what
    /// `shardstream simulate --open-index` measured for a 10^5-shard index with a debug build
    /// on the development VM (36.7 MB in 1.9 s of CPU); a release build parses faster.
    pub index_parse_rate: f64,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            get_limit: 5_500.0,
            put_limit: 3_500.0,
            latency: 0.03,
            connection_bandwidth: 100.0 * MB,
            index_parse_rate: 20.0 * MB,
        }
    }
}

/// Client-side request shaping, with the parameters of `storage::shaping::ShapingConfig`: a
/// token bucket per prefix and process, additive increase per unthrottled attempt,
/// multiplicative decrease (once per cooldown) on `503`/`429`, jittered waits. The rates are a
/// node's and the increase the job's: with `node_share` (what `storage::shaping` ships when
/// torchrun's `LOCAL_WORLD_SIZE` and `WORLD_SIZE` are set), each process runs with
/// `start_rate`, `min_rate` and `max_rate` divided by the node's processes,
/// `ranks_per_node x (workers + 1)`, and `increase` by the job's (that times `nodes`). A
/// declared `prefix_limit` (the job's) caps each process at its share of 0.9 of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Shaping {
    /// On or off.
    pub enabled: bool,
    /// Starting rate of a prefix, attempts/s per node (per process without `node_share`).
    pub start_rate: f64,
    /// Lowest rate, per node.
    pub min_rate: f64,
    /// Highest rate, per node.
    pub max_rate: f64,
    /// Attempts/s gained per second without throttling, by the whole job.
    pub increase: f64,
    /// Factor applied on throttling.
    pub decrease: f64,
    /// At most one decrease per this many seconds.
    pub cooldown: f64,
    /// Seconds of tokens a bucket saves up.
    pub burst_seconds: f64,
    /// Waits stretched by a random factor in `[1, 1 + jitter]`.
    pub jitter: f64,
    /// The node's rates divided among its processes (the shipped policy); `false` models one
    /// full set of rates per process (a process that does not know its node's size).
    pub node_share: bool,
    /// A throttle of one process of a node decreases the node's other processes too (the
    /// shipped policy when the node has a folder: `storage::shaping`'s node signal); `false`
    /// models each process decreasing on its own `503`s only.
    pub node_signal: bool,
    /// The prefix's request limit the user declares for the whole job, requests/s
    /// (`SHARDSTREAM_SHAPING_PREFIX_LIMIT`); `None` (the default): not declared.
    pub prefix_limit: Option<f64>,
}

impl Default for Shaping {
    /// `storage::shaping::ShapingConfig::default()`, shared by the node.
    fn default() -> Self {
        Self {
            enabled: true,
            start_rate: 2_000.0,
            min_rate: 1.0,
            max_rate: 20_000.0,
            increase: 10.0,
            decrease: 0.5,
            cooldown: 0.5,
            burst_seconds: 0.25,
            jitter: 0.2,
            node_share: true,
            node_signal: true,
            prefix_limit: None,
        }
    }
}

impl Shaping {
    /// The limiter's parameters, before any sharing: the one mapping of this section to
    /// `storage::shaping::ShapingConfig`, whose `shared_by` then divides them (the division
    /// rule and the declared limit's cap live there only).
    pub fn limiter(&self) -> ShapingConfig {
        ShapingConfig {
            enabled: self.enabled,
            start_rate: self.start_rate,
            min_rate: self.min_rate,
            max_rate: self.max_rate,
            increase: self.increase,
            decrease: self.decrease,
            cooldown: Duration::try_from_secs_f64(self.cooldown.max(0.0)).unwrap_or(Duration::MAX),
            burst_seconds: self.burst_seconds,
            jitter: self.jitter,
            node_signal: self.node_signal,
            node_dir: None,
            prefix_limit: self.prefix_limit,
            ..ShapingConfig::default()
        }
    }
}

/// One checkpoint save by every process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Checkpoint {
    /// Bytes each process saves.
    pub bytes_per_rank: u64,
    /// Files each process writes (torch DCP: one `.distcp` per rank; rank 0 adds `.metadata`).
    pub files_per_rank: u32,
    /// Plan part sizes and per-rank PUT caps from the prefix limit
    /// (`checkpoint::RatePlan`); off: `UploadConfig::default()` (64 MiB parts, no cap).
    pub rate_plan: bool,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Self {
            bytes_per_rank: 10 * GIB,
            files_per_rank: 1,
            rate_plan: true,
        }
    }
}

/// A resize: from `cluster.nodes` to `to_nodes` after fraction `at` of the epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resize {
    /// Nodes after the resize (same processes per node and workers).
    pub to_nodes: u32,
    /// Fraction of the epoch consumed when it happens, in `(0, 1)`.
    pub at: f64,
}

/// Resolution of the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Model {
    /// Nodes whose whole epoch is planned with the real order (evenly spread, node 0 and the
    /// last included); totals are scaled from them. Every node when the cluster is smaller.
    pub sample_nodes: u32,
    /// Planning steps per shuffle block of a process (the cache's time resolution).
    pub steps_per_block: u32,
    /// Nodes start within this many seconds of each other (uniformly spread).
    pub start_spread: f64,
    /// Seconds of request traffic the shaping model plays.
    pub seconds: f64,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            sample_nodes: 32,
            steps_per_block: 4,
            start_spread: 0.0,
            seconds: 120.0,
        }
    }
}

fn bad(setting: &'static str, reason: impl Into<String>) -> SimError {
    SimError::InvalidConfig {
        setting,
        reason: reason.into(),
    }
}

fn positive(setting: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(setting, format!("must be a positive number, not {v}")))
    }
}

impl SimConfig {
    /// Checks every range the model relies on.
    pub fn validate(&self) -> Result<()> {
        let c = &self.cluster;
        for (name, v) in [
            ("cluster.nodes", c.nodes),
            ("cluster.ranks_per_node", c.ranks_per_node),
            ("cluster.workers", c.workers),
            ("cluster.batch_size", c.batch_size),
            ("dataset.prefixes", self.dataset.prefixes),
            ("order.window", self.order.window),
            ("model.sample_nodes", self.model.sample_nodes),
            ("model.steps_per_block", self.model.steps_per_block),
        ] {
            if v == 0 {
                return Err(bad(name, "must be at least 1"));
            }
        }
        if self.order.lanes == Some(0) {
            return Err(bad("order.lanes", "must be at least 1"));
        }
        if self.dataset.index.is_none() {
            if self.dataset.shards == 0 || self.dataset.samples_per_shard == 0 {
                return Err(bad("dataset.shards", "needs shards with samples"));
            }
            if self.dataset.shard_bytes == 0 {
                return Err(bad("dataset.shard_bytes", "must be at least 1"));
            }
        }
        positive("cluster.node_bandwidth", c.node_bandwidth)?;
        if let Some(r) = c.samples_per_second_per_rank {
            positive("cluster.samples_per_second_per_rank", r)?;
        }
        let s = &self.store;
        positive("store.get_limit", s.get_limit)?;
        positive("store.put_limit", s.put_limit)?;
        positive("store.connection_bandwidth", s.connection_bandwidth)?;
        positive("store.index_parse_rate", s.index_parse_rate)?;
        if !(s.latency.is_finite() && s.latency >= 0.0) {
            return Err(bad("store.latency", "must be 0 or more seconds"));
        }
        let sh = &self.shaping;
        positive("shaping.start_rate", sh.start_rate)?;
        positive("shaping.min_rate", sh.min_rate)?;
        positive("shaping.max_rate", sh.max_rate)?;
        if !(sh.decrease > 0.0 && sh.decrease < 1.0) {
            return Err(bad("shaping.decrease", "must be in (0, 1)"));
        }
        if !(sh.increase >= 0.0 && sh.cooldown >= 0.0 && sh.jitter >= 0.0) {
            return Err(bad(
                "shaping",
                "increase, cooldown and jitter must be 0 or more",
            ));
        }
        if let Some(limit) = sh.prefix_limit {
            positive("shaping.prefix_limit", limit)?;
        }
        self.shaping_processes()?;
        positive("model.seconds", self.model.seconds)?;
        if !(self.model.start_spread.is_finite() && self.model.start_spread >= 0.0) {
            return Err(bad("model.start_spread", "must be 0 or more seconds"));
        }
        if let Some(r) = &self.resize {
            if r.to_nodes == 0 {
                return Err(bad("resize.to_nodes", "must be at least 1"));
            }
            if !(r.at > 0.0 && r.at < 1.0) {
                return Err(bad("resize.at", "must be in (0, 1)"));
            }
        }
        if self.checkpoint.files_per_rank == 0 {
            return Err(bad("checkpoint.files_per_rank", "must be at least 1"));
        }
        Ok(())
    }

    /// Processes of a node that shape requests with a limiter of their own, as
    /// `storage::shaping::node_processes` counts them under torchrun: each rank and its
    /// DataLoader workers, `ranks_per_node x (workers + 1)`.
    pub fn shaping_processes(&self) -> Result<u32> {
        let c = &self.cluster;
        c.workers
            .checked_add(1)
            .and_then(|w| w.checked_mul(c.ranks_per_node))
            .ok_or_else(|| {
                bad(
                    "cluster.workers",
                    "ranks_per_node x (workers + 1) overflows",
                )
            })
    }

    /// Lanes of the order: the configured count, else the node count.
    pub fn lanes(&self) -> u32 {
        self.order.lanes.unwrap_or(self.cluster.nodes)
    }
}
