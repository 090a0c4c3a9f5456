//! The Rust side's log lines in Python's `logging`: every `tracing` event of the engine (a retry,
//! an outage, a slow or damaged download) becomes a record of a logger under `shardstream`
//! (`shardstream.shardstream_streamer.dataset.engine`, ...), so a training script sees warnings
//! while they happen instead of one error after the whole retry window.
//!
//! `tracing`'s `log` feature turns events into `log` records when no `tracing` subscriber is
//! installed (a Python process has none), and `pyo3-log` hands them to Python. Python's levels
//! are cached on the Rust side, so an event below the logger's level costs a cache lookup and
//! never takes the GIL: the engine's per-sample `debug!`s stay off the hot path. A script that
//! changes a level after importing `shardstream` calls `shardstream.refresh_logging()`.

use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3_log::{Caching, Logger, ResetHandle};

/// The bridge, installed once per process (a second extension that installed a `log` logger
/// first keeps it, and this one stays off).
static BRIDGE: OnceLock<Option<ResetHandle>> = OnceLock::new();

/// Installs the bridge (at import).
pub fn install(py: Python<'_>) -> PyResult<()> {
    let logger = Logger::new(py, Caching::LoggersAndLevels)?
        .set_prefix("shardstream")
        .filter(log::LevelFilter::Debug);
    BRIDGE.get_or_init(|| logger.install().ok());
    Ok(())
}

/// Forgets the cached Python loggers and levels, so that a level set after import applies.
#[pyfunction]
pub fn refresh_logging() {
    if let Some(Some(handle)) = BRIDGE.get() {
        handle.reset();
    }
}
