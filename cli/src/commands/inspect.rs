//! `inspect DATASET`: format, shards, samples, bytes, columns, compression and hashes, from the
//! index alone for MDS and LitData (WebDataset tars have no index: they are read to count).

use std::collections::BTreeSet;

use serde::Serialize;
use shardstream_sharding::input::InputFormat;

use crate::dataset::{self, Layout};
use crate::output::outln;
use crate::units::ByteSize;
use crate::{runtime, Global};

/// Arguments of `inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Dataset: an MDS or LitData folder or URL, a .tar, a brace pattern of tars, or a folder of tars.
    pub dataset: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Dataset format: auto, mds, litdata or wds.
    #[arg(long, default_value = "auto")]
    pub input_format: InputFormat,
}

/// One column.
#[derive(Debug, Serialize)]
pub struct ColumnReport {
    /// Column name.
    pub name: String,
    /// Encoding (MDS), serializer (LitData) or `bytes` (WebDataset members).
    pub encoding: String,
    /// Fixed byte size, when the encoding has one.
    pub size: Option<u64>,
}

/// What `inspect` reports.
#[derive(Debug, Serialize)]
pub struct InspectReport {
    /// The dataset as given.
    pub dataset: String,
    /// `mds`, `litdata` or `wds`.
    pub format: String,
    /// Shards (MDS), chunks (LitData) or tars (WebDataset).
    pub shards: u64,
    /// Samples.
    pub samples: u64,
    /// Bytes of the uncompressed shards (MDS raw files, LitData chunk bytes, tar sizes).
    pub raw_bytes: u64,
    /// Bytes of the compressed shards, when the dataset is compressed.
    pub zip_bytes: Option<u64>,
    /// Columns in storage order.
    pub columns: Vec<ColumnReport>,
    /// Compression(s) named by the index.
    pub compression: Vec<String>,
    /// Hash algorithms recorded in the index.
    pub hashes: Vec<String>,
    /// Shard size limit(s) (MDS).
    pub size_limit: Vec<u64>,
}

/// Runs `inspect`.
pub fn run(args: InspectArgs, _global: &Global) -> anyhow::Result<()> {
    let rt = runtime::build(runtime::default_workers())?;
    let report = rt.block_on(async {
        let dataset = dataset::open(&args.dataset, args.input_format, false).await?;
        inspect(&dataset).await
    })?;
    if args.json {
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        print_text(&report)?;
    }
    Ok(())
}

/// Builds the report.
pub async fn inspect(dataset: &dataset::Dataset) -> anyhow::Result<InspectReport> {
    let mut report = InspectReport {
        dataset: dataset.spec.clone(),
        format: dataset.format_name().to_string(),
        shards: 0,
        samples: 0,
        raw_bytes: 0,
        zip_bytes: None,
        columns: Vec::new(),
        compression: Vec::new(),
        hashes: Vec::new(),
        size_limit: Vec::new(),
    };
    match &dataset.layout {
        Layout::Mds(index) => {
            report.shards = index.shards.len() as u64;
            report.samples = index.num_samples();
            let (mut compression, mut hashes, mut limits) =
                (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
            for shard in &index.shards {
                report.raw_bytes += shard.raw_data.bytes;
                if let Some(zip) = &shard.zip_data {
                    *report.zip_bytes.get_or_insert(0) += zip.bytes;
                }
                compression.extend(shard.compression.clone());
                hashes.extend(shard.hashes.iter().cloned());
                limits.extend(shard.size_limit);
            }
            report.compression = compression.into_iter().collect();
            report.hashes = hashes.into_iter().collect();
            report.size_limit = limits.into_iter().collect();
            if let Some(first) = index.shards.first() {
                report.columns = first
                    .column_names
                    .iter()
                    .zip(&first.column_encodings)
                    .zip(&first.column_sizes)
                    .map(|((name, encoding), size)| ColumnReport {
                        name: name.clone(),
                        encoding: encoding.clone(),
                        size: *size,
                    })
                    .collect();
            }
        }
        Layout::LitData(index) => {
            report.shards = index.chunks.len() as u64;
            report.samples = index.num_samples();
            report.raw_bytes = index.chunks.iter().filter_map(|c| c.chunk_bytes).sum();
            report.compression = index.compression.iter().cloned().collect();
            report.columns = index
                .columns
                .iter()
                .zip(&index.data_format)
                .map(|(name, format)| ColumnReport {
                    name: name.clone(),
                    encoding: format.clone(),
                    size: None,
                })
                .collect();
        }
        Layout::Wds(tars) => {
            report.shards = tars.len() as u64;
            let mut extensions = BTreeSet::new();
            for (location, name) in tars {
                report.raw_bytes += location.head(name).await?.size;
                for sample in dataset::load_tar(location, name).await? {
                    report.samples += 1;
                    extensions.extend(sample.into_keys());
                }
            }
            report.columns = extensions
                .into_iter()
                .map(|name| ColumnReport {
                    encoding: if name == "__key__" { "str" } else { "bytes" }.to_string(),
                    name,
                    size: None,
                })
                .collect();
        }
    }
    Ok(report)
}

fn print_text(r: &InspectReport) -> anyhow::Result<()> {
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    outln!("dataset:     {}", r.dataset)?;
    outln!("format:      {}", r.format)?;
    outln!("shards:      {}", r.shards)?;
    outln!("samples:     {}", r.samples)?;
    outln!("raw bytes:   {} ({})", r.raw_bytes, ByteSize(r.raw_bytes))?;
    if let Some(zip) = r.zip_bytes {
        outln!("zip bytes:   {zip} ({})", ByteSize(zip))?;
    }
    outln!("compression: {}", list(&r.compression))?;
    outln!("hashes:      {}", list(&r.hashes))?;
    if !r.size_limit.is_empty() {
        let limits: Vec<String> = r
            .size_limit
            .iter()
            .map(|l| ByteSize(*l).to_string())
            .collect();
        outln!("size limit:  {}", limits.join(", "))?;
    }
    outln!("columns:")?;
    for c in &r.columns {
        let size = c.size.map(|s| format!(" ({s} bytes)")).unwrap_or_default();
        outln!("  {}: {}{size}", c.name, c.encoding)?;
    }
    Ok(())
}
