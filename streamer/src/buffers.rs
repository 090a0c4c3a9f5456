//! Buffers whose allocation goes back to a pool when their last user drops them.
//!
//! A stream reads each sample (or run of samples) into a buffer that the samples it hands out
//! share. The consumer usually drops those samples on another thread, a few reads later (the
//! Python binding keeps a couple of chunks in flight), so the stream cannot take its last
//! buffer back when it reads the next one. Without recycling, every 1 MiB read was a fresh
//! allocation: fresh pages, faulted in and zeroed by the kernel, a second pass over memory
//! before the `pread` copy. The last owner of a [`PooledBuffer`] instead hands its allocation back
//! to the dataset's [`BufferPool`], which keeps a few of them (a bounded number of bytes) for the
//! next reads. The Python binding does the same for the column buffers of `iter_batches`, whose
//! previous batch Python holds while the next one is gathered.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use crate::dataset::RUN_BYTES;

/// Capacity a recycled allocation may have whatever the read's size.
const SMALL_SLACK: usize = 4 << 10;

/// The read pool of the latest memory limit a dataset of this process was opened with (see
/// [`BufferPool::for_memory_limit`]).
static LATEST_POOL: Mutex<Option<KeptPool>> = Mutex::new(None);

/// Frees the allocations of the read pool this process keeps for its next datasets (see
/// [`BufferPool::for_memory_limit`]). For a process about to fork: its children (DataLoader
/// workers) make their own pools and would only inherit these megabytes, unused, in their
/// memory. The next reads of this process fill the pool again. Returns the bytes freed (the
/// allocator may keep them in its free lists; see the binding's caller, which trims them).
pub fn release_kept_buffers() -> usize {
    let Some(kept) = lock_unless_busy(&LATEST_POOL) else {
        return 0;
    };
    match kept.as_ref() {
        Some(k) if k.pid == std::process::id() => k.pool.release(),
        _ => 0,
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
#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
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

    /// The pool of a dataset whose memory limit is `limit`: room for the reads a consumer
    /// typically holds at once (the Python binding keeps up to four chunks of up to 4 MiB in
    /// flight), a sixteenth of the limit, at least one run of [`RUN_BYTES`] (so that a small
    /// limit still reads in-order runs into the same allocation) and at most 16 runs. The pool
    /// only holds what was in circulation: a stream of small samples keeps little.
    ///
    /// Datasets of one process opened with the same limit share one pool: a training script
    /// that opens a new dataset for each epoch (or for each evaluation pass) then reads into
    /// allocations that are already mapped instead of faulting in and zeroing its first
    /// megabytes again. Only the pool of the latest limit is kept for later datasets, so a
    /// process holds at most one pool beyond those of its open datasets, sized for the limit
    /// it opened last.
    pub(crate) fn for_memory_limit(limit: u64) -> Arc<Self> {
        let one_run = RUN_BYTES + 4096;
        let max_bytes = (limit / 16).clamp(one_run, 16 * RUN_BYTES) as usize;
        BufferPool::kept_in(&LATEST_POOL, max_bytes, RUN_BYTES as usize + 4096)
    }

    /// Frees the allocations kept for the next reads (the pool itself stays usable); returns
    /// their bytes.
    fn release(&self) -> usize {
        match self.lock() {
            Some(mut free) => {
                free.buffers = Vec::new();
                std::mem::take(&mut free.bytes)
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

    /// A kept allocation fit for a read of `want` bytes (its length is what it last held), or
    /// an empty one. An allocation larger than `want` by more than a quarter (and 4 KiB) is
    /// left in the pool: a small sample would otherwise pin a larger read's memory for as long
    /// as the consumer holds it.
    pub fn take(&self, want: usize) -> Vec<u8> {
        // At most a quarter more than asked: the samples cut from a read are held by the
        // consumer, and the memory budget counts their bytes, not the allocation's.
        let fits = |cap: usize| cap <= want.saturating_add(want / 4).max(SMALL_SLACK);
        let Some(mut free) = self.lock() else {
            return Vec::new();
        };
        match free.buffers.iter().rposition(|b| fits(b.capacity())) {
            Some(i) => {
                let buf = free.buffers.swap_remove(i);
                free.bytes -= buf.capacity();
                buf
            }
            None => Vec::new(),
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
        if free.bytes + buf.capacity() <= self.max_bytes {
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
        let bytes = free.buffers.iter().map(Vec::capacity).sum();
        assert_eq!(
            free.bytes, bytes,
            "the running count matches the kept allocations"
        );
        bytes
    }
}

/// The bytes of one read, shared by the samples cut from it; its allocation goes back to its
/// pool (if any) when the last of them is dropped.
#[derive(Debug)]
pub struct PooledBuffer {
    data: Vec<u8>,
    pool: Option<Arc<BufferPool>>,
}

impl PooledBuffer {
    /// A buffer that is freed when dropped.
    pub fn unpooled(data: Vec<u8>) -> Self {
        PooledBuffer { data, pool: None }
    }

    /// A buffer whose allocation goes back to `pool` when dropped.
    pub fn pooled(data: Vec<u8>, pool: &Arc<BufferPool>) -> Self {
        PooledBuffer {
            data,
            pool: Some(Arc::clone(pool)),
        }
    }
}

impl AsRef<[u8]> for PooledBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Deref for PooledBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(std::mem::take(&mut self.data));
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

    #[test]
    fn a_small_read_does_not_take_a_large_allocation() {
        let pool = BufferPool::new(8 << 20, 2 << 20);
        drop(PooledBuffer::pooled(Vec::with_capacity(1 << 20), &pool));
        assert!(pool.take(10_000).is_empty(), "10 KB must not pin 1 MiB");
        assert!(pool.take(600_000).is_empty(), "600 KB must not pin 1 MiB");
        assert!(pool.take(900_000).capacity() >= 1 << 20);
    }
}
