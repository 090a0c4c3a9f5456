//! The filesystem logic, free of FUSE: inodes, names, attributes and reads over a
//! [`DatasetSource`]. The `fuser` adapter only translates these calls and their errors.
//!
//! Layout:
//! - `shards/index.json` (when the dataset has one) and `shards/<name>` for every shard,
//!   decompressed: an MDS index's `raw_data` names and sizes (so `shards/` is itself a readable
//!   uncompressed MDS dataset), or for other formats the source's shard listing
//!   ([`DatasetSource::listing`]: WebDataset tars, LitData chunks);
//! - `samples/`: one file per sample and field, `<index>.<field>[.<ext>]`; for MDS the field is
//!   the column, for WebDataset the member's name `<key>.<ext>`, for LitData the leaf; or, for
//!   MDS datasets made from a folder of files or an ImageFolder tree, the original relative paths.
//!
//! Every lookup and every directory listing is answered from the index (or the listing) and
//! from per-shard layouts held in memory; nothing lists the object store.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use shardstream_sharding::mds::{Columns, Index};
use shardstream_sharding::safe_path::check_relative;

use crate::error::{FsError, Result};
use crate::layout::ShardLayout;
use crate::names::{
    column_file_names, escape_column, extension, parse_index, sample_file_name, Naming,
};
use crate::readahead::Readahead;
use crate::source::{DatasetSource, ShardData};
use crate::tree::{Node, Tree};

/// Inode of the root directory.
pub const ROOT_INO: u64 = 1;
/// Inode of `shards/`.
pub const SHARDS_INO: u64 = 2;
/// Inode of `samples/`.
pub const SAMPLES_INO: u64 = 3;
const SHARD_TREE_BASE: u64 = 1 << 32;
const PATH_TREE_BASE: u64 = 1 << 40;
const SAMPLE_BASE: u64 = 1 << 48;

/// Settings of the filesystem.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// Owner of every file.
    pub uid: u32,
    /// Group of every file.
    pub gid: u32,
    /// How long the kernel may keep attributes and names (the data never changes).
    pub ttl: Duration,
    /// Name samples of folder/ImageFolder datasets by their original paths.
    pub by_path: bool,
    /// Most shards a sequential reader fetches ahead (further capped by the source's budget).
    pub max_readahead_shards: usize,
    /// Shards kept open (pinned in the cache) after their last reader, for the next one.
    pub keep_open_shards: usize,
    /// Longest a read waits for its shard; past it the read fails with EIO while the fetch goes
    /// on in the background (a later read finds it). `None`: as long as the streamer retries.
    pub fetch_timeout: Option<Duration>,
}

impl Default for FsConfig {
    fn default() -> Self {
        let (uid, gid) = process_owner();
        FsConfig {
            uid,
            gid,
            ttl: Duration::from_secs(24 * 3600),
            by_path: true,
            max_readahead_shards: 8,
            keep_open_shards: 4,
            fetch_timeout: None,
        }
    }
}

/// The uid and gid this process runs as (from `/proc/self`), root if unknown.
pub fn process_owner() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or((0, 0), |m| (m.uid(), m.gid()))
}

/// A directory or a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
}

/// Attributes of one inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Directory or file.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (read-only: 0o555 for directories, 0o444 for files).
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time (the mount time; the data never changes while mounted).
    pub mtime: SystemTime,
}

/// Filesystem-wide figures for `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Total bytes of the shard files.
    pub bytes: u64,
    /// Number of inodes that names reach.
    pub files: u64,
    /// Longest name.
    pub name_max: u32,
}

/// What `shards/` and the sample order need of one shard.
#[derive(Debug, Clone, Copy)]
struct ShardEntry {
    /// Decompressed bytes, as served.
    bytes: u64,
    samples: u64,
}

/// A file of `samples/` that is a known part of a shard (path-named and listed samples).
#[derive(Debug, Clone, Copy)]
struct Part {
    shard: usize,
    base: u64,
    len: u64,
}

#[derive(Debug)]
enum ShardLeaf {
    Index,
    Shard(usize),
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Root,
    ShardNode(u64),
    SamplesDir,
    PathNode(u64),
    SampleColumn { sample: u64, column: usize },
}

/// What an open file reads: bytes `[base, base + len)` of a shard, or the index.
#[derive(Debug, Clone, Copy)]
enum Span {
    Index,
    Shard {
        shard: usize,
        base: u64,
        len: u64,
    },
    /// A sample column whose place in its shard is known once the shard is there.
    Sample {
        sample: u64,
        column: usize,
    },
    /// A part of a shard whose place is known (a file of a path or listed tree).
    Part(Part),
}

/// Whether an open file can be read by the kernel from a plain file: see
/// [`DatasetFs::backing_file`].
#[derive(Debug)]
pub enum Backing {
    /// Never: the index, or a file of `samples/` (a part of a shard).
    Never,
    /// A whole shard, but not now (still downloading, or the source keeps no such file).
    NotNow,
    /// This file holds exactly the open file's bytes, complete.
    File(std::fs::File),
}

/// An open file's shard bytes, with its span's base offset and length in them.
type OpenData = (Arc<dyn ShardData>, u64, u64);

struct OpenFile {
    span: Span,
    data: Mutex<Option<OpenData>>,
}

/// The filesystem: a plain type, tested without a mount.
pub struct DatasetFs {
    source: Arc<dyn DatasetSource>,
    config: FsConfig,
    shards: Vec<ShardEntry>,
    columns: Vec<(String, String)>,
    /// Each column's part of its `samples/` file names, `None` for one left out (see
    /// [`column_file_names`]).
    column_files: Vec<Option<String>>,
    fixed: Vec<Option<u64>>,
    /// First global sample of each shard, and the total at the end.
    starts: Vec<u64>,
    naming: Naming,
    shard_tree: Tree<ShardLeaf>,
    path_tree: Mutex<Option<Arc<Tree<Part>>>>,
    layouts: RwLock<HashMap<usize, Arc<ShardLayout>>>,
    open: RwLock<HashMap<u64, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    recent: Mutex<VecDeque<(usize, Arc<dyn ShardData>)>>,
    readahead: Readahead,
    pending: Mutex<HashMap<usize, Arc<Pending>>>,
    mtime: SystemTime,
}

/// One fetch in flight, shared by every read that needs its shard.
#[derive(Default)]
struct Pending {
    result: Mutex<Option<std::result::Result<Arc<dyn ShardData>, crate::error::SourceError>>>,
    done: std::sync::Condvar,
}

impl std::fmt::Debug for DatasetFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetFs")
            .field("shards", &self.shards.len())
            .field("samples", &self.num_samples())
            .field("naming", &self.naming)
            .finish_non_exhaustive()
    }
}

/// Emits the children of a tree directory from position `pos` (2 = the first child).
fn emit_children(
    children: &std::collections::BTreeMap<String, u32>,
    pos: &mut u64,
    add: &mut impl FnMut(u64, u64, Kind, &str) -> bool,
    kind_of: impl Fn(u32) -> (u64, Kind),
) {
    let skip = usize::try_from(*pos - 2).unwrap_or(usize::MAX);
    for (name, &id) in children.iter().skip(skip) {
        let (child, kind) = kind_of(id);
        *pos += 1;
        if add(child, *pos, kind, name) {
            break;
        }
    }
}

/// Whether every part of the relative path `path` can be a directory entry: a part longer than
/// the kernel's name limit would fail the listing of its whole directory.
fn names_fit(path: &str) -> bool {
    path.split('/')
        .all(|part| part.len() <= crate::names::NAME_MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DatasetFs {
    /// Builds the filesystem from the source's index; fetches nothing.
    pub fn new(source: Arc<dyn DatasetSource>, config: FsConfig) -> Result<DatasetFs> {
        match source.listing() {
            Some(listing) => Self::from_listing(source, config, &listing),
            None => Self::from_mds_index(source, config),
        }
    }

    /// A dataset of another format than MDS: its shards from the source's listing, its
    /// `samples/` named after each sample's fields ([`Naming::Listed`]).
    fn from_listing(
        source: Arc<dyn DatasetSource>,
        config: FsConfig,
        listing: &[shardstream_streamer::dataset::ShardInfo],
    ) -> Result<DatasetFs> {
        let mut shard_tree = Tree::default();
        if !source.index_json().is_empty() {
            shard_tree.insert("index.json", ShardLeaf::Index);
        }
        let mut shards = Vec::with_capacity(listing.len());
        for (i, info) in listing.iter().enumerate() {
            shards.push(ShardEntry {
                bytes: info.raw_bytes,
                samples: info.samples,
            });
            let name = info.raw_file();
            check_relative("listing", &name)?;
            if !names_fit(&name) || !shard_tree.insert(&name, ShardLeaf::Shard(i)) {
                tracing::warn!(shard = i, name = %name, "shard name too long or taken; shard left out of shards/");
            }
        }
        Self::build(
            source,
            config,
            shards,
            shard_tree,
            Vec::new(),
            Vec::new(),
            false,
        )
    }

    fn from_mds_index(source: Arc<dyn DatasetSource>, config: FsConfig) -> Result<DatasetFs> {
        let index = Index::from_json("index.json", source.index_json())?;
        let mut columns = Vec::new();
        let mut fixed = Vec::new();
        for (i, shard) in index.shards.iter().enumerate() {
            // Bytes are served raw, never decoded: unsafe encodings are no risk here.
            let c = Columns::from_shard_info("index.json", shard, true)?;
            let spec: Vec<(String, String)> = c
                .names()
                .iter()
                .cloned()
                .zip(c.encoding_names().iter().cloned())
                .collect();
            if i == 0 {
                columns = spec;
                fixed = c.sizes().to_vec();
            } else if spec != columns {
                return Err(FsError::Index(
                    shardstream_sharding::FormatError::invalid_index(
                        "index.json",
                        format!(
                            "shard {i} has other columns than shard 0; the mount needs one layout"
                        ),
                    ),
                ));
            }
        }
        let mut shard_tree = Tree::default();
        shard_tree.insert("index.json", ShardLeaf::Index);
        for (i, shard) in index.shards.iter().enumerate() {
            let name = &shard.raw_data.basename;
            check_relative("index.json", name)?;
            if !names_fit(name) {
                tracing::warn!(shard = i, basename = %name, "a part of the name is longer than 255 bytes; shard left out of shards/");
                continue;
            }
            if !shard_tree.insert(name, ShardLeaf::Shard(i)) {
                return Err(FsError::Index(
                    shardstream_sharding::FormatError::invalid_index(
                        "index.json",
                        format!("shard basename {name:?} clashes with another entry"),
                    ),
                ));
            }
        }
        let shards = index
            .shards
            .iter()
            .map(|s| ShardEntry {
                bytes: s.raw_data.bytes,
                samples: s.samples,
            })
            .collect();
        Self::build(source, config, shards, shard_tree, columns, fixed, true)
    }

    /// The filesystem over `shards`; `columns` and `fixed` are an MDS index's when `mds`.
    #[allow(clippy::too_many_arguments)]
    fn build(
        source: Arc<dyn DatasetSource>,
        config: FsConfig,
        shards: Vec<ShardEntry>,
        shard_tree: Tree<ShardLeaf>,
        columns: Vec<(String, String)>,
        fixed: Vec<Option<u64>>,
        mds: bool,
    ) -> Result<DatasetFs> {
        let mut starts = Vec::with_capacity(shards.len() + 1);
        let mut total = 0u64;
        for shard in &shards {
            starts.push(total);
            total = total.checked_add(shard.samples).ok_or_else(|| {
                FsError::Index(shardstream_sharding::FormatError::invalid_index(
                    "index.json",
                    "the shards hold more than 2^64 samples",
                ))
            })?;
        }
        starts.push(total);
        // Every sample file needs an inode above SAMPLE_BASE.
        let sample_files = total.checked_mul(columns.len() as u64);
        if sample_files
            .and_then(|n| n.checked_add(SAMPLE_BASE))
            .is_none()
        {
            return Err(FsError::Index(
                shardstream_sharding::FormatError::invalid_index(
                    "index.json",
                    format!(
                        "{total} samples of {} columns are more files than a mount can number",
                        columns.len()
                    ),
                ),
            ));
        }
        let naming = match mds {
            true => Naming::detect(&columns, total, config.by_path),
            false => Naming::Listed {
                width: total.saturating_sub(1).to_string().len(),
            },
        };
        let column_files = match naming {
            Naming::ByIndex { width } => column_file_names(&columns, width),
            Naming::ByPath { .. } | Naming::Listed { .. } => Vec::new(),
        };
        let max_shard = shards.iter().map(|s| s.bytes).max().unwrap_or(0).max(1);
        // Read-ahead and kept-open shards share half the budget; readers keep the rest.
        let budget_shards = source.readahead_budget().map_or(usize::MAX, |b| {
            usize::try_from(b / 2 / max_shard).unwrap_or(usize::MAX)
        });
        let readahead =
            Readahead::new(config.max_readahead_shards.min(budget_shards), shards.len());
        let mut config = config;
        config.keep_open_shards = config.keep_open_shards.min(budget_shards);
        tracing::info!(
            shards = shards.len(),
            samples = total,
            ?naming,
            readahead_cap = readahead.cap(),
            keep_open = config.keep_open_shards,
            "filesystem ready"
        );
        Ok(DatasetFs {
            source,
            config,
            shards,
            columns,
            column_files,
            fixed,
            starts,
            naming,
            shard_tree,
            path_tree: Mutex::new(None),
            layouts: RwLock::new(HashMap::new()),
            open: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            recent: Mutex::new(VecDeque::new()),
            readahead,
            pending: Mutex::new(HashMap::new()),
            mtime: SystemTime::now(),
        })
    }

    /// Number of samples.
    pub fn num_samples(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// How sample files are named.
    pub fn naming(&self) -> &Naming {
        &self.naming
    }

    /// The TTL for attributes and entries.
    pub fn ttl(&self) -> Duration {
        self.config.ttl
    }

    fn target(&self, ino: u64) -> Result<Target> {
        let unknown = FsError::UnknownInode { ino };
        Ok(match ino {
            ROOT_INO => Target::Root,
            SHARDS_INO => Target::ShardNode(0),
            SAMPLES_INO => Target::SamplesDir,
            i if i >= SAMPLE_BASE => {
                let n = self.columns.len() as u64;
                let k = i - SAMPLE_BASE;
                if n == 0 || k / n >= self.num_samples() {
                    return Err(unknown);
                }
                Target::SampleColumn {
                    sample: k / n,
                    column: (k % n) as usize,
                }
            }
            i if i >= PATH_TREE_BASE => Target::PathNode(i - PATH_TREE_BASE),
            i if i > SHARD_TREE_BASE
                && ((i - SHARD_TREE_BASE) as usize) < self.shard_tree.len() =>
            {
                Target::ShardNode(i - SHARD_TREE_BASE)
            }
            _ => return Err(unknown),
        })
    }

    /// Column `column`'s part of its file names and its encoding, `None` when it is left out
    /// of `samples/`.
    fn column_file(&self, column: usize) -> Option<(&str, &str)> {
        let file = self.column_files.get(column)?.as_deref()?;
        Some((file, self.columns.get(column)?.1.as_str()))
    }

    fn shard_node_ino(id: u64) -> u64 {
        if id == 0 {
            SHARDS_INO
        } else {
            SHARD_TREE_BASE + id
        }
    }

    fn path_node_ino(id: u64) -> u64 {
        if id == 0 {
            SAMPLES_INO
        } else {
            PATH_TREE_BASE + id
        }
    }

    fn sample_ino(&self, sample: u64, column: usize) -> u64 {
        SAMPLE_BASE + sample * self.columns.len() as u64 + column as u64
    }

    fn dir_attr(&self, ino: u64) -> Attr {
        Attr {
            ino,
            kind: Kind::Dir,
            size: 0,
            perm: 0o555,
            nlink: 2,
            uid: self.config.uid,
            gid: self.config.gid,
            mtime: self.mtime,
        }
    }

    fn file_attr(&self, ino: u64, size: u64) -> Attr {
        Attr {
            ino,
            kind: Kind::File,
            size,
            perm: 0o444,
            nlink: 1,
            uid: self.config.uid,
            gid: self.config.gid,
            mtime: self.mtime,
        }
    }

    /// Shard and position inside it of a global sample.
    fn locate(&self, sample: u64) -> Option<(usize, usize)> {
        if sample >= self.num_samples() {
            return None;
        }
        let shard = self.starts.partition_point(|&s| s <= sample) - 1;
        Some((shard, (sample - self.starts[shard]) as usize))
    }

    /// The open data of `shard`, reusing a recently used one.
    fn shard_data(&self, shard: usize) -> Result<Arc<dyn ShardData>> {
        {
            let mut recent = lock(&self.recent);
            if let Some(pos) = recent.iter().position(|(s, _)| *s == shard) {
                if let Some(entry) = recent.remove(pos) {
                    let data = Arc::clone(&entry.1);
                    recent.push_front(entry);
                    return Ok(data);
                }
            }
        }
        let ahead = self.readahead.touch(shard);
        self.readahead.spawn_fetch(Arc::clone(&self.source), ahead);
        let data = self.fetch(shard)?;
        let expected = self.shards[shard].bytes;
        if data.len() != expected {
            return Err(FsError::Corrupt {
                shard,
                reason: format!("{} bytes, the index says {expected}", data.len()),
            });
        }
        if self.config.keep_open_shards > 0 {
            let mut recent = lock(&self.recent);
            recent.push_front((shard, Arc::clone(&data)));
            recent.truncate(self.config.keep_open_shards);
        }
        Ok(data)
    }

    /// Opens `shard` through the source, once for all concurrent readers, waiting at most
    /// `fetch_timeout`.
    fn fetch(&self, shard: usize) -> Result<Arc<dyn ShardData>> {
        let (pending, leader) = {
            let mut map = lock(&self.pending);
            let failed = |p: &Pending| matches!(lock(&p.result).as_ref(), Some(Err(_)));
            match map.get(&shard) {
                // A finished failure is not reused: this read tries again.
                Some(p) if !failed(p) => (Arc::clone(p), false),
                _ => {
                    let p = Arc::new(Pending::default());
                    map.insert(shard, Arc::clone(&p));
                    (p, true)
                }
            }
        };
        if leader {
            let run = {
                let source = Arc::clone(&self.source);
                let pending = Arc::clone(&pending);
                move || {
                    let result = source.open_shard(shard);
                    *lock(&pending.result) = Some(result);
                    pending.done.notify_all();
                }
            };
            match self.config.fetch_timeout {
                // Without a deadline the reader's own thread fetches.
                None => run(),
                Some(_) => {
                    if let Err(e) = std::thread::Builder::new()
                        .name("shardstream-fetch".into())
                        .spawn(run)
                    {
                        lock(&self.pending).remove(&shard);
                        return Err(crate::error::SourceError::new(
                            crate::error::SourceErrorKind::Io,
                            shard,
                            format!("cannot start a fetch thread: {e}"),
                        )
                        .into());
                    }
                }
            }
        }
        let deadline = self
            .config
            .fetch_timeout
            .map(|t| std::time::Instant::now() + t);
        let mut result = lock(&pending.result);
        loop {
            if let Some(r) = result.as_ref() {
                let r = r.clone();
                drop(result);
                let mut map = lock(&self.pending);
                if map.get(&shard).is_some_and(|p| Arc::ptr_eq(p, &pending)) {
                    map.remove(&shard);
                }
                return r.map_err(FsError::from);
            }
            result = match deadline {
                None => pending
                    .done
                    .wait(result)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return Err(crate::error::SourceError::new(
                            crate::error::SourceErrorKind::Unavailable,
                            shard,
                            format!(
                                "not fetched within {:?}; the fetch goes on in the background",
                                self.config.fetch_timeout.unwrap_or_default()
                            ),
                        )
                        .into());
                    }
                    pending
                        .done
                        .wait_timeout(result, d - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn layout(&self, shard: usize) -> Result<Arc<ShardLayout>> {
        if let Some(l) = self
            .layouts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&shard)
        {
            return Ok(Arc::clone(l));
        }
        let data = self.shard_data(shard)?;
        let layout = Arc::new(ShardLayout::read(
            shard,
            data.as_ref(),
            self.shards[shard].samples,
            &self.fixed,
        )?);
        self.layouts
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(shard, Arc::clone(&layout));
        Ok(layout)
    }

    /// `(shard, offset, length)` of a sample's column.
    fn column_span(&self, sample: u64, column: usize) -> Result<(usize, u64, u64)> {
        let (shard, local) = self.locate(sample).ok_or(FsError::UnknownInode {
            ino: self.sample_ino(sample, column),
        })?;
        let (offset, len) = self
            .layout(shard)?
            .column_range(local, column)
            .ok_or_else(|| FsError::Corrupt {
                shard,
                reason: format!("no column {column} for sample {local}"),
            })?;
        Ok((shard, offset, len))
    }

    fn column_size(&self, sample: u64, column: usize) -> Result<u64> {
        match self.fixed.get(column).copied().flatten() {
            Some(size) => Ok(size),
            None => Ok(self.column_span(sample, column)?.2),
        }
    }

    /// The tree of `samples/` for path and listed naming, built on first use: by reading
    /// every shard's path column, or from the source's listing of every shard's samples.
    fn path_tree(&self) -> Result<Arc<Tree<Part>>> {
        let mut slot = lock(&self.path_tree);
        if let Some(tree) = slot.as_ref() {
            return Ok(Arc::clone(tree));
        }
        let started = std::time::Instant::now();
        let (tree, skipped) = match self.naming {
            Naming::ByPath {
                path_column,
                data_column,
            } => self.build_path_tree(path_column, data_column)?,
            Naming::Listed { width } => self.build_listed_tree(width)?,
            Naming::ByIndex { .. } => (Tree::default(), 0),
        };
        tracing::info!(
            entries = tree.len(),
            skipped,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "built the samples/ tree"
        );
        let tree = Arc::new(tree);
        *slot = Some(Arc::clone(&tree));
        Ok(tree)
    }

    /// `samples/` of a listed dataset: `<index>.<field name>[.<ext>]` for every field of
    /// every sample (a `/` in a member's name escaped as `%2F`, as column names are).
    fn build_listed_tree(&self, width: usize) -> Result<(Tree<Part>, u64)> {
        let mut tree = Tree::default();
        let mut skipped = 0u64;
        for shard in 0..self.shards.len() {
            let samples = self.source.sample_files(shard)?;
            if samples.len() as u64 != self.shards[shard].samples {
                return Err(FsError::Corrupt {
                    shard,
                    reason: format!(
                        "{} samples listed, the dataset counted {}",
                        samples.len(),
                        self.shards[shard].samples
                    ),
                });
            }
            for (local, files) in samples.iter().enumerate() {
                let sample = self.starts[shard] + local as u64;
                for file in files {
                    let name = match &file.encoding {
                        Some(enc) => format!(
                            "{sample:0width$}.{}.{}",
                            escape_column(&file.name),
                            extension(enc)
                        ),
                        None => format!("{sample:0width$}.{}", escape_column(&file.name)),
                    };
                    let part = Part {
                        shard,
                        base: file.range.start,
                        len: file.range.end.saturating_sub(file.range.start),
                    };
                    if !(names_fit(&name) && tree.insert(&name, part)) {
                        skipped += 1;
                        tracing::warn!(sample, name = %name, "file name too long or taken; left out of samples/");
                    }
                }
            }
        }
        Ok((tree, skipped))
    }

    /// `samples/` by original paths: the `path` column of every sample names its data column.
    fn build_path_tree(&self, path_column: usize, data_column: usize) -> Result<(Tree<Part>, u64)> {
        let mut tree = Tree::default();
        let mut skipped = 0u64;
        for shard in 0..self.shards.len() {
            let data = self.shard_data(shard)?;
            let layout = self.layout(shard)?;
            for local in 0..layout.len() {
                let sample = self.starts[shard] + local as u64;
                let (offset, len) =
                    layout
                        .column_range(local, path_column)
                        .ok_or_else(|| FsError::Corrupt {
                            shard,
                            reason: format!("sample {local} has no path column"),
                        })?;
                let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX).min(4096)];
                let n = data.read_full_at(offset, &mut buf)?;
                let usable = (n as u64 == len)
                    .then(|| std::str::from_utf8(&buf[..n]).ok())
                    .flatten()
                    .filter(|p| check_relative("samples", p).is_ok() && names_fit(p));
                let part = layout
                    .column_range(local, data_column)
                    .map(|(base, len)| Part { shard, base, len });
                match (usable, part) {
                    (Some(path), Some(part)) if tree.insert(path, part) => {}
                    _ => {
                        skipped += 1;
                        tracing::warn!(
                            sample,
                            "path is unsafe, too long or taken; sample left out of samples/"
                        );
                    }
                }
            }
        }
        Ok((tree, skipped))
    }

    fn attr_of(&self, target: Target, ino: u64) -> Result<Attr> {
        match target {
            Target::Root | Target::SamplesDir => Ok(self.dir_attr(ino)),
            Target::ShardNode(id) => match self.shard_tree.get(id) {
                Some(Node::Dir(_)) => Ok(self.dir_attr(ino)),
                Some(Node::Leaf(ShardLeaf::Index)) => {
                    Ok(self.file_attr(ino, self.source.index_json().len() as u64))
                }
                Some(Node::Leaf(ShardLeaf::Shard(s))) => {
                    Ok(self.file_attr(ino, self.shards[*s].bytes))
                }
                None => Err(FsError::UnknownInode { ino }),
            },
            Target::PathNode(id) => match self.path_tree()?.get(id) {
                Some(Node::Dir(_)) => Ok(self.dir_attr(ino)),
                Some(Node::Leaf(part)) => Ok(self.file_attr(ino, part.len)),
                None => Err(FsError::UnknownInode { ino }),
            },
            Target::SampleColumn { sample, column } => {
                if !matches!(self.naming, Naming::ByIndex { .. })
                    || self.column_file(column).is_none()
                {
                    return Err(FsError::UnknownInode { ino });
                }
                Ok(self.file_attr(ino, self.column_size(sample, column)?))
            }
        }
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.attr_of(self.target(ino)?, ino)
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let not_found = || FsError::NotFound {
            parent,
            name: name.to_string_lossy().into_owned(),
        };
        let name = name.to_str().ok_or_else(not_found)?;
        let child = match self.target(parent)? {
            Target::Root => match name {
                "shards" => SHARDS_INO,
                "samples" => SAMPLES_INO,
                _ => return Err(not_found()),
            },
            Target::ShardNode(id) => match self.shard_tree.get(id) {
                Some(Node::Dir(children)) => {
                    Self::shard_node_ino(u64::from(*children.get(name).ok_or_else(not_found)?))
                }
                _ => return Err(FsError::NotADirectory { ino: parent }),
            },
            Target::SamplesDir | Target::PathNode(_) => match self.naming {
                Naming::ByIndex { width } => {
                    if parent != SAMPLES_INO {
                        return Err(FsError::NotADirectory { ino: parent });
                    }
                    let sample = parse_index(name)
                        .filter(|&s| s < self.num_samples())
                        .ok_or_else(not_found)?;
                    let column = (0..self.columns.len())
                        .position(|c| {
                            self.column_file(c).is_some_and(|(file, enc)| {
                                sample_file_name(width, sample, file, enc) == name
                            })
                        })
                        .ok_or_else(not_found)?;
                    self.sample_ino(sample, column)
                }
                Naming::ByPath { .. } | Naming::Listed { .. } => {
                    let id = if parent == SAMPLES_INO {
                        0
                    } else {
                        parent - PATH_TREE_BASE
                    };
                    match self.path_tree()?.get(id) {
                        Some(Node::Dir(children)) => Self::path_node_ino(u64::from(
                            *children.get(name).ok_or_else(not_found)?,
                        )),
                        Some(Node::Leaf(_)) => return Err(FsError::NotADirectory { ino: parent }),
                        None => return Err(FsError::UnknownInode { ino: parent }),
                    }
                }
            },
            Target::SampleColumn { .. } => return Err(FsError::NotADirectory { ino: parent }),
        };
        self.getattr(child)
    }

    /// Lists directory `ino` from position `offset`: `add(ino, next_offset, kind, name)` returns
    /// true when the reply buffer is full.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, Kind, &str) -> bool,
    ) -> Result<()> {
        let mut pos = offset;
        // "." and ".." come first, at positions 0 and 1.
        while pos < 2 {
            let name = if pos == 0 { "." } else { ".." };
            let dot_ino = if pos == 0 { ino } else { ROOT_INO };
            pos += 1;
            if add(dot_ino, pos, Kind::Dir, name) {
                return Ok(());
            }
        }
        match self.target(ino)? {
            Target::Root => {
                let entries = [(SHARDS_INO, "shards"), (SAMPLES_INO, "samples")];
                for (child, name) in entries.iter().skip((pos - 2) as usize) {
                    pos += 1;
                    if add(*child, pos, Kind::Dir, name) {
                        break;
                    }
                }
                Ok(())
            }
            Target::ShardNode(id) => match self.shard_tree.get(id) {
                Some(Node::Dir(children)) => {
                    emit_children(children, &mut pos, &mut add, |c| {
                        let kind = match self.shard_tree.get(u64::from(c)) {
                            Some(Node::Dir(_)) => Kind::Dir,
                            _ => Kind::File,
                        };
                        (Self::shard_node_ino(u64::from(c)), kind)
                    });
                    Ok(())
                }
                _ => Err(FsError::NotADirectory { ino }),
            },
            Target::SamplesDir | Target::PathNode(_) => match self.naming {
                Naming::ByIndex { width } if ino == SAMPLES_INO => {
                    let ncols = self.columns.len() as u64;
                    // No listable column: nothing to list (and no walk over every sample).
                    let total = if self.column_files.iter().any(Option::is_some) {
                        self.num_samples().saturating_mul(ncols)
                    } else {
                        0
                    };
                    let mut k = pos - 2;
                    while k < total {
                        let (sample, column) = (k / ncols, (k % ncols) as usize);
                        k += 1;
                        // A column left out keeps its positions, so offsets stay stable.
                        let Some((file, enc)) = self.column_file(column) else {
                            continue;
                        };
                        let name = sample_file_name(width, sample, file, enc);
                        if add(self.sample_ino(sample, column), k + 2, Kind::File, &name) {
                            break;
                        }
                    }
                    Ok(())
                }
                Naming::ByIndex { .. } => Err(FsError::NotADirectory { ino }),
                Naming::ByPath { .. } | Naming::Listed { .. } => {
                    let id = if ino == SAMPLES_INO {
                        0
                    } else {
                        ino - PATH_TREE_BASE
                    };
                    let tree = self.path_tree()?;
                    match tree.get(id) {
                        Some(Node::Dir(children)) => {
                            emit_children(children, &mut pos, &mut add, |c| {
                                let kind = match tree.get(u64::from(c)) {
                                    Some(Node::Dir(_)) => Kind::Dir,
                                    _ => Kind::File,
                                };
                                (Self::path_node_ino(u64::from(c)), kind)
                            });
                            Ok(())
                        }
                        _ => Err(FsError::NotADirectory { ino }),
                    }
                }
            },
            Target::SampleColumn { .. } => Err(FsError::NotADirectory { ino }),
        }
    }

    /// Opens file `ino`; `write` is whether the caller asked for write access.
    pub fn open(&self, ino: u64, write: bool) -> Result<u64> {
        if write {
            return Err(FsError::ReadOnly {
                op: "open for write",
            });
        }
        let span = match self.target(ino)? {
            Target::Root | Target::SamplesDir => return Err(FsError::IsADirectory { ino }),
            Target::ShardNode(id) => match self.shard_tree.get(id) {
                Some(Node::Leaf(ShardLeaf::Index)) => Span::Index,
                Some(Node::Leaf(ShardLeaf::Shard(s))) => Span::Shard {
                    shard: *s,
                    base: 0,
                    len: self.shards[*s].bytes,
                },
                Some(Node::Dir(_)) => return Err(FsError::IsADirectory { ino }),
                None => return Err(FsError::UnknownInode { ino }),
            },
            Target::PathNode(id) => match self.path_tree()?.get(id) {
                Some(Node::Leaf(part)) => Span::Part(*part),
                Some(Node::Dir(_)) => return Err(FsError::IsADirectory { ino }),
                None => return Err(FsError::UnknownInode { ino }),
            },
            Target::SampleColumn { sample, column } => Span::Sample { sample, column },
        };
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.open
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                fh,
                Arc::new(OpenFile {
                    span,
                    data: Mutex::new(None),
                }),
            );
        Ok(fh)
    }

    fn open_file(&self, fh: u64) -> Result<Arc<OpenFile>> {
        self.open
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle { fh })
    }

    /// The shard bytes behind an open file (fetched on first use, then kept, pinned, until the
    /// file is released); `None` for the index, which is in memory.
    fn open_data(&self, file: &OpenFile) -> Result<Option<OpenData>> {
        let mut slot = lock(&file.data);
        if let Some(d) = slot.as_ref() {
            return Ok(Some(d.clone()));
        }
        let d = match file.span {
            Span::Index => return Ok(None),
            Span::Shard { shard, base, len } => (self.shard_data(shard)?, base, len),
            Span::Sample { sample, column } => {
                let (shard, base, len) = self.column_span(sample, column)?;
                (self.shard_data(shard)?, base, len)
            }
            Span::Part(Part { shard, base, len }) => (self.shard_data(shard)?, base, len),
        };
        *slot = Some(d.clone());
        Ok(Some(d))
    }

    /// Whether the kernel can read open file `fh` directly from a plain file (FUSE
    /// passthrough): for a whole shard of `shards/` its decompressed file in the node cache once
    /// complete (the shard is fetched first if needed, and stays pinned until `fh` is
    /// released); never for the index and `samples/` files (parts of a shard).
    pub fn backing_file(&self, fh: u64) -> Result<Backing> {
        let file = self.open_file(fh)?;
        if !matches!(file.span, Span::Shard { .. }) {
            return Ok(Backing::Never);
        }
        let Some((data, base, len)) = self.open_data(&file)? else {
            return Ok(Backing::Never);
        };
        let Some(path) = data.path() else {
            return Ok(Backing::NotNow);
        };
        // The file must be the span exactly: a byte more or less would show through.
        if base != 0 || data.len() != len {
            return Ok(Backing::NotNow);
        }
        match std::fs::File::open(path) {
            Ok(f) if f.metadata().is_ok_and(|m| m.len() == len) => Ok(Backing::File(f)),
            Ok(_) => {
                tracing::warn!(path = %path.display(), "cached shard file changed size; reading through the daemon");
                Ok(Backing::NotNow)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot open the cached shard file; reading through the daemon");
                Ok(Backing::NotNow)
            }
        }
    }

    /// Reads up to `size` bytes at `offset` of open file `fh`; fewer only at the end of file.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; size as usize];
        let n = self.read_into(fh, offset, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Reads into `buf` (up to its length) at `offset` of open file `fh`; returns how many
    /// bytes it read, fewer only at the end of file. One copy, from the shard file into `buf`:
    /// the adapter passes a buffer it reuses, so a read allocates and zeroes nothing.
    pub fn read_into(&self, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let file = self.open_file(fh)?;
        let Some((data, base, len)) = self.open_data(&file)? else {
            let bytes = self.source.index_json();
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let n = buf.len().min(bytes.len() - start);
            buf[..n].copy_from_slice(&bytes[start..start + n]);
            return Ok(n);
        };
        if offset >= len {
            return Ok(0);
        }
        let want = (len - offset).min(buf.len() as u64) as usize;
        Ok(data.read_full_at(base + offset, &mut buf[..want])?)
    }

    /// Forgets open file `fh` (its shard may stay pinned among the recently used ones).
    pub fn release(&self, fh: u64) {
        self.open
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh);
    }

    /// Figures for `statfs`.
    pub fn statfs(&self) -> StatFs {
        let bytes = self.shards.iter().map(|s| s.bytes).sum();
        let files = (self.shard_tree.len() as u64)
            .saturating_add(self.num_samples().saturating_mul(self.columns.len() as u64));
        StatFs {
            bytes,
            files,
            name_max: 255,
        }
    }

    /// Any change is refused: the one answer of every write-side operation.
    pub fn refuse(&self, op: &'static str) -> FsError {
        FsError::ReadOnly { op }
    }
}

#[cfg(test)]
mod tests;
