//! [`DatasetSource`] over the streamer: shards come through the node cache
//! (`<cache-root>/<run-id>/<node-rank>/`), fetched once per node, decompressed, and pinned while
//! a reader holds them.

use std::path::Path;
use std::sync::Arc;

use shardstream_streamer::dataset::{
    SampleFile, ShardFormat, ShardHandle, ShardInfo, StreamingDataset,
};
use shardstream_streamer::StreamerError;

use crate::error::{SourceError, SourceErrorKind};
use crate::source::{DatasetSource, ShardData};

/// A [`StreamingDataset`] as the filesystem's source.
#[derive(Debug, Clone)]
pub struct StreamingSource {
    dataset: StreamingDataset,
    cache_limit: Option<u64>,
    /// What the mount's `index.json` serves: the dataset's, byte for byte (fetched here when
    /// the dataset was opened from its `index.ssx`).
    index_json: Arc<[u8]>,
}

impl StreamingSource {
    /// Wraps `dataset`; `cache_limit` is its disk budget (read-ahead stays within half of it).
    /// Fails when the dataset's `index.json` cannot be read.
    pub fn new(
        dataset: StreamingDataset,
        cache_limit: Option<u64>,
    ) -> Result<Self, shardstream_streamer::StreamerError> {
        // A tar set has no index file: the streamer's summary of its tars is not shown.
        let index_json = match dataset.shard_format(0) {
            Some(ShardFormat::WebDataset) => Arc::from(&[][..]),
            _ => dataset.index_json()?,
        };
        Ok(StreamingSource {
            dataset,
            cache_limit,
            index_json,
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &StreamingDataset {
        &self.dataset
    }
}

/// The kind of a streamer error, for its errno.
pub fn kind_of(e: &StreamerError) -> SourceErrorKind {
    match e {
        StreamerError::Storage(_)
        | StreamerError::NotFound { .. }
        | StreamerError::FetchFailed { .. } => SourceErrorKind::Unavailable,
        StreamerError::Corrupt { .. }
        | StreamerError::HashMismatch { .. }
        | StreamerError::Format(_) => SourceErrorKind::Corrupt,
        StreamerError::BudgetExceeded { .. } | StreamerError::LimitTooSmall { .. } => {
            SourceErrorKind::NoSpace
        }
        StreamerError::Cache(_) | StreamerError::Io { .. } | StreamerError::Engine(_) => {
            SourceErrorKind::Io
        }
        // Configuration and range errors, and variants added later: the request is invalid.
        _ => SourceErrorKind::Invalid,
    }
}

struct Handle(ShardHandle);

impl ShardData for Handle {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, SourceError> {
        self.0
            .read_at(offset, buf)
            .map_err(|e| SourceError::new(kind_of(&e), self.0.shard(), e))
    }

    // The handle's file is the whole decompressed shard (its header was checked against the
    // file's length), pinned in the cache while the handle lives; but only once its download
    // is done: before that, the tail of the file is not written yet.
    fn path(&self) -> Option<&Path> {
        self.0.is_complete().then(|| self.0.path())
    }
}

impl DatasetSource for StreamingSource {
    fn index_json(&self) -> &[u8] {
        &self.index_json
    }

    fn open_shard(&self, shard: usize) -> Result<Arc<dyn ShardData>, SourceError> {
        match self.dataset.shard(shard) {
            Ok(h) => Ok(Arc::new(Handle(h))),
            Err(e) => Err(SourceError::new(kind_of(&e), shard, e)),
        }
    }

    fn readahead_budget(&self) -> Option<u64> {
        self.cache_limit
    }

    // An MDS dataset is named by its index (fixed-size columns sized without a fetch); a
    // dataset with any other shard is listed from the streamer's shard infos.
    fn listing(&self) -> Option<Vec<ShardInfo>> {
        let ds = &self.dataset;
        let all_mds = (0..ds.num_shards()).all(|s| ds.shard_format(s) == Some(ShardFormat::Mds));
        if all_mds {
            return None;
        }
        Some(
            (0..ds.num_shards())
                .filter_map(|s| ds.shard_info(s))
                .collect(),
        )
    }

    fn sample_files(&self, shard: usize) -> Result<Vec<Vec<SampleFile>>, SourceError> {
        let to_source = |e: StreamerError| SourceError::new(kind_of(&e), shard, e);
        self.dataset
            .shard(shard)
            .and_then(|h| h.sample_files())
            .map_err(to_source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_that_failed_after_its_retries_is_unavailable_not_invalid() {
        // EIO-after-retries for the reader, and the mount keeps serving once the server is back.
        let failed = StreamerError::FetchFailed {
            what: "s3://b/shard.00000.mds".into(),
            reason: "connection refused".into(),
            transient: true,
        };
        assert_eq!(kind_of(&failed), SourceErrorKind::Unavailable);
    }
}
