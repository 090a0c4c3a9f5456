//! What the process does around `fork` (DataLoader workers): frees its kept read buffers before,
//! and holds the streamer's process-wide locks across it.

use pyo3::prelude::*;

/// Frees the read buffers the process keeps for its next datasets (called before `fork`; see
/// `shardstream_streamer::buffers::release_kept_buffers`), and hands the memory back to the
/// kernel: freed 1 MiB buffers usually stay in malloc's free lists, which the children would
/// inherit all the same. Holds the GIL: it only frees memory, and Python's fork hooks run with
/// it. Trims only when buffers were freed (a DataLoader forks once per worker).
#[pyfunction]
fn release_read_buffers() {
    if shardstream_streamer::buffers::release_kept_buffers() > 0 {
        crate::allocator::trim();
    }
}

thread_local! {
    /// The streamer's process-wide locks, held by the forking thread from the prepare handler
    /// to the parent's or child's handler (`register_fork_handlers`).
    static FORK_HOLD: std::cell::RefCell<Option<shardstream_streamer::fork::ForkHold>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: takes the streamer's process-wide locks
/// (`shardstream_streamer::fork`) so that no other thread is inside one at the fork.
///
/// Not a Python `os.register_at_fork` hook: Python may run other hooks (Python code) after
/// it, and the interpreter can hand the GIL to another thread between them; a thread dropping
/// a dataset with the GIL held then waited for the lock table this thread held, while this
/// thread waited for the GIL (found by `tests/python/test_fork_hold.py`). libc runs this
/// handler inside `fork()` itself, after every Python hook, with no Python code until the
/// parent or child handler has released the locks. The holders of these locks never need the
/// GIL, so the forking thread holding it cannot block them.
extern "C" fn fork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        FORK_HOLD.with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                if h.is_none() {
                    *h = Some(shardstream_streamer::fork::prepare());
                }
            }
        });
    });
}

/// `pthread_atfork` parent and child handler: releases what `fork_prepare` took.
extern "C" fn fork_release() {
    let _ = std::panic::catch_unwind(|| {
        FORK_HOLD.with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                drop(h.take());
            }
        });
    });
}

/// Registers the fork handlers once per process (at module import; a forked child inherits
/// them, as libc keeps the registrations across `fork`).
#[cfg(unix)]
#[allow(unsafe_code)] // one FFI call registering three functions without arguments
fn register_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions without arguments that live for the
        // whole program, never unwind (each catches panics), and only lock and unlock Rust
        // mutexes and touch this thread's thread-local storage.
        let rc = unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_release), Some(fork_release))
        };
        if rc != 0 {
            tracing::warn!(
                rc,
                "pthread_atfork failed: forks while other threads stream may hang"
            );
        }
    });
}

#[cfg(not(unix))]
fn register_fork_handlers() {}

/// Adds `release_read_buffers` and registers the fork handlers.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(release_read_buffers, m)?)?;
    register_fork_handlers();
    Ok(())
}
