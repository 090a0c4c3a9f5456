//! Streaming core of shardstream.
//!
//! - [`dataset`]: [`StreamingDataset`] opens an MDS dataset (or a mix of several) anywhere the
//!   storage layer reaches, serves shards and samples through the node cache, and streams one
//!   rank's part of an epoch with prefetch, inside one memory budget (`docs/streaming.md`).
//! - [`cache`]: the per-node disk cache shared by every process of a node through `flock`s
//!   (`docs/cache.md`).
//! - [`order`]: a deterministic, shard-aware sample order that is the same for every number of
//!   nodes, processes and DataLoader workers, needs memory in O(shards), gives every rank the same
//!   number of samples, and resumes sample-exactly, also after the world changes
//!   (`docs/sample-order.md`).
//!
//! ```
//! use shardstream_streamer::order::{
//!     DatasetShape, EpochOrder, OrderConfig, Rank, StreamState, World,
//! };
//!
//! // Three shards; shuffle in blocks of 2 shards, 2 lanes (one per node below).
//! let shape = DatasetShape::single(vec![1000, 1000, 500])?;
//! let config = OrderConfig {
//!     seed: 7, shuffle: true, window: 2, lanes: 2, ..OrderConfig::default()
//! };
//! let order = EpochOrder::new(&shape, &config, 0)?;
//! assert_eq!(order.global_len(), 2500);
//!
//! // 2 nodes x 4 GPUs, 2 DataLoader workers each, batches of 8.
//! let world = World::new(2, 4, 2, 8)?;
//! let rank = Rank { node: 1, local_process: 3, worker: 0 };
//! let first: Vec<_> = order.rank_iter(world, rank, 0)?.take(3).collect();
//! assert_eq!(first[0].sample, order.sample_at(first[0].position).unwrap());
//!
//! // Every GPU took 5 batches of 8: save, then resume on 3 nodes x 2 GPUs without workers.
//! let state = StreamState::new(&order, order.partition(world, 0).consumed_after(5 * 8));
//! assert_eq!(state.consumed, 5 * 8 * 8);
//! let resumed = state.resume(&shape)?;
//! let new_world = World::new(3, 2, 1, 8)?;
//! // Position 320 goes to the process of residue 320 % 6 = 2: node 2, local process 0.
//! let rank = Rank { node: 2, local_process: 0, worker: 0 };
//! let mut next = resumed.rank_iter(new_world, rank, state.consumed)?;
//! assert_eq!(next.next().unwrap().position, 320);
//! # Ok::<(), shardstream_streamer::StreamerError>(())
//! ```

pub mod buffers;
pub mod cache;
pub mod dataset;
pub mod error;
pub mod fork;
pub mod memory;
pub mod order;
pub mod runtime;
pub mod settings;

pub use dataset::{
    DeferredSample, LitFields, MetricsSnapshot, Prefetch, PrefetchReport, RawSample, SampleSchema,
    SampleStream, ShardFormat, ShardHandle, StreamItem, StreamPlan, StreamSpec, StreamedSample,
    StreamingConfig, StreamingDataset, WdsFields,
};
pub use error::{Result, StreamerError};
pub use memory::MemoryPlan;
