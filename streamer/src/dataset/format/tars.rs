//! WebDataset tars: how a URL names them, how a folder lists them, how each is counted once at
//! open (its member headers; a `.tar.gz` inflated on the way; a remote one read in ranges and
//! its count kept in the node folder), and the table a shard handle reads samples from.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use flate2::read::MultiGzDecoder;
use shardstream_sharding::wds::{braceexpand, locate_samples, CountingReader, LocatedSample};
use shardstream_storage::{Location, StorageError};
use tracing::{debug, info, warn};

use super::{corrupt, runtime, SampleSchema, WdsFields};
use crate::cache::{read_index_copy, save_index_copy};
use crate::error::{Result, StreamerError};

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

/// The tars at the top level of `location`, sorted by name.
pub(super) fn list_tars(location: &Location) -> Result<Vec<String>> {
    if let Some(root) = location.local_root() {
        let entries = match std::fs::read_dir(root) {
            Ok(entries) => entries,
            // No folder, no tars: the caller names the dataset as not found.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StreamerError::Io {
                    op: "list",
                    path: root.to_path_buf(),
                    source,
                })
            }
        };
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
        let shard = match location.local_path(rel)? {
            Some(path) => count_local(rel, &path)?,
            None => {
                let rt = match &mut rt {
                    Some(rt) => rt,
                    None => rt.insert(runtime()?),
                };
                count_remote(location, rt, rel, copies)?
            }
        };
        out.push(shard);
    }
    Ok(out)
}

fn count_local(rel: &str, path: &Path) -> Result<TarShard> {
    let io_error = |op, source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => StreamerError::NotFound {
            what: path.display().to_string(),
        },
        _ => StreamerError::Io {
            op,
            path: path.to_path_buf(),
            source,
        },
    };
    let file = File::open(path).map_err(|e| io_error("open", e))?;
    let stored = file.metadata().map_err(|e| io_error("stat", e))?.len();
    count_one(rel, &path.display().to_string(), stored, file)
}

/// A remote tar's count: the node folder's copy when its stored size still matches (one
/// HEAD), else a scan read in ranges, kept for the next opens.
fn count_remote(
    location: &Location,
    rt: &tokio::runtime::Runtime,
    rel: &str,
    copies: Option<&Path>,
) -> Result<TarShard> {
    let url = location.url_of(rel);
    let size = rt
        .block_on(location.head(rel))
        .map_err(|e| match e {
            StorageError::NotFound { url } => StreamerError::NotFound { what: url },
            e => e.into(),
        })?
        .size;
    let key = format!("{url}#wds-count");
    let kept = copies.and_then(|dir| match read_index_copy(dir, &key) {
        Ok(Some(json)) => serde_json::from_slice::<TarShard>(&json).ok(),
        Ok(None) => None,
        Err(e) => {
            warn!(tar = %url, error = %e, "cannot read the kept sample count");
            None
        }
    });
    if let Some(k) = kept.filter(|k| k.stored == size && k.rel == rel) {
        debug!(tar = %url, samples = k.samples, "sample count from the node folder");
        return Ok(k);
    }
    info!(tar = %url, bytes = size, "counting the samples of a tar (once per node)");
    let reader = RangeReader {
        location,
        rt,
        rel,
        pos: 0,
        size,
        buf: bytes::Bytes::new(),
    };
    let counted = count_one(rel, &url, size, reader)?;
    if let Some(dir) = copies {
        let saved = serde_json::to_vec(&counted)
            .map_err(|e| e.to_string())
            .and_then(|json| save_index_copy(dir, &key, &json).map_err(|e| e.to_string()));
        if let Err(e) = saved {
            warn!(tar = %url, error = %e, "cannot keep the sample count; counted again next open");
        }
    }
    Ok(counted)
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
    let mut counted = CountingReader::new(reader);
    let samples = locate_samples(&mut counted, url)?;
    io::copy(&mut counted, &mut io::sink())
        .map_err(|e| corrupt(url, format!("read error: {e}")))?;
    Ok((samples, counted.position()))
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
