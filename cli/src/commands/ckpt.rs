//! `shardstream ckpt`: checkpoint management over the checkpoint crate.

use std::path::PathBuf;

use crate::Global;

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

/// Runs `ckpt`.
pub fn run(args: CkptArgs, global: &Global) -> anyhow::Result<()> {
    let _ = (args, global);
    super::unavailable::not_available(6)
}
