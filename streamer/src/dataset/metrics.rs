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
    pub samples: AtomicU64,
    pub sample_bytes: AtomicU64,
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
    /// Seconds the consumer waited for a shard (`shardstream_consumer_stall_seconds_total`).
    pub stall_seconds: f64,
    /// Bytes of the memory budget held now (`shardstream_memory_budget_used_bytes`).
    pub memory_in_use: u64,
    /// The memory budget (`shardstream_memory_budget_bytes`).
    pub memory_limit: u64,
}
