//! The process's tokio runtime, shared by every dataset of the process and by the Python
//! binding's writer.
//!
//! One per process, not one per dataset: a script that opens a new dataset for each epoch
//! would otherwise start and join the runtime's threads, and spawn its blocking threads afresh,
//! every epoch, before its first sample. It is never shut down: a background download of a
//! dataset already dropped finishes (and commits its shard).
//!
//! A child made by `fork` (Python DataLoader workers) inherits the parent's memory but none of
//! its threads, so the runtime is keyed by the process id: the child makes its own, and the
//! parent's copy is leaked there (dropping it would wait for threads that do not exist).

use std::sync::{Arc, Mutex};

use tokio::runtime::Runtime;

/// The runtime and the process that made it.
static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The runtime slot, held by a thread about to `fork` (see [`crate::fork`]): a thread making
/// the runtime holds it while the runtime starts its threads, and a child forked then would
/// wait for it forever.
pub(crate) struct RuntimeHold(
    #[allow(dead_code)] std::sync::MutexGuard<'static, Option<(u32, Arc<Runtime>)>>,
);

pub(crate) fn hold_runtime() -> RuntimeHold {
    RuntimeHold(RUNTIME.lock().unwrap_or_else(|p| p.into_inner()))
}

/// This process's runtime if it has started already: never starts one (nor its threads).
pub fn started_runtime() -> Option<Arc<Runtime>> {
    let slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    slot.as_ref()
        .filter(|(owner, _)| *owner == std::process::id())
        .map(|(_, rt)| Arc::clone(rt))
}

/// This process's runtime (two worker threads: the I/O is asynchronous, and reading, decoding
/// and file writes run on its blocking threads or the caller's, except a download's writes to
/// the page cache, which run on the worker while they are fast; see `dataset::fetch`), made on
/// first use and again after a fork.
pub fn process_runtime() -> std::io::Result<Arc<Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(Arc::clone(rt));
        }
    }
    if let Some(stale) = slot.take() {
        std::mem::forget(stale);
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardstream-io")
            .enable_all()
            .build()?,
    );
    *slot = Some((pid, Arc::clone(&rt)));
    Ok(rt)
}

/// Runs a blocking call (file-system work: opens, renames, fsyncs, locks) on the runtime's
/// blocking pool, so that it never stalls the threads that drive the downloads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| crate::StreamerError::Engine(format!("blocking task failed: {e}")))?
}
