//! How a dataset is opened: [`StreamingConfig`] (Mosaic's argument names) and the one way a
//! dataset URL becomes a storage location.

use std::path::PathBuf;
use std::time::Duration;

use shardstream_identity::os_env;
use shardstream_storage::named_options::{self, NamedOptions};
use shardstream_storage::shaping::{self, ShapingConfig};
use shardstream_storage::{Env, Location, StorageOptions};

use crate::error::Result;
use crate::order::Sampling;
use crate::settings;

/// How to open a dataset. Field names follow mosaicml-streaming's `StreamingDataset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamingConfig {
    /// Dataset root: a local path, `file://`, `s3://`, `gs://` or `az://` URL holding an MDS
    /// `index.json`.
    pub remote: String,
    /// Subfolder of `remote` (Mosaic's `split`).
    pub split: Option<String>,
    /// Explicit cache folder (Mosaic's `local`). Else `<cache_root>/<run_id>/<node_rank>/` when a
    /// root is given, else `SHARDSTREAM_CACHE_DIR` as is (the folder `shardstream run` or the pod's
    /// volume keyed), else `<SHARDSTREAM_CACHE_ROOT or the default root>/<run_id>/<node_rank>/`.
    pub local: Option<PathBuf>,
    /// Cache root; see `local` (default root: `$XDG_CACHE_HOME/shardstream`,
    /// `$HOME/.cache/shardstream`, else `/tmp/shardstream-cache`).
    pub cache_root: Option<PathBuf>,
    /// Run id; else resolved as DESIGN §4 says (`SHARDSTREAM_RUN_ID`, job names,
    /// `TORCHELASTIC_RUN_ID`), else an error.
    pub run_id: Option<String>,
    /// Node rank; else resolved from the environment.
    pub node_rank: Option<u64>,
    /// Bytes of RAM for everything in flight and buffered; else `SHARDSTREAM_MEMORY_LIMIT`, else
    /// [`DEFAULT_MEMORY_LIMIT`].
    pub memory_limit: Option<u64>,
    /// Bytes of disk for the node's cache; else `SHARDSTREAM_CACHE_LIMIT`, else the shards the
    /// folder holds plus 80 % of its file system's free space at open
    /// ([`crate::cache::default_limit`]): always a real limit.
    pub cache_limit: Option<u64>,
    /// Copy `file://` and plain-path sources into the cache instead of reading them in place.
    pub copy_local: bool,
    /// Check the hashes the index records when a shard is fetched (and on reuse after a
    /// restart); sizes are always checked.
    pub validate_hash: bool,
    /// Allow `pkl` columns.
    pub allow_unsafe_types: bool,
    /// Which samples a stream whose epoch share is not a whole number of passes keeps: a fresh
    /// subset each epoch (Mosaic's default `sampling_method="balanced"`) or the same one.
    pub sampling: Sampling,
    /// The shards' format; else found from what lies at `remote` (`dataset::format`): tar
    /// names or a brace pattern in the URL, or a folder of tars without `index.json`, are
    /// WebDataset; an `index.json` is MDS.
    pub format: Option<super::ShardFormat>,
    /// Per-call storage options (endpoint, region, credentials...) by the names of
    /// `shardstream_storage::named_options`; they apply to every stream, before a stream's own.
    pub storage_options: NamedOptions,
}

impl StreamingConfig {
    /// How long transient storage failures (5xx, `SlowDown`, timeouts, a server that is down)
    /// of one shard are retried, counted from the first failed request since the last one that
    /// succeeded, before the fetch fails: `SHARDSTREAM_RETRY_WINDOW` (seconds), else
    /// [`DEFAULT_RETRY_WINDOW`] (120 s). It bounds all retry levels together: the storage
    /// client's own retries inside one request are clamped to it, and the streamer's retries
    /// of a range or a shard count against the same window, so an outage ends in an error
    /// after about one window. [`StreamingDataset::set_retry_window`] overrides it.
    pub fn retry_window(&self) -> Duration {
        settings::retry_window(&os_env)
    }
}

/// Opens a dataset URL with the storage client's own retries clamped to the retry window, so
/// that the two retry levels do not add up (see [`StreamingConfig::retry_window`]), the
/// per-call storage options applied, and the job's declared prefix limit on its reads
/// ([`dataset_shaping`]). Every dataset the streamer opens from a URL comes through here
/// (`StreamingDataset::open` and `open_streams`, and their reopening after a fork).
pub(super) fn open_url(
    url: &str,
    storage_options: &[(String, String)],
    retry_window: Duration,
) -> Result<Location> {
    open_url_in(url, storage_options, retry_window, &Env::from_process())
}

/// [`open_url`] with the environment `env`.
fn open_url_in(
    url: &str,
    storage_options: &[(String, String)],
    retry_window: Duration,
    env: &Env,
) -> Result<Location> {
    let mut options = StorageOptions::default();
    options.retry.retry_timeout = options.retry.retry_timeout.min(retry_window);
    let options = named_options::apply(url, storage_options, options)?;
    let options = dataset_shaping(options, env)?;
    Ok(Location::open_with(url, &options, env)?)
}

/// `options` with the request shaping of a dataset's reads: when the job declares the store's
/// per-prefix limit (`SHARDSTREAM_SHAPING_PREFIX_LIMIT`,
/// `shardstream_storage::shaping::declared_prefix_limit`), the environment's shaping with that
/// limit, which caps each process at its share of it (`ShapingConfig::shared_by`). The limit
/// is the dataset's only: every process of the job reads a dataset's prefixes, evenly, so a
/// static share of the limit holds the job under it; the stores a process opens otherwise
/// (checkpoints, uploads) take the environment's shaping without it. Options that already
/// carry a shaping configuration are left as they are; without a declared limit, so are all.
fn dataset_shaping(mut options: StorageOptions, env: &Env) -> Result<StorageOptions> {
    if options.shaping.is_none() {
        if let Some(limit) = shaping::declared_prefix_limit(env)? {
            options.shaping = Some(ShapingConfig::from_env_with_prefix_limit(env, Some(limit))?);
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardstream_storage::shaping::{PREFIX_LIMIT_ENV, SHAPING_ENV};

    const URL: &str = "s3://bucket/dataset";
    const WINDOW: Duration = Duration::from_secs(120);

    /// 8 nodes x 8 ranks x 8 workers (72 processes a node), an S3 endpoint that is never
    /// reached (opening a store sends nothing), and `extra`.
    fn job(extra: &[(&str, &str)]) -> Env {
        let base = [
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("WORLD_SIZE", "64"),
            ("SHARDSTREAM_SHAPING_WORKERS", "8"),
        ];
        Env::from_pairs(base.iter().chain(extra).copied())
    }

    #[test]
    fn a_dataset_gets_the_declared_limit_and_a_plain_location_does_not() {
        let env = job(&[(PREFIX_LIMIT_ENV, "5500")]);
        let dataset = open_url_in(URL, &[], WINDOW, &env).unwrap();
        let reads = dataset.shaping().expect("a remote dataset is shaped");
        let ceiling = 5500.0 * shaping::PREFIX_LIMIT_HEADROOM / (72.0 * 8.0);
        assert_eq!(reads.prefix_limit, Some(5500.0));
        assert!((reads.max_rate - ceiling).abs() < 1e-9, "{reads:?}");
        assert!(reads.start_rate <= ceiling);
        // The same URL opened as any other store (a checkpoint, an upload): the node share
        // only, from the same environment.
        let plain = Location::open_with(URL, &StorageOptions::default(), &env).unwrap();
        let other = plain.shaping().expect("a remote location is shaped");
        assert_eq!(other.prefix_limit, None);
        assert_eq!(other, &ShapingConfig::from_env(&env).unwrap());
        assert_eq!(other.max_rate, ShapingConfig::default().max_rate / 72.0);
        assert!(other.max_rate > reads.max_rate);
        // The dataset's options carry its shaping; a plain location's take the environment's.
        assert!(dataset.options().shaping.is_some());
        assert!(plain.options().shaping.is_none());
    }

    #[test]
    fn without_a_declared_limit_a_dataset_is_shaped_like_any_store() {
        let env = job(&[]);
        let dataset = open_url_in(URL, &[], WINDOW, &env).unwrap();
        assert!(dataset.options().shaping.is_none());
        let plain = Location::open_with(URL, &StorageOptions::default(), &env).unwrap();
        assert_eq!(dataset.shaping(), plain.shaping());
        assert_eq!(dataset.shaping().unwrap().prefix_limit, None);
        // Shaping off: no limiter, declared limit or not.
        let off = job(&[(SHAPING_ENV, "off"), (PREFIX_LIMIT_ENV, "5500")]);
        assert!(open_url_in(URL, &[], WINDOW, &off)
            .unwrap()
            .shaping()
            .is_none());
    }

    #[test]
    fn a_callers_shaping_is_kept_and_a_bad_limit_names_the_variable() {
        let env = job(&[(PREFIX_LIMIT_ENV, "5500")]);
        let own = ShapingConfig {
            start_rate: 7.0,
            ..ShapingConfig::default()
        };
        let options = StorageOptions::default().with_shaping(own.clone());
        let kept = dataset_shaping(options, &env).unwrap();
        assert_eq!(kept.shaping, Some(own));
        let err = open_url_in(URL, &[], WINDOW, &job(&[(PREFIX_LIMIT_ENV, "lots")])).unwrap_err();
        assert!(err.to_string().contains(PREFIX_LIMIT_ENV), "{err}");
        // A local dataset is not shaped at all.
        let dir = tempfile::tempdir().unwrap();
        let local = open_url_in(dir.path().to_str().unwrap(), &[], WINDOW, &env).unwrap();
        assert!(local.shaping().is_none());
    }
}
