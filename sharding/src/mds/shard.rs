//! The `.mds` shard file: header, samples, and a bounds-checked reader.
//!
//! ```text
//! u32 N | u32 offsets[N+1] (absolute; offsets[N] = file size) | config JSON | sample_0 .. sample_N-1
//! sample = u32 size per variable-size column, in column order | each column's bytes, in column order
//! ```
//! All integers are little-endian. The config is `json.dumps(get_config(), sort_keys=True)`; readers
//! never parse it (the index is authoritative), so [`ShardReader`] only checks that the offsets
//! leave room for it.
//!
//! ```
//! use std::sync::Arc;
//! use shardstream_sharding::mds::{encode_shard, Columns, ShardReader};
//! use shardstream_sharding::{Sample, Value};
//! let columns = Arc::new(Columns::new(&[("id".into(), "int".into()), ("txt".into(), "str".into())]).unwrap());
//! let mut sample = Sample::new();
//! sample.insert("id".into(), Value::Int(7));
//! sample.insert("txt".into(), Value::Str("hi".into()));
//! let mut body = Vec::new();
//! columns.encode_sample(&sample, &mut body).unwrap();
//! let shard = encode_shard("shard.00000.mds", b"{}", &[body.len() as u32], &body).unwrap();
//! let reader = ShardReader::new("shard.00000.mds", shard, columns, Some(1)).unwrap();
//! assert_eq!(reader.decode_sample(0).unwrap(), sample);
//! ```

use std::ops::Range;
use std::sync::Arc;

use crate::error::{FormatError, Result};
use crate::mds::encoding::Encoding;
use crate::mds::index::{ShardInfo, MAX_SHARD_BYTES};
use crate::value::Sample;

/// A shard's columns: names (sorted), their encodings and fixed sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Columns {
    names: Vec<String>,
    encoding_names: Vec<String>,
    encodings: Vec<Encoding>,
    sizes: Vec<Option<u64>>,
}

impl Columns {
    /// Builds the layout a writer uses from `(name, encoding)` pairs, sorted by name as Mosaic
    /// sorts them. Encodings are kept verbatim for the index (`jpegarray` stays `jpegarray`).
    pub fn new(spec: &[(String, String)]) -> Result<Columns> {
        let mut spec: Vec<&(String, String)> = spec.iter().collect();
        spec.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = spec.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(FormatError::InvalidArgument(format!(
                "column {:?} given twice",
                w[0].0
            )));
        }
        let mut columns = Columns {
            names: Vec::new(),
            encoding_names: Vec::new(),
            encodings: Vec::new(),
            sizes: Vec::new(),
        };
        for (name, enc) in spec {
            let parsed = Encoding::parse(enc)
                .map_err(|e| FormatError::InvalidArgument(format!("column {name:?}: {e}")))?;
            columns.sizes.push(parsed.fixed_size());
            columns.names.push(name.clone());
            columns.encoding_names.push(enc.clone());
            columns.encodings.push(parsed);
        }
        Ok(columns)
    }

    /// The layout of an index entry read from `path`; `pkl` columns are refused unless
    /// `allow_unsafe_types`.
    pub fn from_shard_info(
        path: &str,
        info: &ShardInfo,
        allow_unsafe_types: bool,
    ) -> Result<Columns> {
        let mut columns = Columns {
            names: info.column_names.clone(),
            encoding_names: info.column_encodings.clone(),
            encodings: Vec::with_capacity(info.column_names.len()),
            sizes: info.column_sizes.clone(),
        };
        if columns.encoding_names.len() != columns.names.len()
            || columns.sizes.len() != columns.names.len()
        {
            return Err(FormatError::invalid_index(
                path,
                "column lists differ in length",
            ));
        }
        for (name, enc) in columns.names.iter().zip(&columns.encoding_names) {
            let parsed = Encoding::parse(enc)
                .map_err(|e| FormatError::invalid_index(path, format!("column {name:?}: {e}")))?;
            if parsed.is_unsafe() && !allow_unsafe_types {
                return Err(FormatError::UnsafeEncoding {
                    path: path.to_string(),
                    column: name.clone(),
                    encoding: enc.clone(),
                });
            }
            columns.encodings.push(parsed);
        }
        Ok(columns)
    }

    /// Column names, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Encoding strings as written in the index.
    pub fn encoding_names(&self) -> &[String] {
        &self.encoding_names
    }

    /// Parsed encodings.
    pub fn encodings(&self) -> &[Encoding] {
        &self.encodings
    }

    /// Fixed sizes (`column_sizes`).
    pub fn sizes(&self) -> &[Option<u64>] {
        &self.sizes
    }

    /// Appends one encoded sample to `out` (`MDSWriter.encode_sample`). Keys of `sample` that are
    /// not columns are ignored; a missing column is an error.
    pub fn encode_sample(&self, sample: &Sample, out: &mut Vec<u8>) -> Result<()> {
        let start = out.len();
        let variable = self.sizes.iter().filter(|s| s.is_none()).count();
        out.resize(start + 4 * variable, 0);
        let mut slot = start;
        for ((name, enc), size) in self.names.iter().zip(&self.encodings).zip(&self.sizes) {
            let err = |reason: String| FormatError::Encode {
                column: name.clone(),
                encoding: enc.to_string(),
                reason,
            };
            let value = sample
                .get(name)
                .ok_or_else(|| err("missing from the sample".into()))?;
            let before = out.len();
            if let Err(reason) = enc.encode_into(value, out) {
                out.truncate(start);
                return Err(err(reason));
            }
            if size.is_none() {
                let len = out.len() - before;
                let Ok(len) = u32::try_from(len) else {
                    out.truncate(start);
                    return Err(err(format!("{len} bytes exceed the u32 size field")));
                };
                out[slot..slot + 4].copy_from_slice(&len.to_le_bytes());
                slot += 4;
            }
        }
        Ok(())
    }

    /// Splits one sample's bytes into its columns' bytes, without copying.
    pub fn split_sample<'a>(
        &self,
        path: &str,
        sample: u64,
        data: &'a [u8],
    ) -> Result<Vec<&'a [u8]>> {
        Ok(self
            .split_ranges(path, sample, data)?
            .into_iter()
            .map(|r| &data[r])
            .collect())
    }

    /// Where each column's bytes lie in one sample's bytes (`data`), in column order; checks
    /// that the columns fill `data` exactly. One allocation: a stream of small samples splits
    /// one per sample, and the per-sample vectors of sizes and slices it once built were a
    /// tenth of a 100-byte batch epoch's CPU.
    pub fn split_ranges(&self, path: &str, sample: u64, data: &[u8]) -> Result<Vec<Range<usize>>> {
        let corrupt =
            |reason: String| FormatError::corrupt(path, format!("sample {sample}: {reason}"));
        // Variable columns' u32 sizes come first, in column order.
        let variable = self.sizes.iter().filter(|s| s.is_none()).count();
        if data.len() < 4 * variable {
            let cut = self
                .names
                .iter()
                .zip(&self.sizes)
                .filter(|(_, s)| s.is_none())
                .nth(data.len() / 4)
                .map_or("", |(n, _)| n.as_str());
            return Err(corrupt(format!("size of column {cut:?} is cut off")));
        }
        let mut at = 4 * variable;
        let mut size_at = 0;
        let mut ranges = Vec::with_capacity(self.sizes.len());
        for (name, size) in self.names.iter().zip(&self.sizes) {
            let size = match size {
                Some(s) => *s,
                None => {
                    let head = data
                        .get(size_at..size_at + 4)
                        .and_then(|b| <[u8; 4]>::try_from(b).ok())
                        .ok_or_else(|| corrupt(format!("size of column {name:?} is cut off")))?;
                    size_at += 4;
                    u64::from(u32::from_le_bytes(head))
                }
            };
            let left = data.len().saturating_sub(at);
            if size > left as u64 {
                return Err(corrupt(format!(
                    "column {name:?} claims {size} bytes, only {left} left"
                )));
            }
            ranges.push(at..at + size as usize);
            at += size as usize;
        }
        if at < data.len() {
            return Err(corrupt(format!(
                "{} bytes left after the last column",
                data.len() - at
            )));
        }
        Ok(ranges)
    }

    /// Decodes one sample's bytes.
    pub fn decode_sample(&self, path: &str, sample: u64, data: &[u8]) -> Result<Sample> {
        let parts = self.split_sample(path, sample, data)?;
        let mut out = Sample::new();
        for ((name, enc), part) in self.names.iter().zip(&self.encodings).zip(parts) {
            let value = enc
                .decode_value(part)
                .map_err(|reason| FormatError::Decode {
                    path: path.to_string(),
                    sample,
                    column: name.clone(),
                    encoding: enc.to_string(),
                    reason,
                })?;
            out.insert(name.clone(), value);
        }
        Ok(out)
    }
}

/// Assembles a shard file (`MDSWriter.encode_joint_shard`) from the config JSON, each sample's
/// encoded size and the concatenated samples. Fails if the file would pass the 4 GiB limit;
/// `path` names the shard in that error.
pub fn encode_shard(
    path: &str,
    config: &[u8],
    sample_sizes: &[u32],
    body: &[u8],
) -> Result<Vec<u8>> {
    let n = sample_sizes.len() as u64;
    let header = 4 + 4 * (n + 1) + config.len() as u64;
    let total = header + body.len() as u64;
    let sum: u64 = sample_sizes.iter().map(|&s| u64::from(s)).sum();
    if sum != body.len() as u64 {
        return Err(FormatError::InvalidArgument(format!(
            "sample sizes add up to {sum}, body holds {}",
            body.len()
        )));
    }
    if total > MAX_SHARD_BYTES || n > u64::from(u32::MAX) {
        return Err(FormatError::ShardTooLarge {
            path: path.to_string(),
            size: total,
            limit: MAX_SHARD_BYTES,
        });
    }
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    let mut offset = header as u32;
    out.extend_from_slice(&offset.to_le_bytes());
    for &s in sample_sizes {
        offset += s;
        out.extend_from_slice(&offset.to_le_bytes());
    }
    out.extend_from_slice(config);
    out.extend_from_slice(body);
    Ok(out)
}

/// Bytes of a shard's header (sample count and offset table) for the count in its first 4 bytes:
/// what [`check_shard_header`] needs to see of a file read in pieces.
pub fn shard_header_len(first_four: [u8; 4]) -> u64 {
    4 + 4 * (u64::from(u32::from_le_bytes(first_four)) + 1)
}

/// Checks a shard's header against its size `len` and returns its sample count: the count
/// matches `expected_samples` when given, and the offsets rise monotonically from past the
/// offset table to exactly `len`. `head` is the start of the file, at least
/// [`shard_header_len`] bytes of it (or all of it when shorter); `path` names it in errors.
pub fn check_shard_header(
    path: &str,
    head: &[u8],
    len: u64,
    expected_samples: Option<u64>,
) -> Result<u32> {
    let corrupt = |reason: String| FormatError::corrupt(path, reason);
    let n =
        read_u32(head, 0).ok_or_else(|| corrupt(format!("{len} bytes, too short for a header")))?;
    if let Some(expected) = expected_samples {
        if expected != u64::from(n) {
            return Err(corrupt(format!(
                "header holds {n} samples, the index says {expected}"
            )));
        }
    }
    let table_end = 4 + 4 * (u64::from(n) + 1);
    if table_end > len || table_end > head.len() as u64 {
        return Err(FormatError::SizeMismatch {
            path: path.to_string(),
            expected: table_end,
            actual: len.min(head.len() as u64),
        });
    }
    let mut prev = table_end;
    for i in 0..=n as usize {
        let off = u64::from(read_u32(head, 4 + 4 * i).unwrap_or(0));
        if off < prev {
            return Err(corrupt(format!(
                "offset {i} ({off}) is below the previous one or inside the offset table ({prev})"
            )));
        }
        prev = off;
    }
    if prev != len {
        return Err(FormatError::SizeMismatch {
            path: path.to_string(),
            expected: prev,
            actual: len,
        });
    }
    Ok(n)
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Random access to the samples of one decompressed shard, checked once at open so that every
/// later access stays inside the buffer.
#[derive(Debug, Clone)]
pub struct ShardReader<B> {
    path: String,
    data: B,
    num_samples: u32,
    columns: Arc<Columns>,
}

impl<B: AsRef<[u8]>> ShardReader<B> {
    /// Opens a shard's bytes. `path` names the shard in errors; `expected_samples` is the index's
    /// count, checked against the header when given. The offsets must rise monotonically from
    /// past the offset table to exactly the end of the buffer.
    pub fn new(
        path: impl Into<String>,
        data: B,
        columns: Arc<Columns>,
        expected_samples: Option<u64>,
    ) -> Result<Self> {
        let path = path.into();
        let bytes = data.as_ref();
        let n = check_shard_header(&path, bytes, bytes.len() as u64, expected_samples)?;
        Ok(ShardReader {
            path,
            data,
            num_samples: n,
            columns,
        })
    }

    /// The shard's name, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The columns.
    pub fn columns(&self) -> &Arc<Columns> {
        &self.columns
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.num_samples as usize
    }

    /// Whether the shard holds no samples.
    pub fn is_empty(&self) -> bool {
        self.num_samples == 0
    }

    /// The whole buffer.
    pub fn data(&self) -> &B {
        &self.data
    }

    /// The encoded bytes of sample `i`, borrowed from the buffer.
    pub fn sample_bytes(&self, i: usize) -> Result<&[u8]> {
        let bytes = self.data.as_ref();
        if i >= self.len() {
            return Err(FormatError::corrupt(
                &self.path,
                format!("sample {i} out of range (shard holds {})", self.num_samples),
            ));
        }
        let begin = read_u32(bytes, 4 + 4 * i).unwrap_or(0) as usize;
        let end = read_u32(bytes, 8 + 4 * i).unwrap_or(0) as usize;
        bytes.get(begin..end).ok_or_else(|| {
            FormatError::corrupt(&self.path, format!("sample {i} lies outside the file"))
        })
    }

    /// The bytes of each column of sample `i`, borrowed from the buffer.
    pub fn sample_columns(&self, i: usize) -> Result<Vec<&[u8]>> {
        self.columns
            .split_sample(&self.path, i as u64, self.sample_bytes(i)?)
    }

    /// Decodes sample `i`.
    pub fn decode_sample(&self, i: usize) -> Result<Sample> {
        self.columns
            .decode_sample(&self.path, i as u64, self.sample_bytes(i)?)
    }

    /// Decodes every sample in order.
    pub fn iter(&self) -> impl Iterator<Item = Result<Sample>> + '_ {
        (0..self.len()).map(move |i| self.decode_sample(i))
    }
}
