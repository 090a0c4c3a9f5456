//! One tokio runtime per process, created on first use.
//!
//! A DataLoader worker started with `fork` inherits the parent's memory but none of its threads,
//! so a runtime made before the fork is dead in the child. The runtime is therefore keyed by the
//! process id: a child makes its own, and the parent's copy is forgotten (dropping it would wait
//! for threads that do not exist in the child).

use std::sync::{Arc, Mutex, OnceLock};

use pyo3::PyResult;
use tokio::runtime::Runtime;

/// The runtime and the process that made it.
type Owned = Option<(u32, Arc<Runtime>)>;

static RUNTIME: OnceLock<Mutex<Owned>> = OnceLock::new();

/// The current process's runtime (two worker threads: the I/O is asynchronous, decoding is not
/// done on it).
pub fn runtime() -> PyResult<Arc<Runtime>> {
    let cell = RUNTIME.get_or_init(|| Mutex::new(None));
    let mut guard = cell.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let pid = std::process::id();
    if let Some((owner, rt)) = guard.as_ref() {
        if *owner == pid {
            return Ok(Arc::clone(rt));
        }
    }
    if let Some(stale) = guard.take() {
        // Inherited through fork: its threads are gone; never drop it.
        std::mem::forget(stale);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("shardstream-io")
        .enable_all()
        .build()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start the I/O runtime: {e}"))
        })?;
    let rt = Arc::new(rt);
    *guard = Some((pid, Arc::clone(&rt)));
    Ok(rt)
}
