//! Counters for the cache, plain atomics that a Prometheus exporter reads
//! (`shardstream_cache_hits_total`, `shardstream_cache_bytes`, ...).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one process's cache handle (the gauge [`CacheMetrics::cache_bytes`] is the node's
/// usage as this process last counted it).
#[derive(Debug, Default)]
pub struct CacheMetrics {
    /// Acquires served from a file already in the cache.
    pub hits: AtomicU64,
    /// Acquires that fetched the shard.
    pub misses: AtomicU64,
    /// Bytes fetched into the cache and committed.
    pub fetched_bytes: AtomicU64,
    /// Shards evicted to make room.
    pub evictions: AtomicU64,
    /// Bytes evicted.
    pub evicted_bytes: AtomicU64,
    /// Cached files found damaged (wrong size or hash) and fetched again.
    pub corrupt: AtomicU64,
    /// Bytes read to check hashes.
    pub hashed_bytes: AtomicU64,
    /// Bytes of shard files in the node's cache folder at the last count.
    pub cache_bytes: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// See [`CacheMetrics::hits`].
    pub hits: u64,
    /// See [`CacheMetrics::misses`].
    pub misses: u64,
    /// See [`CacheMetrics::fetched_bytes`].
    pub fetched_bytes: u64,
    /// See [`CacheMetrics::evictions`].
    pub evictions: u64,
    /// See [`CacheMetrics::evicted_bytes`].
    pub evicted_bytes: u64,
    /// See [`CacheMetrics::corrupt`].
    pub corrupt: u64,
    /// See [`CacheMetrics::hashed_bytes`].
    pub hashed_bytes: u64,
    /// See [`CacheMetrics::cache_bytes`].
    pub cache_bytes: u64,
}

impl CacheMetrics {
    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            hits: get(&self.hits),
            misses: get(&self.misses),
            fetched_bytes: get(&self.fetched_bytes),
            evictions: get(&self.evictions),
            evicted_bytes: get(&self.evicted_bytes),
            corrupt: get(&self.corrupt),
            hashed_bytes: get(&self.hashed_bytes),
            cache_bytes: get(&self.cache_bytes),
        }
    }

    pub(crate) fn add_hashed(&self, bytes: u64) {
        self.hashed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn inc(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }
}
