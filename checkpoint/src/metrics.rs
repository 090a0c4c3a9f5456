//! Counters for checkpoint traffic, as plain atomics. A Prometheus exporter reads
//! [`CheckpointMetrics::snapshot`] and prefixes each name with `shardstream_`
//! ([`MetricsSnapshot::to_prometheus`]). Under `shardstream run` the Python backends and the CLI
//! publish the process-wide counters into the node's folder with the node's other counters
//! ([`MetricsSnapshot::named`] carries them there, [`MetricsSnapshot::from_named`] reads the
//! node's sum back), so that `run`'s endpoint serves them.

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
    /// Nanoseconds spent in commits that succeeded (checking the files, writing and verifying
    /// the manifest).
    pub commit_nanos: AtomicU64,
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
    /// See [`CheckpointMetrics::commit_nanos`].
    pub commit_nanos: u64,
    /// See [`CheckpointMetrics::commit_conflicts`].
    pub commit_conflicts: u64,
    /// See [`CheckpointMetrics::integrity_failures`].
    pub integrity_failures: u64,
    /// See [`CheckpointMetrics::gc_deleted_objects`].
    pub gc_deleted_objects: u64,
}

/// `(prometheus name without the shardstream_ prefix, help)` of every counter, in
/// [`MetricsSnapshot::named`]'s order.
const NAMES: [(&str, &str); 11] = [
    (
        "checkpoint_bytes_total",
        "Bytes uploaded as checkpoint data.",
    ),
    (
        "checkpoint_read_bytes_total",
        "Bytes downloaded from checkpoints (ranged reads and verification).",
    ),
    (
        "checkpoint_files_total",
        "Checkpoint files completely uploaded.",
    ),
    (
        "checkpoint_put_requests_total",
        "PUT and UploadPart requests sent for checkpoints.",
    ),
    (
        "checkpoint_get_requests_total",
        "GET requests sent for checkpoints.",
    ),
    (
        "checkpoint_uploads_aborted_total",
        "Multipart checkpoint uploads aborted after an error.",
    ),
    (
        "checkpoint_commits_total",
        "Checkpoints committed (manifest written).",
    ),
    (
        "checkpoint_commit_seconds_total",
        "Seconds spent in checkpoint commits that succeeded.",
    ),
    (
        "checkpoint_commit_conflicts_total",
        "Commits refused because the checkpoint was already committed.",
    ),
    (
        "checkpoint_integrity_failures_total",
        "Checksum or size mismatches found on checkpoint read or verify.",
    ),
    (
        "checkpoint_gc_deleted_objects_total",
        "Checkpoint objects deleted by garbage collection.",
    ),
];

impl MetricsSnapshot {
    /// `(prometheus name without the shardstream_ prefix, value)` pairs in base units, all
    /// counters.
    pub fn named(&self) -> [(&'static str, f64); 11] {
        let values = [
            self.bytes_written as f64,
            self.bytes_read as f64,
            self.files_written as f64,
            self.put_requests as f64,
            self.get_requests as f64,
            self.uploads_aborted as f64,
            self.commits as f64,
            self.commit_nanos as f64 / 1e9,
            self.commit_conflicts as f64,
            self.integrity_failures as f64,
            self.gc_deleted_objects as f64,
        ];
        std::array::from_fn(|i| (NAMES[i].0, values[i]))
    }

    /// The counters [`MetricsSnapshot::named`] gave (summed over a node's processes): a name
    /// not given is zero, names of others are ignored.
    pub fn from_named(get: impl Fn(&str) -> Option<f64>) -> MetricsSnapshot {
        let n = |name: &str| get(name).unwrap_or(0.0).max(0.0);
        MetricsSnapshot {
            bytes_written: n(NAMES[0].0) as u64,
            bytes_read: n(NAMES[1].0) as u64,
            files_written: n(NAMES[2].0) as u64,
            put_requests: n(NAMES[3].0) as u64,
            get_requests: n(NAMES[4].0) as u64,
            uploads_aborted: n(NAMES[5].0) as u64,
            commits: n(NAMES[6].0) as u64,
            commit_nanos: (n(NAMES[7].0) * 1e9).round() as u64,
            commit_conflicts: n(NAMES[8].0) as u64,
            integrity_failures: n(NAMES[9].0) as u64,
            gc_deleted_objects: n(NAMES[10].0) as u64,
        }
    }

    /// The counters in Prometheus' text exposition format (version 0.0.4), each name with the
    /// `shardstream_` prefix.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        for ((name, value), (_, help)) in self.named().into_iter().zip(NAMES) {
            out.push_str(&format!(
                "# HELP shardstream_{name} {help}\n# TYPE shardstream_{name} counter\n\
                 shardstream_{name} {value}\n"
            ));
        }
        out
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
            commit_nanos: r(&self.commit_nanos),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_counters_round_trip_in_base_units_and_render_with_the_prefix() {
        let snap = MetricsSnapshot {
            bytes_written: 4096,
            commits: 2,
            commit_nanos: 1_500_000_000,
            ..MetricsSnapshot::default()
        };
        let named = snap.named();
        assert!(named.contains(&("checkpoint_commit_seconds_total", 1.5)));
        let back = MetricsSnapshot::from_named(|name| {
            named.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        });
        assert_eq!(back, snap);
        let text = snap.to_prometheus();
        assert!(text.contains(
            "# TYPE shardstream_checkpoint_bytes_total counter\nshardstream_checkpoint_bytes_total 4096\n"
        ));
        assert!(text.contains("shardstream_checkpoint_commit_seconds_total 1.5\n"));
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, 11);
    }
}
