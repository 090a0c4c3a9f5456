//! Which opens the kernel reads directly from a cache file (FUSE passthrough) and which it
//! sends to the daemon, kept consistent with the kernel's rules.
//!
//! The kernel holds one I/O mode per inode: while any open of an inode reads through the daemon
//! (its page cache), an open of it that asks for passthrough fails with EIO, and the reverse;
//! and every passthrough open of one inode must name the same backing file. [`IoModes`] makes
//! each open's choice under one lock: an inode with a backing keeps using it, an inode with
//! opens through the daemon keeps reading through the daemon, and a fresh inode gets a backing
//! if one can be made. The backing is closed when the inode's last passthrough open is
//! released. Generic over the backing type so that the rules are tested without a mount.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// How one open is served.
#[derive(Debug)]
pub enum Mode<B> {
    /// Reads come to the daemon (through the kernel's page cache of the mount).
    Daemon,
    /// The kernel reads this backing file itself.
    Passthrough(Arc<B>),
}

#[derive(Debug)]
enum InodeIo<B> {
    Daemon { opens: usize },
    Passthrough { backing: Arc<B>, opens: usize },
}

/// The I/O mode of every open file that could use passthrough.
#[derive(Debug)]
pub struct IoModes<B> {
    state: Mutex<State<B>>,
}

#[derive(Debug)]
struct State<B> {
    inodes: HashMap<u64, InodeIo<B>>,
    /// Open handle -> its inode and whether it is a passthrough open.
    handles: HashMap<u64, (u64, bool)>,
}

impl<B> Default for IoModes<B> {
    fn default() -> Self {
        IoModes {
            state: Mutex::new(State {
                inodes: HashMap::new(),
                handles: HashMap::new(),
            }),
        }
    }
}

impl<B> IoModes<B> {
    /// Decides how open `fh` of inode `ino` is served: the inode's backing if it has one;
    /// through the daemon if other opens of it are; else a backing from `make` (which
    /// registers the backing file with the kernel; `None` when it cannot), or the daemon.
    pub fn open(&self, ino: u64, fh: u64, make: impl FnOnce() -> Option<B>) -> Mode<B> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mode = match state.inodes.get_mut(&ino) {
            Some(InodeIo::Passthrough { backing, opens }) => {
                *opens += 1;
                Mode::Passthrough(Arc::clone(backing))
            }
            Some(InodeIo::Daemon { opens }) => {
                *opens += 1;
                Mode::Daemon
            }
            None => match make() {
                Some(b) => {
                    let backing = Arc::new(b);
                    state.inodes.insert(
                        ino,
                        InodeIo::Passthrough {
                            backing: Arc::clone(&backing),
                            opens: 1,
                        },
                    );
                    Mode::Passthrough(backing)
                }
                None => {
                    state.inodes.insert(ino, InodeIo::Daemon { opens: 1 });
                    Mode::Daemon
                }
            },
        };
        let direct = matches!(mode, Mode::Passthrough(_));
        state.handles.insert(fh, (ino, direct));
        mode
    }

    /// Forgets open `fh`; the inode's backing is dropped (closed) with its last open.
    /// Handles that never went through [`IoModes::open`] are ignored.
    pub fn release(&self, fh: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((ino, _)) = state.handles.remove(&fh) else {
            return;
        };
        let last = match state.inodes.get_mut(&ino) {
            Some(InodeIo::Daemon { opens } | InodeIo::Passthrough { opens, .. }) => {
                *opens -= 1;
                *opens == 0
            }
            None => false,
        };
        if last {
            state.inodes.remove(&ino);
        }
    }

    /// Open handles served by passthrough now.
    pub fn passthrough_opens(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.handles.values().filter(|(_, direct)| *direct).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A backing that counts how many exist, so the test sees when one is closed.
    struct Backing<'a>(u32, &'a AtomicUsize);
    impl<'a> Backing<'a> {
        fn new(id: u32, live: &'a AtomicUsize) -> Self {
            live.fetch_add(1, Ordering::SeqCst);
            Backing(id, live)
        }
    }
    impl Drop for Backing<'_> {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn id(m: &Mode<Backing<'_>>) -> Option<u32> {
        match m {
            Mode::Passthrough(b) => Some(b.0),
            Mode::Daemon => None,
        }
    }

    #[test]
    fn one_backing_per_inode_closed_with_its_last_open() {
        let live = AtomicUsize::new(0);
        let modes = IoModes::default();
        let a = modes.open(7, 1, || Some(Backing::new(100, &live)));
        // A second open reuses the inode's backing; `make` is not called.
        let b = modes.open(7, 2, || -> Option<Backing<'_>> { panic!("made twice") });
        assert_eq!((id(&a), id(&b)), (Some(100), Some(100)));
        assert_eq!(modes.passthrough_opens(), 2);
        drop((a, b));
        modes.release(1);
        assert_eq!(live.load(Ordering::SeqCst), 1, "still open once");
        modes.release(2);
        assert_eq!(live.load(Ordering::SeqCst), 0, "closed with the last open");
        // A later open makes a new one.
        let c = modes.open(7, 3, || Some(Backing::new(101, &live)));
        assert_eq!(id(&c), Some(101));
    }

    #[test]
    fn an_inode_read_through_the_daemon_gets_no_passthrough_until_it_is_closed() {
        let live = AtomicUsize::new(0);
        let modes = IoModes::default();
        // The first open could not get a backing (e.g. the capability is missing).
        assert!(id(&modes.open(5, 1, || None)).is_none());
        // While it is open, a backing could exist, but the kernel would refuse a mixed inode.
        let b = modes.open(5, 2, || Some(Backing::new(1, &live)));
        assert!(id(&b).is_none());
        assert_eq!(live.load(Ordering::SeqCst), 0, "make was not called");
        modes.release(1);
        modes.release(2);
        let c = modes.open(5, 3, || Some(Backing::new(2, &live)));
        assert_eq!(id(&c), Some(2));
        // Other inodes are independent; unknown handles are ignored.
        assert!(id(&modes.open(6, 4, || None)).is_none());
        modes.release(99);
        assert_eq!(modes.passthrough_opens(), 1);
    }
}
