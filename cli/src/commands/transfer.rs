//! `upload LOCAL REMOTE` and `download REMOTE LOCAL`: whole folders, in parallel, resumable
//! (a file the other side already holds with the same size is skipped; `--force` sends all),
//! verified.
//!
//! Upload: an MDS dataset (a folder with an `index.json` holding `"shards"`) is verified first
//! (every shard's size and hashes), so corrupt shards are never published. Commit markers go up
//! last, each phase finished before the next starts ([`upload_phase`]): data files first, then
//! torch DCP's `.metadata` of a plain DCP folder, then `index.json` and checkpoint manifests
//! (`_shardstream_manifest.json`), then the `.metadata` copy next to a manifest, as a checkpoint
//! commit publishes it. So a reader never finds an index whose shards are not there yet, nor a
//! committed checkpoint with files missing. Afterwards the remote listing must show every file at
//! its local size. Every file is uploaded, dotfiles included (DCP's `.metadata` is one), except
//! the temporary files of shardstream and `object_store` ([`is_excluded`]). Download: files land
//! complete or not at all (temporary name, then rename); an MDS dataset is verified after
//! download (sizes and hashes), other files by size.

use std::collections::{BTreeMap, HashSet};
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
use crate::output::outln;
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
        let keys: HashSet<&str> = files.iter().map(|(k, _, _)| k.as_str()).collect();
        let remote: BTreeMap<String, u64> = dest
            .list("")
            .await
            .with_context(|| format!("cannot list {}", dest.url()))?
            .into_iter()
            .map(|o| (o.key, o.size))
            .collect();
        let total: u64 = files.iter().map(|(_, _, size)| size).sum();
        let bar = progress::bytes(total, "uploaded", global.progress());
        // Phase by phase, each finished before the next starts: commit markers last.
        for batch in upload_plan(&files) {
            let moved: Vec<Option<u64>> = stream::iter(batch)
                .map(|(key, path, size)| {
                    let (dest, bar) = (&dest, &bar);
                    // A marker is always sent: a same-sized one may describe other files.
                    let skip = !args.force
                        && upload_phase(key, &keys) < MARKER_PHASE
                        && remote.get(key) == Some(size);
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
    print_report(&report, "uploaded", &args)?;
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
    print_report(&report, "downloaded", &args)?;
    Ok(())
}

fn print_report(report: &TransferReport, verb: &str, args: &TransferArgs) -> anyhow::Result<()> {
    if args.json {
        outln!("{}", serde_json::to_string(report).unwrap_or_default())?;
    } else {
        let verified = if report.verified_mds {
            ", MDS shards verified"
        } else {
            ""
        };
        outln!(
            "{verb} {} files ({} bytes), skipped {} already there, in {:.1}s{verified}: {} -> {}",
            report.transferred,
            report.bytes,
            report.skipped,
            report.seconds,
            args.from,
            args.to
        )?;
    }
    Ok(())
}

fn is_mds_folder(dir: &Path) -> bool {
    shardstream_sharding::index_file::read_index_file(&dir.join("index.json"))
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

/// A local file to upload: (key, path, size).
type LocalFile = (String, PathBuf, u64);

/// Name of a checkpoint manifest (its presence is a checkpoint's commit).
const MANIFEST_NAME: &str = shardstream_checkpoint::layout::MANIFEST_NAME;

/// The phase of commit markers (`index.json`, checkpoint manifests).
const MARKER_PHASE: u8 = 2;

/// When `key` goes up, given every key of the upload: 0 data; 1 torch DCP's `.metadata` in a
/// folder without a manifest (DCP's own commit marker: a plain DCP folder, or a save attempt's
/// copy, which its manifest lists, so it must land before the manifest); 2 the top-level
/// `index.json` and every `_shardstream_manifest.json`; 3 a `.metadata` next to a manifest (the
/// alias a checkpoint commit publishes after its manifest).
fn upload_phase(key: &str, keys: &HashSet<&str>) -> u8 {
    let (dir, name) = match key.rsplit_once('/') {
        Some((dir, name)) => (Some(dir), name),
        None => (None, key),
    };
    if key == "index.json" || name == MANIFEST_NAME {
        return MARKER_PHASE;
    }
    if name != ".metadata" {
        return 0;
    }
    let manifest = dir.map_or_else(
        || MANIFEST_NAME.to_owned(),
        |d| format!("{d}/{MANIFEST_NAME}"),
    );
    if keys.contains(manifest.as_str()) {
        MARKER_PHASE + 1
    } else {
        1
    }
}

/// `files` in upload batches, in order ([`upload_phase`]); empty phases are left out.
fn upload_plan(files: &[LocalFile]) -> Vec<Vec<&LocalFile>> {
    let keys: HashSet<&str> = files.iter().map(|(k, _, _)| k.as_str()).collect();
    let mut batches: Vec<Vec<&LocalFile>> = vec![Vec::new(); usize::from(MARKER_PHASE) + 2];
    for f in files {
        if let Some(b) = batches.get_mut(usize::from(upload_phase(&f.0, &keys))) {
            b.push(f);
        }
    }
    batches.retain(|b| !b.is_empty());
    batches
}

/// The files `upload` leaves out, by name: temporary files that are never part of a dataset or
/// checkpoint. `<name>.partial` (an unfinished `ckpt download`), `.<name>.shardstream-tmp-<hex>`
/// (an unfinished `download`), and `<name>#<digits>` (a staging file of `object_store`'s local
/// store, i.e. an unfinished write to a local checkpoint root). Everything else goes up, names
/// starting with `.` included.
fn is_excluded(name: &str) -> bool {
    let staging = name.rsplit_once('#').is_some_and(|(base, n)| {
        !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    });
    staging || name.ends_with(".partial") || name.contains(".shardstream-tmp-")
}

/// Regular files below `root` as (key, path, size), sorted by key, less the temporary files
/// [`is_excluded`] names.
fn local_files(root: &Path) -> anyhow::Result<Vec<LocalFile>> {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(true) {
        let entry = entry.with_context(|| format!("cannot walk {}", root.display()))?;
        if is_excluded(&entry.file_name().to_string_lossy()) || !entry.file_type().is_file() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(batch: &[&LocalFile]) -> Vec<String> {
        batch.iter().map(|f| f.0.clone()).collect()
    }

    /// Issue 40, row 5: `upload` of a checkpoint folder skipped every dotfile (DCP's
    /// `.metadata` included) and sent the manifest alongside the data files, so an interrupted
    /// upload could look committed while files were missing.
    #[test]
    fn checkpoint_folder_uploads_dotfiles_and_commits_last() {
        let dir = tempfile::tempdir().unwrap();
        let attempt = "step_1/attempt-0000000000001-00000000000000ab";
        let wanted = [
            format!("{attempt}/__0_0.distcp"),
            format!("{attempt}/.metadata"),
            "step_1/.metadata".to_owned(),
            format!("step_1/{MANIFEST_NAME}"),
            "plain_dcp/__0_0.distcp".to_owned(),
            "plain_dcp/.metadata".to_owned(),
            ".hidden_config".to_owned(),
        ];
        let temporary = [
            format!("{attempt}/__1_0.distcp#3"),
            "step_1/__0_0.distcp.partial".to_owned(),
            "plain_dcp/.x.shardstream-tmp-00000000000000ab".to_owned(),
        ];
        for key in wanted.iter().chain(&temporary) {
            let path = dir.path().join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"x").unwrap();
        }
        let files = local_files(dir.path()).unwrap();
        let mut got: Vec<String> = files.iter().map(|f| f.0.clone()).collect();
        let mut want = wanted.to_vec();
        got.sort();
        want.sort();
        assert_eq!(got, want, "dotfiles in, temporary files out");

        let plan = upload_plan(&files);
        let batches: Vec<Vec<String>> = plan.iter().map(|b| keys(b)).collect();
        assert_eq!(
            batches,
            vec![
                vec![
                    ".hidden_config".to_owned(),
                    "plain_dcp/__0_0.distcp".to_owned(),
                    format!("{attempt}/__0_0.distcp"),
                ],
                vec![
                    "plain_dcp/.metadata".to_owned(),
                    format!("{attempt}/.metadata")
                ],
                vec![format!("step_1/{MANIFEST_NAME}")],
                vec!["step_1/.metadata".to_owned()],
            ]
        );
    }

    #[test]
    fn index_json_still_goes_last_in_a_dataset() {
        let files: Vec<LocalFile> = ["index.json", "shard.00000.mds", "sub/index.json"]
            .iter()
            .map(|k| (k.to_string(), PathBuf::from(k), 1))
            .collect();
        let batches: Vec<Vec<String>> = upload_plan(&files).iter().map(|b| keys(b)).collect();
        assert_eq!(
            batches,
            vec![
                vec!["shard.00000.mds".to_owned(), "sub/index.json".to_owned()],
                vec!["index.json".to_owned()],
            ]
        );
    }
}
