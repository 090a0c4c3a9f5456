//! Worker arenas: the bytes of a column batch cross from a DataLoader worker to the training
//! process through shared memory instead of through the worker's pipe.
//!
//! A batch that a worker yields is pickled, written to a pipe, read back and unpickled: at
//! 10 KB samples that is four copies of a 640 KB batch and as many freshly faulted
//! allocations, which cost more than reading the batch from its shard. In a worker,
//! `iter_batches` lays each variable column's bytes into a slot of an arena, a `memfd` the
//! worker maps once. Pickling a [`Buffer`](crate::buffer::Buffer) over a slot (through
//! `multiprocessing`'s `ForkingPickler`, which a DataLoader uses; plain `pickle` still gives
//! `bytes`) sends only the arena's address and the slot; the receiving process maps the arena
//! once (through `/proc/<pid>/fd/<fd>`) and hands out a `Buffer` over the same pages.
//!
//! Each slot has a holder count in the arena's header: the worker's buffer holds it, each
//! pickled copy adds one, and the receiving side's buffer gives its one back when Python drops
//! it. A slot is reused only at zero, so neither side ever sees its bytes change. Each copy sent
//! is also counted as unclaimed until a receiver attaches it, and the address names the slot's
//! generation (bumped at every reuse): unpickling one message twice, or an address of a slot
//! since reused, is an error instead of a second release or another batch's bytes. A batch whose
//! message is never read (a DataLoader dropped mid-epoch) keeps its slot: the arena has a few
//! slots, and when none is free a batch is gathered on the heap and pickled as `bytes`, as
//! without an arena. Nothing waits for a slot.
//!
//! The file is sealed against resizing, and a receiver checks the header (magic, a random
//! token, the slot count and size) before it uses anything in it.
//!
//! The arena's memory is the binding's batch-pool share of `memory_limit` (it replaces the
//! pool in a worker); the mapped pages count once in the process tree's PSS.

// Shared memory is mapped and read through raw pointers; this module and `buffer` are the
// binding's only `unsafe`, and each use says why it holds.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Marks an arena's header ("SSARENA1").
const MAGIC: u64 = 0x5353_4152_454e_4131;
/// Header: magic, token, slot count, slot size; then [`SlotMeta`] per slot.
const HEADER_FIXED: usize = 32;
/// Per slot: holder count, unclaimed sends, generation, unused (u32 each).
const SLOT_META: usize = 16;
/// The seals an arena has: its size never changes.
const ARENA_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// Slot data starts at a page boundary past the header.
const PAGE: usize = 4096;
/// Slots per arena: a worker has at most `prefetch_factor` (2) batches in the queue, one being
/// pickled, one being gathered and the consumer's current one; two spare.
pub const SLOTS: usize = 8;
/// A column batch smaller than this goes through the pipe: copying it costs less than sharing
/// it (a Python reducer call on one side, a lookup of the mapping on the other; at 100 B samples,
/// 6.4 KB batches were 5-10 % slower shared).
pub const MIN_SHARED_BYTES: usize = 64 * 1024;
/// Fewer slots than this is no arena: the batches would mostly fall back to the heap.
pub const MIN_SLOTS: usize = 4;

/// One arena: a shared, anonymous file mapped into this process.
pub struct Arena {
    base: *mut u8,
    len: usize,
    slots: usize,
    slot_bytes: usize,
    token: u64,
    /// This process's descriptor of the arena, kept open (for the process that made it, so
    /// that receivers can open `/proc/<pid>/fd/<fd>`).
    _open: OwnedFd,
    /// The maker's pid and descriptor number: the arena's address in `/proc`.
    pid: u32,
    fd_number: i32,
    inode: u64,
    /// Whether `take` has said (once) that every slot was held.
    exhausted: std::sync::atomic::AtomicBool,
}

// SAFETY: the mapping is owned by the `Arena` and unmapped only in its `Drop`, after every
// `Arc` clone (and so every slot view) is gone. Concurrent access goes through the atomics of
// the header or through slots, each written by one holder before it is shared and read-only
// after; moving or sharing the struct between threads moves nothing the kernel cares about.
unsafe impl Send for Arena {}
// SAFETY: see `Send`: `&Arena` only gives atomic header access and read-only slot views.
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping this struct made or attached, unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// The header's length, a whole number of pages (`slots` ≤ [`SLOTS`]).
fn header_len(slots: usize) -> usize {
    (HEADER_FIXED + SLOT_META * slots).div_ceil(PAGE) * PAGE
}

/// The counters of one slot, in the header every mapping process shares.
struct SlotMeta<'a> {
    /// This process's buffers over the slot, the other processes' ones, and sent copies not
    /// yet received; the slot is free at 0.
    holders: &'a AtomicU32,
    /// Copies sent and not yet attached by a receiver.
    unclaimed: &'a AtomicU32,
    /// Bumped each time the slot is taken, so an address of an earlier use is refused.
    generation: &'a AtomicU32,
}

/// Subtracts 1 unless at 0; false when it was 0.
fn release(count: &AtomicU32) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok()
}

impl Arena {
    /// A new arena of `slots` slots of `slot_bytes` each (pages are only allocated when a slot
    /// is first written).
    pub fn create(slots: usize, slot_bytes: usize) -> io::Result<Arc<Arena>> {
        let slot_bytes = slot_bytes.div_ceil(PAGE) * PAGE;
        let len = header_len(slots) + slots * slot_bytes;
        let name = CString::new("shardstream-batches").map_err(io::Error::other)?;
        // SAFETY: a valid NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = File::from(fd);
        file.set_len(len as u64)?;
        let inode = file.metadata()?.ino();
        let fd = OwnedFd::from(file);
        // A receiver maps the whole length: nobody may shrink the file under its mapping.
        // SAFETY: fcntl on a descriptor this function owns; the result is checked.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, ARENA_SEALS) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let base = map(&fd, len)?;
        let token = random_token()?;
        let arena = Arena {
            base,
            len,
            slots,
            slot_bytes,
            token,
            fd_number: fd.as_raw_fd(),
            _open: fd,
            inode,
            pid: std::process::id(),
            exhausted: Default::default(),
        };
        // SAFETY: the header lies inside the fresh mapping (len > HEADER_FIXED) and is aligned
        // (the mapping is page-aligned); nothing else sees the arena yet.
        unsafe {
            let h = arena.base.cast::<u64>();
            h.add(1).write(token);
            h.add(2).write(slots as u64);
            h.add(3).write(slot_bytes as u64);
            // Published last: a reader that sees the magic sees the rest.
            (*h.cast::<AtomicU64>()).store(MAGIC, Ordering::Release);
        }
        Ok(Arc::new(arena))
    }

    /// Maps the arena another process made, through its descriptor in `/proc`; checks that it
    /// is the same file (inode) and arena (token) the message named.
    fn attach(pid: u32, fd_in_maker: i32, inode: u64, token: u64) -> io::Result<Arc<Arena>> {
        let path = format!("/proc/{pid}/fd/{fd_in_maker}");
        let file = File::options().read(true).write(true).open(&path)?;
        let meta = file.metadata()?;
        if meta.ino() != inode {
            return Err(io::Error::other(format!(
                "{path} is no longer the worker's batch arena"
            )));
        }
        let len = usize::try_from(meta.len()).map_err(io::Error::other)?;
        if len < HEADER_FIXED {
            return Err(io::Error::other(format!("{path}: arena header cut short")));
        }
        // SAFETY: fcntl on a descriptor this function owns; the result is checked.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & ARENA_SEALS != ARENA_SEALS {
            return Err(io::Error::other(format!(
                "{path} is not sealed as a batch arena"
            )));
        }
        let fd = OwnedFd::from(file);
        let base = map(&fd, len)?;
        // SAFETY: `base` maps at least HEADER_FIXED bytes, page-aligned.
        let (magic, tok, slots, slot_bytes) = unsafe {
            let h = base.cast::<u64>();
            (
                (*h.cast::<AtomicU64>()).load(Ordering::Acquire),
                h.add(1).read(),
                h.add(2).read() as usize,
                h.add(3).read() as usize,
            )
        };
        let arena = Arena {
            base,
            len,
            slots,
            slot_bytes,
            token: tok,
            _open: fd,
            fd_number: fd_in_maker,
            inode,
            pid,
            exhausted: Default::default(),
        };
        let fits = (1..=SLOTS).contains(&slots)
            && slot_bytes > 0
            && slot_bytes % PAGE == 0
            && slots
                .checked_mul(slot_bytes)
                .and_then(|d| d.checked_add(header_len(slots)))
                .is_some_and(|need| need <= len);
        if magic != MAGIC || tok != token || !fits {
            return Err(io::Error::other(format!(
                "{path} is not the batch arena the message named"
            )));
        }
        Ok(Arc::new(arena))
    }

    /// The counters of `slot` (`slot < self.slots`).
    fn meta(&self, slot: usize) -> SlotMeta<'_> {
        debug_assert!(slot < self.slots);
        // SAFETY: the counters lie inside the header of the mapping (header_len covers
        // SLOT_META bytes per slot), 4-byte aligned, and every process that maps the arena only
        // ever accesses them atomically.
        let at = |k: usize| unsafe {
            &*self
                .base
                .add(HEADER_FIXED + SLOT_META * slot + 4 * k)
                .cast::<AtomicU32>()
        };
        SlotMeta {
            holders: at(0),
            unclaimed: at(1),
            generation: at(2),
        }
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        // SAFETY: `slot < self.slots`, so the slot lies inside the mapping.
        unsafe {
            self.base
                .add(header_len(self.slots) + slot * self.slot_bytes)
        }
    }

    /// A free slot to write a batch column into, held by the caller; `None` when every slot is
    /// held.
    pub fn take(self: &Arc<Self>) -> Option<SlotWriter> {
        let taken = (0..self.slots).find_map(|slot| {
            let meta = self.meta(slot);
            meta.holders
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            // Only the holder of a free slot writes these.
            meta.unclaimed.store(0, Ordering::Relaxed);
            meta.generation.fetch_add(1, Ordering::Release);
            Some(SlotWriter(SlotBytes {
                arena: Arc::clone(self),
                slot,
                len: 0,
                holder: std::process::id(),
            }))
        });
        if taken.is_none() && !self.exhausted.swap(true, Ordering::Relaxed) {
            tracing::info!(
                slots = self.slots,
                "every slot of this worker's batch arena is held (batches kept, or sent and \
                 never received); batches travel as bytes until one is free"
            );
        }
        taken
    }
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a shared read-write mapping of `len` bytes of a file at least that long; the
    // result is checked and owned by the `Arena` that unmaps it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// 64 random bits from the kernel. Not `RandomState`: its keys are drawn once per process and
/// a forked worker inherits them, so its hash of its pid would be the same in every fork.
fn random_token() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom writes at most `buf.len()` bytes into `buf`; the count is checked.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(buf))
}

/// A slot being filled by this process (holder count 1): the view it becomes, still growing.
/// Dropped unfinished, it gives the slot back like any view.
pub struct SlotWriter(SlotBytes);

impl SlotWriter {
    /// Appends `value`; `false` (and nothing written) when the slot has no room for it.
    pub fn push(&mut self, value: &[u8]) -> bool {
        let w = &mut self.0;
        if value.len() > w.arena.slot_bytes - w.len {
            return false;
        }
        // SAFETY: the range lies inside this slot (checked above), which only this writer
        // holds (count 1, taken by compare-exchange), and `value` is not in the arena's slot.
        unsafe {
            std::ptr::copy_nonoverlapping(
                value.as_ptr(),
                w.arena.slot_ptr(w.slot).add(w.len),
                value.len(),
            );
        }
        w.len += value.len();
        true
    }

    /// What was written so far.
    pub fn written(&self) -> &[u8] {
        self.0.as_ref()
    }

    /// The written bytes, read-only from now on; the slot is freed when the last holder
    /// (this one and any process it was sent to) lets go.
    pub fn finish(self) -> SlotBytes {
        self.0
    }
}

/// One holder's read-only view of a slot's bytes (an owner for `Bytes::from_owner`).
pub struct SlotBytes {
    arena: Arc<Arena>,
    slot: usize,
    len: usize,
    /// The process that holds the slot: a copy a forked child inherits (the main process forks
    /// the next epoch's workers while it may still hold batches) must not give the parent's
    /// hold back when the child drops it.
    holder: u32,
}

impl AsRef<[u8]> for SlotBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the slot is held (count ≥ 1 including this holder), so no other process
        // writes it until this view is dropped (a `SlotWriter` writes only past `len`); `len`
        // is within the slot (checked on attach, by `push` while writing).
        unsafe { std::slice::from_raw_parts(self.arena.slot_ptr(self.slot), self.len) }
    }
}

impl Drop for SlotBytes {
    fn drop(&mut self) {
        if self.holder == std::process::id() && !release(self.arena.meta(self.slot).holders) {
            tracing::warn!(
                slot = self.slot,
                "a batch arena slot was released more often than it was held"
            );
        }
    }
}

/// What a pickled slot says: enough for another process to find and check it:
/// `(pid, fd, inode, token, slot, generation, len)`.
pub type SlotAddress = (u32, i32, u64, u64, usize, u32, usize);

impl SlotBytes {
    /// Counts a copy that is about to be sent (a holder, unclaimed until a receiver attaches
    /// it), and says where it is.
    pub fn share(&self) -> SlotAddress {
        let a = &self.arena;
        let meta = a.meta(self.slot);
        meta.holders.fetch_add(1, Ordering::AcqRel);
        meta.unclaimed.fetch_add(1, Ordering::AcqRel);
        let generation = meta.generation.load(Ordering::Acquire);
        (
            a.pid,
            a.fd_number,
            a.inode,
            a.token,
            self.slot,
            generation,
            self.len,
        )
    }

    /// The bytes of a slot another process shared; the sent copy's hold becomes this view's.
    /// Refused when the address is not a sent copy still unclaimed (already received, or the
    /// slot since reused).
    pub fn attach(address: SlotAddress) -> io::Result<SlotBytes> {
        let (pid, fd, inode, token, slot, generation, len) = address;
        let arena = attached(pid, fd, inode, token)?;
        if slot >= arena.slots || len > arena.slot_bytes {
            return Err(io::Error::other(format!(
                "slot {slot} ({len} bytes) is outside worker {pid}'s batch arena"
            )));
        }
        let meta = arena.meta(slot);
        // The unclaimed copy holds the slot, so its generation cannot change between the
        // check and the claim unless the address was never (or is no longer) a sent copy.
        if meta.generation.load(Ordering::Acquire) != generation || !release(meta.unclaimed) {
            return Err(io::Error::other(format!(
                "slot {slot} of worker {pid}'s batch arena was already received, or reused \
                 since (a message unpickled twice?)"
            )));
        }
        Ok(SlotBytes {
            arena,
            slot,
            len,
            holder: std::process::id(),
        })
    }
}

/// Other processes' arenas mapped here, by (pid, token).
type Attached = HashMap<(u32, u64), Weak<Arena>>;

/// This process's mapping of another process's arena: one per arena while any batch here
/// uses it, unmapped when the last one is dropped (so a finished loader's arenas do not stay
/// mapped). The lock is not held while mapping: a fork while another thread maps would leave
/// the child's copy locked.
fn attached(pid: u32, fd: i32, inode: u64, token: u64) -> io::Result<Arc<Arena>> {
    static MAPPED: OnceLock<Mutex<Attached>> = OnceLock::new();
    let lock = || {
        MAPPED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    };
    if let Some(a) = lock().get(&(pid, token)).and_then(Weak::upgrade) {
        return Ok(a);
    }
    let fresh = Arena::attach(pid, fd, inode, token)?;
    let mut mapped = lock();
    if let Some(a) = mapped.get(&(pid, token)).and_then(Weak::upgrade) {
        return Ok(a); // another thread mapped it meanwhile; `fresh` is unmapped
    }
    mapped.retain(|_, w| w.strong_count() > 0);
    mapped.insert((pid, token), Arc::downgrade(&fresh));
    Ok(fresh)
}

/// This process's arena for batches of up to `slot_bytes` per column, made on first use
/// within `budget` bytes; `None` when the budget holds fewer than [`MIN_SLOTS`] such slots or
/// the arena cannot be made (the batches then travel as `bytes`).
pub fn for_worker(slot_bytes: usize, budget: usize) -> Option<Arc<Arena>> {
    static ARENA: Mutex<Option<Arc<Arena>>> = Mutex::new(None);
    let mut held = ARENA.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some(a) = held.as_ref() {
        // An arena inherited through fork is the parent's: never write into it. This
        // process's own arena is never replaced (a receiver may not have attached it yet, and
        // its fd must stay open); batches larger than its slots travel as bytes.
        if a.pid == pid {
            return (a.slot_bytes >= slot_bytes).then(|| Arc::clone(a));
        }
    }
    let slot_bytes = slot_bytes.div_ceil(PAGE) * PAGE;
    let slots = (budget / slot_bytes.max(1)).min(SLOTS);
    if slots < MIN_SLOTS {
        return None;
    }
    match Arena::create(slots, slot_bytes) {
        Ok(a) => {
            *held = Some(Arc::clone(&a));
            Some(a)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no shared batch arena; batches travel as bytes");
            None
        }
    }
}
