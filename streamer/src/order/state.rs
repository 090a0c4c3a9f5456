//! The saved position of a run in its sample stream: a few numbers, independent of the world.
//!
//! `consumed` counts global positions of the epoch that the job has consumed; because the
//! partition makes consumption follow the global order (see `partition.rs`), those are exactly
//! positions `0..consumed`, and a resume with any world continues at `consumed`.

use serde::{Deserialize, Serialize};

use super::config::OrderConfig;
use super::epoch::EpochOrder;
use super::shape::DatasetShape;
use crate::error::{Result, StreamerError};

/// A serialisable stream position. Build it with [`StreamState::new`], store it in the training
/// checkpoint, and continue with [`StreamState::resume`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// Format version of this record: [`StreamState::VERSION`] for an order with the sample
    /// ramp, [`StreamState::VERSION_WITH_SHARD_RAMP`] for one with only the shard ramp,
    /// [`StreamState::VERSION_WITHOUT_RAMP`] for one with neither: each is the version the
    /// builds before that setting wrote and read, so that they still resume what they can and
    /// refuse what they would read in another order.
    pub version: u32,
    /// The settings that fixed the order; a resume uses these, not the new run's.
    pub config: OrderConfig,
    /// The epoch in progress.
    pub epoch: u64,
    /// Global positions of `epoch` already consumed (all ranks together).
    pub consumed: u64,
    /// [`DatasetShape::fingerprint`] of the dataset, as 16 hex digits (a string, so that JSON
    /// readers with 53-bit numbers keep it intact).
    pub shape_fingerprint: String,
}

impl StreamState {
    /// The version this build writes for an order with the sample ramp
    /// (`OrderConfig::sample_ramp`).
    pub const VERSION: u32 = 3;
    /// The version of a state with the shard ramp (`OrderConfig::ramp`) but not the sample ramp.
    pub const VERSION_WITH_SHARD_RAMP: u32 = 2;
    /// The version of a state without either ramp; this build reads all three.
    pub const VERSION_WITHOUT_RAMP: u32 = 1;

    /// The state after `consumed` positions of `order`'s epoch (capped at the epoch's length).
    pub fn new(order: &EpochOrder, consumed: u64) -> Self {
        let config = *order.config();
        Self {
            version: Self::version_for(&config),
            config,
            epoch: order.epoch(),
            consumed: consumed.min(order.global_len()),
            shape_fingerprint: hex(order.shape().fingerprint()),
        }
    }

    /// The version a state of `config` is written as.
    fn version_for(config: &OrderConfig) -> u32 {
        if config.sample_ramp {
            Self::VERSION
        } else if config.ramp {
            Self::VERSION_WITH_SHARD_RAMP
        } else {
            Self::VERSION_WITHOUT_RAMP
        }
    }

    /// Whether the saved epoch was finished; the run then goes on with `epoch + 1` from 0.
    pub fn epoch_done(&self, order: &EpochOrder) -> bool {
        self.consumed >= order.global_len()
    }

    /// Checks that this state belongs to `shape` (same shards, sizes, weights and sampling).
    pub fn check(&self, shape: &DatasetShape) -> Result<()> {
        if self.version != Self::VERSION && self.version != Self::version_for(&self.config) {
            return Err(StreamerError::UnsupportedStateVersion {
                found: self.version,
                supported: Self::VERSION,
            });
        }
        let current = hex(shape.fingerprint());
        if self.shape_fingerprint != current {
            return Err(StreamerError::ShapeMismatch {
                saved: self.shape_fingerprint.clone(),
                current,
            });
        }
        self.config.validate()
    }

    /// The order of the saved epoch; iterate it from `self.consumed` with any world.
    pub fn resume(&self, shape: &DatasetShape) -> Result<EpochOrder> {
        self.check(shape)?;
        EpochOrder::new(shape, &self.config, self.epoch)
    }
}

fn hex(v: u64) -> String {
    format!("{v:016x}")
}
