//! `shard INPUT OUTPUT`: convert raw data or another dataset into MDS or WebDataset shards.
//!
//! Reading, encoding, compression, hashing and upload all run in parallel over `--workers`;
//! samples keep the input's order ([`pipeline`]). With `--part I/N` only the I-th of N contiguous
//! ranges of the input is converted, into `OUTPUT/I/` (I zero-padded to the width of N-1, so that a
//! sorted listing keeps the parts in order); `merge-index OUTPUT` then gives the dataset a single
//! process would have written.
//!
//! Defaults: MDS with zstd level 3 (Mosaic's default level) and an xxh64 hash of every file (fast,
//! and Mosaic verifies it with `validate_hash="xxh64"`); WebDataset uncompressed, no hashes.
//! A remote INPUT (s3://...) is downloaded to a temporary folder first.

mod mds_out;
mod pipeline;
mod wds_out;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;
use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::input::{self, parse_columns, part_range, InputFormat, InputOptions};
use shardstream_sharding::wds::ShardWriterOptions;
use shardstream_storage::{sync_down, Location, StorageError};

use crate::exit::ConfigError;
use crate::output::outln;
use crate::units::{ByteSize, Part};
use crate::{progress, runtime, Global};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// MosaicML Streaming's MDS (index.json + shard.NNNNN.mds[.zstd]).
    Mds,
    /// WebDataset tars (shard-NNNNNN.tar).
    Wds,
}

/// Arguments of `shard`.
#[derive(Debug, clap::Args)]
pub struct ShardArgs {
    /// Input: a folder of files, an ImageFolder tree, a .jsonl file or folder, WebDataset tars (a
    /// .tar, a brace pattern, a folder), an MDS or LitData dataset. Local, or a URL (downloaded first).
    pub input: String,
    /// Output folder: a local path or a URL (s3://bucket/prefix, gs://..., az://...).
    pub output: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "mds")]
    pub format: OutputFormat,
    /// Shard compression: zstd[:LEVEL], br, bz2, gz, snappy or none (MDS; default zstd), gz or
    /// none (WebDataset; default none).
    #[arg(long)]
    pub compression: Option<String>,
    /// Shard size limit (MDS size_limit; WebDataset maxsize).
    #[arg(long, default_value = "64MiB")]
    pub shard_size: ByteSize,
    /// Hashes recorded for every MDS file, comma-separated (xxh64, sha1, md5, xxh3_64, ...), or none.
    /// Default: xxh64.
    #[arg(long)]
    pub hashes: Option<String>,
    /// Input format (auto detects it from the path).
    #[arg(long, default_value = "auto")]
    pub input_format: InputFormat,
    /// Threads reading, encoding, compressing and uploading (default: the number of cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Convert only the I-th of N contiguous parts of the input, into OUTPUT/I/ (0-based).
    #[arg(long, value_name = "I/N")]
    pub part: Option<Part>,
    /// JSONL columns and encodings, e.g. id:int,text:str,emb:ndarray:float32:768 (default:
    /// inferred from the first record).
    #[arg(long)]
    pub columns: Option<String>,
    /// Allow pickle (`pkl`) columns.
    #[arg(long)]
    pub allow_unsafe_types: bool,
    /// MDS: write shards under N hashed folders (p00/shard.00000.mds, ...), so that an object
    /// store serves them from N key prefixes (S3 limits request rates per prefix). Mosaic reads
    /// such a dataset unchanged (basenames with a folder, as its merge_index writes them).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub prefixes: u32,
    /// MDS: also write index.ssx, a compact binary form of index.json (which stays, for Mosaic).
    #[arg(long)]
    pub binary_index: bool,
    /// Replace a dataset already at OUTPUT.
    #[arg(long)]
    pub overwrite: bool,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// What `shard` wrote.
#[derive(Debug, Serialize)]
pub struct ShardSummary {
    /// Input as given.
    pub input: String,
    /// Input format used.
    pub input_format: String,
    /// Where the shards went (OUTPUT, or OUTPUT/I with --part).
    pub output: String,
    /// `mds` or `wds`.
    pub format: String,
    /// The part written, `I/N`.
    pub part: Option<String>,
    /// Samples written.
    pub samples: u64,
    /// Shards written.
    pub shards: u64,
    /// Uncompressed shard bytes (MDS raw files; WebDataset payload).
    pub raw_bytes: u64,
    /// Bytes stored (compressed files when compressed).
    pub stored_bytes: u64,
    /// Wall time.
    pub seconds: f64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Uncompressed MB (10^6 bytes) per second.
    pub mb_per_second: f64,
}

/// Runs `shard`.
pub fn run(args: ShardArgs, global: &Global) -> anyhow::Result<()> {
    let started = Instant::now();
    let workers = args.workers.unwrap_or_else(runtime::default_workers).max(1);
    let rt = runtime::build(workers)?;
    let output_url = match args.part {
        Some(part) => format!("{}/{}", args.output.trim_end_matches('/'), part.folder()),
        None => args.output.clone(),
    };
    let output =
        Location::open(&output_url).with_context(|| format!("cannot open {output_url}"))?;
    rt.block_on(prepare_output(&output, args.format, args.overwrite))?;

    let _download_dir; // keeps a downloaded remote input alive until the end
    let input_path = if is_remote(&args.input) {
        let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
        rt.block_on(download_input(&args.input, dir.path()))?;
        let path = dir.path().join(remote_file_name(&args.input));
        _download_dir = dir;
        path
    } else {
        PathBuf::from(&args.input)
    };
    let options = InputOptions {
        columns: args.columns.as_deref().map(parse_columns).transpose()?,
        allow_unsafe_types: args.allow_unsafe_types,
    };
    let input = input::open(&input_path, args.input_format, &options)
        .with_context(|| format!("cannot read input {}", args.input))?;
    let range = match args.part {
        Some(p) => part_range(input.len(), p.index, p.count),
        None => 0..input.len(),
    };
    tracing::info!(input = %args.input, format = %input.format(), items = input.len(), ?range, output = %output_url, "sharding");
    let bar = progress::items(range.end - range.start, "samples", global.progress());
    let mut summary = ShardSummary {
        input: args.input.clone(),
        input_format: input.format().to_string(),
        output: output_url.clone(),
        format: String::new(),
        part: args.part.map(|p| format!("{}/{}", p.index, p.count)),
        samples: range.end - range.start,
        shards: 0,
        raw_bytes: 0,
        stored_bytes: 0,
        seconds: 0.0,
        samples_per_second: 0.0,
        mb_per_second: 0.0,
    };
    match args.format {
        OutputFormat::Mds => {
            let settings = mds_out::MdsSettings {
                compression: mds_compression(args.compression.as_deref())?,
                hashes: hash_list(args.hashes.as_deref().unwrap_or("xxh64"))?,
                size_limit: args.shard_size.0,
                workers,
                allow_unsafe_types: args.allow_unsafe_types,
                prefixes: args.prefixes,
                binary_index: args.binary_index,
            };
            let index = mds_out::write(input.as_ref(), range, &output, &rt, &settings, &bar)?;
            summary.format = "mds".into();
            summary.shards = index.shards.len() as u64;
            summary.raw_bytes = index.shards.iter().map(|s| s.raw_data.bytes).sum();
            summary.stored_bytes = index.shards.iter().map(|s| s.stored_file().bytes).sum();
        }
        OutputFormat::Wds => {
            if args.hashes.as_deref().is_some_and(|h| h != "none") {
                bail!(ConfigError(
                    "--hashes applies to MDS output (WebDataset has no index to record them in)"
                        .into()
                ));
            }
            let options = ShardWriterOptions {
                maxsize: args.shard_size.0,
                gzip: wds_gzip(args.compression.as_deref())?,
                ..ShardWriterOptions::default()
            };
            let shards =
                wds_out::write(input.as_ref(), range, &output, &rt, workers, options, &bar)?;
            summary.format = "wds".into();
            summary.shards = shards.len() as u64;
            summary.raw_bytes = shards.iter().map(|s| s.payload_bytes).sum();
            summary.stored_bytes = shards.iter().map(|s| s.file_bytes).sum();
        }
    }
    bar.finish_and_clear();
    summary.seconds = started.elapsed().as_secs_f64();
    let secs = summary.seconds.max(1e-9);
    summary.samples_per_second = summary.samples as f64 / secs;
    summary.mb_per_second = summary.raw_bytes as f64 / 1e6 / secs;
    if args.json {
        outln!("{}", serde_json::to_string(&summary)?)?;
    } else {
        outln!(
            "wrote {} samples in {} {} shards ({} raw, {} stored) to {} in {:.2}s: {:.0} samples/s, {:.1} MB/s",
            summary.samples,
            summary.shards,
            summary.format,
            ByteSize(summary.raw_bytes),
            ByteSize(summary.stored_bytes),
            summary.output,
            summary.seconds,
            summary.samples_per_second,
            summary.mb_per_second
        )?;
    }
    Ok(())
}

/// Refuses to write over a dataset unless `overwrite`; with it, removes what would mislead a
/// reader while the new dataset is written (the old index; old WebDataset shards).
async fn prepare_output(
    output: &Location,
    format: OutputFormat,
    overwrite: bool,
) -> anyhow::Result<()> {
    let listing = match output.list("").await {
        Ok(l) => l,
        Err(StorageError::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot list {}", output.url())),
    };
    let stale: Vec<String> = listing
        .into_iter()
        .map(|o| o.key)
        .filter(|k| match format {
            OutputFormat::Mds => k == "index.json",
            OutputFormat::Wds => {
                !k.contains('/') && k.starts_with("shard-") && input::wds::is_tar_name(k)
            }
        })
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    if !overwrite {
        bail!(
            "{} already holds a dataset ({}); pass --overwrite to replace it",
            output.url(),
            stale.first().map(String::as_str).unwrap_or_default()
        );
    }
    for key in stale {
        output
            .delete(&key)
            .await
            .with_context(|| format!("cannot delete {}", output.url_of(&key)))?;
    }
    Ok(())
}

fn mds_compression(text: Option<&str>) -> anyhow::Result<Option<Compression>> {
    match text.unwrap_or("zstd") {
        "none" | "" => Ok(None),
        other => Ok(Some(Compression::parse(other)?)),
    }
}

fn wds_gzip(text: Option<&str>) -> anyhow::Result<bool> {
    match text.unwrap_or("none") {
        "none" | "" => Ok(false),
        "gz" | "gzip" => Ok(true),
        other => bail!(ConfigError(format!(
            "WebDataset output takes --compression gz or none, not {other:?}"
        ))),
    }
}

/// Parses `xxh64,sha1`: any order, duplicates dropped (Mosaic requires a sorted, unique list).
fn hash_list(text: &str) -> anyhow::Result<Vec<HashAlgorithm>> {
    if text == "none" || text.is_empty() {
        return Ok(Vec::new());
    }
    let mut names: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    names.sort_unstable();
    names.dedup();
    Ok(HashAlgorithm::parse_list(&names)?)
}

fn is_remote(spec: &str) -> bool {
    spec.split_once("://")
        .is_some_and(|(scheme, _)| scheme != "file")
}

/// The last path component of a remote input (what the download folder holds it under).
fn remote_file_name(spec: &str) -> String {
    if spec.contains('{') {
        return spec.rsplit('/').next().unwrap_or(spec).to_string();
    }
    match spec.trim_end_matches('/').rsplit_once('/') {
        Some((_, name)) if input::wds::is_tar_name(name) || name.ends_with(".jsonl") => {
            name.to_string()
        }
        _ => String::new(),
    }
}

/// Downloads a remote input into `dir`: a folder prefix whole, a single file, or each tar of a
/// brace pattern (kept under its name, so the pattern still matches locally).
async fn download_input(spec: &str, dir: &std::path::Path) -> anyhow::Result<()> {
    let single = remote_file_name(spec);
    if spec.contains('{') {
        for url in shardstream_sharding::wds::expand_urls(spec)? {
            let (folder, name) = url.rsplit_once('/').context("a URL without a folder")?;
            let location = Location::open(folder)?;
            location
                .download_to_file(name, &dir.join(name))
                .await
                .with_context(|| format!("cannot download {url}"))?;
        }
    } else if !single.is_empty() {
        let folder = spec
            .trim_end_matches('/')
            .rsplit_once('/')
            .map(|(f, _)| f)
            .unwrap_or(spec);
        let location = Location::open(folder)?;
        location
            .download_to_file(&single, &dir.join(&single))
            .await
            .with_context(|| format!("cannot download {spec}"))?;
    } else {
        let location = Location::open(spec)?;
        sync_down(&location, dir)
            .await
            .with_context(|| format!("cannot download {spec}"))?;
    }
    Ok(())
}
