//! The run-level settings that fix the global order. None of them is a property of the world
//! (nodes, processes, workers); they are chosen once per run and recorded in every saved state.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StreamerError};

/// What happens to the last `(remaining samples) mod (processes)` positions of an epoch, so that
/// every process gets the same number of samples and DDP never waits on a rank that ran dry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remainder {
    /// Pad with fewer than `processes` repeated samples (each process at most one), marked as
    /// padding; every sample is still seen. Mosaic pads too.
    #[default]
    Pad,
    /// Drop the last fewer-than-`processes` positions of the epoch.
    Drop,
}

/// Settings of the global order. See `docs/sample-order.md` for how to choose them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderConfig {
    /// Base seed of the run; each epoch derives its own keys from `(seed, epoch)`.
    pub seed: u64,
    /// Shuffle (shard order and samples within blocks) or keep the dataset's order.
    pub shuffle: bool,
    /// Shards per shuffle block: samples are mixed across this many consecutive shards of a lane.
    /// A lane needs about `window` shards cached (twice that while prefetching the next block).
    pub window: u32,
    /// Lanes: the epoch is cut into this many contiguous runs that are read in parallel, one
    /// sample of each in turn. Each lane is read by one node when `lanes` is a multiple of the
    /// number of nodes; choose it like Mosaic's `num_canonical_nodes`.
    pub lanes: u32,
    /// How the end of an epoch is evened out across processes.
    pub remainder: Remainder,
    /// Ramp the blocks up at the start of each lane: its first blocks hold 1, 2, 4, ... units,
    /// while that is less than `window` and within half of the lane. An epoch's first samples
    /// then come from one shard instead of a whole window of them, which a cold start (and each
    /// DataLoader worker's first batch) would wait for. A state saved before this setting
    /// existed has none and loads with `false`, so it resumes in the order it was saved in.
    #[serde(default)]
    pub ramp: bool,
    /// Ramp the samples of each lane's first block as well: it is shuffled in parts of its
    /// first `len / 2^k` samples, then the rest of `len / 2^(k-1)`, ... up to its second half,
    /// the smallest part holding at least [`OrderConfig::SAMPLE_RAMP_MIN`] samples (see
    /// `docs/sample-order.md`). A cold epoch's first batch then waits for the first few percent
    /// of its first shard instead of all of it (a 64 MiB shard of 10 KB samples: its first
    /// MiB). The price: an epoch's first ~100 samples come from ~100 neighbouring samples of
    /// one shard, as with WebDataset's initial shuffle buffer. A state saved before this
    /// setting existed has none and loads with `false`.
    #[serde(default)]
    pub sample_ramp: bool,
}

impl OrderConfig {
    /// Mosaic's default shuffle seed, so that a switch keeps the same seed setting.
    pub const DEFAULT_SEED: u64 = 9176;
    /// Default shards per shuffle block.
    pub const DEFAULT_WINDOW: u32 = 16;
    /// Fewest samples in the first part of a lane's first block under `sample_ramp`.
    pub const SAMPLE_RAMP_MIN: u64 = 64;

    /// Checks the ranges (`window >= 1`, `lanes >= 1`).
    pub fn validate(&self) -> Result<()> {
        if self.window == 0 {
            return Err(StreamerError::InvalidConfig {
                setting: "window",
                reason: "a shuffle block holds at least one shard".into(),
            });
        }
        if self.lanes == 0 {
            return Err(StreamerError::InvalidConfig {
                setting: "lanes",
                reason: "the epoch needs at least one lane".into(),
            });
        }
        Ok(())
    }
}

/// How one epoch cuts each lane into shuffle blocks: first the ramp's blocks of 1, 2, 4, ...
/// units, then blocks of `window` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockLayout {
    window: usize,
    ramp_blocks: usize,
}

impl BlockLayout {
    /// The layout of `config` for lanes of about `lane_units` units each. With `ramp`, the ramp
    /// holds the blocks of 1, 2, 4, ... units that are smaller than `window`, but it covers at
    /// most half of `lane_units`: on a small dataset (few shards per lane) most of an epoch is
    /// still mixed in full blocks.
    pub(crate) fn new(config: &OrderConfig, lane_units: usize) -> Self {
        let ramp_blocks = if config.ramp {
            let below_window =
                (u32::BITS - config.window.saturating_sub(1).leading_zeros()) as usize;
            // The ramp's first r blocks hold 2^r - 1 units: at most lane_units / 2.
            let within_half = (usize::BITS - 1 - (lane_units / 2 + 1).leading_zeros()) as usize;
            below_window.min(within_half)
        } else {
            0
        };
        Self {
            window: config.window.max(1) as usize,
            ramp_blocks,
        }
    }

    /// The units of a lane's block `j`, counted from the lane's first unit.
    pub(crate) fn block_units(&self, j: usize) -> Range<usize> {
        let ramp = self.ramp_blocks;
        if j < ramp {
            return (1 << j) - 1..(1 << (j + 1)) - 1;
        }
        let start = ((1usize << ramp) - 1).saturating_add((j - ramp).saturating_mul(self.window));
        start..start.saturating_add(self.window)
    }

    /// The block of a lane that holds its unit `offset` (counted from the lane's first unit).
    pub(crate) fn block_of_unit(&self, offset: usize) -> usize {
        let ramp = self.ramp_blocks;
        let ramp_units = (1usize << ramp) - 1;
        if offset < ramp_units {
            // Block j of the ramp holds the offsets 2^j - 1 ..= 2^(j+1) - 2.
            (usize::BITS - 1 - (offset + 1).leading_zeros()) as usize
        } else {
            ramp + (offset - ramp_units) / self.window
        }
    }
}

impl Default for OrderConfig {
    fn default() -> Self {
        Self {
            seed: Self::DEFAULT_SEED,
            shuffle: false,
            window: Self::DEFAULT_WINDOW,
            lanes: 1,
            remainder: Remainder::Pad,
            ramp: true,
            sample_ramp: true,
        }
    }
}

/// Under `sample_ramp`, the part of a lane's first block (of `len` samples) that holds its
/// sample `offset`, as offsets into the block. The block is cut at `len / 2^k`, ...,
/// `len / 4`, `len / 2`, where `k` is the most halvings that leave at least
/// [`OrderConfig::SAMPLE_RAMP_MIN`] samples in the first part; a block of fewer than twice
/// that is one part.
pub(crate) fn sample_ramp_part(len: u64, offset: u64) -> Range<u64> {
    let mut hi = len;
    let mut halvings = 0;
    while halvings < 63 && (len >> (halvings + 1)) >= OrderConfig::SAMPLE_RAMP_MIN {
        halvings += 1;
        let lo = len >> halvings;
        if offset >= lo {
            return lo..hi;
        }
        hi = lo;
    }
    0..hi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(window: u32, ramp: bool) -> OrderConfig {
        OrderConfig {
            window,
            ramp,
            ..OrderConfig::default()
        }
    }

    #[test]
    fn the_ramp_doubles_blocks_up_to_the_window() {
        let sizes = |c: &OrderConfig, lane_units: usize| {
            let layout = BlockLayout::new(c, lane_units);
            (0..7)
                .map(|j| layout.block_units(j).len())
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(&config(16, true), 1000), [1, 2, 4, 8, 16, 16, 16]);
        assert_eq!(sizes(&config(5, true), 1000), [1, 2, 4, 5, 5, 5, 5]);
        assert_eq!(sizes(&config(1, true), 1000), [1; 7]);
        assert_eq!(sizes(&config(16, false), 1000), [16; 7]);
        assert_eq!(
            BlockLayout::new(&config(16, true), 1000).block_units(4),
            15..31
        );
    }

    #[test]
    fn the_ramp_covers_at_most_half_a_lane() {
        let sizes = |lane_units: usize| {
            let layout = BlockLayout::new(&config(16, true), lane_units);
            (0..5)
                .map(|j| layout.block_units(j).len())
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(30), [1, 2, 4, 8, 16]); // 15 units of 30
        assert_eq!(sizes(29), [1, 2, 4, 16, 16]); // 7 of 29
        assert_eq!(sizes(12), [1, 2, 16, 16, 16]); // 3 of 12
        assert_eq!(sizes(2), [1, 16, 16, 16, 16]);
        assert_eq!(sizes(1), [16; 5]);
        assert_eq!(sizes(0), [16; 5]);
    }

    #[test]
    fn blocks_tile_the_lane_and_each_unit_finds_its_block() {
        for window in [1, 2, 3, 4, 5, 8, 16, 17, 100] {
            for ramp in [false, true] {
                for lane_units in [0, 1, 2, 5, 13, 64, 10_000] {
                    let layout = BlockLayout::new(&config(window, ramp), lane_units);
                    let mut next = 0;
                    for j in 0..40 {
                        let units = layout.block_units(j);
                        let case =
                            format!("window {window} ramp {ramp} lane {lane_units} block {j}");
                        assert_eq!(units.start, next, "{case}");
                        assert!(
                            !units.is_empty() && units.len() <= window as usize,
                            "{case}"
                        );
                        for u in units.clone() {
                            assert_eq!(layout.block_of_unit(u), j, "{case} unit {u}");
                        }
                        next = units.end;
                    }
                }
            }
        }
    }

    #[test]
    fn a_state_without_the_ramp_setting_loads_without_ramp() {
        let old = r#"{"seed":1,"shuffle":true,"window":16,"lanes":1,"remainder":"pad"}"#;
        let c: OrderConfig = serde_json::from_str(old).unwrap();
        assert!(!c.ramp);
        assert!(!c.sample_ramp);
        assert!(OrderConfig::default().ramp);
        assert!(OrderConfig::default().sample_ramp);
        let with_ramp =
            r#"{"seed":1,"shuffle":true,"window":16,"lanes":1,"remainder":"pad","ramp":true}"#;
        let c: OrderConfig = serde_json::from_str(with_ramp).unwrap();
        assert!(c.ramp && !c.sample_ramp);
    }

    #[test]
    fn the_sample_ramp_halves_the_first_block_down_to_its_minimum() {
        let parts = |len: u64| {
            let mut out = Vec::new();
            let mut o = 0;
            while o < len {
                let part = sample_ramp_part(len, o);
                assert!(part.contains(&o), "len {len} offset {o}: {part:?}");
                out.push(part.clone());
                o = part.end;
            }
            out
        };
        assert_eq!(parts(0), Vec::<Range<u64>>::new());
        assert_eq!(parts(100), vec![(0..100)]);
        assert_eq!(parts(127), vec![(0..127)]);
        assert_eq!(parts(128), [0..64, 64..128]);
        assert_eq!(parts(400), [0..100, 100..200, 200..400]);
        assert_eq!(
            parts(6_700),
            [
                0..104,
                104..209,
                209..418,
                418..837,
                837..1675,
                1675..3350,
                3350..6700
            ]
        );
        for len in [1u64, 63, 64, 129, 1000, 4097, 1 << 40] {
            let first = sample_ramp_part(len, 0);
            assert!(
                first.end >= OrderConfig::SAMPLE_RAMP_MIN.min(len),
                "len {len}"
            );
            assert!(first.end < 2 * OrderConfig::SAMPLE_RAMP_MIN || first.end == len);
            assert_eq!(sample_ramp_part(len, len - 1).end, len);
        }
    }
}
