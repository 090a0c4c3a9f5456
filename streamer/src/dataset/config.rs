//! How a dataset is opened: [`StreamingConfig`] (Mosaic's argument names) and the one way a
//! dataset URL becomes a storage location.

use std::path::PathBuf;
use std::time::Duration;

use shardstream_identity::os_env;
use shardstream_storage::named_options::{self, NamedOptions};
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
/// that the two retry levels do not add up (see [`StreamingConfig::retry_window`]), and the
/// per-call storage options applied.
pub(super) fn open_url(
    url: &str,
    storage_options: &[(String, String)],
    retry_window: Duration,
) -> Result<Location> {
    let mut options = StorageOptions::default();
    options.retry.retry_timeout = options.retry.retry_timeout.min(retry_window);
    let options = named_options::apply(url, storage_options, options)?;
    Ok(Location::open_with(url, &options, &Env::from_process())?)
}
