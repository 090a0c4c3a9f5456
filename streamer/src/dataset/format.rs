//! The formats a stream's shards may have, and the one place that says which a location holds.
//!
//! - **MDS**: an `index.json` with `"shards"` (and `"version"`), read by `index`.
//! - **WebDataset**: tar shards, plain or gzip-compressed (`.tar`, `.tar.gz`, `.tgz`), named
//!   by the URL's last component (`shard-{000000..000009}.tar`, brace-expanded as `webdataset`
//!   expands it, or one `x.tar`), or found in a folder that holds no `index.json` (its tars,
//!   top level, sorted). Samples are grouped as `webdataset` groups them
//!   (`shardstream_sharding::wds::locate_samples`).
//!
//! Sample counts: the order works on samples per shard, and a tar records none. Each tar is
//! scanned once at open (member headers; a `.tar.gz` is inflated on the way, data is skipped),
//! which gives its sample count and its inflated size. For a remote dataset the counts are kept
//! in the node's cache folder next to the index copies, keyed by the tar's URL and checked
//! against its stored size on the next open; a local dataset is scanned at each open.
//!
//! - **LitData**: an `index.json` with `"chunks"`. A chunk file has the MDS shard layout (u32
//!   count, u32 offsets, items), each PyTree item a u32 size per leaf then the leaves, so it is
//!   read as an MDS shard is; whole-file zstd chunks (`compression_level="chunk"`) are inflated
//!   into the cache as compressed MDS shards are, per-item zstd (`"sample"`) items are inflated
//!   when decoded. Framed (`"batch"`) chunks, token and other loaders, and encrypted datasets
//!   are refused with a message naming what (the CLI converts them to MDS).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use shardstream_sharding::litdata::{ItemDecoder, LitDataIndex};
use shardstream_sharding::mds::Columns;
use shardstream_sharding::wds::{braceexpand, locate_samples, LocatedSample};
use shardstream_storage::{Location, StorageError};
use tracing::{debug, info, warn};

use super::index::{load_index, read_index};
use crate::cache::{read_index_copy, save_index_copy};
use crate::error::{Result, StreamerError};
use shardstream_sharding::mds::Index;

/// The layout of one stream's shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardFormat {
    /// Mosaic's MDS: `index.json` and `.mds` shards.
    Mds,
    /// WebDataset tar shards.
    WebDataset,
    /// LitData `optimize()` output: `index.json` with `"chunks"` and `chunk-*.bin` files.
    LitData,
}

/// What a sample's fields are: its shard's MDS columns, or a tar sample's member extensions.
#[derive(Debug, Clone)]
pub enum SampleSchema {
    /// MDS columns (names and encodings, as the stream's index declares them).
    Mds(Arc<Columns>),
    /// The extensions of a WebDataset sample's members, in archive order.
    Wds(Arc<WdsFields>),
    /// A LitData item's leaves and their serializers.
    LitData(Arc<LitFields>),
}

impl SampleSchema {
    /// The field names, in the order of the sample's columns.
    pub fn names(&self) -> &[String] {
        match self {
            SampleSchema::Mds(c) => c.names(),
            SampleSchema::Wds(f) => &f.names,
            SampleSchema::LitData(f) => &f.decoder.columns,
        }
    }
}

/// The fields of a WebDataset sample and the tar it comes from.
#[derive(Debug, PartialEq, Eq)]
pub struct WdsFields {
    /// Member extensions, lowercased, in archive order (`jpg`, `seg.png`, `txt.gz`).
    pub names: Vec<String>,
    /// The tar's URL (or path when local): `webdataset`'s `__url__`.
    pub url: Arc<str>,
}

/// The leaves of a LitData stream's items and how they decode.
#[derive(Debug, PartialEq)]
pub struct LitFields {
    /// The leaves' names and serializers (`shardstream_sharding::litdata::ItemDecoder`).
    pub decoder: ItemDecoder,
}

impl LitFields {
    /// The byte ranges of an item's leaves (relative to `item`): after a u32 size per leaf; the
    /// whole item as one range when items are zstd frames (the leaves are inside).
    pub(crate) fn split(&self, name: &str, i: u64, item: &[u8]) -> Result<Vec<Range<usize>>> {
        if self.decoder.per_item_zstd {
            return Ok(std::iter::once(0..item.len()).collect());
        }
        let n = self.decoder.formats.len();
        let bad = |reason: String| corrupt(name, format!("item {i}: {reason}"));
        let mut pos = n
            .checked_mul(4)
            .filter(|h| *h <= item.len())
            .ok_or_else(|| bad(format!("{} bytes cannot hold {n} leaf sizes", item.len())))?;
        let mut out = Vec::with_capacity(n);
        for leaf in 0..n {
            let at = 4 * leaf;
            let size = u32::from_le_bytes([item[at], item[at + 1], item[at + 2], item[at + 3]]);
            let end = pos
                .checked_add(size as usize)
                .filter(|e| *e <= item.len())
                .ok_or_else(|| {
                    bad(format!(
                        "leaf {leaf} runs past the item's {} bytes",
                        item.len()
                    ))
                })?;
            out.push(pos..end);
            pos = end;
        }
        if pos != item.len() {
            return Err(bad(format!(
                "{} bytes after the last leaf",
                item.len() - pos
            )));
        }
        Ok(out)
    }
}

/// How a shard's samples are found in its file.
#[derive(Debug, Clone)]
pub(crate) enum ShardSchema {
    /// The MDS header and offset table, and the columns of each sample.
    Mds(Arc<Columns>),
    /// A tar, located when the shard is opened.
    Wds,
    /// A LitData chunk: the MDS header and offset table, then items of leaves.
    LitData(Arc<LitFields>),
}

/// A URL split into the location to open and, for a WebDataset spec, the tars under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SplitUrl {
    pub root: String,
    pub tars: Option<Vec<String>>,
}

/// Whether `name` is a tar shard's name.
pub(crate) fn is_tar_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".tar") || lower.ends_with(".tar.gz") || lower.ends_with(".tgz")
}

/// Splits a dataset URL whose last component names tars (`x.tar`, `s-{0..9}.tar`) into its
/// folder and the tar names; any other URL is a root as it is.
pub(crate) fn split_url(url: &str) -> Result<SplitUrl> {
    let trimmed = url.trim_end_matches('/');
    let (dir, last) = match trimmed.rfind('/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (".", trimmed),
    };
    let is_spec = is_tar_name(last) || (last.contains('{') && last.contains('}'));
    if !is_spec || last.is_empty() {
        return Ok(SplitUrl {
            root: url.to_string(),
            tars: None,
        });
    }
    let names = braceexpand(last).map_err(|e| StreamerError::InvalidConfig {
        setting: "remote",
        reason: format!("{url}: {e}"),
    })?;
    if let Some(bad) = names.iter().find(|n| !is_tar_name(n)) {
        return Err(StreamerError::InvalidConfig {
            setting: "remote",
            reason: format!("{url}: {bad:?} is not a tar name (.tar, .tar.gz or .tgz)"),
        });
    }
    let root = if dir.is_empty() { "/" } else { dir };
    Ok(SplitUrl {
        root: root.to_string(),
        tars: Some(names),
    })
}

/// One tar of a WebDataset stream, counted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct TarShard {
    /// Its name relative to the stream's location.
    pub rel: String,
    /// Bytes stored (compressed when `gzip`).
    pub stored: u64,
    /// Bytes of the tar itself (inflated).
    pub raw: u64,
    pub samples: u64,
    pub gzip: bool,
}

/// A stream's shards as its location holds them.
pub(crate) enum Opened {
    /// An MDS index: its bytes, parsed, and whether it came from the store.
    Mds(Vec<u8>, Index, bool),
    /// WebDataset tars, counted.
    Wds(Vec<TarShard>),
    /// A LitData index: its bytes and the items' decoder.
    LitData(Vec<u8>, Box<LitDataIndex>, Arc<LitFields>),
}

/// Opens a stream: `tars` named by its URL make it WebDataset; else `index.json` makes it MDS
/// (one with `"chunks"` is LitData, refused with a message naming it), and without one the
/// folder's tars (top level, sorted) make it WebDataset. `forced` overrides the guess.
/// `copies` is the node folder keeping copies of remote indexes and tar counts.
pub(crate) fn open_stream(
    location: &Location,
    tars: Option<Vec<String>>,
    forced: Option<ShardFormat>,
    copies: Option<&Path>,
    allow_unsafe_types: bool,
) -> Result<Opened> {
    let names = match (tars, forced) {
        (Some(names), _) => names,
        (None, Some(ShardFormat::WebDataset)) => list_tars(location)?,
        (None, Some(ShardFormat::LitData)) => {
            let json = read_index(location)?;
            return open_litdata(location, json, allow_unsafe_types);
        }
        (None, forced) => match load_index(location, copies) {
            Ok((json, index, from_store)) => return Ok(Opened::Mds(json, index, from_store)),
            Err(StreamerError::NotFound { what }) if forced.is_none() => {
                let names = list_tars(location)?;
                if names.is_empty() {
                    return Err(StreamerError::NotFound {
                        what: format!("{what} (nor .tar shards next to it)"),
                    });
                }
                names
            }
            Err(e) if forced.is_none() => {
                // Not an MDS index: a LitData one, or the MDS error.
                let Ok(json) = read_index(location) else {
                    return Err(e);
                };
                let litdata = serde_json::from_slice::<serde_json::Value>(&json)
                    .is_ok_and(|v| v.get("chunks").is_some() && v.get("shards").is_none());
                if !litdata {
                    return Err(e);
                }
                return open_litdata(location, json, allow_unsafe_types);
            }
            Err(e) => return Err(e),
        },
    };
    if names.is_empty() {
        return Err(StreamerError::NotFound {
            what: format!("{} (no .tar shards)", location.url()),
        });
    }
    Ok(Opened::Wds(count_tars(location, &names, copies)?))
}

/// A LitData index, checked for what the engine reads: PyTree items in classic chunks, plain,
/// zstd-compressed whole (`compression_level="chunk"`) or item by item (`"sample"`).
fn open_litdata(location: &Location, json: Vec<u8>, allow_unsafe_types: bool) -> Result<Opened> {
    let name = location.url_of("index.json");
    let index = LitDataIndex::parse(&name, &json)?;
    let refuse = |what: String| {
        StreamerError::Format(shardstream_sharding::FormatError::Unsupported {
            path: name.clone(),
            what,
        })
    };
    if index.encryption.is_some() {
        return Err(refuse(
            "encrypted LitData datasets; decrypt with litdata first".into(),
        ));
    }
    if let Some(f) = &index.foreign_format {
        return Err(refuse(format!(
            "a LitData index over another format ({f:?})"
        )));
    }
    let decoder = ItemDecoder::for_index(&index, allow_unsafe_types).ok_or_else(|| {
        refuse(format!(
            "streaming LitData items of the {:?} item loader with compression {:?} at level \
             {:?}; `shardstream convert` turns the dataset into MDS",
            index.item_loader, index.compression, index.compression_level
        ))
    })?;
    Ok(Opened::LitData(
        json,
        Box::new(index),
        Arc::new(LitFields { decoder }),
    ))
}

/// The stored size of `rel`: its file's, or the object's (one HEAD).
pub(crate) fn stored_size(location: &Location, rel: &str) -> Result<u64> {
    if let Some(path) = location.local_path(rel)? {
        return std::fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|source| match source.kind() {
                io::ErrorKind::NotFound => StreamerError::NotFound {
                    what: path.display().to_string(),
                },
                _ => StreamerError::Io {
                    op: "stat",
                    path,
                    source,
                },
            });
    }
    runtime()?
        .block_on(location.head(rel))
        .map(|o| o.size)
        .map_err(|e| match e {
            StorageError::NotFound { url } => StreamerError::NotFound { what: url },
            e => e.into(),
        })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    // A runtime of this thread only, dropped before `open` returns: no thread outlives it.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StreamerError::Engine(format!("cannot start a runtime: {e}")))
}

/// The tars at the top level of `location`, sorted by name.
fn list_tars(location: &Location) -> Result<Vec<String>> {
    if let Some(root) = location.local_root() {
        let entries = std::fs::read_dir(root).map_err(|source| StreamerError::Io {
            op: "list",
            path: root.to_path_buf(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_tar_name(&name) && entry.path().is_file() {
                names.push(name);
            }
        }
        names.sort();
        return Ok(names);
    }
    let objects = runtime()?.block_on(location.list(""))?;
    Ok(objects
        .into_iter()
        .map(|o| o.key)
        .filter(|k| !k.contains('/') && is_tar_name(k))
        .collect())
}

/// Counts the samples of each tar (see the module doc); `copies` is the node folder keeping
/// the counts of a remote stream.
pub(crate) fn count_tars(
    location: &Location,
    names: &[String],
    copies: Option<&Path>,
) -> Result<Vec<TarShard>> {
    let mut out = Vec::with_capacity(names.len());
    let mut rt = None;
    for rel in names {
        let url = location.url_of(rel);
        let shard = match location.local_path(rel)? {
            Some(path) => {
                let file = File::open(&path).map_err(|source| match source.kind() {
                    io::ErrorKind::NotFound => StreamerError::NotFound {
                        what: path.display().to_string(),
                    },
                    _ => StreamerError::Io {
                        op: "open",
                        path: path.clone(),
                        source,
                    },
                })?;
                let stored = file
                    .metadata()
                    .map_err(|source| StreamerError::Io {
                        op: "stat",
                        path: path.clone(),
                        source,
                    })?
                    .len();
                count_one(rel, &url, stored, file)?
            }
            None => {
                let rt = match &mut rt {
                    Some(rt) => rt,
                    None => rt.insert(runtime()?),
                };
                let stored = rt.block_on(location.head(rel)).map_err(|e| match e {
                    StorageError::NotFound { url } => StreamerError::NotFound { what: url },
                    e => e.into(),
                })?;
                let key = format!("{url}#wds-count");
                let kept = copies.and_then(|dir| match read_index_copy(dir, &key) {
                    Ok(Some(json)) => serde_json::from_slice::<TarShard>(&json).ok(),
                    Ok(None) => None,
                    Err(e) => {
                        warn!(tar = %url, error = %e, "cannot read the kept sample count");
                        None
                    }
                });
                match kept {
                    Some(k) if k.stored == stored.size && k.rel == *rel => {
                        debug!(tar = %url, samples = k.samples, "sample count from the node folder");
                        k
                    }
                    _ => {
                        info!(tar = %url, bytes = stored.size, "counting the samples of a tar (once per node)");
                        let reader = RangeReader {
                            location,
                            rt,
                            rel,
                            pos: 0,
                            size: stored.size,
                            buf: bytes::Bytes::new(),
                        };
                        let counted = count_one(rel, &url, stored.size, reader)?;
                        if let Some(dir) = copies {
                            match serde_json::to_vec(&counted) {
                                Ok(json) => {
                                    if let Err(e) = save_index_copy(dir, &key, &json) {
                                        warn!(tar = %url, error = %e, "cannot keep the sample count");
                                    }
                                }
                                Err(e) => {
                                    warn!(tar = %url, error = %e, "cannot keep the sample count")
                                }
                            }
                        }
                        counted
                    }
                }
            }
        };
        out.push(shard);
    }
    Ok(out)
}

/// Scans one stored tar (gzip sniffed from its first bytes).
fn count_one(rel: &str, url: &str, stored: u64, reader: impl Read) -> Result<TarShard> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let gzip = {
        use std::io::BufRead;
        let head = reader
            .fill_buf()
            .map_err(|e| corrupt(url, format!("read error: {e}")))?;
        head.starts_with(&[0x1f, 0x8b])
    };
    let (samples, raw) = if gzip {
        locate_all(url, MultiGzDecoder::new(reader))?
    } else {
        locate_all(url, reader)?
    };
    Ok(TarShard {
        rel: rel.to_string(),
        stored,
        raw,
        samples: samples.len() as u64,
        gzip,
    })
}

/// Locates the samples of a whole tar stream; returns them and the stream's length.
pub(crate) fn locate_all(url: &str, reader: impl Read) -> Result<(Vec<LocatedSample>, u64)> {
    let mut counted = Counted {
        inner: reader,
        pos: 0,
    };
    let samples = locate_samples(&mut counted, url)?;
    io::copy(&mut counted, &mut io::sink())
        .map_err(|e| corrupt(url, format!("read error: {e}")))?;
    Ok((samples, counted.pos))
}

fn corrupt(url: &str, reason: String) -> StreamerError {
    StreamerError::Corrupt {
        what: url.to_string(),
        reason,
    }
}

struct Counted<R> {
    inner: R,
    pos: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Bytes fetched per request when a remote tar is scanned.
const SCAN_RANGE: u64 = 8 << 20;

/// A remote object read front to back in ranges of [`SCAN_RANGE`] (one in memory at a time).
struct RangeReader<'a> {
    location: &'a Location,
    rt: &'a tokio::runtime::Runtime,
    rel: &'a str,
    pos: u64,
    size: u64,
    buf: bytes::Bytes,
}

impl Read for RangeReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.buf.is_empty() {
            if self.pos >= self.size {
                return Ok(0);
            }
            let end = self.pos.saturating_add(SCAN_RANGE).min(self.size);
            let got = self
                .rt
                .block_on(self.location.get_range(self.rel, self.pos..end))
                .map_err(io::Error::other)?;
            if got.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the object ends before its listed size",
                ));
            }
            self.pos += got.len() as u64;
            self.buf = got;
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        let _ = self.buf.split_to(n);
        Ok(n)
    }
}

/// A tar's samples as a shard handle reads them: each sample's field ranges, its key and its
/// fields' names (shared by the samples that have the same ones).
#[derive(Debug)]
pub(crate) struct WdsTable {
    /// `fields[starts[i]..starts[i + 1]]` are sample `i`'s fields.
    starts: Vec<u32>,
    fields: Vec<Range<u64>>,
    keys: Vec<Arc<str>>,
    schema_of: Vec<u32>,
    schemas: Vec<SampleSchema>,
}

impl WdsTable {
    /// The table of a located tar; `url` is its `__url__`. Errors past `len` bytes.
    pub(crate) fn new(url: &Arc<str>, samples: Vec<LocatedSample>, len: u64) -> Result<WdsTable> {
        let mut table = WdsTable {
            starts: Vec::with_capacity(samples.len() + 1),
            fields: Vec::new(),
            keys: Vec::with_capacity(samples.len()),
            schema_of: Vec::with_capacity(samples.len()),
            schemas: Vec::new(),
        };
        table.starts.push(0);
        for s in samples {
            let names: Vec<String> = s.fields.iter().map(|(e, _)| e.clone()).collect();
            let at = match table
                .schemas
                .iter()
                .position(|k| k.names() == names.as_slice())
            {
                Some(at) => at,
                None => {
                    table.schemas.push(SampleSchema::Wds(Arc::new(WdsFields {
                        names,
                        url: Arc::clone(url),
                    })));
                    table.schemas.len() - 1
                }
            };
            for (_, r) in s.fields {
                if r.end > len || r.start > r.end {
                    return Err(corrupt(
                        url,
                        format!("a member lies past the end ({len} bytes)"),
                    ));
                }
                table.fields.push(r);
            }
            let n = u32::try_from(table.fields.len())
                .map_err(|_| corrupt(url, "more than 2^32 members".into()))?;
            table.starts.push(n);
            table.keys.push(Arc::from(s.key));
            table.schema_of.push(at as u32);
        }
        Ok(table)
    }

    pub(crate) fn len(&self) -> u64 {
        self.keys.len() as u64
    }

    /// The fields of sample `i` (absolute ranges in the tar).
    pub(crate) fn fields(&self, i: usize) -> &[Range<u64>] {
        let (a, b) = (self.starts[i] as usize, self.starts[i + 1] as usize);
        &self.fields[a..b]
    }

    /// The bytes sample `i` spans: its first member's data to its last one's end.
    pub(crate) fn span(&self, i: usize) -> Range<u64> {
        let f = self.fields(i);
        match (f.first(), f.last()) {
            (Some(a), Some(b)) => a.start..b.end,
            _ => 0..0,
        }
    }

    pub(crate) fn key(&self, i: usize) -> &Arc<str> {
        &self.keys[i]
    }

    pub(crate) fn schema(&self, i: usize) -> &SampleSchema {
        &self.schemas[self.schema_of[i] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_specs_split_at_their_folder() {
        let s = split_url("s3://b/wds/shard-{000000..000002}.tar").unwrap();
        assert_eq!(s.root, "s3://b/wds");
        assert_eq!(
            s.tars.unwrap(),
            ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
        );
        let s = split_url("/data/x.tar.gz").unwrap();
        assert_eq!(
            (s.root.as_str(), s.tars.unwrap()),
            ("/data", vec!["x.tar.gz".to_string()])
        );
        assert_eq!(split_url("s3://b/mds").unwrap().tars, None);
        assert_eq!(split_url("/data/mds/").unwrap().tars, None);
        assert!(split_url("/d/x-{0..2}.bin").is_err());
    }
}
