//! Counters for checkpoint traffic, as plain atomics. A Prometheus exporter reads
//! [`CheckpointMetrics::snapshot`] and prefixes each name with `shardstream_`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Monotonic counters (all `_total`, Prometheus counters).
#[derive(Debug, Default)]
pub struct CheckpointMetrics {
    /// Bytes uploaded as checkpoint data (`checkpoint_bytes_total`).
    pub bytes_written: AtomicU64,
    /// Bytes downloaded from checkpoints (ranged reads and verification).
    pub bytes_read: AtomicU64,
    /// Files completely uploaded.
    pub files_written: AtomicU64,
    /// PUT and UploadPart requests sent.
    pub put_requests: AtomicU64,
    /// GET requests sent.
    pub get_requests: AtomicU64,
    /// Multipart uploads aborted after an error.
    pub uploads_aborted: AtomicU64,
    /// Checkpoints committed (manifest written).
    pub commits: AtomicU64,
    /// Commits refused because the checkpoint was already committed.
    pub commit_conflicts: AtomicU64,
    /// Checksum or size mismatches found on read or verify.
    pub integrity_failures: AtomicU64,
    /// Objects deleted by garbage collection.
    pub gc_deleted_objects: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetricsSnapshot {
    /// See [`CheckpointMetrics::bytes_written`].
    pub bytes_written: u64,
    /// See [`CheckpointMetrics::bytes_read`].
    pub bytes_read: u64,
    /// See [`CheckpointMetrics::files_written`].
    pub files_written: u64,
    /// See [`CheckpointMetrics::put_requests`].
    pub put_requests: u64,
    /// See [`CheckpointMetrics::get_requests`].
    pub get_requests: u64,
    /// See [`CheckpointMetrics::uploads_aborted`].
    pub uploads_aborted: u64,
    /// See [`CheckpointMetrics::commits`].
    pub commits: u64,
    /// See [`CheckpointMetrics::commit_conflicts`].
    pub commit_conflicts: u64,
    /// See [`CheckpointMetrics::integrity_failures`].
    pub integrity_failures: u64,
    /// See [`CheckpointMetrics::gc_deleted_objects`].
    pub gc_deleted_objects: u64,
}

impl MetricsSnapshot {
    /// `(prometheus name without the shardstream_ prefix, value)` pairs, all counters.
    pub fn named(&self) -> [(&'static str, u64); 10] {
        [
            ("checkpoint_bytes_total", self.bytes_written),
            ("checkpoint_read_bytes_total", self.bytes_read),
            ("checkpoint_files_total", self.files_written),
            ("checkpoint_put_requests_total", self.put_requests),
            ("checkpoint_get_requests_total", self.get_requests),
            ("checkpoint_uploads_aborted_total", self.uploads_aborted),
            ("checkpoint_commits_total", self.commits),
            ("checkpoint_commit_conflicts_total", self.commit_conflicts),
            (
                "checkpoint_integrity_failures_total",
                self.integrity_failures,
            ),
            (
                "checkpoint_gc_deleted_objects_total",
                self.gc_deleted_objects,
            ),
        ]
    }
}

impl CheckpointMetrics {
    /// The process-wide counters that every handle uses unless given its own.
    pub fn global() -> Arc<CheckpointMetrics> {
        static GLOBAL: OnceLock<Arc<CheckpointMetrics>> = OnceLock::new();
        GLOBAL.get_or_init(Default::default).clone()
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            bytes_written: r(&self.bytes_written),
            bytes_read: r(&self.bytes_read),
            files_written: r(&self.files_written),
            put_requests: r(&self.put_requests),
            get_requests: r(&self.get_requests),
            uploads_aborted: r(&self.uploads_aborted),
            commits: r(&self.commits),
            commit_conflicts: r(&self.commit_conflicts),
            integrity_failures: r(&self.integrity_failures),
            gc_deleted_objects: r(&self.gc_deleted_objects),
        }
    }
}

/// Adds `n` to a counter.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
