//! Time to the first batch of every rank on a cold start.
//!
//! Each node starts at its offset in `model.start_spread`; each of its processes fetches
//! `index.json` (they start together, before the node's copy exists, as the validation runs
//! measured) and parses it, then every DataLoader worker of every
//! process takes its first `batch_size` samples from the order ([`EpochOrder::rank_iter`],
//! with the real world of workers). The node opens each distinct shard once (its workers join the download) and the
//! shards share the node's link; a worker's batch is ready when the bytes up to the last
//! sample it needs of each of its shards have arrived (shards are written front to back and
//! served as they arrive). Requests over the prefix's limit in one second are answered `503`
//! and retried after the store's backoff.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use serde::Serialize;
use shardstream_storage::RetryPolicy;
use shardstream_streamer::order::{EpochOrder, Rank, World};

use crate::config::SimConfig;
use crate::error::Result;
use crate::shards::Shards;

/// Distribution of first-batch times, seconds.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Quantiles {
    /// Fastest.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

impl Quantiles {
    fn of(mut v: Vec<f64>) -> Quantiles {
        if v.is_empty() {
            return Quantiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Quantiles {
            min: v[0],
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// The cold start.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StartupReport {
    /// Bytes of `index.json`.
    pub index_bytes: u64,
    /// Seconds to fetch and parse it on one node, unthrottled.
    pub index_seconds: f64,
    /// Requests for the index: two per process (a cold node's processes start together), the
    /// GET of `index.ssx` (404 without one) and then that of `index.json` (a HEAD with one).
    pub index_requests: u64,
    /// Shard GETs the first batches start, all nodes.
    pub first_gets: u64,
    /// Distinct shards per node for the first batches (largest).
    pub first_shards_per_node_max: u64,
    /// `503` replies during the start.
    pub throttled: u64,
    /// First batch of each process (its DataLoader's worker 0), seconds from the job start.
    pub process_first_batch: Quantiles,
    /// First batch of every worker, seconds from the job start.
    pub worker_first_batch: Quantiles,
}

/// A prefix that serves at most `limit` requests in each second.
struct Prefix {
    limit_per_slice: f64,
    used: std::collections::HashMap<u64, f64>,
}

impl Prefix {
    fn admit(&mut self, t: f64) -> bool {
        let slice = t.floor().max(0.0) as u64;
        let used = self.used.entry(slice).or_insert(0.0);
        if *used + 1.0 <= self.limit_per_slice.max(1.0) {
            *used += 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(PartialEq)]
struct Pending {
    at: f64,
    id: usize,
    attempt: u32,
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.total_cmp(&self.at).then(o.id.cmp(&self.id))
    }
}

/// When each request (issued at `issued[i]` on prefix `prefix[i]`) is answered, with retries
/// of throttled attempts; also the number of `503`s.
fn serve(
    issued: &[f64],
    prefix: &[usize],
    prefixes: usize,
    limit: f64,
    latency: f64,
) -> (Vec<f64>, u64) {
    let retry = RetryPolicy::default();
    let init = retry.init_backoff.as_secs_f64();
    let mut stores: Vec<Prefix> = (0..prefixes)
        .map(|_| Prefix {
            limit_per_slice: limit,
            used: Default::default(),
        })
        .collect();
    let mut heap: BinaryHeap<Pending> = issued
        .iter()
        .enumerate()
        .map(|(id, &at)| Pending { at, id, attempt: 0 })
        .collect();
    let mut done = vec![f64::INFINITY; issued.len()];
    let mut throttled = 0;
    let mut seed = 0x1234_5678u64;
    while let Some(p) = heap.pop() {
        if stores[prefix[p.id]].admit(p.at) {
            done[p.id] = p.at + latency;
            continue;
        }
        throttled += 1;
        if p.attempt as usize >= retry.max_retries {
            continue;
        }
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let u = (seed >> 11) as f64 / (1u64 << 53) as f64;
        let hi =
            (init * retry.base.powi(p.attempt as i32 + 1)).min(retry.max_backoff.as_secs_f64());
        let wait = init + u * (hi - init).max(0.0);
        heap.push(Pending {
            at: p.at + latency + wait,
            id: p.id,
            attempt: p.attempt + 1,
        });
    }
    (done, throttled)
}

/// Models the cold start of `config`'s cluster.
pub fn model_startup(
    config: &SimConfig,
    order: &EpochOrder,
    shards: &Shards,
) -> Result<StartupReport> {
    let c = &config.cluster;
    let s = &config.store;
    let world = World::new(c.nodes, c.ranks_per_node, c.workers, c.batch_size)?;
    // Every process of a cold node fetches the index itself: they start together, before the
    // node's copy exists (measured: one GET per process in `cli/tests/simulate.rs`).
    let per_node = c.ranks_per_node as usize;
    let link = s
        .connection_bandwidth
        .min(c.node_bandwidth / per_node.max(1) as f64);
    let index_transfer = shards.index_bytes as f64 / link;
    let index_parse = shards.index_bytes as f64 / s.index_parse_rate;
    let spread = config.model.start_spread;
    let nodes = c.nodes as usize;
    let start: Vec<f64> = (0..nodes)
        .map(|n| spread * n as f64 / nodes as f64)
        .collect();
    // The index: two requests per process, one after the other, on the dataset's own prefix
    // (0): the GET of `index.ssx` (a 404 without one), then the GET of `index.json` (or its
    // HEAD, when `index.ssx` was there); a node's workers start when its last process has it.
    let probe_issued: Vec<f64> = start
        .iter()
        .flat_map(|&t| std::iter::repeat_n(t, per_node))
        .collect();
    let prefixes = shards.prefixes as usize;
    let (probe_done, _) = serve(
        &probe_issued,
        &vec![0; probe_issued.len()],
        prefixes,
        s.get_limit,
        s.latency,
    );
    // Both rounds served together, each second request issued when its first was answered
    // alone: they share the prefix's second-by-second budget.
    let index_issued = [probe_issued.as_slice(), probe_done.as_slice()].concat();
    let (both_done, index_throttled) = serve(
        &index_issued,
        &vec![0; index_issued.len()],
        prefixes,
        s.get_limit,
        s.latency,
    );
    let index_done = both_done
        .get(probe_issued.len()..)
        .unwrap_or_default()
        .to_vec();
    let ready: Vec<f64> = index_done
        .chunks(per_node.max(1))
        .map(|c| c.iter().copied().fold(0.0, f64::max) + index_transfer + index_parse)
        .collect();
    // Each worker's first batch: its shards and how far into each it reads.
    let mut worker_needs: Vec<Vec<(u32, u64)>> = Vec::new();
    let mut node_shards: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); nodes];
    for n in 0..c.nodes {
        for p in 0..c.ranks_per_node {
            for w in 0..c.workers {
                let rank = Rank {
                    node: n,
                    local_process: p,
                    worker: w,
                };
                // The batch's samples and, per shard, how far into it the last one lies.
                let mut ends: BTreeMap<u32, u64> = BTreeMap::new();
                for item in order.rank_iter(world, rank, 0)?.take(c.batch_size as usize) {
                    let end = ends.entry(item.sample.shard).or_insert(0);
                    *end = (*end).max(item.sample.index + 1);
                }
                let v: Vec<(u32, u64)> = ends
                    .into_iter()
                    .map(|(shard, end)| (shard, shards.prefix_bytes(shard, end)))
                    .collect();
                for (shard, _) in &v {
                    node_shards[n as usize].insert(*shard);
                }
                worker_needs.push(v);
            }
        }
    }
    // The first GET of every distinct shard of every node, when its index is ready.
    let mut issued = Vec::new();
    let mut prefix = Vec::new();
    let mut key: Vec<std::collections::HashMap<u32, usize>> = vec![Default::default(); nodes];
    for (n, set) in node_shards.iter().enumerate() {
        for &shard in set {
            key[n].insert(shard, issued.len());
            issued.push(ready[n]);
            prefix.push(shards.prefix_of(shard));
        }
    }
    let (answered, shard_throttled) = serve(
        &issued,
        &prefix,
        shards.prefixes as usize,
        s.get_limit,
        s.latency,
    );
    let mut process_times = Vec::new();
    let mut worker_times = Vec::with_capacity(worker_needs.len());
    let workers_per_node = (c.ranks_per_node as usize) * (c.workers as usize);
    for (i, needs) in worker_needs.iter().enumerate() {
        let n = i / workers_per_node.max(1);
        let share = node_shards[n].len().max(1) as f64;
        let rate = s.connection_bandwidth.min(c.node_bandwidth / share);
        let t = needs
            .iter()
            .map(|(shard, bytes)| answered[key[n][shard]] + *bytes as f64 / rate)
            .fold(ready[n], f64::max);
        if i % (c.workers as usize).max(1) == 0 {
            process_times.push(t);
        }
        worker_times.push(t);
    }
    Ok(StartupReport {
        index_bytes: shards.index_bytes,
        index_seconds: 2.0 * s.latency + index_transfer + index_parse,
        index_requests: index_issued.len() as u64,
        first_gets: issued.len() as u64,
        first_shards_per_node_max: node_shards
            .iter()
            .map(|s| s.len() as u64)
            .max()
            .unwrap_or(0),
        throttled: index_throttled + shard_throttled,
        process_first_batch: Quantiles::of(process_times),
        worker_first_batch: Quantiles::of(worker_times),
    })
}
