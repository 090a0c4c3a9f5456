//! The process's tokio runtime for the binding's own I/O (the writer's uploads, every checkpoint
//! call): the streamer's ([`shardstream_streamer::runtime`]), which its datasets use too, so that
//! a process runs one runtime whatever it does. Made anew in a forked child (DataLoader workers).

use std::sync::Arc;

use pyo3::PyResult;
use tokio::runtime::Runtime;

/// The current process's runtime.
pub fn runtime() -> PyResult<Arc<Runtime>> {
    shardstream_streamer::runtime::process_runtime().map_err(|e| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start the I/O runtime: {e}"))
    })
}
