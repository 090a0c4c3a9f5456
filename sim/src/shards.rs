//! The dataset as the model sees it: every shard's sample count and stored bytes, its key
//! prefix, and the size of its `index.json`. Uniform shards from the config, or the shards of
//! a real MDS `index.json` read with the same parser the streamer uses
//! (`sharding::mds::Index::from_json`).

use std::collections::BTreeMap;

use shardstream_sharding::mds::{FileInfo, Index, ShardInfo};

use crate::config::Dataset;
use crate::error::{add, Result, SimError};

/// Shards of the modelled dataset.
#[derive(Debug, Clone)]
pub struct Shards {
    /// Samples of each shard.
    pub samples: Vec<u64>,
    /// Stored bytes of each shard (what one download moves).
    pub bytes: Vec<u64>,
    /// Bytes of `index.json`.
    pub index_bytes: u64,
    /// Key prefixes the shards are spread over.
    pub prefixes: u32,
    /// Sum of `bytes`.
    pub total_bytes: u64,
}

impl Shards {
    /// The shards `d` describes.
    pub fn from_config(d: &Dataset) -> Result<Shards> {
        let (samples, bytes, index_bytes) = match &d.index {
            Some(path) => {
                let json = std::fs::read(path).map_err(|e| SimError::Index {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                let index = Index::from_json(path, &json).map_err(|e| SimError::Index {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                let samples = index.shards.iter().map(|s| s.samples).collect();
                let bytes = index
                    .shards
                    .iter()
                    .map(|s| s.zip_data.as_ref().unwrap_or(&s.raw_data).bytes)
                    .collect();
                (samples, bytes, json.len() as u64)
            }
            None => {
                let n = d.shards as usize;
                let index_bytes = match d.index_bytes {
                    Some(b) => b,
                    None => estimated_index_bytes(d.shards, d.samples_per_shard, d.shard_bytes)?,
                };
                (
                    vec![d.samples_per_shard; n],
                    vec![d.shard_bytes; n],
                    index_bytes,
                )
            }
        };
        let mut total_bytes = 0u64;
        for b in &bytes {
            total_bytes = add(total_bytes, *b, "dataset bytes")?;
        }
        Ok(Shards {
            samples,
            bytes,
            index_bytes,
            prefixes: d.prefixes.max(1),
            total_bytes,
        })
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The key prefix of `shard` (`shard % prefixes`).
    pub fn prefix_of(&self, shard: u32) -> usize {
        (shard % self.prefixes) as usize
    }

    /// Bytes of the first `samples` samples of `shard` (samples taken as equal in size; the
    /// shard header is in the first of them).
    pub fn prefix_bytes(&self, shard: u32, samples: u64) -> u64 {
        let i = shard as usize;
        let (n, b) = (self.samples[i].max(1), self.bytes[i]);
        let part = (u128::from(b) * u128::from(samples.min(n))).div_ceil(u128::from(n));
        u64::try_from(part).unwrap_or(b)
    }
}

/// One shard's entry as Mosaic's writer records it: two columns, two hashes, no compression.
pub fn synthetic_shard(i: u32, samples: u64, bytes: u64) -> ShardInfo {
    let hashes = BTreeMap::from([
        ("sha1".to_string(), format!("{:040x}", u64::from(i) * 7919)),
        (
            "xxh64".to_string(),
            format!("{:016x}", u64::from(i) * 104_729),
        ),
    ]);
    ShardInfo {
        column_encodings: vec!["jpeg".into(), "int".into()],
        column_names: vec!["image".into(), "label".into()],
        column_sizes: vec![None, Some(8)],
        compression: None,
        format: "mds".into(),
        hashes: vec!["sha1".into(), "xxh64".into()],
        raw_data: FileInfo {
            basename: format!("shard.{i:05}.mds"),
            bytes,
            hashes,
        },
        samples,
        size_limit: Some(bytes),
        version: 2,
        zip_data: None,
    }
}

/// A Mosaic `index.json` of `shards` synthetic shards, as bytes.
pub fn synthetic_index(shards: u32, samples: u64, bytes: u64) -> Result<Vec<u8>> {
    let index = Index {
        version: 2,
        shards: (0..shards)
            .map(|i| synthetic_shard(i, samples, bytes))
            .collect(),
    };
    serde_json::to_vec(&index).map_err(|e| SimError::Serialize {
        what: "synthetic index",
        reason: e.to_string(),
    })
}

/// The size of a Mosaic index of `shards` shards, from 1,000 serialized synthetic entries.
pub fn estimated_index_bytes(shards: u32, samples: u64, bytes: u64) -> Result<u64> {
    let sample = 1_000u32;
    let len = synthetic_index(sample, samples, bytes)?.len() as u64;
    Ok(len.saturating_mul(u64::from(shards)) / u64::from(sample))
}
