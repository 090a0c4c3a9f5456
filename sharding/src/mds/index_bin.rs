//! `index.ssx`: a compact binary form of an MDS `index.json`, written beside it (which stays,
//! for Mosaic), so that a reader of a dataset of 10^6 shards fetches and parses a fraction of
//! the bytes and builds no JSON tree.
//!
//! # Layout (little-endian)
//!
//! ```text
//! 0   8  magic "SSXINDEX"
//! 8   4  layout version (1)
//! 12  4  header size (64)
//! 16  8  shards                     S
//! 24  8  schemas                    C
//! 32  8  string table size          T
//! 40  8  size of the index.json this mirrors
//! 48  8  xxh64 (seed 0) of that index.json
//! 56  8  zero
//! 64     C schema refs:   u32 offset, u32 length into the string table
//!        S shard records, 64 bytes each:
//!          u32 schema, u32 flags (bit 0: zip_data present),
//!          u64 samples, u64 raw bytes, u64 zip bytes,
//!          (u32 offset, u32 length) x 4: raw basename, raw hashes, zip basename, zip hashes
//!        T bytes of string table (UTF-8)
//! ```
//!
//! A *schema* is what shards share: the shard entry of `index.json` without `raw_data`,
//! `zip_data` and `samples`, stored once as JSON text. Hashes are `alg:hex` pairs joined by
//! `,`. The file's size must equal `64 + 8C + 64S + T` exactly (checked arithmetic: every
//! size in it is untrusted); every string reference must lie inside the table; the result is
//! validated as [`Index::from_json`] validates. Errors name the file.
//!
//! A reader trusts `index.ssx` only when it mirrors the `index.json` beside it: the size it
//! records equals that file's size (a HEAD) and it is not older; otherwise it reads
//! `index.json` ([`is_fresh`]). [`verify_against_json`] checks it byte for byte.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::error::{FormatError, Result};
use crate::mds::index::{FileInfo, Index, ShardInfo};

/// Name of the binary index beside `index.json`.
pub const BINARY_INDEX_BASENAME: &str = "index.ssx";
/// First bytes of the file.
pub const MAGIC: &[u8; 8] = b"SSXINDEX";
/// Layout version this code reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
const HEADER: usize = 64;
const RECORD: usize = 64;
const SCHEMA_REF: usize = 8;

/// What shards share (the shard entry without its files and sample count).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Schema {
    column_encodings: Vec<String>,
    column_names: Vec<String>,
    column_sizes: Vec<Option<u64>>,
    compression: Option<String>,
    format: String,
    hashes: Vec<String>,
    size_limit: Option<u64>,
    version: u64,
}

impl Schema {
    fn of(s: &ShardInfo) -> Self {
        Self {
            column_encodings: s.column_encodings.clone(),
            column_names: s.column_names.clone(),
            column_sizes: s.column_sizes.clone(),
            compression: s.compression.clone(),
            format: s.format.clone(),
            hashes: s.hashes.clone(),
            size_limit: s.size_limit,
            version: s.version,
        }
    }
}

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Shards.
    pub shards: u64,
    /// Size of the `index.json` it mirrors.
    pub json_bytes: u64,
    /// xxh64 of that `index.json`.
    pub json_xxh64: u64,
}

fn invalid(path: &str, reason: impl Into<String>) -> FormatError {
    FormatError::invalid_index(path, reason)
}

struct Strings {
    bytes: Vec<u8>,
}

impl Strings {
    /// Appends `s` (an empty string takes no room); schemas are shared by [`Builder`] and
    /// basenames are unique, so nothing else is worth looking up.
    fn add(&mut self, s: &str) -> Result<(u32, u32)> {
        if s.is_empty() {
            return Ok((0, 0));
        }
        let too_big =
            || FormatError::InvalidArgument("binary index string table over 4 GiB".into());
        let off = u32::try_from(self.bytes.len()).map_err(|_| too_big())?;
        let len = u32::try_from(s.len()).map_err(|_| too_big())?;
        off.checked_add(len).ok_or_else(too_big)?;
        self.bytes.extend_from_slice(s.as_bytes());
        Ok((off, len))
    }
}

fn hashes_text(h: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (i, (alg, hex)) in h.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(alg);
        out.push(':');
        out.push_str(hex);
    }
    out
}

/// Builds a binary index one shard at a time.
struct Builder {
    strings: Strings,
    schemas: Vec<(u32, u32)>,
    schema_ids: HashMap<Schema, u32>,
    records: Vec<u8>,
    shards: u64,
}

impl Builder {
    fn new(shards_hint: usize) -> Self {
        Self {
            strings: Strings { bytes: Vec::new() },
            schemas: Vec::new(),
            schema_ids: HashMap::new(),
            records: Vec::with_capacity(shards_hint.min(1 << 24).saturating_mul(RECORD)),
            shards: 0,
        }
    }

    fn add(&mut self, shard: &ShardInfo) -> Result<()> {
        let schema = Schema::of(shard);
        let id = match self.schema_ids.get(&schema) {
            Some(id) => *id,
            None => {
                let text = serde_json::to_string(&schema)
                    .map_err(|e| FormatError::InvalidArgument(e.to_string()))?;
                let id = u32::try_from(self.schemas.len())
                    .map_err(|_| FormatError::InvalidArgument("too many schemas".into()))?;
                self.schemas.push(self.strings.add(&text)?);
                self.schema_ids.insert(schema, id);
                id
            }
        };
        let flags: u32 = u32::from(shard.zip_data.is_some());
        let empty = FileInfo {
            basename: String::new(),
            bytes: 0,
            hashes: BTreeMap::new(),
        };
        let zip = shard.zip_data.as_ref().unwrap_or(&empty);
        let records = &mut self.records;
        records.extend_from_slice(&id.to_le_bytes());
        records.extend_from_slice(&flags.to_le_bytes());
        records.extend_from_slice(&shard.samples.to_le_bytes());
        records.extend_from_slice(&shard.raw_data.bytes.to_le_bytes());
        records.extend_from_slice(&zip.bytes.to_le_bytes());
        for text in [
            shard.raw_data.basename.as_str(),
            &hashes_text(&shard.raw_data.hashes),
            zip.basename.as_str(),
            &hashes_text(&zip.hashes),
        ] {
            let (off, len) = self.strings.add(text)?;
            records.extend_from_slice(&off.to_le_bytes());
            records.extend_from_slice(&len.to_le_bytes());
        }
        self.shards += 1;
        Ok(())
    }

    fn finish(self, json: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER
                + self.schemas.len() * SCHEMA_REF
                + self.records.len()
                + self.strings.bytes.len(),
        );
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        out.extend_from_slice(&(HEADER as u32).to_le_bytes());
        for n in [
            self.shards,
            self.schemas.len() as u64,
            self.strings.bytes.len() as u64,
            json.len() as u64,
            xxhash_rust::xxh64::xxh64(json, 0),
            0,
        ] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for (off, len) in self.schemas {
            out.extend_from_slice(&off.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out.extend_from_slice(&self.records);
        out.extend_from_slice(&self.strings.bytes);
        out
    }
}

/// The binary form of `index`, which was written as the bytes `json`.
pub fn to_bytes(index: &Index, json: &[u8]) -> Result<Vec<u8>> {
    let mut builder = Builder::new(index.shards.len());
    for shard in &index.shards {
        builder.add(shard)?;
    }
    Ok(builder.finish(json))
}

/// Reads `index.json` bytes (from `path`) straight into an [`IndexView`], one shard entry at a
/// time: no JSON tree and no [`Index`] (each shard is deserialised, checked, appended to the
/// binary form and dropped). Peak memory is the JSON bytes plus the binary form. An index this
/// refuses is refused by [`Index::from_json`] too; the error may read differently.
pub fn view_from_json(path: &str, json: &[u8]) -> Result<IndexView> {
    use serde::de::{
        DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
    };
    use std::fmt;

    struct Top<'a> {
        builder: &'a mut Builder,
        path: &'a str,
    }
    struct Shards<'a> {
        builder: &'a mut Builder,
        path: &'a str,
    }
    impl<'de> Visitor<'de> for Shards<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of shard entries")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
            let mut i = 0usize;
            while let Some(shard) = seq.next_element::<ShardInfo>()? {
                shard.validate(self.path, i).map_err(A::Error::custom)?;
                self.builder.add(&shard).map_err(A::Error::custom)?;
                i += 1;
            }
            Ok(())
        }
    }
    impl<'de> DeserializeSeed<'de> for Shards<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for Top<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an MDS index object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
            let (mut version, mut shards) = (None, false);
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "version" => version = Some(map.next_value::<u64>()?),
                    "shards" if !shards => {
                        map.next_value_seed(Shards {
                            builder: &mut *self.builder,
                            path: self.path,
                        })?;
                        shards = true;
                    }
                    "shards" => return Err(A::Error::custom("shards appears twice")),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            match (version, shards) {
                (Some(2), true) => Ok(()),
                (Some(v), _) if v != 2 => Err(A::Error::custom(format!(
                    "unsupported index version {v} (only 2)"
                ))),
                _ => Err(A::Error::custom("missing version or shards")),
            }
        }
    }

    let mut builder = Builder::new(0);
    let mut de = serde_json::Deserializer::from_slice(json);
    de.deserialize_map(Top {
        builder: &mut builder,
        path,
    })
    .and_then(|()| de.end())
    .map_err(|e| invalid(path, e.to_string()))?;
    IndexView::parse(path, builder.finish(json))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// Reads and checks the header of the binary index `bytes` read from `path`.
pub fn header(path: &str, bytes: &[u8]) -> Result<Header> {
    if bytes.len() < HEADER || bytes.get(..8) != Some(MAGIC.as_slice()) {
        return Err(invalid(path, "not a shardstream binary index (bad magic)"));
    }
    let version = u32_at(bytes, 8);
    if version != LAYOUT_VERSION || u32_at(bytes, 12) as usize != HEADER {
        return Err(invalid(
            path,
            format!("unsupported binary index layout {version}"),
        ));
    }
    let shards = u64_at(bytes, 16);
    let schemas = u64_at(bytes, 24);
    let strings = u64_at(bytes, 32);
    let expected = schemas
        .checked_mul(SCHEMA_REF as u64)
        .and_then(|s| shards.checked_mul(RECORD as u64)?.checked_add(s))
        .and_then(|n| n.checked_add(strings))
        .and_then(|n| n.checked_add(HEADER as u64));
    if expected != Some(bytes.len() as u64) {
        return Err(invalid(
            path,
            format!(
                "binary index of {} bytes does not hold the {shards} shards, {schemas} schemas \
                 and {strings} string bytes its header declares",
                bytes.len()
            ),
        ));
    }
    Ok(Header {
        shards,
        json_bytes: u64_at(bytes, 40),
        json_xxh64: u64_at(bytes, 48),
    })
}

/// Parses the binary index `bytes` read from `path` into the [`Index`] it mirrors, validated
/// as `index.json` is. Memory: the result plus one copy of each distinct schema.
pub fn from_bytes(path: &str, bytes: &[u8]) -> Result<Index> {
    let head = header(path, bytes)?;
    // `header` checked that these fit in the file, hence in usize.
    let shards = head.shards as usize;
    let schemas = u64_at(bytes, 24) as usize;
    let refs_at = HEADER;
    let records_at = refs_at + schemas * SCHEMA_REF;
    let strings_at = records_at + shards * RECORD;
    let table = bytes.get(strings_at..).unwrap_or_default();
    let text = |off: u32, len: u32, what: &str, shard: usize| -> Result<&str> {
        let start = off as usize;
        let end = start.checked_add(len as usize);
        end.and_then(|end| table.get(start..end))
            .and_then(|b| std::str::from_utf8(b).ok())
            .ok_or_else(|| {
                invalid(
                    path,
                    format!("shard {shard}: {what} lies outside the string table"),
                )
            })
    };
    let mut parsed = Vec::with_capacity(schemas.min(1 << 20));
    for i in 0..schemas {
        let at = refs_at + i * SCHEMA_REF;
        let json = text(u32_at(bytes, at), u32_at(bytes, at + 4), "a schema", 0)?;
        let schema: Schema =
            serde_json::from_str(json).map_err(|e| invalid(path, format!("schema {i}: {e}")))?;
        parsed.push(schema);
    }
    let hashes = |s: &str, shard: usize| parse_hashes(path, s, shard);
    let mut out = Vec::with_capacity(shards.min(1 << 24));
    for i in 0..shards {
        let at = records_at + i * RECORD;
        let schema = parsed
            .get(u32_at(bytes, at) as usize)
            .ok_or_else(|| invalid(path, format!("shard {i}: no such schema")))?
            .clone();
        let zipped = u32_at(bytes, at + 4) & 1 == 1;
        let string = |k: usize, what: &str| {
            text(
                u32_at(bytes, at + 32 + 8 * k),
                u32_at(bytes, at + 36 + 8 * k),
                what,
                i,
            )
        };
        let raw_data = FileInfo {
            basename: string(0, "raw basename")?.to_string(),
            bytes: u64_at(bytes, at + 16),
            hashes: hashes(string(1, "raw hashes")?, i)?,
        };
        let zip_data = if zipped {
            Some(FileInfo {
                basename: string(2, "zip basename")?.to_string(),
                bytes: u64_at(bytes, at + 24),
                hashes: hashes(string(3, "zip hashes")?, i)?,
            })
        } else {
            None
        };
        out.push(ShardInfo {
            column_encodings: schema.column_encodings,
            column_names: schema.column_names,
            column_sizes: schema.column_sizes,
            compression: schema.compression,
            format: schema.format,
            hashes: schema.hashes,
            raw_data,
            samples: u64_at(bytes, at + 8),
            size_limit: schema.size_limit,
            version: schema.version,
            zip_data,
        });
    }
    let index = Index {
        version: 2,
        shards: out,
    };
    index.validate(path)?;
    Ok(index)
}

/// A shard's hashes as the string table holds them (`alg:hex` pairs joined by `,`).
fn parse_hashes(path: &str, text: &str, shard: usize) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (alg, hex) = pair
            .split_once(':')
            .ok_or_else(|| invalid(path, format!("shard {shard}: bad hash entry {pair:?}")))?;
        out.insert(alg.to_string(), hex.to_string());
    }
    Ok(out)
}

/// One shard of an [`IndexView`], borrowed from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardRef<'a> {
    /// Samples in the shard.
    pub samples: u64,
    /// The uncompressed file's name (relative, checked) and size.
    pub raw: (&'a str, u64),
    /// The compressed file's name and size, when compressed.
    pub zip: Option<(&'a str, u64)>,
    /// Index of its schema in [`IndexView::schema`].
    pub schema: u32,
}

/// The binary index read in place: its bytes plus the distinct schemas, nothing per shard
/// (about 150 bytes a shard, against ~2 KiB a shard for a parsed [`Index`]). Every record is
/// checked when the view is made, so [`IndexView::shard`] cannot fail on a valid index.
#[derive(Debug)]
pub struct IndexView {
    bytes: Vec<u8>,
    shards: usize,
    records_at: usize,
    strings_at: usize,
    schemas: Vec<ShardInfo>,
}

impl IndexView {
    /// Checks `bytes` (read from `path`) as [`from_bytes`] does, keeping them as they are.
    pub fn parse(path: &str, bytes: Vec<u8>) -> Result<IndexView> {
        let head = header(path, &bytes)?;
        let shards = head.shards as usize;
        let schemas = u64_at(&bytes, 24) as usize;
        let records_at = HEADER + schemas * SCHEMA_REF;
        let strings_at = records_at + shards * RECORD;
        let mut parsed = Vec::with_capacity(schemas.min(1 << 20));
        let table = bytes.get(strings_at..).unwrap_or_default();
        for i in 0..schemas {
            let at = HEADER + i * SCHEMA_REF;
            let (off, len) = (u32_at(&bytes, at) as usize, u32_at(&bytes, at + 4) as usize);
            let text = off
                .checked_add(len)
                .and_then(|end| table.get(off..end))
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| {
                    invalid(path, format!("schema {i} lies outside the string table"))
                })?;
            let schema: Schema = serde_json::from_str(text)
                .map_err(|e| invalid(path, format!("schema {i}: {e}")))?;
            // A shard of this schema with files that pass, to check the schema once.
            let file = |name: &str| FileInfo {
                basename: name.into(),
                bytes: 8,
                hashes: BTreeMap::new(),
            };
            let zipped = schema.compression.is_some();
            let probe = ShardInfo {
                column_encodings: schema.column_encodings,
                column_names: schema.column_names,
                column_sizes: schema.column_sizes,
                compression: schema.compression,
                format: schema.format,
                hashes: schema.hashes,
                raw_data: file("a"),
                samples: 0,
                size_limit: schema.size_limit,
                version: schema.version,
                zip_data: zipped.then(|| file("b")),
            };
            probe.validate(path, 0)?;
            parsed.push(probe);
        }
        let view = IndexView {
            bytes,
            shards,
            records_at,
            strings_at,
            schemas: parsed,
        };
        let mut names: Vec<(&str, usize)> = Vec::with_capacity(shards.min(1 << 24));
        for i in 0..shards {
            let s = view.checked_shard(path, i)?;
            names.push((s.raw.0, i));
            if let Some((zip, _)) = s.zip {
                names.push((zip, i));
            }
        }
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(invalid(
                path,
                format!("shard {}: basename {:?} appears twice", w[1].1, w[1].0),
            ));
        }
        drop(names);
        Ok(view)
    }

    fn string(&self, at: usize) -> Option<&str> {
        let off = u32_at(&self.bytes, at) as usize;
        let len = u32_at(&self.bytes, at + 4) as usize;
        let start = self.strings_at.checked_add(off)?;
        self.bytes
            .get(start..start.checked_add(len)?)
            .and_then(|b| std::str::from_utf8(b).ok())
    }

    fn checked_shard(&self, path: &str, i: usize) -> Result<ShardRef<'_>> {
        let bad = |reason: String| invalid(path, format!("shard {i}: {reason}"));
        let at = self.records_at + i * RECORD;
        let schema = u32_at(&self.bytes, at);
        let info = self
            .schemas
            .get(schema as usize)
            .ok_or_else(|| bad(format!("no schema {schema}")))?;
        let zipped = u32_at(&self.bytes, at + 4) & 1 == 1;
        if zipped != info.zip_data.is_some() {
            return Err(bad(
                "zip_data present without a compression, or missing".into()
            ));
        }
        let samples = u64_at(&self.bytes, at + 8);
        let raw_bytes = u64_at(&self.bytes, at + 16);
        let zip_bytes = u64_at(&self.bytes, at + 24);
        let name = |k: usize, what: &str| {
            self.string(at + 32 + 16 * k)
                .ok_or_else(|| bad(format!("{what} lies outside the string table")))
                .and_then(|n| crate::safe_path::check_relative(path, n))
        };
        let raw = name(0, "raw basename")?;
        let header = samples
            .checked_add(1)
            .and_then(|n| n.checked_mul(4))
            .and_then(|n| n.checked_add(4));
        if header.is_none_or(|h| raw_bytes < h) || raw_bytes > crate::mds::MAX_SHARD_BYTES {
            return Err(bad(format!(
                "raw size {raw_bytes} cannot hold {samples} samples in an MDS shard"
            )));
        }
        let zip = if zipped {
            if zip_bytes > crate::mds::max_compressed_bytes(raw_bytes) {
                return Err(bad(format!(
                    "compressed size {zip_bytes} is larger than {raw_bytes} bytes compress to"
                )));
            }
            Some((name(1, "zip basename")?, zip_bytes))
        } else {
            None
        };
        Ok(ShardRef {
            samples,
            raw: (raw, raw_bytes),
            zip,
            schema,
        })
    }

    /// Shards in the index.
    pub fn len(&self) -> usize {
        self.shards
    }

    /// Whether it has no shard.
    pub fn is_empty(&self) -> bool {
        self.shards == 0
    }

    /// Shard `i` (`None` past the end).
    pub fn shard(&self, i: usize) -> Option<ShardRef<'_>> {
        if i >= self.shards {
            return None;
        }
        self.checked_shard("", i).ok()
    }

    /// Shard `i` as its `index.json` entry: its schema with its files (names, sizes, hashes)
    /// and sample count, validated as [`Index::from_json`] validates a shard. Built on each
    /// call, so that a reader holds one entry at a time instead of the whole [`Index`];
    /// `path` names the file in errors.
    pub fn shard_info(&self, path: &str, i: usize) -> Result<ShardInfo> {
        if i >= self.shards {
            return Err(invalid(path, format!("no shard {i} of {}", self.shards)));
        }
        let s = self.checked_shard(path, i)?;
        let schema = self
            .schemas
            .get(s.schema as usize)
            .ok_or_else(|| invalid(path, format!("shard {i}: no schema {}", s.schema)))?;
        let at = self.records_at + i * RECORD;
        let hashes = |k: usize, what: &str| {
            self.string(at + 40 + 16 * k)
                .ok_or_else(|| {
                    invalid(
                        path,
                        format!("shard {i}: {what} lies outside the string table"),
                    )
                })
                .and_then(|text| parse_hashes(path, text, i))
        };
        let raw_data = FileInfo {
            basename: s.raw.0.to_string(),
            bytes: s.raw.1,
            hashes: hashes(0, "raw hashes")?,
        };
        let zip_data = match s.zip {
            Some((name, bytes)) => Some(FileInfo {
                basename: name.to_string(),
                bytes,
                hashes: hashes(1, "zip hashes")?,
            }),
            None => None,
        };
        let info = ShardInfo {
            raw_data,
            zip_data,
            samples: s.samples,
            ..schema.clone()
        };
        info.validate(path, i)?;
        Ok(info)
    }

    /// The file's bytes, as the view reads them.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The file's bytes, owned (the view is dropped).
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Schema `i` as a shard entry without files (its columns, compression, hashes).
    pub fn schema(&self, i: u32) -> Option<&ShardInfo> {
        self.schemas.get(i as usize)
    }

    /// Total samples.
    pub fn num_samples(&self) -> u64 {
        (0..self.shards)
            .filter_map(|i| self.shard(i))
            .fold(0u64, |t, s| t.saturating_add(s.samples))
    }
}

/// Whether a binary index whose header is `head`, last modified at `bin_modified`, mirrors an
/// `index.json` of `json_bytes` bytes last modified at `json_modified` (times as the store
/// reports them; `None` when unknown).
pub fn is_fresh<T: PartialOrd>(
    head: &Header,
    bin_modified: Option<T>,
    json_bytes: u64,
    json_modified: Option<T>,
) -> bool {
    let not_older = match (bin_modified, json_modified) {
        (Some(b), Some(j)) => b >= j,
        _ => true,
    };
    head.json_bytes == json_bytes && not_older
}

/// Checks that the binary index `bin` mirrors the `index.json` bytes `json` exactly: the size
/// and hash it records, and the same [`Index`].
pub fn verify_against_json(path: &str, bin: &[u8], json: &[u8]) -> Result<()> {
    let head = header(path, bin)?;
    if head.json_bytes != json.len() as u64 || head.json_xxh64 != xxhash_rust::xxh64::xxh64(json, 0)
    {
        return Err(invalid(
            path,
            "stale: it does not mirror the index.json beside it",
        ));
    }
    let from_bin = from_bytes(path, bin)?;
    let from_json = Index::from_json(path, json)?;
    if from_bin != from_json {
        return Err(invalid(path, "differs from the index.json beside it"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(i: usize, zip: bool) -> ShardInfo {
        let mut h = BTreeMap::new();
        h.insert("xxh64".to_string(), format!("{i:016x}"));
        ShardInfo {
            column_encodings: vec!["bytes".into(), "int".into()],
            column_names: vec!["data".into(), "id".into()],
            column_sizes: vec![None, Some(8)],
            compression: zip.then(|| "zstd".to_string()),
            format: "mds".into(),
            hashes: vec!["xxh64".into()],
            raw_data: FileInfo {
                basename: format!("p{:02}/shard.{i:05}.mds", i % 4),
                bytes: 1000 + i as u64,
                hashes: h.clone(),
            },
            samples: 10,
            size_limit: Some(1 << 26),
            version: 2,
            zip_data: zip.then(|| FileInfo {
                basename: format!("p{:02}/shard.{i:05}.mds.zstd", i % 4),
                bytes: 500,
                hashes: h,
            }),
        }
    }

    fn index(n: usize) -> Index {
        Index {
            version: 2,
            shards: (0..n).map(|i| shard(i, i % 3 == 0)).collect(),
        }
    }

    #[test]
    fn round_trips_and_verifies_against_its_json() {
        let index = index(50);
        let json = index.to_json();
        let bin = to_bytes(&index, json.as_bytes()).unwrap();
        assert_eq!(from_bytes("index.ssx", &bin).unwrap(), index);
        verify_against_json("index.ssx", &bin, json.as_bytes()).unwrap();
        assert!(
            bin.len() < json.len() / 2,
            "{} vs {}",
            bin.len(),
            json.len()
        );
        let other = super::super::index::Index {
            version: 2,
            shards: index.shards[1..].to_vec(),
        };
        let err = verify_against_json("index.ssx", &bin, other.to_json().as_bytes()).unwrap_err();
        assert!(err.to_string().contains("index.ssx"), "{err}");
    }

    #[test]
    fn the_view_reads_what_the_index_holds_without_copying() {
        let index = index(20);
        let bin = to_bytes(&index, index.to_json().as_bytes()).unwrap();
        let view = IndexView::parse("index.ssx", bin.clone()).unwrap();
        assert_eq!(view.len(), 20);
        assert_eq!(view.num_samples(), index.num_samples());
        for (i, s) in index.shards.iter().enumerate() {
            let r = view.shard(i).unwrap();
            assert_eq!(r.raw, (s.raw_data.basename.as_str(), s.raw_data.bytes));
            assert_eq!(
                r.zip,
                s.zip_data.as_ref().map(|z| (z.basename.as_str(), z.bytes))
            );
            let schema = view.schema(r.schema).unwrap();
            assert_eq!(schema.compression, s.compression);
            assert_eq!(schema.column_names, s.column_names);
            // The whole entry, hashes included, as index.json has it.
            assert_eq!(&view.shard_info("index.ssx", i).unwrap(), s);
        }
        assert!(view.shard(20).is_none());
        let err = view.shard_info("ds/index.ssx", 20).unwrap_err();
        assert!(err.to_string().contains("ds/index.ssx"), "{err}");
        assert_eq!(view.into_bytes(), bin);
        // A basename that leaves the dataset folder is refused, naming the file.
        let evil = Index {
            version: 2,
            shards: vec![ShardInfo {
                raw_data: FileInfo {
                    basename: "../x.mds".into(),
                    ..index.shards[1].raw_data.clone()
                },
                ..index.shards[1].clone()
            }],
        };
        let bin = to_bytes(&evil, b"{}").unwrap();
        let err = IndexView::parse("ds/index.ssx", bin).unwrap_err();
        assert!(err.to_string().contains("ds/index.ssx"), "{err}");
    }

    #[test]
    fn index_json_reads_into_a_view_one_shard_at_a_time() {
        let index = index(30);
        let json = index.to_json();
        let view = view_from_json("index.json", json.as_bytes()).unwrap();
        let bin = to_bytes(&index, json.as_bytes()).unwrap();
        assert_eq!(view.bytes, bin);
        for bad in [
            r#"{"shards": [], "version": 3}"#,
            r#"{"shards": []}"#,
            r#"{"shards": [{}], "version": 2}"#,
            r#"{"shards": [], "version": 2} x"#,
        ] {
            let err = view_from_json("ds/index.json", bad.as_bytes()).unwrap_err();
            assert!(err.to_string().contains("ds/index.json"), "{err}");
            assert!(
                Index::from_json("ds/index.json", bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn lying_sizes_and_references_are_refused_naming_the_file() {
        let index = index(3);
        let bin = to_bytes(&index, index.to_json().as_bytes()).unwrap();
        // A shard count that overflows, one that does not match the length, a truncated file.
        for (at, value) in [(16usize, u64::MAX), (16, 4), (32, u64::MAX / 2)] {
            let mut bad = bin.clone();
            bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
            let err = from_bytes("ds/index.ssx", &bad).unwrap_err();
            assert!(err.to_string().contains("ds/index.ssx"), "{err}");
        }
        assert!(from_bytes("x", &bin[..bin.len() - 1]).is_err());
        assert!(from_bytes("x", b"{\"version\": 2}").is_err());
        // A basename reference past the string table.
        let mut bad = bin.clone();
        let at = HEADER + SCHEMA_REF * 2 + 32;
        bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(from_bytes("x", &bad).is_err());
    }

    #[test]
    fn freshness_needs_the_same_json_size_and_no_older_file() {
        let head = Header {
            shards: 1,
            json_bytes: 10,
            json_xxh64: 0,
        };
        assert!(is_fresh(&head, Some(5), 10, Some(5)));
        assert!(!is_fresh(&head, Some(4), 10, Some(5)));
        assert!(!is_fresh(&head, Some(5), 11, Some(5)));
        assert!(is_fresh::<u8>(&head, None, 10, None));
    }
}
