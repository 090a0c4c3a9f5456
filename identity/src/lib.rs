//! Who this process is in a run, and where its node's cache folder is: the one owner of the run
//! id, the node rank and the `<cache-root>/<run-id>/<node-rank>/` rule (docs/cache.md,
//! docs/deploy.md). It sits on the ground floor of the workspace (its only I/O is making and checking that folder), so that
//! the launcher (`shardstream run`), the streamer, the CLI and the Python binding all resolve the
//! same folder the same way without depending on one another.
//!
//! - [`resolve_with`]: run id and node rank from flags, then from the environment of any common
//!   launcher (Indexed Job, JobSet, PyTorchJob, TrainJob, torchrun);
//! - [`locate`]: the node's folder, with the one precedence (explicit folder, explicit root,
//!   `SHARDSTREAM_CACHE_DIR`, `SHARDSTREAM_CACHE_ROOT` or the default root);
//! - [`validate_run_id`] / [`node_dir`]: the one rule for what a run id may be;
//! - [`prepare_node_folder`]: the one rule for making the folder safely on a shared root.
//!
//! ```
//! use shardstream_identity::{locate, CacheOverrides};
//! let env = |name: &str| (name == "SHARDSTREAM_RUN_ID").then(|| "run1".to_string());
//! let overrides = CacheOverrides { cache_root: Some("/efs".into()), ..Default::default() };
//! assert_eq!(locate(&overrides, &env)?, std::path::PathBuf::from("/efs/run1/0"));
//! # Ok::<(), shardstream_identity::IdentityError>(())
//! ```

pub mod error;
pub mod folder;
pub mod hash;
pub mod locate;
pub mod resolve;

pub use error::{IdentityError, Result};
pub use folder::{prepare_node_folder, FolderError};
pub use hash::{stable_hash, stable_hash_from, STABLE_HASH_START};
pub use locate::{
    cache_root, default_cache_root, locate, locate_resolved, node_dir, CacheOverrides,
};
pub use resolve::{
    derived_run_id, multi_node_flag, os_env, resolve, resolve_for_command, resolve_node_rank_with,
    resolve_with, validate_run_id, Overrides, ProcessRank, Resolved, Source, CACHE_DIR_ENV,
    CACHE_ROOT_ENV, NODE_RANK_ENV, NODE_RANK_SOURCES, RUN_ID_ENV, RUN_ID_SOURCES,
};
