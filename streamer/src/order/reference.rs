//! A naive model of the order, for the model tests: it materialises every array the real code
//! avoids (the unit contents, the shuffled sequence, each lane, each block, each rank's list) and
//! builds them the obvious way. It shares only the keyed primitives (`prp`) with the real code.

use super::config::{OrderConfig, Remainder};
use super::epoch::SampleId;
use super::partition::World;
use super::prp::{derive_key, tag, Feistel, SplitMix64};
use super::shape::{DatasetShape, Sampling};

/// The global order of an epoch, one entry per position.
pub(crate) fn naive_order(shape: &DatasetShape, config: &OrderConfig, epoch: u64) -> Vec<SampleId> {
    // Units as explicit lists of samples.
    let mut units: Vec<Vec<SampleId>> = Vec::new();
    for (s, entry) in shape.streams().iter().enumerate() {
        let n = entry.shape.num_samples();
        if n == 0 || entry.choose == 0 {
            continue;
        }
        let id = |h: usize, i: u64| {
            let shard = entry.first_shard + h as u32;
            SampleId {
                stream: s as u32,
                shard,
                index: i,
                sample: shape.shard_start(shard).unwrap() + i,
            }
        };
        let sizes = entry.shape.samples_per_shard();
        for _ in 0..entry.choose / n {
            for (h, &len) in sizes.iter().enumerate() {
                if len > 0 {
                    units.push((0..len).map(|i| id(h, i)).collect());
                }
            }
        }
        let leftover = entry.choose % n;
        if leftover == 0 {
            continue;
        }
        let epoch_part = if shape.sampling() == Sampling::Balanced {
            epoch
        } else {
            u64::MAX
        };
        // Floor shares, then one more for randomly picked distinct non-empty shards.
        let mut take: Vec<u64> = sizes.iter().map(|&len| leftover * len / n).collect();
        let short = leftover - take.iter().sum::<u64>();
        let mut candidates: Vec<usize> = (0..sizes.len()).filter(|&h| sizes[h] > 0).collect();
        let mut rng = SplitMix64::new(derive_key(
            tag::LEFTOVER,
            &[config.seed, epoch_part, s as u64],
        ));
        for i in 0..short as usize {
            let j = i + rng.below((candidates.len() - i) as u64) as usize;
            candidates.swap(i, j);
            take[candidates[i]] += 1;
        }
        for (h, &r) in take.iter().enumerate() {
            if r == 0 {
                continue;
            }
            let shard = entry.first_shard + h as u32;
            let key = derive_key(tag::SUBSET, &[config.seed, epoch_part, u64::from(shard)]);
            let perm = Feistel::new(sizes[h], key);
            let all: Vec<u64> = (0..sizes[h]).map(|i| perm.permute(i)).collect();
            units.push(all[..r as usize].iter().map(|&i| id(h, i)).collect());
        }
    }
    if config.shuffle {
        SplitMix64::new(derive_key(tag::UNIT_ORDER, &[config.seed, epoch])).shuffle(&mut units);
    }
    // The sequence, remembering each sample's unit.
    let seq: Vec<(usize, SampleId)> = units
        .iter()
        .enumerate()
        .flat_map(|(u, samples)| samples.iter().map(move |&s| (u, s)))
        .collect();
    // Lanes: contiguous runs, the first `N % lanes` one longer.
    let lanes = config.lanes as usize;
    let mut lane_lists: Vec<Vec<SampleId>> = Vec::new();
    let mut at = 0;
    for c in 0..lanes {
        let len = seq.len() / lanes + usize::from(c < seq.len() % lanes);
        let lane = &seq[at..at + len];
        at += len;
        let mut out = Vec::with_capacity(len);
        // Blocks: runs of samples whose unit lies in the same block of the lane: the ramp of 1, 2,
        // 4, ... units (each smaller than `window`, all together at most half of the lane's
        // average unit count), then groups of `window`, written out here by counting.
        let group = |u: usize| {
            let window = config.window as usize;
            let half = units.len() / lanes / 2;
            let (mut offset, mut j, mut ramp_size, mut ramped) = (u - lane[0].0, 0, 1usize, 0usize);
            loop {
                let in_ramp = config.ramp && ramp_size < window && ramped + ramp_size <= half;
                let size = if in_ramp { ramp_size } else { window };
                if offset < size {
                    return j;
                }
                offset -= size;
                j += 1;
                if in_ramp {
                    ramped += ramp_size;
                    ramp_size = ramp_size.saturating_mul(2);
                } else {
                    ramp_size = usize::MAX;
                }
            }
        };
        let mut i = 0;
        while i < lane.len() {
            let g = group(lane[i].0);
            let mut e = i;
            while e < lane.len() && group(lane[e].0) == g {
                e += 1;
            }
            let block = &lane[i..e];
            if config.shuffle && g == 0 && config.sample_ramp {
                // The first block's parts, written out: its ends at len, len/2, len/4, ... while
                // they leave at least SAMPLE_RAMP_MIN samples before them.
                let len = block.len();
                let min = OrderConfig::SAMPLE_RAMP_MIN as usize;
                let mut cuts = vec![len];
                let mut k = 1;
                while k < 64 && (len >> k) >= min {
                    cuts.push(len >> k);
                    k += 1;
                }
                cuts.push(0);
                cuts.reverse();
                cuts.dedup();
                for part in cuts.windows(2) {
                    let (lo, hi) = (part[0], part[1]);
                    let key = derive_key(tag::BLOCK, &[config.seed, epoch, c as u64, 0, lo as u64]);
                    let perm = Feistel::new((hi - lo) as u64, key);
                    out.extend((0..hi - lo).map(|o| block[lo + perm.permute(o as u64) as usize].1));
                }
            } else if config.shuffle {
                let key = derive_key(tag::BLOCK, &[config.seed, epoch, c as u64, g as u64]);
                let perm = Feistel::new(block.len() as u64, key);
                out.extend((0..block.len()).map(|o| block[perm.permute(o as u64) as usize].1));
            } else {
                out.extend(block.iter().map(|&(_, s)| s));
            }
            i = e;
        }
        lane_lists.push(out);
    }
    (0..seq.len())
        .map(|p| lane_lists[p % lanes][p / lanes])
        .collect()
}

/// The `(position, padding)` list of every rank, indexed by flat rank, for positions `start..`.
pub(crate) fn naive_partition(
    global_len: u64,
    world: &World,
    start: u64,
    remainder: Remainder,
) -> Vec<Vec<(u64, bool)>> {
    let g = world.processes();
    let start = start.min(global_len);
    let mut positions: Vec<u64> = (start..global_len).collect();
    match remainder {
        Remainder::Pad => {
            while !(positions.len() as u64).is_multiple_of(g) {
                positions.push(global_len + (positions.len() as u64 - (global_len - start)));
            }
        }
        Remainder::Drop => positions.truncate((positions.len() as u64 / g * g) as usize),
    }
    let mut out = Vec::new();
    for node in 0..world.nodes() {
        for local in 0..world.processes_per_node() {
            let residue = u64::from(local) * u64::from(world.nodes()) + u64::from(node);
            let mine: Vec<u64> = positions
                .iter()
                .copied()
                .filter(|p| p % g == residue)
                .collect();
            let batches: Vec<&[u64]> = mine.chunks(world.batch_size() as usize).collect();
            for w in 0..world.workers() as usize {
                let list = batches
                    .iter()
                    .skip(w)
                    .step_by(world.workers() as usize)
                    .flat_map(|b| b.iter().map(|&p| (p, p >= global_len)))
                    .collect();
                out.push(list);
            }
        }
    }
    out
}

/// What a padding position repeats.
pub(crate) fn naive_padding_source(p: u64, global_len: u64, processes: u64) -> u64 {
    if p >= processes {
        p - processes
    } else {
        p % global_len
    }
}
