//! One LitData chunk file: its container (classic, whole-file zstd, framed zstd, per-item zstd)
//! turned into item byte ranges, and items turned into [`Sample`]s.
//!
//! Classic layout (`writer.py:_create_chunk`): `u32 n | u32 offsets[n+1] | items`, offsets absolute.
//! A PyTree item is `u32 size[leaves] | leaf bytes...`; a Tokens item is raw token bytes.
//! Framed chunks (`compression_level="batch"`) are turned into the classic layout first, by
//! [`super::framed`], the same transform the streamer applies into its cache.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use super::index::{CompressionLevel, ItemLoader, LitDataIndex};
use super::serializers::{decode_leaf, token_dtype, tokens, LeafError, LeafFormat};
use crate::error::{FormatError, Result};
use crate::value::{DType, Sample};

const ARROW_FOOTER_MAGIC: &[u8; 8] = b"LDARW01\0";

/// How chunks are read.
#[derive(Debug, Clone)]
pub struct LitDataOptions {
    /// Decode `pickle` leaves (as raw [`crate::Value::Pickle`] bytes) instead of refusing them.
    pub allow_unsafe_types: bool,
    /// Most bytes one zstd stream (a chunk, a frame, an item) may inflate to. Classic offsets are
    /// u32, so no valid chunk exceeds 4 GiB.
    pub max_inflated_size: u64,
}

impl Default for LitDataOptions {
    fn default() -> Self {
        LitDataOptions {
            allow_unsafe_types: false,
            max_inflated_size: 1 << 32,
        }
    }
}

/// What the items of a chunk are.
#[derive(Debug, Clone)]
enum Items {
    PyTree {
        formats: Vec<LeafFormat>,
        names: Vec<String>,
    },
    Tokens(DType),
}

/// A parsed chunk: random access to its items and samples.
#[derive(Debug, Clone)]
pub struct LitDataChunk {
    path: String,
    data: Vec<u8>,
    ranges: Vec<(usize, usize)>,
    per_item_zstd: bool,
    items: Items,
    columns: Vec<String>,
    options: LitDataOptions,
}

/// `dir-of-index/filename`, to name a chunk in errors.
pub(crate) fn chunk_label(index: &LitDataIndex, filename: &str) -> String {
    match Path::new(&index.path).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(filename).display().to_string(),
        _ => filename.to_string(),
    }
}

fn inflate(src: &[u8], limit: u64) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    inflate_into(src, limit, &mut out)?;
    Ok(out)
}

/// Inflates `src` into `out`, failing once it would pass `limit` bytes: the decoder is read
/// through a `take` of `limit + 1`, so at most that much is ever produced, whatever the stream
/// holds.
fn inflate_into(src: &[u8], limit: u64, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let decoder = zstd::stream::read::Decoder::with_buffer(src).map_err(|e| e.to_string())?;
    decoder
        .take(limit.saturating_add(1))
        .read_to_end(out)
        .map_err(|e| e.to_string())?;
    if out.len() as u64 > limit {
        return Err(format!("inflates to more than {limit} bytes"));
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

impl LitDataChunk {
    /// Parses chunk number `chunk` of `index` from the bytes of its file (as stored: compressed
    /// when the index says so).
    pub fn parse(
        index: &LitDataIndex,
        chunk: usize,
        file: Vec<u8>,
        options: &LitDataOptions,
    ) -> Result<LitDataChunk> {
        Self::parse_inner(index, chunk, file, options, index.whole_file_zstd())
    }

    /// Parses chunk `chunk` from bytes already inflated from whole-file zstd: the copy litdata
    /// keeps as `chunk-R-I.bin` in place of `chunk-R-I.zstd.bin` once it has read a local dataset.
    pub fn parse_inflated(
        index: &LitDataIndex,
        chunk: usize,
        bytes: Vec<u8>,
        options: &LitDataOptions,
    ) -> Result<LitDataChunk> {
        Self::parse_inner(index, chunk, bytes, options, false)
    }

    fn parse_inner(
        index: &LitDataIndex,
        chunk: usize,
        file: Vec<u8>,
        options: &LitDataOptions,
        whole_file_zstd: bool,
    ) -> Result<LitDataChunk> {
        let info = index.chunks.get(chunk).ok_or_else(|| {
            FormatError::InvalidArgument(format!(
                "{}: no chunk {chunk} (the index lists {})",
                index.path,
                index.chunks.len()
            ))
        })?;
        let path = chunk_label(index, &info.filename);
        let unsupported = |what: String| FormatError::Unsupported {
            path: index.path.clone(),
            what,
        };
        if let Some(enc) = &index.encryption {
            return Err(unsupported(format!(
                "encrypted LitData datasets (encryption {enc}); decrypt with litdata first"
            )));
        }
        if let Some(format) = &index.foreign_format {
            return Err(unsupported(format!(
                "litdata index over another format ({format:?}); read that format directly"
            )));
        }
        let items = match &index.item_loader {
            ItemLoader::PyTree => Items::PyTree {
                formats: index.leaf_formats.clone(),
                names: index.data_format.clone(),
            },
            ItemLoader::Tokens => {
                let [format] = index.leaf_formats.as_slice() else {
                    return Err(FormatError::invalid_index(
                        &index.path,
                        "TokensLoader dataset with more than one data_format entry",
                    ));
                };
                Items::Tokens(token_dtype(format).map_err(|e| match e {
                    LeafError::Bad(r) | LeafError::Unsupported(r) => unsupported(r),
                    LeafError::Unsafe => unsupported("pickle tokens".into()),
                })?)
            }
            ItemLoader::Other(name) => {
                return Err(unsupported(format!("the {name} item loader")));
            }
        };
        let data = if whole_file_zstd {
            // The index declares the inflated size: inflating stops there, not at the 4 GiB
            // any chunk could take, so a small bomb costs no more memory than its honest chunk.
            let (limit, declared) = match info.chunk_bytes {
                Some(b) if b <= options.max_inflated_size => (b, " (the index's chunk_bytes)"),
                _ => (options.max_inflated_size, ""),
            };
            let data = inflate(&file, limit).map_err(|reason| FormatError::Decompress {
                path: path.clone(),
                algorithm: "zstd".into(),
                reason: format!("{reason}{declared}"),
            })?;
            check_size(&path, info.chunk_bytes, data.len())?;
            data
        } else {
            // `chunk_bytes` is the size before whole-file compression, so it holds either way.
            check_size(&path, info.chunk_bytes, file.len())?;
            file
        };
        let mut chunk = LitDataChunk {
            path,
            data: Vec::new(),
            ranges: Vec::new(),
            per_item_zstd: false,
            items,
            columns: index.columns.clone(),
            options: options.clone(),
        };
        if super::framed::is_framed(&data) {
            chunk.parse_framed(data, info.chunk_size)?;
        } else if index.compression_level == CompressionLevel::Batch
            && index.compression.is_some()
            && !data_is_classic(&data, info.chunk_size)
        {
            return Err(chunk.corrupt(
                "indexed as compression_level='batch' but the LDFZ01 magic is missing".into(),
            ));
        } else {
            chunk.per_item_zstd =
                index.compression_level == CompressionLevel::Sample && index.compression.is_some();
            chunk.parse_classic(data, info.chunk_size)?;
        }
        Ok(chunk)
    }

    fn corrupt(&self, reason: String) -> FormatError {
        FormatError::corrupt(self.path.clone(), reason)
    }

    fn parse_classic(&mut self, data: Vec<u8>, expected: u64) -> Result<()> {
        let n = u32_at(&data, 0).ok_or_else(|| self.corrupt("shorter than 4 bytes".into()))?;
        if u64::from(n) != expected {
            return Err(self.corrupt(format!("holds {n} items, the index says {expected}")));
        }
        let header_end = 4 + 4 * (u64::from(n) + 1);
        if header_end > data.len() as u64 {
            return Err(self.corrupt(format!(
                "offset table of {n} items runs past the end ({} bytes)",
                data.len()
            )));
        }
        let offsets: Vec<u64> = (0..=n as usize)
            .map(|i| u64::from(u32_at(&data, 4 + 4 * i).unwrap_or(0)))
            .collect();
        self.ranges = self.ranges_from(&offsets, header_end, data.len() as u64)?;
        let all_empty = self.ranges.iter().all(|&(a, b)| a == b);
        if n > 0 && all_empty && data.ends_with(ARROW_FOOTER_MAGIC) {
            return Err(FormatError::Unsupported {
                path: self.path.clone(),
                what: "rows stored only in an Arrow IPC footer (litdata with pyarrow)".into(),
            });
        }
        self.data = data;
        Ok(())
    }

    /// Item ranges from `n+1` offsets that must rise from `start` to at most `end`.
    fn ranges_from(&self, offsets: &[u64], start: u64, end: u64) -> Result<Vec<(usize, usize)>> {
        let mut ranges = Vec::with_capacity(offsets.len().saturating_sub(1));
        let mut prev = start;
        for (i, pair) in offsets.windows(2).enumerate() {
            let (a, b) = (pair[0], pair[1]);
            if a < prev || b < a || b > end {
                return Err(self.corrupt(format!(
                    "item {i} spans bytes {a}..{b}, outside {prev}..{end}"
                )));
            }
            ranges.push((a as usize, b as usize));
            prev = b;
        }
        Ok(ranges)
    }

    /// A framed chunk turned into the classic layout ([`super::framed::to_classic`]), then read
    /// as one.
    fn parse_framed(&mut self, data: Vec<u8>, expected: u64) -> Result<()> {
        let mut classic = Vec::new();
        super::framed::to_classic(
            &self.path,
            &mut &data[..],
            data.len() as u64,
            self.options.max_inflated_size,
            &mut classic,
            &mut |_| {},
        )?;
        drop(data);
        self.parse_classic(classic, expected)
    }

    /// Items in the chunk.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether the chunk has no items.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Column names of this chunk's samples, in leaf order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The bytes of item `i` (inflated when items are zstd-compressed one by one).
    pub fn item_bytes(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        let &(a, b) = self.ranges.get(i).ok_or_else(|| {
            FormatError::InvalidArgument(format!(
                "{}: no item {i} (chunk has {})",
                self.path,
                self.len()
            ))
        })?;
        let raw = &self.data[a..b];
        if !self.per_item_zstd {
            return Ok(Cow::Borrowed(raw));
        }
        inflate(raw, self.options.max_inflated_size)
            .map(Cow::Owned)
            .map_err(|reason| FormatError::Decompress {
                path: format!("{} (item {i})", self.path),
                algorithm: "zstd".into(),
                reason,
            })
    }

    /// Decodes item `i` into a sample keyed by [`LitDataChunk::columns`].
    pub fn sample(&self, i: usize) -> Result<Sample> {
        let bytes = self.item_bytes(i)?;
        let mut sample = Sample::new();
        match &self.items {
            Items::Tokens(dtype) => {
                let value =
                    tokens(*dtype, &bytes).map_err(|e| self.leaf_error(i, 0, "tokens", e))?;
                sample.insert(self.columns[0].clone(), value);
            }
            Items::PyTree { formats, names } => {
                let decoder = ItemDecoder {
                    formats: formats.clone(),
                    names: names.clone(),
                    columns: self.columns.clone(),
                    per_item_zstd: false,
                    allow_unsafe_types: self.options.allow_unsafe_types,
                    max_inflated_size: self.options.max_inflated_size,
                };
                for (name, value) in self
                    .columns
                    .iter()
                    .zip(decoder.decode(&self.path, i as u64, &bytes)?)
                {
                    sample.insert(name.clone(), value);
                }
            }
        }
        Ok(sample)
    }

    /// Every sample, in order.
    pub fn samples(&self) -> impl Iterator<Item = Result<Sample>> + '_ {
        (0..self.len()).map(|i| self.sample(i))
    }

    fn leaf_error(&self, i: usize, leaf: usize, encoding: &str, e: LeafError) -> FormatError {
        let column = self.columns[leaf].clone();
        match e {
            LeafError::Bad(reason) => FormatError::Decode {
                path: self.path.clone(),
                sample: i as u64,
                column,
                encoding: encoding.to_string(),
                reason,
            },
            LeafError::Unsupported(what) => FormatError::Unsupported {
                path: self.path.clone(),
                what: format!("column {column:?} ({encoding}): {what}"),
            },
            LeafError::Unsafe => FormatError::UnsafeEncoding {
                path: self.path.clone(),
                column,
                encoding: encoding.to_string(),
            },
        }
    }
}

/// litdata writes the config's `compression_level="batch"` even for chunks it left unframed (when
/// its Arrow footer path declined the rows), so a classic chunk under "batch" is accepted when its
/// item count matches.
fn data_is_classic(data: &[u8], expected: u64) -> bool {
    u32_at(data, 0).is_some_and(|n| u64::from(n) == expected)
}

fn check_size(path: &str, expected: Option<u64>, actual: usize) -> Result<()> {
    match expected {
        Some(e) if e != actual as u64 => Err(FormatError::SizeMismatch {
            path: path.to_string(),
            expected: e,
            actual: actual as u64,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zstd stream of `size` zero bytes: a bomb when `size` is large (a few KB per 100 MB).
    fn zeros_zstd(size: usize) -> Vec<u8> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        let block = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(block.len());
            std::io::Write::write_all(&mut encoder, &block[..n]).unwrap();
            left -= n;
        }
        encoder.finish().unwrap()
    }

    fn whole_file_zstd_index(chunk_bytes: u64) -> LitDataIndex {
        let text = format!(
            r#"{{"chunks": [{{"filename": "chunk-0-0.zstd.bin", "chunk_size": 1,
            "chunk_bytes": {chunk_bytes}, "dim": null}}],
            "config": {{"compression": "zstd", "data_format": ["int"]}}}}"#
        );
        LitDataIndex::parse("ds/index.json", text.as_bytes()).unwrap()
    }

    /// Issue 40, row 2: a whole-file zstd chunk the index says is 32 bytes, inflating to far
    /// more, was inflated up to the 4 GiB any chunk may take (4.2 GB RSS for a 3 GB bomb) before
    /// its size was compared. Inflation now stops at the declared size: the decoder's bounded
    /// reader produces at most 33 bytes, and the error names the chunk and the limit.
    #[test]
    fn a_zstd_bomb_stops_at_the_chunk_bytes_the_index_declares() {
        let bomb = zeros_zstd(256 << 20);
        assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());

        let mut produced = Vec::new();
        let err = inflate_into(&bomb, 32, &mut produced).unwrap_err();
        assert!(err.contains("more than 32 bytes"), "{err}");
        assert!(produced.len() <= 33, "{} bytes produced", produced.len());
        // What was allocated, not only what was kept: the slack of the first growth step.
        assert!(
            produced.capacity() <= 64 << 10,
            "{} bytes reserved",
            produced.capacity()
        );

        let index = whole_file_zstd_index(32);
        let err = LitDataChunk::parse(&index, 0, bomb, &LitDataOptions::default()).unwrap_err();
        match &err {
            FormatError::Decompress { path, reason, .. } => {
                assert_eq!(path, "ds/chunk-0-0.zstd.bin");
                assert!(reason.contains("more than 32 bytes"), "{reason}");
                assert!(reason.contains("chunk_bytes"), "{reason}");
            }
            other => panic!("expected a decompression error, got {other}"),
        }
    }

    /// An honest whole-file zstd chunk inflates to exactly its declared size and still reads.
    #[test]
    fn a_whole_file_zstd_chunk_of_its_declared_size_reads() {
        let mut raw = Vec::new();
        // One item of one `int` leaf: count, offsets 12..24, the leaf's size, the leaf.
        for word in [1u32, 12, 24, 8] {
            raw.extend_from_slice(&word.to_le_bytes());
        }
        raw.extend_from_slice(&7i64.to_le_bytes());
        let index = whole_file_zstd_index(raw.len() as u64);
        let packed = zstd::encode_all(raw.as_slice(), 3).unwrap();
        let chunk = LitDataChunk::parse(&index, 0, packed, &LitDataOptions::default()).unwrap();
        assert_eq!(chunk.len(), 1);
    }
}

/// Decodes the items of a PyTree chunk one at a time, from their bytes as the chunk holds them
/// (a zstd frame each when `per_item_zstd`): the sizes of the leaves, then the leaves, each by
/// its serializer. What the streamer uses on an item it read from a chunk file.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemDecoder {
    /// One serializer per leaf.
    pub formats: Vec<LeafFormat>,
    /// The `data_format` entries, to name a leaf's format in errors.
    pub names: Vec<String>,
    /// One column name per leaf.
    pub columns: Vec<String>,
    /// Items are zstd frames (`compression_level="sample"`).
    pub per_item_zstd: bool,
    /// Decode `pickle` leaves (as raw bytes) instead of refusing them.
    pub allow_unsafe_types: bool,
    /// Most bytes an item inflates to.
    pub max_inflated_size: u64,
}

impl ItemDecoder {
    /// The decoder of `index`'s items; `None` when they are not PyTree items (tokens, other
    /// loaders). Items of framed `batch` chunks are read from their classic form
    /// ([`super::framed`]), so they decode as plain items.
    pub fn for_index(index: &LitDataIndex, allow_unsafe_types: bool) -> Option<ItemDecoder> {
        if index.item_loader != ItemLoader::PyTree {
            return None;
        }
        Some(ItemDecoder {
            formats: index.leaf_formats.clone(),
            names: index.data_format.clone(),
            columns: index.columns.clone(),
            per_item_zstd: index.compression.is_some()
                && index.compression_level == CompressionLevel::Sample,
            allow_unsafe_types,
            max_inflated_size: LitDataOptions::default().max_inflated_size,
        })
    }

    /// Item `i` of chunk `path`, one value per leaf (in [`ItemDecoder::columns`] order).
    pub fn decode(&self, path: &str, i: u64, item: &[u8]) -> Result<Vec<crate::Value>> {
        let inflated;
        let bytes = if self.per_item_zstd {
            inflated = inflate(item, self.max_inflated_size).map_err(|reason| {
                FormatError::Decompress {
                    path: format!("{path} (item {i})"),
                    algorithm: "zstd".into(),
                    reason,
                }
            })?;
            &inflated[..]
        } else {
            item
        };
        let item_error =
            |reason: String| FormatError::corrupt(path.to_string(), format!("item {i}: {reason}"));
        let header = 4 * self.formats.len();
        if bytes.len() < header {
            return Err(item_error(format!(
                "{} bytes cannot hold the sizes of {} leaves",
                bytes.len(),
                self.formats.len()
            )));
        }
        let mut values = Vec::with_capacity(self.formats.len());
        let mut pos = header;
        for (leaf, format) in self.formats.iter().enumerate() {
            let size = u32_at(bytes, 4 * leaf).unwrap_or(0) as usize;
            let column = self.columns.get(leaf).cloned().unwrap_or_default();
            let Some(leaf_bytes) = pos.checked_add(size).and_then(|end| bytes.get(pos..end)) else {
                return Err(item_error(format!(
                    "leaf {leaf} ({column}) of {size} bytes runs past the item's {} bytes",
                    bytes.len()
                )));
            };
            let encoding = self.names.get(leaf).map_or("", String::as_str);
            let value =
                decode_leaf(format, leaf_bytes, self.allow_unsafe_types).map_err(|e| match e {
                    LeafError::Bad(reason) => FormatError::Decode {
                        path: path.to_string(),
                        sample: i,
                        column: column.clone(),
                        encoding: encoding.to_string(),
                        reason,
                    },
                    LeafError::Unsupported(what) => FormatError::Unsupported {
                        path: path.to_string(),
                        what: format!("column {column:?} ({encoding}): {what}"),
                    },
                    LeafError::Unsafe => FormatError::UnsafeEncoding {
                        path: path.to_string(),
                        column: column.clone(),
                        encoding: encoding.to_string(),
                    },
                })?;
            values.push(value);
            pos += size;
        }
        if pos != bytes.len() {
            return Err(item_error(format!(
                "{} bytes after the last leaf",
                bytes.len() - pos
            )));
        }
        Ok(values)
    }
}
