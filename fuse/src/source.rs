//! What the filesystem reads from: a dataset's index and its shards' decompressed bytes.
//!
//! [`DatasetSource`] is the seam between the filesystem logic and the streamer: the mount uses
//! [`StreamingSource`](crate::StreamingSource) (fetch through the node cache under its budget),
//! tests use in-memory doubles.

use std::path::Path;
use std::sync::Arc;

use shardstream_streamer::dataset::{SampleFile, ShardInfo};

use crate::error::{SourceError, SourceErrorKind};

/// One shard's decompressed bytes, available while the value lives (the cache keeps it pinned).
pub trait ShardData: Send + Sync {
    /// The decompressed size in bytes.
    fn len(&self) -> u64;

    /// Whether the shard holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at the end).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, SourceError>;

    /// A plain file that holds exactly these bytes, complete now and unchanged while the value
    /// lives (the decompressed shard in the node cache), if there is one: the mount can then
    /// let the kernel read it directly (FUSE passthrough) instead of copying every read through
    /// the daemon. `None` (the default) for bytes that exist only in memory, and for a shard
    /// still being downloaded (its reads wait for their bytes; the file's do not).
    fn path(&self) -> Option<&Path> {
        None
    }

    /// Fills `buf` from `offset` up to the end of the shard; returns how many bytes it read.
    fn read_full_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, SourceError> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(offset + done as u64, &mut buf[done..])?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }
}

/// A dataset as the filesystem sees it.
pub trait DatasetSource: Send + Sync {
    /// The bytes of the dataset's `index.json` (of the chosen split).
    fn index_json(&self) -> &[u8];

    /// Fetches shard `shard` if needed (blocking) and returns its decompressed bytes.
    fn open_shard(&self, shard: usize) -> Result<Arc<dyn ShardData>, SourceError>;

    /// Bytes the source may hold for read-ahead beyond what readers hold (the cache budget), if
    /// it has a limit; read-ahead never asks for more.
    fn readahead_budget(&self) -> Option<u64>;

    /// The shards of a dataset that is not MDS (WebDataset tars, LitData chunks), in order:
    /// [`ShardInfo::raw_file`] names a shard in `shards/`, `raw_bytes` is its size as
    /// [`Self::open_shard`] serves it, `samples` its sample count. `None` (the default): the
    /// dataset is MDS and [`Self::index_json`] names everything.
    fn listing(&self) -> Option<Vec<ShardInfo>> {
        None
    }

    /// Every sample's fields of shard `shard` of a listed dataset ([`Self::listing`]), named,
    /// with their byte ranges in the bytes [`Self::open_shard`] serves. Fetches the shard.
    fn sample_files(&self, shard: usize) -> Result<Vec<Vec<SampleFile>>, SourceError> {
        Err(SourceError::new(
            SourceErrorKind::Invalid,
            shard,
            "this source lists no sample files",
        ))
    }
}

/// Shard bytes held in memory (test doubles, small local datasets).
#[derive(Debug, Clone)]
pub struct MemoryShard(pub Arc<Vec<u8>>);

impl ShardData for MemoryShard {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, SourceError> {
        let data = self.0.as_slice();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }
}
