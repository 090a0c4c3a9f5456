//! The sample order: which sample every rank reads, in which order, in every epoch.
//!
//! - [`DatasetShape`]: per-shard sample counts of one or more streams and their weights.
//! - [`OrderConfig`]: the run's seed, shuffle, window (shards per shuffle block), lanes,
//!   remainder rule and ramp (smaller blocks at the start of each lane).
//! - [`EpochOrder`]: the global order of one epoch; [`EpochOrder::sample_at`] answers any position
//!   in O(log shards) time and O(shards) memory, with no per-sample array.
//! - [`World`], [`Rank`], [`Partition`], [`RankIter`]: the split of the order over nodes,
//!   processes and DataLoader workers.
//! - [`EpochOrder::shards_needed`]: the shards a rank reads next, for prefetch.
//! - [`StreamState`]: what a checkpoint stores to resume sample-exactly, with any world.
//!
//! The contract (docs/sample-order.md): the global order of `(dataset, config, epoch)` does not depend on
//! the world; ranks read disjoint parts that together hold every sample exactly once (plus fewer
//! than `processes` padding repeats); the order in which a job consumes samples is the global
//! order, so `consumed` alone resumes it. `docs/sample-order.md` explains the choices and their
//! costs (cache need, downloads per shard).

mod config;
mod epoch;
mod partition;
mod plan;
mod prp;
mod shape;
mod state;
mod units;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod reference;

pub use config::{OrderConfig, Remainder};
pub use epoch::{EpochOrder, SampleId};
pub use partition::{Locality, Partition, Rank, RankIter, RankSample, World};
pub use plan::ShardNeed;
pub use shape::{DatasetShape, Sampling, StreamEntry, StreamShape, Weight};
pub use state::StreamState;
