//! The units of one epoch: what the shuffle moves around. A unit is one shard read in full, or,
//! for a stream whose epoch share is not a whole number of passes, a subset of one shard.
//!
//! A stream that contributes `k = f * n + r` samples (n = its samples) gives `f` full copies of
//! each shard and, when `r > 0`, one subset unit per shard. The `r` leftover samples are spread
//! over the shards in proportion to their size (`floor(r * n_h / n)` each, the last few samples to
//! shards picked at random), and the subset of shard `h` is the first `r_h` values of a keyed
//! permutation of `0..n_h`; nothing per sample is stored. Memory is O(shards x (f + 1)).

use super::prp::{derive_key, tag, Feistel, SplitMix64};
use super::shape::{DatasetShape, Sampling};

/// One unit; its length is implied by the prefix sums kept beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    /// Global shard id.
    pub shard: u32,
    /// Whether the unit is a subset of the shard (its samples go through [`subset_index`]).
    pub subset: bool,
}

/// The units of an epoch in their unshuffled order, with their lengths. Empty units are left out.
pub(crate) fn epoch_units(shape: &DatasetShape, seed: u64, epoch: u64) -> (Vec<Unit>, Vec<u64>) {
    let mut units = Vec::new();
    let mut lens = Vec::new();
    for (stream_idx, entry) in shape.streams().iter().enumerate() {
        let n = entry.shape.num_samples();
        if n == 0 || entry.choose == 0 {
            continue;
        }
        let sizes = entry.shape.samples_per_shard();
        let copies = entry.choose / n;
        let leftover = entry.choose % n;
        for _ in 0..copies {
            for (h, &len) in sizes.iter().enumerate() {
                if len > 0 {
                    units.push(Unit {
                        shard: entry.first_shard + h as u32,
                        subset: false,
                    });
                    lens.push(len);
                }
            }
        }
        if leftover > 0 {
            let per_shard = split_leftover(
                sizes,
                n,
                leftover,
                subset_seed(shape, seed, epoch, stream_idx),
            );
            for (h, &take) in per_shard.iter().enumerate() {
                if take > 0 {
                    units.push(Unit {
                        shard: entry.first_shard + h as u32,
                        subset: true,
                    });
                    lens.push(take);
                }
            }
        }
    }
    (units, lens)
}

/// The seed of a stream's leftover split: fixed for [`Sampling::Fixed`], new each epoch otherwise.
fn subset_seed(shape: &DatasetShape, seed: u64, epoch: u64, stream: usize) -> u64 {
    let epoch_part = match shape.sampling() {
        Sampling::Balanced => epoch,
        Sampling::Fixed => u64::MAX,
    };
    derive_key(tag::LEFTOVER, &[seed, epoch_part, stream as u64])
}

/// How many of `leftover` (< `total`) samples each shard gives: `floor(leftover * n_h / total)`,
/// plus one for `leftover - sum` distinct non-empty shards chosen at random. Each shard still gives
/// fewer samples than it has, because `floor(leftover * n_h / total) < n_h` when
/// `leftover < total`.
fn split_leftover(sizes: &[u64], total: u64, leftover: u64, key: u64) -> Vec<u64> {
    let mut take: Vec<u64> = sizes
        .iter()
        .map(|&n_h| (u128::from(leftover) * u128::from(n_h) / u128::from(total)) as u64)
        .collect();
    let given: u64 = take.iter().sum();
    let short = (leftover - given) as usize;
    if short > 0 {
        let mut candidates: Vec<usize> = (0..sizes.len()).filter(|&h| sizes[h] > 0).collect();
        // A partial Fisher–Yates: the first `short` slots are a uniform pick without repeats.
        let mut rng = SplitMix64::new(key);
        for i in 0..short.min(candidates.len()) {
            let j = i + rng.below((candidates.len() - i) as u64) as usize;
            candidates.swap(i, j);
            take[candidates[i]] += 1;
        }
    }
    take
}

/// Sample index inside shard `shard` (of `shard_len` samples) for position `offset` of its subset
/// unit: the subset is the image of `0..r_h` under a keyed permutation of the shard.
pub(crate) fn subset_index(
    shape: &DatasetShape,
    seed: u64,
    epoch: u64,
    shard: u32,
    shard_len: u64,
    offset: u64,
) -> u64 {
    let epoch_part = match shape.sampling() {
        Sampling::Balanced => epoch,
        Sampling::Fixed => u64::MAX,
    };
    let key = derive_key(tag::SUBSET, &[seed, epoch_part, u64::from(shard)]);
    Feistel::new(shard_len, key).permute(offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::shape::{StreamShape, Weight};

    #[test]
    fn leftover_split_is_exact_and_within_each_shard() {
        let sizes = [10u64, 3, 0, 7, 1];
        for leftover in 0..21 {
            for key in 0..5 {
                let take = split_leftover(&sizes, 21, leftover, key);
                assert_eq!(take.iter().sum::<u64>(), leftover);
                for (t, n) in take.iter().zip(&sizes) {
                    assert!(t <= n, "{take:?}");
                }
                assert_eq!(take[2], 0);
            }
        }
    }

    #[test]
    fn repeat_makes_copies_then_a_subset() {
        let shape = DatasetShape::mixed(
            vec![(
                StreamShape::new(vec![4, 0, 2]).unwrap(),
                Weight::Repeat(2.5),
            )],
            None,
            Sampling::Balanced,
        )
        .unwrap();
        let (units, lens) = epoch_units(&shape, 1, 0);
        // Two copies of shards 0 and 2, then 3 leftover samples from subsets.
        assert_eq!(&lens[..4], &[4, 2, 4, 2]);
        assert!(units[..4].iter().all(|u| !u.subset));
        assert_eq!(lens[4..].iter().sum::<u64>(), 3);
        assert!(units[4..].iter().all(|u| u.subset && u.shard != 1));
    }
}
