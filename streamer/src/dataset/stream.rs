//! One rank's part of an epoch as an iterator ([`SampleStream`]), with prefetch.
//!
//! The stream walks the rank's positions of the global order (`order::Partition`, the same
//! arithmetic as `order::RankIter`, owned so that the stream is `'static`). Ahead of the
//! consumer, it asks the order which shards the next samples come from
//! (`EpochOrder::shards_needed`) and starts their fetches on the engine's runtime, as far ahead
//! as the prefetch allowance of disk (`cache_limit / 2`) lets it; the memory budget then limits
//! how many bytes those fetches hold at once. Shards the stream no longer needs are released
//! (unpinned) so the cache may evict them.
//!
//! Samples are read from the decompressed file with `pread`: one sample at a time in shuffled
//! order, or runs of up to [`RUN_BYTES`] of consecutive samples when the stream reads a shard
//! in order. The read buffer holds its bytes of the budget until the next read replaces it; a
//! sample handed to the consumer no longer counts (holding many of them is the caller's memory).
//!
//! A shuffled stream reads a *small* shard (its samples within [`RUN_BYTES`]) whole, once it is
//! complete, and serves its later samples from memory: in a shuffle block every sample of it is
//! read sooner or later, and one `pread` per tiny sample costs more than the sample. Not before
//! its first batch is out, though: that batch's samples come from every shard of the block, and
//! reading all of them whole would hold the first batch back by as many megabytes. These
//! buffers hold budget while kept (at most [`WHOLE_SHARDS_MAX`], and an eighth of the budget),
//! are taken only when the budget is free at once, and are given back before the stream waits
//! for anything that may need budget (a fetch, a shard's next bytes, a read) unless the budget
//! has room for the largest buffer a download or decoder of the dataset takes, so they never
//! hold up a download.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use tracing::debug;

use super::budget::{Budget, Lease};
use super::engine;
use super::fetch::WRITE_BYTES;
use super::inner::Inner;
use super::metrics::Metrics;
use super::proc::ProcState;
use super::shard::{RawSample, ShardHandle};
use crate::buffers::PooledBuffer;
use crate::error::{Result, StreamerError};
use crate::memory::RUN_BYTES;
use crate::order::{EpochOrder, OrderConfig, Partition, Rank, World};

/// Most shard fetches one stream starts ahead at once (each streams its shard in as few GETs
/// as `fetch::PART_BYTES` allows, so this is most of the stream's parallelism; the memory
/// budget and the disk allowance bound it further).
pub(crate) const MAX_FETCHES: usize = 8;
/// Most bytes of whole small shards a shuffled stream keeps in memory (see the module doc).
pub const WHOLE_SHARDS_MAX: u64 = 16 << 20;
/// Above a shard's bytes, what a decoder may take from the budget at once (its input and copy
/// buffers and the zstd blocks; `decode::decoder_bytes`), with room to spare.
const DECODER_SLACK: u64 = 4 << 20;

/// What to stream: the order's settings, the epoch, the world and this rank, and where to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPlan {
    /// Seed, shuffle, window, lanes, remainder, ramp (fixed for a run).
    pub order: OrderConfig,
    /// The epoch.
    pub epoch: u64,
    /// Nodes x processes x workers, and the batch size.
    pub world: World,
    /// This node, process and DataLoader worker.
    pub rank: Rank,
    /// Global positions already consumed (a saved `StreamState::consumed`; 0 for a new epoch).
    pub start: u64,
}

impl StreamPlan {
    /// The whole of `epoch` in `order` for a single reader ([`World::SINGLE`]), from its start.
    pub fn single_process(order: OrderConfig, epoch: u64) -> StreamPlan {
        StreamPlan {
            order,
            epoch,
            world: World::SINGLE,
            rank: Rank {
                node: 0,
                local_process: 0,
                worker: 0,
            },
            start: 0,
        }
    }
}

/// One sample of a stream.
#[derive(Debug, Clone)]
pub struct StreamedSample {
    /// Its position in the epoch's global order (`>= epoch length` for a padding repeat).
    pub position: u64,
    /// Its global sample id.
    pub index: u64,
    /// Its bytes.
    pub sample: RawSample,
    /// Whether it is a padding repeat (see `order::Remainder::Pad`).
    pub padding: bool,
}

/// A sample the stream located but left unread, for its consumer to read on a thread of its
/// own (see [`SampleStream::defer_on_demand`]). The shard is pinned, and the sample's bytes are
/// on disk, until it is dropped.
///
/// It holds no read buffer and so none of the stream's memory budget: its bytes are read when
/// the consumer calls [`DeferredSample::read`], into a buffer of the dataset's pool that the
/// consumer holds as it would hold a sample the stream had read.
#[derive(Debug)]
pub struct DeferredSample {
    /// Its position in the epoch's global order (`>= epoch length` for a padding repeat).
    pub position: u64,
    /// Its global sample id.
    pub index: u64,
    /// Whether it is a padding repeat (see `order::Remainder::Pad`).
    pub padding: bool,
    handle: ShardHandle,
    in_shard: u64,
    len: u64,
    ds: Arc<Inner>,
}

impl DeferredSample {
    /// The sample's bytes as stored in its shard (column sizes and column bytes).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the sample has no bytes (never, for a valid MDS sample).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the sample: one `pread` of it into a buffer of the dataset's pool; errors name the
    /// shard file.
    pub fn read(self) -> Result<RawSample> {
        let i = self.in_shard;
        let (base, buf) = read_pooled(&self.ds, &self.handle, i, i + 1, self.len)?;
        Metrics::add(&self.ds.metrics.deferred_reads, 1);
        cut(&self.handle, i, base, buf)
    }

    /// As a [`StreamedSample`], read.
    pub fn into_streamed(self) -> Result<StreamedSample> {
        let (position, index, padding) = (self.position, self.index, self.padding);
        Ok(StreamedSample {
            position,
            index,
            sample: self.read()?,
            padding,
        })
    }
}

/// Samples a stream hands over unread on request (see [`SampleStream::defer_on_demand`]).
#[derive(Debug)]
struct DeferOnDemand {
    /// Set by the consumer when it has nothing left to do; the stream clears it when it hands
    /// a sample over unread.
    wanted: Arc<AtomicBool>,
    min_bytes: u64,
}

/// A sample as `SampleStream::read_sample` serves it: read, or left for the consumer with its
/// shard and its length.
enum Sampled {
    Read(RawSample),
    Deferred(ShardHandle, u64),
}

/// What [`SampleStream::next_item`] yields.
#[derive(Debug)]
pub enum StreamItem {
    /// A sample read by the stream.
    Read(StreamedSample),
    /// A sample handed over unread (see [`SampleStream::defer_on_demand`]).
    Deferred(DeferredSample),
}

enum Slot {
    Pending(JoinHandle<Result<ShardHandle>>),
    Ready(ShardHandle),
}

struct ReadBuf {
    shard: u32,
    first: u64,
    last: u64,
    base: u64,
    buf: Arc<PooledBuffer>,
    _lease: Lease,
}

/// A small shard read whole (see the module doc).
struct WholeShard {
    base: u64,
    bytes: u64,
    buf: Arc<PooledBuffer>,
    _lease: Lease,
}

/// A rank's samples for (the rest of) an epoch, prefetched. `Iterator<Item =
/// Result<StreamedSample>>`; stops after the first error.
pub struct SampleStream {
    ds: Arc<Inner>,
    ps: Option<Arc<ProcState>>,
    order: Arc<EpochOrder>,
    partition: Partition,
    rank: Rank,
    residue: u64,
    next: u64,
    len: u64,
    slots: BTreeMap<u32, Slot>,
    slot_bytes: u64,
    prefetch_bytes: u64,
    /// Items to plan ahead; grows while the plan fits in `prefetch_bytes`.
    lookahead: u64,
    /// The farthest item any plan has reached: shards started for items up to it stay held
    /// while the lookahead shrinks.
    planned_end: u64,
    replan_at: u64,
    read: Option<ReadBuf>,
    /// Small shards read whole (shuffled streams only), and their bytes.
    whole: HashMap<u32, WholeShard>,
    whole_bytes: u64,
    /// Most bytes `whole` may hold: 0 for a stream in order.
    whole_limit: u64,
    /// Samples served one by one before shards are read whole (the first batch).
    whole_after: u64,
    /// Free budget below which `whole` is given back before a wait: the most a download's
    /// buffer or a decoder of this dataset takes at once.
    wait_room: u64,
    /// This process's memory budget (the engine's, taken once: a stream never changes process).
    budget: Budget,
    /// The shard read last, so that consecutive samples of one shard skip the slot map.
    current: Option<(u32, ShardHandle)>,
    last: Option<(u32, u64)>,
    /// When to hand samples over unread ([`StreamItem::Deferred`]).
    defer: Option<DeferOnDemand>,
    failed: bool,
}

impl std::fmt::Debug for SampleStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleStream")
            .field("rank", &self.rank)
            .field("next", &self.next)
            .field("len", &self.len)
            .field("shards_held", &self.slots.len())
            .finish()
    }
}

impl SampleStream {
    pub(crate) fn new(ds: Arc<Inner>, ps: Arc<ProcState>, plan: StreamPlan) -> Result<Self> {
        plan.order.validate()?;
        let order = Arc::new(EpochOrder::new(&ds.shape, &plan.order, plan.epoch)?);
        let residue = plan.world.residue(plan.rank)?;
        let partition = order.partition(plan.world, plan.start);
        let len = partition.worker_len(plan.rank.worker);
        let limit = ds.cache_config.limit_bytes;
        if ds.max_shard_bytes > 0 {
            // What the order holds at once: a shuffle block of shards (one shard in order).
            let window = if plan.order.shuffle {
                u64::from(plan.order.window).min(ds.shards.len() as u64)
            } else {
                1
            };
            let need = ds.max_shard_bytes.saturating_mul(window.max(1));
            if need > limit {
                return Err(StreamerError::LimitTooSmall {
                    need,
                    limit,
                    reason: format!(
                        "{window} shard(s) of up to {} bytes in one shuffle block",
                        ds.max_shard_bytes
                    ),
                });
            }
        }
        let prefetch_bytes = (limit / 2).max(ds.max_shard_bytes);
        // A dataset read wholly in place downloads and decodes nothing: no wait of its streams
        // can be held up by budget, so whole shards are never given back before one.
        let wait_room = if ds.max_shard_bytes == 0 {
            0
        } else {
            WRITE_BYTES.max(ds.max_shard_bytes.saturating_add(DECODER_SLACK))
        };
        let budget = ps.budget.clone();
        let whole_limit = if plan.order.shuffle {
            (budget.limit() / 8).min(WHOLE_SHARDS_MAX)
        } else {
            0
        };
        Ok(SampleStream {
            ds,
            ps: Some(ps),
            order,
            partition,
            rank: plan.rank,
            residue,
            next: 0,
            len,
            slots: BTreeMap::new(),
            slot_bytes: 0,
            prefetch_bytes,
            lookahead: 64,
            planned_end: 0,
            replan_at: 0,
            read: None,
            whole: HashMap::new(),
            whole_bytes: 0,
            whole_limit,
            whole_after: u64::from(plan.world.batch_size()),
            wait_room,
            budget,
            current: None,
            last: None,
            defer: None,
            failed: false,
        })
    }

    /// From now on, each time `wanted` is set, [`SampleStream::next_item`] hands the next sample
    /// of at least `min_bytes` over unread ([`StreamItem::Deferred`]) and clears `wanted`,
    /// unless the stream has already read that sample along with others. A consumer that sets
    /// `wanted` when it runs out of samples then reads some large samples itself, on its own
    /// thread, while the stream's thread reads the next ones: the two threads share the
    /// reading, in the proportion the consumer's spare time sets. A consumer busy with its own
    /// work never sets it and gets every sample read. The iterator reads deferred samples
    /// itself.
    pub fn defer_on_demand(&mut self, wanted: Arc<AtomicBool>, min_bytes: u64) {
        self.defer = Some(DeferOnDemand {
            wanted,
            min_bytes: min_bytes.max(1),
        });
    }

    /// The next sample: read, or (see [`SampleStream::defer_on_demand`]) located for the caller
    /// to read. `None` at the end of the stream and after its first error.
    pub fn next_item(&mut self) -> Option<Result<StreamItem>> {
        if self.failed {
            return None;
        }
        let item = self.step();
        if !matches!(item, Ok(Some(_))) {
            // The end of this stream (or its failure): its last counts, before a DataLoader
            // worker that reaches it exits without running destructors.
            let ds = &self.ds;
            ds.publisher.publish(|| ds.snapshot());
        }
        match item {
            Ok(item) => item.map(Ok),
            Err(e) => {
                debug!(error = %e, "stream failed");
                self.failed = true;
                Some(Err(e))
            }
        }
    }

    /// Samples this stream has yielded (this worker's count; `partition().consumed_after` turns
    /// a per-process count into the global `consumed` a checkpoint stores).
    pub fn consumed(&self) -> u64 {
        self.next
    }

    /// Samples this stream yields in all.
    pub fn total(&self) -> u64 {
        self.len
    }

    /// The split of the epoch it walks.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// The epoch's global order.
    pub fn order(&self) -> &EpochOrder {
        &self.order
    }

    fn ps(&self) -> Result<&Arc<ProcState>> {
        match &self.ps {
            Some(ps) if ps.pid == std::process::id() => Ok(ps),
            _ => Err(StreamerError::Engine(
                "this stream was created in another process (before a fork); create a new \
                 stream in each DataLoader worker"
                    .into(),
            )),
        }
    }

    fn shard_bytes(&self, shard: u32) -> u64 {
        self.ds
            .shards
            .get(shard as usize)
            .map_or(0, |s| s.cache_bytes)
    }

    fn spawn_fetch(&mut self, shard: u32) -> Result<()> {
        let ps = Arc::clone(self.ps()?);
        let fut = engine::open_shard(Arc::clone(&self.ds), Arc::clone(&ps), shard as usize);
        self.slots.insert(shard, Slot::Pending(ps.spawn(fut)));
        self.slot_bytes += self.shard_bytes(shard);
        Ok(())
    }

    fn release(&mut self, shard: u32) {
        if self.current.as_ref().is_some_and(|(s, _)| *s == shard) {
            self.current = None;
        }
        if self.slots.remove(&shard).is_some() {
            self.slot_bytes = self.slot_bytes.saturating_sub(self.shard_bytes(shard));
        }
        if let Some(w) = self.whole.remove(&shard) {
            self.whole_bytes -= w.bytes;
        }
    }

    fn drop_whole(&mut self) {
        self.whole.clear();
        self.whole_bytes = 0;
    }

    /// Waits until the first `end` bytes of a shard still downloading are on disk, making room
    /// in the budget first if it must wait (see [`SampleStream::room_for_wait`]); the wait counts
    /// as a stall.
    fn wait_readable(&mut self, h: &ShardHandle, end: u64) -> Result<()> {
        if h.is_complete() {
            return Ok(());
        }
        if h.readable() < end {
            self.room_for_wait();
        }
        let started = Instant::now();
        h.wait_for(end)?;
        Metrics::add(
            &self.ds.metrics.stall_nanos,
            started.elapsed().as_nanos() as u64,
        );
        Ok(())
    }

    /// Before a wait that a download or decoder (which may need budget) could be holding up:
    /// gives the whole shards' bytes back unless the budget has room for the largest buffer
    /// either takes at once. Dropping them on every wait would read them again and again while
    /// a cold epoch's shards arrive.
    fn room_for_wait(&mut self) {
        if !self.whole.is_empty() && self.budget.free() < self.wait_room {
            self.drop_whole();
        }
    }

    /// Plans the next `lookahead` items: releases shards no longer needed, starts fetches.
    fn plan(&mut self, current: u32) -> Result<()> {
        // At a cold start the lookahead is short; widen it at once (a few doublings) while the
        // plan fits and fetch slots are free, so that the next shards all start together
        // instead of one more per replan. Not on the very first plan: the first shard gets the
        // link to itself until the first replan, which keeps the time to the first sample short.
        let rounds = if self.slots.is_empty() && self.next == 0 {
            1
        } else {
            8
        };
        for _ in 0..rounds {
            let grew = self.plan_once(current)?;
            let pending = self
                .slots
                .values()
                .filter(|s| matches!(s, Slot::Pending(_)))
                .count();
            if !grew || pending >= MAX_FETCHES {
                break;
            }
        }
        Ok(())
    }

    /// One planning pass; returns whether the lookahead grew (the plan fitted with room).
    fn plan_once(&mut self, current: u32) -> Result<bool> {
        let end = self.next.saturating_add(self.lookahead).min(self.len);
        let needs = self
            .order
            .shards_needed(&self.partition, self.rank, self.next..end)?;
        // Keep what an earlier, longer plan started: when the lookahead halves (a block of more
        // shards ahead than fetch slots), the next block's shards are still needed soon, and
        // releasing them only to start them again reopened every shard of it at each replan.
        self.planned_end = self.planned_end.max(end);
        let keep: std::collections::HashSet<u32> = if self.planned_end > end {
            self.order
                .shards_needed(&self.partition, self.rank, self.next..self.planned_end)?
                .iter()
                .map(|n| n.shard)
                .collect()
        } else {
            needs.iter().map(|n| n.shard).collect()
        };
        let stale: Vec<u32> = self
            .slots
            .keys()
            .copied()
            .filter(|s| *s != current && !keep.contains(s))
            .collect();
        for s in stale {
            self.release(s);
        }
        let mut planned = 0u64;
        let mut fits = true;
        for need in &needs {
            let bytes = self.shard_bytes(need.shard);
            planned += bytes;
            if self.slots.contains_key(&need.shard) {
                continue;
            }
            let pending = self
                .slots
                .values()
                .filter(|s| matches!(s, Slot::Pending(_)))
                .count();
            if self.slot_bytes + bytes > self.prefetch_bytes || pending >= MAX_FETCHES {
                fits = false;
                break;
            }
            self.spawn_fetch(need.shard)?;
        }
        // Look further ahead next time while the plan is well inside the disk allowance.
        let grow = fits && planned < self.prefetch_bytes / 2 && end < self.len;
        if grow {
            self.lookahead = self.lookahead.saturating_mul(2);
        } else if !fits && self.lookahead > 1 {
            self.lookahead /= 2;
        }
        self.replan_at = self.next + (self.lookahead / 4).max(1);
        Ok(grow)
    }

    fn handle(&mut self, shard: u32) -> Result<ShardHandle> {
        if let Some((s, h)) = &self.current {
            if *s == shard {
                return Ok(h.clone());
            }
        }
        let h = self.slot_handle(shard)?;
        self.current = Some((shard, h.clone()));
        Ok(h)
    }

    fn slot_handle(&mut self, shard: u32) -> Result<ShardHandle> {
        if !self.slots.contains_key(&shard) {
            // Not prefetched (a tight cache): make room first, then fetch it now.
            let stale: Vec<u32> = self.slots.keys().copied().filter(|s| *s != shard).collect();
            if self.slot_bytes + self.shard_bytes(shard) > self.prefetch_bytes {
                for s in stale {
                    self.release(s);
                }
            }
            self.spawn_fetch(shard)?;
        }
        // A ready shard is looked up in place: in a shuffled order nearly every sample switches
        // shards, and taking the slot out and back in cost a tree rebalance each time.
        if let Some(Slot::Ready(h)) = self.slots.get(&shard) {
            return Ok(h.clone());
        }
        match self.slots.remove(&shard) {
            Some(Slot::Ready(h)) => {
                self.slots.insert(shard, Slot::Ready(h.clone()));
                Ok(h)
            }
            Some(Slot::Pending(task)) => {
                if !task.is_finished() {
                    self.room_for_wait();
                }
                let started = Instant::now();
                let result = futures::executor::block_on(task)
                    .map_err(|e| StreamerError::Engine(format!("fetch task failed: {e}")))?;
                Metrics::add(
                    &self.ds.metrics.stall_nanos,
                    started.elapsed().as_nanos() as u64,
                );
                match result {
                    Ok(h) => {
                        self.slots.insert(shard, Slot::Ready(h.clone()));
                        Ok(h)
                    }
                    Err(e) => {
                        self.slot_bytes = self.slot_bytes.saturating_sub(self.shard_bytes(shard));
                        Err(e)
                    }
                }
            }
            None => Err(StreamerError::Engine("shard slot vanished".into())),
        }
    }

    /// Sample `i` of `shard`: from a buffer of the stream, read, or (see
    /// [`SampleStream::defer_on_demand`]) located for the consumer to read, with its bytes on
    /// disk.
    fn read_sample(&mut self, shard: u32, i: u64) -> Result<Sampled> {
        if let Some(w) = self.whole.get(&shard) {
            let (base, buf) = (w.base, Arc::clone(&w.buf));
            return cut(&self.handle(shard)?, i, base, buf).map(Sampled::Read);
        }
        let buffered = self
            .read
            .as_ref()
            .filter(|r| r.shard == shard && (r.first..r.last).contains(&i))
            .map(|r| (r.base, Arc::clone(&r.buf)));
        if let Some((base, buf)) = buffered {
            return cut(&self.handle(shard)?, i, base, buf).map(Sampled::Read);
        }
        // Give the read buffer's bytes back to the budget before waiting for a fetch that may
        // need them. Its allocation returns to the dataset's `read_buffers` once the consumer
        // lets go of its samples (see `crate::buffers`).
        self.read = None;
        let h = self.handle(shard)?;
        // Sequential reading (the previous sample was the one before): read a run.
        let sequential = self.last == Some((shard, i.wrapping_sub(1)));
        if !sequential {
            if let Some(sample) = self.read_whole(shard, &h, i)? {
                return Ok(Sampled::Read(sample));
            }
        }
        let first = h.sample_range(i)?;
        // A shard still downloading: wait for this sample's bytes before taking any budget
        // (the download needs budget to make progress), and read no further than what is
        // there, so the sample is served as soon as it has arrived.
        self.wait_readable(&h, first.end)?;
        if self.take_request(first.end - first.start) {
            return Ok(Sampled::Deferred(h, first.end - first.start));
        }
        let readable = h.readable();
        let mut last = i + 1;
        if sequential {
            while last < h.num_samples() && h.sample_range(last)?.end - first.start <= RUN_BYTES {
                if h.sample_range(last)?.end > readable {
                    break;
                }
                last += 1;
            }
        }
        let bytes = h.sample_range(last - 1)?.end - first.start;
        let name = Arc::clone(&self.ds.shards[shard as usize].name);
        let what = || format!("sample {i} of {name}");
        let lease = match self.budget.try_acquire(bytes) {
            Some(lease) => lease,
            None => {
                self.drop_whole();
                self.budget.acquire_blocking(&what, bytes)?
            }
        };
        let (base, buf) = read_pooled(&self.ds, &h, i, last, bytes)?;
        let sample = cut(&h, i, base, Arc::clone(&buf))?;
        self.read = Some(ReadBuf {
            shard,
            first: i,
            last,
            base,
            buf,
            _lease: lease,
        });
        Ok(Sampled::Read(sample))
    }

    /// Whether the consumer asked for a sample to read (see
    /// [`SampleStream::defer_on_demand`]) and one of `bytes` is large enough; if so the request
    /// is taken (cleared). Costs one comparison for a small sample.
    fn take_request(&self, bytes: u64) -> bool {
        self.defer.as_ref().is_some_and(|d| {
            bytes >= d.min_bytes
                && d.wanted.load(Ordering::Relaxed)
                && d.wanted.swap(false, Ordering::AcqRel)
        })
    }

    /// Reads all of shard `shard` for sample `i` when the stream keeps whole shards and this one
    /// is small, complete, and fits now (`None`: read the sample alone).
    fn read_whole(&mut self, shard: u32, h: &ShardHandle, i: u64) -> Result<Option<RawSample>> {
        let n = h.num_samples();
        if self.whole_limit == 0 || self.next < self.whole_after || n == 0 || !h.is_complete() {
            return Ok(None);
        }
        let start = h.sample_range(0)?.start;
        let bytes = h.sample_range(n - 1)?.end - start;
        if bytes > RUN_BYTES || self.whole_bytes + bytes > self.whole_limit {
            return Ok(None);
        }
        let Some(lease) = self.budget.try_acquire(bytes) else {
            return Ok(None);
        };
        let (base, buf) = read_pooled(&self.ds, h, 0, n, bytes)?;
        let sample = cut(h, i, base, Arc::clone(&buf))?;
        self.whole.insert(
            shard,
            WholeShard {
                base,
                bytes,
                buf,
                _lease: lease,
            },
        );
        self.whole_bytes += bytes;
        Ok(Some(sample))
    }

    fn step(&mut self) -> Result<Option<StreamItem>> {
        if self.next >= self.len {
            self.slots.clear();
            self.current = None;
            self.read = None;
            self.drop_whole();
            // Shards still arriving in the background (served before they were complete) are
            // committed before the stream reports its end.
            if let Ok(ps) = self.ps() {
                ps.settle();
            }
            return Ok(None);
        }
        let j = self.partition.process_index(self.rank.worker, self.next);
        let position = self.partition.process_position(self.residue, j);
        let padding = position >= self.order.global_len();
        let source = if padding {
            self.partition.padding_source(position)
        } else {
            position
        };
        let id = self
            .order
            .sample_at(source)
            .ok_or_else(|| StreamerError::Engine(format!("position {source} has no sample")))?;
        if self.next >= self.replan_at {
            self.plan(id.shard)?;
        }
        let item = match self.read_sample(id.shard, id.index)? {
            Sampled::Read(sample) => StreamItem::Read(StreamedSample {
                position,
                index: id.sample,
                sample,
                padding,
            }),
            Sampled::Deferred(handle, len) => StreamItem::Deferred(DeferredSample {
                position,
                index: id.sample,
                padding,
                handle,
                in_shard: id.index,
                len,
                ds: Arc::clone(&self.ds),
            }),
        };
        let bytes = match &item {
            StreamItem::Read(s) => s.sample.bytes().len() as u64,
            StreamItem::Deferred(d) => d.len(),
        };
        self.last = Some((id.shard, id.index));
        self.next += 1;
        Metrics::add(&self.ds.metrics.samples, 1);
        Metrics::add(&self.ds.metrics.sample_bytes, bytes);
        Ok(Some(item))
    }
}

/// Reads samples `first..last` of `h` (`bytes` of them) with one `pread` into an allocation from
/// the dataset's pool; returns the file offset of its first byte and the buffer.
fn read_pooled(
    ds: &Inner,
    h: &ShardHandle,
    first: u64,
    last: u64,
    bytes: u64,
) -> Result<(u64, Arc<PooledBuffer>)> {
    let mut alloc = ds.read_buffers.take_read(bytes as usize);
    let base = h.read_run(first, last, &mut alloc)?;
    Metrics::add(&ds.metrics.sample_reads, 1);
    Ok((
        base,
        Arc::new(PooledBuffer::pooled_read(alloc, &ds.read_buffers)),
    ))
}

/// Sample `i` of `h` out of a buffer that holds the shard file's bytes from offset `base`.
fn cut(h: &ShardHandle, i: u64, base: u64, buf: Arc<PooledBuffer>) -> Result<RawSample> {
    let range = h.sample_range(i)?;
    let lo = (range.start - base) as usize;
    let hi = (range.end - base) as usize;
    h.raw_sample(i, buf, lo..hi)
}

impl Iterator for SampleStream {
    type Item = Result<StreamedSample>;

    fn next(&mut self) -> Option<Self::Item> {
        let streamed = match self.next_item()? {
            Ok(StreamItem::Read(s)) => Ok(s),
            Ok(StreamItem::Deferred(d)) => d.into_streamed(),
            Err(e) => Err(e),
        };
        if streamed.is_err() {
            self.failed = true;
        }
        Some(streamed)
    }
}

impl Drop for SampleStream {
    fn drop(&mut self) {
        let forked = self
            .ps
            .as_ref()
            .is_some_and(|ps| ps.pid != std::process::id());
        if forked {
            // Inherited from the parent: leak, never drop (see `engine`).
            std::mem::forget(std::mem::take(&mut self.slots));
            std::mem::forget(std::mem::take(&mut self.whole));
            std::mem::forget(self.current.take());
            std::mem::forget(self.ps.take());
        } else {
            let ds = &self.ds;
            ds.publisher.publish(|| ds.snapshot());
        }
    }
}
