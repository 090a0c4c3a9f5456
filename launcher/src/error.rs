//! The launcher's error type: one enum, each variant naming the variable, folder or program it is
//! about, worded so that the one-line message tells the user what to set or fix.

use std::io;
use std::path::PathBuf;

/// A `Result` with [`LauncherError`].
pub type Result<T, E = LauncherError> = std::result::Result<T, E>;

/// What can go wrong while resolving the run, preparing its cache or supervising the command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LauncherError {
    /// The run id, node rank or cache folder could not be worked out.
    #[error(transparent)]
    Identity(#[from] shardstream_identity::IdentityError),
    /// The cache folder is not safe to use (a planted link, another user's folder, a folder of
    /// someone's files).
    #[error(transparent)]
    Folder(#[from] shardstream_identity::FolderError),
    /// The cache folder holds the marker of another run or node.
    #[error(
        "cache folder {dir} belongs to run {found_run:?} node {found_node}, not run {run:?} node \
         {node}; two runs never share a folder: pick another run id or cache root"
    )]
    ForeignCacheDir {
        /// The folder.
        dir: PathBuf,
        /// The run id in its marker.
        found_run: String,
        /// The node rank in its marker.
        found_node: u32,
        /// The run id being prepared.
        run: String,
        /// The node rank being prepared.
        node: u32,
    },
    /// The cache folder's lease is held by a run on another host.
    #[error(
        "cache folder {dir} is in use by host {holder} (this is {host}): one node's folder has one \
         host at a time; if {holder} is a pod still terminating, a retry succeeds once it is gone, \
         else check that no two pods get the same node rank"
    )]
    CacheDirInUseElsewhere {
        /// The folder.
        dir: PathBuf,
        /// The host named in its marker, whose lease is held.
        holder: String,
        /// This host.
        host: String,
    },
    /// A marker file that does not parse.
    #[error("cache marker {path} is unreadable: {reason}")]
    BadMarker {
        /// The marker file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The cache folder kept moving while it was being prepared (a concurrent `cache gc`).
    #[error("cache folder {dir} was removed while being prepared, {attempts} times")]
    CacheDirRacing {
        /// The folder.
        dir: PathBuf,
        /// How many times it was tried.
        attempts: u32,
    },
    /// A file-system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`"create folder"`, `"lock"`, ...).
        op: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The command to supervise was empty.
    #[error("no command to run: give one after `--`")]
    EmptyCommand,
    /// The command could not be started.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Waiting for the command failed.
    #[error("waiting for {program}: {source}")]
    Wait {
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A `--mount` value that is not `DATASET:PATH`.
    #[error("--mount {value:?}: {reason} (expected DATASET:PATH, e.g. s3://bucket/ds:/mnt/ds)")]
    InvalidMountSpec {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `shardstream mount` ended before it said it was ready.
    #[error("mounting {dataset} at {mountpoint} failed: {reason}")]
    MountFailed {
        /// The dataset.
        dataset: String,
        /// Where it was to be mounted.
        mountpoint: PathBuf,
        /// What happened (the mount process's exit status).
        reason: String,
    },
    /// `shardstream mount` did not say it was ready in time.
    #[error(
        "mounting {dataset} at {mountpoint}: not ready after {timeout:?} (raise --mount-timeout)"
    )]
    MountTimeout {
        /// The dataset.
        dataset: String,
        /// Where it was to be mounted.
        mountpoint: PathBuf,
        /// How long it was given.
        timeout: std::time::Duration,
    },
    /// The launcher was asked to stop (`SIGTERM`/`SIGINT`) before the command started.
    #[error("stopped by a signal while {during}, before the command started")]
    Stopped {
        /// What was going on.
        during: &'static str,
    },
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {source}")]
    Signals {
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Builds the `map_err` closure for an I/O error on `path`.
pub(crate) fn io_err(
    op: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(io::Error) -> LauncherError {
    let path = path.into();
    move |source| LauncherError::Io { op, path, source }
}
