//! `flock(2)` on small files: the kernel drops the lock when its holder dies, so a crashed run
//! never leaves a folder that looks busy forever.
//!
//! On NFS (EFS) Linux emulates `flock` with POSIX record locks, which other clients see, so a
//! `cache gc` on one machine respects a run on another. Within one process such locks do not
//! exclude each other; the gc and the runs are separate processes.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use rustix::fs::{flock, FlockOperation};
use rustix::io::Errno;

/// Opens (creating if needed) a lock file. Never truncated or replaced: holders must all lock
/// the same inode.
pub(crate) fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Opens an existing lock file; `None` if there is none.
pub(crate) fn open_existing(path: &Path) -> io::Result<Option<File>> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Takes a shared lock, waiting for an exclusive holder (the gc, briefly) to let go.
pub(crate) fn lock_shared(file: &File) -> io::Result<()> {
    retry_interrupted(|| flock(file, FlockOperation::LockShared))
}

/// Tries to take an exclusive lock without waiting: `false` if someone holds the file.
pub(crate) fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    match retry_interrupted(|| flock(file, FlockOperation::NonBlockingLockExclusive)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

fn retry_interrupted(mut op: impl FnMut() -> rustix::io::Result<()>) -> io::Result<()> {
    loop {
        match op() {
            Err(Errno::INTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}
