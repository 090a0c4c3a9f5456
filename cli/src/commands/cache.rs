//! `shardstream cache`: node cache maintenance (`cache gc` removes the folders of finished runs).

use std::path::PathBuf;

use crate::Global;

/// `cache ACTION`.
#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: CacheAction,
}

/// The `cache` actions.
#[derive(Debug, clap::Subcommand)]
pub enum CacheAction {
    /// Remove the cache folders of runs that are over.
    Gc {
        /// Cache root.
        #[arg(long, env = "SHARDSTREAM_CACHE_ROOT")]
        cache_root: Option<PathBuf>,
    },
}

/// Runs `cache`.
pub fn run(args: CacheArgs, global: &Global) -> anyhow::Result<()> {
    let _ = (args, global);
    super::unavailable::not_available(7)
}
