//! `shardstream run`: the pod entrypoint wrapper around torchrun.

use std::path::PathBuf;

use crate::Global;

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

/// Runs `run`.
pub fn run(args: RunArgs, global: &Global) -> anyhow::Result<()> {
    let _ = (args, global);
    super::unavailable::not_available(7)
}
