//! Request shaping: a client-side rate limit per key prefix that adapts to the store's
//! throttling (`503 SlowDown`, `429`), so that many clients sharing one prefix settle under
//! its request limit instead of storming it with synchronized retries.
//!
//! # Where it sits
//!
//! Every HTTP *attempt* to a remote store (S3, GCS, Azure) passes through the limiter,
//! retries included: the limiter wraps `object_store`'s HTTP client
//! ([`ShapingConnector`]), below `object_store`'s own retry loop. A decorator of the
//! `ObjectStore` (see [`crate::decorate`]) would sit above that loop: it would neither see the
//! `503`s that a retry later hides, nor pace the retries themselves, which are what turns a
//! burst of throttling into a storm. Local paths are not shaped.
//!
//! # The model (for simulators: this is all of it)
//!
//! - **Prefix**: the request URL's authority and path up to its last `/`
//!   (`s3.amazonaws.com/bucket/ds/p07/` for `.../bucket/ds/p07/shard.00001.mds`; a LIST
//!   `GET /bucket?list-type=2...` is the bucket's own prefix). Each prefix has its own state.
//! - **Token bucket** per prefix: `rate` tokens per second, at most `burst_seconds x rate`
//!   tokens (at least 1) saved up. Each attempt takes one token; without one it waits
//!   `deficit / rate`, stretched by a random factor in `[1, 1 + jitter]` so that waiters do
//!   not wake in step. Tokens may go negative: queued attempts are served in order of arrival.
//! - **Additive increase**: each attempt answered without throttling adds
//!   `increase / rate` to `rate` (so `rate` grows by about `increase` per second while the
//!   prefix is used at its rate), up to `max_rate`.
//! - **Multiplicative decrease**: an attempt answered `503` or `429` multiplies `rate` by
//!   `decrease` (not below `min_rate`) and empties the saved tokens, at most once per
//!   `cooldown` per prefix (every attempt in flight during one throttling episode reports
//!   it; one episode is one decrease, as in TCP).
//! - State is per process: `N` processes on one prefix each run their own AIMD loop and
//!   converge together, as TCP flows share a link (the processes of one node decrease
//!   together through the node signal, below). The limiter is shared by every store of a
//!   process with the same [`ShapingConfig`].
//! - **Node share**: the rates (`start_rate`, `min_rate`, `max_rate`) are a node's, divided
//!   among the processes of the node that shape requests, so that a node of `P` processes
//!   starts, floors and peaks like one limiter state instead of `P`; `increase` is the whole
//!   job's, divided by `P x nodes` (`WORLD_SIZE / LOCAL_WORLD_SIZE`) ([`ShapingConfig::shared_by`]).
//!   `P` is `SHARDSTREAM_SHAPING_PROCESSES` when set, else `LOCAL_WORLD_SIZE x
//!   (SHARDSTREAM_SHAPING_WORKERS + 1)` (each rank and its DataLoader workers; workers 0 when
//!   unset) when torchrun's `LOCAL_WORLD_SIZE` is set, else 1: a single process is unchanged.
//!   Without it, 512 nodes x 8 ranks x 8 workers are 32,768 states whose floor alone
//!   (`min_rate` 1/s each) is over a prefix's 5,500 GET/s (`docs/scale.md`).
//! - **Node signal**: when a process decreases its rate for a prefix on its own `503`, it
//!   records the time in the node's signal; every other process of the node reads the signal
//!   of a prefix at most once per `node_poll` (50 ms; before taking a token, so no read per
//!   request) and, if a process of the node decreased within the last `cooldown` and this one
//!   has not during that episode, decreases too, as of that time
//!   ([`Shaper::follow_node`]). A node's processes thus decrease together, once per episode,
//!   as one limiter would. The signal is a small file per prefix in the node's folder
//!   ([`FileSignal`], `<node folder>/shaping/<hash of the prefix>`, UNIX nanoseconds written
//!   to a temporary file and renamed over); the node folder is [`NODE_DIR_ENV`] when set, else
//!   the one the streamer resolves for its cache (`<cache-root>/<run-id>/<node-rank>/`,
//!   registered with [`use_node_folder`]). Without a node folder, or with
//!   `SHARDSTREAM_SHAPING_NODE_DIR=off`, each process runs on its own `503`s only. A file that
//!   cannot be read or written, or holds anything but a timestamp, is logged and ignored:
//!   the signal never fails a request. [`MemorySignal`] is the same signal in memory (tests,
//!   the scale simulator).
//! - **Declared prefix limit** (optional, datasets' reads only): a user who knows the store's
//!   per-prefix request limit sets it for the whole job (`SHARDSTREAM_SHAPING_PREFIX_LIMIT`,
//!   [`declared_prefix_limit`], [`ShapingConfig::prefix_limit`]); each process then caps
//!   `max_rate` (and `start_rate`) at its share of 0.9 of it ([`PREFIX_LIMIT_HEADROOM`] says
//!   why 0.9): `prefix_limit x 0.9 / (P x nodes)`, with the same `P` and nodes as the node
//!   share ([`ShapingConfig::prefix_ceiling`]). No process talks to another, and the job's
//!   steady offer stays under the limit: AIMD probes up to the ceiling, never above, and still
//!   decreases on `503`s (another tenant's load). A node that does not fetch with all of its
//!   `P` processes (ranks whose DataLoader workers fetch) uses less than its share. A static
//!   share is only right where the job's processes share a prefix evenly, a dataset being
//!   streamed, so the limit is put only on the stores the streamer opens for datasets
//!   (`StreamingDataset`: Python datasets, `shardstream stream`, the FUSE mount), through
//!   [`ShapingConfig::from_env_with_prefix_limit`]. [`ShapingConfig::from_env`], the
//!   configuration of every other store (checkpoints, uploads, `shardstream transfer`),
//!   ignores it: there one process may use a prefix alone (a checkpoint coordinator's commit)
//!   and would get one share of the job's, and PUT limits differ (S3 documents 3,500 PUT/s
//!   against 5,500 GET/s per prefix). Such a dataset limiter is another [`Shaper`] of the
//!   process (its configuration differs) with its own prefix states; the node signal is per
//!   prefix, whichever limiter publishes or reads it, so a `503` on a dataset prefix still
//!   decreases every limiter of the node that uses that prefix. Unset by default: the limit is
//!   not known in general (S3 splits a busy prefix beyond its documented 5,500 GET/s).
//! - Retries of a throttled request are also jittered by `object_store`'s backoff
//!   (decorrelated jitter between `init_backoff` and `base x` the previous wait, see
//!   [`crate::RetryPolicy`]) and then take a token like any attempt.
//!
//! Defaults ([`ShapingConfig::default`]): on, `start_rate` 2000/s per prefix and node (a
//! node rarely needs more from one prefix; S3 serves about 5,500 GET/s per partitioned
//! prefix), `min_rate` 1/s, `max_rate` 20000/s, `increase` 10/s per second, `decrease` 0.5,
//! `cooldown` 500 ms, `burst_seconds` 0.25, `jitter` 0.2, node signal on (read every 50 ms),
//! no declared prefix limit.
//! The `SHARDSTREAM_SHAPING*` variables ([`ShapingConfig::from_env`]) change them; the
//! declared prefix limit only for datasets' reads.
//!
//! ```
//! use shardstream_storage::shaping::ShapingConfig;
//! let config = ShapingConfig { start_rate: 100.0, ..ShapingConfig::default() };
//! assert!(config.enabled);
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use rand::Rng;

use crate::env::Env;
use crate::error::{Result, StorageError};

mod signal;

pub use signal::{FileSignal, MemorySignal, NodeSignal, SignalError, SIGNAL_DIR};

/// `0`/`off`/`false` turns shaping off; on by default.
pub const SHAPING_ENV: &str = "SHARDSTREAM_SHAPING";
/// Starting rate of a prefix, attempts per second per process.
pub const START_RATE_ENV: &str = "SHARDSTREAM_SHAPING_START_RATE";
/// Lowest rate a prefix is decreased to.
pub const MIN_RATE_ENV: &str = "SHARDSTREAM_SHAPING_MIN_RATE";
/// Highest rate a prefix is increased to.
pub const MAX_RATE_ENV: &str = "SHARDSTREAM_SHAPING_MAX_RATE";
/// Additive increase, attempts per second gained per second without throttling.
pub const INCREASE_ENV: &str = "SHARDSTREAM_SHAPING_INCREASE";
/// Multiplicative decrease on throttling, in (0, 1).
pub const DECREASE_ENV: &str = "SHARDSTREAM_SHAPING_DECREASE";
/// Processes of this node that share its rates (see [`node_processes`]).
pub const PROCESSES_ENV: &str = "SHARDSTREAM_SHAPING_PROCESSES";
/// The store's request limit per prefix for the whole job, attempts per second, when the user
/// knows it (see [`ShapingConfig::prefix_limit`]); unset: unknown. Read by
/// [`declared_prefix_limit`] for datasets' reads only, not by [`ShapingConfig::from_env`].
pub const PREFIX_LIMIT_ENV: &str = "SHARDSTREAM_SHAPING_PREFIX_LIMIT";
/// Fraction of a declared prefix limit the job aims at (see [`ShapingConfig::prefix_limit`]).
///
/// The ceiling is a steady rate; what the store counts in its window can exceed it: each
/// process saves up a burst (`burst_seconds` of its rate, at least one token) that it spends
/// at once after a pause, jitter and DataLoader restarts bunch the processes' attempts, and a
/// documented limit is approximate ("at least 5,500" for S3). AIMD itself never probes above
/// the ceiling (it is `max_rate`), and retries take tokens like any attempt. The price is
/// 10 % of what the prefix would serve.
pub const PREFIX_LIMIT_HEADROOM: f64 = 0.9;
/// DataLoader workers per rank, for the node's process count when
/// [`PROCESSES_ENV`] is not set.
pub const WORKERS_ENV: &str = "SHARDSTREAM_SHAPING_WORKERS";
/// Ranks on this node, as torchrun sets it.
pub const LOCAL_WORLD_SIZE_ENV: &str = "LOCAL_WORLD_SIZE";
/// Ranks of the job, as torchrun sets it.
pub const WORLD_SIZE_ENV: &str = "WORLD_SIZE";
/// The node's folder, shared by the node's processes, where they keep the node's throttle
/// signal (see "Node signal" in the module docs); `off` turns the signal off. When unset, the
/// folder the streamer resolves for its cache ([`use_node_folder`]).
pub const NODE_DIR_ENV: &str = "SHARDSTREAM_SHAPING_NODE_DIR";
/// Most processes a node's rates are divided among.
const MAX_PROCESSES: u32 = 1 << 20;

/// Most prefixes tracked at once; idle ones are forgotten beyond it.
const MAX_PREFIXES: usize = 10_000;
/// A prefix unused this long is forgotten when the table is full.
const IDLE: Duration = Duration::from_secs(30);

/// Parameters of the limiter (see the module docs for what each does).
#[derive(Debug, Clone, PartialEq)]
pub struct ShapingConfig {
    /// Whether attempts are shaped at all.
    pub enabled: bool,
    /// Rate of a prefix first seen, attempts per second.
    pub start_rate: f64,
    /// Floor of the rate.
    pub min_rate: f64,
    /// Ceiling of the rate.
    pub max_rate: f64,
    /// Attempts per second gained per second of unthrottled use.
    pub increase: f64,
    /// Factor applied to the rate on throttling.
    pub decrease: f64,
    /// At most one decrease per this long per prefix.
    pub cooldown: Duration,
    /// Tokens saved up, in seconds of the current rate.
    pub burst_seconds: f64,
    /// Waits are stretched by a random factor in `[1, 1 + jitter]`.
    pub jitter: f64,
    /// Whether the node's processes share their throttling (see "Node signal" in the module
    /// docs): a decrease of one is a decrease of all, for the same prefix.
    pub node_signal: bool,
    /// The node's folder, for the signal's files; `None`: the folder registered with
    /// [`use_node_folder`] (by the streamer, once it has resolved its node folder), if any.
    pub node_dir: Option<PathBuf>,
    /// A process reads the node's signal of a prefix at most once per this long.
    pub node_poll: Duration,
    /// The store's request limit per prefix, attempts per second for the *whole job*, when the
    /// user declares it ([`PREFIX_LIMIT_ENV`], put on the configuration of datasets' reads only:
    /// see "Declared prefix limit" in the module docs); `None` (the default, and always from
    /// [`ShapingConfig::from_env`]): unknown, and AIMD finds
    /// the limit by its `503`s, which holds a prefix *at* its limit, not under it. When set,
    /// [`ShapingConfig::shared_by`] caps each process's `max_rate` (and `start_rate`) at its
    /// share of [`PREFIX_LIMIT_HEADROOM`] x the limit, so that the job stays under it without
    /// any communication; AIMD still runs below that ceiling (other tenants' load still
    /// throttles). Not defaulted for S3: its 5,500 GET/s is a floor per partitioned prefix, and
    /// S3 partitions a busy prefix further, so a ceiling would forgo what it would serve.
    pub prefix_limit: Option<f64>,
}

impl Default for ShapingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            start_rate: 2000.0,
            min_rate: 1.0,
            max_rate: 20_000.0,
            increase: 10.0,
            decrease: 0.5,
            cooldown: Duration::from_millis(500),
            burst_seconds: 0.25,
            jitter: 0.2,
            node_signal: true,
            node_dir: None,
            node_poll: Duration::from_millis(50),
            prefix_limit: None,
        }
    }
}

impl ShapingConfig {
    /// The defaults, changed by the `SHARDSTREAM_SHAPING*` variables of `env`, shared by the
    /// node's processes and the job's nodes ([`ShapingConfig::shared_by`]); a value that does
    /// not parse or is out of range is a configuration error naming the variable.
    ///
    /// The declared prefix limit ([`PREFIX_LIMIT_ENV`]) is *not* read here: this is the
    /// configuration of every store a process opens (checkpoints, uploads, transfers), where
    /// one process may use a prefix alone. Datasets' reads add it
    /// ([`ShapingConfig::from_env_with_prefix_limit`] with [`declared_prefix_limit`]).
    pub fn from_env(env: &Env) -> Result<Self> {
        Self::from_env_with_prefix_limit(env, None)
    }

    /// [`ShapingConfig::from_env`] with `prefix_limit` declared for the whole job
    /// ([`ShapingConfig::prefix_limit`]): each process's rates are capped at its share of it.
    /// For the stores of a prefix that all the job's processes share evenly: the streamer
    /// opens datasets with `declared_prefix_limit(env)` here. A limit that is not a positive
    /// number is a configuration error naming [`PREFIX_LIMIT_ENV`].
    ///
    /// ```
    /// use shardstream_storage::shaping::{declared_prefix_limit, ShapingConfig, PREFIX_LIMIT_ENV};
    /// use shardstream_storage::Env;
    /// let env = Env::from_pairs([(PREFIX_LIMIT_ENV, "5500"), ("LOCAL_WORLD_SIZE", "8")]);
    /// // Every store: the node share only.
    /// assert_eq!(ShapingConfig::from_env(&env).unwrap().max_rate, 20_000.0 / 8.0);
    /// // A dataset's reads: capped at 0.9 x 5,500 / 8.
    /// let limit = declared_prefix_limit(&env).unwrap();
    /// let reads = ShapingConfig::from_env_with_prefix_limit(&env, limit).unwrap();
    /// assert!((reads.max_rate - 0.9 * 5500.0 / 8.0).abs() < 1e-9);
    /// ```
    pub fn from_env_with_prefix_limit(env: &Env, prefix_limit: Option<f64>) -> Result<Self> {
        let mut config = Self::default();
        if let Some(v) = env.get(SHAPING_ENV).filter(|v| !v.trim().is_empty()) {
            config.enabled = match v.trim().to_ascii_lowercase().as_str() {
                "0" | "off" | "false" | "no" => false,
                "1" | "on" | "true" | "yes" => true,
                _ => return Err(bad(SHAPING_ENV, "expected on or off")),
            };
        }
        let number = |var: &'static str, current: f64| -> Result<f64> {
            let positive = |x: &f64| x.is_finite() && *x > 0.0;
            Ok(env_value(env, var, positive, "expected a positive number")?.unwrap_or(current))
        };
        config.start_rate = number(START_RATE_ENV, config.start_rate)?;
        config.min_rate = number(MIN_RATE_ENV, config.min_rate)?;
        config.max_rate = number(MAX_RATE_ENV, config.max_rate)?;
        config.increase = number(INCREASE_ENV, config.increase)?;
        config.decrease = number(DECREASE_ENV, config.decrease)?;
        config.prefix_limit = prefix_limit;
        if let Some(v) = env
            .get(NODE_DIR_ENV)
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            match v.to_ascii_lowercase().as_str() {
                "0" | "off" | "false" | "no" => config.node_signal = false,
                _ => config.node_dir = Some(PathBuf::from(v)),
            }
        }
        config.check()?;
        let config = config.shared_by(node_processes(env)?, job_nodes(env)?);
        config.check()?;
        Ok(config)
    }

    /// The parameters of one of `processes` processes of a node, one of `nodes` nodes of a
    /// job: `start_rate`, `min_rate` and `max_rate` divided by `processes` (so that a node's
    /// processes add up to one limiter), `increase` by `processes x nodes` (so that the whole
    /// job regains `increase` per second: each node's decreases are its own (each process's,
    /// without the node signal), and uncorrelated decreases only hold a prefix near its limit
    /// when the sum of the increases is small; see `docs/scale.md`). With a declared
    /// [`ShapingConfig::prefix_limit`], `max_rate` is further capped at the process's share
    /// of it ([`ShapingConfig::prefix_ceiling`]), and `start_rate` and `min_rate` with it.
    /// `shared_by(1, 1)` is `self` when no limit is declared.
    ///
    /// ```
    /// use shardstream_storage::shaping::ShapingConfig;
    /// // 512 nodes x 8 ranks x (8 workers + 1) under a declared 5,500 GET/s.
    /// let job = ShapingConfig { prefix_limit: Some(5500.0), ..ShapingConfig::default() };
    /// let process = job.shared_by(72, 512);
    /// assert!((process.max_rate * 72.0 * 512.0 - 0.9 * 5500.0).abs() < 1e-6);
    /// assert!(process.min_rate <= process.start_rate && process.start_rate <= process.max_rate);
    /// ```
    pub fn shared_by(&self, processes: u32, nodes: u32) -> Self {
        let n = f64::from(processes.max(1));
        let mut shared = Self {
            start_rate: self.start_rate / n,
            min_rate: self.min_rate / n,
            max_rate: self.max_rate / n,
            increase: self.increase / (n * f64::from(nodes.max(1))),
            ..self.clone()
        };
        if let Some(ceiling) = self.prefix_ceiling(processes, nodes) {
            shared.max_rate = shared.max_rate.min(ceiling);
            shared.start_rate = shared.start_rate.min(ceiling);
            shared.min_rate = shared.min_rate.min(ceiling);
        }
        shared
    }

    /// The most attempts per second one of `processes` processes of each of `nodes` nodes
    /// makes on a prefix under the declared [`ShapingConfig::prefix_limit`]:
    /// `prefix_limit x PREFIX_LIMIT_HEADROOM / (processes x nodes)`; `None` when none is
    /// declared.
    pub fn prefix_ceiling(&self, processes: u32, nodes: u32) -> Option<f64> {
        let job = f64::from(processes.max(1)) * f64::from(nodes.max(1));
        self.prefix_limit
            .map(|limit| limit * PREFIX_LIMIT_HEADROOM / job)
    }

    /// Refuses parameters the limiter cannot run with.
    pub fn check(&self) -> Result<()> {
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err(bad(DECREASE_ENV, "must be between 0 and 1"));
        }
        if !(self.min_rate > 0.0 && self.min_rate <= self.max_rate) {
            return Err(bad(
                MIN_RATE_ENV,
                "must be positive and at most the maximum rate",
            ));
        }
        if !(self.min_rate..=self.max_rate).contains(&self.start_rate) {
            return Err(bad(
                START_RATE_ENV,
                "must lie between the minimum and maximum rates",
            ));
        }
        if self
            .prefix_limit
            .is_some_and(|limit| !(limit.is_finite() && limit > 0.0))
        {
            return Err(bad(PREFIX_LIMIT_ENV, "must be a positive number"));
        }
        let finite_non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if ![self.burst_seconds, self.jitter, self.increase]
            .into_iter()
            .all(finite_non_negative)
        {
            return Err(bad(
                SHAPING_ENV,
                "burst, jitter and increase must be finite and >= 0",
            ));
        }
        Ok(())
    }

    /// The limiter of this process for this configuration, or `None` when shaping is off.
    pub fn shaper(&self) -> Option<Arc<Shaper>> {
        if !self.enabled {
            return None;
        }
        static SHAPERS: OnceLock<Mutex<Vec<Arc<Shaper>>>> = OnceLock::new();
        let mut shapers = SHAPERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = shapers.iter().find(|s| s.config == *self) {
            return Some(Arc::clone(found));
        }
        let shaper = Arc::new(Shaper::new(self.clone()));
        shapers.push(Arc::clone(&shaper));
        Some(shaper)
    }
}

/// The node folder registered by [`use_node_folder`].
static NODE_FOLDER: OnceLock<PathBuf> = OnceLock::new();

/// Names the node's folder (`<cache-root>/<run-id>/<node-rank>/`, as `shardstream_identity::
/// locate` resolves it) for the throttle signal of this process's limiters whose
/// configuration names none ([`ShapingConfig::node_dir`]). The streamer calls it once it has
/// resolved its folder; the first call of a process wins, later ones are ignored.
pub fn use_node_folder(dir: &Path) {
    if NODE_FOLDER.set(dir.to_path_buf()).is_ok() {
        tracing::debug!(dir = %dir.display(), "request shaping shares throttling with the node");
    }
}

/// The store's request limit per prefix that the user declares for the whole job
/// ([`PREFIX_LIMIT_ENV`], attempts per second), `None` when unset or blank; a value that is
/// not a positive number is a configuration error naming the variable. The one reader of the
/// variable; the streamer puts it on its datasets' configuration
/// ([`ShapingConfig::from_env_with_prefix_limit`]), [`ShapingConfig::from_env`] ignores it.
pub fn declared_prefix_limit(env: &Env) -> Result<Option<f64>> {
    env_value(
        env,
        PREFIX_LIMIT_ENV,
        |x: &f64| x.is_finite() && *x > 0.0,
        "expected a positive number of requests per second for the whole job",
    )
}

/// Processes of this node that shape requests with their own limiter: `SHARDSTREAM_SHAPING_
/// PROCESSES` when set, else `LOCAL_WORLD_SIZE x (SHARDSTREAM_SHAPING_WORKERS + 1)` when
/// `LOCAL_WORLD_SIZE` is set, else 1. A value that does not parse, is 0 or over 2^20 (or a
/// product over it) is a configuration error naming the variable.
pub fn node_processes(env: &Env) -> Result<u32> {
    let count = |var: &'static str, least: u32| -> Result<Option<u32>> {
        let in_range = |n: &u32| (least..=MAX_PROCESSES).contains(n);
        env_value(env, var, in_range, "expected a whole number of processes")
    };
    if let Some(n) = count(PROCESSES_ENV, 1)? {
        return Ok(n);
    }
    let Some(ranks) = count(LOCAL_WORLD_SIZE_ENV, 1)? else {
        return Ok(1);
    };
    let workers = count(WORKERS_ENV, 0)?.unwrap_or(0);
    workers
        .checked_add(1)
        .and_then(|w| w.checked_mul(ranks))
        .filter(|n| *n <= MAX_PROCESSES)
        .ok_or_else(|| bad(PROCESSES_ENV, "more processes on the node than 2^20"))
}

/// Nodes of the job: torchrun's `WORLD_SIZE / LOCAL_WORLD_SIZE` when both are set, else 1.
pub fn job_nodes(env: &Env) -> Result<u32> {
    let get = |var: &'static str| -> Result<Option<u32>> {
        env_value(
            env,
            var,
            |n: &u32| *n >= 1,
            "expected a positive whole number",
        )
    };
    match (get(WORLD_SIZE_ENV)?, get(LOCAL_WORLD_SIZE_ENV)?) {
        (Some(world), Some(local)) => Ok((world / local).max(1)),
        _ => Ok(1),
    }
}

/// `var` of `env` parsed, `None` when unset or blank; a value that does not parse or that
/// `accept` refuses is a configuration error naming the variable and saying what was expected.
fn env_value<T: std::str::FromStr>(
    env: &Env,
    var: &'static str,
    accept: impl Fn(&T) -> bool,
    expected: &str,
) -> Result<Option<T>> {
    match env.get(var).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .ok()
            .filter(accept)
            .map(Some)
            .ok_or_else(|| bad(var, expected)),
    }
}

fn bad(setting: &'static str, reason: &str) -> StorageError {
    StorageError::Config {
        url: setting.to_string(),
        reason: reason.to_string(),
    }
}

/// One prefix's state.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    refilled: Instant,
    decreased: Option<Instant>,
    used: Instant,
    /// When the node's signal was last read.
    polled: Option<Instant>,
    /// The latest node throttle time this process acted on or published.
    seen: Option<Instant>,
}

/// What a prefix's state looks like now (for tests, logs and simulators).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixState {
    /// Current rate, attempts per second.
    pub rate: f64,
    /// Decreases so far.
    pub decreases: u64,
}

/// The limiter: per-prefix token buckets with AIMD rates. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Shaper {
    config: ShapingConfig,
    buckets: Mutex<HashMap<String, (Bucket, u64)>>,
    /// The node's signal given at construction (its folder, or a caller's signal).
    signal: Option<Arc<dyn NodeSignal>>,
    /// The signal of the folder registered later with [`use_node_folder`].
    registered: OnceLock<Arc<dyn NodeSignal>>,
}

impl Shaper {
    /// A limiter with no prefix seen yet; with the node's signal in `config.node_dir` when it
    /// names one (else in the folder [`use_node_folder`] registers), unless
    /// `config.node_signal` is off.
    pub fn new(config: ShapingConfig) -> Self {
        let signal = match (&config.node_dir, config.node_signal) {
            (Some(dir), true) => Some(Arc::new(FileSignal::new(dir)) as Arc<dyn NodeSignal>),
            _ => None,
        };
        Self {
            config,
            buckets: Mutex::new(HashMap::new()),
            signal,
            registered: OnceLock::new(),
        }
    }

    /// A limiter that shares its throttling through `signal` (the processes of one node, each
    /// with its own limiter and the same signal), whatever `config.node_dir` says.
    pub fn with_signal(config: ShapingConfig, signal: Arc<dyn NodeSignal>) -> Self {
        Self {
            signal: config.node_signal.then_some(signal),
            ..Self::new(ShapingConfig {
                node_dir: None,
                ..config
            })
        }
    }

    /// The node's signal, if this limiter has one.
    fn signal(&self) -> Option<&Arc<dyn NodeSignal>> {
        if let Some(signal) = &self.signal {
            return Some(signal);
        }
        if !self.config.node_signal || self.config.node_dir.is_some() {
            return None;
        }
        if let Some(signal) = self.registered.get() {
            return Some(signal);
        }
        let dir = NODE_FOLDER.get()?;
        Some(
            self.registered
                .get_or_init(|| Arc::new(FileSignal::new(dir)) as Arc<dyn NodeSignal>),
        )
    }

    /// Its parameters.
    pub fn config(&self) -> &ShapingConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Bucket, u64)>> {
        self.buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a token of `prefix` at `now`; returns how long the caller must wait for it
    /// (before jitter).
    pub fn reserve(&self, prefix: &str, now: Instant) -> Duration {
        self.follow_node(prefix, now);
        let config = &self.config;
        let mut buckets = self.lock();
        if buckets.len() >= MAX_PREFIXES && !buckets.contains_key(prefix) {
            buckets.retain(|_, (b, _)| now.saturating_duration_since(b.used) < IDLE);
            if buckets.len() >= MAX_PREFIXES {
                tracing::debug!(prefix, "request shaping table full; attempt not shaped");
                return Duration::ZERO;
            }
        }
        let (bucket, _) = buckets.entry(prefix.to_string()).or_insert_with(|| {
            let rate = config.start_rate;
            (
                Bucket {
                    rate,
                    tokens: (config.burst_seconds * rate).max(1.0),
                    refilled: now,
                    decreased: None,
                    used: now,
                    polled: None,
                    seen: None,
                },
                0,
            )
        });
        let capacity = (config.burst_seconds * bucket.rate).max(1.0);
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * bucket.rate).min(capacity);
        bucket.refilled = now;
        bucket.used = now;
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((-bucket.tokens / bucket.rate).min(3600.0))
        }
    }

    /// An attempt on `prefix` was answered without throttling: additive increase.
    pub fn succeeded(&self, prefix: &str) {
        self.succeeded_many(prefix, 1.0);
    }

    /// `attempts` attempts on `prefix` were answered without throttling, at about the same
    /// rate: `attempts x increase / rate` added at once. For fluid models (the scale
    /// simulator), where `attempts` is a fraction.
    pub fn succeeded_many(&self, prefix: &str, attempts: f64) {
        let config = &self.config;
        if let Some((bucket, _)) = self.lock().get_mut(prefix) {
            bucket.rate =
                (bucket.rate + attempts * config.increase / bucket.rate).min(config.max_rate);
        }
    }

    /// An attempt on `prefix` was throttled at `now`: multiplicative decrease, at most once
    /// per cooldown. Returns whether the rate was decreased.
    pub fn throttled(&self, prefix: &str, now: Instant) -> bool {
        let config = &self.config;
        let mut buckets = self.lock();
        let Some((bucket, decreases)) = buckets.get_mut(prefix) else {
            return false;
        };
        if bucket
            .decreased
            .is_some_and(|at| now.saturating_duration_since(at) < config.cooldown)
        {
            return false;
        }
        let before = bucket.rate;
        decrease(config, bucket, decreases, now);
        bucket.seen = bucket.seen.max(Some(now));
        tracing::debug!(
            prefix,
            before,
            after = bucket.rate,
            "store throttled; rate decreased"
        );
        drop(buckets);
        if let Some(signal) = self.signal() {
            signal.publish(prefix, now);
        }
        true
    }

    /// Reads the node's signal of `prefix` (at most once per `node_poll`) and, when another
    /// process of the node decreased its rate for it within the last cooldown and this one
    /// has not decreased during that episode, decreases this one's as of then. Returns whether
    /// it did. [`Shaper::reserve`] calls it before each token; a fluid model calls it each step.
    pub fn follow_node(&self, prefix: &str, now: Instant) -> bool {
        let Some(signal) = self.signal() else {
            return false;
        };
        {
            let mut buckets = self.lock();
            let Some((bucket, _)) = buckets.get_mut(prefix) else {
                return false;
            };
            if bucket
                .polled
                .is_some_and(|at| now.saturating_duration_since(at) < self.config.node_poll)
            {
                return false;
            }
            bucket.polled = Some(now);
        }
        // Read without the lock: a file read must not hold up the process's other prefixes.
        let Some(at) = signal.last(prefix) else {
            return false;
        };
        let config = &self.config;
        let mut buckets = self.lock();
        let Some((bucket, decreases)) = buckets.get_mut(prefix) else {
            return false;
        };
        if bucket.seen.is_some_and(|seen| at <= seen) {
            return false;
        }
        bucket.seen = Some(at);
        // A signal from another clock a little ahead counts as now.
        let at = at.min(now);
        if now.saturating_duration_since(at) >= config.cooldown {
            // An old episode (the file of a previous one, or this process started since).
            return false;
        }
        if let Some(own) = bucket.decreased {
            // Decreased during the same episode, before or after the other process.
            let apart = if own > at { own - at } else { at - own };
            if apart < config.cooldown {
                return false;
            }
        }
        let before = bucket.rate;
        decrease(config, bucket, decreases, at);
        tracing::debug!(
            prefix,
            before,
            after = bucket.rate,
            "node throttled; rate decreased"
        );
        true
    }

    /// The state of `prefix`, if it was seen.
    pub fn state(&self, prefix: &str) -> Option<PrefixState> {
        self.lock().get(prefix).map(|(b, decreases)| PrefixState {
            rate: b.rate,
            decreases: *decreases,
        })
    }

    /// Waits for a token of `prefix`, with jitter.
    pub async fn acquire(&self, prefix: &str) {
        let wait = self.reserve(prefix, Instant::now());
        if wait.is_zero() {
            return;
        }
        let stretch = 1.0 + rand::rng().random_range(0.0..=self.config.jitter.max(0.0));
        tokio::time::sleep(wait.mul_f64(stretch)).await;
    }
}

/// The multiplicative decrease of `bucket` as of `at`.
fn decrease(config: &ShapingConfig, bucket: &mut Bucket, decreases: &mut u64, at: Instant) {
    bucket.rate = (bucket.rate * config.decrease).max(config.min_rate);
    bucket.tokens = bucket.tokens.min(0.0);
    bucket.decreased = Some(at);
    *decreases = decreases.saturating_add(1);
}

/// The prefix of a request URL: authority and path up to the last `/`.
pub fn prefix_of(uri: &str) -> &str {
    let without_query = uri.split(['?', '#']).next().unwrap_or(uri);
    let start = without_query.find("://").map_or(0, |i| i + 3);
    match without_query.get(start..).and_then(|rest| rest.rfind('/')) {
        Some(slash) => without_query
            .get(..start + slash + 1)
            .unwrap_or(without_query),
        None => without_query,
    }
}

/// `object_store`'s HTTP client with every attempt passing through a [`Shaper`].
#[derive(Debug)]
pub struct ShapingConnector {
    shaper: Arc<Shaper>,
}

impl ShapingConnector {
    /// A connector whose clients shape their attempts with `shaper`.
    pub fn new(shaper: Arc<Shaper>) -> Self {
        Self { shaper }
    }
}

impl HttpConnector for ShapingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(ShapedService {
            inner,
            shaper: Arc::clone(&self.shaper),
        }))
    }
}

#[derive(Debug)]
struct ShapedService {
    inner: HttpClient,
    shaper: Arc<Shaper>,
}

#[async_trait]
impl HttpService for ShapedService {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        let uri = req.uri().to_string();
        let prefix = prefix_of(&uri);
        self.shaper.acquire(prefix).await;
        let response = self.inner.execute(req).await;
        if let Ok(response) = &response {
            let status = response.status().as_u16();
            if status == 503 || status == 429 {
                self.shaper.throttled(prefix, Instant::now());
            } else if status < 500 {
                self.shaper.succeeded(prefix);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ShapingConfig {
        ShapingConfig {
            start_rate: 10.0,
            burst_seconds: 0.0,
            ..ShapingConfig::default()
        }
    }

    #[test]
    fn a_single_process_keeps_the_defaults() {
        for pairs in [vec![], vec![("LOCAL_WORLD_SIZE", "1")]] {
            let env = Env::from_pairs(pairs);
            assert_eq!(node_processes(&env).unwrap(), 1);
            assert_eq!(
                ShapingConfig::from_env(&env).unwrap(),
                ShapingConfig::default()
            );
        }
    }

    #[test]
    fn the_processes_of_a_node_share_its_rates() {
        let env = Env::from_pairs([
            ("LOCAL_WORLD_SIZE", "8"),
            ("SHARDSTREAM_SHAPING_WORKERS", "7"),
        ]);
        assert_eq!(node_processes(&env).unwrap(), 64);
        let c = ShapingConfig::from_env(&env).unwrap();
        let d = ShapingConfig::default();
        assert_eq!(c.start_rate * 64.0, d.start_rate);
        assert_eq!(c.min_rate * 64.0, d.min_rate);
        assert_eq!(c.max_rate * 64.0, d.max_rate);
        assert_eq!(c.increase * 64.0, d.increase);
        assert_eq!((c.decrease, c.cooldown), (d.decrease, d.cooldown));
        // The explicit count wins; ranks without workers count once each.
        let env = Env::from_pairs([
            ("LOCAL_WORLD_SIZE", "8"),
            ("SHARDSTREAM_SHAPING_PROCESSES", "3"),
        ]);
        assert_eq!(node_processes(&env).unwrap(), 3);
        assert_eq!(
            node_processes(&Env::from_pairs([("LOCAL_WORLD_SIZE", "4")])).unwrap(),
            4
        );
        // 4 nodes of 8 ranks: the job, not the node, regains `increase` per second.
        let env = Env::from_pairs([("LOCAL_WORLD_SIZE", "8"), ("WORLD_SIZE", "32")]);
        assert_eq!(job_nodes(&env).unwrap(), 4);
        let c = ShapingConfig::from_env(&env).unwrap();
        assert_eq!(c.start_rate * 8.0, d.start_rate);
        assert_eq!(c.increase * 32.0, d.increase);
        for bad in [
            vec![("SHARDSTREAM_SHAPING_PROCESSES", "0")],
            vec![("SHARDSTREAM_SHAPING_PROCESSES", "many")],
            vec![
                ("LOCAL_WORLD_SIZE", "4096"),
                ("SHARDSTREAM_SHAPING_WORKERS", "4096"),
            ],
        ] {
            let err = node_processes(&Env::from_pairs(bad)).unwrap_err();
            assert!(err.to_string().contains("SHARDSTREAM_SHAPING"), "{err}");
        }
    }

    #[test]
    fn prefix_is_the_directory_of_the_key() {
        assert_eq!(
            prefix_of("http://127.0.0.1:9/bucket/ds/p07/shard.00001.mds"),
            "http://127.0.0.1:9/bucket/ds/p07/"
        );
        assert_eq!(
            prefix_of("http://h/bucket?list-type=2&prefix=a/b/"),
            "http://h/"
        );
        assert_eq!(prefix_of("http://h"), "http://h");
    }

    #[test]
    fn a_bucket_paces_attempts_at_its_rate() {
        let shaper = Shaper::new(config());
        let t0 = Instant::now();
        assert_eq!(shaper.reserve("p", t0), Duration::ZERO);
        // Ten more at the same instant queue 0.1 s apart.
        let waits: Vec<_> = (0..10).map(|_| shaper.reserve("p", t0)).collect();
        assert_eq!(waits[0], Duration::from_millis(100));
        assert_eq!(waits[9], Duration::from_secs(1));
        // Another prefix is independent.
        assert_eq!(shaper.reserve("q", t0), Duration::ZERO);
    }

    #[test]
    fn throttling_halves_the_rate_once_per_cooldown_and_success_adds_back() {
        let shaper = Shaper::new(config());
        let t0 = Instant::now();
        shaper.reserve("p", t0);
        assert!(shaper.throttled("p", t0));
        assert!(!shaper.throttled("p", t0 + Duration::from_millis(100)));
        assert_eq!(shaper.state("p").unwrap().rate, 5.0);
        assert!(shaper.throttled("p", t0 + Duration::from_millis(600)));
        assert_eq!(shaper.state("p").unwrap().rate, 2.5);
        // Each success adds increase / rate: about `increase` per second at that rate.
        shaper.succeeded("p");
        assert_eq!(shaper.state("p").unwrap().rate, 2.5 + 10.0 / 2.5);
        assert_eq!(shaper.state("p").unwrap().decreases, 2);
        let capped = Shaper::new(ShapingConfig {
            max_rate: 100.0,
            ..config()
        });
        capped.reserve("p", t0);
        for _ in 0..1_000 {
            capped.succeeded("p");
        }
        assert_eq!(capped.state("p").unwrap().rate, 100.0);
    }

    #[test]
    fn the_rate_never_falls_below_the_floor() {
        let shaper = Shaper::new(config());
        let mut t = Instant::now();
        shaper.reserve("p", t);
        for _ in 0..100 {
            t += Duration::from_secs(1);
            shaper.throttled("p", t);
        }
        assert_eq!(shaper.state("p").unwrap().rate, 1.0);
    }

    #[test]
    fn settings_come_from_the_environment_and_bad_ones_name_their_variable() {
        let env = Env::from_pairs([(SHAPING_ENV, "off"), (START_RATE_ENV, "300")]);
        let c = ShapingConfig::from_env(&env).unwrap();
        assert!(!c.enabled);
        assert_eq!(c.start_rate, 300.0);
        assert!(c.shaper().is_none());
        let env = Env::from_pairs([(DECREASE_ENV, "1.5")]);
        let err = ShapingConfig::from_env(&env).unwrap_err();
        assert!(err.to_string().contains(DECREASE_ENV), "{err}");
        let env = Env::from_pairs([(START_RATE_ENV, "lots")]);
        assert!(ShapingConfig::from_env(&env).is_err());
        assert!(
            ShapingConfig::from_env(&Env::from_pairs::<_, &str, &str>([]))
                .unwrap()
                .enabled
        );
    }

    /// 512 nodes x 8 ranks x 8 workers (72 processes a node) under a declared 5,500/s.
    fn declared_512() -> Env {
        Env::from_pairs([
            ("LOCAL_WORLD_SIZE", "8"),
            ("WORLD_SIZE", "4096"),
            ("SHARDSTREAM_SHAPING_WORKERS", "8"),
            (PREFIX_LIMIT_ENV, "5500"),
        ])
    }

    /// A dataset's reads: the environment's configuration with its declared limit.
    fn dataset_reads(env: &Env) -> Result<ShapingConfig> {
        ShapingConfig::from_env_with_prefix_limit(env, declared_prefix_limit(env)?)
    }

    #[test]
    fn a_declared_prefix_limit_comes_from_the_environment_and_bad_ones_name_it() {
        let env = Env::from_pairs([(PREFIX_LIMIT_ENV, " 3500.5 ")]);
        assert_eq!(declared_prefix_limit(&env).unwrap(), Some(3500.5));
        assert_eq!(dataset_reads(&env).unwrap().prefix_limit, Some(3500.5));
        // Unset or blank: no limit declared, and the defaults are untouched.
        for pairs in [vec![], vec![(PREFIX_LIMIT_ENV, "  ")]] {
            let env = Env::from_pairs(pairs);
            assert_eq!(declared_prefix_limit(&env).unwrap(), None);
            assert_eq!(dataset_reads(&env).unwrap(), ShapingConfig::default());
        }
        for value in ["0", "-5500", "NaN", "inf", "lots", "5,500"] {
            let err =
                declared_prefix_limit(&Env::from_pairs([(PREFIX_LIMIT_ENV, value)])).unwrap_err();
            assert!(err.to_string().contains(PREFIX_LIMIT_ENV), "{value}: {err}");
        }
        // A limit given in code is checked the same way, on its own or on a configuration.
        for limit in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = ShapingConfig::from_env_with_prefix_limit(&Env::default(), Some(limit))
                .unwrap_err();
            assert!(err.to_string().contains(PREFIX_LIMIT_ENV), "{limit}: {err}");
            let c = ShapingConfig {
                prefix_limit: Some(limit),
                ..ShapingConfig::default()
            };
            let err = c.check().unwrap_err();
            assert!(err.to_string().contains(PREFIX_LIMIT_ENV), "{limit}: {err}");
        }
    }

    #[test]
    fn from_env_ignores_a_declared_prefix_limit() {
        // Every store of a process (checkpoints, uploads, transfers) gets the node share only,
        // whatever the variable says, even a value that would not parse: only datasets' reads
        // read it.
        let mut pairs = vec![
            ("LOCAL_WORLD_SIZE", "8"),
            ("WORLD_SIZE", "4096"),
            ("SHARDSTREAM_SHAPING_WORKERS", "8"),
        ];
        let plain = ShapingConfig::from_env(&Env::from_pairs(pairs.clone())).unwrap();
        assert_eq!(plain, ShapingConfig::default().shared_by(72, 512));
        for value in ["5500", "0.001", "lots"] {
            pairs.push((PREFIX_LIMIT_ENV, value));
            let c = ShapingConfig::from_env(&Env::from_pairs(pairs.clone())).unwrap();
            assert_eq!(c, plain, "{value}");
            assert_eq!(c.prefix_limit, None);
            pairs.pop();
        }
        // The same environment's dataset reads are capped.
        let reads = dataset_reads(&declared_512()).unwrap();
        assert_eq!(reads.prefix_limit, Some(5500.0));
        assert_eq!(reads.max_rate, reads.prefix_ceiling(72, 512).unwrap());
        assert!(reads.max_rate < plain.max_rate);
    }

    #[test]
    fn a_declared_prefix_limit_caps_each_process_at_its_share_of_the_job() {
        let c = dataset_reads(&declared_512()).unwrap();
        let ceiling = 5500.0 * PREFIX_LIMIT_HEADROOM / (72.0 * 512.0);
        assert_eq!(c.prefix_ceiling(72, 512), Some(ceiling));
        assert_eq!(c.max_rate, ceiling);
        assert_eq!(c.start_rate, ceiling);
        assert!(c.min_rate <= c.max_rate);
        // The node share and the job's increase are as without a declared limit.
        let d = ShapingConfig::default();
        assert_eq!(c.min_rate * 72.0, d.min_rate);
        assert_eq!(c.increase * 72.0 * 512.0, d.increase);
        // A limit above what the rates reach changes nothing; one below the floor lowers it.
        let high = ShapingConfig {
            prefix_limit: Some(1e9),
            ..d.clone()
        };
        let shared = high.shared_by(8, 2);
        assert_eq!(
            (shared.start_rate, shared.min_rate, shared.max_rate),
            (d.start_rate / 8.0, d.min_rate / 8.0, d.max_rate / 8.0)
        );
        let tiny = ShapingConfig {
            prefix_limit: Some(10.0),
            ..d.clone()
        };
        let shared = tiny.shared_by(72, 512);
        assert!(shared.check().is_ok());
        assert_eq!(shared.min_rate, shared.max_rate);
        // A single process gets 0.9 of the limit; without one declared, itself.
        let one = ShapingConfig {
            prefix_limit: Some(100.0),
            ..d.clone()
        };
        assert_eq!(one.shared_by(1, 1).max_rate, 90.0);
        assert_eq!(d.shared_by(1, 1), d);
    }

    #[test]
    fn the_limiter_never_exceeds_the_declared_ceiling() {
        let c = dataset_reads(&declared_512()).unwrap();
        let ceiling = c.max_rate;
        let shaper = Shaper::new(ShapingConfig {
            node_signal: false,
            ..c
        });
        // Additive increase stops at the ceiling, whatever the number of successes.
        let t0 = Instant::now();
        shaper.reserve("p", t0);
        for _ in 0..10_000 {
            shaper.succeeded("p");
        }
        assert_eq!(shaper.state("p").unwrap().rate, ceiling);
        // A process always ready to send gets at most the ceiling's attempts (plus the one
        // token it starts with) over an hour.
        let hour = 3600.0;
        let mut now = t0;
        let mut attempts = 1u32;
        while now.duration_since(t0).as_secs_f64() < hour {
            now += shaper.reserve("p", now);
            shaper.succeeded("p");
            attempts += 1;
        }
        assert!(f64::from(attempts) <= ceiling * hour + 2.0, "{attempts}");
        assert!(f64::from(attempts) >= ceiling * hour - 2.0, "{attempts}");
        // AIMD still runs under the ceiling: a 503 halves the rate.
        assert!(shaper.throttled("p", now));
        assert_eq!(shaper.state("p").unwrap().rate, ceiling / 2.0);
    }

    /// Two processes of one node: two limiters sharing `signal`.
    fn two_of_a_node(signal: Arc<dyn NodeSignal>) -> (Shaper, Shaper) {
        let c = ShapingConfig {
            start_rate: 100.0,
            ..config()
        };
        (
            Shaper::with_signal(c.clone(), Arc::clone(&signal)),
            Shaper::with_signal(c, signal),
        )
    }

    #[test]
    fn a_throttle_of_one_process_decreases_the_node_once_per_cooldown() {
        let (a, b) = two_of_a_node(Arc::new(MemorySignal::new()));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        a.reserve("p", t0);
        b.reserve("p", t0);
        b.reserve("q", t0);
        assert!(a.throttled("p", ms(10)));
        // b reads the signal at its next token (its last read was at t0, over 50 ms ago).
        b.reserve("p", ms(60));
        assert_eq!(b.state("p").unwrap().rate, 50.0);
        assert_eq!(b.state("p").unwrap().decreases, 1);
        // Another prefix is not touched.
        b.reserve("q", ms(60));
        assert_eq!(b.state("q").unwrap().rate, 100.0);
        // The same episode: b's own 503 within the cooldown and a's further 503s are no more
        // decreases, nor are re-reads of the same signal.
        assert!(!b.throttled("p", ms(200)));
        assert!(!a.throttled("p", ms(300)));
        assert!(!b.follow_node("p", ms(400)));
        assert_eq!(a.state("p").unwrap().rate, 50.0);
        assert_eq!(b.state("p").unwrap().rate, 50.0);
        // The next episode, on b's side: a follows, once.
        assert!(b.throttled("p", ms(700)));
        assert!(a.follow_node("p", ms(710)));
        assert!(!a.follow_node("p", ms(800)));
        assert_eq!(a.state("p").unwrap().rate, 25.0);
        assert_eq!(a.state("p").unwrap().decreases, 2);
        // The signal is read at most once per node_poll: a throttle of a at 1,300 ms reaches
        // b at its first read 50 ms after its last one (at 1,260 ms).
        assert!(!b.follow_node("p", ms(1_260)));
        assert!(a.throttled("p", ms(1_300)));
        assert!(!b.follow_node("p", ms(1_301)));
        assert!(b.follow_node("p", ms(1_310)));
        assert_eq!(b.state("p").unwrap().rate, 12.5);
    }

    #[test]
    fn an_old_signal_or_none_leaves_a_process_on_its_own() {
        let signal = Arc::new(MemorySignal::new());
        let t0 = Instant::now();
        // A throttle of a process gone a minute ago is no reason to slow down.
        signal.publish("p", t0);
        let (a, _) = two_of_a_node(signal);
        let later = t0 + Duration::from_secs(60);
        a.reserve("p", later);
        assert!(!a.follow_node("p", later + Duration::from_secs(1)));
        assert_eq!(a.state("p").unwrap().rate, 100.0);
        // Without a signal (no node folder), behaviour is as before.
        let alone = Shaper::new(config());
        alone.reserve("p", t0);
        assert!(!alone.follow_node("p", t0 + Duration::from_secs(1)));
        // node_signal off: a given signal is not used.
        let off = Shaper::with_signal(
            ShapingConfig {
                node_signal: false,
                ..config()
            },
            Arc::new(MemorySignal::new()),
        );
        off.reserve("p", t0);
        assert!(off.throttled("p", t0));
        assert!(off.signal().is_none());
    }

    #[test]
    fn two_limiters_over_one_node_folder_share_their_throttling() {
        let dir = tempfile::tempdir().unwrap();
        let c = ShapingConfig {
            start_rate: 100.0,
            node_dir: Some(dir.path().to_path_buf()),
            ..config()
        };
        let (a, b) = (Shaper::new(c.clone()), Shaper::new(c));
        let t0 = Instant::now();
        a.reserve("p", t0);
        b.reserve("p", t0);
        assert!(a.throttled("p", t0 + Duration::from_millis(10)));
        assert!(b.follow_node("p", t0 + Duration::from_millis(60)));
        assert_eq!(b.state("p").unwrap().rate, 50.0);
        // A corrupt or missing file is no signal and no error.
        let file = FileSignal::new(dir.path()).path_of("p");
        std::fs::write(&file, b"garbage").unwrap();
        assert!(!b.follow_node("p", t0 + Duration::from_millis(120)));
        std::fs::remove_file(&file).unwrap();
        assert!(!b.follow_node("p", t0 + Duration::from_millis(180)));
        assert_eq!(b.reserve("p", t0 + Duration::from_secs(10)), Duration::ZERO);
        assert_eq!(b.state("p").unwrap().rate, 50.0);
    }

    #[test]
    fn a_dataset_limiter_is_its_own_and_shares_the_node_signal_with_the_others() {
        // A process with a declared limit has two limiters: its datasets' reads (capped) and
        // every other store's. They keep their own prefix states, and the node's signal, one
        // file per prefix, reaches both whichever was throttled.
        let dir = tempfile::tempdir().unwrap();
        let dir_value = dir.path().to_str().unwrap().to_string();
        let env = Env::from_pairs([
            ("LOCAL_WORLD_SIZE", "8"),
            ("WORLD_SIZE", "4096"),
            ("SHARDSTREAM_SHAPING_WORKERS", "8"),
            (PREFIX_LIMIT_ENV, "5500"),
            (NODE_DIR_ENV, dir_value.as_str()),
        ]);
        let reads = dataset_reads(&env).unwrap();
        let plain = ShapingConfig::from_env(&env).unwrap();
        assert_ne!(reads, plain);
        let (r, o) = (reads.shaper().unwrap(), plain.shaper().unwrap());
        assert!(!Arc::ptr_eq(&r, &o));
        assert!(Arc::ptr_eq(&r, &reads.shaper().unwrap()));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        r.reserve("p", t0);
        o.reserve("p", t0);
        assert_eq!(r.state("p").unwrap().rate, reads.start_rate);
        assert_eq!(o.state("p").unwrap().rate, plain.start_rate);
        assert!(r.throttled("p", ms(10)));
        assert!(o.follow_node("p", ms(60)));
        assert_eq!(o.state("p").unwrap().rate, plain.start_rate / 2.0);
        // And the other way round, the next episode.
        assert!(o.throttled("p", ms(700)));
        assert!(r.follow_node("p", ms(760)));
        assert_eq!(r.state("p").unwrap().rate, reads.start_rate / 4.0);
    }

    #[test]
    fn a_throttle_in_another_process_decreases_this_one() {
        // This test runs itself again as the other process, which is throttled on "p".
        const CHILD: &str = "SHARDSTREAM_TEST_NODE_SIGNAL_CHILD";
        let node = |dir: PathBuf| ShapingConfig {
            start_rate: 100.0,
            node_dir: Some(dir),
            // Long enough for a child process to start on a loaded machine.
            cooldown: Duration::from_secs(30),
            ..config()
        };
        if let Some(dir) = std::env::var_os(CHILD) {
            let other = Shaper::new(node(dir.into()));
            let now = Instant::now();
            other.reserve("p", now);
            assert!(other.throttled("p", now));
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let this = Shaper::new(node(dir.path().to_path_buf()));
        let t0 = Instant::now();
        this.reserve("p", t0);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "shaping::tests::a_throttle_in_another_process_decreases_this_one",
                "--test-threads=1",
            ])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        assert!(this.follow_node("p", Instant::now() + Duration::from_millis(100)));
        assert_eq!(this.state("p").unwrap().rate, 50.0);
    }

    #[test]
    fn the_node_folder_comes_from_the_environment() {
        let env = Env::from_pairs([(NODE_DIR_ENV, "/tmp/node")]);
        let c = ShapingConfig::from_env(&env).unwrap();
        assert_eq!(c.node_dir.as_deref(), Some(Path::new("/tmp/node")));
        assert!(c.node_signal);
        let c = ShapingConfig::from_env(&Env::from_pairs([(NODE_DIR_ENV, "off")])).unwrap();
        assert!(!c.node_signal && c.node_dir.is_none());
    }

    #[test]
    fn one_limiter_per_configuration_in_a_process() {
        let c = config();
        let a = c.shaper().unwrap();
        let b = c.shaper().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
