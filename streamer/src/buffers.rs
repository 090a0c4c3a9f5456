//! Buffers whose allocation goes back to a pool when their last user drops them.
//!
//! A stream reads each sample (or run of samples) into a buffer that the samples it hands out
//! share. The consumer usually drops those samples on another thread, a few reads later (the
//! Python binding keeps a couple of chunks in flight), so the stream cannot take its last
//! buffer back when it reads the next one. Without recycling, every 1 MiB read was a fresh
//! allocation: fresh pages, faulted in and zeroed by the kernel, a second pass over memory
//! before the `pread` copy. The last owner of a [`PooledBuffer`] instead hands its allocation back
//! to the dataset's [`BufferPool`], which keeps a few of them (bounded in bytes and in number) for the
//! next reads. The Python binding does the same for the column buffers of `iter_batches`, whose
//! previous batch Python holds while the next one is gathered.
//!
//! A read of [`PAGE_READ_MIN`] bytes or more (a run of samples, a large sample) gets an
//! anonymous mapping of its own ([`ReadAlloc::Pages`]) instead of heap memory, so that it can
//! be handed back to the kernel whole. Before a fork ([`release_kept_buffers`], which the
//! Python binding runs before each DataLoader worker is forked) the kept mappings, which no
//! sample uses, are unmapped: while a DataLoader's workers read, the training process reads
//! nothing, and the mappings it kept sat in its memory for the whole epoch (6 MiB of a 10 KB
//! cold `DataLoader(2)` epoch's peak, up to the pool's 16 MiB with large samples). A training
//! process that reads again after the epoch maps fresh ones, at most the pool's 16 MiB once per
//! fork (allocated up front, see [`PageAlloc`]). Mappings that samples use are inherited like
//! any other memory. The free list remembers the process that filled it; a forked child unmaps
//! the copies of kept mappings it finds there (given back between the release and the fork, or
//! inherited through a fork the binding did not see), which are its own.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};

use crate::memory::RUN_BYTES;

/// Capacity a recycled allocation may have whatever the read's size.
const SMALL_SLACK: usize = 4 << 10;
/// Most heap allocations the pool keeps, whatever their bytes. A stream of small shuffled
/// samples reads once per sample, and a list bounded only by bytes (16 MiB) grew to many
/// thousands of 100-byte allocations that every `take` scanned (6 % of a 100-byte
/// `iter_batches` epoch's CPU); past this many, the allocator recycles small blocks as well.
const MAX_KEPT_BUFFERS: usize = 64;
/// Smallest read that gets a mapping of its own instead of heap memory (smaller reads are
/// many, and a mapping costs two system calls to make and one to unmap).
pub const PAGE_READ_MIN: usize = 64 << 10;
/// Mappings are made in multiples of this, so that reads of similar sizes share them.
const PAGE_STEP: usize = 64 << 10;
/// The size of a page.
const PAGE: usize = 4 << 10;

/// The read pool of the latest memory limit a dataset of this process was opened with (see
/// [`BufferPool::for_read_pool`]).
static LATEST_POOL: Mutex<Option<KeptPool>> = Mutex::new(None);
/// The column-batch pool of the latest size the Python binding asked for (see
/// [`BufferPool::for_batches`]).
static LATEST_BATCH_POOL: Mutex<Option<KeptPool>> = Mutex::new(None);

/// For a process about to fork: its children (DataLoader workers) make their own read and
/// batch pools and would only inherit the kept allocations of this process's (see
/// [`BufferPool::for_read_pool`], [`BufferPool::for_batches`]), unused, in their memory;
/// and while they read, this process does not. Frees the kept allocations (the next reads fill
/// the pools again): unmaps the mappings and frees the heap buffers. Returns the heap bytes
/// freed (the allocator may keep them in its free lists; see the binding's caller, which trims
/// them).
pub fn release_kept_buffers() -> usize {
    [&LATEST_POOL, &LATEST_BATCH_POOL]
        .into_iter()
        .map(|slot| {
            let Some(kept) = lock_unless_busy(slot) else {
                return 0;
            };
            match kept.as_ref() {
                Some(k) if k.pid == std::process::id() => k.pool.release(),
                _ => 0,
            }
        })
        .sum()
}

/// The memory of one read: heap memory for a small read, an anonymous mapping of its own for a
/// large one (see the module doc).
#[derive(Debug)]
pub enum ReadAlloc {
    /// A heap allocation.
    Heap(Vec<u8>),
    /// An anonymous mapping, of which the first `len` bytes are the read.
    Pages(PageAlloc),
}

/// An anonymous mapping and how many of its bytes hold the read.
#[derive(Debug)]
pub struct PageAlloc {
    map: MmapMut,
    len: usize,
}

impl PageAlloc {
    /// A fresh mapping for `len` bytes (its capacity rounded up, see [`PAGE_STEP`]), its
    /// pages allocated up front (`MAP_POPULATE`): the read that takes it writes all of them,
    /// and one system call allocating them is cheaper than a page fault for each (16 MiB
    /// mapped and written: 8.0 ms populated, 10.7 ms faulted in, on the 2-core VM).
    fn new(len: usize, max_each: usize) -> std::io::Result<PageAlloc> {
        let mut cap = len.div_ceil(PAGE_STEP).max(1) * PAGE_STEP;
        if cap > max_each {
            cap = len.div_ceil(PAGE).max(1) * PAGE;
        }
        Ok(PageAlloc {
            map: MmapOptions::new().len(cap).populate().map_anon()?,
            len,
        })
    }

    fn capacity(&self) -> usize {
        self.map.len()
    }
}

impl ReadAlloc {
    /// Makes the read `len` bytes long. A heap allocation zeroes only its growth (a recycled
    /// allocation of the same size costs nothing); a mapping too small is replaced.
    pub fn set_len(&mut self, len: usize) {
        match self {
            ReadAlloc::Heap(v) => v.resize(len, 0),
            ReadAlloc::Pages(p) if len <= p.capacity() => p.len = len,
            ReadAlloc::Pages(_) => {
                *self = match PageAlloc::new(len, usize::MAX) {
                    Ok(p) => ReadAlloc::Pages(p),
                    Err(_) => ReadAlloc::Heap(vec![0; len]),
                }
            }
        }
    }

    /// The read's bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            ReadAlloc::Heap(v) => v,
            ReadAlloc::Pages(p) => &mut p.map[..p.len],
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            ReadAlloc::Heap(v) => v,
            ReadAlloc::Pages(p) => &p.map[..p.len],
        }
    }

    /// Whether it is a mapping of its own.
    #[cfg(test)]
    fn is_pages(&self) -> bool {
        matches!(self, ReadAlloc::Pages(_))
    }
}

/// `mutex`'s guard, or `None` while another thread holds it. Pooling is an optimisation, so a
/// busy lock means doing without the pool: never a wait, and a process forked while a thread
/// of its parent held the lock (which no thread of the child will release) does not hang.
fn lock_unless_busy<T>(mutex: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// A pool kept for the next datasets, and the process that made it.
#[derive(Debug)]
struct KeptPool {
    pid: u32,
    pool: Arc<BufferPool>,
}

/// Allocations a stream keeps for its next reads, at most `max_bytes` of capacity in all.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Free>,
    max_bytes: usize,
    max_each: usize,
}

/// The kept allocations and their capacity in all (kept alongside: `give_back` runs once per
/// read, and a stream of small shuffled samples reads once per sample).
#[derive(Debug)]
struct Free {
    buffers: Vec<Vec<u8>>,
    /// Kept mappings.
    pages: Vec<PageAlloc>,
    /// The process whose mappings `pages` holds.
    pid: u32,
    bytes: usize,
}

impl Default for Free {
    fn default() -> Self {
        Free {
            buffers: Vec::new(),
            pages: Vec::new(),
            pid: std::process::id(),
            bytes: 0,
        }
    }
}

impl Free {
    /// If this list was inherited through `fork` (a fork the binding did not see coming, or a
    /// mapping given back between its release and the fork), unmaps its kept mappings (this
    /// process's copies of them) and makes the list this process's.
    fn unmap_inherited_pages(&mut self) {
        let pid = std::process::id();
        if self.pid != pid {
            self.unmap_pages();
            self.pid = pid;
        }
    }

    /// Unmaps every kept mapping.
    fn unmap_pages(&mut self) {
        let gone: usize = self.pages.iter().map(PageAlloc::capacity).sum();
        self.pages.clear();
        self.bytes = self.bytes.saturating_sub(gone);
    }
}

impl BufferPool {
    /// A pool that keeps allocations of at most `max_each` bytes, `max_bytes` in all.
    pub fn new(max_bytes: usize, max_each: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            free: Mutex::new(Free::default()),
            max_bytes,
            max_each,
        })
    }

    /// The read pool of a dataset, keeping up to `max_bytes` (the memory plan's `read_pool`:
    /// room for the reads a consumer typically holds at once, see [`crate::MemoryPlan`]). The
    /// pool only holds what was in circulation: a stream of small samples keeps little.
    ///
    /// Datasets of one process opened with the same limit share one pool: a training script
    /// that opens a new dataset for each epoch (or for each evaluation pass) then reads into
    /// allocations that are already mapped instead of faulting in and zeroing its first
    /// megabytes again. Only the pool of the latest limit is kept for later datasets, so a
    /// process holds at most one pool beyond those of its open datasets, sized for the limit
    /// it opened last.
    pub(crate) fn for_read_pool(max_bytes: u64) -> Arc<Self> {
        let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        BufferPool::kept_in(&LATEST_POOL, max_bytes, RUN_BYTES as usize + 4096)
    }

    /// The pool for the column buffers of `iter_batches` batches (the Python binding), keeping
    /// up to `max_bytes`, shared by the datasets of this process that ask for the same size as
    /// [`BufferPool::for_read_pool`] shares read pools: a script that opens a dataset for
    /// each epoch otherwise gathered each epoch's first batches into fresh memory (100
    /// samples of 1 MB in batches of 64: 25,000 page faults an epoch, 1,450 samples/s).
    pub fn for_batches(max_bytes: usize) -> Arc<Self> {
        BufferPool::kept_in(&LATEST_BATCH_POOL, max_bytes, max_bytes)
    }

    /// Before a fork: frees the allocations kept for the next reads, mappings and heap
    /// buffers (the pool itself stays usable); returns the heap bytes freed.
    fn release(&self) -> usize {
        match self.lock() {
            Some(mut free) => {
                // Every kept mapping goes, whichever process's list this was.
                free.unmap_pages();
                free.pid = std::process::id();
                let heap: usize = free.buffers.iter().map(Vec::capacity).sum();
                free.buffers = Vec::new();
                free.bytes -= heap;
                heap
            }
            None => 0,
        }
    }

    /// The pool `slot` keeps for pools of these sizes in this process, or a new one that
    /// `slot` then keeps instead.
    fn kept_in(slot: &Mutex<Option<KeptPool>>, max_bytes: usize, max_each: usize) -> Arc<Self> {
        let pid = std::process::id();
        // Not a wait: a DataLoader worker forked while another thread of its parent opened a
        // dataset must not wait for a lock no thread of its own will release.
        let Some(mut kept) = lock_unless_busy(slot) else {
            return BufferPool::new(max_bytes, max_each);
        };
        if let Some(k) = kept.as_ref() {
            if k.pid == pid && k.pool.max_bytes == max_bytes && k.pool.max_each == max_each {
                return Arc::clone(&k.pool);
            }
        }
        // A pool inherited through fork would do no harm (its allocations are this process's
        // own copies), but it was sized for the parent's datasets.
        let pool = BufferPool::new(max_bytes, max_each);
        *kept = Some(KeptPool {
            pid,
            pool: Arc::clone(&pool),
        });
        pool
    }

    /// The capacity the pool keeps at most, in all.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// A kept allocation fit for a read of `want` bytes (its length is what it last held), or
    /// an empty one. An allocation larger than `want` by more than a quarter (and 4 KiB) is
    /// left in the pool: a small sample would otherwise pin a larger read's memory for as long
    /// as the consumer holds it. One that holds `want` is preferred over a smaller one (which
    /// the caller grows): handing a small buffer to a large request made it allocate fresh
    /// memory while a kept allocation of the right size sat unused (`iter_batches` of 64
    /// samples of 1 MB took a column's 512-byte buffer for its 64 MB one, and every batch
    /// faulted its 64 MB in again).
    pub fn take(&self, want: usize) -> Vec<u8> {
        // At most a quarter more than asked: the samples cut from a read are held by the
        // consumer, and the memory budget counts their bytes, not the allocation's.
        let bound = want.saturating_add(want / 4).max(SMALL_SLACK);
        let Some(mut free) = self.lock() else {
            return Vec::new();
        };
        let holds = free
            .buffers
            .iter()
            .rposition(|b| (want..=bound).contains(&b.capacity()));
        // Else the largest smaller one: it grows the least.
        let chosen = holds.or_else(|| {
            free.buffers
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() < want)
                .max_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
        });
        match chosen {
            Some(i) => {
                let buf = free.buffers.swap_remove(i);
                free.bytes -= buf.capacity();
                buf
            }
            None => Vec::new(),
        }
    }

    /// An allocation for a read of `want` bytes: from the heap ([`BufferPool::take`]) below
    /// [`PAGE_READ_MIN`], else a kept mapping of at least `want` bytes (and not much more), or a
    /// fresh one. The reader sets its length ([`ReadAlloc::set_len`]); its contents are
    /// whatever it held.
    pub fn take_read(&self, want: usize) -> ReadAlloc {
        if want < PAGE_READ_MIN {
            return ReadAlloc::Heap(self.take(want));
        }
        let fits = |cap: usize| cap >= want && cap <= want + want / 4 + PAGE_STEP;
        if let Some(mut free) = self.lock() {
            free.unmap_inherited_pages();
            if let Some(i) = free.pages.iter().rposition(|p| fits(p.capacity())) {
                let p = free.pages.swap_remove(i);
                free.bytes -= p.capacity();
                return ReadAlloc::Pages(p);
            }
        }
        match PageAlloc::new(want, self.max_each) {
            Ok(p) => ReadAlloc::Pages(p),
            Err(_) => ReadAlloc::Heap(vec![0; want]),
        }
    }

    /// Keeps a read's allocation for a later read, or frees it.
    fn give_back_read(&self, alloc: ReadAlloc) {
        let p = match alloc {
            ReadAlloc::Heap(v) => return self.give_back(v),
            ReadAlloc::Pages(p) => p,
        };
        if p.capacity() > self.max_each {
            return;
        }
        let Some(mut free) = self.lock() else {
            return;
        };
        free.unmap_inherited_pages();
        if free.bytes + p.capacity() <= self.max_bytes {
            free.bytes += p.capacity();
            free.pages.push(p);
        }
    }

    /// Keeps `buf` for a later read if it is small enough and the pool has room; frees it
    /// otherwise.
    fn give_back(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > self.max_each {
            return;
        }
        let Some(mut free) = self.lock() else {
            return;
        };
        if free.bytes + buf.capacity() <= self.max_bytes && free.buffers.len() < MAX_KEPT_BUFFERS {
            free.bytes += buf.capacity();
            free.buffers.push(buf);
        }
    }

    /// The free list, unless another thread holds it ([`lock_unless_busy`]): a busy list means
    /// allocate or free as usual.
    fn lock(&self) -> Option<std::sync::MutexGuard<'_, Free>> {
        lock_unless_busy(&self.free)
    }

    /// Bytes of capacity kept now.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = free.buffers.iter().map(Vec::capacity).sum::<usize>()
            + free.pages.iter().map(PageAlloc::capacity).sum::<usize>();
        assert_eq!(
            free.bytes, bytes,
            "the running count matches the kept allocations"
        );
        bytes
    }
}

impl Drop for BufferPool {
    /// Frees the kept allocations, unless the free list is locked. Nothing else can hold a
    /// pool being dropped, so a held lock means this process was forked while a thread of its
    /// parent was inside the list (a `push` or `swap_remove` half done): the list may then name
    /// one allocation twice, and freeing it would unmap or free it twice. Such a list is leaked
    /// instead (the child's copies of at most the pool's bytes, until it exits).
    fn drop(&mut self) {
        let held = matches!(
            self.free.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        );
        if held {
            let free = self.free.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(std::mem::take(&mut free.buffers));
            std::mem::forget(std::mem::take(&mut free.pages));
        }
    }
}

/// The bytes of one read, shared by the samples cut from it; its allocation goes back to its
/// pool (if any) when the last of them is dropped.
#[derive(Debug)]
pub struct PooledBuffer {
    data: ReadAlloc,
    pool: Option<Arc<BufferPool>>,
}

impl PooledBuffer {
    /// A buffer that is freed when dropped.
    pub fn unpooled(data: Vec<u8>) -> Self {
        PooledBuffer {
            data: ReadAlloc::Heap(data),
            pool: None,
        }
    }

    /// A buffer whose allocation goes back to `pool` when dropped.
    pub fn pooled(data: Vec<u8>, pool: &Arc<BufferPool>) -> Self {
        PooledBuffer::pooled_read(ReadAlloc::Heap(data), pool)
    }

    /// A read (from [`BufferPool::take_read`]) whose allocation goes back to `pool` when
    /// dropped.
    pub fn pooled_read(data: ReadAlloc, pool: &Arc<BufferPool>) -> Self {
        PooledBuffer {
            data,
            pool: Some(Arc::clone(pool)),
        }
    }

    /// The bytes, to write (the buffer's owner alone holds it).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.data.as_mut_slice()
    }
}

impl AsRef<[u8]> for PooledBuffer {
    fn as_ref(&self) -> &[u8] {
        self.data.as_slice()
    }
}

impl Deref for PooledBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.data.as_slice()
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back_read(std::mem::replace(
                &mut self.data,
                ReadAlloc::Heap(Vec::new()),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasets_of_one_limit_share_the_kept_pool_and_a_new_limit_replaces_it() {
        let slot = Mutex::new(None);
        let first = BufferPool::kept_in(&slot, 4 << 20, 1 << 20);
        drop(PooledBuffer::pooled(vec![1u8; 1000], &first));
        let again = BufferPool::kept_in(&slot, 4 << 20, 1 << 20);
        assert!(Arc::ptr_eq(&first, &again), "the same sizes share a pool");
        assert_eq!(again.take(1000).len(), 1000, "and its kept allocations");
        drop(PooledBuffer::pooled(vec![1u8; 1000], &first));
        assert_eq!(first.release(), 1000, "released before a fork");
        assert_eq!(first.kept_bytes(), 0);
        let other = BufferPool::kept_in(&slot, 8 << 20, 1 << 20);
        assert!(!Arc::ptr_eq(&first, &other), "other sizes get their own");
        let back = BufferPool::kept_in(&slot, 4 << 20, 1 << 20);
        assert!(
            !Arc::ptr_eq(&first, &back),
            "only the latest sizes' pool is kept for later datasets"
        );
        let held = slot.lock().unwrap();
        let busy = BufferPool::kept_in(&slot, 8 << 20, 1 << 20);
        drop(held);
        assert!(
            !Arc::ptr_eq(&busy, &BufferPool::kept_in(&slot, 8 << 20, 1 << 20)),
            "a held slot gives a pool of its own instead of a wait"
        );
    }

    #[test]
    fn a_held_free_list_means_no_pooling_instead_of_a_wait() {
        let pool = BufferPool::new(4 << 20, 1 << 20);
        drop(PooledBuffer::pooled(vec![1u8; 100], &pool));
        let held = pool.free.lock().unwrap();
        assert!(
            pool.take(100).is_empty(),
            "a busy list gives a fresh buffer"
        );
        drop(PooledBuffer::pooled(vec![2u8; 100], &pool));
        drop(held);
        assert_eq!(
            pool.kept_bytes(),
            100,
            "the buffer dropped while busy was freed"
        );
    }

    #[test]
    fn a_dropped_buffer_goes_back_with_its_contents_length() {
        let pool = BufferPool::new(4 << 20, 1 << 20);
        let buf = PooledBuffer::pooled(vec![7u8; 1000], &pool);
        let shared = Arc::new(buf);
        let other = Arc::clone(&shared);
        drop(shared);
        assert_eq!(pool.kept_bytes(), 0, "still held by a sample");
        drop(other);
        let again = pool.take(1000);
        assert_eq!(again.len(), 1000);
        assert!(again.capacity() >= 1000);
        assert!(pool.take(1000).is_empty(), "the pool held one allocation");
    }

    #[test]
    fn batch_pools_are_kept_apart_from_read_pools_and_released_before_a_fork() {
        // The only test that uses the process's batch slot (a global): an odd size of its own.
        let size = (48 << 20) + 12_345;
        let batches = BufferPool::for_batches(size);
        assert!(Arc::ptr_eq(&batches, &BufferPool::for_batches(size)));
        assert!(!Arc::ptr_eq(
            &batches,
            &BufferPool::for_read_pool(crate::MemoryPlan::new(Some(size as u64)).read_pool)
        ));
        let column = Vec::<u8>::with_capacity(1 << 20);
        let column_at = column.as_ptr();
        drop(PooledBuffer::pooled(column, &batches));
        let next_dataset = BufferPool::for_batches(size);
        let reused = next_dataset.take(1 << 20);
        assert_eq!(reused.as_ptr(), column_at, "kept across datasets");
        drop(PooledBuffer::pooled(vec![0u8; 4096], &batches));
        assert!(release_kept_buffers() >= 4096, "freed before a fork");
        assert_eq!(batches.kept_bytes(), 0);
    }

    #[test]
    fn a_large_request_gets_the_kept_allocation_that_holds_it_not_a_small_one() {
        let pool = BufferPool::new(16 << 20, 8 << 20);
        let large = Vec::<u8>::with_capacity(4 << 20);
        let large_at = large.as_ptr();
        drop(PooledBuffer::pooled(large, &pool));
        drop(PooledBuffer::pooled(Vec::with_capacity(512), &pool));
        let got = pool.take(4 << 20);
        assert_eq!(
            got.as_ptr(),
            large_at,
            "the kept 4 MiB allocation, not the 512-byte one"
        );
        assert_eq!(
            pool.take(500).capacity(),
            512,
            "the small one is still there for its size"
        );
        // With none that holds the request, the largest smaller one (the caller grows it).
        drop(PooledBuffer::pooled(Vec::with_capacity(1000), &pool));
        drop(PooledBuffer::pooled(Vec::with_capacity(3000), &pool));
        assert_eq!(pool.take(5000).capacity(), 3000);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_small_allocations() {
        // Room for thousands by bytes: the count bounds the list every `take` searches.
        let pool = BufferPool::new(16 << 20, 1 << 20);
        let held: Vec<PooledBuffer> = (0..MAX_KEPT_BUFFERS * 3)
            .map(|_| PooledBuffer::pooled(vec![1u8; 100], &pool))
            .collect();
        drop(held);
        assert_eq!(pool.kept_bytes(), MAX_KEPT_BUFFERS * 100);
        let mut taken = 0;
        while pool.take(100).capacity() > 0 {
            taken += 1;
        }
        assert_eq!(
            taken, MAX_KEPT_BUFFERS,
            "each kept allocation is handed out once"
        );
    }

    #[test]
    fn the_pool_keeps_no_more_than_its_bytes_and_no_large_buffers() {
        let pool = BufferPool::new(3000, 2000);
        drop(PooledBuffer::pooled(Vec::with_capacity(1500), &pool));
        drop(PooledBuffer::pooled(Vec::with_capacity(1500), &pool));
        assert!(pool.kept_bytes() <= 3000);
        drop(PooledBuffer::pooled(Vec::with_capacity(1500), &pool));
        assert!(pool.kept_bytes() <= 3000);
        let before = pool.kept_bytes();
        drop(PooledBuffer::pooled(Vec::with_capacity(5000), &pool));
        assert_eq!(
            pool.kept_bytes(),
            before,
            "a buffer larger than max_each is freed"
        );
        drop(PooledBuffer::unpooled(vec![1u8; 10]));
        assert_eq!(pool.kept_bytes(), before);
    }

    fn read_of(pool: &Arc<BufferPool>, len: usize, fill: u8) -> PooledBuffer {
        let mut alloc = pool.take_read(len);
        alloc.set_len(len);
        alloc.as_mut_slice().fill(fill);
        PooledBuffer::pooled_read(alloc, pool)
    }

    #[test]
    fn large_reads_get_mappings_that_are_kept_and_reused() {
        let pool = BufferPool::new(8 << 20, RUN_BYTES as usize + 4096);
        let small = pool.take_read(PAGE_READ_MIN - 1);
        assert!(!small.is_pages(), "small reads stay on the heap");
        let first = read_of(&pool, 1_000_000, 7);
        assert_eq!(first.len(), 1_000_000);
        assert!(first.iter().all(|&b| b == 7));
        let addr = first.as_ptr() as usize;
        drop(first);
        assert_eq!(pool.kept_bytes(), 1 << 20, "kept, rounded up to 64 KiB");
        let again = read_of(&pool, 990_000, 8);
        assert_eq!(
            again.as_ptr() as usize,
            addr,
            "the next large read reuses it"
        );
        assert_eq!(again.len(), 990_000);
        assert_eq!(pool.kept_bytes(), 0);
        drop(again);
        let smaller = pool.take_read(500_000);
        assert!(smaller.is_pages());
        assert_eq!(
            pool.kept_bytes(),
            1 << 20,
            "a much smaller read does not pin the mapping"
        );
    }

    #[test]
    fn before_a_fork_kept_mappings_are_unmapped_and_mappings_in_use_stay() {
        let pool = BufferPool::new(8 << 20, RUN_BYTES as usize + 4096);
        let kept = read_of(&pool, 1 << 20, 1);
        let in_use = read_of(&pool, 1 << 20, 2);
        drop(kept);
        drop(PooledBuffer::pooled(Vec::with_capacity(1000), &pool));
        assert_eq!(pool.kept_bytes(), (1 << 20) + 1000);
        assert_eq!(pool.release(), 1000, "the heap bytes freed");
        assert_eq!(pool.kept_bytes(), 0, "the kept mapping is unmapped too");
        assert!(
            in_use.iter().all(|&b| b == 2),
            "a mapping that samples use stays, with its bytes"
        );
        // The pool goes on: the next large read maps afresh, and is kept again.
        let next = read_of(&pool, 1 << 20, 3);
        assert!(next.iter().all(|&b| b == 3));
        drop(next);
        assert_eq!(pool.kept_bytes(), 1 << 20);
    }

    #[test]
    fn an_inherited_free_list_unmaps_its_copies() {
        let pool = BufferPool::new(8 << 20, RUN_BYTES as usize + 4096);
        let (a, b) = (read_of(&pool, 1 << 20, 1), read_of(&pool, 1 << 20, 1));
        drop((a, b));
        assert_eq!(pool.kept_bytes(), 2 << 20);
        {
            let mut free = pool.free.lock().unwrap();
            // What a forked child finds: another process's list (here, its mappings are this
            // test process's own, so unmapping them is what a child does with its copies).
            free.pid = free.pid.wrapping_add(1);
        }
        let fresh = read_of(&pool, 1 << 20, 4);
        assert!(fresh.iter().all(|&b| b == 4));
        assert_eq!(pool.kept_bytes(), 0, "the inherited mappings are gone");
        drop(fresh);
        assert_eq!(
            pool.kept_bytes(),
            1 << 20,
            "only this process's mapping is kept"
        );
    }

    /// Whether `addr` lies in one of this process's mappings.
    fn is_mapped(addr: usize) -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|line| {
            let range = line.split_whitespace().next().unwrap();
            let (lo, hi) = range.split_once('-').unwrap();
            let lo = usize::from_str_radix(lo, 16).unwrap();
            let hi = usize::from_str_radix(hi, 16).unwrap();
            (lo..hi).contains(&addr)
        })
    }

    #[test]
    fn a_pool_dropped_while_its_list_is_locked_frees_nothing_from_it() {
        let pool = BufferPool::new(8 << 20, RUN_BYTES as usize + 4096);
        let kept = read_of(&pool, 1 << 20, 1);
        let addr = kept.as_ptr() as usize;
        drop(kept);
        assert_eq!(pool.kept_bytes(), 1 << 20);
        // A thread locks the list and goes away without unlocking it, as in a child forked
        // while a thread of its parent was inside the list.
        let other = Arc::clone(&pool);
        std::thread::spawn(move || std::mem::forget(other.free.lock().unwrap()))
            .join()
            .unwrap();
        drop(pool);
        // (Whether an unlocked pool's mapping is unmapped cannot be checked the same way: a
        // test running beside this one may map the freed addresses at once.)
        assert!(is_mapped(addr), "a locked list is leaked, not unmapped");
    }

    #[test]
    fn a_small_read_does_not_take_a_large_allocation() {
        let pool = BufferPool::new(8 << 20, 2 << 20);
        drop(PooledBuffer::pooled(Vec::with_capacity(1 << 20), &pool));
        assert!(pool.take(10_000).is_empty(), "10 KB must not pin 1 MiB");
        assert!(pool.take(600_000).is_empty(), "600 KB must not pin 1 MiB");
        assert!(pool.take(900_000).capacity() >= 1 << 20);
    }
}
