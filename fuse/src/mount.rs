//! Mounting: a `fuser` session over [`DatasetFs`], with an owner that unmounts it.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};

use crate::adapter::{FuseAdapter, MountStats};
use crate::fs::DatasetFs;
use crate::mountpoint;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Let other users (and root) read the mount (`allow_other`; non-root users need
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Threads serving kernel requests.
    pub threads: usize,
    /// The name shown as the mount's source in /proc/mounts.
    pub fs_name: String,
    /// Let the kernel read whole shards of `shards/` straight from their cache files (FUSE
    /// passthrough), where the kernel and the process's privileges allow; off: every read goes
    /// through the daemon.
    pub passthrough: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            threads: std::thread::available_parallelism()
                .map_or(4, |n| n.get())
                .clamp(2, 16),
            fs_name: "shardstream".into(),
            passthrough: true,
        }
    }
}

/// Errors of mounting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// The kernel or fusermount3 refused the mount.
    #[error("cannot mount at {path}: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The session thread could not start.
    #[error("cannot start the FUSE session thread: {0}")]
    Thread(std::io::Error),
    /// Unmounting failed.
    #[error("cannot unmount {path}: {source}")]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `allow_other` was asked for by a user that `/etc/fuse.conf` does not allow it to
    /// ([`crate::mountpoint::allow_other_refusal`]: the message names the fix).
    #[error("{0}")]
    AllowOtherRefused(String),
    /// A dead mount (`ENOTCONN`) at the mount point could not be cleared.
    #[error("cannot clear the dead mount at {path}: {source}")]
    ClearDead {
        /// The mount point.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The session ended with an error.
    #[error("the FUSE session at {path} failed: {source}")]
    Session {
        /// The mount point.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// A live mount. Dropping it unmounts and waits for the session to end.
#[derive(Debug)]
pub struct Mount {
    path: PathBuf,
    unmounter: SessionUnmounter,
    ended: mpsc::Receiver<std::io::Result<()>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<MountStats>,
}

/// Mounts `fs` at `mountpoint`; returns once the kernel has completed the FUSE handshake, so the
/// mount serves requests as soon as this returns. A dead mount left at `mountpoint` by a killed
/// server is detached first, and `allow_other` is refused up front, with the fix named, where
/// `/etc/fuse.conf` would make `fusermount3` refuse it ([`crate::mountpoint`]).
pub fn mount(
    fs: DatasetFs,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<Mount, MountError> {
    if options.allow_other {
        let uid = rustix::process::geteuid().as_raw();
        let conf = std::fs::read_to_string(mountpoint::FUSE_CONF).ok();
        if let Some(reason) = mountpoint::allow_other_refusal(uid, conf.as_deref()) {
            return Err(MountError::AllowOtherRefused(reason));
        }
    }
    if mountpoint::clear_dead(mountpoint).map_err(|source| MountError::ClearDead {
        path: mountpoint.to_path_buf(),
        source,
    })? {
        tracing::info!(mountpoint = %mountpoint.display(), "cleared a dead mount");
    }
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::FSName(options.fs_name.clone()),
        MountOption::Subtype("shardstream".into()),
        MountOption::DefaultPermissions,
    ];
    if options.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(options.threads.max(1));
    let adapter = FuseAdapter::new(fs, options.passthrough);
    let stats = adapter.stats();
    let mut session =
        Session::new(adapter, mountpoint, &config).map_err(|source| MountError::Mount {
            path: mountpoint.to_path_buf(),
            source,
        })?;
    let unmounter = session.unmount_callable();
    let (tx, ended) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("shardstream-fuse".into())
        .spawn(move || {
            let _ = tx.send(session.run());
        })
        .map_err(MountError::Thread)?;
    tracing::info!(mountpoint = %mountpoint.display(), "mounted");
    Ok(Mount {
        path: mountpoint.to_path_buf(),
        unmounter,
        ended,
        thread: Some(thread),
        stats,
    })
}

impl Mount {
    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the mount has done so far (passthrough in use, opens and reads served).
    pub fn stats(&self) -> &MountStats {
        &self.stats
    }

    /// Waits up to `timeout` for the session to end (someone ran `fusermount3 -u`); returns
    /// `Some` with its outcome if it did.
    pub fn wait_ended(&mut self, timeout: Duration) -> Option<Result<(), MountError>> {
        match self.ended.recv_timeout(timeout) {
            Ok(result) => {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
                Some(result.map_err(|source| MountError::Session {
                    path: self.path.clone(),
                    source,
                }))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Ok(())),
        }
    }

    /// Unmounts and waits for the session thread to finish.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.unmount_inner()
    }

    fn unmount_inner(&mut self) -> Result<(), MountError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        if let Err(source) = self.unmounter.unmount() {
            // Busy (a reader still has a file open): detach it now; the kernel ends the session
            // when the last file closes, or when this process exits.
            tracing::warn!(mountpoint = %self.path.display(), error = %source, "unmount failed; unmounting lazily");
            lazy_unmount(&self.path).map_err(|_| MountError::Unmount {
                path: self.path.clone(),
                source,
            })?;
            return Ok(());
        }
        let _ = thread.join();
        tracing::info!(mountpoint = %self.path.display(), "unmounted");
        match self.ended.try_recv() {
            Ok(Err(source)) => Err(MountError::Session {
                path: self.path.clone(),
                source,
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_inner() {
            tracing::warn!(error = %e, "unmount on drop failed");
        }
    }
}

/// `fusermount3 -u -z PATH` (then `fusermount -u -z`, `umount -l`): detaches a mount even when
/// it is busy or its server is gone.
pub fn lazy_unmount(path: &Path) -> std::io::Result<()> {
    let attempts: [(&str, &[&str]); 3] = [
        ("fusermount3", &["-u", "-z"]),
        ("fusermount", &["-u", "-z"]),
        ("umount", &["-l"]),
    ];
    let mut last = std::io::Error::other("no unmount tool found");
    for (program, args) in attempts {
        match std::process::Command::new(program)
            .args(args)
            .arg(path)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                last = std::io::Error::other(format!(
                    "{program} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}
