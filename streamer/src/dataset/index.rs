//! Reading the streams' MDS indexes: from the node folder's copy or the store (under the size
//! cap), checked, and turned into the shard list the engine fetches from.
//!
//! `index.ssx` (`shardstream_sharding::mds::index_bin`), when a stream has one that mirrors the
//! `index.json` beside it, is read instead of `index.json`: a fraction of the bytes, parsed
//! without a JSON tree. `index.json` stays the source of truth: an `index.ssx` that is stale
//! (its recorded size is not `index.json`'s, or it is older) or does not parse is ignored with
//! a warning, and `index.json` is read.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardstream_sharding::compression::Algorithm;

use shardstream_sharding::hashing::HashAlgorithm;
use shardstream_sharding::mds::index_bin::{self, IndexView, BINARY_INDEX_BASENAME};
use shardstream_sharding::mds::{Columns, FileInfo, Index, ShardInfo};
use shardstream_storage::{Location, StorageError};
use tracing::{debug, warn};

use super::config::StreamingConfig;
use super::format::{framed_classic_size, stored_size, LitFields, ShardSchema, TarShard};
use crate::cache::{read_index_copy, remove_index_copy, save_index_copy, ExpectedHash};
use crate::error::{Result, StreamerError};
use crate::order::Weight;
use shardstream_sharding::litdata::{CompressionLevel, LitDataIndex};

/// A remote index to keep in the node's cache folder (see `crate::cache::save_index_copy`):
/// `index.json`'s bytes, or `index.ssx`'s when that was read.
#[derive(Debug)]
pub(crate) struct IndexCopy {
    pub(super) dir: PathBuf,
    pub(super) url: String,
    pub(super) bytes: Vec<u8>,
}

/// A stream's MDS index as it was read: `index.json`'s bytes and their parse, or `index.ssx`
/// read in place (its bytes and distinct schemas; each shard's entry is built when the shard
/// list is, one at a time), so that a dataset of 10^6 shards never holds a whole [`Index`].
#[derive(Debug)]
pub(crate) enum MdsIndex {
    /// `index.json`.
    Json { bytes: Vec<u8>, index: Index },
    /// `index.ssx`, found fresh against the `index.json` beside it.
    Binary(IndexView),
}

impl MdsIndex {
    /// The file's name in the stream's folder.
    pub(super) fn basename(&self) -> &'static str {
        match self {
            MdsIndex::Json { .. } => "index.json",
            MdsIndex::Binary(_) => BINARY_INDEX_BASENAME,
        }
    }

    /// The file's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            MdsIndex::Json { bytes, .. } => bytes,
            MdsIndex::Binary(view) => view.bytes(),
        }
    }

    /// The file's bytes, owned (the parse is dropped).
    pub(super) fn into_bytes(self) -> Vec<u8> {
        match self {
            MdsIndex::Json { bytes, .. } => bytes,
            MdsIndex::Binary(view) => view.into_bytes(),
        }
    }

    fn shard_count(&self) -> usize {
        match self {
            MdsIndex::Json { index, .. } => index.shards.len(),
            MdsIndex::Binary(view) => view.len(),
        }
    }

    /// Shard `i`'s entry; `path` names the file in errors.
    fn shard_info(&self, path: &str, i: usize) -> Result<Cow<'_, ShardInfo>> {
        match self {
            MdsIndex::Json { index, .. } => {
                index
                    .shards
                    .get(i)
                    .map(Cow::Borrowed)
                    .ok_or_else(|| StreamerError::NotFound {
                        what: format!("shard {i} of {path}"),
                    })
            }
            MdsIndex::Binary(view) => Ok(Cow::Owned(view.shard_info(path, i)?)),
        }
    }
}

/// One dataset of a mix, for [`StreamingDataset::open_streams`] (Mosaic's `Stream`).
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Its root (as [`StreamingConfig::remote`]).
    pub remote: String,
    /// Its subfolder.
    pub split: Option<String>,
    /// How much of each epoch it gives.
    pub weight: Weight,
    /// A location built by the caller (custom options, a test server); else `remote` is opened.
    pub location: Option<Location>,
    /// Storage options of this stream, applied after the dataset's
    /// ([`StreamingConfig::storage_options`](crate::StreamingConfig::storage_options)).
    pub storage_options: shardstream_storage::named_options::NamedOptions,
}

/// The shards of the streams read so far.
#[derive(Default)]
pub(super) struct Loaded {
    pub(super) shards: Vec<ShardSource>,
    pub(super) first_sample: u64,
    pub(super) max_shard_bytes: u64,
    pub(super) first_columns: Vec<(String, String)>,
}

impl Loaded {
    /// Adds stream `stream` from its MDS index; returns its per-shard sample counts.
    pub(super) fn add_stream(
        &mut self,
        config: &StreamingConfig,
        location: &Location,
        stream: usize,
        index: &MdsIndex,
    ) -> Result<Vec<u64>> {
        let index_name = location.url_of(index.basename());
        let in_place = location.local_root().is_some() && !config.copy_local;
        let count = index.shard_count();
        if count > 0 {
            let s = index.shard_info(&index_name, 0)?;
            let cols = s
                .column_names
                .iter()
                .cloned()
                .zip(s.column_encodings.iter().cloned())
                .collect();
            if stream == 0 {
                self.first_columns = cols;
            }
        }
        let mut counts = Vec::with_capacity(count);
        let mut prev_columns: Option<Arc<Columns>> = None;
        for i in 0..count {
            let info = index.shard_info(&index_name, i)?;
            let info = info.as_ref();
            let columns = Columns::from_shard_info(&index_name, info, config.allow_unsafe_types)?;
            let columns = match prev_columns {
                Some(prev) if *prev == columns => prev,
                _ => Arc::new(columns),
            };
            prev_columns = Some(Arc::clone(&columns));
            let compression = info.compression()?;
            let hash =
                |file: &FileInfo| config.validate_hash.then(|| expected_hash(file)).flatten();
            let raw_local = match location.local_path(&info.raw_data.basename)? {
                Some(p) if p.is_file() => Some(p),
                _ => None,
            };
            let (stored, algorithm) = match (&info.zip_data, compression) {
                (Some(zip), Some(c)) if raw_local.is_none() => (zip, Some(c.algorithm())),
                _ => (&info.raw_data, None),
            };
            let local_stored = location.local_path(&stored.basename)?;
            let name: Arc<str> = match &local_stored {
                Some(p) => Arc::from(p.display().to_string()),
                None => Arc::from(location.url_of(&stored.basename)),
            };
            // Bytes the shard takes in the cache: decompressed, plus compressed while it is
            // being decompressed; nothing when it is read in place.
            let cached = match (in_place, raw_local.is_some(), algorithm) {
                (true, true, _) => 0,
                (true, false, _) => info.raw_data.bytes,
                (false, _, Some(_)) => info.raw_data.bytes + stored.bytes,
                (false, _, None) => info.raw_data.bytes,
            };
            self.max_shard_bytes = self.max_shard_bytes.max(cached);
            self.shards.push(ShardSource {
                name,
                stream,
                stored_rel: stored.basename.clone(),
                stored_size: stored.bytes,
                stored_hash: hash(stored),
                algorithm,
                framed: false,
                raw_size: info.raw_data.bytes,
                raw_hash: hash(&info.raw_data),
                local_raw: raw_local.filter(|_| in_place),
                local_stored: local_stored.filter(|_| in_place),
                samples: info.samples,
                first_sample: self.first_sample,
                cache_bytes: cached,
                schema: ShardSchema::Mds(columns),
            });
            counts.push(info.samples);
            self.first_sample += info.samples;
        }
        Ok(counts)
    }
}

impl Loaded {
    /// Adds a WebDataset stream from its counted tars; returns its per-shard sample counts.
    /// A tar is stored as it is or gzip-compressed; in the cache it takes its inflated size
    /// (plus the stored bytes while it is inflated), nothing when it is read in place.
    pub(super) fn add_wds_stream(
        &mut self,
        config: &StreamingConfig,
        location: &Location,
        stream: usize,
        tars: &[TarShard],
    ) -> Result<Vec<u64>> {
        let in_place = location.local_root().is_some() && !config.copy_local;
        let mut counts = Vec::with_capacity(tars.len());
        for tar in tars {
            let local = location.local_path(&tar.rel)?;
            let name: Arc<str> = match &local {
                Some(p) => Arc::from(p.display().to_string()),
                None => Arc::from(location.url_of(&tar.rel)),
            };
            let algorithm = tar.gzip.then_some(Algorithm::Gzip);
            let cached = match (in_place, tar.gzip) {
                (true, false) => 0,
                (true, true) => tar.raw,
                (false, true) => tar.raw.saturating_add(tar.stored),
                (false, false) => tar.raw,
            };
            self.max_shard_bytes = self.max_shard_bytes.max(cached);
            self.shards.push(ShardSource {
                name,
                stream,
                stored_rel: tar.rel.clone(),
                stored_size: tar.stored,
                stored_hash: None,
                algorithm,
                framed: false,
                raw_size: tar.raw,
                raw_hash: None,
                local_raw: local.clone().filter(|_| in_place && !tar.gzip),
                local_stored: local.filter(|_| in_place),
                samples: tar.samples,
                first_sample: self.first_sample,
                cache_bytes: cached,
                schema: ShardSchema::Wds,
            });
            counts.push(tar.samples);
            self.first_sample = self.first_sample.saturating_add(tar.samples);
        }
        Ok(counts)
    }
}

impl Loaded {
    /// Adds a LitData stream from its index; returns its per-chunk sample counts. A chunk is
    /// read as an MDS shard (the same layout); a whole-file zstd chunk is inflated into the
    /// cache to the `chunk_bytes` its index records, a framed one (`"batch"`) turned into the
    /// classic layout there, of the size its header gives ([`framed_classic_size`]). Stored
    /// sizes come from the files (a stat, or a HEAD per chunk when remote), not from the index.
    pub(super) fn add_lit_stream(
        &mut self,
        config: &StreamingConfig,
        location: &Location,
        stream: usize,
        index: &LitDataIndex,
        fields: &Arc<LitFields>,
    ) -> Result<Vec<u64>> {
        let in_place = location.local_root().is_some() && !config.copy_local;
        let whole_zstd = index.whole_file_zstd();
        let batch =
            index.compression.is_some() && index.compression_level == CompressionLevel::Batch;
        let mut counts = Vec::with_capacity(index.chunks.len());
        for chunk in &index.chunks {
            // litdata reading a local dataset inflates `chunk-R-I.zstd.bin` in place into
            // `chunk-R-I.bin` and deletes the compressed file: that copy is read instead.
            let inflated = match &index.compression {
                Some(c) if whole_zstd => Some(chunk.filename.replace(&format!(".{c}"), "")),
                _ => None,
            };
            let inflated = inflated.filter(|rel| {
                let local = |r: &str| location.local_path(r).ok().flatten();
                local(&chunk.filename).is_some_and(|p| !p.exists())
                    && local(rel).is_some_and(|p| p.is_file())
            });
            let whole_zstd = whole_zstd && inflated.is_none();
            let rel = inflated.as_ref().unwrap_or(&chunk.filename);
            let stored = stored_size(location, rel)?;
            let local = location.local_path(rel)?;
            let name: Arc<str> = match &local {
                Some(p) => Arc::from(p.display().to_string()),
                None => Arc::from(location.url_of(rel)),
            };
            let framed = match batch {
                true => framed_classic_size(location, rel, &name, stored, chunk.chunk_size)?,
                false => None,
            };
            let whole_zstd = whole_zstd || framed.is_some();
            let raw = match (whole_zstd, framed.or(chunk.chunk_bytes)) {
                (false, _) => stored,
                (true, Some(bytes)) => bytes,
                (true, None) => {
                    return Err(StreamerError::Format(
                        shardstream_sharding::FormatError::invalid_index(
                            location.url_of("index.json"),
                            format!("compressed chunk {rel} has no chunk_bytes"),
                        ),
                    ))
                }
            };
            let cached = match (in_place, whole_zstd) {
                (true, false) => 0,
                (true, true) => raw,
                (false, true) => raw.saturating_add(stored),
                (false, false) => raw,
            };
            self.max_shard_bytes = self.max_shard_bytes.max(cached);
            self.shards.push(ShardSource {
                name,
                stream,
                stored_rel: rel.clone(),
                stored_size: stored,
                stored_hash: None,
                algorithm: whole_zstd.then_some(Algorithm::Zstd),
                framed: framed.is_some(),
                raw_size: raw,
                raw_hash: None,
                local_raw: local.clone().filter(|_| in_place && !whole_zstd),
                local_stored: local.filter(|_| in_place),
                samples: chunk.chunk_size,
                first_sample: self.first_sample,
                cache_bytes: cached,
                schema: ShardSchema::LitData(Arc::clone(fields)),
            });
            counts.push(chunk.chunk_size);
            self.first_sample = self.first_sample.saturating_add(chunk.chunk_size);
        }
        Ok(counts)
    }
}

/// A stream's MDS index, as the bytes of the file it was read from, parsed, and whether it
/// came from the store. A remote index comes from its copy in the node's cache folder `copies`
/// when there is one that parses (`index.ssx`'s first, then `index.json`'s; see
/// `crate::cache::read_index_copy`), else from the store: `index.ssx` when it is there and
/// fresh, else `index.json`. A local index is always read where it is.
pub(super) fn load_index(location: &Location, copies: Option<&Path>) -> Result<(MdsIndex, bool)> {
    let name = location.url_of("index.json");
    let bin_name = location.url_of(BINARY_INDEX_BASENAME);
    let copies = copies.filter(|_| location.local_root().is_none());
    if let Some(dir) = copies {
        let parse_bin = |b: Vec<u8>| IndexView::parse(&bin_name, b).map(MdsIndex::Binary);
        if let Some(index) = read_copy(dir, &bin_name, parse_bin) {
            return Ok((index, false));
        }
        let parse_json = |bytes: Vec<u8>| {
            Index::from_json(&name, &bytes).map(|index| MdsIndex::Json { bytes, index })
        };
        if let Some(index) = read_copy(dir, &name, parse_json) {
            return Ok((index, false));
        }
    }
    let jitter = crate::settings::index_jitter(&shardstream_identity::os_env);
    let delay = crate::settings::random_delay(jitter);
    match block_on(read_binary_index(location, delay)) {
        Ok(Some(view)) => {
            debug!(index = %bin_name, "binary index read");
            return Ok((MdsIndex::Binary(view), true));
        }
        Ok(None) => {}
        // `index.json` is the source of truth and `index.ssx` only a faster way to read it: a
        // binary index that cannot be read costs memory and time, not the run.
        Err(e) => warn!(index = %bin_name, error = %e,
            "cannot use the binary index; reading index.json instead"),
    }
    let json = block_on(read_json_index(location, std::time::Duration::ZERO))?;
    let index = Index::from_json(&name, &json)?;
    Ok((MdsIndex::Json { bytes: json, index }, true))
}

/// The copy of the index `url` in folder `dir` and what `parse` makes of it; a copy that does
/// not parse is removed (the store is read again).
fn read_copy(
    dir: &Path,
    url: &str,
    parse: impl FnOnce(Vec<u8>) -> shardstream_sharding::error::Result<MdsIndex>,
) -> Option<MdsIndex> {
    match read_index_copy(dir, url) {
        Ok(Some(bytes)) => match parse(bytes) {
            Ok(index) => {
                debug!(index = %url, cache = %dir.display(), "index read from its copy");
                return Some(index);
            }
            Err(e) => {
                warn!(index = %url, cache = %dir.display(), error = %e,
                    "the copy of the index does not parse; reading the store again");
                if let Err(e) = remove_index_copy(dir, url) {
                    warn!(error = %e, "cannot remove the copy of the index");
                }
            }
        },
        Ok(None) => {}
        Err(e) => warn!(index = %url, error = %e, "cannot read the copy of the index"),
    }
    None
}

/// `index.ssx` parsed, when the stream has one that mirrors its `index.json`: a GET of
/// `index.ssx` (under the index size cap), then, when it is there, a HEAD of `index.json` for
/// its freshness. Two requests whether or not the stream has one (a dataset without it costs
/// one 404 before its `index.json` GET), so that 4,096 processes starting together do not add
/// a round of HEADs to the start-up burst on the dataset's prefix (`docs/scale.md`). `None`
/// when there is none or it is stale (with a warning); an error when it is there but cannot be
/// read or does not parse.
async fn read_binary_index(
    location: &Location,
    delay: std::time::Duration,
) -> Result<Option<IndexView>> {
    tokio::time::sleep(delay).await;
    let bin_url = location.url_of(BINARY_INDEX_BASENAME);
    let limit = shardstream_sharding::index_file::max_index_bytes();
    let (bytes, bin_info) = match location
        .get_at_most_with_info(BINARY_INDEX_BASENAME, limit)
        .await
    {
        Ok(got) => got,
        Err(StorageError::TooLarge { size, limit, .. }) => {
            return Err(
                shardstream_sharding::index_file::oversized_index(&bin_url, size, limit).into(),
            )
        }
        Err(StorageError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let json_head = match location.head("index.json").await {
        Ok(h) => h,
        // Without index.json the stream is not MDS (or not there): its reader says which.
        Err(StorageError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let head = index_bin::header(&bin_url, &bytes)?;
    let fresh = index_bin::is_fresh(
        &head,
        Some(bin_info.last_modified),
        json_head.size,
        Some(json_head.last_modified),
    );
    if !fresh {
        warn!(index = %bin_url, recorded_json_bytes = head.json_bytes,
            json_bytes = json_head.size,
            "the binary index does not mirror index.json (stale); reading index.json");
        return Ok(None);
    }
    Ok(Some(IndexView::parse(&bin_url, bytes.to_vec())?))
}

/// Keeps a remote index read from the store in the node's cache folder for the next opens,
/// unless the folder has that copy already (a forked DataLoader worker of a parent that never
/// iterated saves what its siblings saved); a failure only costs those opens a GET.
pub(super) fn keep_index_copy(copy: &IndexCopy) {
    if read_index_copy(&copy.dir, &copy.url).is_ok_and(|kept| kept.as_ref() == Some(&copy.bytes)) {
        return;
    }
    match save_index_copy(&copy.dir, &copy.url, &copy.bytes) {
        Ok(()) => debug!(index = %copy.url, cache = %copy.dir.display(), "index copied"),
        Err(e) => warn!(index = %copy.url, cache = %copy.dir.display(), error = %e,
            "cannot keep a copy of the index; the next open reads the store again"),
    }
}

/// Runs `fut` on a runtime of this thread only, dropped before returning: no thread outlives
/// `open`, so a fork right after it is safe.
fn block_on<T>(fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StreamerError::Engine(format!("cannot start a runtime: {e}")))?;
    rt.block_on(fut)
}

/// A stream's `index.json` from its location, after the start jitter (see
/// `crate::settings::index_jitter`).
pub(super) fn read_index(location: &Location) -> Result<Vec<u8>> {
    let jitter = crate::settings::index_jitter(&shardstream_identity::os_env);
    block_on(read_json_index(
        location,
        crate::settings::random_delay(jitter),
    ))
}

async fn read_json_index(location: &Location, delay: std::time::Duration) -> Result<Vec<u8>> {
    tokio::time::sleep(delay).await;
    // The index is read whole: its size (untrusted) is checked against the cap from the first
    // response, before the rest is fetched.
    let url = location.url_of("index.json");
    let limit = shardstream_sharding::index_file::max_index_bytes();
    match location.get_at_most("index.json", limit).await {
        Ok(bytes) => Ok(bytes.to_vec()),
        Err(StorageError::TooLarge { size, limit, .. }) => {
            Err(shardstream_sharding::index_file::oversized_index(&url, size, limit).into())
        }
        Err(StorageError::NotFound { url }) => Err(StreamerError::NotFound { what: url }),
        Err(e) => Err(e.into()),
    }
}

pub(super) fn expected_hash(file: &FileInfo) -> Option<ExpectedHash> {
    file.hashes.iter().find_map(|(name, hex)| {
        HashAlgorithm::parse(name)
            .ok()
            .map(|algorithm| ExpectedHash {
                algorithm,
                hex: hex.clone(),
            })
    })
}

/// Where one shard's bytes come from, resolved at open from the index.
#[derive(Debug, Clone)]
pub(crate) struct ShardSource {
    /// The shard's URL (or local path), for messages and as its cache key.
    pub name: Arc<str>,
    /// The stream (dataset) it belongs to: an index into the dataset's locations.
    pub stream: usize,
    /// The file to fetch, relative to the dataset location (compressed when `algorithm` is set).
    pub stored_rel: String,
    pub stored_size: u64,
    pub stored_hash: Option<ExpectedHash>,
    /// Set when the stored file must be decompressed.
    pub algorithm: Option<Algorithm>,
    /// The stored file is a framed zstd LitData chunk (`algorithm` is zstd): decompressing it
    /// turns it into the classic chunk layout (`shardstream_sharding::litdata::framed`).
    pub framed: bool,
    pub raw_size: u64,
    pub raw_hash: Option<ExpectedHash>,
    /// The decompressed file, when it is local and read in place.
    pub local_raw: Option<PathBuf>,
    /// The compressed file, when it is local.
    pub local_stored: Option<PathBuf>,
    pub samples: u64,
    pub first_sample: u64,
    /// Bytes it takes in the cache (0 when read in place).
    pub cache_bytes: u64,
    /// How its samples are found and split.
    pub schema: ShardSchema,
}
