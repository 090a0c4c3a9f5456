//! `shardstream ckpt`: checkpoint management over the checkpoint crate.
//!
//! - `ls ROOT`: the committed checkpoints (a directory without a manifest is not one);
//! - `latest ROOT`: the last committed checkpoint (by commit time, not step; non-zero exit when
//!   there is none);
//! - `verify ROOT [ID]`: every byte of a checkpoint against its manifest (non-zero on any problem);
//! - `gc ROOT`: retention (`--keep`, `--keep-every`) and leftovers older than `--older-than`;
//! - `download ROOT LOCAL`: a checkpoint into a local directory, checked part by part, that
//!   torch's `FileSystemReader` and shardstream's `StorageReader` both load
//!   ([`shardstream_checkpoint::CheckpointReader::download_to`]: sizes checked against the
//!   store before anything is allocated, bounded memory, no `.partial` left on failure).
//!
//! Under `shardstream run` a command's checkpoint traffic (verify and download read every
//! byte) is published into the node's metrics when it ends, as the Python backends do.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use serde::Serialize;
use shardstream_checkpoint::{
    CheckpointInfo, CheckpointMetrics, CheckpointRoot, DownloadReport, GcOptions, GcReport,
    RetentionPolicy,
};
use shardstream_storage::object_store::ObjectStore;
use shardstream_streamer::dataset::{NamedCounters, ProcessCounters};

use crate::output::outln;
use crate::{runtime, Global};

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
    /// Print the latest complete checkpoint under ROOT (the last committed, not the highest step).
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
    /// Delete incomplete checkpoints and all but the last --keep committed (by commit time).
    /// Only the checkpoint layout is touched (manifests, aliases, attempt-* folders); other
    /// files under ROOT are left alone, and every deletion is printed.
    Gc {
        /// Checkpoint root.
        root: String,
        /// Complete checkpoints to keep (the latest is always kept).
        #[arg(long)]
        keep: Option<usize>,
        /// Also keep every checkpoint whose step is a multiple of this.
        #[arg(long)]
        keep_every: Option<u64>,
        /// Delete leftovers of unfinished saves only once their newest object is this old
        /// (e.g. 30m, 24h, 2d; default 24h). Must be longer than the longest save.
        #[arg(long, value_parser = parse_age)]
        older_than: Option<Duration>,
        /// Only print what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// JSON output.
        #[arg(long)]
        json: bool,
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
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

impl CkptAction {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            CkptAction::Ls { json, .. }
            | CkptAction::Latest { json, .. }
            | CkptAction::Verify { json, .. }
            | CkptAction::Gc { json, .. }
            | CkptAction::Download { json, .. } => *json,
        }
    }
}

/// `30s`, `15m`, `24h`, `2d` (a bare number is seconds).
fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with s, m, h or d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use s, m, h or d)")),
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?}: too large"))
}

/// A committed checkpoint, as `ls`, `latest` and `--json` print it.
#[derive(Debug, Serialize)]
struct Entry {
    id: String,
    url: String,
    step: Option<u64>,
    world_size: u32,
    files: usize,
    total_bytes: u64,
    created_unix_ms: u64,
    committed_unix_ms: u64,
    attempt: String,
}

fn entry(root: &str, i: &CheckpointInfo) -> Entry {
    Entry {
        id: i.id.clone(),
        url: format!("{}/{}", root.trim_end_matches('/'), i.id),
        step: i.step,
        world_size: i.world_size,
        files: i.files,
        total_bytes: i.total_bytes,
        created_unix_ms: i.created_unix_ms,
        committed_unix_ms: i.committed_unix_ms,
        attempt: i.attempt.clone(),
    }
}

/// Runs `ckpt`.
pub fn run(args: CkptArgs, global: &Global) -> anyhow::Result<()> {
    let _ = global;
    let node = ProcessCounters::from_env();
    let counters = || NamedCounters::new(CheckpointMetrics::global().snapshot().named());
    node.start(counters);
    let result = run_action(args);
    node.publish(counters);
    result
}

fn run_action(args: CkptArgs) -> anyhow::Result<()> {
    let rt = runtime::build(runtime::default_workers())?;
    match args.action {
        CkptAction::Ls { root, json } => {
            let ckpt = open(&root)?;
            let list = rt.block_on(ckpt.list())?;
            if list.is_empty() {
                rt.block_on(ensure_root_exists(&ckpt, &root))?;
            }
            let entries: Vec<Entry> = list.iter().map(|i| entry(&root, i)).collect();
            if json {
                outln!("{}", serde_json::to_string(&entries)?)?;
            } else {
                for e in &entries {
                    let step = e.step.map_or_else(|| "-".to_owned(), |s| s.to_string());
                    outln!(
                        "{}\tstep={step}\tworld_size={}\tfiles={}\tbytes={}",
                        e.id,
                        e.world_size,
                        e.files,
                        e.total_bytes
                    )?;
                }
            }
            Ok(())
        }
        CkptAction::Latest { root, json } => {
            let ckpt = open(&root)?;
            let Some(info) = rt.block_on(ckpt.latest())? else {
                bail!("no committed checkpoint under {root}");
            };
            let e = entry(&root, &info);
            if json {
                outln!("{}", serde_json::to_string(&e)?)?;
            } else {
                outln!("{}", e.url)?;
            }
            Ok(())
        }
        CkptAction::Verify { root, id, json } => {
            let ckpt = open(&root)?;
            let id = resolve_id(&rt, &ckpt, &root, id)?;
            let report = rt
                .block_on(ckpt.verify(&id))
                .with_context(|| format!("verifying checkpoint {id} under {root}"))?;
            let problems: Vec<String> = report.failures.iter().map(|f| f.to_string()).collect();
            if json {
                let out = serde_json::json!({
                    "id": id, "ok": problems.is_empty(), "files_checked": report.files_checked,
                    "bytes_checked": report.bytes_checked, "problems": problems,
                });
                outln!("{out}")?;
            } else {
                for p in &problems {
                    outln!("FAILED {p}")?;
                }
                if problems.is_empty() {
                    outln!(
                        "ok: {id}: {} files, {} bytes verified",
                        report.files_checked,
                        report.bytes_checked
                    )?;
                }
            }
            if !problems.is_empty() {
                bail!(
                    "checkpoint {id} under {root}: {} problem(s)",
                    problems.len()
                );
            }
            Ok(())
        }
        CkptAction::Gc {
            root,
            keep,
            keep_every,
            older_than,
            dry_run,
            json,
        } => {
            let ckpt = open(&root)?;
            rt.block_on(ensure_root_exists(&ckpt, &root))?;
            let defaults = GcOptions::default();
            let opts = GcOptions {
                policy: RetentionPolicy {
                    keep_last: keep.unwrap_or(defaults.policy.keep_last),
                    keep_every: keep_every.or(defaults.policy.keep_every),
                },
                leftovers_older_than: older_than.unwrap_or(defaults.leftovers_older_than),
                dry_run,
                local_root: None,
            };
            let report = rt.block_on(ckpt.gc(&opts))?;
            print_gc(&report, dry_run, json)
        }
        CkptAction::Download {
            root,
            local,
            id,
            json,
        } => {
            let ckpt = open(&root)?;
            let id = resolve_id(&rt, &ckpt, &root, id)?;
            let reader = rt.block_on(ckpt.open(&id))?;
            // On Ctrl-C the download future is dropped rather than the process killed, so its
            // `.partial` guard removes the unfinished file.
            let DownloadReport { files, bytes } = rt
                .block_on(async {
                    tokio::select! {
                        r = reader.download_to(&local) => r.map_err(anyhow::Error::from),
                        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
                    }
                })
                .with_context(|| format!("downloading checkpoint {id} under {root}"))?;
            if json {
                let out = serde_json::json!({
                    "id": id, "local": local, "files": files, "bytes": bytes,
                });
                outln!("{out}")?;
            } else {
                outln!(
                    "downloaded {id}: {files} files, {bytes} bytes, verified, to {}",
                    local.display()
                )?;
            }
            Ok(())
        }
    }
}

fn open(root: &str) -> anyhow::Result<CheckpointRoot> {
    CheckpointRoot::open_url(root).with_context(|| format!("opening checkpoint root {root}"))
}

/// Fails unless `root` exists, so that a mistyped root is an error rather than an empty
/// listing (or a gc that finds nothing to do): a local root must be a folder; an object-store
/// root, which has no folders, must have at least one object under its prefix. A root that
/// exists and holds no checkpoint yet is fine.
async fn ensure_root_exists(ckpt: &CheckpointRoot, root: &str) -> anyhow::Result<()> {
    if let Some(dir) = ckpt.local_root() {
        return match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => bail!("checkpoint root {root} is not a folder"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("checkpoint root {root} does not exist")
            }
            Err(e) => Err(e).with_context(|| format!("checkpoint root {root}")),
        };
    }
    let first = ckpt.store().list(Some(ckpt.root())).next().await;
    match first {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(e).with_context(|| format!("listing checkpoint root {root}")),
        None => bail!("checkpoint root {root} does not exist: no object under it (mistyped?)"),
    }
}

fn resolve_id(
    rt: &tokio::runtime::Runtime,
    ckpt: &CheckpointRoot,
    root: &str,
    id: Option<String>,
) -> anyhow::Result<String> {
    match id {
        Some(id) => Ok(id),
        None => match rt.block_on(ckpt.latest())? {
            Some(info) => Ok(info.id),
            None => bail!("no committed checkpoint under {root}"),
        },
    }
}

fn print_gc(report: &GcReport, dry_run: bool, json: bool) -> anyhow::Result<()> {
    if json {
        let out = serde_json::json!({
            "dry_run": dry_run,
            "kept": report.kept,
            "deleted": report.deleted,
            "leftover_dirs_deleted": report.leftover_dirs_deleted,
            "young_leftovers": report.young_leftovers,
            "unreadable": report.unreadable,
            "objects_deleted": report.objects_deleted,
            "bytes_deleted": report.bytes_deleted,
            "stale_attempts_deleted": report.stale_attempts_deleted,
            "local_staging_files_deleted": report.local_staging_files_deleted,
            "local_paths_deleted": report.local_paths_deleted,
            "foreign_objects": report.foreign_objects,
            "foreign_dirs": report.foreign_dirs,
        });
        outln!("{out}")?;
        return Ok(());
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    for id in &report.deleted {
        outln!("{verb} checkpoint {id}")?;
    }
    for dir in &report.leftover_dirs_deleted {
        outln!("{verb} unfinished save {dir}")?;
    }
    for attempt in &report.stale_attempts_deleted {
        outln!("{verb} dead attempt {attempt}")?;
    }
    for path in &report.local_paths_deleted {
        outln!("{verb} {}", path.display())?;
    }
    for dir in &report.unreadable {
        outln!("left alone (manifest does not read) {dir}")?;
    }
    for dir in &report.foreign_dirs {
        outln!("left alone (not a checkpoint) {dir}")?;
    }
    if report.foreign_objects > 0 {
        outln!(
            "left alone {} object(s) inside checkpoint folders that gc does not manage",
            report.foreign_objects
        )?;
    }
    outln!(
        "kept {} checkpoint(s); {verb} {} object(s), {} bytes; {} recent leftover(s) kept",
        report.kept.len(),
        report.objects_deleted,
        report.bytes_deleted,
        report.young_leftovers
    )?;
    Ok(())
}
