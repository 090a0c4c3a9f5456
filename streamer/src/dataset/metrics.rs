//! Counters of one process's dataset handle, read by [`super::StreamingDataset::metrics`] and
//! exported under the metrics contract's names (`shardstream_*`, base units, no per-shard labels),
//! and the node's sum of them.
//!
//! **The node's sum.** A node runs many processes that stream (each rank, each of its DataLoader
//! workers, a FUSE mount), and `shardstream run` serves the sum of all of them, including those
//! that already exited. Each process publishes each dataset's counters into the node's cache
//! folder, `metrics/<pid>-<id>.json` (written whole: temp file and rename), once a second while
//! its counters change (a task on the process's runtime, which ends with the dataset) and once
//! more when a stream ends or the dataset is dropped ([`Publisher`]); [`node_metrics`] sums the
//! folder. A file is never removed while the run
//! lives, so a counter of the sum never goes backwards when a worker exits. A forked child
//! (a DataLoader worker) inherits its parent's counters: it publishes only what it counted
//! itself, from the moment its own engine started.
//!
//! Files instead of a socket or shared memory: the node folder is the one thing every process of
//! the node already shares (by contract), a file survives its writer, and a process that is
//! killed loses at most its last second.
//!
//! **Other counters.** Checkpoint writers and readers (and anything else above the streamer)
//! publish through the same [`Publisher`], as [`NamedCounters`]: a `counters` object of
//! `shardstream_*` names (without the prefix) to values, which [`node_sum`] adds up by name.
//! The owner of those names renders them; this module only carries and sums them.
//!
//! `SHARDSTREAM_NODE_METRICS=0` turns publishing off in a process ([`NODE_METRICS_ENV`]).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::debug;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
    /// What was counted since `earlier` (a forked child's inherited counters): counters are
    /// subtracted, gauges kept.
    pub fn since(&self, earlier: &MetricsSnapshot) -> MetricsSnapshot {
        MetricsSnapshot {
            fetch_bytes: self.fetch_bytes.saturating_sub(earlier.fetch_bytes),
            fetch_requests: self.fetch_requests.saturating_sub(earlier.fetch_requests),
            fetch_retries: self.fetch_retries.saturating_sub(earlier.fetch_retries),
            shards_fetched: self.shards_fetched.saturating_sub(earlier.shards_fetched),
            shards_joined: self.shards_joined.saturating_sub(earlier.shards_joined),
            cache_hits: self.cache_hits.saturating_sub(earlier.cache_hits),
            cache_misses: self.cache_misses.saturating_sub(earlier.cache_misses),
            cache_evictions: self.cache_evictions.saturating_sub(earlier.cache_evictions),
            cache_corrupt: self.cache_corrupt.saturating_sub(earlier.cache_corrupt),
            samples: self.samples.saturating_sub(earlier.samples),
            sample_bytes: self.sample_bytes.saturating_sub(earlier.sample_bytes),
            sample_reads: self.sample_reads.saturating_sub(earlier.sample_reads),
            deferred_reads: self.deferred_reads.saturating_sub(earlier.deferred_reads),
            stall_seconds: (self.stall_seconds - earlier.stall_seconds).max(0.0),
            ..*self
        }
    }

    /// Adds `other` (another process's counters) to these: counters and the memory figures add
    /// up over the node's processes; the node cache's size is one folder's, so the largest
    /// count wins. `live` says whether `other`'s process still runs: an exited one holds no
    /// memory.
    pub fn add(&mut self, other: &MetricsSnapshot, live: bool) {
        self.fetch_bytes = self.fetch_bytes.saturating_add(other.fetch_bytes);
        self.fetch_requests = self.fetch_requests.saturating_add(other.fetch_requests);
        self.fetch_retries = self.fetch_retries.saturating_add(other.fetch_retries);
        self.shards_fetched = self.shards_fetched.saturating_add(other.shards_fetched);
        self.shards_joined = self.shards_joined.saturating_add(other.shards_joined);
        self.cache_hits = self.cache_hits.saturating_add(other.cache_hits);
        self.cache_misses = self.cache_misses.saturating_add(other.cache_misses);
        self.cache_evictions = self.cache_evictions.saturating_add(other.cache_evictions);
        self.cache_corrupt = self.cache_corrupt.saturating_add(other.cache_corrupt);
        self.cache_bytes = self.cache_bytes.max(other.cache_bytes);
        self.samples = self.samples.saturating_add(other.samples);
        self.sample_bytes = self.sample_bytes.saturating_add(other.sample_bytes);
        self.sample_reads = self.sample_reads.saturating_add(other.sample_reads);
        self.deferred_reads = self.deferred_reads.saturating_add(other.deferred_reads);
        self.stall_seconds += other.stall_seconds;
        if live {
            self.memory_in_use = self.memory_in_use.saturating_add(other.memory_in_use);
            self.memory_limit = self.memory_limit.saturating_add(other.memory_limit);
        }
    }

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

/// Counters a [`Publisher`] can publish: written whole as JSON, compared to skip an unchanged
/// write, and made relative to what a forked child inherited.
pub trait Counters: Clone + PartialEq + Serialize {
    /// What was counted since `earlier` (counters subtracted, gauges kept).
    fn since(&self, earlier: &Self) -> Self;
}

impl Counters for MetricsSnapshot {
    fn since(&self, earlier: &Self) -> Self {
        MetricsSnapshot::since(self, earlier)
    }
}

/// Monotonic counters by name (the `shardstream_*` name without its prefix, e.g.
/// `checkpoint_bytes_total`), published by a part of shardstream above the streamer
/// (checkpoint writers and readers). Serialized as `{"counters": {name: value}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NamedCounters {
    /// Name to value; every one a counter (never goes backwards).
    pub counters: BTreeMap<String, f64>,
}

impl NamedCounters {
    /// Counters from `(name, value)` pairs.
    pub fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, f64)>) -> Self {
        NamedCounters {
            counters: pairs
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect(),
        }
    }

    fn add(&mut self, other: &NamedCounters) {
        for (name, value) in &other.counters {
            *self.counters.entry(name.clone()).or_default() += value;
        }
    }
}

impl Counters for NamedCounters {
    fn since(&self, earlier: &Self) -> Self {
        NamedCounters {
            counters: self
                .counters
                .iter()
                .map(|(name, value)| {
                    let before = earlier.counters.get(name).copied().unwrap_or(0.0);
                    (name.clone(), (value - before).max(0.0))
                })
                .collect(),
        }
    }
}

/// `0` (or `false`, `off`, `no`) turns node-metrics publishing off in a process: its counters
/// then stay out of the node's sum (`ds.metrics()` still counts them). For measuring what
/// publishing costs; on by default.
pub const NODE_METRICS_ENV: &str = "SHARDSTREAM_NODE_METRICS";

/// Whether this process publishes node metrics ([`NODE_METRICS_ENV`], read once).
pub fn publishing_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let off = std::env::var(NODE_METRICS_ENV).is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "false" | "off" | "no"
            )
        });
        if off {
            debug!("{NODE_METRICS_ENV} is off: this process publishes no node metrics");
        }
        !off
    })
}

/// The folder inside a node's cache folder where its processes publish their counters.
pub const METRICS_DIR: &str = "metrics";
/// How often a process publishes its counters while they change.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// A file not written for this long belongs to a process that no longer holds memory.
const LIVE_WITHIN: Duration = Duration::from_secs(30);

/// Publishes one set of counters of this process (a dataset handle's, or the process's
/// checkpoint counters) into the node folder (see the module doc).
#[derive(Debug)]
pub struct Publisher<T = MetricsSnapshot> {
    /// The process that owns `state` (a forked child starts its own).
    pid: AtomicU32,
    state: Mutex<Option<Published<T>>>,
}

impl<T> Default for Publisher<T> {
    fn default() -> Self {
        Publisher {
            pid: AtomicU32::new(0),
            state: Mutex::new(None),
        }
    }
}

#[derive(Debug)]
struct Published<T> {
    file: PathBuf,
    /// The counters this process had when it started: its parent's, for a forked child.
    baseline: T,
    /// What was written last, so that unchanged counters write nothing.
    last: Option<T>,
}

impl<T: Counters> Publisher<T> {
    /// Makes sure this process publishes into `node_dir`, starting a file of its own (with
    /// the counters it holds now as the baseline) the first time it is called in a process;
    /// returns whether it started one now (the caller then starts the periodic task). Starts
    /// nothing when publishing is off ([`NODE_METRICS_ENV`]).
    pub fn start(&self, node_dir: &Path, snapshot: impl FnOnce() -> T) -> bool {
        if !publishing_enabled() {
            return false;
        }
        let pid = std::process::id();
        if self.pid.load(Ordering::Acquire) == pid {
            return false;
        }
        // `try_lock`: in a child forked while a thread of the parent was publishing, the lock
        // is held forever; that child then publishes nothing rather than hang.
        let Ok(mut state) = self.state.try_lock() else {
            debug!(
                pid,
                "metrics publisher busy or inherited locked: this process publishes none"
            );
            return false;
        };
        if self.pid.load(Ordering::Acquire) == pid {
            return false;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "{pid}-{stamp:x}-{}.json",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        *state = Some(Published {
            file: node_dir.join(METRICS_DIR).join(name),
            baseline: snapshot(),
            last: None,
        });
        self.pid.store(pid, Ordering::Release);
        true
    }

    /// Publishes now, if the counters changed since the last time.
    pub fn publish(&self, snapshot: impl FnOnce() -> T) {
        if self.pid.load(Ordering::Acquire) != std::process::id() {
            return;
        }
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let Some(published) = state.as_mut() else {
            return;
        };
        let counted = snapshot().since(&published.baseline);
        if published.last.as_ref() == Some(&counted) {
            return;
        }
        if let Err(e) = write_whole(&published.file, &counted) {
            // Metrics must never fail the data path; a folder that cannot take them is logged.
            debug!(file = %published.file.display(), error = %e, "cannot publish metrics");
        }
        published.last = Some(counted);
    }
}

/// Named counters of this process published into the node folder that `shardstream run`
/// exported (`SHARDSTREAM_CACHE_DIR`); nothing is published outside `run`. For counters that
/// belong to the process rather than to a dataset handle (the checkpoint crate's process-wide
/// counters): keep one in a `static`, call [`ProcessCounters::start`] when the counting object
/// is made (before it counts) and [`ProcessCounters::publish`] after the work that changes them.
#[derive(Debug)]
pub struct ProcessCounters {
    node_dir: Option<PathBuf>,
    publisher: Publisher<NamedCounters>,
}

impl ProcessCounters {
    /// Publishes into the node folder named by `SHARDSTREAM_CACHE_DIR`, if set.
    pub fn from_env() -> Self {
        let node_dir = std::env::var_os(shardstream_identity::CACHE_DIR_ENV)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        ProcessCounters::in_dir(node_dir)
    }

    /// Publishes into `node_dir` (none: publishes nothing).
    pub fn in_dir(node_dir: Option<PathBuf>) -> Self {
        ProcessCounters {
            node_dir,
            publisher: Publisher::default(),
        }
    }

    /// Starts this process's file: what `counters` reads now (zeros, or what a forked child
    /// inherited) is the baseline that later publishes subtract. Once per process; later
    /// calls do nothing.
    pub fn start(&self, counters: impl FnOnce() -> NamedCounters) {
        if let Some(dir) = &self.node_dir {
            self.publisher.start(dir, counters);
        }
    }

    /// Publishes the counters `counters` reads now, if they changed. In a process that never
    /// called [`ProcessCounters::start`] the counts up to now are the baseline (never counted
    /// twice, at the price of those).
    pub fn publish(&self, counters: impl Fn() -> NamedCounters) {
        let Some(dir) = &self.node_dir else { return };
        self.publisher.start(dir, &counters);
        self.publisher.publish(&counters);
    }
}

/// Publishes `inner`'s counters every [`PUBLISH_EVERY`] while they change, until the dataset
/// is gone (its last counts are published by its drop).
pub(crate) async fn publish_every_second(inner: std::sync::Weak<super::Inner>) {
    loop {
        tokio::time::sleep(PUBLISH_EVERY).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.publisher.publish(|| inner.snapshot());
    }
}

fn write_whole(file: &Path, snapshot: &impl Serialize) -> io::Result<()> {
    let body = serde_json::to_vec(snapshot).map_err(io::Error::other)?;
    let tmp = file.with_extension("json.tmp");
    let written = fs::write(&tmp, &body);
    let written = match written {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = file.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::write(&tmp, &body)
        }
        other => other,
    };
    written?;
    fs::rename(&tmp, file)
}

/// The sum of a node folder's published counters: the datasets' and the named ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeSum {
    /// Every dataset handle's counters, summed ([`MetricsSnapshot::add`]).
    pub dataset: MetricsSnapshot,
    /// Every [`NamedCounters`] file's counters, summed by name.
    pub named: NamedCounters,
}

/// One published file: a dataset's snapshot, or named counters (the other part's fields
/// are absent and read as zeros).
#[derive(Deserialize)]
struct PublishedFile {
    #[serde(flatten)]
    dataset: MetricsSnapshot,
    #[serde(flatten)]
    named: NamedCounters,
}

/// The sum of the dataset counters every process published into a node folder (see the
/// module doc). A folder with none gives zeros.
pub fn node_metrics(node_dir: &Path) -> io::Result<MetricsSnapshot> {
    node_sum(node_dir).map(|sum| sum.dataset)
}

/// The sum of everything every process published into a node folder, dataset counters and
/// named ones (see the module doc): what `shardstream run` serves. A folder with none gives
/// zeros.
pub fn node_sum(node_dir: &Path) -> io::Result<NodeSum> {
    let dir = node_dir.join(METRICS_DIR);
    let mut total = NodeSum::default();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(total),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        // Written whole by rename: a file that does not parse is not ours, and is skipped.
        let Ok(bytes) = fs::read(&path) else { continue };
        let Ok(file) = serde_json::from_slice::<PublishedFile>(&bytes) else {
            continue;
        };
        let live = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < LIVE_WITHIN);
        total.dataset.add(&file.dataset, live);
        total.named.add(&file.named);
    }
    Ok(total)
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

    #[test]
    fn a_node_sums_its_processes_and_a_forked_child_counts_only_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let parent = Publisher::default();
        let at_start = MetricsSnapshot {
            fetch_bytes: 100,
            samples: 10,
            ..MetricsSnapshot::default()
        };
        parent.start(dir.path(), MetricsSnapshot::default);
        parent.publish(|| at_start);
        // A child made by fork inherits 100 bytes; it counts 50 of its own.
        let child = Publisher::default();
        child.start(dir.path(), || at_start);
        child.publish(|| MetricsSnapshot {
            fetch_bytes: 150,
            samples: 15,
            cache_bytes: 7,
            ..MetricsSnapshot::default()
        });
        let node = node_metrics(dir.path()).unwrap();
        assert_eq!(node.fetch_bytes, 150);
        assert_eq!(node.samples, 15);
        assert_eq!(node.cache_bytes, 7);
        // A second start in the same process keeps its file and baseline.
        assert!(!parent.start(dir.path(), || MetricsSnapshot {
            fetch_bytes: 999,
            ..MetricsSnapshot::default()
        }));
        parent.publish(|| MetricsSnapshot {
            fetch_bytes: 120,
            ..at_start
        });
        assert_eq!(node_metrics(dir.path()).unwrap().fetch_bytes, 170);
        let files = fs::read_dir(dir.path().join(METRICS_DIR)).unwrap().count();
        assert_eq!(files, 2);
    }

    #[test]
    fn unchanged_counters_write_nothing_and_a_missing_folder_sums_to_zero() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            node_metrics(dir.path()).unwrap(),
            MetricsSnapshot::default()
        );
        let p = Publisher::default();
        assert!(p.start(dir.path(), MetricsSnapshot::default));
        assert!(
            !p.start(dir.path(), MetricsSnapshot::default),
            "started once a process"
        );
        let snap = |n| {
            move || MetricsSnapshot {
                samples: n,
                ..MetricsSnapshot::default()
            }
        };
        p.publish(snap(1));
        let file = fs::read_dir(dir.path().join(METRICS_DIR))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        fs::write(&file, "planted").unwrap();
        p.publish(snap(1));
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "planted",
            "unchanged: not written"
        );
        p.publish(snap(3));
        assert_eq!(node_metrics(dir.path()).unwrap().samples, 3);
    }

    #[test]
    fn named_counters_ride_in_the_node_sum_beside_the_datasets() {
        let dir = tempfile::tempdir().unwrap();
        let dataset = Publisher::default();
        dataset.start(dir.path(), MetricsSnapshot::default);
        dataset.publish(|| MetricsSnapshot {
            fetch_bytes: 10,
            ..MetricsSnapshot::default()
        });
        // Two processes' checkpoint counters, one of them a child that inherited 100 bytes.
        let named = |bytes: f64, commits: f64| {
            NamedCounters::new([
                ("checkpoint_bytes_total", bytes),
                ("checkpoint_commits_total", commits),
            ])
        };
        let parent = ProcessCounters::in_dir(Some(dir.path().to_path_buf()));
        parent.start(NamedCounters::default);
        parent.publish(|| named(100.0, 1.0));
        let child = ProcessCounters::in_dir(Some(dir.path().to_path_buf()));
        child.start(|| named(100.0, 1.0));
        child.publish(|| named(150.0, 2.0));
        let sum = node_sum(dir.path()).unwrap();
        assert_eq!(sum.dataset.fetch_bytes, 10);
        assert_eq!(sum.named.counters["checkpoint_bytes_total"], 150.0);
        assert_eq!(sum.named.counters["checkpoint_commits_total"], 2.0);
        // The datasets' sum alone is unchanged by the named files.
        assert_eq!(node_metrics(dir.path()).unwrap(), sum.dataset);
        // Outside `run` (no node folder) nothing is written.
        ProcessCounters::in_dir(None).publish(|| named(1.0, 1.0));
        assert_eq!(
            fs::read_dir(dir.path().join(METRICS_DIR)).unwrap().count(),
            3
        );
    }
}
