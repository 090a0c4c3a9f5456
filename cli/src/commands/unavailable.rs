//! `stream`, `mount`, `ckpt` and `run`: their interface is declared (so `--help` shows it), and
//! they say they are not in this build yet.

use std::path::PathBuf;

use anyhow::bail;

use crate::units::ByteSize;

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

/// `mount DATASET MOUNTPOINT`: a read-only FUSE view of a dataset.
#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Dataset location.
    pub dataset: String,
    /// Where to mount it.
    pub mountpoint: PathBuf,
    /// Cache root.
    #[arg(long, env = "SHARDSTREAM_CACHE_ROOT")]
    pub cache_root: Option<PathBuf>,
    /// Stay in the foreground.
    #[arg(long)]
    pub foreground: bool,
}

/// `ckpt`: checkpoint management.
#[derive(Debug, clap::Args)]
pub struct CkptArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: CkptAction,
}

/// The `ckpt` actions.
#[derive(Debug, clap::Subcommand)]
pub enum CkptAction {
    /// List the complete checkpoints under ROOT.
    Ls {
        /// Checkpoint root.
        root: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Print the latest complete checkpoint under ROOT.
    Latest {
        /// Checkpoint root.
        root: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Check a checkpoint's files against its manifest.
    Verify {
        /// Checkpoint root.
        root: String,
        /// Checkpoint id (default: the latest).
        id: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Delete incomplete checkpoints and all but the newest --keep.
    Gc {
        /// Checkpoint root.
        root: String,
        /// Complete checkpoints to keep.
        #[arg(long)]
        keep: Option<usize>,
        /// Only print what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Download a checkpoint to a local folder.
    Download {
        /// Checkpoint root.
        root: String,
        /// Local folder.
        local: PathBuf,
        /// Checkpoint id (default: the latest).
        #[arg(long)]
        id: Option<String>,
    },
}

/// `run -- COMMAND...`: the pod entrypoint wrapper around torchrun.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Run id.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Cache root.
    #[arg(long, env = "SHARDSTREAM_CACHE_ROOT")]
    pub cache_root: Option<PathBuf>,
    /// Mount DATASET at PATH for the command's lifetime (repeatable).
    #[arg(long, value_name = "DATASET:PATH")]
    pub mount: Vec<String>,
    /// The command to run.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Refuses a command that is declared but not built yet, pointing at its issue.
pub fn not_available(issue: u32) -> anyhow::Result<()> {
    bail!("not available yet in this build: see issue {issue}")
}
