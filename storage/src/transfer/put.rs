//! Uploads of local files: one PUT for small files, a parallel multipart upload for large ones.
//!
//! Both are atomic on every store: a multipart object appears only when the upload is
//! completed, and a failed upload is aborted so that no parts linger (and cost).

use std::path::Path as FsPath;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStoreExt, PutPayload};
use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::get::{add, cancelled};
use crate::error::{Result, StorageError};
use crate::location::Location;

impl Location {
    /// Uploads the local file `local` to `rel`, replacing any object there. Files larger than
    /// the part size go up as a multipart upload with `concurrency` parts in flight; memory
    /// is bounded by `concurrency x part size`. Returns the size.
    pub async fn upload_file(&self, local: &FsPath, rel: &str) -> Result<u64> {
        let permits = Arc::new(Semaphore::new(self.options().concurrency.max(1)));
        self.upload_with(local, rel, permits, None).await
    }

    /// [`Self::upload_file`] drawing part permits from `permits`.
    pub(crate) async fn upload_with(
        &self,
        local: &FsPath,
        rel: &str,
        permits: Arc<Semaphore>,
        progress: Option<&AtomicU64>,
    ) -> Result<u64> {
        let path = self.path(rel)?;
        let len = tokio::fs::metadata(local)
            .await
            .map_err(|e| StorageError::io(local, e))?
            .len();
        let part = self.options().part_size_for(len);
        if len <= part as u64 {
            self.put_small(local, rel, &path, len, permits, progress)
                .await
        } else {
            self.put_multipart_file(local, rel, &path, len, part, permits, progress)
                .await
        }
    }

    async fn put_small(
        &self,
        local: &FsPath,
        rel: &str,
        path: &Path,
        len: u64,
        permits: Arc<Semaphore>,
        progress: Option<&AtomicU64>,
    ) -> Result<u64> {
        let _permit = permits
            .acquire_owned()
            .await
            .map_err(|_| cancelled(self, rel))?;
        let data = tokio::fs::read(local)
            .await
            .map_err(|e| StorageError::io(local, e))?;
        check_unchanged(local, len, data.len() as u64)?;
        self.store()
            .put(path, PutPayload::from(Bytes::from(data)))
            .await
            .map_err(|e| self.backend_error(rel, e))?;
        add(progress, len);
        Ok(len)
    }

    #[allow(clippy::too_many_arguments)]
    async fn put_multipart_file(
        &self,
        local: &FsPath,
        rel: &str,
        path: &Path,
        len: u64,
        part: usize,
        permits: Arc<Semaphore>,
        progress: Option<&AtomicU64>,
    ) -> Result<u64> {
        let mut upload = self
            .store()
            .put_multipart(path)
            .await
            .map_err(|e| self.backend_error(rel, e))?;
        let sent = self
            .send_parts(upload.as_mut(), local, rel, len, part, permits, progress)
            .await;
        match sent {
            Ok(sent) => {
                upload
                    .complete()
                    .await
                    .map_err(|e| self.backend_error(rel, e))?;
                tracing::debug!(url = %self.url_of(rel), bytes = sent, part, "multipart upload complete");
                Ok(sent)
            }
            Err(e) => {
                if let Err(abort) = upload.abort().await {
                    tracing::warn!(url = %self.url_of(rel), error = %crate::redact::scrub(abort), "cannot abort multipart upload");
                }
                Err(e)
            }
        }
    }

    /// Reads `local` part by part and hands each to the upload. Parts run as tasks, so they
    /// progress (and release their permits) while this loop waits for a permit.
    #[allow(clippy::too_many_arguments)]
    async fn send_parts(
        &self,
        upload: &mut dyn MultipartUpload,
        local: &FsPath,
        rel: &str,
        len: u64,
        part: usize,
        permits: Arc<Semaphore>,
        progress: Option<&AtomicU64>,
    ) -> Result<u64> {
        let mut file = tokio::fs::File::open(local)
            .await
            .map_err(|e| StorageError::io(local, e))?;
        let concurrency = self.options().concurrency.max(1);
        let mut tasks: JoinSet<(u64, object_store::Result<()>)> = JoinSet::new();
        let mut sent = 0u64;
        while sent < len {
            let n = usize::try_from(len - sent).map_or(part, |left| left.min(part));
            let permit = Arc::clone(&permits)
                .acquire_owned()
                .await
                .map_err(|_| cancelled(self, rel))?;
            let mut buf = vec![0u8; n];
            file.read_exact(&mut buf)
                .await
                .map_err(|e| StorageError::io(local, e))?;
            let request = upload.put_part(PutPayload::from(Bytes::from(buf)));
            tasks.spawn(async move {
                let result = request.await;
                drop(permit);
                (n as u64, result)
            });
            sent += n as u64;
            while tasks.len() >= concurrency {
                self.join_part(&mut tasks, rel, progress).await?;
            }
        }
        while !tasks.is_empty() {
            self.join_part(&mut tasks, rel, progress).await?;
        }
        // A file that grew while being read would be uploaded truncated.
        let now = tokio::fs::metadata(local)
            .await
            .map_err(|e| StorageError::io(local, e))?
            .len();
        check_unchanged(local, len, now)?;
        Ok(sent)
    }

    async fn join_part(
        &self,
        tasks: &mut JoinSet<(u64, object_store::Result<()>)>,
        rel: &str,
        progress: Option<&AtomicU64>,
    ) -> Result<()> {
        match tasks.join_next().await {
            Some(Ok((n, Ok(())))) => {
                add(progress, n);
                Ok(())
            }
            Some(Ok((_, Err(e)))) => Err(self.backend_error(rel, e)),
            Some(Err(join)) => Err(StorageError::Backend {
                url: self.url_of(rel),
                source: object_store::Error::JoinError { source: join },
            }),
            None => Ok(()),
        }
    }
}

fn check_unchanged(local: &FsPath, expected: u64, actual: u64) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(StorageError::SizeMismatch {
            url: local.display().to_string(),
            expected,
            actual,
        })
    }
}
