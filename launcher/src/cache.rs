//! The node's cache folder, `<cache-root>/<run-id>/<node-rank>/` (docs/cache.md, the seeds'
//! `/run1/{j}`), and the lease a run holds on it.
//!
//! Two files at the folder's top belong to the launcher (the streamer's own files sit beside
//! them and are left alone):
//! - `SHARDSTREAM-RUN`: a JSON marker naming the run id and node rank. A folder whose marker
//!   names another run is refused, so two runs never share one, even where a case-insensitive
//!   file system or a hand-made path would make their names meet. Its mtime is the last time a
//!   run used the folder, which `cache gc --older-than` reads.
//! - `SHARDSTREAM-RUN.lock`: held shared by every [`RunLease`] for the whole run; `cache gc`
//!   takes it exclusively, so it never removes a folder in use.
//!
//! The marker also records the host that holds the folder (`HOSTNAME`, which Kubernetes sets
//! to the pod name, else the kernel's host name). A run on another host is refused while the
//! lease is held ([`LauncherError::CacheDirInUseElsewhere`]): two pods given the same node rank,
//! or a replacement pod started while the old one is still terminating. A restart on the same
//! host, or another host once the lease is released, takes the folder. "Held" is what the
//! lease's `flock` says, which crosses hosts only where the file system arbitrates locks: on
//! NFS (v4, or v3 with NLM) Linux turns `flock` into a whole-file lock that the server sees;
//! with `local_lock=flock` or `nolock` mounts, another host's lease is invisible and the check
//! lets the second host in (the marker still names the latest host). A host that died keeps its
//! NFS lock until the server's lease time runs out (about 90 s), and until then its replacement
//! is refused with a failure that a retry cures.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::error::{io_err, LauncherError, Result};
use crate::lock::{lock_shared, open_lock_file, try_lock_exclusive};
use shardstream_identity::Resolved;

/// The marker file naming the folder's run and node.
pub const MARKER_FILE: &str = "SHARDSTREAM-RUN";
/// The lock file held shared while a run uses the folder.
pub const LEASE_LOCK_FILE: &str = "SHARDSTREAM-RUN.lock";
/// The streamer cache's own marker (streamer `cache/layout.rs`): also marks a folder as ours.
pub const STREAMER_MARKER_FILE: &str = "SHARDSTREAM-CACHE";
/// The streamer cache's open lock, held shared by every process that has the cache open.
pub const STREAMER_OPEN_LOCK: &str = "cache.lock";

/// How often [`prepare_cache_dir`] retries when a concurrent gc moves the folder away.
const PREPARE_ATTEMPTS: u32 = 3;

/// What `SHARDSTREAM-RUN` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The run the folder belongs to.
    pub run_id: String,
    /// The node the folder belongs to.
    pub node_rank: u32,
    /// When the folder was first prepared (seconds since the epoch).
    pub created_unix: u64,
    /// The host that last took the folder's lease (absent from markers written before it was
    /// recorded, and where the host has no name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// A run's hold on its cache folder: while it lives, `cache gc` leaves the folder alone.
/// Dropping it stamps the marker's mtime, so an age-based gc counts from the end of the run.
#[derive(Debug)]
pub struct RunLease {
    dir: PathBuf,
    marker: Marker,
    _lock: File,
}

impl RunLease {
    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its marker.
    pub fn marker(&self) -> &Marker {
        &self.marker
    }
}

impl Drop for RunLease {
    fn drop(&mut self) {
        let path = self.dir.join(MARKER_FILE);
        let stamped = File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        if let Err(e) = stamped {
            warn!(path = %path.display(), error = %e, "could not stamp the cache marker");
        }
    }
}

/// Creates `dir` if needed, checks or writes its marker, and takes the run's shared lease.
///
/// Safe against a concurrent `cache gc`: the gc holds the lease lock exclusively while it
/// moves a folder away, so a lease taken on a moved folder is noticed (the lock file is no
/// longer at `dir`) and the folder is made again.
pub fn prepare_cache_dir(dir: &Path, resolved: &Resolved) -> Result<RunLease> {
    prepare_as(dir, resolved, this_host().as_deref())
}

/// This host's name: `HOSTNAME` (the pod name in Kubernetes), else the kernel's.
pub fn this_host() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// [`prepare_cache_dir`] on behalf of `host`.
fn prepare_as(dir: &Path, resolved: &Resolved, host: Option<&str>) -> Result<RunLease> {
    for attempt in 1..=PREPARE_ATTEMPTS {
        shardstream_identity::prepare_node_folder(dir, &shardstream_identity::os_env)?;
        let lock_path = dir.join(LEASE_LOCK_FILE);
        let lock = open_lock_file(&lock_path).map_err(io_err("open", &lock_path))?;
        lock_shared(&lock).map_err(io_err("lock", &lock_path))?;
        if !same_file(&lock, &lock_path)? {
            debug!(dir = %dir.display(), attempt, "cache folder moved by gc; making it again");
            continue;
        }
        let Some(marker) = check_or_write_marker(dir, resolved, host, &lock)? else {
            debug!(dir = %dir.display(), attempt, "cache folder moved by gc during a takeover");
            continue;
        };
        return Ok(RunLease {
            dir: dir.to_path_buf(),
            marker,
            _lock: lock,
        });
    }
    Err(LauncherError::CacheDirRacing {
        dir: dir.to_path_buf(),
        attempts: PREPARE_ATTEMPTS,
    })
}

/// Whether the open `file` is still the file at `path`.
fn same_file(file: &File, path: &Path) -> Result<bool> {
    let held = file.metadata().map_err(io_err("stat", path))?;
    match fs::metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("stat", path)(e)),
    }
}

/// Reads a folder's marker; `None` if it has none.
pub fn read_marker(dir: &Path) -> Result<Option<Marker>> {
    let path = dir.join(MARKER_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| LauncherError::BadMarker {
            path,
            reason: e.to_string(),
        })
}

/// Checks the folder's marker against this run and host, or writes it; `None` if the folder
/// moved away (a gc) while this host was taking it over from another.
fn check_or_write_marker(
    dir: &Path,
    resolved: &Resolved,
    host: Option<&str>,
    lock: &File,
) -> Result<Option<Marker>> {
    let Some(found) = read_marker(dir)? else {
        let marker = Marker {
            run_id: resolved.run_id.clone(),
            node_rank: resolved.node_rank,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            host: host.map(str::to_string),
        };
        write_marker(dir, &marker)?;
        return Ok(Some(marker));
    };
    if found.run_id != resolved.run_id || found.node_rank != resolved.node_rank {
        return Err(LauncherError::ForeignCacheDir {
            dir: dir.to_path_buf(),
            found_run: found.run_id,
            found_node: found.node_rank,
            run: resolved.run_id.clone(),
            node: resolved.node_rank,
        });
    }
    match (found.host.as_deref(), host) {
        (Some(holder), Some(me)) if holder != me => {
            // Another host had the folder: only if no one holds the lease any more. Our own
            // shared lock becomes exclusive only if no other holder is left.
            if !try_lock_exclusive(lock).map_err(io_err("lock", dir.join(LEASE_LOCK_FILE)))? {
                return Err(LauncherError::CacheDirInUseElsewhere {
                    dir: dir.to_path_buf(),
                    holder: holder.to_string(),
                    host: me.to_string(),
                });
            }
            let marker = Marker {
                host: Some(me.to_string()),
                ..found
            };
            write_marker(dir, &marker)?;
            let lock_path = dir.join(LEASE_LOCK_FILE);
            lock_shared(lock).map_err(io_err("lock", &lock_path))?;
            // Turning the lock back into a shared one lets go of it for a moment, in which a
            // gc could have taken the folder away.
            if !same_file(lock, &lock_path)? {
                return Ok(None);
            }
            debug!(dir = %dir.display(), from = holder, to = me, "cache folder taken over");
            Ok(Some(marker))
        }
        (None, Some(me)) => {
            // A marker from before hosts were recorded: record ours.
            let marker = Marker {
                host: Some(me.to_string()),
                ..found
            };
            write_marker(dir, &marker)?;
            Ok(Some(marker))
        }
        _ => {
            let path = dir.join(MARKER_FILE);
            File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()))
                .map_err(io_err("stamp", &path))?;
            Ok(Some(found))
        }
    }
}

/// Writes the marker complete or not at all: temp file (named per process, so racing writers
/// never rename each other's half-written file), fsync, rename.
fn write_marker(dir: &Path, marker: &Marker) -> Result<()> {
    let path = dir.join(MARKER_FILE);
    let tmp = dir.join(format!(".{MARKER_FILE}.{}.tmp", std::process::id()));
    let mut body = serde_json::to_vec(marker).map_err(|e| LauncherError::BadMarker {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    body.push(b'\n');
    let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(&body).map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("fsync", &tmp))?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io_err("rename", &tmp))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardstream_identity::node_dir;
    use shardstream_identity::Source;

    fn resolved(run: &str, node: u32) -> Resolved {
        Resolved {
            run_id: run.into(),
            run_id_from: Source::Flag,
            node_rank: node,
            node_rank_from: Source::Flag,
            process: None,
        }
    }

    #[test]
    fn prepare_writes_marker_and_reuses_it() {
        let root = tempfile::tempdir().unwrap();
        let r = resolved("run1", 0);
        let dir = node_dir(root.path(), "run1", 0).unwrap();
        let first = prepare_cache_dir(&dir, &r).unwrap();
        let marker = read_marker(&dir).unwrap().unwrap();
        assert_eq!(marker.run_id, "run1");
        assert_eq!(marker.node_rank, 0);
        assert_eq!(first.marker(), &marker);
        // A second process of the same run (or a restart) shares the folder and the marker.
        let second = prepare_cache_dir(&dir, &r).unwrap();
        assert_eq!(second.marker().created_unix, marker.created_unix);
        assert!(dir.join(LEASE_LOCK_FILE).exists());
    }

    #[test]
    fn refuses_a_folder_of_another_run_or_node() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("shared");
        let _a = prepare_cache_dir(&dir, &resolved("a", 0)).unwrap();
        let err = prepare_cache_dir(&dir, &resolved("b", 0)).unwrap_err();
        assert!(
            matches!(&err, LauncherError::ForeignCacheDir { found_run, run, .. } if found_run == "a" && run == "b"),
            "{err}"
        );
        let err = prepare_cache_dir(&dir, &resolved("a", 1)).unwrap_err();
        assert!(matches!(
            err,
            LauncherError::ForeignCacheDir {
                found_node: 0,
                node: 1,
                ..
            }
        ));
    }

    #[test]
    fn a_second_host_is_refused_while_the_first_holds_the_lease() {
        let root = tempfile::tempdir().unwrap();
        let r = resolved("run1", 0);
        let dir = node_dir(root.path(), "run1", 0).unwrap();
        let a = prepare_as(&dir, &r, Some("pod-a")).unwrap();
        assert_eq!(a.marker().host.as_deref(), Some("pod-a"));
        // Host A again (a restart, or a second process there) shares it.
        let a2 = prepare_as(&dir, &r, Some("pod-a")).unwrap();
        let err = prepare_as(&dir, &r, Some("pod-b")).unwrap_err();
        assert!(
            matches!(&err, LauncherError::CacheDirInUseElsewhere { holder, host, .. }
                if holder == "pod-a" && host == "pod-b"),
            "{err}"
        );
        assert!(err.to_string().contains("pod-a"), "{err}");
        // The refusal left host A's lease as it was.
        drop(a);
        assert!(
            prepare_as(&dir, &r, Some("pod-b")).is_err(),
            "a2 still holds it"
        );
        drop(a2);
        // Released: host B takes the folder over, and the marker names it.
        let b = prepare_as(&dir, &r, Some("pod-b")).unwrap();
        assert_eq!(b.marker().host.as_deref(), Some("pod-b"));
        let on_disk = read_marker(&dir).unwrap().unwrap();
        assert_eq!(on_disk.host.as_deref(), Some("pod-b"));
        assert_eq!(on_disk.created_unix, b.marker().created_unix);
        // B holds a shared lease again: A is refused now.
        assert!(prepare_as(&dir, &r, Some("pod-a")).is_err());
    }

    #[test]
    fn a_marker_without_a_host_is_adopted() {
        let root = tempfile::tempdir().unwrap();
        fs::write(
            root.path().join(MARKER_FILE),
            r#"{"run_id":"a","node_rank":0,"created_unix":5}"#,
        )
        .unwrap();
        let lease = prepare_as(root.path(), &resolved("a", 0), Some("pod-a")).unwrap();
        assert_eq!(lease.marker().host.as_deref(), Some("pod-a"));
        assert_eq!(lease.marker().created_unix, 5);
    }

    #[test]
    fn refuses_a_corrupt_marker() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join(MARKER_FILE), "not json").unwrap();
        let err = prepare_cache_dir(root.path(), &resolved("a", 0)).unwrap_err();
        assert!(matches!(err, LauncherError::BadMarker { .. }), "{err}");
    }

    #[test]
    fn dropping_the_lease_stamps_the_marker() {
        let root = tempfile::tempdir().unwrap();
        let r = resolved("run1", 0);
        let dir = node_dir(root.path(), "run1", 0).unwrap();
        let lease = prepare_cache_dir(&dir, &r).unwrap();
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options()
            .write(true)
            .open(dir.join(MARKER_FILE))
            .unwrap()
            .set_modified(old)
            .unwrap();
        drop(lease);
        let stamped = fs::metadata(dir.join(MARKER_FILE))
            .unwrap()
            .modified()
            .unwrap();
        assert!(stamped > old);
    }
}
