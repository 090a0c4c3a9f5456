//! The flags that say which node's cache a command works in, and with what budgets: declared
//! once here and flattened into `run`, `stream` and `mount`, so that their names, types and
//! precedence (docs/cache.md: flag, then environment, then default) cannot drift apart.

use std::path::PathBuf;

use shardstream_launcher::{CacheOverrides, Overrides};

use crate::units::ByteSize;

/// Which node of which run, and where its cache folder is.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeArgs {
    /// Run id (else SHARDSTREAM_RUN_ID, SHARDSTREAM_JOBSET_NAME, SHARDSTREAM_PYTORCHJOB_NAME,
    /// SHARDSTREAM_JOB_NAME, TORCHELASTIC_RUN_ID unless it is "none"; never invented).
    #[arg(long)]
    pub run_id: Option<String>,
    /// This node's rank (else SHARDSTREAM_NODE_RANK, JOB_COMPLETION_INDEX, PET_NODE_RANK,
    /// GROUP_RANK; 0 only when nothing suggests several nodes).
    #[arg(long)]
    pub node_rank: Option<u32>,
    /// Cache root: the node's folder is <cache-root>/<run-id>/<node-rank>/. Without it:
    /// SHARDSTREAM_CACHE_DIR as is, else under SHARDSTREAM_CACHE_ROOT or the default root.
    #[arg(long)]
    pub cache_root: Option<PathBuf>,
    /// The node's cache folder itself (as `shardstream run` exports it in
    /// SHARDSTREAM_CACHE_DIR); beats every other source and needs no run id.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

impl NodeArgs {
    /// The flags as the identity crate's overrides (the environment is read there).
    pub fn overrides(&self) -> CacheOverrides {
        CacheOverrides {
            cache_dir: self.cache_dir.clone(),
            cache_root: self.cache_root.clone(),
            run: Overrides {
                run_id: self.run_id.clone(),
                node_rank: self.node_rank,
                ..Overrides::default()
            },
        }
    }
}

/// The RAM and disk budgets of the fetch engine and the node cache.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BudgetArgs {
    /// RAM budget for everything in flight and buffered (docs/streaming.md, "Memory plan").
    #[arg(long)]
    pub memory_limit: Option<ByteSize>,
    /// Disk budget of the node cache.
    #[arg(long)]
    pub cache_limit: Option<ByteSize>,
}

/// The streamer's configuration for `remote` under these flags; the rest is left at its default
/// for the command to set.
pub fn streaming_config(
    remote: &str,
    split: Option<String>,
    node: &NodeArgs,
    budget: &BudgetArgs,
) -> shardstream_streamer::StreamingConfig {
    shardstream_streamer::StreamingConfig {
        remote: remote.to_string(),
        split,
        local: node.cache_dir.clone(),
        cache_root: node.cache_root.clone(),
        run_id: node.run_id.clone(),
        node_rank: node.node_rank.map(u64::from),
        memory_limit: budget.memory_limit.map(|b| b.0),
        cache_limit: budget.cache_limit.map(|b| b.0),
        ..shardstream_streamer::StreamingConfig::default()
    }
}
