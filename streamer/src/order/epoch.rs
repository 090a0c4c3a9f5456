//! The global order of one epoch, computed one position at a time.
//!
//! Construction (all keys derive from `(seed, epoch)`; memory O(units + lanes)):
//! 1. The epoch's units (shards, shard copies and shard subsets; see `units.rs`) are shuffled
//!    with a seeded Fisher–Yates and laid end to end: a sequence of `N` samples.
//! 2. The sequence is cut into `lanes` contiguous runs; lane `c` has `ceil((N - c) / lanes)`
//!    samples, so position `p` of the global order is sample `p / lanes` of lane `p % lanes`.
//! 3. Each lane is cut into blocks of consecutive units: `window` of them, after a ramp of 1, 2,
//!    4, ... units at the lane's start when `ramp` is on (at most half of the lane's units; see
//!    [`BlockLayout`]). The first and last block of a lane may hold parts of units; inside a
//!    block, samples are permuted by a keyed Feistel permutation; with `sample_ramp`, a lane's
//!    first block is permuted in parts that halve towards its start (`sample_ramp_part`), so
//!    that its first samples lie near the start of the first unit.
//!
//! Without `shuffle`, steps 1 and 3 keep the natural order; the lanes remain.

use std::ops::Range;
use std::time::Instant;

use super::config::{sample_ramp_part, BlockLayout, OrderConfig};
use super::prp::{derive_key, tag, Feistel, SplitMix64};
use super::shape::DatasetShape;
use super::units::{epoch_units, subset_index, Unit};
use crate::error::Result;

/// One sample of the dataset, as the order hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleId {
    /// The stream (dataset) it comes from.
    pub stream: u32,
    /// Global shard id (shards of all streams numbered one after the other).
    pub shard: u32,
    /// Index of the sample inside its shard.
    pub index: u64,
    /// Global sample id (samples of all streams numbered one after the other).
    pub sample: u64,
}

/// A block of a lane: consecutive units whose samples are shuffled together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Block {
    /// Indices into the epoch's unit list.
    pub units: Range<usize>,
    /// The block's samples, as a range of the epoch's sample sequence.
    pub seq: Range<u64>,
}

/// The global sample order of one epoch. Cheap to query from any thread (`Sync`), O(shards) in
/// memory, independent of how many nodes, processes or workers read it.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    config: OrderConfig,
    epoch: u64,
    shape: DatasetShape,
    units: Vec<Unit>,
    /// `starts[i]` is the sequence index of unit `i`'s first sample; one extra entry holds `N`.
    starts: Vec<u64>,
    /// The unit holding each lane's first sample (`units.len()` for an empty lane).
    lane_first_unit: Vec<usize>,
    /// How this epoch cuts each lane into blocks.
    layout: BlockLayout,
}

impl EpochOrder {
    /// The order of `epoch` for `shape` under `config`.
    pub fn new(shape: &DatasetShape, config: &OrderConfig, epoch: u64) -> Result<Self> {
        config.validate()?;
        let began = Instant::now();
        let (mut units, mut lens) = epoch_units(shape, config.seed, epoch);
        if config.shuffle {
            let mut paired: Vec<(Unit, u64)> = units.into_iter().zip(lens).collect();
            SplitMix64::new(derive_key(tag::UNIT_ORDER, &[config.seed, epoch]))
                .shuffle(&mut paired);
            (units, lens) = paired.into_iter().unzip();
        }
        let mut starts = Vec::with_capacity(lens.len() + 1);
        let mut at = 0u64;
        for len in lens {
            starts.push(at);
            // Cannot overflow: the lengths add up to `shape.epoch_len()`, which fit in a u64.
            at += len;
        }
        starts.push(at);
        let units_len = units.len();
        let mut order = Self {
            config: *config,
            epoch,
            shape: shape.clone(),
            units,
            starts,
            lane_first_unit: Vec::new(),
            layout: BlockLayout::new(config, units_len / config.lanes as usize),
        };
        order.lane_first_unit = (0..u64::from(config.lanes))
            .map(|c| {
                let lane = order.lane(c);
                if lane.is_empty() {
                    order.units.len()
                } else {
                    order.unit_at(lane.start)
                }
            })
            .collect();
        tracing::debug!(
            epoch,
            samples = order.global_len(),
            units = order.units.len(),
            lanes = config.lanes,
            window = config.window,
            shuffle = config.shuffle,
            build_us = began.elapsed().as_micros() as u64,
            "built epoch order"
        );
        Ok(order)
    }

    /// Samples in the epoch (positions `0..global_len()`), padding not included.
    pub fn global_len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The epoch this order is for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The settings it was built with.
    pub fn config(&self) -> &OrderConfig {
        &self.config
    }

    /// The dataset it orders.
    pub fn shape(&self) -> &DatasetShape {
        &self.shape
    }

    /// Heap bytes held by this order (and its copy of the dataset shape): O(shards), whatever the
    /// number of samples.
    pub fn heap_bytes(&self) -> usize {
        self.units.capacity() * std::mem::size_of::<Unit>()
            + self.starts.capacity() * std::mem::size_of::<u64>()
            + self.lane_first_unit.capacity() * std::mem::size_of::<usize>()
            + self.shape.heap_bytes()
    }

    /// The sample at global position `pos`, or `None` past the end of the epoch.
    pub fn sample_at(&self, pos: u64) -> Option<SampleId> {
        if pos >= self.global_len() {
            return None;
        }
        let lanes = u64::from(self.config.lanes);
        let c = pos % lanes;
        let lane = self.lane(c);
        let q = lane.start + pos / lanes;
        let unit = self.unit_at(q);
        if !self.config.shuffle {
            return Some(self.sample_in_unit(unit, q));
        }
        let (j, block) = self.block_of(c, &lane, unit);
        let offset = q - block.seq.start;
        let block_len = block.seq.end - block.seq.start;
        let shuffled = if j == 0 && self.config.sample_ramp {
            let part = sample_ramp_part(block_len, offset);
            let key = derive_key(
                tag::BLOCK,
                &[self.config.seed, self.epoch, c, j, part.start],
            );
            block.seq.start
                + part.start
                + Feistel::new(part.end - part.start, key).permute(offset - part.start)
        } else {
            let key = derive_key(tag::BLOCK, &[self.config.seed, self.epoch, c, j]);
            block.seq.start + Feistel::new(block_len, key).permute(offset)
        };
        let in_block = &self.starts[block.units.clone()];
        let unit = block.units.start
            + in_block
                .partition_point(|&s| s <= shuffled)
                .saturating_sub(1);
        Some(self.sample_in_unit(unit, shuffled))
    }

    /// Lane `c`'s samples as a range of the epoch's sample sequence.
    pub(crate) fn lane(&self, c: u64) -> Range<u64> {
        let lanes = u64::from(self.config.lanes);
        let n = self.global_len();
        let (base, extra) = (n / lanes, n % lanes);
        let start = c * base + c.min(extra);
        start..start + base + u64::from(c < extra)
    }

    /// The unit holding sequence index `q` (`q < global_len()`).
    pub(crate) fn unit_at(&self, q: u64) -> usize {
        self.starts.partition_point(|&s| s <= q).saturating_sub(1)
    }

    /// The block of lane `c` (spanning `lane`) that holds unit `unit`, with its index in the lane.
    pub(crate) fn block_of(&self, c: u64, lane: &Range<u64>, unit: usize) -> (u64, Block) {
        let first = self.lane_first_unit.get(c as usize).copied().unwrap_or(0);
        let j = self.layout.block_of_unit(unit - first);
        (j as u64, self.block(first, lane, j))
    }

    /// Block `j` of the lane that spans `lane` and begins in unit `first`.
    pub(crate) fn block(&self, first: usize, lane: &Range<u64>, j: usize) -> Block {
        let span = self.layout.block_units(j);
        let u0 = first.saturating_add(span.start).min(self.units.len());
        let u1 = first.saturating_add(span.end).min(self.units.len());
        let start = self.starts[u0].max(lane.start);
        let end = self.starts[u1].min(lane.end);
        Block {
            units: u0..u1,
            seq: start..end.max(start),
        }
    }

    /// Index of the first unit of lane `c`.
    pub(crate) fn lane_first_unit(&self, c: u64) -> usize {
        self.lane_first_unit
            .get(c as usize)
            .copied()
            .unwrap_or(self.units.len())
    }

    /// How this epoch cuts each lane into blocks, for planning.
    pub(crate) fn layout(&self) -> &BlockLayout {
        &self.layout
    }

    /// The unit list and its prefix sums, for planning.
    pub(crate) fn units(&self) -> (&[Unit], &[u64]) {
        (&self.units, &self.starts)
    }

    /// The sample at sequence index `q`, which lies in unit `unit`.
    fn sample_in_unit(&self, unit: usize, q: u64) -> SampleId {
        let u = self.units[unit];
        let offset = q - self.starts[unit];
        let index = if u.subset {
            let shard_len = self.shape.shard_len(u.shard).unwrap_or(0);
            subset_index(
                &self.shape,
                self.config.seed,
                self.epoch,
                u.shard,
                shard_len,
                offset,
            )
        } else {
            offset
        };
        let shard_start = self
            .shape
            .shard_starts()
            .get(u.shard as usize)
            .copied()
            .unwrap_or(0);
        SampleId {
            stream: self.shape.stream_of(u.shard).unwrap_or(0),
            shard: u.shard,
            index,
            sample: shard_start + index,
        }
    }
}
