//! Warming the node cache for a stream that has not started yet.
//!
//! [`StreamingDataset::prefetch`](super::StreamingDataset::prefetch) downloads, in the
//! background of the calling process, the shards the first samples of one process's part of an
//! epoch come from, in the order that part needs them. It reads no sample and yields nothing:
//! the shards land in the node's cache, where whichever process streams that part finds them
//! (a hit), or joins them while they still arrive (`docs/cache.md`, "Joining a download in
//! progress").
//!
//! Why: a training script builds its dataset long before its DataLoader workers exist, and on
//! a cold cache each worker's first act is to download the same first shards. The binding starts
//! this at dataset construction, so the time the script spends building the model, and the
//! DataLoader spends forking its workers, is spent downloading too.
//!
//! It holds at most [`MAX_FETCHES`] downloads at once (the stream's own limit), each until its
//! shard is committed, so the first shard needed is the first one complete. The very first
//! starts alone, as a stream's does, because the first sample waits for it, but only until it
//! is open (its header and offset table have arrived and the rest is streaming in): a server
//! gives each connection its own pace (moto 45-60 MB/s per GET on the development VM, S3
//! about 100 MB/s), so the next downloads barely slow it, while holding them back until it
//! was committed left a 4 MiB shard's 65 ms download alone on the link. It stops after
//! `max_shards` shards or the stream's disk allowance (`cache_limit / 2`, at least one shard),
//! whichever comes first. Shards read in place are skipped; a plan with nothing to download
//! starts no thread at all; a shard whose file is already in the cache costs one `stat` (the
//! stream opens and checks it anyway). Cancelling (or dropping the handle) starts no further
//! download; the ones under way finish, since the part they belong to needs them.
//!
//! A failed download is logged, not returned: the stream that needs the shard fetches it again
//! and reports the error where the samples are wanted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::engine;
use super::inner::Inner;
use super::proc::ProcState;
use super::stream::{StreamPlan, MAX_FETCHES};
use crate::error::{Result, StreamerError};
use crate::order::EpochOrder;

/// What a finished (or cancelled) prefetch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefetchReport {
    /// Shards the plan chose (the first ones its part needs, within the limits).
    pub planned: u64,
    /// Shards now complete in the cache (fetched, joined, or already there).
    pub ready: u64,
    /// Shards whose download failed (logged; the stream fetches them again).
    pub failed: u64,
}

/// A prefetch under way in this process. Dropping it cancels what has not started yet.
#[derive(Debug)]
pub struct Prefetch {
    shards: Vec<usize>,
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
    pid: u32,
}

#[derive(Debug, Default)]
struct Shared {
    cancelled: AtomicBool,
    ready: AtomicU64,
    failed: AtomicU64,
    /// Set (and waiters woken) when every download started has ended.
    ended: Mutex<bool>,
    ended_cv: Condvar,
}

impl Shared {
    fn end(&self) {
        if let Ok(mut ended) = self.ended.lock() {
            *ended = true;
        }
        self.ended_cv.notify_all();
    }
}

impl Prefetch {
    /// Starts no further download; those under way finish in the background.
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether every planned download has ended (or none was needed).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// The shards it chose, in the order it downloads them.
    pub fn shards(&self) -> &[usize] {
        &self.shards
    }

    /// What it has done so far.
    pub fn report(&self) -> PrefetchReport {
        PrefetchReport {
            planned: self.shards.len() as u64,
            ready: self.shared.ready.load(Ordering::Relaxed),
            failed: self.shared.failed.load(Ordering::Relaxed),
        }
    }

    /// Waits (from a plain thread) until every download it started has ended.
    pub fn wait(&mut self) -> Result<PrefetchReport> {
        self.check_process()?;
        if let Some(task) = self.task.take() {
            futures::executor::block_on(task)
                .map_err(|e| StreamerError::Engine(format!("prefetch task failed: {e}")))?;
        }
        Ok(self.report())
    }

    /// [`Prefetch::wait`] for at most `timeout`; whether every download it started has ended.
    /// Wakes when they end, not by polling.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.check_process()?;
        if self.is_finished() {
            return Ok(true);
        }
        let ended = self
            .shared
            .ended
            .lock()
            .map_err(|_| StreamerError::Engine("prefetch state poisoned".into()))?;
        let (ended, _) = self
            .shared
            .ended_cv
            .wait_timeout_while(ended, timeout, |ended| !*ended)
            .map_err(|_| StreamerError::Engine("prefetch state poisoned".into()))?;
        // A driver task that panicked never says so: its handle does.
        Ok(*ended || self.is_finished())
    }

    fn check_process(&self) -> Result<()> {
        if self.pid != std::process::id() {
            return Err(StreamerError::Engine(
                "this prefetch was started in another process (before a fork)".into(),
            ));
        }
        Ok(())
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // Inherited through fork: the task belongs to the parent's runtime, whose threads
            // this process does not have. Touch nothing of it.
            std::mem::forget(self.task.take());
            return;
        }
        self.cancel();
    }
}

/// The shards to prefetch for `plan`, in the order its part first needs them: at most
/// `max_shards`, within `allowance` bytes of cache (always at least one), skipping shards read
/// in place. Asks the order for growing ranges of the part, so a large epoch costs only the
/// blocks the answer comes from.
pub(crate) fn shards_for(
    ds: &Inner,
    plan: &StreamPlan,
    max_shards: usize,
    allowance: u64,
) -> Result<Vec<usize>> {
    plan.order.validate()?;
    let order = EpochOrder::new(&ds.shape, &plan.order, plan.epoch)?;
    let partition = order.partition(plan.world, plan.start);
    let len = partition.worker_len(plan.rank.worker);
    let mut items = 1024u64.min(len);
    loop {
        let needs = order.shards_needed(&partition, plan.rank, 0..items)?;
        let mut chosen = Vec::new();
        let mut bytes = 0u64;
        let mut full = false;
        for need in &needs {
            let shard = need.shard as usize;
            let cost = ds.shards.get(shard).map_or(0, |s| s.cache_bytes);
            if cost == 0 {
                continue;
            }
            if chosen.len() >= max_shards || (!chosen.is_empty() && bytes + cost > allowance) {
                full = true;
                break;
            }
            bytes += cost;
            chosen.push(shard);
        }
        if full || items >= len {
            return Ok(chosen);
        }
        items = items.saturating_mul(4).min(len);
    }
}

/// Starts the downloads of `shards` on `ps`'s runtime.
pub(crate) fn start(ds: Arc<Inner>, ps: Arc<ProcState>, shards: Vec<usize>) -> Prefetch {
    let shared = Arc::new(Shared::default());
    let driver_shared = Arc::clone(&shared);
    let driver_ps = Arc::clone(&ps);
    let chosen = shards.clone();
    let task = ps.spawn(async move {
        let slots = Arc::new(Semaphore::new(MAX_FETCHES));
        let mut started = 0usize;
        for shard in shards {
            if driver_shared.cancelled.load(Ordering::Relaxed) {
                break;
            }
            // A warm cache costs a `stat` per shard, not an open and check that the stream
            // repeats anyway.
            if ds.shards.get(shard).is_some_and(|src| engine::is_cached(&driver_ps, src)) {
                driver_shared.ready.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                break;
            };
            // The first shard gets the link to itself until it is open (module doc).
            let mut alone = None;
            if started == 0 {
                let Ok(rest) = Arc::clone(&slots)
                    .acquire_many_owned(MAX_FETCHES as u32 - 1)
                    .await
                else {
                    break;
                };
                alone = Some(rest);
            }
            started += 1;
            if driver_shared.cancelled.load(Ordering::Relaxed) {
                break;
            }
            let (ds, ps, shared) = (
                Arc::clone(&ds),
                Arc::clone(&driver_ps),
                Arc::clone(&driver_shared),
            );
            driver_ps.spawn(async move {
                let name = ds.shards.get(shard).map(|s| Arc::clone(&s.name));
                let outcome = match engine::open_shard(ds, ps, shard).await {
                    // Held until committed, so that the downloads run in the order of need.
                    Ok(handle) => {
                        drop(alone);
                        handle.complete().await
                    }
                    Err(e) => Err(e),
                };
                match outcome {
                    Ok(()) => {
                        shared.ready.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        shared.failed.fetch_add(1, Ordering::Relaxed);
                        warn!(shard = ?name, error = %e, "prefetch failed; the stream will fetch it");
                    }
                }
                drop(permit);
            });
        }
        // Every download started has ended once all the slots are free again.
        let _ = slots.acquire_many(MAX_FETCHES as u32).await;
        debug!(
            ready = driver_shared.ready.load(Ordering::Relaxed),
            failed = driver_shared.failed.load(Ordering::Relaxed),
            "prefetch finished"
        );
        driver_shared.end();
    });
    Prefetch {
        shards: chosen,
        shared,
        task: Some(task),
        pid: std::process::id(),
    }
}

/// A prefetch with nothing to download.
pub(crate) fn nothing() -> Prefetch {
    Prefetch {
        shards: Vec::new(),
        shared: Arc::new(Shared::default()),
        task: None,
        pid: std::process::id(),
    }
}
