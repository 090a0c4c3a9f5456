//! `verify DATASET`: every shard's size and every hash the index records, for the raw and the
//! compressed file (whichever exist; one of them must), plus the shard header against the index.
//! LitData records no hash: its chunks are parsed and counted. Tars are read through.
//!
//! Every problem is reported (not only the first), each naming its file; any problem makes the
//! exit status non-zero.

use std::sync::Arc;

use anyhow::bail;
use futures::{stream, StreamExt};
use serde::Serialize;
use shardstream_sharding::input::InputFormat;
use shardstream_sharding::mds::{
    decode_stored_shard, verify_raw_shard_file, Columns, Index, ShardInfo, ShardReader,
};
use shardstream_storage::Location;

use crate::dataset::{self, get_optional, Layout};
use crate::output::outln;
use crate::{progress, runtime, Global};

/// Arguments of `verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Dataset: an MDS or LitData folder or URL, a .tar, a brace pattern of tars, or a folder of tars.
    pub dataset: String,
    /// Print one JSON report.
    #[arg(long)]
    pub json: bool,
    /// Dataset format: auto, mds, litdata or wds.
    #[arg(long, default_value = "auto")]
    pub input_format: InputFormat,
    /// Files checked at once (default: the number of cores).
    #[arg(long)]
    pub workers: Option<usize>,
}

/// One problem found.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// The file (path or URL).
    pub file: String,
    /// What is wrong.
    pub problem: String,
}

/// What `verify` reports.
#[derive(Debug, Serialize)]
pub struct VerifyReport {
    /// The dataset as given.
    pub dataset: String,
    /// `mds`, `litdata` or `wds`.
    pub format: String,
    /// Shards (or chunks, or tars) checked.
    pub shards: u64,
    /// Files read.
    pub files_checked: u64,
    /// True when no problem was found.
    pub ok: bool,
    /// Every problem, in shard order.
    pub problems: Vec<Problem>,
}

/// Runs `verify`.
pub fn run(args: VerifyArgs, global: &Global) -> anyhow::Result<()> {
    let workers = args.workers.unwrap_or_else(runtime::default_workers).max(1);
    let rt = runtime::build(workers)?;
    let report = rt.block_on(async {
        let dataset = dataset::open(&args.dataset, args.input_format, true).await?;
        verify(&dataset, workers, global.progress()).await
    })?;
    if args.json {
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        for p in &report.problems {
            outln!("FAILED {}: {}", p.file, p.problem)?;
        }
        if report.ok {
            outln!(
                "ok: {} files of {} shards verified ({})",
                report.files_checked,
                report.shards,
                report.dataset
            )?;
        }
    }
    match report.problems.first() {
        None => Ok(()),
        Some(first) => bail!(
            "verification failed: {} problem(s), first {}: {}",
            report.problems.len(),
            first.file,
            first.problem
        ),
    }
}

/// Checks the whole dataset, `workers` files at a time.
pub async fn verify(
    dataset: &dataset::Dataset,
    workers: usize,
    show_progress: bool,
) -> anyhow::Result<VerifyReport> {
    let root = &dataset.root;
    let (shards, outcomes): (u64, Vec<(u64, Vec<Problem>)>) = match &dataset.layout {
        Layout::Mds(index) => {
            let bar = progress::items(index.shards.len() as u64, "shards", show_progress);
            let index = Arc::new(index.clone());
            let outcomes = stream::iter(0..index.shards.len())
                .map(|i| {
                    let index = Arc::clone(&index);
                    let bar = bar.clone();
                    async move {
                        let outcome = check_mds_shard(root, &index, i).await;
                        bar.inc(1);
                        outcome
                    }
                })
                .buffered(workers)
                .collect()
                .await;
            bar.finish_and_clear();
            (index.shards.len() as u64, outcomes)
        }
        Layout::LitData(index) => {
            let outcomes = stream::iter(0..index.chunks.len())
                .map(|i| check_litdata_chunk(dataset, index, i))
                .buffered(workers)
                .collect()
                .await;
            (index.chunks.len() as u64, outcomes)
        }
        Layout::Wds(tars) => {
            let outcomes = stream::iter(tars)
                .map(|(location, name)| async move {
                    match dataset::load_tar(location, name).await {
                        Ok(_) => (1, Vec::new()),
                        Err(e) => (1, vec![problem(&location.url_of(name), &format!("{e:#}"))]),
                    }
                })
                .buffered(workers)
                .collect()
                .await;
            (tars.len() as u64, outcomes)
        }
    };
    let files_checked = outcomes.iter().map(|(n, _)| n).sum();
    let problems: Vec<Problem> = outcomes.into_iter().flat_map(|(_, p)| p).collect();
    Ok(VerifyReport {
        dataset: dataset.spec.clone(),
        format: dataset.format_name().to_string(),
        shards,
        files_checked,
        ok: problems.is_empty(),
        problems,
    })
}

/// A problem, with the file's name taken off the front of the message when it is there.
fn problem(file: &str, message: &str) -> Problem {
    let trimmed = message
        .strip_prefix(file)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(message);
    Problem {
        file: file.to_string(),
        problem: trimmed.to_string(),
    }
}

/// Checks MDS shard `i`: returns (files read, problems).
async fn check_mds_shard(root: &Location, index: &Index, i: usize) -> (u64, Vec<Problem>) {
    let Some(shard) = index.shards.get(i) else {
        return (0, Vec::new());
    };
    let mut problems = Vec::new();
    let mut files = 0;
    let raw_name = &shard.raw_data.basename;
    let raw_url = root.url_of(raw_name);
    // A local raw file is streamed through the checks (bounded memory, no copy); everything
    // else is fetched whole, as decompression needs it anyway.
    let mut found = false;
    match local_file(root, raw_name) {
        Ok(Some(path)) => {
            found = true;
            files += 1;
            let (info, url) = (shard.clone(), raw_url.clone());
            let checked = tokio::task::spawn_blocking(move || {
                Columns::from_shard_info(&url, &info, true).map_err(|e| e.to_string())?;
                verify_raw_shard_file(&path, &url, &info).map_err(|e| e.to_string())
            })
            .await;
            match checked {
                Ok(Ok(())) => {}
                Ok(Err(message)) => problems.push(problem(&raw_url, &message)),
                Err(e) => problems.push(problem(&raw_url, &e.to_string())),
            }
        }
        Ok(None) => match get_optional(root, raw_name).await {
            Ok(Some(bytes)) => {
                found = true;
                files += 1;
                check_fetched(shard, raw_url.clone(), bytes, false, &mut problems).await;
            }
            Ok(None) => {}
            Err(e) => problems.push(problem(&raw_url, &format!("{e:#}"))),
        },
        Err(message) => problems.push(problem(&raw_url, &message)),
    }
    if let Some(zip) = &shard.zip_data {
        let zip_url = root.url_of(&zip.basename);
        match get_optional(root, &zip.basename).await {
            Ok(Some(bytes)) => {
                found = true;
                files += 1;
                check_fetched(shard, zip_url, bytes, true, &mut problems).await;
            }
            Ok(None) => {}
            Err(e) => problems.push(problem(&zip_url, &format!("{e:#}"))),
        }
    }
    if !found && problems.is_empty() {
        let stored = root.url_of(&shard.stored_file().basename);
        problems.push(problem(
            &stored,
            "missing (listed in index.json, not found)",
        ));
    }
    (files, problems)
}

/// The local file behind `rel` when the dataset is local and the file exists (`Ok(None)` when
/// remote or absent); an error message when it exists but cannot be looked at.
fn local_file(root: &Location, rel: &str) -> Result<Option<std::path::PathBuf>, String> {
    let Some(path) = root.local_path(rel).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    match std::fs::metadata(&path) {
        Ok(_) => Ok(Some(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

/// Runs [`check_stored`] on fetched bytes off the async threads, adding any problem.
async fn check_fetched(
    shard: &ShardInfo,
    url: String,
    bytes: bytes::Bytes,
    from_zip: bool,
    problems: &mut Vec<Problem>,
) {
    let info = shard.clone();
    let shown = url.clone();
    let checked =
        tokio::task::spawn_blocking(move || check_stored(&url, &info, bytes, from_zip)).await;
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(message)) => problems.push(problem(&shown, &message)),
        Err(e) => problems.push(problem(&shown, &e.to_string())),
    }
}

/// Size and hashes of one stored file (`decode_stored_shard` checks them first), then for a
/// compressed one the inflated bytes against the raw record, then the shard header against the
/// index.
fn check_stored(
    url: &str,
    info: &ShardInfo,
    bytes: bytes::Bytes,
    from_zip: bool,
) -> Result<(), String> {
    // Without a copy when the buffer is not shared (a fresh GET's is not).
    let stored = Vec::from(bytes);
    let raw = decode_stored_shard(url, info, stored, from_zip, true).map_err(|e| e.to_string())?;
    let columns = Columns::from_shard_info(url, info, true).map_err(|e| e.to_string())?;
    ShardReader::new(url, raw, Arc::new(columns), Some(info.samples)).map_err(|e| e.to_string())?;
    Ok(())
}

/// Parses LitData chunk `i` and checks its item count (and its size when stored uncompressed).
async fn check_litdata_chunk(
    dataset: &dataset::Dataset,
    index: &shardstream_sharding::litdata::LitDataIndex,
    i: usize,
) -> (u64, Vec<Problem>) {
    let Some(info) = index.chunks.get(i) else {
        return (0, Vec::new());
    };
    let url = dataset.root.url_of(&info.filename);
    let size = match dataset.root.head(&info.filename).await {
        Ok(o) => o.size,
        Err(shardstream_storage::StorageError::NotFound { .. }) => {
            return (
                0,
                vec![problem(&url, "missing (listed in index.json, not found)")],
            )
        }
        Err(e) => return (0, vec![problem(&url, &e.to_string())]),
    };
    if index.compression.is_none() && index.encryption.is_none() {
        if let Some(expected) = info.chunk_bytes.filter(|&b| b != size) {
            let message = format!("size mismatch: expected {expected} bytes, found {size}");
            return (1, vec![problem(&url, &message)]);
        }
    }
    match dataset::load_litdata_chunk(&dataset.root, index, i, true).await {
        Ok(chunk) if chunk.len() as u64 != info.chunk_size => {
            let message = format!(
                "holds {} items, index.json says {}",
                chunk.len(),
                info.chunk_size
            );
            (1, vec![problem(&url, &message)])
        }
        Ok(_) => (1, Vec::new()),
        Err(e) => (1, vec![problem(&url, &format!("{e:#}"))]),
    }
}
