//! `shardstream run --mount DATASET:PATH`: a FUSE view of a dataset that exists for the
//! command's lifetime.
//!
//! The mount is served by a second process, `shardstream mount DATASET PATH --foreground
//! --ready-file FILE`, which the launcher starts in a process group of its own (so a terminal's
//! Ctrl-C reaches it only through the launcher) and waits for: ready once `FILE` exists, failed
//! if the process exits first, timed out otherwise. Taking it down is `SIGTERM` to that process
//! (which unmounts and exits), then, if it does not exit in time, `SIGKILL` and a lazy unmount
//! (`fusermount3 -uz`, `fusermount -uz`, `umount -l`) so no dead mount is left behind.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use tracing::{info, warn};

use crate::error::{io_err, LauncherError, Result};
use shardstream_identity::CACHE_ROOT_ENV;

/// How often the launcher looks for the ready file or the mount process's exit.
const POLL: Duration = Duration::from_millis(20);

/// glibc's cap on malloc arenas, set for the mount process unless the caller chose one.
const MALLOC_ARENA_MAX: &str = "MALLOC_ARENA_MAX";

/// How long [`Mount`]'s drop waits for the mount process after `SIGTERM`.
const DROP_WAIT: Duration = Duration::from_secs(5);

/// One `--mount DATASET:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// The dataset (a local path or an `s3://`, `gs://`, `az://` URL).
    pub dataset: String,
    /// Where to mount it.
    pub mountpoint: PathBuf,
}

impl FromStr for MountSpec {
    type Err = LauncherError;

    /// Splits at the *last* `:`, since URLs have one of their own (`s3://b/ds:/mnt/ds`).
    fn from_str(value: &str) -> Result<MountSpec> {
        let bad = |reason| LauncherError::InvalidMountSpec {
            value: value.to_string(),
            reason,
        };
        let (dataset, path) = value.rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
        if path.starts_with("//") {
            return Err(bad(
                "no mount point (the last ':' is the dataset URL's own)",
            ));
        }
        if dataset.is_empty() {
            return Err(bad("empty dataset"));
        }
        if !path.starts_with('/') {
            return Err(bad("the mount point must be an absolute path"));
        }
        Ok(MountSpec {
            dataset: dataset.to_string(),
            mountpoint: PathBuf::from(path),
        })
    }
}

/// A live mount: the `shardstream mount` process serving it. Take it down with
/// [`Mount::unmount`]; dropping it does the same, waiting at most a few seconds.
#[derive(Debug)]
pub struct Mount {
    spec: MountSpec,
    child: Option<Child>,
    ready_file: PathBuf,
}

/// A ready-file name unique in this process.
fn ready_file_path() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "shardstream-mount-{}-{n}.ready",
        std::process::id()
    ))
}

/// Starts `program mount DATASET PATH --foreground --ready-file FILE` with `env` added (the
/// resolved run's exports, so the mount uses the node's cache folder) and waits until it is
/// ready, it fails, `timeout` passes, or `stop` (asked every few milliseconds) says to give up
/// ([`LauncherError::Stopped`]; the launcher got `SIGTERM`). `program` is the `shardstream`
/// binary itself. On any error the mount process is stopped before this returns.
pub fn start_mount(
    program: &Path,
    spec: &MountSpec,
    env: &[(&'static str, OsString)],
    timeout: Duration,
    stop: &mut dyn FnMut() -> bool,
) -> Result<Mount> {
    fs::create_dir_all(&spec.mountpoint).map_err(io_err("create folder", &spec.mountpoint))?;
    let ready_file = ready_file_path();
    match fs::remove_file(&ready_file) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove", &ready_file)(e)),
    }
    let mut cmd = Command::new(program);
    cmd.arg("mount")
        .arg(&spec.dataset)
        .arg(&spec.mountpoint)
        .arg("--foreground")
        .arg("--ready-file")
        .arg(&ready_file)
        .envs(env.iter().map(|(k, v)| (k, v)))
        // The exported SHARDSTREAM_CACHE_DIR is the node's folder; a root would compete with it.
        .env_remove(CACHE_ROOT_ENV)
        .stdin(Stdio::null());
    if std::env::var_os(MALLOC_ARENA_MAX).is_none()
        && !env.iter().any(|(k, _)| *k == MALLOC_ARENA_MAX)
    {
        // glibc reads this only at start: without it each of the mount's serving threads gets
        // an arena of its own, and freed read buffers stay resident in each, so the daemon's RSS
        // grows with its thread count rather than with its byte budget.
        cmd.env(MALLOC_ARENA_MAX, "2");
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().map_err(|source| LauncherError::Spawn {
        program: format!("{} mount", program.display()),
        source,
    })?;
    info!(dataset = %spec.dataset, mountpoint = %spec.mountpoint.display(), pid = child.id(), "mounting");
    let mut mount = Mount {
        spec: spec.clone(),
        child: Some(child),
        ready_file,
    };
    mount.wait_ready(timeout, stop)?;
    info!(mountpoint = %spec.mountpoint.display(), "mount ready");
    Ok(mount)
}

impl Mount {
    /// The dataset and mount point.
    pub fn spec(&self) -> &MountSpec {
        &self.spec
    }

    /// The mount process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self, timeout: Duration, stop: &mut dyn FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ready_file.exists() {
                return Ok(());
            }
            if stop() {
                return Err(LauncherError::Stopped { during: "mounting" });
            }
            if let Some(child) = self.child.as_mut() {
                let exited = child.try_wait().map_err(|source| LauncherError::Wait {
                    program: "shardstream mount".into(),
                    source,
                })?;
                if let Some(status) = exited {
                    self.child = None;
                    return Err(LauncherError::MountFailed {
                        dataset: self.spec.dataset.clone(),
                        mountpoint: self.spec.mountpoint.clone(),
                        reason: format!(
                            "`shardstream mount` exited ({status}) before it was ready"
                        ),
                    });
                }
            }
            if Instant::now() >= deadline {
                // Drop takes the process down.
                return Err(LauncherError::MountTimeout {
                    dataset: self.spec.dataset.clone(),
                    mountpoint: self.spec.mountpoint.clone(),
                    timeout,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Asks the mount process to unmount and exit (`SIGTERM`) and waits until `deadline`;
    /// past it, kills the process and unmounts lazily. `Err` says what did not go cleanly.
    pub fn unmount(mut self, deadline: Instant) -> std::result::Result<(), String> {
        self.stop(deadline)
    }

    fn stop(&mut self, deadline: Instant) -> std::result::Result<(), String> {
        let _ = fs::remove_file(&self.ready_file);
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let mountpoint = self.spec.mountpoint.clone();
        let pid = Pid::from_child(&child);
        // ESRCH: it already exited; the wait below collects it.
        let _ = kill_process(pid, Signal::TERM);
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => {
                    info!(mountpoint = %mountpoint.display(), "unmounted");
                    return Ok(());
                }
                Ok(Some(status)) => {
                    lazy_unmount_if_mounted(&mountpoint);
                    return Err(format!("the mount process exited with {status}"));
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                Ok(None) => break,
                Err(e) => return Err(format!("waiting for the mount process: {e}")),
            }
        }
        warn!(mountpoint = %mountpoint.display(), "mount process did not exit in time; killing it");
        let _ = child.kill();
        let _ = child.wait();
        lazy_unmount_if_mounted(&mountpoint);
        Err("the mount process did not exit in time and was killed".into())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_some() {
            if let Err(e) = self.stop(Instant::now() + DROP_WAIT) {
                warn!(mountpoint = %self.spec.mountpoint.display(), error = %e, "unmount on drop");
            }
        }
    }
}

/// Whether `path` is a mount point, from `/proc/self/mountinfo` (field 5, octal-escaped).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|field| unescape_mountinfo(field) == want)
}

fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches a mount whose server is gone, with whichever tool the image has.
fn lazy_unmount_if_mounted(mountpoint: &Path) {
    if !is_mounted(mountpoint) {
        return;
    }
    for (tool, args) in [
        ("fusermount3", ["-u", "-z"].as_slice()),
        ("fusermount", ["-u", "-z"].as_slice()),
        ("umount", ["-l"].as_slice()),
    ] {
        let ok = Command::new(tool)
            .args(args)
            .arg(mountpoint)
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            info!(mountpoint = %mountpoint.display(), tool, "lazily unmounted");
            return;
        }
    }
    warn!(mountpoint = %mountpoint.display(), "could not unmount; it goes with the container");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_splits_at_the_last_colon() {
        let s: MountSpec = "s3://bucket/ds:/mnt/ds".parse().unwrap();
        assert_eq!(s.dataset, "s3://bucket/ds");
        assert_eq!(s.mountpoint, PathBuf::from("/mnt/ds"));
        let s: MountSpec = "/data/ds:/mnt/x".parse().unwrap();
        assert_eq!(s.dataset, "/data/ds");
        for bad in ["nocolon", ":/mnt/x", "ds:relative/path", "s3://b/ds"] {
            assert!(
                matches!(
                    bad.parse::<MountSpec>(),
                    Err(LauncherError::InvalidMountSpec { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/mnt/my\040data"), "/mnt/my data");
        assert_eq!(unescape_mountinfo(r"/a\134b"), r"/a\b");
        assert_eq!(unescape_mountinfo(r"/plain\0"), r"/plain\0");
        assert!(is_mounted(Path::new("/")));
        assert!(!is_mounted(Path::new("/nonexistent-shardstream-mount")));
    }

    #[test]
    fn a_mount_process_that_exits_early_is_an_error() {
        // `true` ignores its arguments and exits 0 without writing the ready file.
        let dir = tempfile::tempdir().unwrap();
        let spec = MountSpec {
            dataset: "ds".into(),
            mountpoint: dir.path().join("mnt"),
        };
        let err = start_mount(
            Path::new("true"),
            &spec,
            &[],
            Duration::from_secs(30),
            &mut || false,
        )
        .unwrap_err();
        assert!(
            matches!(&err, LauncherError::MountFailed { reason, .. } if reason.contains("before it was ready")),
            "{err}"
        );
        assert!(spec.mountpoint.is_dir());
    }

    /// Writes an executable script standing in for `shardstream mount`: it gets the same
    /// arguments (`mount DATASET PATH --foreground --ready-file FILE`, so FILE is `$6`).
    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-mount.sh");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_mount_process_that_never_gets_ready_times_out_and_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let prog = script(
            dir.path(),
            &format!("echo $$ > {}; exec sleep 60", pidfile.display()),
        );
        let spec = MountSpec {
            dataset: "ds".into(),
            mountpoint: dir.path().join("mnt"),
        };
        let start = Instant::now();
        let err =
            start_mount(&prog, &spec, &[], Duration::from_millis(500), &mut || false).unwrap_err();
        assert!(matches!(err, LauncherError::MountTimeout { .. }), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(500));
        // The process was stopped (and reaped) before the error came back.
        let pid = fs::read_to_string(&pidfile).unwrap();
        assert!(!Path::new(&format!("/proc/{}", pid.trim())).exists());
    }

    #[test]
    fn ready_then_sigterm_on_unmount_with_the_exported_env() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let prog = script(
            dir.path(),
            &format!(
                "trap 'echo term >> {log}; exit 0' TERM\n\
                 echo \"$1 $2 $3 $4 $5 $SHARDSTREAM_RUN_ID ${{SHARDSTREAM_CACHE_ROOT:-noroot}} arenas=${{MALLOC_ARENA_MAX:-unset}}\" > {log}\n\
                 touch \"$6\"\n\
                 i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 99",
                log = log.display()
            ),
        );
        let spec = MountSpec {
            dataset: "s3://b/ds".into(),
            mountpoint: dir.path().join("mnt"),
        };
        let env = [("SHARDSTREAM_RUN_ID", OsString::from("r1"))];
        let mount =
            start_mount(&prog, &spec, &env, Duration::from_secs(30), &mut || false).unwrap();
        assert!(mount.pid().is_some());
        let first = fs::read_to_string(&log).unwrap();
        assert_eq!(
            first.trim(),
            format!(
                "mount s3://b/ds {} --foreground --ready-file r1 noroot arenas={}",
                spec.mountpoint.display(),
                std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "2".into())
            )
        );
        mount
            .unmount(Instant::now() + Duration::from_secs(10))
            .unwrap();
        assert_eq!(fs::read_to_string(&log).unwrap(), format!("{first}term\n"));
    }
}
