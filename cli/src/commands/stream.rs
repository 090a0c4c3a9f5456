//! `shardstream stream`: stream one epoch through the streamer (pre-warm a cache, or measure).

use crate::units::ByteSize;
use std::path::PathBuf;

use crate::Global;

/// `stream DATASET`: stream one epoch (pre-warm a cache, or measure throughput).
#[derive(Debug, clap::Args)]
pub struct StreamArgs {
    /// Dataset location (local path or s3://, gs://, az:// URL).
    pub dataset: String,
    /// Cache root; the run's cache is <cache-root>/<run-id>/<node-rank>/.
    #[arg(long, env = "SHARDSTREAM_CACHE_ROOT")]
    pub cache_root: Option<PathBuf>,
    /// Run id (else SHARDSTREAM_RUN_ID, the launcher's job name, TORCHELASTIC_RUN_ID).
    #[arg(long)]
    pub run_id: Option<String>,
    /// This node's rank (else SHARDSTREAM_NODE_RANK, JOB_COMPLETION_INDEX, PET_NODE_RANK, GROUP_RANK).
    #[arg(long)]
    pub node_rank: Option<u64>,
    /// Number of nodes.
    #[arg(long)]
    pub num_nodes: Option<u64>,
    /// Processes per node.
    #[arg(long)]
    pub nproc_per_node: Option<u64>,
    /// DataLoader workers per process.
    #[arg(long)]
    pub num_workers: Option<u64>,
    /// Batch size per process.
    #[arg(long)]
    pub batch_size: Option<u64>,
    /// Shuffle the sample order.
    #[arg(long)]
    pub shuffle: bool,
    /// Shuffle seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Epoch.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// RAM budget for everything in flight and buffered.
    #[arg(long)]
    pub memory_limit: Option<ByteSize>,
    /// Disk budget of the cache.
    #[arg(long)]
    pub cache_limit: Option<ByteSize>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `stream`.
pub fn run(args: StreamArgs, global: &Global) -> anyhow::Result<()> {
    let _ = (args, global);
    super::unavailable::not_available(3)
}
