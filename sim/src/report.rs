//! The model's answer: one serializable [`Report`] and a plain-text table of it.

use std::fmt::Write;

use serde::Serialize;

use crate::checkpoint::CheckpointReport;
use crate::config::SimConfig;
use crate::epoch::EpochReport;
use crate::resize::ResizeReport;
use crate::shaping::RateReport;
use crate::startup::{Quantiles, StartupReport};

/// Everything the model computed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// The inputs.
    pub config: SimConfig,
    /// Shards of the dataset.
    pub shards: u64,
    /// Samples of the dataset.
    pub samples: u64,
    /// Heap bytes of the epoch's order in every process (`EpochOrder::heap_bytes`).
    pub order_heap_bytes: u64,
    /// The epoch.
    pub epoch: EpochReport,
    /// The cold start.
    pub startup: StartupReport,
    /// The busiest prefix's steady rate, shaping off then on.
    pub rates: Vec<RateReport>,
    /// The resize, if one was asked for.
    pub resize: Option<ResizeReport>,
    /// One checkpoint save.
    pub checkpoint: CheckpointReport,
    /// Seconds the model took.
    pub model_seconds: f64,
}

fn bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut v = b;
    let mut u = 0;
    while v.abs() >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.3} {}", UNITS[u])
}

fn q(x: &Quantiles) -> String {
    format!(
        "min {:.2} / p50 {:.2} / p90 {:.2} / p99 {:.2} / max {:.2} s",
        x.min, x.p50, x.p90, x.p99, x.max
    )
}

impl Report {
    /// The report as an aligned two-column table.
    pub fn table(&self) -> String {
        let c = &self.config.cluster;
        let e = &self.epoch;
        let s = &self.startup;
        let k = &self.checkpoint;
        let mut rows: Vec<(String, String)> = vec![
            (
                "cluster".into(),
                format!(
                    "{} nodes x {} ranks x {} workers, {}/s per node, cache {}",
                    c.nodes,
                    c.ranks_per_node,
                    c.workers,
                    bytes(c.node_bandwidth),
                    bytes(c.cache_limit as f64)
                ),
            ),
            (
                "dataset".into(),
                format!(
                    "{} shards, {} samples, {}, {} prefix(es), lanes {}",
                    self.shards,
                    self.samples,
                    bytes(e.dataset_bytes as f64),
                    self.config.dataset.prefixes,
                    self.config.lanes()
                ),
            ),
            (
                "nodes played".into(),
                format!(
                    "{} ({} steps of {} samples per process)",
                    e.nodes_played, e.steps, e.step_samples
                ),
            ),
            ("amplification".into(), format!("{:.4}", e.amplification)),
            (
                "bytes per node".into(),
                format!(
                    "{} (min {}, max {})",
                    bytes(e.bytes_per_node.mean),
                    bytes(e.bytes_per_node.min),
                    bytes(e.bytes_per_node.max)
                ),
            ),
            (
                "GETs per node".into(),
                format!(
                    "{:.0} (min {:.0}, max {:.0})",
                    e.requests_per_node.mean, e.requests_per_node.min, e.requests_per_node.max
                ),
            ),
            (
                "cache need per node".into(),
                format!(
                    "{} (max {}), {} node(s) over the limit",
                    bytes(e.cache_need_per_node.mean),
                    bytes(e.cache_need_per_node.max),
                    e.nodes_over_cache_limit
                ),
            ),
            (
                "epoch".into(),
                format!(
                    "{:.0} s ({})",
                    e.seconds,
                    if e.io_bound {
                        "network-bound"
                    } else {
                        "compute-bound"
                    }
                ),
            ),
            (
                "GET/s per prefix".into(),
                format!(
                    "mean {:.0}, peak {:.0} (limit {:.0})",
                    e.get_per_s_per_prefix_mean,
                    e.get_per_s_per_prefix_peak,
                    self.config.store.get_limit
                ),
            ),
            (
                "bytes/s per prefix".into(),
                bytes(e.bytes_per_s_per_prefix_mean) + "/s",
            ),
            (
                "index".into(),
                format!(
                    "{} per node, {:.2} s to fetch and parse, {} requests",
                    bytes(s.index_bytes as f64),
                    s.index_seconds,
                    s.index_requests
                ),
            ),
            ("first batch (process)".into(), q(&s.process_first_batch)),
            ("first batch (worker)".into(), q(&s.worker_first_batch)),
            (
                "start-up GETs".into(),
                format!("{} shard GETs, {} 503s", s.first_gets, s.throttled),
            ),
        ];
        for r in &self.rates {
            rows.push((
                format!("shaping {}", if r.shaping { "on" } else { "off" }),
                format!(
                    "offered {:.0}/s (peak {:.0}), served {:.0}/s, 503 {:.0}/s, failed {:.1}/s, over limit {:.0}% of seconds",
                    r.offered, r.offered_peak, r.served, r.throttled, r.failed, r.seconds_over_limit * 100.0
                ),
            ));
        }
        if let Some(r) = &self.resize {
            rows.push((
                "resize".into(),
                format!(
                    "{} -> {} nodes at {}: rest of epoch {} -> {} ({} extra), {:.0} shards moved, {:.0} kept, nodes per lane {} -> {}, rest amplification {:.3}",
                    r.from_nodes, r.to_nodes, r.consumed, bytes(r.rest_bytes_without), bytes(r.rest_bytes_with), bytes(r.extra_bytes), r.shards_moved, r.shards_kept, r.nodes_per_lane_before, r.nodes_per_lane_after, r.rest_amplification
                ),
            ));
        }
        rows.push((
            "checkpoint".into(),
            format!(
                "{} ranks, {} files, parts of {} x {}, {} PUTs at {:.0}/s (offered {:.0}/s{}), upload {:.1} s",
                k.ranks, k.files, bytes(k.part_size as f64), k.parts_per_file, k.upload_puts, k.put_rate, k.put_rate_offered,
                if k.over_put_limit { ", over the limit" } else { "" }, k.upload_seconds
            ),
        ));
        rows.push((
            "checkpoint commit".into(),
            format!(
                "manifest {}, {} requests, {:.2} s",
                bytes(k.manifest_bytes as f64),
                k.commit_requests,
                k.commit_seconds
            ),
        ));
        rows.push((
            "order per process".into(),
            bytes(self.order_heap_bytes as f64),
        ));
        rows.push(("model took".into(), format!("{:.2} s", self.model_seconds)));
        let width = rows.iter().map(|(a, _)| a.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (a, b) in rows {
            let _ = writeln!(out, "{a:width$}  {b}");
        }
        out
    }
}
