//! One distributed checkpoint save by every process: its PUT profile, manifest and commit.
//!
//! Part sizes and per-rank PUT caps come from `checkpoint::RatePlan` (or
//! `UploadConfig::default()` when the plan is off); the manifest is a real
//! `checkpoint::Manifest` of every rank's files, serialized as `Manifest::to_json` does
//! (pretty JSON), so its size is the size the coordinator puts. The commit's requests are those of
//! `CheckpointRoot::commit` on a store whose create-only put is atomic (Amazon S3): the
//! attempt folder listed page by page (1,000 objects a page, one page after another) to check
//! every file's size, the manifest's create-only put, its read-back and the `latest` pointer's
//! put (plus, once per coordinator process, the two-put probe of the store's conditional puts
//! and its delete).

use serde::Serialize;
use shardstream_checkpoint::checksum::combine_parts;
use shardstream_checkpoint::{FileRecord, Manifest, RatePlan, UploadConfig};

use crate::config::SimConfig;
use crate::error::{mul, Result, SimError};

/// Objects per LIST page: S3's `max-keys` default and most.
const LIST_PAGE: u64 = 1000;
/// Requests of the conditional-put probe: two create-only puts and a delete.
const PROBE_REQUESTS: u64 = 3;

/// The save.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckpointReport {
    /// Ranks saving.
    pub ranks: u64,
    /// Files (ranks x files per rank, plus DCP's `.metadata`).
    pub files: u64,
    /// Part size, bytes.
    pub part_size: u64,
    /// Parts of one rank file.
    pub parts_per_file: u64,
    /// PUT-class requests of the upload (create, parts, complete per multipart file).
    pub upload_puts: u64,
    /// PUT/s the ranks offer while uploading, all together.
    pub put_rate_offered: f64,
    /// PUT/s the prefix takes (the offer, capped by the plan's caps and the prefix limit).
    pub put_rate: f64,
    /// Whether the offer is over the prefix's PUT limit (`503`s and retries).
    pub over_put_limit: bool,
    /// Seconds to upload (bandwidth or request rate, whichever binds).
    pub upload_seconds: f64,
    /// Bytes of the manifest.
    pub manifest_bytes: u64,
    /// Requests of the commit (listing pages, probe, manifest put and read-back, pointer).
    pub commit_requests: u64,
    /// Seconds of the commit.
    pub commit_seconds: f64,
}

/// Models a save by every process of `config`'s cluster.
pub fn model_checkpoint(config: &SimConfig) -> Result<CheckpointReport> {
    let c = &config.cluster;
    let k = &config.checkpoint;
    let s = &config.store;
    let ranks = mul(u64::from(c.nodes), u64::from(c.ranks_per_node), "ranks")?;
    let world = u32::try_from(ranks).map_err(|_| SimError::Overflow { what: "ranks" })?;
    let file_bytes = k.bytes_per_rank / u64::from(k.files_per_rank);
    let rank_bandwidth = c.node_bandwidth / f64::from(c.ranks_per_node);
    let upload = if k.rate_plan {
        let mut plan = RatePlan::s3(world, rank_bandwidth);
        plan.put_rate_limit = s.put_limit;
        plan.largest_file = file_bytes;
        plan.upload_config()
    } else {
        UploadConfig::default()
    };
    // As the writer plans a file of known size: one PUT up to the single-PUT bound, else even
    // parts.
    let part = upload.planned_part_size(file_bytes).max(1);
    let parts = file_bytes.div_ceil(part).max(1);
    let per_file = if parts > 1 { parts + 2 } else { 1 };
    let files = mul(ranks, u64::from(k.files_per_rank), "files")?.saturating_add(1);
    let upload_puts = mul(files - 1, per_file, "upload requests")?.saturating_add(1);
    let offered = ranks as f64 * rank_bandwidth / part as f64;
    let capped = match upload.max_requests_per_second {
        Some(per_rank) => offered.min(per_rank * ranks as f64),
        None => offered,
    };
    let put_rate = capped.min(s.put_limit);
    let bandwidth_seconds = k.bytes_per_rank as f64 / rank_bandwidth;
    let request_seconds = upload_puts as f64 / put_rate.max(f64::MIN_POSITIVE);
    let upload_seconds = bandwidth_seconds.max(request_seconds) + s.latency;
    let manifest = manifest_of(world, k.files_per_rank, file_bytes, part, parts)?;
    // `Manifest::to_json`'s bytes, without its validation (which recombines every file's part
    // checksums: minutes at 4,096 ranks, and these are consistent by construction).
    let manifest_bytes = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| SimError::Serialize {
            what: "manifest",
            reason: e.to_string(),
        })?
        .len() as u64;
    // Pages follow each other (each carries the next one's continuation token).
    let list_pages = files.div_ceil(LIST_PAGE).max(1);
    let list_seconds = list_pages as f64 * s.latency.max(1.0 / s.get_limit);
    // The manifest goes up and is read back whole; the pointer is a few bytes.
    let manifest_seconds = 2.0 * (s.latency + manifest_bytes as f64 / s.connection_bandwidth);
    let commit_seconds =
        list_seconds + PROBE_REQUESTS as f64 * s.latency + manifest_seconds + s.latency;
    Ok(CheckpointReport {
        ranks,
        files,
        part_size: part,
        parts_per_file: parts,
        upload_puts,
        put_rate_offered: offered,
        put_rate,
        over_put_limit: capped > s.put_limit,
        upload_seconds,
        manifest_bytes,
        commit_requests: list_pages + PROBE_REQUESTS + 3,
        commit_seconds,
    })
}

/// The manifest the coordinator would commit: every rank's files with a CRC per part.
fn manifest_of(
    world: u32,
    files_per_rank: u32,
    file_bytes: u64,
    part: u64,
    parts: u64,
) -> Result<Manifest> {
    let attempt = "attempt-0123456789abcdef";
    let multipart = parts > 1;
    // Checksums are fixed-width hex, so their values do not change the size: one set of part
    // CRCs (and their combination) serves every file.
    let part_crcs: Vec<u32> = if multipart {
        (0..parts)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 3) as u32)
            .collect()
    } else {
        Vec::new()
    };
    let crc32c = if multipart {
        combine_parts(part_crcs.iter().enumerate().map(|(i, &c)| {
            let lo = part.saturating_mul(i as u64).min(file_bytes);
            (c, file_bytes.min(lo.saturating_add(part)) - lo)
        }))
    } else {
        0x9e37_79b9
    };
    let mut files = Vec::new();
    for rank in 0..world {
        for f in 0..files_per_rank {
            files.push(FileRecord {
                path: format!("{attempt}/__{rank}_{f}.distcp"),
                size: file_bytes,
                crc32c,
                part_size: if multipart { part } else { 0 },
                parts: part_crcs.clone(),
                rank: Some(rank),
            });
        }
    }
    files.push(FileRecord {
        path: format!("{attempt}/.metadata"),
        size: 1 << 20,
        crc32c: 0x1234_5678,
        part_size: 0,
        parts: Vec::new(),
        rank: Some(0),
    });
    Ok(Manifest {
        format: shardstream_checkpoint::manifest::FORMAT_NAME.to_string(),
        version: shardstream_checkpoint::manifest::FORMAT_VERSION,
        checkpoint_id: "step_100000".into(),
        attempt: attempt.into(),
        step: Some(100_000),
        world_size: world,
        created_unix_ms: 1_764_000_000_000,
        created: "2025-11-24T16:00:00Z".into(),
        checksum: "crc32c".into(),
        files,
        aliases: Vec::new(),
        metadata: serde_json::Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::model_checkpoint;
    use crate::config::{Checkpoint, Cluster, SimConfig};

    const MIB: u64 = 1 << 20;

    fn shape(bytes_per_rank: u64, files_per_rank: u32) -> SimConfig {
        SimConfig {
            cluster: Cluster {
                nodes: 2,
                ranks_per_node: 4,
                ..Cluster::default()
            },
            checkpoint: Checkpoint {
                bytes_per_rank,
                files_per_rank,
                rate_plan: false,
            },
            ..SimConfig::default()
        }
    }

    #[test]
    fn files_are_modelled_as_the_writer_plans_them() {
        // 128 MiB files (a tensor each): one PUT per file, as the writer sends them.
        let r = model_checkpoint(&shape(1024 * MIB, 8)).unwrap();
        assert_eq!((r.parts_per_file, r.files), (1, 8 * 8 + 1));
        assert_eq!(r.upload_puts, r.files);
        // 10 GiB in one file: 160 even parts of 64 MiB, create + parts + complete.
        let r = model_checkpoint(&shape(10 * 1024 * MIB, 1)).unwrap();
        assert_eq!((r.part_size, r.parts_per_file), (64 * MIB, 160));
        assert_eq!(r.upload_puts, 8 * 162 + 1);
        // 200 MiB: past the single-PUT bound, so four parts of 50 MiB, not 64 + 64 + 64 + 8.
        let r = model_checkpoint(&shape(200 * MIB, 1)).unwrap();
        assert_eq!((r.part_size, r.parts_per_file), (50 * MIB, 4));
    }
}
