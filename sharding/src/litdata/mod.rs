//! LitData `optimize()` output, read (`litdata` 0.2.x: `streaming/writer.py`, `item_loader.py`,
//! `serializers.py`, `framed_zstd.py`).
//!
//! A dataset is a folder with `index.json` ([`LitDataIndex`]) and chunk files. Chunks are read in
//! the order the index lists them, which is the order litdata's merge wrote them (its per-worker
//! index files merged in natural order of their names: `2.index.json` before `10.index.json` in
//! litdata 0.2.7x, plain lexicographic order in older releases), so samples come out in litdata's
//! global item order.
//!
//! Chunk containers read: classic `.bin`, whole-file zstd (`chunk-R-I.zstd.bin`, also
//! `chunk-R-I.zstd:N.bin`), framed zstd (`LDFZ01` magic, `compression_level="batch"`, the default
//! for `compression="zstd"` in litdata 0.2.7x) and per-item zstd (`compression_level="sample"`).
//! Item loaders read: `PyTreeLoader` (every leaf decoded) and `TokensLoader` (each item as a 1-D
//! array of its tokens). Encrypted datasets, Arrow-footer-only chunks and other loaders are a
//! [`crate::FormatError::Unsupported`] error.
//!
//! Leaves map to values: `str`/`text` → [`Value::Str`](crate::Value::Str), `int`, `float`, `bool`,
//! `bytes`, `numpy`/`tensor` and their `no_header_*` forms → [`Value::NdArray`](crate::Value::NdArray),
//! `pil` → [`Value::Pil`](crate::Value::Pil), `jpeg` → `Value::Image(Jpeg, ..)`, `jpeg_array` →
//! a list of those, `json` → [`Value::Json`](crate::Value::Json), `file:*`, `video:*`, `audio:*` and
//! other file-backed media → raw bytes; `pickle` only with
//! [`LitDataOptions::allow_unsafe_types`].
//!
//! Column names come from the pytree spec ([`TreeSpec::leaf_names`]): a top-level dict gives its
//! keys, nested containers join their keys or positions with `.` (`meta.id`, `boxes.0`), and a
//! tuple, list or single leaf gives `0`, `1`, ...
//!
//! ```no_run
//! use shardstream_sharding::litdata::{LitDataOptions, LitDataReader};
//!
//! let reader = LitDataReader::open("/data/optimized", LitDataOptions::default())?;
//! println!("{} samples, columns {:?}", reader.num_samples(), reader.index().columns);
//! for sample in reader.samples().take(3) {
//!     let sample = sample?;
//!     println!("{:?}", sample.keys().collect::<Vec<_>>());
//! }
//! # Ok::<(), shardstream_sharding::FormatError>(())
//! ```
//!
//! Without a folder (bytes fetched from object storage), parse the index and each chunk directly:
//!
//! ```no_run
//! # fn fetch(_: &str) -> Vec<u8> { Vec::new() }
//! use shardstream_sharding::litdata::{LitDataChunk, LitDataIndex, LitDataOptions};
//! let index = LitDataIndex::parse("s3://b/ds/index.json", &fetch("index.json"))?;
//! let chunk = LitDataChunk::parse(&index, 0, fetch(&index.chunks[0].filename), &LitDataOptions::default())?;
//! let first = chunk.sample(0)?;
//! # Ok::<(), shardstream_sharding::FormatError>(())
//! ```

mod chunk;
pub mod framed;
mod index;
mod nested_json;
mod serializers;

use std::path::{Path, PathBuf};

pub use chunk::{ItemDecoder, LitDataChunk, LitDataOptions};
pub use index::{ChunkInfo, CompressionLevel, ItemLoader, LitDataIndex, TreeSpec};
pub use serializers::LeafFormat;

use crate::error::{FormatError, Result};
use crate::value::Sample;

/// The name of a LitData index file.
pub const INDEX_FILENAME: &str = "index.json";

/// Reads a LitData dataset from a local folder.
#[derive(Debug, Clone)]
pub struct LitDataReader {
    root: PathBuf,
    index: LitDataIndex,
    options: LitDataOptions,
}

impl LitDataReader {
    /// Opens the dataset in `dir` (reads and checks `dir/index.json`).
    pub fn open(dir: impl AsRef<Path>, options: LitDataOptions) -> Result<Self> {
        let root = dir.as_ref().to_path_buf();
        let path = root.join(INDEX_FILENAME);
        let bytes = crate::index_file::read_index_file(&path)?;
        let index = LitDataIndex::parse(&path.display().to_string(), &bytes)?;
        Ok(LitDataReader {
            root,
            index,
            options,
        })
    }

    /// The parsed index.
    pub fn index(&self) -> &LitDataIndex {
        &self.index
    }

    /// Samples in the dataset.
    pub fn num_samples(&self) -> u64 {
        self.index.num_samples()
    }

    /// Reads and parses chunk `i`.
    pub fn read_chunk(&self, i: usize) -> Result<LitDataChunk> {
        let info = self.index.chunks.get(i).ok_or_else(|| {
            FormatError::InvalidArgument(format!(
                "{}: no chunk {i} (the index lists {})",
                self.index.path,
                self.index.chunks.len()
            ))
        })?;
        let path = self.root.join(&info.filename);
        match std::fs::read(&path) {
            Ok(bytes) => LitDataChunk::parse(&self.index, i, bytes, &self.options),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // litdata reading a local dataset inflates `chunk-R-I.zstd.bin` in place to
                // `chunk-R-I.bin` and deletes the compressed file; read that copy.
                let inflated = match &self.index.compression {
                    Some(c) if self.index.whole_file_zstd() => {
                        info.filename.replace(&format!(".{c}"), "")
                    }
                    _ => return Err(FormatError::io(&path, e)),
                };
                let inflated_path = self.root.join(&inflated);
                let bytes = std::fs::read(&inflated_path).map_err(|_| FormatError::io(&path, e))?;
                LitDataChunk::parse_inflated(&self.index, i, bytes, &self.options)
            }
            Err(e) => Err(FormatError::io(&path, e)),
        }
    }

    /// Every sample in dataset order, one chunk in memory at a time. Ends after the first error.
    pub fn samples(&self) -> impl Iterator<Item = Result<Sample>> + '_ {
        let mut chunk_no = 0usize;
        let mut current: Option<(LitDataChunk, usize)> = None;
        let mut failed = false;
        std::iter::from_fn(move || loop {
            if failed {
                return None;
            }
            if let Some((chunk, next)) = current.as_mut() {
                if *next < chunk.len() {
                    let sample = chunk.sample(*next);
                    *next += 1;
                    failed = sample.is_err();
                    return Some(sample);
                }
                current = None;
            }
            if chunk_no >= self.index.chunks.len() {
                return None;
            }
            match self.read_chunk(chunk_no) {
                Ok(chunk) => current = Some((chunk, 0)),
                Err(e) => {
                    failed = true;
                    return Some(Err(e));
                }
            }
            chunk_no += 1;
        })
    }
}
