//! Prefetch planning: which shards a rank reads over a range of its samples, and from when.
//!
//! Computed from the block structure, not sample by sample, so the cost is O(lanes the rank
//! reads x blocks in the range x window) whatever the range's length. The answer is a superset:
//! it lists every unit of every block the rank reaches, since within a shuffled block any unit
//! may come next.

use std::collections::BTreeMap;
use std::ops::Range;

use super::epoch::EpochOrder;
use super::partition::{gcd, Partition, Rank};
use crate::error::Result;

/// A shard that a rank will read in the planned range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardNeed {
    /// Global shard id.
    pub shard: u32,
    /// The rank's first sample (counted as its `RankIter` counts) that may come from this shard:
    /// the shard must be ready by then.
    pub first_item: u64,
    /// The sample indices of the shard that the range can touch (a node that owns only part of a
    /// shard, at a lane's edge, can fetch just these). The whole shard for a subset unit.
    pub samples: Range<u64>,
}

impl EpochOrder {
    /// The shards `rank` reads among its samples `items` (indices as its `RankIter` counts them)
    /// in `partition`, ordered by when they are first needed.
    pub fn shards_needed(
        &self,
        partition: &Partition,
        rank: Rank,
        items: Range<u64>,
    ) -> Result<Vec<ShardNeed>> {
        let world = *partition.world();
        let x = world.residue(rank)?;
        let len = partition.worker_len(rank.worker);
        let items = items.start.min(len)..items.end.min(len);
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut needs = BTreeMap::new();
        let first_process_index = partition.process_index(rank.worker, items.start);
        let mut last_item = items.end - 1;
        let p_lo = partition.process_position(x, first_process_index);
        let mut p_hi =
            partition.process_position(x, partition.process_index(rank.worker, last_item));
        let n = self.global_len();
        if p_hi >= n {
            // Only a process's last position can be padding.
            if let Some(s) = self.sample_at(partition.padding_source(p_hi)) {
                add(&mut needs, s.shard, last_item, s.index..s.index + 1);
            }
            if last_item == items.start {
                return Ok(sorted(needs));
            }
            last_item -= 1;
            p_hi = partition.process_position(x, partition.process_index(rank.worker, last_item));
        }
        let first_item_at = |pos: u64| -> u64 {
            let g = world.processes();
            let first = partition.process_position(x, 0);
            let j = if pos <= first {
                0
            } else {
                (pos - first).div_ceil(g)
            };
            partition
                .worker_index_at_or_after(rank.worker, j)
                .clamp(items.start, last_item)
        };
        let lanes = u64::from(self.config().lanes);
        let d = gcd(lanes, world.processes());
        let (units, starts) = self.units();
        let mut c = x % d;
        while c < lanes && c <= p_hi {
            let lane = self.lane(c);
            let lane_len = lane.end - lane.start;
            let k_lo = if p_lo <= c {
                0
            } else {
                (p_lo - c).div_ceil(lanes)
            };
            let k_hi = ((p_hi - c) / lanes).min(lane_len.saturating_sub(1));
            if lane_len > 0 && k_lo <= k_hi {
                let first_unit = self.lane_first_unit(c);
                let layout = self.layout();
                let j0 = layout.block_of_unit(self.unit_at(lane.start + k_lo) - first_unit);
                let j1 = layout.block_of_unit(self.unit_at(lane.start + k_hi) - first_unit);
                for j in j0..=j1 {
                    let block = self.block(first_unit, &lane, j);
                    let seq_lo = block.seq.start.max(lane.start + k_lo);
                    let seq_hi = block.seq.end.min(lane.start + k_hi + 1);
                    // Shuffled: any sample of the block may be read from `seq_lo` on.
                    // In order: each unit's part of `seq_lo..seq_hi`, when its turn comes.
                    let span = if self.config().shuffle {
                        block.seq.clone()
                    } else {
                        seq_lo..seq_hi
                    };
                    for u in block.units.clone() {
                        let (u_lo, u_hi) = (starts[u].max(span.start), starts[u + 1].min(span.end));
                        if u_lo >= u_hi {
                            continue;
                        }
                        let reached = if self.config().shuffle { seq_lo } else { u_lo };
                        let first = first_item_at((reached - lane.start) * lanes + c);
                        let unit = units[u];
                        let samples = if unit.subset {
                            0..self.shape().shard_len(unit.shard).unwrap_or(0)
                        } else {
                            (u_lo - starts[u])..(u_hi - starts[u])
                        };
                        add(&mut needs, unit.shard, first, samples);
                    }
                }
            }
            c += d;
        }
        Ok(sorted(needs))
    }
}

fn add(needs: &mut BTreeMap<u32, ShardNeed>, shard: u32, first_item: u64, samples: Range<u64>) {
    needs
        .entry(shard)
        .and_modify(|n| {
            n.first_item = n.first_item.min(first_item);
            n.samples = n.samples.start.min(samples.start)..n.samples.end.max(samples.end);
        })
        .or_insert(ShardNeed {
            shard,
            first_item,
            samples,
        });
}

fn sorted(needs: BTreeMap<u32, ShardNeed>) -> Vec<ShardNeed> {
    let mut out: Vec<ShardNeed> = needs.into_values().collect();
    out.sort_by_key(|n| (n.first_item, n.shard));
    out
}
