//! A dataset's state in one process: its runtime, its cache handle, its memory budget, its storage
//! clients and the shards it is downloading while serving them ([`ProcState`]), made on first use
//! in each process and again after a `fork` ([`ProcSlot`]).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};

use shardstream_storage::Location;
use tokio::runtime::Runtime;
use tracing::debug;

use super::budget::Budget;
use super::growing::{Growing, Landing};
use crate::cache::{Cache, CacheConfig};
use crate::error::{Result, StreamerError};
use crate::memory::MemoryPlan;

/// What one process needs to fetch: its runtime, its cache handle, and its storage clients.
#[derive(Debug)]
pub(crate) struct ProcState {
    pub pid: u32,
    /// The process's runtime, shared by all its datasets ([`crate::runtime`]).
    rt: Arc<Runtime>,
    pub cache: Cache,
    /// The process's share of `memory_limit`: a budget is per process that streams, and one a
    /// child of `fork` inherited would count the parent's downloads, which never end there.
    pub budget: Budget,
    /// One per stream. Opened again in each process when the dataset was opened by URL: an
    /// HTTP connection pool inherited through fork holds the parent's sockets and tasks.
    pub locations: Vec<Location>,
    /// Shards this process is downloading while serving them, by shard number: a second
    /// opener in this process joins the download instead of waiting on its fetch lock.
    pub(super) inflight: Mutex<HashMap<usize, InFlight>>,
    /// Background work a stream's end waits for (see [`ProcState::settle`]).
    pending: Mutex<Vec<tokio::task::JoinHandle<Result<()>>>>,
}

/// A shard being served while it downloads (see [`ProcState::inflight`]).
#[derive(Debug, Clone)]
pub(super) struct InFlight {
    pub(super) file: Arc<File>,
    pub(super) tmp: PathBuf,
    pub(super) growing: Growing,
    pub(super) landing: Arc<Landing>,
}

/// Shared by every thread inside a [`ProcSlot`] (building or looking up a process's state);
/// taken exclusively across a `fork` ([`crate::fork`]), so that no slot's lock is held at the
/// fork. A child would otherwise wait forever for a dataset's slot that a parent thread was
/// filling (starting the runtime, opening the cache: milliseconds) at that instant.
static SLOTS_IN_USE: RwLock<()> = RwLock::new(());

/// Waits until no thread is inside a [`ProcSlot`], and keeps new ones out until dropped.
pub(crate) fn hold_proc_slots() -> RwLockWriteGuard<'static, ()> {
    SLOTS_IN_USE.write().unwrap_or_else(|e| e.into_inner())
}

/// The per-process state slot of a dataset.
#[derive(Debug, Default)]
pub(crate) struct ProcSlot {
    slot: Mutex<Option<Arc<ProcState>>>,
}

impl ProcSlot {
    /// This process's state if it exists already (for metrics: never starts an engine).
    pub(crate) fn peek(&self) -> Option<Arc<ProcState>> {
        let _in_use = SLOTS_IN_USE.read().unwrap_or_else(|e| e.into_inner());
        let slot = self.slot.lock().ok()?;
        slot.as_ref()
            .filter(|s| s.pid == std::process::id())
            .map(Arc::clone)
    }

    /// This process's state, created on first use and again after a fork.
    pub(crate) fn get(
        &self,
        dir: &Path,
        config: &CacheConfig,
        memory: &MemoryPlan,
        locations: impl FnOnce() -> Result<Vec<Location>>,
    ) -> Result<Arc<ProcState>> {
        let pid = std::process::id();
        let _in_use = SLOTS_IN_USE.read().unwrap_or_else(|e| e.into_inner());
        let mut slot = self
            .slot
            .lock()
            .map_err(|_| StreamerError::Engine("state lock poisoned".into()))?;
        if let Some(state) = slot.as_ref() {
            if state.pid == pid {
                return Ok(Arc::clone(state));
            }
        }
        if let Some(stale) = slot.take() {
            // Inherited from the parent: see the module docs for why it is leaked.
            debug!(
                parent = stale.pid,
                pid, "forked: starting a new fetch engine"
            );
            std::mem::forget(stale);
        }
        let rt = crate::runtime::process_runtime()
            .map_err(|e| StreamerError::Engine(format!("cannot start the runtime: {e}")))?;
        let cache = Cache::open(dir, config.clone())?;
        let locations = locations()?;
        let state = Arc::new(ProcState {
            pid,
            rt,
            cache,
            budget: Budget::new(memory),
            locations,
            inflight: Mutex::default(),
            pending: Mutex::default(),
        });
        *slot = Some(Arc::clone(&state));
        Ok(state)
    }
}

impl ProcState {
    /// Starts `fut` on the engine's runtime.
    pub(crate) fn spawn<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.rt.spawn(fut)
    }

    /// Runs `fut` on the engine's runtime and waits for it from a plain thread.
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let task = self.spawn(fut);
        futures::executor::block_on(task)
            .map_err(|e| StreamerError::Engine(format!("fetch task failed: {e}")))?
    }
}

impl ProcState {
    /// The download of `shard` this process runs now, if any.
    pub(super) fn joinable(&self, shard: usize) -> Option<InFlight> {
        self.inflight.lock().ok()?.get(&shard).cloned()
    }

    /// Takes the ended download of `shard` out of [`Self::joinable`]'s reach.
    pub(super) fn forget_inflight(&self, shard: usize) {
        if let Ok(mut map) = self.inflight.lock() {
            map.remove(&shard);
        }
    }

    /// Waits (from a plain thread) until every shard this process is downloading while serving
    /// it is committed or has failed, and the work started with [`ProcState::spawn_settled`] is
    /// done. A stream calls it at its end: a process that exits right after its last sample
    /// would otherwise abandon those downloads (and the node would fetch them again) or that
    /// work.
    pub(crate) fn settle(&self) {
        let growing: Vec<Growing> = match self.inflight.lock() {
            Ok(map) => map.values().map(|f| f.growing.clone()).collect(),
            Err(_) => Vec::new(),
        };
        for g in growing {
            // A failure was already reported to the readers that needed the shard.
            let _ = g.wait_blocking(u64::MAX);
        }
        let pending = match self.pending.lock() {
            Ok(mut pending) => std::mem::take(&mut *pending),
            Err(_) => return,
        };
        for task in pending {
            // Such work reports its own failures (it only logs them).
            let _ = futures::executor::block_on(task);
        }
    }

    /// Runs `work` in the background; the next [`ProcState::settle`] waits for it.
    pub(crate) fn spawn_settled(
        &self,
        work: impl std::future::Future<Output = Result<()>> + Send + 'static,
    ) {
        let task = self.spawn(work);
        if let Ok(mut pending) = self.pending.lock() {
            pending.push(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dataset_of_a_process_uses_its_one_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let config = CacheConfig::new(1 << 20);
        let first = ProcSlot::default();
        let a = first
            .get(
                &dir.path().join("a"),
                &config,
                &MemoryPlan::new(Some(1 << 20)),
                || Ok(Vec::new()),
            )
            .unwrap();
        let b = ProcSlot::default()
            .get(
                &dir.path().join("b"),
                &config,
                &MemoryPlan::new(Some(1 << 20)),
                || Ok(Vec::new()),
            )
            .unwrap();
        assert!(Arc::ptr_eq(&a.rt, &b.rt), "two datasets share the runtime");
        drop((a, first));
        let c = ProcSlot::default()
            .get(
                &dir.path().join("c"),
                &config,
                &MemoryPlan::new(Some(1 << 20)),
                || Ok(Vec::new()),
            )
            .unwrap();
        assert!(
            Arc::ptr_eq(&b.rt, &c.rt),
            "and a dataset dropped does not take it down"
        );
        assert_eq!(
            c.block_on(async { Ok(7) }).unwrap(),
            7,
            "it still runs work"
        );
    }
}
