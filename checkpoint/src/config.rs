//! Upload settings, and the request-rate arithmetic that picks them for a job.
//!
//! S3 serves at least 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second per
//! partitioned prefix, and a fresh prefix starts as one partition. Every rank of a checkpoint
//! writes under the same `<root>/<id>/` prefix, so with `W` ranks uploading `B` bytes/s each in
//! parts of `P` bytes the prefix sees `W·B/P` PUT/s. Keeping that under the limit `L` (with some
//! headroom `h`) gives the smallest part size `P ≥ W·B / (h·L)`, and turned around, a prefix can
//! absorb at most `h·L·P` bytes/s whatever the number of ranks. [`RatePlan::upload_config`] does
//! this sum and also caps each rank's own PUT rate at `h·L/W` so that ranks faster than planned
//! queue locally instead of drawing `503 SlowDown` storms. Retries and backoff on `SlowDown`
//! belong to the object store client (the storage layer's retry config), not to this crate.

use crate::error::{CheckpointError, Result};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// S3's smallest part (every part but the last).
pub const S3_MIN_PART_SIZE: u64 = 5 * MIB;
/// S3's largest part.
pub const S3_MAX_PART_SIZE: u64 = 5 << 30;
/// S3's most parts per upload.
pub const S3_MAX_PARTS: u64 = 10_000;
/// S3's PUT rate per partitioned prefix.
pub const S3_PUT_RATE_PER_PREFIX: f64 = 3_500.0;
/// S3's GET rate per partitioned prefix.
pub const S3_GET_RATE_PER_PREFIX: f64 = 5_500.0;
/// Default [`UploadConfig::single_put_max`]: two default parts and room for the framing a
/// caller adds around them (a 128 MiB tensor with its `torch.save` headers is one PUT).
pub const DEFAULT_SINGLE_PUT_MAX: u64 = 136 * MIB;

/// How one process uploads its files.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadConfig {
    /// Files larger than this go up in parts of this size; smaller ones in a single PUT (but see
    /// [`UploadConfig::single_put_max`] for files whose size is known up front).
    pub part_size: u64,
    /// A file whose size is given up front ([`crate::FileWriter::with_expected_size`]) and is
    /// at most this (and at most `memory_budget`) goes up in one PUT, not as a multipart upload:
    /// one request instead of create + parts + complete, no completion round trip at the end
    /// (on some stores a server-side copy of the whole object), and nothing to abort if the
    /// process dies. The price is one connection per file instead of one per part and a whole
    /// file to resend on a retry, both small at this size when a rank uploads several files at
    /// once. At most 5 GiB (S3's largest PUT); 0 turns it off.
    pub single_put_max: u64,
    /// Host memory, in bytes, that part buffers in flight (filling or uploading) may hold.
    pub memory_budget: u64,
    /// Most part/PUT requests in flight at once.
    pub max_concurrent_requests: usize,
    /// Most files uploaded at once by [`crate::RankWriter::upload_all`].
    pub max_concurrent_files: usize,
    /// Cap on this process's PUT requests per second (`None`: no cap).
    pub max_requests_per_second: Option<f64>,
}

impl Default for UploadConfig {
    fn default() -> Self {
        Self {
            part_size: 64 * MIB,
            memory_budget: 512 * MIB,
            max_concurrent_requests: 16,
            max_concurrent_files: 4,
            max_requests_per_second: None,
            single_put_max: DEFAULT_SINGLE_PUT_MAX,
        }
    }
}

impl UploadConfig {
    /// Checks the values against each other. Part sizes below 5 MiB are allowed (local
    /// filesystems and tests) but S3 rejects them for every part except the last.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(CheckpointError::InvalidConfig(m));
        if self.part_size < 1024 || self.part_size > S3_MAX_PART_SIZE {
            return bad(format!(
                "part_size {} is outside 1 KiB..=5 GiB",
                self.part_size
            ));
        }
        if self.memory_budget < self.part_size {
            return bad(format!(
                "memory_budget {} is smaller than one part ({})",
                self.memory_budget, self.part_size
            ));
        }
        if self.single_put_max > S3_MAX_PART_SIZE {
            return bad(format!(
                "single_put_max {} is larger than S3's largest PUT (5 GiB)",
                self.single_put_max
            ));
        }
        if self.max_concurrent_requests == 0 || self.max_concurrent_files == 0 {
            return bad("concurrency limits must be at least 1".into());
        }
        if let Some(r) = self.max_requests_per_second {
            if !(r.is_finite() && r > 0.0) {
                return bad(format!(
                    "max_requests_per_second {r} is not a positive number"
                ));
            }
        }
        Ok(())
    }

    /// The largest file of known size that goes up in one PUT: its buffer must fit the budget.
    pub fn effective_single_put_max(&self) -> u64 {
        self.single_put_max.min(self.memory_budget)
    }

    /// The part size a file of `size` bytes, known up front, is uploaded with
    /// ([`crate::FileWriter::with_expected_size`]): `size` itself (one PUT) up to the single-PUT
    /// bound, else even parts of at most `part_size`. The one rule, for callers that model an
    /// upload without making it (the scale simulator).
    pub fn planned_part_size(&self, size: u64) -> u64 {
        crate::upload::planned_part_size(size, self.part_size, self.effective_single_put_max())
    }

    /// How many part buffers the budget holds at once.
    pub fn buffers_in_budget(&self) -> u64 {
        self.memory_budget / self.part_size.max(1)
    }
}

/// Inputs of the request-rate arithmetic for one save.
#[derive(Debug, Clone, PartialEq)]
pub struct RatePlan {
    /// Ranks saving at the same time under one prefix.
    pub world_size: u32,
    /// Upload throughput one rank can reach, bytes/s (its share of the node's NIC).
    pub rank_bandwidth: f64,
    /// The store's PUT rate per prefix ([`S3_PUT_RATE_PER_PREFIX`]).
    pub put_rate_limit: f64,
    /// Fraction of `put_rate_limit` to plan for (leaves room for HEADs, retries, other jobs).
    pub headroom: f64,
    /// Largest single file a rank writes (for the part-count limit).
    pub largest_file: u64,
    /// Host memory a rank may use for part buffers.
    pub memory_budget: u64,
}

impl RatePlan {
    /// A plan for `world_size` ranks of `rank_bandwidth` bytes/s each, against S3's limits.
    pub fn s3(world_size: u32, rank_bandwidth: f64) -> Self {
        Self {
            world_size,
            rank_bandwidth,
            put_rate_limit: S3_PUT_RATE_PER_PREFIX,
            headroom: 0.8,
            largest_file: 0,
            memory_budget: 512 * MIB,
        }
    }

    /// PUT/s the prefix may take under this plan.
    pub fn target_rate(&self) -> f64 {
        (self.put_rate_limit * self.headroom).max(1.0)
    }

    /// The smallest part size (a multiple of 8 MiB, at least 8 MiB) that keeps the aggregate
    /// PUT rate under [`RatePlan::target_rate`] and every file under 10,000 parts.
    pub fn part_size(&self) -> u64 {
        let aggregate = f64::from(self.world_size.max(1)) * self.rank_bandwidth.max(0.0);
        let for_rate = (aggregate / self.target_rate()).ceil();
        let for_rate = if for_rate.is_finite() && for_rate < S3_MAX_PART_SIZE as f64 {
            for_rate as u64
        } else {
            S3_MAX_PART_SIZE
        };
        let for_count = self.largest_file.div_ceil(S3_MAX_PARTS);
        let raw = for_rate.max(for_count).max(8 * MIB);
        raw.div_ceil(8 * MIB)
            .saturating_mul(8 * MIB)
            .min(S3_MAX_PART_SIZE)
    }

    /// Each rank's share of the prefix's PUT rate.
    pub fn per_rank_rate(&self) -> f64 {
        self.target_rate() / f64::from(self.world_size.max(1))
    }

    /// The aggregate bytes/s one prefix can absorb with the planned part size.
    pub fn prefix_throughput_ceiling(&self) -> f64 {
        self.target_rate() * self.part_size() as f64
    }

    /// An [`UploadConfig`] that follows the plan: the part size above, the budget (raised to two
    /// parts if needed so one part can fill while another uploads), concurrency the budget can
    /// feed, and the per-rank rate cap.
    pub fn upload_config(&self) -> UploadConfig {
        let part_size = self.part_size();
        let memory_budget = self.memory_budget.max(2 * part_size);
        let buffers = (memory_budget / part_size).max(1);
        UploadConfig {
            part_size,
            memory_budget,
            max_concurrent_requests: usize::try_from(buffers).unwrap_or(usize::MAX).min(16),
            max_concurrent_files: 4,
            max_requests_per_second: Some(self.per_rank_rate()),
            single_put_max: DEFAULT_SINGLE_PUT_MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        UploadConfig::default().validate().unwrap();
        let mut c = UploadConfig::default();
        c.memory_budget = c.part_size - 1;
        assert!(c.validate().is_err());
        c = UploadConfig {
            max_requests_per_second: Some(f64::NAN),
            ..UploadConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn small_jobs_get_the_floor() {
        let p = RatePlan::s3(8, 1.0e9);
        // 8 GB/s over 2,800 PUT/s is 2.9 MB: the 8 MiB floor applies.
        assert_eq!(p.part_size(), 8 * MIB);
        p.upload_config().validate().unwrap();
    }

    #[test]
    fn large_jobs_get_large_parts() {
        // 1,024 ranks at 1 GB/s: 1.024 TB/s / 2,800 PUT/s = 365.7 MB -> 352 MiB.
        let p = RatePlan::s3(1024, 1.0e9);
        assert_eq!(p.part_size(), 352 * MIB);
        let c = p.upload_config();
        c.validate().unwrap();
        assert!(c.memory_budget >= 2 * c.part_size);
        let rate = c.max_requests_per_second.unwrap();
        assert!((rate * 1024.0 - 2_800.0).abs() < 1e-6);
        // The plan keeps the aggregate rate under the limit.
        assert!(1024.0 * 1.0e9 / p.part_size() as f64 <= p.target_rate());
    }

    #[test]
    fn part_count_limit() {
        let mut p = RatePlan::s3(1, 1.0e6);
        p.largest_file = 1 << 40; // 1 TiB needs >= 105 MiB parts for 10,000 parts
        let ps = p.part_size();
        assert!(p.largest_file.div_ceil(ps) <= S3_MAX_PARTS);
        assert_eq!(ps % (8 * MIB), 0);
    }

    #[test]
    fn absurd_inputs_clamp() {
        let p = RatePlan::s3(u32::MAX, f64::INFINITY);
        assert_eq!(p.part_size(), S3_MAX_PART_SIZE);
        let p = RatePlan::s3(0, -5.0);
        assert_eq!(p.part_size(), 8 * MIB);
    }
}
