//! Who reads which positions of the global order.
//!
//! The rule is chosen so that the order in which a training job *consumes* samples is the global
//! order, whatever its world:
//! - process (GPU) with residue `x` reads the positions `p >= start` with `p % processes == x`,
//!   in increasing order. With `processes` ranks each taking one batch per step, the samples
//!   consumed after `t` steps are exactly the positions `start .. start + t * processes * batch`;
//!   a resume needs only that count, and can continue it with any other world.
//! - the residue of global rank `node * processes_per_node + local` is
//!   `local * nodes + node`: positions are dealt across nodes first, so that lane `c` is read
//!   only by node `c % nodes` whenever `nodes` divides `lanes` (each shard downloaded by one node).
//! - a process's DataLoader workers take turns by batch: worker `w` yields the process's batches
//!   `w, w + workers, ...`, which is the order in which PyTorch's DataLoader returns them.
//! - the end of the epoch is evened out per [`Remainder`]: with `Pad`, position `p >= N` repeats
//!   position `p - processes` (the same process's previous-round sample, already cached).

use super::config::Remainder;
use super::epoch::{EpochOrder, SampleId};
use crate::error::{Result, StreamerError};

/// The shape of a training job: nodes, processes per node, DataLoader workers per process, and
/// the per-process batch size that the DataLoader collates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct World {
    nodes: u32,
    processes_per_node: u32,
    workers: u32,
    batch_size: u32,
}

/// One reader: a DataLoader worker of one process on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rank {
    /// Node index (`SHARDSTREAM_NODE_RANK` / `JOB_COMPLETION_INDEX` / `GROUP_RANK`).
    pub node: u32,
    /// Process index on the node (`LOCAL_RANK`).
    pub local_process: u32,
    /// DataLoader worker id (0 when the DataLoader has no workers).
    pub worker: u32,
}

/// How lanes fall onto nodes for a given world; see `docs/sample-order.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locality {
    /// Lanes each node reads (its cache holds about `lanes_per_node * window` shards).
    pub lanes_per_node: u64,
    /// Nodes that read each lane: how many times each shard is downloaded per epoch when shards
    /// are fetched whole (1 when `nodes` divides `lanes`).
    pub nodes_per_lane: u64,
}

impl World {
    /// One node, one process, no DataLoader workers, batches of one: a whole epoch read by one
    /// reader.
    pub const SINGLE: World = World {
        nodes: 1,
        processes_per_node: 1,
        workers: 1,
        batch_size: 1,
    };

    /// A world of `nodes x processes_per_node` processes with `workers` DataLoader workers each
    /// (pass 1 for a DataLoader without workers) collating batches of `batch_size`.
    pub fn new(nodes: u32, processes_per_node: u32, workers: u32, batch_size: u32) -> Result<Self> {
        for (setting, v) in [
            ("nodes", nodes),
            ("processes_per_node", processes_per_node),
            ("workers", workers),
            ("batch_size", batch_size),
        ] {
            if v == 0 {
                return Err(StreamerError::InvalidConfig {
                    setting,
                    reason: "must be at least 1".into(),
                });
            }
        }
        Ok(Self {
            nodes,
            processes_per_node,
            workers,
            batch_size,
        })
    }

    /// Nodes.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// Processes per node.
    pub fn processes_per_node(&self) -> u32 {
        self.processes_per_node
    }

    /// DataLoader workers per process.
    pub fn workers(&self) -> u32 {
        self.workers
    }

    /// Per-process batch size.
    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    /// Processes in all (the torch world size).
    pub fn processes(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.processes_per_node)
    }

    /// Readers in all: `nodes x processes_per_node x workers`.
    pub fn size(&self) -> u64 {
        self.processes() * u64::from(self.workers)
    }

    /// The flat index of a rank: `(node * processes_per_node + local_process) * workers + worker`.
    pub fn flat_index(&self, rank: Rank) -> Result<u64> {
        self.check(rank)?;
        let process = u64::from(rank.node) * u64::from(self.processes_per_node)
            + u64::from(rank.local_process);
        Ok(process * u64::from(self.workers) + u64::from(rank.worker))
    }

    /// The rank with a given flat index (the inverse of [`World::flat_index`]).
    pub fn rank_at(&self, flat: u64) -> Result<Rank> {
        let workers = u64::from(self.workers);
        let ppn = u64::from(self.processes_per_node);
        let rank = Rank {
            node: u32::try_from(flat / workers / ppn).unwrap_or(u32::MAX),
            local_process: ((flat / workers) % ppn) as u32,
            worker: (flat % workers) as u32,
        };
        self.check(rank)?;
        Ok(rank)
    }

    /// The rank of DataLoader worker `worker` of torch global rank `global_rank` (torchrun numbers
    /// processes node by node: `global_rank = node * processes_per_node + local_rank`).
    pub fn rank_of_process(&self, global_rank: u64, worker: u32) -> Result<Rank> {
        let ppn = u64::from(self.processes_per_node);
        let rank = Rank {
            node: u32::try_from(global_rank / ppn).unwrap_or(u32::MAX),
            local_process: (global_rank % ppn) as u32,
            worker,
        };
        self.check(rank)?;
        Ok(rank)
    }

    /// The residue class of positions that `rank`'s process reads.
    pub fn residue(&self, rank: Rank) -> Result<u64> {
        self.check(rank)?;
        Ok(u64::from(rank.local_process) * u64::from(self.nodes) + u64::from(rank.node))
    }

    /// How `lanes` lanes fall onto this world's nodes.
    pub fn locality(&self, lanes: u32) -> Locality {
        let nodes = u64::from(self.nodes);
        let lanes = u64::from(lanes.max(1));
        let g = gcd(nodes, lanes);
        Locality {
            lanes_per_node: lanes / g,
            nodes_per_lane: nodes / g,
        }
    }

    fn check(&self, rank: Rank) -> Result<()> {
        if rank.node >= self.nodes
            || rank.local_process >= self.processes_per_node
            || rank.worker >= self.workers
        {
            return Err(self.out_of_range(rank));
        }
        Ok(())
    }

    fn out_of_range(&self, rank: Rank) -> StreamerError {
        StreamerError::RankOutOfRange {
            node: rank.node,
            local_process: rank.local_process,
            worker: rank.worker,
            nodes: self.nodes,
            processes_per_node: self.processes_per_node,
            workers: self.workers,
        }
    }
}

pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The split of the positions `start..` of one epoch over a world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    world: World,
    global_len: u64,
    start: u64,
    end: u64,
}

impl Partition {
    /// Splits positions `start..global_len` (nothing when `start >= global_len`), evened out per
    /// `remainder`.
    pub fn new(global_len: u64, world: World, start: u64, remainder: Remainder) -> Self {
        let g = world.processes();
        let start = start.min(global_len);
        let left = global_len - start;
        let rounds = match remainder {
            Remainder::Pad => left.div_ceil(g),
            Remainder::Drop => left / g,
        };
        Self {
            world,
            global_len,
            start,
            end: start + rounds * g,
        }
    }

    /// The world it is for.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// First position it hands out (the resume point).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last position it hands out; positions at or past the epoch's length are
    /// padding.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Samples each process reads (the same for all, so no DDP rank waits on another).
    pub fn per_process(&self) -> u64 {
        (self.end - self.start) / self.world.processes()
    }

    /// Padding positions in all (fewer than the number of processes).
    pub fn padding(&self) -> u64 {
        self.end.saturating_sub(self.global_len)
    }

    /// Global samples consumed once every process has consumed `per_process` of its samples:
    /// the value to save in a [`StreamState`](super::StreamState) (capped at the epoch's length).
    pub fn consumed_after(&self, per_process: u64) -> u64 {
        let n = per_process.min(self.per_process());
        (self.start + n * self.world.processes()).min(self.global_len)
    }

    /// The `j`-th position read by the process of residue `x`.
    pub fn process_position(&self, x: u64, j: u64) -> u64 {
        let g = self.world.processes();
        let first = self.start + (x + g - self.start % g) % g;
        first + j * g
    }

    /// Samples a worker yields (workers of a process may differ by up to a batch).
    pub fn worker_len(&self, worker: u32) -> u64 {
        let b = u64::from(self.world.batch_size);
        let nw = u64::from(self.world.workers);
        let w = u64::from(worker);
        let len = self.per_process();
        let batches = len.div_ceil(b);
        if w >= batches {
            return 0;
        }
        let mine = (batches - 1 - w) / nw + 1;
        let owns_last = (batches - 1) % nw == w;
        let short = batches * b - len;
        mine * b - if owns_last { short } else { 0 }
    }

    /// The process-local index of a worker's `i`-th sample.
    pub fn process_index(&self, worker: u32, i: u64) -> u64 {
        let b = u64::from(self.world.batch_size);
        let nw = u64::from(self.world.workers);
        let batch = (i / b) * nw + u64::from(worker);
        batch * b + i % b
    }

    /// The first of a worker's samples whose process-local index is at least `j`.
    pub(crate) fn worker_index_at_or_after(&self, worker: u32, j: u64) -> u64 {
        let b = u64::from(self.world.batch_size);
        let nw = u64::from(self.world.workers);
        let w = u64::from(worker);
        let batch = j / b;
        if batch % nw == w {
            (batch / nw) * b + j % b
        } else {
            let next = batch + (w + nw - batch % nw) % nw;
            (next / nw) * b
        }
    }

    /// The position whose sample a padding position `p` repeats.
    pub fn padding_source(&self, p: u64) -> u64 {
        let g = self.world.processes();
        if p >= g {
            p - g
        } else {
            p % self.global_len.max(1)
        }
    }
}

/// One sample handed to a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankSample {
    /// Its global position in the epoch (padding positions are `>= global_len`).
    pub position: u64,
    /// The sample.
    pub sample: SampleId,
    /// Whether this is a padding repeat (see [`Remainder::Pad`]).
    pub padding: bool,
}

/// A rank's samples for the rest of an epoch, in the order its DataLoader worker yields them.
#[derive(Debug, Clone)]
pub struct RankIter<'a> {
    order: &'a EpochOrder,
    partition: Partition,
    residue: u64,
    worker: u32,
    next: u64,
    len: u64,
}

impl RankIter<'_> {
    /// The partition it walks.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Samples already yielded.
    pub fn yielded(&self) -> u64 {
        self.next
    }
}

impl Iterator for RankIter<'_> {
    type Item = RankSample;

    fn next(&mut self) -> Option<RankSample> {
        if self.next >= self.len {
            return None;
        }
        let j = self.partition.process_index(self.worker, self.next);
        self.next += 1;
        let position = self.partition.process_position(self.residue, j);
        let padding = position >= self.order.global_len();
        let source = if padding {
            self.partition.padding_source(position)
        } else {
            position
        };
        let sample = self.order.sample_at(source)?;
        Some(RankSample {
            position,
            sample,
            padding,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.len - self.next).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl ExactSizeIterator for RankIter<'_> {}

impl EpochOrder {
    /// The split of positions `start..` over `world`, evened out per the order's remainder rule.
    pub fn partition(&self, world: World, start: u64) -> Partition {
        let locality = world.locality(self.config().lanes);
        if locality.nodes_per_lane > 1 {
            tracing::debug!(
                lanes = self.config().lanes,
                nodes = world.nodes(),
                nodes_per_lane = locality.nodes_per_lane,
                "lanes is not a multiple of nodes: shards are read by several nodes"
            );
        }
        Partition::new(self.global_len(), world, start, self.config().remainder)
    }

    /// The samples of `rank` from global position `start` on (0 for a fresh epoch, the saved
    /// `consumed` count on resume).
    pub fn rank_iter(&self, world: World, rank: Rank, start: u64) -> Result<RankIter<'_>> {
        let residue = world.residue(rank)?;
        let partition = self.partition(world, start);
        Ok(RankIter {
            order: self,
            partition,
            residue,
            worker: rank.worker,
            next: 0,
            len: partition.worker_len(rank.worker),
        })
    }
}
