//! Finished datasets as `cat`, `inspect` and `verify` see them: an MDS or LitData folder (by its
//! `index.json`) or WebDataset tars (a `.tar`, a brace pattern, a folder of tars), local or remote.
//!
//! Every file goes through a storage [`Location`], so a local folder and an `s3://` prefix are
//! read by the same code; remote files are fetched whole into memory, one at a time per worker.

use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use shardstream_sharding::input::detect::index_format_of;
use shardstream_sharding::input::wds::is_tar_name;
use shardstream_sharding::input::InputFormat;
use shardstream_sharding::litdata::{LitDataChunk, LitDataIndex, LitDataOptions};
use shardstream_sharding::mds::{decode_stored_shard, Columns, Index, ShardInfo, ShardReader};
use shardstream_sharding::wds::{expand_urls, WdsReader};
use shardstream_sharding::Sample;
use shardstream_storage::{Location, StorageError};

/// A dataset's format and the index it was opened with.
#[derive(Debug)]
pub enum Layout {
    /// MDS: the parsed `index.json`.
    Mds(Index),
    /// LitData: the parsed `index.json`.
    LitData(Box<LitDataIndex>),
    /// WebDataset: the tars, in order, each as (folder, name).
    Wds(Vec<(Location, String)>),
}

/// An opened dataset.
#[derive(Debug)]
pub struct Dataset {
    /// What the user typed.
    pub spec: String,
    /// The folder holding `index.json` (MDS, LitData); for WebDataset, the folder of the first tar.
    pub root: Location,
    /// Format and index.
    pub layout: Layout,
    /// Read `pkl` / `pickle` columns.
    pub allow_unsafe_types: bool,
}

/// Opens `spec`, detecting its format unless `format` says it.
pub async fn open(
    spec: &str,
    format: InputFormat,
    allow_unsafe_types: bool,
) -> anyhow::Result<Dataset> {
    let dataset = |root: Location, layout| Dataset {
        spec: spec.to_string(),
        root,
        layout,
        allow_unsafe_types,
    };
    let tar_spec = spec.contains('{') || is_tar_name(spec);
    if matches!(format, InputFormat::Wds | InputFormat::Auto) && tar_spec {
        let tars = tar_list(spec)?;
        let root = tars.first().map(|(l, _)| l.clone()).context("no tar")?;
        return Ok(dataset(root, Layout::Wds(tars)));
    }
    let root = Location::open(spec).with_context(|| format!("cannot open {spec}"))?;
    if root.local_root().is_some_and(|dir| !dir.exists()) {
        bail!("{spec}: no such file or folder");
    }
    let max_index = shardstream_sharding::index_file::max_index_bytes();
    let index = match root.get_at_most("index.json", max_index).await {
        Ok(bytes) => Some(bytes),
        Err(StorageError::NotFound { .. }) => None,
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", root.url_of("index.json")))
        }
    };
    let index_url = root.url_of("index.json");
    let detected = match (&index, format) {
        (_, InputFormat::Wds) => InputFormat::Wds,
        (Some(bytes), InputFormat::Auto) => {
            let json: serde_json::Value = serde_json::from_slice(bytes)
                .with_context(|| format!("{index_url}: not valid JSON"))?;
            index_format_of(&json).with_context(|| {
                format!("{index_url}: holds neither \"shards\" (MDS) nor \"chunks\" (LitData)")
            })?
        }
        (None, InputFormat::Auto) => InputFormat::Wds,
        (_, f @ (InputFormat::Mds | InputFormat::LitData)) => f,
        (_, other) => bail!("{other} is an input format for `shard`, not a dataset format"),
    };
    let layout = match (detected, index) {
        (InputFormat::Mds, Some(bytes)) => Layout::Mds(Index::from_json(&index_url, &bytes)?),
        (InputFormat::LitData, Some(bytes)) => {
            Layout::LitData(Box::new(LitDataIndex::parse(&index_url, &bytes)?))
        }
        (InputFormat::Wds, _) => {
            let tars: Vec<(Location, String)> = root
                .list("")
                .await
                .with_context(|| format!("cannot list {}", root.url()))?
                .into_iter()
                .filter(|o| is_tar_name(&o.key))
                .map(|o| (root.clone(), o.key))
                .collect();
            if tars.is_empty() {
                bail!("{spec}: no index.json and no .tar file: not a dataset");
            }
            Layout::Wds(tars)
        }
        _ => bail!("{index_url}: not found"),
    };
    Ok(dataset(root, layout))
}

/// The tars of a `.tar` path or URL, or a brace pattern of them.
fn tar_list(spec: &str) -> anyhow::Result<Vec<(Location, String)>> {
    let urls = expand_urls(spec)?;
    let mut out: Vec<(Location, String)> = Vec::with_capacity(urls.len());
    let mut previous_dir = String::new();
    for url in urls {
        let (dir, name) = match url.rsplit_once('/') {
            Some((dir, name)) if !dir.is_empty() && !dir.ends_with(':') && !dir.ends_with("/") => {
                (dir.to_string(), name.to_string())
            }
            Some(("", name)) => ("/".to_string(), name.to_string()),
            _ => (".".to_string(), url.clone()),
        };
        // Tars of one pattern almost always share a folder; share its store too.
        let location = match out.last() {
            Some((l, _)) if dir == previous_dir => l.clone(),
            _ => Location::open(&dir).with_context(|| format!("cannot open {dir}"))?,
        };
        previous_dir = dir;
        out.push((location, name));
    }
    Ok(out)
}

impl Dataset {
    /// Format name for reports.
    pub fn format_name(&self) -> &'static str {
        match self.layout {
            Layout::Mds(_) => "mds",
            Layout::LitData(_) => "litdata",
            Layout::Wds(_) => "wds",
        }
    }
}

/// The raw bytes of MDS shard `i`: the raw file when it exists, else the compressed one,
/// checked (sizes, and hashes when `check_hashes`) and decompressed. Returns a reader.
pub async fn load_mds_shard(
    root: &Location,
    index: &Index,
    i: usize,
    allow_unsafe_types: bool,
    check_hashes: bool,
) -> anyhow::Result<ShardReader<Vec<u8>>> {
    let shard: &ShardInfo = index.shards.get(i).context("shard out of range")?;
    let (url, bytes, from_zip) = match get_optional(root, &shard.raw_data.basename).await? {
        Some(bytes) => (root.url_of(&shard.raw_data.basename), bytes, false),
        None => {
            let zip = shard
                .zip_data
                .as_ref()
                .with_context(|| format!("{}: missing", root.url_of(&shard.raw_data.basename)))?;
            let bytes = get_optional(root, &zip.basename)
                .await?
                .with_context(|| format!("{}: missing", root.url_of(&zip.basename)))?;
            (root.url_of(&zip.basename), bytes, true)
        }
    };
    let columns = Columns::from_shard_info(&url, shard, allow_unsafe_types)?;
    let info = shard.clone();
    let reader = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let raw = decode_stored_shard(&url, &info, bytes.to_vec(), from_zip, check_hashes)?;
        Ok(ShardReader::new(
            url,
            raw,
            Arc::new(columns),
            Some(info.samples),
        )?)
    })
    .await??;
    Ok(reader)
}

/// Chunk `i` of a LitData dataset, parsed.
pub async fn load_litdata_chunk(
    root: &Location,
    index: &LitDataIndex,
    i: usize,
    allow_unsafe_types: bool,
) -> anyhow::Result<LitDataChunk> {
    let info = index.chunks.get(i).context("chunk out of range")?;
    let url = root.url_of(&info.filename);
    let bytes = root
        .get(&info.filename)
        .await
        .with_context(|| format!("cannot read {url}"))?;
    let options = LitDataOptions {
        allow_unsafe_types,
        ..LitDataOptions::default()
    };
    let index = index.clone();
    Ok(tokio::task::spawn_blocking(move || {
        LitDataChunk::parse(&index, i, bytes.to_vec(), &options)
    })
    .await??)
}

/// Every sample of one tar, in order.
pub async fn load_tar(location: &Location, name: &str) -> anyhow::Result<Vec<Sample>> {
    let url = location.url_of(name);
    let bytes = location
        .get(name)
        .await
        .with_context(|| format!("cannot read {url}"))?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Sample>> {
        let reader = WdsReader::new(std::io::Cursor::new(bytes), url)?;
        Ok(reader
            .map(|s| s.map(|s| s.into_sample()))
            .collect::<Result<_, _>>()?)
    })
    .await?
}

/// `rel`'s bytes, or `None` when it does not exist.
pub async fn get_optional(root: &Location, rel: &str) -> anyhow::Result<Option<Bytes>> {
    match root.get(rel).await {
        Ok(bytes) => Ok(Some(bytes)),
        Err(StorageError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", root.url_of(rel))),
    }
}

/// Calls `visit(index, sample)` for samples `start..start + limit` in dataset order, loading one
/// shard, chunk or tar at a time and skipping whole ones before `start` without fetching them
/// (except tars, whose sample counts are unknown until read). `visit` returns `false` to stop.
pub async fn visit_samples(
    dataset: &Dataset,
    start: u64,
    limit: Option<u64>,
    mut visit: impl FnMut(u64, Sample) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let end = limit.map_or(u64::MAX, |l| start.saturating_add(l));
    let mut first = 0u64;
    let unsafe_ok = dataset.allow_unsafe_types;
    match &dataset.layout {
        Layout::Mds(index) => {
            for (i, shard) in index.shards.iter().enumerate() {
                let (lo, hi) = (first, first + shard.samples);
                first = hi;
                if hi <= start || shard.samples == 0 {
                    continue;
                }
                if lo >= end {
                    break;
                }
                let reader = load_mds_shard(&dataset.root, index, i, unsafe_ok, true).await?;
                for j in start.max(lo)..hi.min(end) {
                    if !visit(j, reader.decode_sample((j - lo) as usize)?)? {
                        return Ok(());
                    }
                }
            }
        }
        Layout::LitData(index) => {
            for (i, chunk) in index.chunks.iter().enumerate() {
                let (lo, hi) = (first, first + chunk.chunk_size);
                first = hi;
                if hi <= start || chunk.chunk_size == 0 {
                    continue;
                }
                if lo >= end {
                    break;
                }
                let chunk = load_litdata_chunk(&dataset.root, index, i, unsafe_ok).await?;
                for j in start.max(lo)..hi.min(end) {
                    if !visit(j, chunk.sample((j - lo) as usize)?)? {
                        return Ok(());
                    }
                }
            }
        }
        Layout::Wds(tars) => {
            for (location, name) in tars {
                if first >= end {
                    break;
                }
                for sample in load_tar(location, name).await? {
                    let j = first;
                    first += 1;
                    if j >= end {
                        return Ok(());
                    }
                    if j >= start && !visit(j, sample)? {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}
