//! Scale model of shardstream: what a cluster shape, a dataset shape and a store profile cost
//! in requests, bytes, cache and time, computed by running the real sample order and fetch
//! planning (`shardstream_streamer::order`, `EpochOrder::shards_needed`, the fetch's request
//! split `fetch_parts`) and the real checkpoint arithmetic (`RatePlan`, `Manifest`), not a
//! re-implementation of them.
//!
//! - [`plan`]: one node's downloads step by step, through an LRU cache under its limit.
//! - [`epoch`]: the epoch over the cluster: amplification, cache need, GET/s per prefix.
//! - [`startup`]: time to the first batch of every rank on a cold start.
//! - [`shaping`]: the rate a prefix sees with the client-side shaping on or off.
//! - [`resize`]: what a mid-epoch change of the node count moves and fetches again.
//! - [`checkpoint`]: a save's PUT profile, manifest size and commit.
//!
//! `docs/scale.md` describes the model, its approximations and its validation against real
//! runs; `shardstream simulate` is its command line.
//!
//! ```
//! use shardstream_sim::{simulate, SimConfig};
//!
//! let mut config = SimConfig::default();
//! config.cluster.nodes = 4;
//! config.cluster.ranks_per_node = 2;
//! config.cluster.workers = 2;
//! config.dataset.shards = 64;
//! let report = simulate(&config)?;
//! assert!(report.epoch.amplification >= 1.0);
//! # Ok::<(), shardstream_sim::SimError>(())
//! ```

#![deny(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod epoch;
mod error;
pub mod plan;
pub mod report;
pub mod resize;
pub mod shaping;
pub mod shards;
pub mod startup;

use std::time::Instant;

use shardstream_storage::shaping::ShapingConfig;
use shardstream_streamer::order::{DatasetShape, EpochOrder, OrderConfig};

pub use config::SimConfig;
pub use error::{Result, SimError};
pub use report::Report;

/// The order settings the model runs: `config.order` with its lanes resolved.
pub fn order_config(config: &SimConfig) -> OrderConfig {
    OrderConfig {
        seed: config.order.seed,
        shuffle: config.order.shuffle,
        window: config.order.window,
        lanes: config.lanes(),
        ramp: config.order.ramp,
        sample_ramp: config.order.ramp,
        ..OrderConfig::default()
    }
}

/// Runs the whole model.
pub fn simulate(config: &SimConfig) -> Result<Report> {
    let started = Instant::now();
    config.validate()?;
    let shards = shards::Shards::from_config(&config.dataset)?;
    let shape = DatasetShape::single(shards.samples.clone())?;
    let order = EpochOrder::new(&shape, &order_config(config), config.order.epoch)?;
    let epoch = epoch::model_epoch(config, &order, &shards)?;
    let startup = startup::model_startup(config, &order, &shards)?;
    // The processes that fetch (DataLoader workers, or the ranks without any); the node's
    // rates are shared by its ranks and their workers, and the increase by the job's, as
    // `storage::shaping` counts them.
    let ranks = u64::from(config.cluster.ranks_per_node);
    let workers = u64::from(config.cluster.workers);
    let nodes = u64::from(config.cluster.nodes);
    let per_node = ranks * workers.max(1);
    let demand = epoch.get_per_s_per_prefix_mean;
    // One process's limiter: shared by the node's processes and the job's nodes, and capped by
    // a declared prefix limit, by the storage layer's own rule; without the share, a process
    // that knows neither (`shared_by(1, 1)`: full rates, the whole declared limit).
    let limiter = config.shaping.limiter();
    let on = if config.shaping.node_share {
        limiter.shared_by(config.shaping_processes()?, config.cluster.nodes)
    } else {
        limiter.shared_by(1, 1)
    };
    let on = ShapingConfig {
        enabled: true,
        ..on
    };
    let off = ShapingConfig {
        enabled: false,
        ..on.clone()
    };
    let limit = config.store.get_limit;
    let rates = vec![
        shaping::model_prefix(demand, nodes, per_node, limit, &off, config.model.seconds),
        shaping::model_prefix(demand, nodes, per_node, limit, &on, config.model.seconds),
    ];
    let resize = match &config.resize {
        Some(r) => Some(resize::model_resize(config, &order, &shards, r)?),
        None => None,
    };
    let checkpoint = checkpoint::model_checkpoint(config)?;
    Ok(Report {
        config: config.clone(),
        shards: shards.len() as u64,
        samples: shape.num_samples(),
        order_heap_bytes: order.heap_bytes() as u64,
        epoch,
        startup,
        rates,
        resize,
        checkpoint,
        model_seconds: started.elapsed().as_secs_f64(),
    })
}
