//! One shard at a time, by id: what it is, whether the node's cache holds it, downloading it
//! and deleting it. Mosaic's `StreamingDataset` lets its users do this (`shards`,
//! `prepare_shard`, `evict_shard`, `evict_coldest_shard`); the binding offers the same over
//! the node's cache, under its locks, so that a shard in use is never deleted and a shard is
//! still downloaded once per node.

use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use super::engine;
use super::format::{SampleSchema, ShardFormat, ShardSchema};
use super::prefetch::{self, Prefetch};
use super::{ShardHandle, StreamingDataset};
use crate::error::{Result, StreamerError};

/// What the index says of one shard, and where it is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard's URL, or its path when it is local (its cache key).
    pub name: String,
    /// The stream it belongs to (0 without `streams`).
    pub stream: usize,
    /// The file fetched, relative to its dataset (the compressed one when `compression` is set).
    pub file: String,
    /// That file's bytes.
    pub file_bytes: u64,
    /// The compression of the fetched file (`zstd`, `gz`, ...), if it is compressed.
    pub compression: Option<&'static str>,
    /// The decompressed shard's bytes.
    pub raw_bytes: u64,
    /// Samples in the shard.
    pub samples: u64,
    /// Global id of its first sample.
    pub first_sample: u64,
    /// Bytes it takes in the cache (decompressed, plus compressed while it is decompressed);
    /// 0 when it is read in place.
    pub cache_bytes: u64,
}

impl ShardInfo {
    /// Whether it is read where it lies (a local dataset), without the cache.
    pub fn in_place(&self) -> bool {
        self.cache_bytes == 0
    }

    /// The name of the decompressed shard, as the cache holds it and readers are served it:
    /// [`Self::file`] itself when it is not compressed; else without its compression suffix
    /// (`shard.00000.mds.zstd` → `shard.00000.mds`, `x.tar.gz` and `x.tgz` → `x.tar`,
    /// LitData's `chunk-0-0.zstd.bin` → `chunk-0-0.bin`, the name litdata inflates it to).
    pub fn raw_file(&self) -> String {
        let file = self.file.as_str();
        let Some(ext) = self.compression else {
            return file.to_string();
        };
        if let Some(stem) = file.strip_suffix(".tgz") {
            return format!("{stem}.tar");
        }
        if let Some(stem) = file.strip_suffix(&format!(".{ext}.bin")) {
            return format!("{stem}.bin");
        }
        file.strip_suffix(&format!(".{ext}"))
            .unwrap_or(file)
            .to_string()
    }
}

/// One field of one sample, named for a file: a WebDataset member, a LitData leaf, an MDS
/// column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleFile {
    /// WebDataset: the member's name, `<key>.<ext>` (the extension lowercased, as `webdataset`
    /// reads it); LitData: the leaf's name (`docs/formats.md`); MDS: the column's name.
    pub name: String,
    /// The field's encoding, which gives a file extension: an MDS column's, a LitData leaf's
    /// serializer (`int`, `str`, `numpy:...`); `None` for a tar member (its name has one).
    pub encoding: Option<String>,
    /// Its bytes in the decompressed shard.
    pub range: Range<u64>,
}

impl ShardHandle {
    /// Every sample's fields, named ([`SampleFile`]), in sample order. A tar's come from its
    /// table; an MDS shard or LitData chunk is read through to split its samples. An item of
    /// per-item zstd LitData chunks is one field, `item` (encoding `zst`): its leaves are
    /// inside the frame.
    pub fn sample_files(&self) -> Result<Vec<Vec<SampleFile>>> {
        (0..self.num_samples())
            .map(|i| {
                let (schema, key, ranges) = self.sample_fields(i)?;
                let files = match &schema {
                    SampleSchema::Wds(fields) => {
                        let key = key.as_deref().unwrap_or_default();
                        fields
                            .names
                            .iter()
                            .zip(ranges)
                            .map(|(ext, range)| SampleFile {
                                name: format!("{key}.{ext}"),
                                encoding: None,
                                range,
                            })
                            .collect()
                    }
                    SampleSchema::LitData(fields) if fields.decoder.per_item_zstd => ranges
                        .into_iter()
                        .map(|range| SampleFile {
                            name: "item".into(),
                            encoding: Some("zst".into()),
                            range,
                        })
                        .collect(),
                    SampleSchema::LitData(fields) => fields
                        .decoder
                        .columns
                        .iter()
                        .zip(&fields.decoder.names)
                        .zip(ranges)
                        .map(|((name, format), range)| SampleFile {
                            name: name.clone(),
                            encoding: Some(format.clone()),
                            range,
                        })
                        .collect(),
                    SampleSchema::Mds(columns) => columns
                        .names()
                        .iter()
                        .zip(columns.encoding_names())
                        .zip(ranges)
                        .map(|((name, encoding), range)| SampleFile {
                            name: name.clone(),
                            encoding: Some(encoding.clone()),
                            range,
                        })
                        .collect(),
                };
                Ok(files)
            })
            .collect()
    }
}

impl StreamingDataset {
    /// Shard `shard` as the index describes it; `None` out of range.
    pub fn shard_info(&self, shard: usize) -> Option<ShardInfo> {
        let src = self.inner.shards.get(shard)?;
        Some(ShardInfo {
            name: src.name.to_string(),
            stream: src.stream,
            file: src.stored_rel.clone(),
            file_bytes: src.stored_size,
            compression: src.algorithm.map(|a| a.extension()),
            raw_bytes: src.raw_size,
            samples: src.samples,
            first_sample: src.first_sample,
            cache_bytes: src.cache_bytes,
        })
    }

    /// The format of shard `shard`; `None` out of range.
    pub fn shard_format(&self, shard: usize) -> Option<ShardFormat> {
        Some(match self.inner.shards.get(shard)?.schema {
            ShardSchema::Mds(_) => ShardFormat::Mds,
            ShardSchema::Wds => ShardFormat::WebDataset,
            ShardSchema::LitData(_) => ShardFormat::LitData,
        })
    }

    fn check_shard(&self, shard: usize) -> Result<()> {
        if shard >= self.inner.shards.len() {
            return Err(StreamerError::OutOfRange {
                what: "shard",
                index: shard as u64,
                len: self.inner.shards.len() as u64,
            });
        }
        Ok(())
    }

    /// The cache keys a shard's files may have in the node's cache: its stored file and, for a
    /// compressed shard, the decompressed one.
    fn cache_keys(&self, shard: usize) -> Vec<String> {
        match self.inner.shards.get(shard) {
            Some(src) if src.cache_bytes == 0 => Vec::new(),
            Some(src) if src.algorithm.is_some() => {
                vec![format!("{}#raw", src.name), src.name.to_string()]
            }
            Some(src) => vec![src.name.to_string()],
            None => Vec::new(),
        }
    }

    /// Whether shard `shard` can be read without a download: read in place, or its file in the
    /// node's cache now (a `stat`; opening it checks it).
    pub fn shard_cached(&self, shard: usize) -> Result<bool> {
        self.check_shard(shard)?;
        let src = &self.inner.shards[shard];
        if src.cache_bytes == 0 {
            return Ok(true);
        }
        let ps = self.proc()?;
        Ok(engine::is_cached(&ps, src))
    }

    /// Downloads shard `shard` into the node's cache (or joins the process of the node that
    /// downloads it) and waits until it is complete there. Nothing to do for a cached shard or
    /// one read in place. Blocking; the shard is not pinned afterwards.
    pub fn prepare_shard(&self, shard: usize) -> Result<()> {
        self.check_shard(shard)?;
        let ps = self.proc()?;
        let (inner, task_ps) = (Arc::clone(&self.inner), Arc::clone(&ps));
        ps.block_on(async move {
            let handle = engine::open_shard(inner, task_ps, shard).await?;
            handle.complete().await
        })
    }

    /// [`Self::prepare_shard`] for `shards` in the background of this process, in that order,
    /// as many at once as a stream downloads. Returns at once; dropping the handle starts no
    /// further download.
    pub fn prepare_shards(&self, shards: Vec<usize>) -> Result<Prefetch> {
        for &shard in &shards {
            self.check_shard(shard)?;
        }
        let shards: Vec<usize> = shards
            .into_iter()
            .filter(|&s| self.inner.shards[s].cache_bytes > 0)
            .collect();
        if shards.is_empty() {
            return Ok(prefetch::nothing());
        }
        let ps = self.proc()?;
        Ok(prefetch::start(Arc::clone(&self.inner), ps, shards))
    }

    /// Deletes shard `shard`'s files from the node's cache, unless a process of the node reads,
    /// fetches or checks it (this process's shards kept open by random access are let go
    /// first). `Some(bytes freed)` (0 when it was not cached or is read in place), `None` when
    /// it is in use.
    pub fn evict_shard(&self, shard: usize) -> Result<Option<u64>> {
        self.check_shard(shard)?;
        let keys = self.cache_keys(shard);
        if keys.is_empty() {
            return Ok(Some(0));
        }
        self.inner.forget_recent(Some(shard));
        let ps = self.proc()?;
        let mut freed = 0u64;
        for key in keys {
            match ps.cache.evict(&key)? {
                Some(bytes) => freed += bytes,
                None => return Ok(None),
            }
        }
        Ok(Some(freed))
    }

    /// Deletes the least recently used of this dataset's shards in the node's cache that no
    /// process uses, as [`Self::evict_shard`]. Returns its id, or `None` when no shard of the
    /// dataset is in the cache unused.
    pub fn evict_coldest_shard(&self) -> Result<Option<usize>> {
        let ps = self.proc()?;
        let mut cached: Vec<(SystemTime, usize)> = (0..self.inner.shards.len())
            .filter_map(|s| {
                let key = self.cache_keys(s).into_iter().next()?;
                ps.cache.last_use(&key).map(|t| (t, s))
            })
            .collect();
        cached.sort();
        for (_, shard) in cached {
            if let Some(bytes) = self.evict_shard(shard)? {
                if bytes > 0 {
                    return Ok(Some(shard));
                }
            }
        }
        Ok(None)
    }
}
