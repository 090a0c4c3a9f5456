//! `upload LOCAL REMOTE` and `download REMOTE LOCAL`: whole folders, in parallel, resumable
//! (a file the other side already holds with the same size is skipped; `--force` sends all),
//! verified.
//!
//! Upload: an MDS dataset (a folder with an `index.json` holding `"shards"`) is verified first
//! (every shard's size and hashes), so corrupt shards are never published; `index.json` goes up
//! last, so a reader never finds an index whose shards are not there yet; afterwards the remote
//! listing must show every file at its local size. Names starting with `.` (temporary files) are
//! not uploaded. Download: files land complete or not at all (temporary name, then rename); an
//! MDS dataset is verified after download (sizes and hashes), other files by size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::{stream, StreamExt, TryStreamExt};
use serde::Serialize;
use shardstream_sharding::input::InputFormat;
use shardstream_storage::{sync_down_with, Env, Location, StorageOptions, SyncOptions};

use crate::commands::verify;
use crate::{dataset, progress, runtime, Global};

/// Arguments of `upload` and `download`.
#[derive(Debug, clap::Args)]
pub struct TransferArgs {
    /// Source folder (local for upload, a URL for download).
    pub from: String,
    /// Destination folder (a URL for upload, local for download).
    pub to: String,
    /// Requests in flight (default: 4 per core, at least 8).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Transfer every file, even those the destination already holds.
    #[arg(long)]
    pub force: bool,
    /// Skip the MDS hash verification (sizes are still checked).
    #[arg(long)]
    pub no_verify: bool,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// What a transfer did.
#[derive(Debug, Default, Serialize)]
pub struct TransferReport {
    /// Files transferred.
    pub transferred: u64,
    /// Files skipped (already there).
    pub skipped: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Seconds taken.
    pub seconds: f64,
    /// Whether an MDS index was found and every shard verified.
    pub verified_mds: bool,
}

fn workers(args: &TransferArgs) -> usize {
    args.workers
        .unwrap_or_else(|| (runtime::default_workers() * 4).max(8))
        .max(1)
}

fn open(url: &str, workers: usize) -> anyhow::Result<Location> {
    let options = StorageOptions::default().with_concurrency(workers);
    Location::open_with(url, &options, &Env::from_process())
        .with_context(|| format!("cannot open {url}"))
}

/// Runs `upload`.
pub fn upload(args: TransferArgs, global: &Global) -> anyhow::Result<()> {
    let workers = workers(&args);
    let local = PathBuf::from(&args.from);
    if !local.is_dir() {
        bail!("{}: not a folder", local.display());
    }
    let rt = runtime::build(runtime::default_workers())?;
    let report = rt.block_on(async {
        let started = Instant::now();
        let mut report = TransferReport::default();
        let is_mds = is_mds_folder(&local);
        if is_mds && !args.no_verify {
            check_mds(&args.from, workers, global.progress())
                .await
                .context("not uploading")?;
            report.verified_mds = true;
        }
        let dest = open(&args.to, workers)?;
        let files = local_files(&local)?;
        let remote: BTreeMap<String, u64> = dest
            .list("")
            .await
            .with_context(|| format!("cannot list {}", dest.url()))?
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect();
        let total: u64 = files.iter().map(|(_, _, size)| size).sum();
        let bar = progress::bytes(total, "uploaded", global.progress());
        let (index, rest): (Vec<_>, Vec<_>) =
            files.iter().partition(|(key, _, _)| key == "index.json");
        // Everything else first, index.json last.
        for batch in [rest, index] {
            let moved: Vec<Option<u64>> = stream::iter(batch)
                .map(|(key, path, size)| {
                    let (dest, bar) = (&dest, &bar);
                    let skip = !args.force && key != "index.json" && remote.get(key) == Some(size);
                    async move {
                        if skip {
                            bar.inc(*size);
                            return Ok(None);
                        }
                        let n = dest.upload_file(path, key).await.with_context(|| {
                            format!("cannot upload {} to {}", path.display(), dest.url_of(key))
                        })?;
                        bar.inc(n);
                        anyhow::Ok(Some(n))
                    }
                })
                .buffer_unordered(workers)
                .try_collect()
                .await?;
            for m in moved {
                match m {
                    Some(n) => {
                        report.transferred += 1;
                        report.bytes += n;
                    }
                    None => report.skipped += 1,
                }
            }
        }
        bar.finish_and_clear();
        let after: BTreeMap<String, u64> = dest
            .list("")
            .await?
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect();
        for (key, _, size) in &files {
            match after.get(key) {
                Some(s) if s == size => {}
                Some(s) => bail!(
                    "{}: {s} bytes after upload, {size} locally",
                    dest.url_of(key)
                ),
                None => bail!("{}: missing after upload", dest.url_of(key)),
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        anyhow::Ok(report)
    })?;
    print_report(&report, "uploaded", &args);
    Ok(())
}

/// Runs `download`.
pub fn download(args: TransferArgs, global: &Global) -> anyhow::Result<()> {
    let workers = workers(&args);
    let local = PathBuf::from(&args.to);
    let rt = runtime::build(runtime::default_workers())?;
    let report = rt.block_on(async {
        let started = Instant::now();
        let src = open(&args.from, workers)?;
        let listing = src
            .list("")
            .await
            .with_context(|| format!("cannot list {}", src.url()))?;
        if listing.is_empty() {
            bail!("{}: nothing to download", src.url());
        }
        if args.force {
            for object in &listing {
                let _ = std::fs::remove_file(local.join(&object.key));
            }
        }
        let total: u64 = listing.iter().map(|o| o.size).sum();
        let bar = progress::bytes(total, "downloaded", global.progress());
        let moved = Arc::new(AtomicU64::new(0));
        let options = SyncOptions {
            progress: Some(Arc::clone(&moved)),
            ..SyncOptions::default()
        };
        let ticker = {
            let (bar, moved) = (bar.clone(), Arc::clone(&moved));
            tokio::spawn(async move {
                loop {
                    bar.set_position(moved.load(Ordering::Relaxed));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        };
        let synced = sync_down_with(&src, &local, &options).await;
        ticker.abort();
        bar.finish_and_clear();
        let synced = synced.with_context(|| format!("cannot download {}", src.url()))?;
        for object in &listing {
            let path = local.join(&object.key);
            let size = std::fs::metadata(&path)
                .with_context(|| format!("{}: missing after download", path.display()))?
                .len();
            if size != object.size {
                bail!(
                    "{}: {size} bytes after download, {} remotely",
                    path.display(),
                    object.size
                );
            }
        }
        let mut report = TransferReport {
            transferred: synced.transferred as u64,
            skipped: synced.skipped as u64,
            bytes: synced.bytes,
            ..TransferReport::default()
        };
        if is_mds_folder(&local) && !args.no_verify {
            check_mds(&args.to, workers, global.progress()).await?;
            report.verified_mds = true;
        }
        report.seconds = started.elapsed().as_secs_f64();
        anyhow::Ok(report)
    })?;
    print_report(&report, "downloaded", &args);
    Ok(())
}

fn print_report(report: &TransferReport, verb: &str, args: &TransferArgs) {
    if args.json {
        println!("{}", serde_json::to_string(report).unwrap_or_default());
    } else {
        let verified = if report.verified_mds {
            ", MDS shards verified"
        } else {
            ""
        };
        println!(
            "{verb} {} files ({} bytes), skipped {} already there, in {:.1}s{verified}: {} -> {}",
            report.transferred, report.bytes, report.skipped, report.seconds, args.from, args.to
        );
    }
}

fn is_mds_folder(dir: &Path) -> bool {
    std::fs::read(dir.join("index.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|j| j.get("shards").is_some())
}

/// Verifies the MDS dataset at `spec`, failing with the first problem.
async fn check_mds(spec: &str, workers: usize, show_progress: bool) -> anyhow::Result<()> {
    let dataset = dataset::open(spec, InputFormat::Mds, true).await?;
    let report = verify::verify(&dataset, workers, show_progress).await?;
    match report.problems.first() {
        None => Ok(()),
        Some(p) => bail!(
            "{} fails verification ({} problem(s)), first {}: {}",
            spec,
            report.problems.len(),
            p.file,
            p.problem
        ),
    }
}

/// Regular files below `root` as (key, path, size), sorted by key; names starting with `.` are
/// skipped (temporary files of writers and downloads).
fn local_files(root: &Path) -> anyhow::Result<Vec<(String, PathBuf, u64)>> {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(true) {
        let entry = entry.with_context(|| format!("cannot walk {}", root.display()))?;
        if entry.file_name().to_string_lossy().starts_with('.') || !entry.file_type().is_file() {
            continue;
        }
        let rel = entry.path().strip_prefix(root).unwrap_or(entry.path());
        let key = rel
            .components()
            .map(|c| c.as_os_str().to_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .with_context(|| format!("{}: name is not UTF-8", entry.path().display()))?
            .join("/");
        let size = entry
            .metadata()
            .with_context(|| format!("cannot stat {}", entry.path().display()))?
            .len();
        out.push((key, entry.path().to_path_buf(), size));
    }
    out.sort();
    Ok(out)
}
