//! Blocking calls from Python: the one way this binding waits for Rust work.
//!
//! Every wait releases the GIL and wakes every [`POLL`] to run Python's signal handlers, so that
//! Ctrl-C raises `KeyboardInterrupt` in a call blocked on storage. All of them run one loop
//! (`released_wait`):
//! - [`wait`] and [`wait_until`]: anything that can wait a bounded time (a stream's channel, a
//!   prefetch);
//! - [`run`]: a blocking Rust call on a helper thread, which finishes on its own after Ctrl-C;
//! - [`block_on`]: a future on the process runtime, dropped on Ctrl-C (which aborts what it was
//!   doing: a checkpoint file's multipart upload).

use std::future::Future;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, RecvTimeoutError};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often a blocked wait wakes up to check for Ctrl-C.
pub const POLL: Duration = Duration::from_millis(50);

/// Calls `step` with the GIL released and a slice of at most [`POLL`] (less near `deadline`)
/// until it returns a value, taking the GIL between slices to run Python's signal handlers.
/// `Ok(None)` once `deadline` has passed.
pub fn wait_until<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    step: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    py.detach(|| released_wait(deadline, step))
}

/// [`wait_until`] without a deadline.
pub fn wait<T: Send>(
    py: Python<'_>,
    step: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<T> {
    py.detach(|| released_wait(None, step).map(|value| value.ok_or_else(no_answer)))?
}

/// The loop of every wait, on a thread that has released the GIL.
fn released_wait<T>(
    deadline: Option<Instant>,
    mut step: impl FnMut(Duration) -> Option<T>,
) -> PyResult<Option<T>> {
    loop {
        let slice = deadline.map_or(POLL, |d| {
            POLL.min(d.saturating_duration_since(Instant::now()))
        });
        if let Some(value) = step(slice) {
            return Ok(Some(value));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        Python::attach(|py| py.check_signals())?;
    }
}

fn no_answer() -> PyErr {
    PyRuntimeError::new_err("a shardstream helper thread stopped without an answer")
}

/// Runs `f` on a helper thread and waits for it (see [`wait`]): a call blocked on storage
/// still answers Ctrl-C, and the helper finishes on its own. Once the process runtime runs, the
/// helper is one of its blocking threads, which stay for the next calls (starting and joining a
/// thread for each call cost more than a random-access read); before, a thread of its own, so
/// that opening a dataset starts no runtime.
pub fn run<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = bounded::<T>(1);
    let job = move || {
        let _ = tx.send(f());
    };
    match shardstream_streamer::runtime::started_runtime() {
        Some(rt) => drop(rt.spawn_blocking(job)),
        None => drop(
            std::thread::Builder::new()
                .name("shardstream-call".into())
                .spawn(job)
                .map_err(|e| {
                    PyRuntimeError::new_err(format!("cannot start a helper thread: {e}"))
                })?,
        ),
    }
    let answer = wait(py, |slice| match rx.recv_timeout(slice) {
        Ok(value) => Some(Some(value)),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => Some(None),
    })?;
    answer.ok_or_else(no_answer)
}

/// Runs the future `make` returns on the process runtime, driven from this thread as
/// `Runtime::block_on` drives it, and waits for it (see [`wait`]). On Ctrl-C the future is
/// dropped unfinished, inside the runtime: dropping some futures spawns their cleanup (a
/// multipart upload's abort). The future is made once the GIL is released, so it need not be
/// `Send`; what `make` captures must be.
pub fn block_on<F>(py: Python<'_>, make: impl FnOnce() -> F + Send) -> PyResult<F::Output>
where
    F: Future,
    F::Output: Send,
{
    let rt = crate::runtime::runtime()?;
    py.detach(move || {
        // Made before the future, so dropped after it.
        let _inside = rt.enter();
        let mut fut = std::pin::pin!(make());
        let out = released_wait(None, |slice| {
            rt.block_on(tokio::time::timeout(slice, fut.as_mut())).ok()
        });
        out?.ok_or_else(no_answer)
    })
}
