//! The formats a stream's shards may have, and the one place that says which a location holds.
//!
//! - **MDS**: an `index.json` with `"shards"` (and `"version"`), read by `index`.
//! - **WebDataset**: tar shards, plain or gzip-compressed (`.tar`, `.tar.gz`, `.tgz`), named
//!   by the URL's last component (`shard-{000000..000009}.tar`, brace-expanded as `webdataset`
//!   expands it, or one `x.tar`), or found in a folder that holds no `index.json` (its tars,
//!   top level, sorted). Samples are grouped as `webdataset` groups them
//!   (`shardstream_sharding::wds::locate_samples`); see `tars`.
//! - **LitData**: an `index.json` with `"chunks"`. A chunk file has the MDS shard layout (u32
//!   count, u32 offsets, items), each PyTree item a u32 size per leaf then the leaves, so it is
//!   read as an MDS shard is; whole-file zstd chunks (`compression_level="chunk"`) are inflated
//!   into the cache as compressed MDS shards are, per-item zstd (`"sample"`) items are inflated
//!   when decoded. Framed chunks (`"batch"`, litdata's default for zstd) are turned into the
//!   classic layout in the cache by the decompression step
//!   (`shardstream_sharding::litdata::framed`); the index records only their framed size, so
//!   the classic size is read from each chunk's header at open ([`framed_classic_size`]). Token
//!   and other loaders, and encrypted datasets, are refused with a message naming what (the
//!   CLI converts them to MDS).
//!
//! WebDataset sample counts: the order works on samples per shard, and a tar records none.
//! Each tar is scanned once at open (member headers; a `.tar.gz` is inflated on the way, data
//! is skipped), which gives its sample count and its inflated size. For a remote dataset the
//! counts are kept in the node's cache folder next to the index copies, keyed by the tar's URL
//! and checked against its stored size on the next open; a local dataset is scanned at each
//! open.

mod tars;

use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use shardstream_sharding::litdata::framed::{self, FramedPrefix, PREFIX_BYTES};
use shardstream_sharding::litdata::{ItemDecoder, LitDataIndex};
use shardstream_sharding::mds::Columns;
use shardstream_storage::{Location, StorageError};

use super::index::{load_index, read_index};
use crate::error::{Result, StreamerError};
use tars::{count_tars, list_tars};
pub(crate) use tars::{locate_all, split_url, TarShard, WdsTable};

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

/// A stream's shards as its location holds them.
pub(crate) enum Opened {
    /// An MDS index: the bytes of its file (`index.json` or `index.ssx`), parsed, and whether
    /// it came from the store.
    Mds(super::index::MdsIndex, bool),
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
            Ok((index, from_store)) => return Ok(Opened::Mds(index, from_store)),
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
/// zstd-compressed whole (`compression_level="chunk"`), item by item (`"sample"`) or in framed
/// batches of items (`"batch"`).
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
            "streaming LitData items of the {:?} item loader; `shardstream convert` turns the \
             dataset into MDS",
            index.item_loader
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

/// Bytes read from the start of a LitData chunk to size it: the prefix and, for up to about a
/// thousand items, the last offset too (one read).
const FRAMED_HEAD: u64 = 4096;

/// The classic size of LitData chunk `rel` (`stored` bytes, `items` items, `name` in messages)
/// when it is a framed zstd chunk; `None` when it is not (litdata leaves some chunks of a
/// `"batch"` dataset unframed). Framed chunks record only their framed size in the index, and
/// the cache must know the inflated size before it reserves room for it: the prefix and the
/// last relative offset give it exactly (`4 + 4(n+1) + offsets[n]`), at one read of the first
/// bytes (two past about a thousand items), a ranged GET each when remote.
pub(crate) fn framed_classic_size(
    location: &Location,
    rel: &str,
    name: &str,
    stored: u64,
    items: u64,
) -> Result<Option<u64>> {
    let head = read_range(location, rel, 0..stored.min(FRAMED_HEAD))?;
    if !framed::is_framed(&head) {
        return Ok(None);
    }
    if (head.len() as u64) < PREFIX_BYTES {
        return Err(corrupt(name, "framed zstd header truncated".into()));
    }
    let prefix = FramedPrefix::parse(name, &head)?;
    let at = prefix.last_offset_at();
    let end = at + 4;
    if end > stored {
        return Err(corrupt(
            name,
            format!("framed zstd offsets end at byte {end}, past the file's {stored}"),
        ));
    }
    let last = match usize::try_from(at).ok().and_then(|a| head.get(a..a + 4)) {
        Some(b) => b.to_vec(),
        None => read_range(location, rel, at..end)?,
    };
    let last = match last.as_slice() {
        [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
        _ => return Err(corrupt(name, "framed zstd offsets end early".into())),
    };
    Ok(Some(framed::classic_size(
        name, &head, last, stored, items,
    )?))
}

/// Bytes `range` of `rel`: a read of the local file, or a ranged GET.
fn read_range(location: &Location, rel: &str, range: Range<u64>) -> Result<Vec<u8>> {
    if let Some(path) = location.local_path(rel)? {
        use std::os::unix::fs::FileExt;
        let io_error = |op, source| StreamerError::Io {
            op,
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(&path).map_err(|e| io_error("open", e))?;
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        file.read_exact_at(&mut buf, range.start)
            .map_err(|e| io_error("read", e))?;
        return Ok(buf);
    }
    runtime()?
        .block_on(location.get_range(rel, range))
        .map(|b| b.to_vec())
        .map_err(|e| match e {
            StorageError::NotFound { url } => StreamerError::NotFound { what: url },
            e => e.into(),
        })
}

fn corrupt(url: &str, reason: String) -> StreamerError {
    StreamerError::Corrupt {
        what: url.to_string(),
        reason,
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    // A runtime of this thread only, dropped before `open` returns: no thread outlives it.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StreamerError::Engine(format!("cannot start a runtime: {e}")))
}
