//! A LitData dataset as an input: its columns (the pytree's leaves) and samples, in index order.
//! Blocks are chunks.
//!
//! Leaf formats map to MDS encodings: `str` → `str`, `int` → `int`, `float` → `float64`, `bool` →
//! `uint8`, `bytes` and file-like leaves → `bytes`, `numpy`/`tensor` (and `no_header_*`, and
//! `TokensLoader` items) → `ndarray`, `pil` → `pil`, `jpeg` and `image:jpg` → `jpeg`, `image:png`
//! → `png`, other images → `bytes`, `jpeg_array` → `jpeg_array`, `json` → `json`, `pickle` →
//! `pkl`.

use std::ops::Range;
use std::path::Path;

use super::{clamp, Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::litdata::{ItemLoader, LeafFormat, LitDataOptions, LitDataReader};

/// A local LitData dataset as an [`Input`].
#[derive(Debug)]
pub struct LitDataInput {
    reader: LitDataReader,
    starts: Vec<u64>,
    columns: Columns,
}

/// The MDS encoding a LitData leaf converts to (see the module doc).
pub fn mds_encoding_of(leaf: &LeafFormat) -> Option<&'static str> {
    Some(match leaf {
        LeafFormat::Str => "str",
        LeafFormat::Int => "int",
        LeafFormat::Float => "float64",
        LeafFormat::Bool => "uint8",
        LeafFormat::Bytes | LeafFormat::File(_) => "bytes",
        LeafFormat::Numpy
        | LeafFormat::NoHeaderNumpy(_)
        | LeafFormat::Tensor
        | LeafFormat::NoHeaderTensor(_) => "ndarray",
        LeafFormat::Pil => "pil",
        LeafFormat::Jpeg => "jpeg",
        LeafFormat::JpegArray => "jpeg_array",
        LeafFormat::Image(ext) if ext == "jpg" || ext == "jpeg" => "jpeg",
        LeafFormat::Image(ext) if ext == "png" => "png",
        LeafFormat::Image(_) => "bytes",
        LeafFormat::Json => "json",
        LeafFormat::Pickle => "pkl",
        LeafFormat::Unsupported(_) => return None,
    })
}

impl LitDataInput {
    /// Opens the dataset in `dir`.
    pub fn open(dir: &Path, allow_unsafe_types: bool) -> Result<Self> {
        let options = LitDataOptions {
            allow_unsafe_types,
            ..LitDataOptions::default()
        };
        let reader = LitDataReader::open(dir, options)?;
        let index = reader.index();
        let mut columns = Columns::new();
        let tokens = matches!(index.item_loader, ItemLoader::Tokens);
        for (i, name) in index.columns.iter().enumerate() {
            let leaf = index.leaf_formats.get(i);
            let encoding = if tokens {
                Some("ndarray")
            } else {
                leaf.and_then(mds_encoding_of)
            };
            let encoding = encoding.ok_or_else(|| {
                FormatError::invalid_index(
                    index.path.clone(),
                    format!("column {name:?} has a format ({leaf:?}) that cannot be converted"),
                )
            })?;
            columns.insert(name.clone(), encoding.to_string());
        }
        let mut starts = Vec::with_capacity(index.chunks.len() + 1);
        let mut total = 0u64;
        for chunk in &index.chunks {
            starts.push(total);
            total += chunk.chunk_size;
        }
        starts.push(total);
        Ok(LitDataInput {
            reader,
            starts,
            columns,
        })
    }

    fn chunk_of(&self, item: u64) -> usize {
        self.starts
            .partition_point(|&s| s <= item)
            .saturating_sub(1)
    }
}

impl Input for LitDataInput {
    fn format(&self) -> InputFormat {
        InputFormat::LitData
    }

    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    fn block_end(&self, start: u64) -> u64 {
        self.starts
            .get(self.chunk_of(start) + 1)
            .copied()
            .unwrap_or_else(|| self.len())
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let range = clamp(range, self.len());
        let chunks = self.starts.len().saturating_sub(1);
        let mut parts: Vec<SampleIter<'_>> = Vec::new();
        for chunk in self.chunk_of(range.start)..chunks {
            let (first, end) = (self.starts[chunk], self.starts[chunk + 1]);
            if first >= range.end {
                break;
            }
            if first == end {
                continue;
            }
            let from = (range.start.max(first) - first) as usize;
            let to = (range.end.min(end) - first) as usize;
            let mut loaded = None;
            let mut next = from;
            let mut failed = false;
            parts.push(Box::new(std::iter::from_fn(move || {
                if failed || next >= to {
                    return None;
                }
                if loaded.is_none() {
                    match self.reader.read_chunk(chunk) {
                        Ok(c) => loaded = Some(c),
                        Err(e) => {
                            failed = true;
                            return Some(Err(e));
                        }
                    }
                }
                let sample = loaded.as_ref()?.sample(next);
                next += 1;
                failed = sample.is_err();
                Some(sample)
            })));
        }
        Ok(Box::new(parts.into_iter().flatten()))
    }
}
