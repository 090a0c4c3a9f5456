//! MDS output: samples are encoded on the reading workers, added in order by one [`MdsWriter`],
//! whose own worker threads compress, hash and store each closed shard through a sink: a local
//! folder (atomic files) or an object store (one PUT per file, issued from those threads, so
//! uploads overlap with encoding).

use std::ops::Range;
use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use indicatif::ProgressBar;
use shardstream_sharding::compression::Compression;
use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::input::Input;
use shardstream_sharding::mds::index_bin;
use shardstream_sharding::mds::{
    Encoding, Index, LocalDirSink, MdsWriter, MdsWriterOptions, ShardSink,
};
use shardstream_sharding::FormatError;
use shardstream_storage::Location;

use crate::exit::ConfigError;

use super::pipeline::run_ordered;

/// Stores files in an object store, blocking the calling writer thread until the PUT is done.
struct StoreSink {
    location: Location,
    runtime: tokio::runtime::Handle,
}

impl ShardSink for StoreSink {
    fn put(&self, name: &str, data: Vec<u8>) -> Result<(), FormatError> {
        self.runtime
            .block_on(self.location.put(name, Bytes::from(data)))
            .map_err(|e| FormatError::Io {
                path: self.location.url_of(name),
                source: std::io::Error::other(e.to_string()),
            })
    }
}

/// How to write.
pub struct MdsSettings {
    /// Shard compression.
    pub compression: Option<Compression>,
    /// Hashes, sorted and unique.
    pub hashes: Vec<HashAlgorithm>,
    /// Shard size limit.
    pub size_limit: u64,
    /// Reading and writing threads.
    pub workers: usize,
    /// Allow `pkl` columns.
    pub allow_unsafe_types: bool,
    /// Hashed folders to spread shards over (0: none).
    pub prefixes: u32,
    /// Also write `index.ssx`.
    pub binary_index: bool,
}

/// Writes `range` of `input` as an MDS dataset at `output`.
pub fn write(
    input: &dyn Input,
    range: Range<u64>,
    output: &Location,
    runtime: &tokio::runtime::Runtime,
    settings: &MdsSettings,
    bar: &ProgressBar,
) -> anyhow::Result<Index> {
    let spec: Vec<(String, String)> = input.columns().clone().into_iter().collect();
    for (name, encoding) in &spec {
        let parsed = Encoding::parse(encoding).with_context(|| format!("column {name:?}"))?;
        if parsed.is_unsafe() && !settings.allow_unsafe_types {
            bail!(ConfigError(format!(
                "column {name:?} uses the unsafe encoding {encoding:?}; pass --allow-unsafe-types \
                 to write it"
            )));
        }
    }
    let sink: Arc<dyn ShardSink> = match output.local_root() {
        Some(dir) => Arc::new(LocalDirSink::new(dir)?),
        None => Arc::new(StoreSink {
            location: output.clone(),
            runtime: runtime.handle().clone(),
        }),
    };
    let options = MdsWriterOptions {
        compression: settings.compression,
        hashes: settings.hashes.clone(),
        size_limit: Some(settings.size_limit),
        threads: settings.workers,
    };
    let mut writer = MdsWriter::new(&spec, options, Arc::clone(&sink))?;
    writer.spread_over_prefixes(settings.prefixes);
    let columns = Arc::clone(writer.columns());
    run_ordered(
        input,
        range,
        settings.workers,
        settings.workers * 2 + 2,
        |first, samples| {
            let mut encoded = Vec::new();
            for (i, sample) in samples.enumerate() {
                let mut out = Vec::new();
                columns
                    .encode_sample(&sample?, &mut out)
                    .with_context(|| format!("sample {}", first + i as u64))?;
                encoded.push(out);
            }
            Ok(encoded)
        },
        |encoded| {
            let n = encoded.len() as u64;
            for sample in encoded {
                writer.write_encoded(&sample)?;
            }
            bar.inc(n);
            Ok(())
        },
    )?;
    let index = writer.finish()?;
    if settings.binary_index {
        let json = index.to_json();
        let binary = index_bin::to_bytes(&index, json.as_bytes())?;
        sink.put(index_bin::BINARY_INDEX_BASENAME, binary)?;
    }
    Ok(index)
}
