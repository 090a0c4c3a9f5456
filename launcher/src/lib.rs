//! What `shardstream run` does in a pod, as a library: work out which run and node this is,
//! prepare the node's cache folder, start the command (torchrun) under supervision, and clean
//! up; plus `shardstream cache gc`. No argument parsing: the CLI maps its flags onto this.
//!
//! - [`resolve_with`], [`locate_resolved`] (from `shardstream-identity`, re-exported): run id
//!   and node rank from the environment of any common launcher, and the node's folder
//!   `<cache-root>/<run-id>/<node-rank>/`.
//! - [`prepare_cache_dir`]: that folder with a marker that keeps two runs apart, and a
//!   [`RunLease`] that keeps the gc away.
//! - [`Supervisor`]: runs the command in its own process group, forwards `SIGTERM`/`SIGINT`/
//!   `SIGHUP`, kills after a grace period, returns the exit code, runs shutdown hooks.
//! - [`start_mount`]: a `--mount DATASET:PATH` served by `shardstream mount` for the
//!   command's lifetime, waited for until ready, taken down after.
//! - [`cache_gc`]: removes the folders of runs that are over and unused.
//!
//! ```no_run
//! use std::time::Duration;
//! use shardstream_launcher::{
//!     locate_resolved, os_env, prepare_cache_dir, resolve_with, CacheOverrides, Supervisor,
//! };
//!
//! # fn main() -> Result<(), shardstream_launcher::LauncherError> {
//! let overrides = CacheOverrides::default();
//! let resolved = resolve_with(&overrides.run, &os_env)?;
//! resolved.log();
//! let dir = locate_resolved(&overrides, &resolved, &os_env)?;
//! let lease = prepare_cache_dir(&dir, &resolved)?;
//! let outcome = Supervisor::new(["torchrun", "--nproc-per-node=8", "train.py"])?
//!     .export_resolved(&resolved, lease.dir())
//!     .grace_period(Duration::from_secs(20))
//!     .on_shutdown("unmount", Duration::from_secs(5), |_deadline| Ok(()))
//!     .run()?;
//! drop(lease);
//! std::process::exit(outcome.exit_code);
//! # }
//! ```

pub mod cache;
pub mod error;
pub mod gc;
pub mod hooks;
mod lock;
pub mod mount;
pub mod signals;
pub mod supervise;

pub use cache::{prepare_cache_dir, read_marker, Marker, RunLease};
pub use error::{LauncherError, Result};
pub use gc::{cache_gc, list_runs, GcReport, RunDir};
pub use hooks::{HookReport, HookResult};
pub use mount::{start_mount, Mount, MountSpec};
// Run identity and the folder rule live in `shardstream-identity` (one owner, shared with the
// streamer); re-exported because every caller of the launcher needs them.
pub use shardstream_identity as identity;
pub use shardstream_identity::{
    locate, locate_resolved, os_env, resolve, resolve_with, CacheOverrides, IdentityError,
    Overrides, ProcessRank, Resolved, Source,
};
pub use signals::{EarlySignals, ForwardSignal, OsSignals, Signaller};
pub use supervise::{exit_code, Outcome, Running, Supervisor, DEFAULT_GRACE};
