//! Streaming upload of one file: bytes are checksummed as they arrive, cut into parts, and each
//! full part is sent in the background while the next one fills. A file no larger than one part
//! goes up in a single PUT; a larger one as a multipart upload that is aborted on any error (or
//! when the writer is dropped unfinished), so no committed name ever points at a partial object.
//! A writer told the file's size up front ([`FileWriter::with_expected_size`]) plans it: one PUT
//! up to [`crate::UploadConfig::single_put_max`], else parts of even size (no small last part).

use crate::budget::{BudgetPermit, ByteBudget, RateLimiter};
use crate::checksum::{combine_parts, Crc32c};
use crate::error::{CheckpointError, Result};
use crate::manifest::FileRecord;
use crate::metrics::{add, CheckpointMetrics};
use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, PutOptions, PutPayload};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// What every file writer of one rank shares.
#[derive(Debug)]
pub(crate) struct Uploader {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) part_size: u64,
    /// [`crate::UploadConfig::effective_single_put_max`].
    pub(crate) single_put_max: u64,
    pub(crate) budget: ByteBudget,
    pub(crate) requests: Arc<Semaphore>,
    pub(crate) limiter: Option<RateLimiter>,
    pub(crate) metrics: Arc<CheckpointMetrics>,
}

impl Uploader {
    /// Waits for the rate cap and a request slot.
    async fn request_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        if let Some(l) = &self.limiter {
            l.acquire().await;
        }
        self.requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| CheckpointError::InvalidConfig("request limiter closed".into()))
    }
}

/// Writes one file of a checkpoint. Obtain one from [`crate::RankWriter::create`], feed it with
/// [`FileWriter::write`], [`FileWriter::write_bytes`] or [`FileWriter::write_from`], then call
/// [`FileWriter::finish`] for its [`FileRecord`].
///
/// Each open writer holds at most one partly filled part buffer (for a file planned as one PUT,
/// the whole file), so when one task writes to several writers in turn, the byte budget must
/// hold one such buffer per open writer.
#[derive(Debug)]
pub struct FileWriter {
    up: Arc<Uploader>,
    path: Path,
    rel: String,
    rank: Option<u32>,
    /// This file's part size (the rank's, unless [`FileWriter::with_part_size`] changed it).
    part_size: u64,
    /// The part being filled: frozen pieces, then an owned tail.
    chunks: Vec<Bytes>,
    tail: BytesMut,
    cur_len: u64,
    cur_crc: Crc32c,
    permit: Option<BudgetPermit>,
    parts: Vec<(u32, u64)>,
    size: u64,
    upload: Option<Box<dyn MultipartUpload>>,
    in_flight: JoinSet<Result<()>>,
    poisoned: bool,
}

impl FileWriter {
    pub(crate) fn new(up: Arc<Uploader>, path: Path, rel: String, rank: Option<u32>) -> Self {
        Self {
            part_size: up.part_size,
            up,
            path,
            rel,
            rank,
            chunks: Vec::new(),
            tail: BytesMut::new(),
            cur_len: 0,
            cur_crc: Crc32c::new(),
            permit: None,
            parts: Vec::new(),
            size: 0,
            upload: None,
            in_flight: JoinSet::new(),
            poisoned: false,
        }
    }

    /// Uses `part_size` for this file instead of the rank's (before anything is written):
    /// a caller that knows a file will be a little larger than one part (a part-sized tensor
    /// and its `torch.save` framing) lets it go up in one PUT instead of a two-part upload.
    /// Its buffer still comes out of the rank's budget.
    pub fn with_part_size(mut self, part_size: u64) -> Result<Self> {
        if !(1024..=crate::config::S3_MAX_PART_SIZE).contains(&part_size) {
            return Err(CheckpointError::InvalidConfig(format!(
                "part_size {part_size} is outside 1 KiB..=5 GiB"
            )));
        }
        if self.size > 0 {
            return Err(CheckpointError::InvalidConfig(format!(
                "{}: the part size is fixed once bytes are written",
                self.path
            )));
        }
        self.part_size = part_size;
        Ok(self)
    }

    /// Plans the upload of a file of about `size` bytes (before anything is written): up to the
    /// single-PUT bound ([`crate::UploadConfig::single_put_max`], within the budget) it goes up
    /// in one PUT, beyond it in parts of even size. `size` should not be an underestimate: bytes
    /// past it still upload correctly, but as one more part (or a multipart upload instead of
    /// the single PUT).
    pub fn with_expected_size(self, size: u64) -> Result<Self> {
        let part = planned_part_size(size, self.up.part_size, self.up.single_put_max);
        self.with_part_size(part)
    }

    /// The object this writer creates.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.size
    }

    /// Appends a copy of `data`.
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        self.check()?;
        while !data.is_empty() {
            let room = self.make_room().await?;
            let n = usize::try_from(room).unwrap_or(usize::MAX).min(data.len());
            let (head, rest) = data.split_at(n);
            if self.tail.capacity() - self.tail.len() < n {
                // Reserve the rest of the part at once so a part is at most one allocation.
                self.tail
                    .reserve(usize::try_from(room).unwrap_or(usize::MAX).max(n));
            }
            self.tail.extend_from_slice(head);
            self.account(head);
            data = rest;
        }
        Ok(())
    }

    /// Appends `data` without copying it (the part holds a reference until it is uploaded).
    pub async fn write_bytes(&mut self, mut data: Bytes) -> Result<()> {
        self.check()?;
        while !data.is_empty() {
            let room = self.make_room().await?;
            let n = usize::try_from(room).unwrap_or(usize::MAX).min(data.len());
            let head = data.split_to(n);
            if !self.tail.is_empty() {
                let tail = self.tail.split().freeze();
                self.chunks.push(tail);
            }
            self.account(&head);
            self.chunks.push(head);
        }
        Ok(())
    }

    /// Appends everything `reader` yields until EOF, reading straight into part buffers.
    pub async fn write_from<R: AsyncRead + Unpin>(&mut self, reader: &mut R) -> Result<()> {
        self.check()?;
        loop {
            let room = self.make_room().await?;
            let room = usize::try_from(room).unwrap_or(usize::MAX);
            if self.tail.capacity() - self.tail.len() < room {
                self.tail.reserve(room);
            }
            let start = self.tail.len();
            let mut limited = (&mut *reader).take(room as u64);
            let n = match limited.read_buf(&mut self.tail).await {
                Ok(n) => n,
                Err(source) => {
                    self.fail().await;
                    return Err(CheckpointError::Source {
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            if n == 0 {
                return Ok(());
            }
            let Self { tail, cur_crc, .. } = self;
            if let Some(new) = tail.get(start..start + n) {
                cur_crc.update(new);
            }
            self.cur_len += n as u64;
            self.size += n as u64;
        }
    }

    /// Uploads what is left, completes the upload and returns the file's record.
    pub async fn finish(mut self) -> Result<FileRecord> {
        self.check()?;
        match self.finish_inner().await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.fail().await;
                Err(e)
            }
        }
    }

    async fn finish_inner(&mut self) -> Result<FileRecord> {
        let record = if self.upload.is_none() {
            let payload = self.take_payload();
            let crc = self.cur_crc.value();
            let _slot = self.up.request_slot().await?;
            add(&self.up.metrics.put_requests, 1);
            self.up
                .store
                .put_opts(&self.path, payload, PutOptions::default())
                .await
                .map_err(|e| CheckpointError::store("put", &self.path, e))?;
            self.permit = None;
            add(&self.up.metrics.bytes_written, self.size);
            FileRecord {
                path: self.rel.clone(),
                size: self.size,
                crc32c: crc,
                part_size: 0,
                parts: Vec::new(),
                rank: self.rank,
            }
        } else {
            if self.cur_len > 0 {
                self.seal_part().await?;
            }
            while let Some(joined) = self.in_flight.join_next().await {
                flatten(joined, &self.path)?;
            }
            if let Some(upload) = self.upload.as_mut() {
                upload
                    .complete()
                    .await
                    .map_err(|e| CheckpointError::store("complete", &self.path, e))?;
            }
            self.upload = None;
            FileRecord {
                path: self.rel.clone(),
                size: self.size,
                crc32c: combine_parts(self.parts.iter().copied()),
                part_size: self.part_size,
                parts: self.parts.iter().map(|(c, _)| *c).collect(),
                rank: self.rank,
            }
        };
        add(&self.up.metrics.files_written, 1);
        debug!(path = %self.path, size = record.size, parts = record.parts.len(), "uploaded");
        Ok(record)
    }

    fn check(&self) -> Result<()> {
        if self.poisoned {
            return Err(CheckpointError::Aborted {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    fn account(&mut self, data: &[u8]) {
        self.cur_crc.update(data);
        self.cur_len += data.len() as u64;
        self.size += data.len() as u64;
    }

    /// Bytes that fit in the current part, sealing a full part first (only once more data is
    /// known to follow, so a file of exactly one part stays a single PUT) and taking budget for
    /// a new part when none is held.
    async fn make_room(&mut self) -> Result<u64> {
        if self.cur_len >= self.part_size {
            if let Err(e) = self.seal_part().await {
                self.fail().await;
                return Err(e);
            }
        }
        if self.permit.is_none() {
            self.permit = Some(self.up.budget.acquire(self.part_size).await?);
        }
        Ok(self.part_size - self.cur_len)
    }

    fn take_payload(&mut self) -> PutPayload {
        if !self.tail.is_empty() {
            let tail = self.tail.split().freeze();
            self.chunks.push(tail);
        }
        // Release the spare capacity reserved for this part.
        self.tail = BytesMut::new();
        std::mem::take(&mut self.chunks).into_iter().collect()
    }

    async fn seal_part(&mut self) -> Result<()> {
        let len = self.cur_len;
        let payload = self.take_payload();
        let crc = std::mem::take(&mut self.cur_crc).value();
        self.cur_len = 0;
        self.parts.push((crc, len));
        let permit = self.permit.take();
        if self.upload.is_none() {
            add(&self.up.metrics.put_requests, 1);
            let upload = self
                .up
                .store
                .put_multipart_opts(&self.path, Default::default())
                .await
                .map_err(|e| CheckpointError::store("create_multipart", &self.path, e))?;
            self.upload = Some(upload);
        }
        // Surface a failed part early instead of at finish.
        while let Some(joined) = self.in_flight.try_join_next() {
            flatten(joined, &self.path)?;
        }
        let slot = self.up.request_slot().await?;
        let Some(upload) = self.upload.as_mut() else {
            return Err(CheckpointError::InvalidConfig(
                "multipart upload vanished".into(),
            ));
        };
        add(&self.up.metrics.put_requests, 1);
        let fut = upload.put_part(payload);
        let path = self.path.clone();
        let metrics = self.up.metrics.clone();
        self.in_flight.spawn(async move {
            let r = fut.await;
            drop(slot);
            drop(permit);
            r.map_err(|e| CheckpointError::store("put_part", &path, e))?;
            add(&metrics.bytes_written, len);
            Ok(())
        });
        Ok(())
    }

    /// Stops everything and aborts the multipart upload.
    async fn fail(&mut self) {
        self.poisoned = true;
        self.in_flight.abort_all();
        while self.in_flight.join_next().await.is_some() {}
        self.chunks.clear();
        self.tail = BytesMut::new();
        self.permit = None;
        if let Some(mut upload) = self.upload.take() {
            add(&self.up.metrics.uploads_aborted, 1);
            if let Err(e) = upload.abort().await {
                warn!(path = %self.path, error = %e, "aborting the multipart upload failed; a bucket lifecycle rule will reap it");
            }
        }
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        if let Some(mut upload) = self.upload.take() {
            add(&self.up.metrics.uploads_aborted, 1);
            self.in_flight.abort_all();
            let path = self.path.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn(async move {
                        if let Err(e) = upload.abort().await {
                            warn!(path = %path, error = %e, "aborting a dropped multipart upload failed");
                        }
                    });
                }
                Err(_) => {
                    warn!(path = %path, "multipart upload dropped outside a runtime; not aborted")
                }
            }
        }
    }
}

/// The part size for a file of `size` bytes, with the rank's `part_size` and single-PUT bound:
/// - at most `part_size`: `part_size` (one PUT, as without a plan);
/// - at most `single_put_max`: `size`, so the whole file is one part, i.e. one PUT;
/// - larger: `n = ceil(size / part_size)` parts of `ceil(size / n)` bytes (never above
///   `part_size`), so a file just over a multiple of the part size, such as a part-sized tensor
///   with its framing, has no tiny last part; never below S3's 5 MiB minimum part unless
///   `part_size` itself is below it.
pub(crate) fn planned_part_size(size: u64, part_size: u64, single_put_max: u64) -> u64 {
    let part_size = part_size.max(1);
    if size <= part_size {
        return part_size;
    }
    if size <= single_put_max {
        return size;
    }
    let n = size.div_ceil(part_size);
    // ceil(size / n) is above part_size / 2; S3 wants 5 MiB of every part but the last.
    let floor = if part_size >= crate::config::S3_MIN_PART_SIZE {
        crate::config::S3_MIN_PART_SIZE
    } else {
        1024
    };
    size.div_ceil(n).max(floor).min(part_size)
}

fn flatten(joined: Result<Result<()>, tokio::task::JoinError>, path: &Path) -> Result<()> {
    match joined {
        Ok(r) => r,
        Err(source) => Err(CheckpointError::Store {
            op: "put_part",
            path: path.clone(),
            source: object_store::Error::JoinError { source },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::planned_part_size;
    use crate::config::MIB;
    use crate::{CheckpointRoot, UploadConfig};
    use bytes::Bytes;
    use object_store::{memory::InMemory, path::Path, ObjectStoreExt};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_file_part_size_keeps_a_slightly_larger_file_in_one_put() {
        let root = CheckpointRoot::new(Arc::new(InMemory::new()), Path::from("r"));
        let attempt = root.begin_save("step_1").await.unwrap();
        let config = UploadConfig {
            part_size: 1024,
            memory_budget: 4096,
            ..Default::default()
        };
        let w = root.rank_writer(&attempt, 0, &config).unwrap();
        let data = Bytes::from(vec![7u8; 1100]);

        let mut two_parts = w.create("a").unwrap();
        two_parts.write_bytes(data.clone()).await.unwrap();
        assert_eq!(two_parts.finish().await.unwrap().parts.len(), 2);

        let mut one_put = w.create("b").unwrap().with_part_size(2048).unwrap();
        one_put.write_bytes(data.clone()).await.unwrap();
        let rec = one_put.finish().await.unwrap();
        assert!(rec.parts.is_empty() && rec.size == 1100, "{rec:?}");

        let mut started = w.create("c").unwrap();
        started.write(b"x").await.unwrap();
        assert!(started.with_part_size(2048).is_err());
        assert!(w.create("d").unwrap().with_part_size(10).is_err());
    }

    #[test]
    fn the_plan_puts_up_to_the_bound_in_one_put_and_splits_the_rest_evenly() {
        let (part, put_max) = (64 * MIB, 136 * MIB);
        // Up to a part: unchanged (one PUT as ever).
        assert_eq!(planned_part_size(0, part, put_max), part);
        assert_eq!(planned_part_size(part, part, put_max), part);
        // A 128 MiB tensor with its framing: one PUT, not 64 + 64 MiB + a tiny part.
        let tensor = 128 * MIB + 1500;
        assert_eq!(planned_part_size(tensor, part, put_max), tensor);
        assert_eq!(planned_part_size(put_max, part, put_max), put_max);
        // Past the bound: even parts, none tiny, none above the part size.
        let big = 256 * MIB + 1500;
        let p = planned_part_size(big, part, put_max);
        assert_eq!(big.div_ceil(p), 5);
        assert!(p <= part && big - 4 * p >= p - 4, "{p}");
        // Turned off (or a budget smaller than the file): the even split.
        assert_eq!(planned_part_size(tensor, part, 0), tensor.div_ceil(3));
        // Never below S3's minimum part (a small part size keeps its own).
        assert_eq!(planned_part_size(8 * MIB + 1, 8 * MIB, 0), 5 * MIB);
        assert_eq!(planned_part_size(4097, 4096, 0), 2049);
        let p = planned_part_size(u64::MAX, part, put_max);
        assert!((5 * MIB..=part).contains(&p), "{p}");
    }

    #[tokio::test]
    async fn an_expected_size_makes_one_put_within_the_budget_and_even_parts_beyond() {
        let root = CheckpointRoot::new(Arc::new(InMemory::new()), Path::from("r"));
        let attempt = root.begin_save("step_1").await.unwrap();
        let config = UploadConfig {
            part_size: 2048,
            memory_budget: 8192,
            single_put_max: 5000,
            ..Default::default()
        };
        let w = root.rank_writer(&attempt, 0, &config).unwrap();
        let data = Bytes::from((0..3100u32).map(|i| i as u8).collect::<Vec<u8>>());

        // Unplanned: 2048 + 1052.
        let mut plain = w.create("a").unwrap();
        plain.write_bytes(data.clone()).await.unwrap();
        let rec = plain.finish().await.unwrap();
        assert_eq!((rec.parts.len(), rec.part_size), (2, 2048));

        // Planned, within the bound: one PUT.
        let rec = w.upload_bytes("b", data.clone()).await.unwrap();
        assert!(rec.parts.is_empty() && rec.size == 3100, "{rec:?}");

        // Past the bound: four even parts of 1750 bytes, not 3 x 2048 + 856.
        let mut even = w.create("c").unwrap().with_expected_size(7000).unwrap();
        even.write(&[3u8; 7000]).await.unwrap();
        let rec = even.finish().await.unwrap();
        assert_eq!((rec.parts.len(), rec.part_size), (4, 1750));

        // An estimate that falls short still uploads every byte (as a second part).
        let mut short = w.create("d").unwrap().with_expected_size(3000).unwrap();
        let path = short.path().clone();
        short.write(&data).await.unwrap();
        let rec = short.finish().await.unwrap();
        assert_eq!((rec.size, rec.parts.len(), rec.part_size), (3100, 2, 3000));
        let got = root
            .store()
            .get(&path)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(got, data);

        // A budget smaller than the bound caps it.
        let small = UploadConfig {
            memory_budget: 4096,
            ..config
        };
        let w = root.rank_writer(&attempt, 1, &small).unwrap();
        let rec = w
            .upload_bytes("e", Bytes::from(vec![1u8; 4500]))
            .await
            .unwrap();
        assert_eq!((rec.parts.len(), rec.part_size), (3, 1500));
    }
}
