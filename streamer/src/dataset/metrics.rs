//! Counters of one process's dataset handle, read by [`super::StreamingDataset::metrics`] and
//! exported by `shardstream stream --metrics-addr` under the DESIGN §4 names (no per-shard
//! labels).

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters (plain atomics, updated by the engine).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub fetch_bytes: AtomicU64,
    pub fetch_requests: AtomicU64,
    pub fetch_retries: AtomicU64,
    pub shards_fetched: AtomicU64,
    pub shards_joined: AtomicU64,
    pub samples: AtomicU64,
    pub sample_bytes: AtomicU64,
    pub sample_reads: AtomicU64,
    pub deferred_reads: AtomicU64,
    pub stall_nanos: AtomicU64,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The counters at one moment. Cache figures are this process's view of the node's cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Bytes downloaded from storage (`shardstream_fetch_bytes_total`).
    pub fetch_bytes: u64,
    /// GET requests sent (`shardstream_fetch_requests_total`).
    pub fetch_requests: u64,
    /// Fetches retried after a transient failure or a damaged download
    /// (`shardstream_fetch_retries_total`).
    pub fetch_retries: u64,
    /// Shards this process downloaded into the cache (`shardstream_shards_fetched_total`).
    pub shards_fetched: u64,
    /// Shards this process read from another process's download while it arrived, instead of
    /// waiting for its commit (`shardstream_shards_joined_total`).
    pub shards_joined: u64,
    /// Shard requests served from the node cache (`shardstream_cache_hits_total`).
    pub cache_hits: u64,
    /// Shard requests that had to fetch (`shardstream_cache_misses_total`).
    pub cache_misses: u64,
    /// Shards evicted by this process (`shardstream_cache_evictions_total`).
    pub cache_evictions: u64,
    /// Cached files found damaged and fetched again (`shardstream_cache_corrupt_total`).
    pub cache_corrupt: u64,
    /// Bytes in the node's cache folder at this process's last count (`shardstream_cache_bytes`).
    pub cache_bytes: u64,
    /// Samples handed to the consumer (`shardstream_samples_total`).
    pub samples: u64,
    /// Bytes of those samples (`shardstream_sample_bytes_total`).
    pub sample_bytes: u64,
    /// `pread`s of cached shard files made to serve samples: one per sample, per run of samples
    /// read in order, or per small shard read whole (`shardstream_sample_reads_total`).
    pub sample_reads: u64,
    /// Of those, the samples a stream left for its consumer's thread to read while it waited
    /// (`SampleStream::defer_on_demand`; `shardstream_deferred_reads_total`).
    pub deferred_reads: u64,
    /// Seconds the consumer waited for a shard (`shardstream_consumer_stall_seconds_total`).
    pub stall_seconds: f64,
    /// Bytes of the memory budget held now (`shardstream_memory_budget_used_bytes`).
    pub memory_in_use: u64,
    /// The memory budget (`shardstream_memory_budget_bytes`).
    pub memory_limit: u64,
}

impl MetricsSnapshot {
    /// The snapshot in Prometheus' text exposition format (version 0.0.4), under the DESIGN §4
    /// names: `shardstream_*`, base units, no per-shard labels.
    pub fn to_prometheus(&self) -> String {
        let counters: [(&str, &str, f64); 15] = [
            (
                "shardstream_fetch_bytes_total",
                "Bytes downloaded from storage.",
                self.fetch_bytes as f64,
            ),
            (
                "shardstream_fetch_requests_total",
                "GET requests sent to storage.",
                self.fetch_requests as f64,
            ),
            (
                "shardstream_fetch_retries_total",
                "Fetches retried after a transient failure or a damaged download.",
                self.fetch_retries as f64,
            ),
            (
                "shardstream_shards_fetched_total",
                "Shards downloaded into the node cache by this process.",
                self.shards_fetched as f64,
            ),
            (
                "shardstream_shards_joined_total",
                "Shards read from another process's download while it arrived.",
                self.shards_joined as f64,
            ),
            (
                "shardstream_cache_hits_total",
                "Shard requests served from the node cache.",
                self.cache_hits as f64,
            ),
            (
                "shardstream_cache_misses_total",
                "Shard requests that had to fetch.",
                self.cache_misses as f64,
            ),
            (
                "shardstream_cache_evictions_total",
                "Shards evicted from the node cache by this process.",
                self.cache_evictions as f64,
            ),
            (
                "shardstream_cache_corrupt_total",
                "Cached shards found damaged and fetched again.",
                self.cache_corrupt as f64,
            ),
            (
                "shardstream_samples_total",
                "Samples handed to the consumer.",
                self.samples as f64,
            ),
            (
                "shardstream_sample_bytes_total",
                "Bytes of the samples handed to the consumer.",
                self.sample_bytes as f64,
            ),
            (
                "shardstream_sample_reads_total",
                "Reads of cached shard files made to serve samples.",
                self.sample_reads as f64,
            ),
            (
                "shardstream_deferred_reads_total",
                "Of those reads, the samples a stream left for its consumer's thread to read.",
                self.deferred_reads as f64,
            ),
            (
                "shardstream_consumer_stall_seconds_total",
                "Seconds the consumer waited for a shard.",
                self.stall_seconds,
            ),
            (
                "shardstream_memory_budget_bytes",
                "The memory budget (memory_limit).",
                self.memory_limit as f64,
            ),
        ];
        let gauges: [(&str, &str, f64); 2] = [
            (
                "shardstream_cache_bytes",
                "Bytes of shard files in the node cache at the last count.",
                self.cache_bytes as f64,
            ),
            (
                "shardstream_memory_budget_used_bytes",
                "Bytes of the memory budget held now.",
                self.memory_in_use as f64,
            ),
        ];
        let mut out = String::new();
        for (name, help, value) in counters {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        for (name, help, value) in gauges {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_has_one_typed_sample_per_metric_in_base_units() {
        let snap = MetricsSnapshot {
            fetch_bytes: 1234,
            stall_seconds: 1.5,
            cache_bytes: 77,
            ..MetricsSnapshot::default()
        };
        let text = snap.to_prometheus();
        assert!(text.contains(
            "# TYPE shardstream_fetch_bytes_total counter\nshardstream_fetch_bytes_total 1234\n"
        ));
        assert!(text.contains("shardstream_consumer_stall_seconds_total 1.5\n"));
        assert!(text.contains("# TYPE shardstream_cache_bytes gauge\nshardstream_cache_bytes 77\n"));
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(samples.len(), 17);
        assert!(samples
            .iter()
            .all(|l| l.starts_with("shardstream_") && !l.contains('{')));
    }
}
