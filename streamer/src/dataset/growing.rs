//! A file that this process is still writing, readable up to the prefix written so far.
//!
//! A download (or a streamed decompression) writes a shard into the cache's temp file and
//! publishes, through a [`Publisher`], how many bytes from the start are complete. Readers hold
//! a [`Growing`] and wait until the prefix covers the bytes they need, then `pread` the file:
//! so the first samples of a shard are served while the rest is still on its way. The temp file
//! is later renamed into the cache; an open descriptor survives the rename.
//!
//! A compressed shard is published as its decompressed output grows; the decoder starts once
//! the compressed file is complete (a decoder waiting for download chunks while holding its
//! window's share of the budget could starve those very chunks).
//!
//! A download of an uncompressed shard also shares its prefix with the other processes of the
//! node, through an extended attribute of its temp file (`cache::progress`): a process that finds
//! the shard's fetch lock taken joins the download ([`super::engine`]) instead of waiting for
//! the commit. A decompression's output is not shared: other processes wait on the fetch lock
//! for the complete file (`docs/cache.md`).

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

use crate::cache::{progress, ShardLease};
use crate::error::{Result, StreamerError};

/// How far a file has been written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Progress {
    /// The first `n` bytes are complete.
    Written(u64),
    /// Complete, checked and moved into the cache.
    Done,
    /// The writer gave up; the reason (and whether it was transient) is shown to every
    /// waiting reader.
    Failed(String, bool),
}

/// The writer's side: publishes the complete prefix. Dropped without [`Publisher::done`] (an
/// error, or a task cancelled at shutdown), it tells the readers the write failed.
#[derive(Debug)]
pub(crate) struct Publisher {
    tx: watch::Sender<Progress>,
    finished: AtomicBool,
    /// Whether the writer should share the prefix with other processes.
    share: bool,
    /// Once shared: the temp file whose progress attribute follows the prefix.
    shared: OnceLock<Arc<File>>,
    /// The prefix last written to the progress attribute.
    shared_prefix: AtomicU64,
}

/// How far the prefix grows between two writes of the progress attribute (after the first):
/// each is a journal transaction, and the other processes look for it once a millisecond.
const SHARE_STEP: u64 = 1 << 20;

/// The readers' side: waits for a prefix. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Growing {
    rx: watch::Receiver<Progress>,
    /// What is being written, for messages.
    what: Arc<str>,
}

/// A new pair for a file of which nothing is written yet.
pub(crate) fn channel(what: Arc<str>) -> (Publisher, Growing) {
    channel_with(what, false)
}

/// [`channel`] for a download whose prefix the other processes of the node may read
/// ([`Publisher::share_through`]).
pub(crate) fn shared_channel(what: Arc<str>) -> (Publisher, Growing) {
    channel_with(what, true)
}

fn channel_with(what: Arc<str>, share: bool) -> (Publisher, Growing) {
    let (tx, rx) = watch::channel(Progress::Written(0));
    (
        Publisher {
            tx,
            finished: AtomicBool::new(false),
            share,
            shared: OnceLock::new(),
            shared_prefix: AtomicU64::new(0),
        },
        Growing { rx, what },
    )
}

impl Publisher {
    /// Whether the download should share its prefix ([`Publisher::share_through`]).
    pub(crate) fn wants_sharing(&self) -> bool {
        self.share
    }

    /// From now on, each advance also sets the progress attribute of `file`, the temp file
    /// being written (`cache::progress`). Where the file system has no user attributes, the
    /// download is simply not shared.
    pub(crate) fn share_through(&self, file: Arc<File>) {
        let now = self.readable_now();
        match progress::write(&file, now) {
            Ok(()) => {
                self.shared_prefix.fetch_max(now, Ordering::Relaxed);
                let _ = self.shared.set(file);
            }
            Err(e) => tracing::debug!(error = %e, "download progress not shared"),
        }
    }

    fn readable_now(&self) -> u64 {
        match &*self.tx.borrow() {
            Progress::Written(n) => *n,
            _ => 0,
        }
    }

    /// The download's bytes are of object version `etag`: recorded on the shared temp file
    /// before its first byte (`cache::progress`), so that a process that finishes the download
    /// after this one dies asks for that version only. Nothing for a download not shared.
    pub(crate) fn record_version(&self, etag: &str) -> std::io::Result<()> {
        match self.shared.get() {
            Some(file) => progress::write_version(file, etag),
            None => Ok(()),
        }
    }

    /// The first `bytes` bytes are written. Never moves the prefix back. This process's
    /// readers see every advance; other processes (a shared download) see the first, then one
    /// per [`SHARE_STEP`] bytes, and every one with `last` set (the writer's last, which they
    /// must see).
    pub(crate) fn advance(&self, bytes: u64, last: bool) {
        let moved = self.tx.send_if_modified(|p| match p {
            Progress::Written(n) if *n < bytes => {
                *n = bytes;
                true
            }
            _ => false,
        });
        let Some(file) = self.shared.get().filter(|_| moved) else {
            return;
        };
        let before = self.shared_prefix.load(Ordering::Relaxed);
        if last || before == 0 || bytes.saturating_sub(before) >= SHARE_STEP {
            self.shared_prefix.fetch_max(bytes, Ordering::Relaxed);
            // Best effort: a reader that misses one update waits for the next.
            if let Err(e) = progress::write(file, bytes) {
                tracing::debug!(error = %e, "could not share download progress");
            }
        }
    }

    /// The file is complete and in the cache.
    pub(crate) fn done(&self) {
        self.finished.store(true, Ordering::Release);
        self.tx.send_replace(Progress::Done);
    }

    /// The write failed for good.
    pub(crate) fn fail(&self, reason: String, transient: bool) {
        self.finished.store(true, Ordering::Release);
        self.tx.send_replace(Progress::Failed(reason, transient));
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Acquire) {
            self.tx
                .send_replace(Progress::Failed("the fetch was abandoned".into(), false));
        }
    }
}

impl Growing {
    /// Bytes from the start that are readable now (`u64::MAX` once complete), or the error
    /// the writer gave up with.
    fn ready(&self, rx: &watch::Receiver<Progress>) -> Result<u64> {
        match &*rx.borrow() {
            Progress::Written(n) => Ok(*n),
            Progress::Done => Ok(u64::MAX),
            Progress::Failed(reason, transient) => Err(StreamerError::FetchFailed {
                what: self.what.to_string(),
                reason: reason.clone(),
                transient: *transient,
            }),
        }
    }

    /// Bytes readable now without waiting (`u64::MAX` once complete; 0 after a failure).
    pub(crate) fn readable(&self) -> u64 {
        self.ready(&self.rx).unwrap_or(0)
    }

    /// Whether the file is complete (reads need no wait).
    pub(crate) fn is_done(&self) -> bool {
        matches!(*self.rx.borrow(), Progress::Done)
    }

    /// Waits until at least `end` bytes (or the whole file) are readable; returns the bytes
    /// readable then.
    pub(crate) async fn wait(&self, end: u64) -> Result<u64> {
        let mut rx = self.rx.clone();
        loop {
            let ready = self.ready(&rx)?;
            if ready >= end {
                return Ok(ready);
            }
            if rx.changed().await.is_err() {
                // The writer is gone; its last word (done or failed) is in the channel.
                let ready = self.ready(&rx)?;
                return if ready >= end {
                    Ok(ready)
                } else {
                    Err(StreamerError::FetchFailed {
                        what: self.what.to_string(),
                        reason: "the fetch ended early".into(),
                        transient: false,
                    })
                };
            }
        }
    }

    /// [`Growing::wait`] for a plain thread (a consumer, or a blocking task).
    pub(crate) fn wait_blocking(&self, end: u64) -> Result<u64> {
        let ready = self.ready(&self.rx)?;
        if ready >= end {
            return Ok(ready);
        }
        futures::executor::block_on(self.wait(end))
    }
}

/// Where a growing shard ends up: the cache lease (a pin) and the final path, set by the
/// writer once it commits. Shared by the writer and every handle on the shard, so the pin lives
/// as long as any of them.
#[derive(Debug, Default)]
pub(crate) struct Landing {
    lease: Mutex<Option<ShardLease>>,
    path: OnceLock<PathBuf>,
}

impl Landing {
    /// Records the committed file.
    pub(crate) fn land(&self, lease: ShardLease) {
        let _ = self.path.set(lease.path().to_path_buf());
        if let Ok(mut slot) = self.lease.lock() {
            *slot = Some(lease);
        }
    }

    /// The final path, once committed.
    pub(crate) fn path(&self) -> Option<&PathBuf> {
        self.path.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_processes_see_the_first_advance_then_one_per_step_and_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("t"))
            .unwrap();
        let file = Arc::new(file);
        let (tx, rx) = shared_channel(Arc::from("s"));
        tx.share_through(Arc::clone(&file));
        let shared = || progress::read(&file).unwrap();
        assert_eq!(shared(), Some(0));
        tx.advance(64 << 10, false);
        assert_eq!(shared(), Some(64 << 10), "the first advance is shared");
        tx.advance(512 << 10, false);
        assert_eq!(
            rx.wait_blocking(1).unwrap(),
            512 << 10,
            "this process sees each one"
        );
        assert_eq!(shared(), Some(64 << 10), "less than a step is not written");
        tx.advance((64 << 10) + SHARE_STEP, false);
        assert_eq!(shared(), Some((64 << 10) + SHARE_STEP));
        tx.advance((65 << 10) + SHARE_STEP, true);
        assert_eq!(shared(), Some((65 << 10) + SHARE_STEP), "the last one is");
    }

    #[test]
    fn readers_wait_for_the_prefix_and_see_failures() {
        let (tx, rx) = channel(Arc::from("s"));
        tx.advance(10, false);
        assert_eq!(rx.wait_blocking(5).unwrap(), 10);
        tx.advance(4, true); // never moves back
        let waiter = {
            let rx = rx.clone();
            std::thread::spawn(move || rx.wait_blocking(100))
        };
        tx.advance(100, false);
        assert_eq!(waiter.join().unwrap().unwrap(), 100);
        tx.done();
        assert!(rx.is_done());
        assert_eq!(rx.wait_blocking(1 << 40).unwrap(), u64::MAX);

        let (tx, rx) = channel(Arc::from("t"));
        let waiter = std::thread::spawn(move || rx.wait_blocking(1));
        drop(tx);
        assert!(matches!(
            waiter.join().unwrap(),
            Err(StreamerError::FetchFailed { .. })
        ));
    }
}
