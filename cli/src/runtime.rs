//! The tokio runtime the commands run their storage calls on.

use anyhow::Context;

/// A multi-threaded runtime with `workers` threads (at least 2: one may block on a channel).
pub fn build(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(2))
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The default number of workers: the machine's cores.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}
