//! `shardstream cache gc`: removes the cache folders of runs that are over, never one in use.
//!
//! A run folder (`<root>/<run-id>/`) is ours when at least one of its node folders
//! (`<root>/<run-id>/<n>/`) holds the launcher's or the streamer's marker; anything else under
//! the root is reported and left alone. A run is removed only if the caller says it is over
//! *and* every node folder's locks can be taken exclusively: the run lease
//! (`SHARDSTREAM-RUN.lock`, held by `shardstream run`) and the streamer's `cache.lock` (held by
//! every process with the cache open). While holding them, the run folder is renamed to
//! `<root>/.gc-<run-id>-<pid>-<nanos>`, so a run starting meanwhile makes a fresh folder instead of
//! writing into one being deleted; then the locks are let go and the renamed folder removed.
//! A `.gc-*` folder left by a gc that crashed is removed by the next one.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use crate::cache::{LEASE_LOCK_FILE, MARKER_FILE, STREAMER_MARKER_FILE, STREAMER_OPEN_LOCK};
use crate::error::{io_err, Result};
use crate::lock::{open_existing, try_lock_exclusive};
use shardstream_identity::validate_run_id;

const TOMBSTONE_PREFIX: &str = ".gc-";

/// One run's folder as the gc sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    /// The run id (the folder's name).
    pub run_id: String,
    /// `<root>/<run-id>`.
    pub path: PathBuf,
    /// The node ranks that have a folder.
    pub nodes: Vec<u32>,
    /// The last time a run used it: the newest mtime among the node markers.
    pub last_used: SystemTime,
}

impl RunDir {
    /// How long ago it was last used (zero if its clock is ahead of `now`).
    pub fn idle_for(&self, now: SystemTime) -> Duration {
        now.duration_since(self.last_used).unwrap_or_default()
    }
}

/// What a gc did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Runs removed (or, in a dry run, that would be), with the bytes they held.
    pub removed: Vec<(String, u64)>,
    /// Runs that are over but still have a process holding their folder.
    pub busy: Vec<String>,
    /// Runs the caller did not consider over.
    pub kept: Vec<String>,
    /// Entries under the root that are not shardstream run folders, left alone.
    pub foreign: Vec<PathBuf>,
    /// Folders of crashed gcs removed.
    pub tombstones: usize,
}

impl GcReport {
    /// Bytes freed (or that a dry run would free).
    pub fn freed_bytes(&self) -> u64 {
        self.removed.iter().map(|(_, b)| b).sum()
    }
}

/// Lists the run folders under `root` (for `shardstream cache ls`, and the gc).
pub fn list_runs(root: &Path) -> Result<(Vec<RunDir>, Vec<PathBuf>)> {
    let mut runs = Vec::new();
    let mut foreign = Vec::new();
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((runs, foreign)),
        Err(e) => return Err(io_err("list", root)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err("list", root))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(TOMBSTONE_PREFIX) {
            continue;
        }
        let is_dir = entry.file_type().map_err(io_err("stat", &path))?.is_dir();
        match (is_dir && validate_run_id(&name).is_ok())
            .then(|| inspect_run(&path, &name))
            .transpose()?
            .flatten()
        {
            Some(run) => runs.push(run),
            None => foreign.push(path),
        }
    }
    runs.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    foreign.sort();
    Ok((runs, foreign))
}

fn inspect_run(path: &Path, run_id: &str) -> Result<Option<RunDir>> {
    let mut nodes = Vec::new();
    let mut last_used = None;
    for entry in fs::read_dir(path).map_err(io_err("list", path))? {
        let entry = entry.map_err(io_err("list", path))?;
        let Some(rank) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let node = entry.path();
        let stamp = [MARKER_FILE, STREAMER_MARKER_FILE]
            .iter()
            .find_map(|m| fs::metadata(node.join(m)).and_then(|md| md.modified()).ok());
        if let Some(t) = stamp {
            nodes.push(rank);
            last_used = Some(last_used.map_or(t, |l: SystemTime| l.max(t)));
        }
    }
    nodes.sort_unstable();
    Ok(last_used.map(|last_used| RunDir {
        run_id: run_id.to_string(),
        path: path.to_path_buf(),
        nodes,
        last_used,
    }))
}

/// Removes the folders of the runs `is_over` picks, unless a process still holds them.
/// With `dry_run`, only reports what it would remove (busy runs are still detected).
pub fn cache_gc(root: &Path, is_over: impl Fn(&RunDir) -> bool, dry_run: bool) -> Result<GcReport> {
    let mut report = GcReport::default();
    if !dry_run {
        report.tombstones = remove_tombstones(root)?;
    }
    let (runs, foreign) = list_runs(root)?;
    report.foreign = foreign;
    for run in runs {
        if !is_over(&run) {
            report.kept.push(run.run_id);
            continue;
        }
        let Some(locks) = lock_run(&run)? else {
            info!(run_id = %run.run_id, "run is over but its cache is in use; kept");
            report.busy.push(run.run_id);
            continue;
        };
        let bytes = tree_size(&run.path);
        if !dry_run {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let tomb = root.join(format!(
                "{TOMBSTONE_PREFIX}{}-{}-{nanos}",
                run.run_id,
                std::process::id()
            ));
            fs::rename(&run.path, &tomb).map_err(io_err("rename", &run.path))?;
            drop(locks);
            fs::remove_dir_all(&tomb).map_err(io_err("remove", &tomb))?;
            info!(run_id = %run.run_id, bytes, "removed run cache");
        }
        report.removed.push((run.run_id, bytes));
    }
    Ok(report)
}

/// Takes every node folder's locks exclusively; `None` if any is held.
fn lock_run(run: &RunDir) -> Result<Option<Vec<File>>> {
    let mut held = Vec::new();
    for node in &run.nodes {
        let dir = run.path.join(node.to_string());
        for name in [LEASE_LOCK_FILE, STREAMER_OPEN_LOCK] {
            let path = dir.join(name);
            let Some(file) = open_existing(&path).map_err(io_err("open", &path))? else {
                continue;
            };
            if !try_lock_exclusive(&file).map_err(io_err("lock", &path))? {
                return Ok(None);
            }
            held.push(file);
        }
    }
    Ok(Some(held))
}

fn remove_tombstones(root: &Path) -> Result<usize> {
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("list", root)(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io_err("list", root))?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(TOMBSTONE_PREFIX)
        {
            let path = entry.path();
            match fs::remove_dir_all(&path) {
                Ok(()) => removed += 1,
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "could not remove a gc leftover")
                }
            }
        }
    }
    Ok(removed)
}

/// Bytes in a tree, not following links; unreadable parts count as 0 (it is a report).
fn tree_size(path: &Path) -> u64 {
    let Ok(md) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !md.is_dir() {
        return md.len();
    }
    fs::read_dir(path).map_or(0, |entries| {
        entries.flatten().map(|e| tree_size(&e.path())).sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::prepare_cache_dir;
    use crate::lock::{lock_shared, open_lock_file};
    use shardstream_identity::{node_dir, Resolved, Source};

    fn resolved(run: &str, node: u32) -> Resolved {
        Resolved {
            run_id: run.into(),
            run_id_from: Source::Flag,
            node_rank: node,
            node_rank_from: Source::Flag,
            process: None,
        }
    }

    fn make_run(root: &Path, run: &str, nodes: &[u32]) {
        for &n in nodes {
            let r = resolved(run, n);
            let dir = node_dir(root, run, n).unwrap();
            drop(prepare_cache_dir(&dir, &r).unwrap());
            fs::write(dir.join("shard.bin"), vec![0u8; 1000]).unwrap();
        }
    }

    #[test]
    fn removes_only_runs_that_are_over() {
        let root = tempfile::tempdir().unwrap();
        make_run(root.path(), "old", &[0, 1]);
        make_run(root.path(), "new", &[0]);
        let report = cache_gc(root.path(), |r| r.run_id == "old", false).unwrap();
        assert_eq!(report.removed.len(), 1);
        assert_eq!(report.removed[0].0, "old");
        assert!(report.removed[0].1 >= 2000, "{report:?}");
        assert_eq!(report.kept, vec!["new".to_string()]);
        assert!(!root.path().join("old").exists());
        assert!(root.path().join("new/0/shard.bin").exists());
        // Nothing left behind: no tombstone.
        let names: Vec<_> = fs::read_dir(root.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("new")]);
    }

    #[test]
    fn never_removes_a_run_with_a_live_lease() {
        let root = tempfile::tempdir().unwrap();
        let r = resolved("live", 0);
        let lease =
            prepare_cache_dir(&node_dir(root.path(), &r.run_id, r.node_rank).unwrap(), &r).unwrap();
        let report = cache_gc(root.path(), |_| true, false).unwrap();
        assert_eq!(report.busy, vec!["live".to_string()]);
        assert!(report.removed.is_empty());
        assert!(lease.dir().join(MARKER_FILE).exists());
        drop(lease);
        let report = cache_gc(root.path(), |_| true, false).unwrap();
        assert_eq!(report.removed.len(), 1);
        assert!(!root.path().join("live").exists());
    }

    #[test]
    fn never_removes_a_folder_the_streamer_has_open() {
        let root = tempfile::tempdir().unwrap();
        // A Python-only run: the streamer made the folder, no launcher marker.
        let node = root.path().join("py-run/0");
        fs::create_dir_all(&node).unwrap();
        fs::write(node.join(STREAMER_MARKER_FILE), "{\"layout\":1}\n").unwrap();
        let open = open_lock_file(&node.join(STREAMER_OPEN_LOCK)).unwrap();
        lock_shared(&open).unwrap();
        let report = cache_gc(root.path(), |_| true, false).unwrap();
        assert_eq!(report.busy, vec!["py-run".to_string()]);
        drop(open);
        let report = cache_gc(root.path(), |_| true, false).unwrap();
        assert_eq!(report.removed[0].0, "py-run");
    }

    #[test]
    fn leaves_foreign_entries_alone_and_dry_run_removes_nothing() {
        let root = tempfile::tempdir().unwrap();
        make_run(root.path(), "done", &[0]);
        fs::create_dir_all(root.path().join("not-ours/0")).unwrap();
        fs::write(root.path().join("README"), "x").unwrap();
        let report = cache_gc(root.path(), |_| true, true).unwrap();
        assert_eq!(report.removed.len(), 1);
        assert_eq!(report.foreign.len(), 2);
        assert!(root.path().join("done/0").exists());
        assert!(root.path().join("not-ours/0").exists());
        let report = cache_gc(root.path(), |_| true, false).unwrap();
        assert_eq!(report.freed_bytes(), report.removed[0].1);
        assert!(root.path().join("not-ours/0").exists());
        assert!(root.path().join("README").exists());
    }

    #[test]
    fn removes_leftovers_of_a_crashed_gc() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join(".gc-x-123/0")).unwrap();
        let report = cache_gc(root.path(), |_| true, false).unwrap();
        assert_eq!(report.tombstones, 1);
        assert!(!root.path().join(".gc-x-123").exists());
    }

    #[test]
    fn age_comes_from_the_marker() {
        let root = tempfile::tempdir().unwrap();
        make_run(root.path(), "r", &[0, 2]);
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        for n in [0, 2] {
            File::options()
                .write(true)
                .open(root.path().join(format!("r/{n}/{MARKER_FILE}")))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let (runs, _) = list_runs(root.path()).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].nodes, vec![0, 2]);
        assert_eq!(runs[0].last_used, old);
        assert!(runs[0].idle_for(SystemTime::now()) > Duration::from_secs(86_400));
        let report = cache_gc(
            root.path(),
            |r| r.idle_for(SystemTime::now()) > Duration::from_secs(3_600),
            false,
        )
        .unwrap();
        assert_eq!(report.removed.len(), 1);
    }

    #[test]
    fn missing_root_is_empty() {
        let root = tempfile::tempdir().unwrap();
        let report = cache_gc(&root.path().join("nope"), |_| true, false).unwrap();
        assert_eq!(report, GcReport::default());
    }
}
