//! Every `SHARDSTREAM_*` setting the streamer reads from the environment, in one place, with the
//! one precedence the whole product follows: an argument (a flag, a Python keyword, a
//! [`crate::StreamingConfig`] field) beats the environment, which beats the default. The deploy
//! manifests' ConfigMap sets these; `docs/configuration.md` lists them all.
//!
//! Request shaping (`SHARDSTREAM_SHAPING*`) is read by the storage layer, since datasets,
//! checkpoints and the CLI all need it: see `shardstream_storage::shaping`, whose names are
//! re-exported here so that this stays the one list.

use std::time::Duration;

use crate::error::{Result, StreamerError};

/// RAM budget of a dataset (`memory_limit`), as a byte size (`4GiB`).
pub const MEMORY_LIMIT_ENV: &str = "SHARDSTREAM_MEMORY_LIMIT";
/// Disk budget of the node cache (`cache_limit`), as a byte size (`200GiB`).
pub const CACHE_LIMIT_ENV: &str = "SHARDSTREAM_CACHE_LIMIT";
/// How long transient storage failures of one shard are retried, in seconds.
pub const RETRY_WINDOW_ENV: &str = "SHARDSTREAM_RETRY_WINDOW";
pub use shardstream_storage::shaping::{
    DECREASE_ENV as SHAPING_DECREASE_ENV, INCREASE_ENV as SHAPING_INCREASE_ENV,
    MAX_RATE_ENV as SHAPING_MAX_RATE_ENV, MIN_RATE_ENV as SHAPING_MIN_RATE_ENV,
    PREFIX_LIMIT_ENV as SHAPING_PREFIX_LIMIT_ENV, PROCESSES_ENV as SHAPING_PROCESSES_ENV,
    SHAPING_ENV, START_RATE_ENV as SHAPING_START_RATE_ENV, WORKERS_ENV as SHAPING_WORKERS_ENV,
};
/// Longest random delay, in seconds, before a remote `index.json` is fetched from the store:
/// many nodes starting together then spread their GETs of that one key over this window.
pub const INDEX_JITTER_ENV: &str = "SHARDSTREAM_INDEX_JITTER";
/// Largest accepted [`INDEX_JITTER_ENV`].
pub const MAX_INDEX_JITTER: Duration = Duration::from_secs(60);

/// Index requests per second a job's starting processes aim at when no jitter is set: half
/// of S3's 5,500 GET/s per prefix, the rest left to the shards and to other jobs.
const START_REQUESTS_PER_SECOND: f64 = 2750.0;
/// Requests each process makes for its index (`index.ssx`, then `index.json`).
const INDEX_REQUESTS_PER_PROCESS: f64 = 2.0;

/// The start jitter: [`INDEX_JITTER_ENV`] when set (seconds, at most [`MAX_INDEX_JITTER`]);
/// else, when torchrun's `WORLD_SIZE` is set, the window that spreads the job's index
/// requests to [`START_REQUESTS_PER_SECOND`] (4,096 processes: 3 s; 16: 12 ms); else none.
pub fn index_jitter(env: &dyn Fn(&str) -> Option<String>) -> Duration {
    let seconds = |var: &str| {
        env(var)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
    };
    let window = match seconds(INDEX_JITTER_ENV) {
        Some(set) => set,
        None => seconds("WORLD_SIZE").map_or(0.0, |processes| {
            processes * INDEX_REQUESTS_PER_PROCESS / START_REQUESTS_PER_SECOND
        }),
    };
    Duration::from_secs_f64(window).min(MAX_INDEX_JITTER)
}

/// A delay drawn uniformly from `[0, max]` (a fresh random seed each call, from the standard
/// library's hasher keys: no generator to share between forked processes).
pub fn random_delay(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    if max.is_zero() {
        return Duration::ZERO;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    max.mul_f64(unit)
}

/// Default retry window: how long transient storage failures of one shard are retried before
/// its fetch fails.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(120);

/// Parses a byte count typed as `123`, `64MiB`, `64MB`, `1.5g`, `200GiB`. Every unit is a power
/// of 1024, as in Mosaic's `size_limit="64mb"` (the CLI's flags and the Python package read sizes
/// the same way).
pub fn parse_byte_size(s: &str) -> std::result::Result<u64, String> {
    let text = s.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 64MiB)"))?;
    let bytes = value * 2f64.powi(shift);
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// A byte size: `given`, else the variable `var` of `env` (an error naming it if it does not
/// parse), else `None` (the caller's default).
pub fn byte_size(
    given: Option<u64>,
    var: &'static str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<u64>> {
    if given.is_some() {
        return Ok(given);
    }
    match env(var).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(text) => {
            parse_byte_size(&text)
                .map(Some)
                .map_err(|reason| StreamerError::InvalidConfig {
                    setting: var,
                    reason,
                })
        }
    }
}

/// The retry window an environment sets (seconds, fractions allowed), else the default.
pub fn retry_window(env: &dyn Fn(&str) -> Option<String>) -> Duration {
    env(RETRY_WINDOW_ENV)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && (0.0..=1e9).contains(s))
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_RETRY_WINDOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(var: &'static str, value: &'static str) -> impl Fn(&str) -> Option<String> {
        move |k: &str| (k == var).then(|| value.to_string())
    }

    #[test]
    fn sizes_are_binary() {
        assert_eq!(parse_byte_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_byte_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_byte_size(" 1.5g "), Ok(3 << 29));
        assert_eq!(parse_byte_size("200GiB"), Ok(200 << 30));
        assert_eq!(parse_byte_size("123"), Ok(123));
        for bad in ["", "x", "1.2.3MB", "5 furlongs", "1e400"] {
            assert!(parse_byte_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_argument_beats_the_environment_which_beats_the_default() {
        let env = env_of(MEMORY_LIMIT_ENV, "4GiB");
        assert_eq!(byte_size(Some(7), MEMORY_LIMIT_ENV, &env).unwrap(), Some(7));
        assert_eq!(
            byte_size(None, MEMORY_LIMIT_ENV, &env).unwrap(),
            Some(4 << 30)
        );
        assert_eq!(byte_size(None, CACHE_LIMIT_ENV, &env).unwrap(), None);
        let bad = env_of(CACHE_LIMIT_ENV, "lots");
        let err = byte_size(None, CACHE_LIMIT_ENV, &bad).unwrap_err();
        assert!(err.to_string().contains(CACHE_LIMIT_ENV), "{err}");
    }

    #[test]
    fn the_index_jitter_is_bounded_and_scales_with_the_job() {
        assert_eq!(index_jitter(&|_| None), Duration::ZERO);
        let env = |value: &'static str| env_of(INDEX_JITTER_ENV, value);
        assert_eq!(index_jitter(&env("2")), Duration::from_secs(2));
        assert_eq!(index_jitter(&env("1e9")), MAX_INDEX_JITTER);
        assert_eq!(index_jitter(&env("-1")), Duration::ZERO);
        // Unset, a job of WORLD_SIZE processes spreads its index requests over a window
        // that keeps them at 2,750/s; an explicit value (0 included) wins.
        let world = |n: &'static str| env_of("WORLD_SIZE", n);
        assert_eq!(index_jitter(&world("4096")).as_millis(), 2978);
        assert_eq!(index_jitter(&world("16")).as_micros(), 11636);
        assert_eq!(index_jitter(&world("100000000")), MAX_INDEX_JITTER);
        let both = |k: &str| match k {
            INDEX_JITTER_ENV => Some("0".to_string()),
            "WORLD_SIZE" => Some("4096".to_string()),
            _ => None,
        };
        assert_eq!(index_jitter(&both), Duration::ZERO);
        for _ in 0..100 {
            assert!(random_delay(Duration::from_secs(2)) <= Duration::from_secs(2));
        }
        assert_eq!(random_delay(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_retry_window_is_read_from_its_variable_else_120_s() {
        let env = |value: &'static str| env_of(RETRY_WINDOW_ENV, value);
        assert_eq!(retry_window(&|_| None), Duration::from_secs(120));
        assert_eq!(retry_window(&env("30")), Duration::from_secs(30));
        assert_eq!(retry_window(&env(" 0.5 ")), Duration::from_millis(500));
        for bad in ["", "-1", "soon", "inf", "NaN"] {
            assert_eq!(retry_window(&env(bad)), DEFAULT_RETRY_WINDOW, "{bad:?}");
        }
    }
}
