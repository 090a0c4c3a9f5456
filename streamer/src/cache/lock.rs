//! Node-wide locks for the cache: `flock(2)` on small files in the cache folder, which the kernel
//! releases when the holding process dies, so no lock outlives its owner.
//!
//! Under the file locks sits one process-wide table with a reader/writer state per lock file. It
//! does two jobs. Threads of one process share a single descriptor (and so a single `flock`) per
//! lock file: readers just bump a count. And the process never holds two descriptors of one lock
//! file, which keeps the locks correct on NFS, where Linux emulates `flock` with POSIX record
//! locks that do not exclude each other within a process and are all dropped when any
//! descriptor of the file is closed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

/// How a lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Any number of holders, across threads and processes.
    Shared,
    /// One holder on the node.
    Exclusive,
}

#[derive(Default)]
struct SlotState {
    readers: usize,
    writer: bool,
    /// A thread of this process is inside a blocking `flock` call for this file.
    pending: bool,
    file: Option<File>,
}

struct Slot {
    /// The process that made it: a guard a child of `fork` inherited must not touch it.
    pid: u32,
    path: PathBuf,
    state: Mutex<SlotState>,
    cv: Condvar,
}

impl Slot {
    fn state(&self) -> MutexGuard<'_, SlotState> {
        // A panic while the state is locked leaves plain counters behind; they stay consistent
        // because every update is a single assignment, so a poisoned lock is safe to reuse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The process-wide table. Keyed by the lock file's path (the cache folder is canonicalized at
/// open, so two `Cache` values on one folder share entries).
struct Table {
    /// The process the slots belong to: a child of `fork` inherits them, but none of the
    /// threads that hold them or wait for them.
    pid: u32,
    slots: HashMap<PathBuf, Arc<Slot>>,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        pid: std::process::id(),
        slots: HashMap::new(),
    })
});

fn table() -> MutexGuard<'static, Table> {
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if t.pid != pid {
        forget_parent_slots(std::mem::take(&mut t.slots));
        t.pid = pid;
    }
    t
}

/// The table, held by a thread about to `fork` (see [`crate::fork`]) so that no other thread is
/// inside it at the fork: a child would otherwise find it locked by a thread it does not have,
/// and wait forever at its first lock. Every holder of the table only updates the map, so the
/// wait is short; nothing holds the table while it waits for anything else.
pub(crate) struct TableHold(#[allow(dead_code)] MutexGuard<'static, Table>);

pub(crate) fn hold_table() -> TableHold {
    TableHold(TABLE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The name of a cache folder's own lock file (`Layout::open_lock`).
const CACHE_LOCK_NAME: &str = "cache.lock";
/// The folder of a cache's per-shard lock files (`Layout::locks_dir`).
const LOCKS_DIR_NAME: &str = "locks";

/// Runs in a child of `fork`, at its first use of the table (before it opens a lock file of its
/// own). The parent's slots say "held" for threads that do not exist here: the child would wait
/// on them forever. And the child's copies of the parent's lock descriptors share the parent's
/// `flock`s, which would then outlive the parent's unlock for as long as the child runs.
///
/// So every descriptor of the child that points at one of those lock files is closed (closing
/// a copy never unlocks what the parent holds: an `flock` lives until its last descriptor
/// closes). Found through `/proc/self/fd`, not through the slots: a parent thread between
/// `open` and recording its descriptor (or half way through closing one) leaves the slots and
/// the descriptors out of step. The slots are then leaked, never dropped: a guard the child
/// inherited finds its slot empty and releases nothing, and nothing closes a descriptor twice.
fn forget_parent_slots(slots: HashMap<PathBuf, Arc<Slot>>) {
    for slot in slots.values() {
        // A slot whose state lock a parent thread held at the fork stays locked here: left as
        // it is (its descriptor, if any, is closed below all the same).
        if let Ok(mut st) = slot.state.try_lock() {
            std::mem::forget(st.file.take());
            st.readers = 0;
            st.writer = false;
            st.pending = false;
        }
    }
    close_descriptors_of(&slots);
    std::mem::forget(slots);
}

/// Closes this process's descriptors of lock files: those of `slots`' keys, and every lock file
/// of a cache folder among them (its `cache.lock`, held by each open cache, names the folder).
/// The folders' lock files are all made by this module, and a parent thread may hold one whose
/// key was not in the table at the fork.
fn close_descriptors_of(slots: &HashMap<PathBuf, Arc<Slot>>) {
    let roots: Vec<&Path> = slots
        .keys()
        .filter(|k| k.file_name().is_some_and(|n| n == CACHE_LOCK_NAME))
        .filter_map(|k| k.parent())
        .collect();
    let is_lock_file = |p: &Path| {
        slots.contains_key(p)
            || roots.iter().any(|root| {
                let parent = p.parent();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                (parent == Some(*root) && name.ends_with(".lock"))
                    || parent == Some(root.join(LOCKS_DIR_NAME).as_path())
            })
    };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        let Ok(target) = std::fs::read_link(format!("/proc/self/fd/{fd}")) else {
            continue;
        };
        if is_lock_file(&target) {
            close_inherited(fd);
        }
    }
}

/// Closes `fd`, a descriptor this child inherited for a lock file of the parent's. Nothing in
/// the child owns it: the slot that recorded it was emptied without closing it, and the parent
/// thread that was opening it does not exist here.
#[allow(unsafe_code)]
fn close_inherited(fd: i32) {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: `fd` is open (just listed in /proc/self/fd) and owned by no live value of this
    // process (see above), so taking ownership and dropping it closes it exactly once.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
}

fn slot(path: &Path) -> Arc<Slot> {
    let mut t = table();
    let pid = t.pid;
    t.slots
        .entry(path.to_path_buf())
        .or_insert_with(|| {
            Arc::new(Slot {
                pid,
                path: path.to_path_buf(),
                state: Mutex::new(SlotState::default()),
                cv: Condvar::new(),
            })
        })
        .clone()
}

/// Drops the table's entry once nobody holds or waits for it, so the table stays as small as the
/// set of locks in use rather than growing with every shard ever seen.
fn prune(slot: &Arc<Slot>) {
    let mut t = table();
    // A slot forgotten at a fork is no longer the table's: the entry for its path, if any, is
    // this process's own.
    if !t
        .slots
        .get(&slot.path)
        .is_some_and(|s| Arc::ptr_eq(s, slot))
    {
        return;
    }
    // Holders and waiters own clones; `2` is the table's plus the caller's.
    if Arc::strong_count(slot) == 2 {
        let st = slot.state();
        if st.readers == 0 && !st.writer && !st.pending {
            drop(st);
            t.slots.remove(&slot.path);
        }
    }
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

fn try_flock(file: &File, mode: Mode) -> io::Result<bool> {
    let op = match mode {
        Mode::Shared => FlockOperation::NonBlockingLockShared,
        Mode::Exclusive => FlockOperation::NonBlockingLockExclusive,
    };
    match flock(file, op) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Takes the file lock, waiting until `deadline` if there is one. `Ok(false)` means the deadline
/// passed. Without a deadline the kernel wakes us when the holder unlocks or dies; with one we
/// poll, backing off to 50 ms, because `flock` has no timed form.
fn flock_wait(file: &File, mode: Mode, deadline: Option<Instant>) -> io::Result<bool> {
    let Some(deadline) = deadline else {
        let op = match mode {
            Mode::Shared => FlockOperation::LockShared,
            Mode::Exclusive => FlockOperation::LockExclusive,
        };
        loop {
            match flock(file, op) {
                Ok(()) => return Ok(true),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    };
    let mut pause = Duration::from_millis(1);
    loop {
        if try_flock(file, mode)? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// A held lock; dropping it releases this holder's share (and the file lock with the last one).
pub(crate) struct LockGuard {
    /// `None` only after [`LockGuard::downgrade`] has moved the hold into a new guard.
    slot: Option<Arc<Slot>>,
    mode: Mode,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("path", &self.slot.as_ref().map(|s| &s.path))
            .field("mode", &self.mode)
            .finish()
    }
}

/// Takes `path` in `mode`, waiting for holders in this and other processes. `Ok(None)` means
/// `deadline` passed first.
pub(crate) fn lock(
    path: &Path,
    mode: Mode,
    deadline: Option<Instant>,
) -> io::Result<Option<LockGuard>> {
    let slot = slot(path);
    let mut st = slot.state();
    loop {
        let free = !st.writer && !st.pending;
        match mode {
            Mode::Shared if free && st.readers > 0 => {
                st.readers += 1;
                drop(st);
                return Ok(Some(LockGuard {
                    slot: Some(slot),
                    mode,
                }));
            }
            Mode::Shared | Mode::Exclusive if free && st.readers == 0 => break,
            _ => {}
        }
        st = match deadline {
            None => slot.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    drop(st);
                    prune(&slot);
                    return Ok(None);
                }
                slot.cv
                    .wait_timeout(st, d - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
    }
    st.pending = true;
    drop(st);
    let taken = open_lock_file(path)
        .and_then(|file| Ok(flock_wait(&file, mode, deadline)?.then_some(file)));
    let mut st = slot.state();
    st.pending = false;
    let out = match taken {
        Ok(Some(file)) => {
            st.file = Some(file);
            match mode {
                Mode::Shared => st.readers = 1,
                Mode::Exclusive => st.writer = true,
            }
            Ok(Some(LockGuard {
                slot: Some(slot.clone()),
                mode,
            }))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    slot.cv.notify_all();
    drop(st);
    if !matches!(out, Ok(Some(_))) {
        prune(&slot);
    }
    out
}

/// Takes `path` exclusively only if nobody in any process holds it, without waiting.
pub(crate) fn try_exclusive(path: &Path) -> io::Result<Option<LockGuard>> {
    let slot = slot(path);
    let mut st = slot.state();
    let out = if st.readers > 0 || st.writer || st.pending {
        None
    } else {
        let file = open_lock_file(path)?;
        if try_flock(&file, Mode::Exclusive)? {
            st.file = Some(file);
            st.writer = true;
            Some(LockGuard {
                slot: Some(slot.clone()),
                mode: Mode::Exclusive,
            })
        } else {
            None
        }
    };
    drop(st);
    if out.is_none() {
        prune(&slot);
    }
    Ok(out)
}

impl LockGuard {
    /// Turns an exclusive hold into a shared one. The kernel does this as unlock-then-lock, so
    /// another process may slip in between; callers re-check what the lock protects afterwards.
    pub(crate) fn downgrade(mut self) -> io::Result<LockGuard> {
        if self.mode == Mode::Shared {
            return Ok(self);
        }
        // Taking the slot out disarms this guard's release, which would close the file.
        let Some(slot) = self.slot.take() else {
            return Err(io::Error::other("lock guard already released"));
        };
        if slot.pid != std::process::id() {
            std::mem::forget(slot);
            return Err(io::Error::other("a lock held by the parent of a fork"));
        }
        let mut st = slot.state();
        st.writer = false;
        st.pending = true;
        let file = st.file.take();
        drop(st);
        let res = match &file {
            Some(f) => flock_wait(f, Mode::Shared, None).map(|_| ()),
            None => Err(io::Error::other("lock file missing from a held lock")),
        };
        let mut st = slot.state();
        st.pending = false;
        let out = match res {
            Ok(()) => {
                st.file = file;
                st.readers = 1;
                Ok(LockGuard {
                    slot: Some(slot.clone()),
                    mode: Mode::Shared,
                })
            }
            Err(e) => Err(e),
        };
        slot.cv.notify_all();
        drop(st);
        if out.is_err() {
            prune(&slot);
        }
        out
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        if slot.pid != std::process::id() {
            // A guard inherited through `fork`: the hold is the parent's. Its slot is no
            // longer the table's (see `forget_parent_slots`), and a parent thread may have held
            // its state lock at the fork, which no thread here would ever release.
            std::mem::forget(slot);
            return;
        }
        let mut st = slot.state();
        match self.mode {
            Mode::Shared => {
                st.readers = st.readers.saturating_sub(1);
                if st.readers == 0 {
                    st.file = None;
                }
            }
            Mode::Exclusive => {
                st.writer = false;
                st.file = None;
            }
        }
        slot.cv.notify_all();
        drop(st);
        prune(&slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_share_one_lock_and_exclude_writers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let a = lock(&path, Mode::Shared, None).unwrap().unwrap();
        let b = lock(&path, Mode::Shared, None).unwrap().unwrap();
        assert!(try_exclusive(&path).unwrap().is_none());
        let deadline = Some(Instant::now() + Duration::from_millis(20));
        assert!(lock(&path, Mode::Exclusive, deadline).unwrap().is_none());
        drop(a);
        assert!(try_exclusive(&path).unwrap().is_none());
        drop(b);
        let x = try_exclusive(&path).unwrap().unwrap();
        let deadline = Some(Instant::now() + Duration::from_millis(20));
        assert!(lock(&path, Mode::Shared, deadline).unwrap().is_none());
        let s = x.downgrade().unwrap();
        assert!(lock(&path, Mode::Shared, None).unwrap().is_some());
        drop(s);
        assert!(!table().slots.contains_key(&path), "idle slots are pruned");
    }

    #[test]
    fn the_fork_cleanup_knows_every_lock_file_of_the_layout() {
        use crate::cache::layout::{KeyId, Layout};
        let root = PathBuf::from("/cache/run/0");
        let layout = Layout::new(root.clone());
        let id = KeyId::of("s3://b/shard.00000.mds");
        assert_eq!(layout.open_lock(), root.join(CACHE_LOCK_NAME));
        assert!(layout.space_lock().to_string_lossy().ends_with(".lock"));
        assert_eq!(layout.space_lock().parent(), Some(root.as_path()));
        let locks = root.join(LOCKS_DIR_NAME);
        for per_shard in [
            layout.fetch_lock(&id),
            layout.pin_lock(&id),
            layout.index_lock(&id),
        ] {
            assert_eq!(per_shard.parent(), Some(locks.as_path()));
        }
    }

    #[test]
    fn a_guard_inherited_through_fork_releases_nothing_and_never_waits() {
        // As a child of `fork` sees a parent's guard: its slot is from another process, and a
        // parent thread held the slot's state lock at the fork.
        let slot = Arc::new(Slot {
            pid: std::process::id().wrapping_add(1),
            path: PathBuf::from("/nonexistent/k.lock"),
            state: Mutex::new(SlotState {
                readers: 1,
                ..SlotState::default()
            }),
            cv: Condvar::new(),
        });
        let held = slot.state.lock().unwrap();
        let guard = LockGuard {
            slot: Some(Arc::clone(&slot)),
            mode: Mode::Shared,
        };
        drop(guard);
        assert_eq!(held.readers, 1, "the parent's count is left alone");
        let guard = LockGuard {
            slot: Some(Arc::clone(&slot)),
            mode: Mode::Exclusive,
        };
        assert!(guard.downgrade().is_err());
        drop(held);
    }

    #[test]
    fn a_waiting_writer_wakes_when_the_reader_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.lock");
        let reader = lock(&path, Mode::Shared, None).unwrap().unwrap();
        let p = path.clone();
        let writer = std::thread::spawn(move || lock(&p, Mode::Exclusive, None).unwrap().is_some());
        drop(reader);
        assert!(writer.join().unwrap());
    }
}
