//! One module per subcommand; [`run`] dispatches.

use crate::Global;

pub mod cache;
pub mod cat;
pub mod ckpt;
pub mod completions;
pub mod inspect;
pub mod merge_index;
pub mod mount;
pub mod mount_check;
pub mod run;
pub mod shard;
pub mod simulate;
pub mod stream;
pub mod transfer;
pub mod verify;

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Convert raw data (files, ImageFolder, JSONL, WebDataset, MDS, LitData) into MDS or WebDataset
    /// shards, locally or straight to an object store.
    Shard(shard::ShardArgs),
    /// Merge ROOT/*/index.json (parts written with `shard --part`) into ROOT/index.json, as
    /// Mosaic's merge_index does.
    MergeIndex(merge_index::MergeIndexArgs),
    /// Upload a local folder to a remote location: parallel, resumable, verified.
    Upload(transfer::TransferArgs),
    /// Download a remote folder to a local one: parallel, resumable, verified.
    Download(transfer::TransferArgs),
    /// Describe a dataset: format, shards, samples, bytes, columns, compression, hashes.
    Inspect(inspect::InspectArgs),
    /// Check every shard's size and recorded hashes; non-zero exit on any mismatch.
    Verify(verify::VerifyArgs),
    /// Print samples, in dataset order.
    Cat(cat::CatArgs),
    /// Stream one epoch: pre-warm a cache, or measure throughput.
    Stream(stream::StreamArgs),
    /// Mount a dataset read-only with FUSE.
    Mount(mount::MountArgs),
    /// Liveness probe of a mount: exit 0 when a mount at MOUNTPOINT answers, non-zero when it
    /// is dead (ENOTCONN), missing or hung.
    MountCheck(mount_check::MountCheckArgs),
    /// Checkpoint management.
    Ckpt(ckpt::CkptArgs),
    /// Pod entrypoint around torchrun: prepare the cache, mount, export the env, clean up.
    Run(run::RunArgs),
    /// Node cache maintenance.
    Cache(cache::CacheArgs),
    /// Model a cluster, dataset and store at scale (docs/scale.md).
    Simulate(simulate::SimulateArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
}

impl Command {
    /// Whether the command was asked for JSON output (`--json`): its error is JSON then too.
    pub fn json(&self) -> bool {
        match self {
            Command::Shard(a) => a.json,
            Command::MergeIndex(a) => a.json,
            Command::Upload(a) | Command::Download(a) => a.json,
            Command::Inspect(a) => a.json,
            Command::Verify(a) => a.json,
            Command::Cat(a) => a.json,
            Command::Stream(a) => a.json,
            Command::Simulate(a) => a.json,
            Command::Ckpt(a) => a.action.json(),
            Command::Cache(a) => a.action.json(),
            Command::Mount(_)
            | Command::MountCheck(_)
            | Command::Run(_)
            | Command::Completions(_) => false,
        }
    }
}

/// Runs `command`.
pub fn run(command: Command, global: &Global) -> anyhow::Result<()> {
    match command {
        Command::Shard(args) => shard::run(args, global),
        Command::MergeIndex(args) => merge_index::run(args),
        Command::Upload(args) => transfer::upload(args, global),
        Command::Download(args) => transfer::download(args, global),
        Command::Inspect(args) => inspect::run(args, global),
        Command::Verify(args) => verify::run(args, global),
        Command::Cat(args) => cat::run(args, global),
        Command::Stream(args) => stream::run(args, global),
        Command::Simulate(args) => simulate::run(args),
        Command::Mount(args) => mount::run(args, global),
        Command::MountCheck(args) => mount_check::run(&args),
        Command::Ckpt(args) => ckpt::run(args, global),
        Command::Run(args) => run::run(args, global),
        Command::Cache(args) => cache::run(args, global),
        Command::Completions(args) => completions::run(&args),
    }
}
