//! `shardstream ckpt`: checkpoint management over the checkpoint crate.
//!
//! - `ls ROOT`: the committed checkpoints (a directory without a manifest is not one);
//! - `latest ROOT`: the newest committed checkpoint (non-zero exit when there is none);
//! - `verify ROOT [ID]`: every byte of a checkpoint against its manifest (non-zero on any problem);
//! - `gc ROOT`: retention (`--keep`, `--keep-every`) and leftovers older than `--older-than`;
//! - `download ROOT LOCAL`: a checkpoint into a local directory, checked part by part, that
//!   torch's `FileSystemReader` and shardstream's `StorageReader` both load.

use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use shardstream_checkpoint::{
    CheckpointInfo, CheckpointReader, CheckpointRoot, FileRecord, GcOptions, GcReport,
    RetentionPolicy,
};

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
        attempt: i.attempt.clone(),
    }
}

/// Runs `ckpt`.
pub fn run(args: CkptArgs, global: &Global) -> anyhow::Result<()> {
    let _ = global;
    let rt = runtime::build(runtime::default_workers())?;
    match args.action {
        CkptAction::Ls { root, json } => {
            let ckpt = open(&root)?;
            let list = rt.block_on(ckpt.list())?;
            let entries: Vec<Entry> = list.iter().map(|i| entry(&root, i)).collect();
            if json {
                println!("{}", serde_json::to_string(&entries)?);
            } else {
                for e in &entries {
                    let step = e.step.map_or_else(|| "-".to_owned(), |s| s.to_string());
                    println!(
                        "{}\tstep={step}\tworld_size={}\tfiles={}\tbytes={}",
                        e.id, e.world_size, e.files, e.total_bytes
                    );
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
                println!("{}", serde_json::to_string(&e)?);
            } else {
                println!("{}", e.url);
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
                println!("{out}");
            } else {
                for p in &problems {
                    println!("FAILED {p}");
                }
                if problems.is_empty() {
                    println!(
                        "ok: {id}: {} files, {} bytes verified",
                        report.files_checked, report.bytes_checked
                    );
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
            let (files, bytes) = rt.block_on(download(&reader, &local))?;
            if json {
                let out = serde_json::json!({
                    "id": id, "local": local, "files": files, "bytes": bytes,
                });
                println!("{out}");
            } else {
                println!(
                    "downloaded {id}: {files} files, {bytes} bytes, verified, to {}",
                    local.display()
                );
            }
            Ok(())
        }
    }
}

fn open(root: &str) -> anyhow::Result<CheckpointRoot> {
    CheckpointRoot::open_url(root).with_context(|| format!("opening checkpoint root {root}"))
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
            "local_staging_files_deleted": report.local_staging_files_deleted,
        });
        println!("{out}");
        return Ok(());
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    for id in &report.deleted {
        println!("{verb} checkpoint {id}");
    }
    for dir in &report.leftover_dirs_deleted {
        println!("{verb} unfinished save {dir}");
    }
    for dir in &report.unreadable {
        println!("left alone (manifest does not read) {dir}");
    }
    println!(
        "kept {} checkpoint(s); {verb} {} object(s), {} bytes; {} recent leftover(s) kept",
        report.kept.len(),
        report.objects_deleted,
        report.bytes_deleted,
        report.young_leftovers
    );
    Ok(())
}

/// Bytes per ranged read while downloading (rounded to whole parts so every part is checked).
const DOWNLOAD_CHUNK: u64 = 64 << 20;

/// Writes every file and alias of the checkpoint under `local`, each to a temporary name then
/// renamed, and the manifest last, so an interrupted download is never a loadable checkpoint.
async fn download(reader: &CheckpointReader, local: &FsPath) -> anyhow::Result<(usize, u64)> {
    let manifest = reader.manifest();
    let mut files = 0usize;
    let mut bytes = 0u64;
    for rec in &manifest.files {
        bytes += fetch_file(reader, &rec.path, rec, &local.join(&rec.path)).await?;
        files += 1;
    }
    for alias in &manifest.aliases {
        let rec = reader.record(&alias.path)?;
        bytes += fetch_file(reader, &alias.path, rec, &local.join(&alias.path)).await?;
        files += 1;
    }
    let json = manifest.to_json()?;
    write_atomically(
        &local.join(shardstream_checkpoint::layout::MANIFEST_NAME),
        &[bytes::Bytes::from(json)],
    )
    .await?;
    Ok((files, bytes))
}

async fn fetch_file(
    reader: &CheckpointReader,
    path: &str,
    rec: &FileRecord,
    dest: &FsPath,
) -> anyhow::Result<u64> {
    use tokio::io::AsyncWriteExt;

    let (tmp, mut out) = create_partial(dest).await?;
    // Whole parts per read (or the whole file when it has none), so every byte is checked.
    let step = match DOWNLOAD_CHUNK.checked_div(rec.part_size) {
        Some(parts) => parts.max(1) * rec.part_size,
        None => rec.size.max(1),
    };
    let mut off = 0;
    while off < rec.size || (rec.size == 0 && off == 0) {
        let end = (off + step).min(rec.size);
        let data = reader
            .read_range(path, off..end)
            .await
            .with_context(|| format!("downloading {path}"))?;
        out.write_all(&data)
            .await
            .with_context(|| format!("writing {}", tmp.display()))?;
        if end == off {
            break;
        }
        off = end;
    }
    publish_partial(out, &tmp, dest).await?;
    Ok(rec.size)
}

async fn write_atomically(dest: &FsPath, chunks: &[bytes::Bytes]) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;

    let (tmp, mut out) = create_partial(dest).await?;
    for c in chunks {
        out.write_all(c)
            .await
            .with_context(|| format!("writing {}", tmp.display()))?;
    }
    publish_partial(out, &tmp, dest).await
}

/// Creates `dest`'s folder and its `.partial` file, which [`publish_partial`] renames into place:
/// a download that stops half-way never leaves a file that looks complete.
async fn create_partial(dest: &FsPath) -> anyhow::Result<(PathBuf, tokio::fs::File)> {
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = tmp_name(dest);
    let out = tokio::fs::File::create(&tmp)
        .await
        .with_context(|| format!("creating {}", tmp.display()))?;
    Ok((tmp, out))
}

/// Syncs the `.partial` file and renames it to `dest`.
async fn publish_partial(out: tokio::fs::File, tmp: &FsPath, dest: &FsPath) -> anyhow::Result<()> {
    out.sync_all()
        .await
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(out);
    tokio::fs::rename(tmp, dest)
        .await
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))
}

fn tmp_name(dest: &FsPath) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dest.with_file_name(name)
}
