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

use super::blocks::BlockStarts;
use super::{Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::litdata::{ItemLoader, LeafFormat, LitDataOptions, LitDataReader};

/// A local LitData dataset as an [`Input`].
#[derive(Debug)]
pub struct LitDataInput {
    reader: LitDataReader,
    starts: BlockStarts,
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
        let starts = BlockStarts::from_counts(index.chunks.iter().map(|chunk| chunk.chunk_size));
        Ok(LitDataInput {
            reader,
            starts,
            columns,
        })
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
        self.starts.len()
    }

    fn block_end(&self, start: u64) -> u64 {
        self.starts.block_end(start)
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let reader = &self.reader;
        Ok(self.starts.read(
            range,
            move |chunk| reader.read_chunk(chunk),
            |loaded, i| loaded.sample(i),
        ))
    }
}
