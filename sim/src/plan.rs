//! What one node downloads, step by step, as the real code decides it.
//!
//! A node's processes read their parts of the epoch in lock step (DDP: every process takes one
//! batch per step). The model cuts each process's part into steps of a fraction of a shuffle
//! block and asks the order which shards each process reads in each step
//! ([`EpochOrder::shards_needed`], the call a stream's prefetch planner makes). The union over
//! the node's processes is what the node's cache must hold during that step; a shard that is
//! not in the cache is downloaded in the requests [`fetch_parts`] cuts it into (what the
//! streamer's fetch sends). The cache keeps what it holds until the limit forces the least
//! recently used unpinned shard out (the streamer's eviction rule), so a shard that comes back
//! after eviction is downloaded again.
//!
//! DataLoader workers are folded into their process here (a world of one worker per process):
//! the workers of a process split its positions, so together they read the same shards.

use std::collections::{BTreeMap, HashMap, HashSet};

use shardstream_streamer::dataset::fetch_parts;
use shardstream_streamer::order::{EpochOrder, Partition, Rank, World};

use crate::error::{add, Result};
use crate::shards::Shards;

/// One world's split of an epoch into planning steps.
#[derive(Debug)]
pub struct Steps<'a> {
    order: &'a EpochOrder,
    partition: Partition,
    ranks_per_node: u32,
    /// Items (samples) of one process per step.
    pub step: u64,
    /// Steps in the part of the epoch the partition covers.
    pub count: u64,
}

impl<'a> Steps<'a> {
    /// Steps for `nodes x ranks_per_node` processes from global position `start`, about
    /// `steps_per_block` of them per shuffle block of a process.
    pub fn new(
        order: &'a EpochOrder,
        nodes: u32,
        ranks_per_node: u32,
        batch_size: u32,
        start: u64,
        steps_per_block: u32,
    ) -> Result<Steps<'a>> {
        let world = World::new(nodes, ranks_per_node, 1, batch_size)?;
        let partition = order.partition(world, start);
        let shards = order.shape().num_shards().max(1);
        let mean_samples = order.shape().num_samples() / u64::from(shards);
        let config = order.config();
        // A lane moves one sample per `lanes` positions, a process reads one of `processes`:
        // a block of `window` shards lasts window x samples x lanes / processes of its items.
        let block_items =
            u128::from(config.window) * u128::from(mean_samples.max(1)) * u128::from(config.lanes)
                / u128::from(world.processes());
        let step = u64::try_from(block_items / u128::from(steps_per_block.max(1)))
            .unwrap_or(u64::MAX)
            .max(1);
        let count = partition.per_process().div_ceil(step);
        Ok(Steps {
            order,
            partition,
            ranks_per_node,
            step,
            count,
        })
    }

    /// The partition (one worker per process).
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// The shards node `node`'s processes read in step `k`, sorted.
    pub fn live(&self, node: u32, k: u64) -> Result<Vec<u32>> {
        let lo = k.saturating_mul(self.step);
        let hi = lo.saturating_add(self.step);
        let mut out = Vec::new();
        for p in 0..self.ranks_per_node {
            let rank = Rank {
                node,
                local_process: p,
                worker: 0,
            };
            let needs = self.order.shards_needed(&self.partition, rank, lo..hi)?;
            out.extend(needs.into_iter().map(|n| n.shard));
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// A node cache under a byte limit with least-recently-used eviction of unpinned shards.
#[derive(Debug, Clone, Default)]
pub struct NodeCache {
    limit: u64,
    tick: u64,
    by_age: BTreeMap<u64, u32>,
    age: HashMap<u32, u64>,
    bytes: u64,
}

impl NodeCache {
    /// An empty cache of `limit` bytes.
    pub fn new(limit: u64) -> NodeCache {
        NodeCache {
            limit,
            ..NodeCache::default()
        }
    }

    /// Whether it holds `shard`.
    pub fn holds(&self, shard: u32) -> bool {
        self.age.contains_key(&shard)
    }

    /// The shards it holds.
    pub fn shards(&self) -> impl Iterator<Item = u32> + '_ {
        self.age.keys().copied()
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn touch(&mut self, shard: u32) {
        self.tick += 1;
        if let Some(old) = self.age.insert(shard, self.tick) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(self.tick, shard);
    }

    fn insert(&mut self, shard: u32, bytes: u64) -> Result<()> {
        self.bytes = add(self.bytes, bytes, "cache bytes")?;
        self.touch(shard);
        Ok(())
    }

    /// Evicts least recently used shards outside `pinned` until it is within its limit;
    /// returns how many it evicted.
    fn evict(&mut self, pinned: &HashSet<u32>, shards: &Shards) -> u64 {
        let mut evicted = 0;
        let mut skipped = Vec::new();
        while self.bytes > self.limit {
            let Some((&t, &s)) = self.by_age.iter().next() else {
                break;
            };
            self.by_age.remove(&t);
            if pinned.contains(&s) {
                skipped.push((t, s));
                continue;
            }
            self.age.remove(&s);
            self.bytes = self.bytes.saturating_sub(shards.bytes[s as usize]);
            evicted += 1;
        }
        for (t, s) in skipped {
            self.by_age.insert(t, s);
        }
        evicted
    }
}

/// What one node did over a range of steps.
#[derive(Debug, Clone, Default)]
pub struct NodeRun {
    /// Bytes downloaded.
    pub bytes: u64,
    /// GET requests sent for shards.
    pub requests: u64,
    /// Shard downloads (a shard downloaded twice counts twice).
    pub downloads: u64,
    /// Downloads of a shard this node had already downloaded and evicted.
    pub refetches: u64,
    /// Shards found in the cache when first needed in the range (kept from before it).
    pub kept_hits: u64,
    /// Most bytes the node needs at once: the shards of a step and of the next (prefetch).
    pub peak_need: u64,
    /// Whether `peak_need` exceeded the cache limit (the streamer would refuse or thrash).
    pub over_limit: bool,
    /// Requests per step and prefix: `[step][prefix]`.
    pub step_requests: Vec<Vec<u64>>,
    /// Bytes per step.
    pub step_bytes: Vec<u64>,
    /// Every shard downloaded in the range.
    pub downloaded: HashSet<u32>,
}

/// Plays node `node` through `steps` (from `first` to the end), starting from `cache`.
pub fn run_node(
    steps: &Steps<'_>,
    shards: &Shards,
    node: u32,
    first: u64,
    cache: &mut NodeCache,
) -> Result<NodeRun> {
    let mut run = NodeRun::default();
    let prefixes = shards.prefixes as usize;
    let mut seen: HashSet<u32> = HashSet::new();
    let initial: HashSet<u32> = cache.shards().collect();
    let mut ever = initial.clone();
    let mut live = if first < steps.count {
        steps.live(node, first)?
    } else {
        Vec::new()
    };
    for k in first..steps.count {
        let next = if k + 1 < steps.count {
            steps.live(node, k + 1)?
        } else {
            Vec::new()
        };
        let mut requests = vec![0u64; prefixes];
        let mut bytes = 0u64;
        for &s in &live {
            let size = shards.bytes[s as usize];
            if cache.holds(s) {
                if seen.insert(s) && initial.contains(&s) {
                    run.kept_hits += 1;
                }
                cache.touch(s);
                continue;
            }
            seen.insert(s);
            let parts = fetch_parts(size).len() as u64;
            requests[shards.prefix_of(s)] += parts;
            run.requests = add(run.requests, parts, "requests")?;
            bytes = add(bytes, size, "node bytes")?;
            run.downloads += 1;
            if !ever.insert(s) {
                run.refetches += 1;
            }
            run.downloaded.insert(s);
            cache.insert(s, size)?;
        }
        let pinned: HashSet<u32> = live.iter().chain(next.iter()).copied().collect();
        let need = pinned
            .iter()
            .map(|&s| shards.bytes[s as usize])
            .fold(0u64, u64::saturating_add);
        run.peak_need = run.peak_need.max(need);
        cache.evict(&pinned, shards);
        run.bytes = add(run.bytes, bytes, "node bytes")?;
        run.step_requests.push(requests);
        run.step_bytes.push(bytes);
        live = next;
    }
    run.over_limit = run.peak_need > cache.limit;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dataset;
    use shardstream_streamer::order::{DatasetShape, OrderConfig};

    fn shards(n: u32) -> Shards {
        Shards::from_config(&Dataset {
            shards: n,
            shard_bytes: 1000,
            samples_per_shard: 50,
            prefixes: 3,
            index_bytes: Some(1),
            index: None,
        })
        .unwrap()
    }

    /// With room for everything, a node downloads exactly the shards its ranks' samples come
    /// from (as `rank_iter` yields them), each once.
    #[test]
    fn a_node_downloads_the_shards_of_its_ranks_samples_once() {
        let sh = shards(40);
        let shape = DatasetShape::single(sh.samples.clone()).unwrap();
        for (nodes, lanes, ppn) in [(4u32, 4u32, 2u32), (3, 4, 2), (2, 1, 3)] {
            let config = OrderConfig {
                seed: 3,
                shuffle: true,
                window: 4,
                lanes,
                ..OrderConfig::default()
            };
            let order = EpochOrder::new(&shape, &config, 1).unwrap();
            let steps = Steps::new(&order, nodes, ppn, 5, 0, 4).unwrap();
            let world = World::new(nodes, ppn, 1, 5).unwrap();
            for node in 0..nodes {
                let mut cache = NodeCache::new(u64::MAX);
                let run = run_node(&steps, &sh, node, 0, &mut cache).unwrap();
                let mut want = HashSet::new();
                for p in 0..ppn {
                    let rank = Rank {
                        node,
                        local_process: p,
                        worker: 0,
                    };
                    want.extend(
                        order
                            .rank_iter(world, rank, 0)
                            .unwrap()
                            .map(|s| s.sample.shard),
                    );
                }
                assert!(
                    run.downloaded.is_superset(&want),
                    "{nodes} nodes, {lanes} lanes, node {node}"
                );
                assert_eq!(run.downloads, run.downloaded.len() as u64);
                assert_eq!(run.refetches, 0);
                let total: u64 = run.step_requests.iter().flatten().sum();
                assert_eq!(total, run.requests);
            }
        }
    }

    /// A cache smaller than the epoch evicts, and what comes back is downloaded again.
    #[test]
    fn a_small_cache_refetches_what_it_evicted() {
        let sh = shards(40);
        let shape = DatasetShape::single(sh.samples.clone()).unwrap();
        let config = OrderConfig {
            seed: 3,
            shuffle: true,
            window: 4,
            lanes: 1,
            ..OrderConfig::default()
        };
        let order = EpochOrder::new(&shape, &config, 0).unwrap();
        let steps = Steps::new(&order, 2, 1, 5, 0, 4).unwrap();
        let mut big = NodeCache::new(u64::MAX);
        let all = run_node(&steps, &sh, 0, 0, &mut big).unwrap();
        let mut small = NodeCache::new(all.peak_need);
        let tight = run_node(&steps, &sh, 0, 0, &mut small).unwrap();
        assert!(!tight.over_limit);
        assert!(small.bytes() <= all.peak_need);
        assert_eq!(
            tight.downloads,
            tight.downloaded.len() as u64 + tight.refetches
        );
    }
}
