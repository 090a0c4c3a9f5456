//! Keeping `fork` from copying a lock in the middle of its use.
//!
//! A child of `fork` gets a copy of the parent's memory and only the thread that forked. A
//! process-wide lock that another parent thread held at that instant is held forever in the
//! child. The streamer's per-process state is keyed by process id and rebuilt in a child, but
//! locks guard that rebuilding itself: each dataset's per-process slot (held while a thread
//! starts the dataset's engine in this process), the runtime slot ([`crate::runtime`]) and the
//! cache's lock table. A thread about to fork takes them all with [`prepare`], forks, and drops
//! the [`ForkHold`] in the parent and in the child, so that no other thread was inside any of
//! them at the fork.
//!
//! The Python binding takes the hold in a `pthread_atfork` prepare handler and drops it in the
//! parent and child handlers: libc runs them inside `fork()` itself, after Python's own fork
//! hooks, so no Python code (which may hand the GIL to a thread that wants one of these locks)
//! runs while the hold is taken. Other holders of process-wide state (the read pools) only try
//! their locks.

use std::sync::RwLockWriteGuard;

use crate::cache::{hold_table, TableHold};
use crate::dataset::hold_proc_slots;
use crate::runtime::{hold_runtime, RuntimeHold};

/// The streamer's process-wide locks, held across a `fork`. Drop it right after the fork, in
/// the parent and in the child (the thread that forked is the child's only thread).
#[must_use = "the locks are released when the hold is dropped, which must be after the fork"]
pub struct ForkHold {
    // Released in reverse order of taking: the table, the runtime slot, the datasets' slots.
    _table: TableHold,
    _runtime: RuntimeHold,
    _slots: RwLockWriteGuard<'static, ()>,
}

impl std::fmt::Debug for ForkHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkHold")
    }
}

/// Takes the datasets' per-process slots, the runtime slot and the cache's lock table for a
/// `fork` about to happen, in that order (a thread filling a dataset's slot takes the other
/// two inside it, never the reverse, so this cannot deadlock). Waits for their current holders:
/// a dataset's first use in this process (starting the runtime, opening the cache folder, which
/// may wait for another process's crash recovery of it) is the longest; the others only update
/// memory while they hold their lock.
pub fn prepare() -> ForkHold {
    let slots = hold_proc_slots();
    let runtime = hold_runtime();
    let table = hold_table();
    ForkHold {
        _table: table,
        _runtime: runtime,
        _slots: slots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_is_released_when_dropped() {
        let hold = prepare();
        drop(hold);
        // Both are free again: the runtime and the lock table work.
        let rt = crate::runtime::process_runtime().unwrap();
        assert_eq!(rt.block_on(async { 3 }), 3);
        let dir = tempfile::tempdir().unwrap();
        let cache = crate::cache::Cache::open(dir.path(), crate::cache::CacheConfig::new(1 << 20));
        assert!(cache.is_ok());
    }
}
