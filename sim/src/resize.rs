//! A resize in the middle of an epoch: the job stops after a fraction of the epoch, saves
//! `consumed`, and resumes on another node count (`StreamState::resume` semantics: the same
//! global order, continued at `consumed` by the new world). A node that survives keeps its
//! cache folder (`<run-id>/<node-rank>/`), so what it holds at the stop is what it starts
//! with.
//!
//! For each played node the model compares, over the rest of the epoch, what the node would
//! have downloaded without the resize with what it downloads after it.

use std::collections::HashSet;

use serde::Serialize;
use shardstream_streamer::order::EpochOrder;

use crate::config::{Resize, SimConfig};
use crate::epoch::sampled_nodes;
use crate::error::Result;
use crate::plan::{run_node, NodeCache, Steps};
use crate::shards::Shards;

/// What moves.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResizeReport {
    /// Nodes before and after.
    pub from_nodes: u32,
    /// Nodes after.
    pub to_nodes: u32,
    /// Lanes (unchanged by a resize).
    pub lanes: u32,
    /// Global positions consumed at the stop.
    pub consumed: u64,
    /// Nodes that read each lane before and after (`nodes / gcd(nodes, lanes)`).
    pub nodes_per_lane_before: u64,
    /// After.
    pub nodes_per_lane_after: u64,
    /// Bytes the rest of the epoch downloads without the resize (all nodes).
    pub rest_bytes_without: f64,
    /// Bytes the rest of the epoch downloads after the resize (all nodes).
    pub rest_bytes_with: f64,
    /// `rest_bytes_with - rest_bytes_without`: what the resize makes the cluster fetch again.
    pub extra_bytes: f64,
    /// Shards a surviving node reads after the resize that it would not have read without it
    /// (they were, or would have been, another node's), all nodes.
    pub shards_moved: f64,
    /// Shards found in a surviving node's cache after the resize, all nodes.
    pub shards_kept: f64,
    /// Amplification of the rest of the epoch after the resize (bytes / the rest's share of
    /// the dataset).
    pub rest_amplification: f64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Models `resize` of `config`'s cluster in `order`'s epoch.
pub fn model_resize(
    config: &SimConfig,
    order: &EpochOrder,
    shards: &Shards,
    resize: &Resize,
) -> Result<ResizeReport> {
    let c = &config.cluster;
    let spb = config.model.steps_per_block;
    let old = Steps::new(order, c.nodes, c.ranks_per_node, c.batch_size, 0, spb)?;
    let processes = u64::from(c.nodes) * u64::from(c.ranks_per_node);
    let per_step = processes.saturating_mul(u64::from(c.batch_size)).max(1);
    let consumed = ((order.global_len() as f64 * resize.at) as u64 / per_step) * per_step;
    let stop_step = (consumed / processes.max(1)) / old.step.max(1);
    let consumed = stop_step * old.step * processes;
    let new = Steps::new(
        order,
        resize.to_nodes,
        c.ranks_per_node,
        c.batch_size,
        consumed,
        spb,
    )?;
    let lanes = u64::from(order.config().lanes);
    let survivors = c.nodes.min(resize.to_nodes);
    let played_old = sampled_nodes(c.nodes, config.model.sample_nodes);
    let played_new = sampled_nodes(resize.to_nodes, config.model.sample_nodes);
    let mut without = 0f64;
    for &n in &played_old {
        let mut cache = NodeCache::new(c.cache_limit);
        let mut head = Steps::new(order, c.nodes, c.ranks_per_node, c.batch_size, 0, spb)?;
        head.count = stop_step.min(head.count);
        run_node(&head, shards, n, 0, &mut cache)?;
        without += run_node(&old, shards, n, stop_step, &mut cache)?.bytes as f64;
    }
    without *= f64::from(c.nodes) / played_old.len().max(1) as f64;
    let (mut with, mut moved, mut kept) = (0f64, 0f64, 0f64);
    for &n in &played_new {
        let mut cache = NodeCache::new(c.cache_limit);
        let mut old_rest = HashSet::new();
        if n < survivors {
            let mut head = Steps::new(order, c.nodes, c.ranks_per_node, c.batch_size, 0, spb)?;
            head.count = stop_step.min(head.count);
            run_node(&head, shards, n, 0, &mut cache)?;
            let mut probe = cache.clone();
            old_rest = run_node(&old, shards, n, stop_step, &mut probe)?.downloaded;
            old_rest.extend(cache.shards());
        }
        let run = run_node(&new, shards, n, 0, &mut cache)?;
        with += run.bytes as f64;
        kept += run.kept_hits as f64;
        moved += run.downloaded.difference(&old_rest).count() as f64;
    }
    let scale = f64::from(resize.to_nodes) / played_new.len().max(1) as f64;
    with *= scale;
    moved *= scale;
    kept *= scale;
    let rest_share =
        shards.total_bytes as f64 * (1.0 - consumed as f64 / order.global_len().max(1) as f64);
    Ok(ResizeReport {
        from_nodes: c.nodes,
        to_nodes: resize.to_nodes,
        lanes: order.config().lanes,
        consumed,
        nodes_per_lane_before: u64::from(c.nodes) / gcd(u64::from(c.nodes), lanes),
        nodes_per_lane_after: u64::from(resize.to_nodes) / gcd(u64::from(resize.to_nodes), lanes),
        rest_bytes_without: without,
        rest_bytes_with: with,
        extra_bytes: with - without,
        shards_moved: moved,
        shards_kept: kept,
        rest_amplification: with / rest_share.max(1.0),
    })
}
