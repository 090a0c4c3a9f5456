//! `shardstream mount`: a read-only FUSE view of a dataset.

use std::path::PathBuf;

use crate::Global;

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

/// Runs `mount`.
pub fn run(args: MountArgs, global: &Global) -> anyhow::Result<()> {
    let _ = (args, global);
    super::unavailable::not_available(5)
}
