//! Tunables: retries, timeouts, transfer sizes and concurrency, and their translation into
//! `object_store`'s `RetryConfig` and `ClientOptions`.
//!
//! # The timeout arithmetic
//!
//! `object_store`'s request timeout covers a whole request, body included (connect to last
//! byte). A single GET of a multi-GiB object therefore cannot have a useful timeout: either it
//! is long enough for the slowest legitimate download (and a hung connection waits that long),
//! or it kills a slow but healthy transfer. So no request here moves more than
//! `max(chunk_size, part_size)` bytes: large GETs are split into ranged chunks and large PUTs
//! into multipart parts, and each request gets its own timeout.
//!
//! With the defaults (8 MiB chunks and parts):
//! - `connect` = 5 s: a TCP/TLS handshake to a healthy endpoint takes milliseconds.
//! - `request` = 120 s per request: an 8 MiB request must sustain only ~70 KiB/s to finish,
//!   so only a connection that is effectively dead hits it (16 MiB parts: ~140 KiB/s).
//! - `stall` = 30 s: no byte at all for 30 s on an open connection fails that read early,
//!   without waiting for the whole request timeout.
//! - A timed-out GET is retried (it is idempotent), with backoff, until `max_retries` (10) or
//!   `retry_timeout` (300 s, measured from the first attempt of that request) runs out; the
//!   worst case for one request is thus about `retry_timeout + request` = 7 minutes, never a
//!   hang. A whole transfer has no overall deadline: a 100 GiB download at 10 MiB/s takes
//!   nearly 3 hours, and every one of its ~12 800 requests is bounded as above.

use std::time::Duration;

use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use crate::shaping::ShapingConfig;

/// One MiB.
pub const MIB: usize = 1024 * 1024;

/// S3's smallest multipart part (except the last).
pub const MIN_PART_SIZE: usize = 5 * MIB;

/// S3's largest number of parts in one multipart upload.
pub const MAX_PARTS: u64 = 10_000;

/// Retry policy for transient failures (5xx, 429, `SlowDown`, timeouts, connection errors).
///
/// Backoff is exponential with full jitter: each wait is drawn uniformly between
/// `init_backoff` and `base` times the previous wait, capped at `max_backoff`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt of one request.
    pub max_retries: usize,
    /// First backoff.
    pub init_backoff: Duration,
    /// Longest single backoff.
    pub max_backoff: Duration,
    /// Growth factor of the backoff.
    pub base: f64,
    /// No retry is started once this much time has passed since the request's first attempt.
    pub retry_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 10,
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
            retry_timeout: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The equivalent `object_store` configuration.
    pub fn to_retry_config(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: self.init_backoff,
                max_backoff: self.max_backoff,
                base: self.base,
            },
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }
}

/// Per-request timeouts (see the module docs for why they are per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP + TLS connection setup.
    pub connect: Duration,
    /// One whole request, body included; bounds requests of at most one chunk or part.
    pub request: Duration,
    /// Longest silence (no byte received) on an open connection.
    pub stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            request: Duration::from_secs(120),
            stall: Duration::from_secs(30),
        }
    }
}

/// Explicit overrides for opening a location; anything left `None` comes from the environment.
///
/// Its `Debug` output shows the endpoint through [`crate::redact::redact_url`].
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct StorageOptions {
    /// Custom S3 endpoint (e.g. `http://127.0.0.1:9000`); overrides the environment.
    pub endpoint: Option<String>,
    /// Allow plain-HTTP endpoints; overrides `AWS_ALLOW_HTTP` and the loopback rule.
    pub allow_http: Option<bool>,
    /// S3 region; overrides `AWS_REGION`/`AWS_DEFAULT_REGION`.
    pub region: Option<String>,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Per-request timeouts.
    pub timeouts: Timeouts,
    /// Requests in flight for one transfer (and for a whole `sync_*`).
    pub concurrency: usize,
    /// Size of one ranged GET.
    pub chunk_size: usize,
    /// Size of one multipart part; files larger than this are uploaded in parts.
    pub part_size: usize,
    /// Request shaping of remote stores; `None`: from the `SHARDSTREAM_SHAPING*` environment
    /// (see [`crate::shaping`]).
    pub shaping: Option<ShapingConfig>,
    /// Send unsigned requests (public buckets); S3 and GCS.
    pub anonymous: Option<bool>,
    /// AWS profile for the credential chain; overrides `AWS_PROFILE`.
    pub profile: Option<String>,
    /// `object_store` configuration keys of the location's backend (`aws_access_key_id`,
    /// `google_service_account`, `azure_storage_sas_key`, `timeout`...), applied after the
    /// environment. Filled from per-call options by [`crate::named_options`].
    pub config: Vec<(String, String)>,
}

impl std::fmt::Debug for StorageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageOptions")
            .field(
                "endpoint",
                &self.endpoint.as_deref().map(crate::redact::redact_url),
            )
            .field("allow_http", &self.allow_http)
            .field("region", &self.region)
            .field("retry", &self.retry)
            .field("timeouts", &self.timeouts)
            .field("concurrency", &self.concurrency)
            .field("chunk_size", &self.chunk_size)
            .field("part_size", &self.part_size)
            .field("shaping", &self.shaping)
            .field("anonymous", &self.anonymous)
            .field("profile", &self.profile)
            .field(
                "config_keys",
                &self.config.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Default for StorageOptions {
    fn default() -> Self {
        Self {
            endpoint: None,
            allow_http: None,
            region: None,
            retry: RetryPolicy::default(),
            timeouts: Timeouts::default(),
            concurrency: 8,
            chunk_size: 8 * MIB,
            part_size: 8 * MIB,
            shaping: None,
            anonymous: None,
            profile: None,
            config: Vec::new(),
        }
    }
}

impl StorageOptions {
    /// Sets a custom S3 endpoint.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Allows or forbids plain HTTP.
    pub fn with_allow_http(mut self, allow: bool) -> Self {
        self.allow_http = Some(allow);
        self
    }

    /// Sets the S3 region.
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sends unsigned requests (a public bucket) or not.
    pub fn with_anonymous(mut self, anonymous: bool) -> Self {
        self.anonymous = Some(anonymous);
        self
    }

    /// Sets the AWS profile of the credential chain.
    pub fn with_profile(mut self, profile: impl Into<String>) -> Self {
        self.profile = Some(profile.into());
        self
    }

    /// Adds an `object_store` configuration key for the backend (applied last).
    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the timeouts.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Sets the number of requests in flight per transfer (at least 1).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Sets the ranged-GET chunk size (at least 64 KiB).
    pub fn with_chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = bytes.max(64 * 1024);
        self
    }

    /// Sets the multipart part size (at least S3's 5 MiB minimum).
    pub fn with_part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes.max(MIN_PART_SIZE);
        self
    }

    /// Sets the request shaping, instead of the environment's.
    pub fn with_shaping(mut self, shaping: ShapingConfig) -> Self {
        self.shaping = Some(shaping);
        self
    }

    /// Part size for a file of `len` bytes: the configured size, grown so that the upload
    /// stays within S3's 10 000 parts.
    pub fn part_size_for(&self, len: u64) -> usize {
        let needed = len.div_ceil(MAX_PARTS);
        let needed = usize::try_from(needed).unwrap_or(usize::MAX);
        self.part_size.max(MIN_PART_SIZE).max(needed)
    }

    /// The HTTP client options for remote stores.
    pub(crate) fn client_options(&self, allow_http: bool) -> ClientOptions {
        ClientOptions::new()
            .with_allow_http(allow_http)
            .with_connect_timeout(self.timeouts.connect)
            .with_timeout(self.timeouts.request)
            .with_read_timeout(self.timeouts.stall)
            .with_pool_max_idle_per_host(self.concurrency.max(1) * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_size_grows_to_stay_within_ten_thousand_parts() {
        let o = StorageOptions::default();
        assert_eq!(o.part_size_for(1024), 8 * MIB);
        let huge = 200 * 1024 * MIB as u64; // 200 GiB
        let part = o.part_size_for(huge) as u64;
        assert!(huge.div_ceil(part) <= MAX_PARTS);
        assert!(part > 8 * MIB as u64);
    }

    #[test]
    fn builder_clamps_to_sane_minimums() {
        let o = StorageOptions::default()
            .with_part_size(1)
            .with_chunk_size(1)
            .with_concurrency(0);
        assert_eq!(o.part_size, MIN_PART_SIZE);
        assert_eq!(o.chunk_size, 64 * 1024);
        assert_eq!(o.concurrency, 1);
    }

    #[test]
    fn retry_policy_maps_field_by_field() {
        let p = RetryPolicy {
            max_retries: 3,
            init_backoff: Duration::from_millis(7),
            max_backoff: Duration::from_secs(2),
            base: 3.0,
            retry_timeout: Duration::from_secs(9),
        };
        let c = p.to_retry_config();
        assert_eq!(c.max_retries, 3);
        assert_eq!(c.retry_timeout, Duration::from_secs(9));
        assert_eq!(c.backoff.init_backoff, Duration::from_millis(7));
        assert_eq!(c.backoff.max_backoff, Duration::from_secs(2));
    }
}
