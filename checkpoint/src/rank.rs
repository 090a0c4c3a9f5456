//! One rank's side of a save: its files go up in parallel under the attempt directory, within
//! the byte budget, request cap and rate cap of its [`UploadConfig`].

use crate::budget::{ByteBudget, RateLimiter};
use crate::config::UploadConfig;
use crate::error::{CheckpointError, Result};
use crate::layout::{join, validate_attempt, validate_checkpoint_id, validate_relative_path};
use crate::manifest::FileRecord;
use crate::upload::{FileWriter, Uploader};
use crate::CheckpointRoot;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::AsyncRead;
use tokio::sync::Semaphore;
use tracing::{info_span, Instrument};

/// One save of one checkpoint id: the id and the attempt directory every rank writes into.
/// The coordinator makes it with [`CheckpointRoot::begin_save`] and sends both strings to the
/// other ranks, which rebuild it with [`SaveAttempt::new`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SaveAttempt {
    id: String,
    attempt: String,
}

impl SaveAttempt {
    /// Rebuilds an attempt from its two names (validated).
    pub fn new(id: impl Into<String>, attempt: impl Into<String>) -> Result<Self> {
        let (id, attempt) = (id.into(), attempt.into());
        validate_checkpoint_id(&id)?;
        validate_attempt(&attempt)?;
        Ok(Self { id, attempt })
    }

    /// The checkpoint id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The attempt directory name.
    pub fn attempt(&self) -> &str {
        &self.attempt
    }

    /// The path, relative to the checkpoint directory, of a file `name` of this attempt.
    pub fn relative_path(&self, name: &str) -> Result<String> {
        validate_relative_path(name)?;
        let rel = format!("{}/{name}", self.attempt);
        validate_relative_path(&rel)?;
        Ok(rel)
    }
}

/// Where a file's bytes come from, for [`RankWriter::upload_all`].
#[derive(Debug, Clone)]
pub enum UploadSource {
    /// Bytes already in memory (uploaded without a copy).
    Bytes(Bytes),
    /// A local file, streamed in part-sized reads.
    File(PathBuf),
}

/// Uploads one rank's files of one [`SaveAttempt`].
#[derive(Debug, Clone)]
pub struct RankWriter {
    up: Arc<Uploader>,
    dir: Path,
    attempt: SaveAttempt,
    rank: u32,
    max_files: usize,
}

impl RankWriter {
    pub(crate) fn new(
        root: &CheckpointRoot,
        attempt: &SaveAttempt,
        rank: u32,
        config: &UploadConfig,
    ) -> Result<Self> {
        config.validate()?;
        let up = Uploader {
            store: root.store().clone(),
            part_size: config.part_size,
            single_put_max: config.effective_single_put_max(),
            budget: ByteBudget::new(config.memory_budget),
            requests: Arc::new(Semaphore::new(config.max_concurrent_requests)),
            limiter: config.max_requests_per_second.map(RateLimiter::new),
            metrics: root.metrics().clone(),
        };
        // More files in flight than buffers would only queue on the budget.
        let buffers = usize::try_from(config.buffers_in_budget()).unwrap_or(usize::MAX);
        Ok(Self {
            up: Arc::new(up),
            dir: root.checkpoint_dir(attempt.id()),
            attempt: attempt.clone(),
            rank,
            max_files: config.max_concurrent_files.min(buffers).max(1),
        })
    }

    /// The rank this writer records in its files.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The attempt it writes into.
    pub fn attempt(&self) -> &SaveAttempt {
        &self.attempt
    }

    /// Starts a streaming upload of file `name` (relative to the attempt directory).
    pub fn create(&self, name: &str) -> Result<FileWriter> {
        let rel = self.attempt.relative_path(name)?;
        let path = join(&self.dir, &rel);
        Ok(FileWriter::new(self.up.clone(), path, rel, Some(self.rank)))
    }

    /// Uploads in-memory bytes as file `name` (its size is known, so it is planned: see
    /// [`FileWriter::with_expected_size`]).
    pub async fn upload_bytes(&self, name: &str, data: Bytes) -> Result<FileRecord> {
        let size = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let mut w = self.create(name)?.with_expected_size(size)?;
        let span = info_span!("checkpoint.upload", path = %w.path(), size = data.len());
        async move {
            w.write_bytes(data).await?;
            w.finish().await
        }
        .instrument(span)
        .await
    }

    /// Uploads everything `reader` yields as file `name`.
    pub async fn upload_reader<R: AsyncRead + Unpin>(
        &self,
        name: &str,
        mut reader: R,
    ) -> Result<FileRecord> {
        let mut w = self.create(name)?;
        let span = info_span!("checkpoint.upload", path = %w.path());
        async move {
            w.write_from(&mut reader).await?;
            w.finish().await
        }
        .instrument(span)
        .await
    }

    /// Uploads the local file `local` as file `name`.
    pub async fn upload_file(&self, name: &str, local: &std::path::Path) -> Result<FileRecord> {
        let rel = self.attempt.relative_path(name)?;
        let file =
            tokio::fs::File::open(local)
                .await
                .map_err(|source| CheckpointError::Source {
                    path: join(&self.dir, &rel),
                    source,
                })?;
        self.upload_reader(name, file).await
    }

    /// Uploads several files at once (at most `max_concurrent_files`, and no more than the
    /// budget has part buffers for). Records come back sorted by path. On the first error the
    /// remaining uploads are dropped, which aborts their multipart uploads.
    pub async fn upload_all(
        &self,
        files: impl IntoIterator<Item = (String, UploadSource)>,
    ) -> Result<Vec<FileRecord>> {
        let span = info_span!("checkpoint.rank_upload", id = %self.attempt.id(), rank = self.rank);
        async move {
            let mut records: Vec<FileRecord> = futures::stream::iter(files)
                .map(|(name, src)| async move {
                    match src {
                        UploadSource::Bytes(b) => self.upload_bytes(&name, b).await,
                        UploadSource::File(p) => self.upload_file(&name, &p).await,
                    }
                })
                .buffer_unordered(self.max_files)
                .try_collect()
                .await?;
            records.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(records)
        }
        .instrument(span)
        .await
    }
}
