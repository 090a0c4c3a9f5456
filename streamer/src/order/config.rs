//! The run-level settings that fix the global order. None of them is a property of the world
//! (nodes, processes, workers); they are chosen once per run and recorded in every saved state.

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
}

impl OrderConfig {
    /// Mosaic's default shuffle seed, so that a switch keeps the same seed setting.
    pub const DEFAULT_SEED: u64 = 9176;
    /// Default shards per shuffle block.
    pub const DEFAULT_WINDOW: u32 = 16;

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

impl Default for OrderConfig {
    fn default() -> Self {
        Self {
            seed: Self::DEFAULT_SEED,
            shuffle: false,
            window: Self::DEFAULT_WINDOW,
            lanes: 1,
            remainder: Remainder::Pad,
        }
    }
}
