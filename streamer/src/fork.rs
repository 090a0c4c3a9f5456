//! Keeping `fork` from copying a lock in the middle of its use.
//!
//! A child of `fork` gets a copy of the parent's memory and only the thread that forked. A
//! process-wide lock that another parent thread held at that instant is held forever in the
//! child. The streamer's per-process state is keyed by process id and rebuilt in a child, but
//! two process-wide locks guard that rebuilding itself: the runtime slot
//! ([`crate::runtime`]) and the cache's lock table. A thread about to fork takes both with
//! [`prepare`], forks, and drops the [`ForkHold`] in the parent and in the child, so that no
//! other thread was inside either at the fork.
//!
//! Python DataLoader workers are forked by `os.fork()`; the binding registers this with
//! `os.register_at_fork`. Other holders of process-wide state (the read pools) only try their
//! locks, and per-dataset state is rebuilt in the child without waiting on the parent's.

use crate::cache::{hold_table, TableHold};
use crate::runtime::{hold_runtime, RuntimeHold};

/// The streamer's process-wide locks, held across a `fork`. Drop it right after the fork, in
/// the parent and in the child (the thread that forked is the child's only thread).
#[must_use = "the locks are released when the hold is dropped, which must be after the fork"]
pub struct ForkHold {
    // Released in reverse order of taking: the table, then the runtime slot.
    _table: TableHold,
    _runtime: RuntimeHold,
}

impl std::fmt::Debug for ForkHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkHold")
    }
}

/// Takes the runtime slot and the cache's lock table for a `fork` about to happen. Waits for
/// their current holders, which only update in-memory state while they hold them (making the
/// runtime starts its threads, the longest of these); none of them waits for anything else
/// meanwhile, so this cannot deadlock.
pub fn prepare() -> ForkHold {
    let runtime = hold_runtime();
    let table = hold_table();
    ForkHold {
        _table: table,
        _runtime: runtime,
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
