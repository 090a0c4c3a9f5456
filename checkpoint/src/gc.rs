//! Retention and garbage collection.
//!
//! `gc` deletes committed checkpoints the [`RetentionPolicy`] does not keep (never the latest;
//! the manifest goes first, so a crash mid-delete leaves an uncommitted leftover, never a torn
//! checkpoint), deletes leftovers of dead saves (uncommitted directories, and objects of other
//! attempts inside committed ones) once their newest object is older than a threshold, and
//! leaves alone any directory whose manifest does not read (it may be a newer format).
//!
//! A root may hold other things, so gc deletes only what its own layout names: a checkpoint's
//! manifest, its aliases, and objects under attempt directories of the exact format
//! ([`crate::layout::is_attempt_name`]); in a directory without a manifest, only such attempt
//! objects and root-level copies of them. Anything else is left alone and counted in
//! [`GcReport::foreign_objects`] / [`GcReport::foreign_dirs`]. Every deletion is reported: the
//! checkpoints, leftover directories and dead attempts in the [`GcReport`], each local file or
//! folder in [`GcReport::local_paths_deleted`], each object in a `debug` log line.
//!
//! Orphaned multipart uploads: `object_store` exposes no ListMultipartUploads, so gc cannot see
//! the parts a killed process left behind on S3. Every failed or dropped upload is aborted by
//! the writer itself; for processes killed outright, configure the bucket lifecycle rule
//! `AbortIncompleteMultipartUpload` (`docs/checkpoints.md` has it). On a POSIX directory the
//! equivalent leftovers are `<file>#<n>` staging files, which `object_store` hides from listings;
//! when [`GcOptions::local_root`] names the directory, gc removes those (and empty directories)
//! inside the checkpoints it manages only (`local_sweep.rs`).

use crate::catalog::{CheckpointInfo, Entry};
use crate::error::{CheckpointError, Result};
use crate::layout::{is_attempt_name, join, relative_to};
use crate::local_sweep::LocalSweep;
use crate::manifest::Manifest;
use crate::metrics::add;
use crate::CheckpointRoot;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt};
use shardstream_storage::listing;
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{debug, info, info_span, warn, Instrument};

/// Which committed checkpoints to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Keep the newest `keep_last` (at least 1: the latest is always kept).
    pub keep_last: usize,
    /// Also keep every checkpoint whose step is a multiple of this (0 or `None`: off).
    pub keep_every: Option<u64>,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            keep_last: 3,
            keep_every: None,
        }
    }
}

impl RetentionPolicy {
    /// For checkpoints sorted oldest first, whether each is kept. The last is always kept.
    pub fn keep_flags(&self, sorted: &[CheckpointInfo]) -> Vec<bool> {
        let n = sorted.len();
        let keep_last = self.keep_last.max(1);
        sorted
            .iter()
            .enumerate()
            .map(|(i, info)| {
                let recent = i + keep_last >= n;
                let every = match (self.keep_every, info.step) {
                    (Some(k), Some(s)) if k > 0 => s % k == 0,
                    _ => false,
                };
                recent || every
            })
            .collect()
    }
}

/// Settings of one `gc` run.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Which committed checkpoints stay.
    pub policy: RetentionPolicy,
    /// Leftovers are deleted only when their newest object is at least this old. It must be
    /// longer than the longest save, or gc could sweep a save that is still running.
    pub leftovers_older_than: Duration,
    /// Report what would be deleted without deleting.
    pub dry_run: bool,
    /// The local directory of the checkpoint root when the store is a POSIX directory, so that
    /// staging files of killed uploads and empty directories can be removed too. Defaults to
    /// the root's own ([`CheckpointRoot::local_root`]).
    pub local_root: Option<PathBuf>,
}

impl Default for GcOptions {
    fn default() -> Self {
        Self {
            policy: RetentionPolicy::default(),
            leftovers_older_than: Duration::from_secs(24 * 3600),
            dry_run: false,
            local_root: None,
        }
    }
}

/// What a `gc` run did (or, with `dry_run`, would do).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Committed checkpoints kept, oldest first.
    pub kept: Vec<String>,
    /// Committed checkpoints deleted.
    pub deleted: Vec<String>,
    /// Uncommitted directories deleted.
    pub leftover_dirs_deleted: Vec<String>,
    /// Uncommitted directories (or stale attempts) kept because they are younger than the threshold.
    pub young_leftovers: usize,
    /// Directories whose manifest does not read, left alone.
    pub unreadable: Vec<String>,
    /// Objects deleted in total.
    pub objects_deleted: u64,
    /// Bytes of those objects.
    pub bytes_deleted: u64,
    /// Dead attempts (`<id>/<attempt>`) whose objects were deleted from kept checkpoints.
    pub stale_attempts_deleted: Vec<String>,
    /// Local staging files (`<file>#<n>`) removed.
    pub local_staging_files_deleted: u64,
    /// Every local file and folder removed by the local sweep.
    pub local_paths_deleted: Vec<PathBuf>,
    /// Objects inside checkpoint directories that are not part of the layout gc manages,
    /// left alone.
    pub foreign_objects: u64,
    /// Directories under the root without a manifest and without any attempt directory: not
    /// checkpoints, left alone.
    pub foreign_dirs: Vec<String>,
}

impl CheckpointRoot {
    /// Applies `opts` to the root. See the module docs of `gc` for what is deleted and in which
    /// order.
    pub async fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let span = info_span!("checkpoint.gc", root = %self.root(), dry_run = opts.dry_run);
        self.gc_inner(opts).instrument(span).await
    }

    async fn gc_inner(&self, opts: &GcOptions) -> Result<GcReport> {
        let cutoff_ms = SystemTime::now()
            .checked_sub(opts.leftovers_older_than)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(i64::MIN, |d| {
                i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
            });
        let mut report = GcReport::default();
        let mut committed = Vec::new();
        let mut uncommitted = Vec::new();
        for e in self.entries().await? {
            match e {
                Entry::Committed(m, stored) => committed.push((*m, stored)),
                Entry::Uncommitted(id) => uncommitted.push(id),
                Entry::Unreadable(id) => report.unreadable.push(id),
            }
        }
        let mut infos: Vec<(CheckpointInfo, usize)> = committed
            .iter()
            .enumerate()
            .map(|(i, (m, stored))| (CheckpointInfo::from_manifest(m, *stored), i))
            .collect();
        infos.sort_by(|a, b| a.0.order(&b.0));
        let sorted: Vec<CheckpointInfo> = infos.iter().map(|(c, _)| c.clone()).collect();
        let flags = opts.policy.keep_flags(&sorted);

        for ((info, idx), keep) in infos.iter().zip(flags) {
            let Some((m, _)) = committed.get(*idx) else {
                continue;
            };
            let dir = self.checkpoint_dir(&info.id);
            let mpath = self.manifest_path(&info.id);
            if keep {
                report.kept.push(info.id.clone());
                // Objects of other attempts in a committed directory are dead.
                let mut live: HashSet<Path> = m.files.iter().map(|f| join(&dir, &f.path)).collect();
                live.extend(m.aliases.iter().map(|a| join(&dir, &a.path)));
                live.insert(mpath);
                let objects = self.list_dir(&info.id).await?;
                let (ours, foreign): (Vec<_>, Vec<_>) = objects
                    .into_iter()
                    .filter(|o| !live.contains(&o.location))
                    .partition(|o| attempt_of(&dir, &o.location).is_some());
                self.note_foreign(&info.id, &foreign, &mut report);
                let (old, young): (Vec<_>, Vec<_>) = ours
                    .into_iter()
                    .partition(|o| o.last_modified.timestamp_millis() <= cutoff_ms);
                if !young.is_empty() {
                    report.young_leftovers += 1;
                }
                let stale: BTreeSet<String> = old
                    .iter()
                    .filter_map(|o| attempt_of(&dir, &o.location))
                    .map(|a| format!("{}/{a}", info.id))
                    .collect();
                for s in &stale {
                    info!(attempt = %s, "deleting a dead attempt inside a committed checkpoint");
                }
                report.stale_attempts_deleted.extend(stale);
                self.delete_objects(old, opts.dry_run, &mut report).await?;
            } else {
                info!(id = %info.id, step = ?info.step, "deleting checkpoint outside the retention policy");
                report.deleted.push(info.id.clone());
                if !opts.dry_run {
                    // The manifest first: from here on the checkpoint no longer exists.
                    match self.store().delete(&mpath).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(CheckpointError::store("delete", &mpath, e)),
                    }
                    add(&self.metrics().gc_deleted_objects, 1);
                }
                report.objects_deleted += 1;
                // Then the root aliases, so torch's reader stops seeing it before data goes;
                // then the attempts' files. Anything else in the directory is not ours.
                let aliases: HashSet<Path> =
                    m.aliases.iter().map(|a| join(&dir, &a.path)).collect();
                let mut first = Vec::new();
                let mut rest = Vec::new();
                let mut foreign = Vec::new();
                for o in self.list_dir(&info.id).await? {
                    if o.location == mpath {
                        continue;
                    } else if aliases.contains(&o.location) {
                        first.push(o);
                    } else if attempt_of(&dir, &o.location).is_some() {
                        rest.push(o);
                    } else {
                        foreign.push(o);
                    }
                }
                self.note_foreign(&info.id, &foreign, &mut report);
                self.delete_objects(first, opts.dry_run, &mut report)
                    .await?;
                self.delete_objects(rest, opts.dry_run, &mut report).await?;
            }
        }

        for id in &uncommitted {
            let dir = self.checkpoint_dir(id);
            let (ours, foreign) = leftover_objects(&dir, self.list_dir(id).await?);
            if ours.is_empty() {
                if !foreign.is_empty() {
                    warn!(
                        id,
                        objects = foreign.len(),
                        "left alone: a directory that is not a checkpoint"
                    );
                    report.foreign_dirs.push(id.clone());
                }
                continue;
            }
            self.note_foreign(id, &foreign, &mut report);
            let newest = ours
                .iter()
                .map(|o| o.last_modified.timestamp_millis())
                .max();
            match newest {
                Some(t) if t <= cutoff_ms => {
                    info!(id, objects = ours.len(), "deleting an uncommitted leftover");
                    report.leftover_dirs_deleted.push(id.clone());
                    self.delete_objects(ours, opts.dry_run, &mut report).await?;
                }
                Some(_) => report.young_leftovers += 1,
                None => {}
            }
        }

        let local_root = opts.local_root.as_deref().or(self.local_root());
        if let (Some(local), false) = (local_root, opts.dry_run) {
            let plan = LocalSweep {
                root: local.to_path_buf(),
                committed: committed
                    .iter()
                    .map(|(m, _)| (m.checkpoint_id.clone(), alias_names(m)))
                    .collect(),
                skip: report.unreadable.iter().cloned().collect(),
                cutoff: SystemTime::now()
                    .checked_sub(opts.leftovers_older_than)
                    .unwrap_or(UNIX_EPOCH),
            };
            let removed = tokio::task::spawn_blocking(move || plan.run())
                .await
                .unwrap_or_default();
            report.local_staging_files_deleted = removed.staging_files;
            report.local_paths_deleted = removed.paths;
        }
        Ok(report)
    }

    /// Counts and logs objects in a checkpoint directory that are not in the layout gc
    /// manages; they are never deleted.
    fn note_foreign(&self, id: &str, foreign: &[ObjectMeta], report: &mut GcReport) {
        if foreign.is_empty() {
            return;
        }
        warn!(
            id,
            objects = foreign.len(),
            first = %foreign[0].location,
            "left alone: objects that are not part of a checkpoint's layout"
        );
        report.foreign_objects += foreign.len() as u64;
    }

    async fn list_dir(&self, id: &str) -> Result<Vec<ObjectMeta>> {
        let dir = self.checkpoint_dir(id);
        // Through the storage helper: an odd key in the directory is skipped with a warning
        // (and, having no path, never deleted) instead of aborting gc.
        match listing::list(&**self.store(), &dir).await {
            Ok(l) => Ok(l.objects),
            Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(CheckpointError::store("list", &dir, e)),
        }
    }

    async fn delete_objects(
        &self,
        objects: Vec<ObjectMeta>,
        dry_run: bool,
        report: &mut GcReport,
    ) -> Result<()> {
        report.objects_deleted += objects.len() as u64;
        // Sizes from a listing; saturate rather than wrap on a hostile one.
        report.bytes_deleted = objects
            .iter()
            .fold(report.bytes_deleted, |acc, o| acc.saturating_add(o.size));
        for o in &objects {
            debug!(object = %o.location, bytes = o.size, dry_run, "gc delete");
        }
        if dry_run || objects.is_empty() {
            return Ok(());
        }
        let n = objects.len() as u64;
        let paths = futures::stream::iter(objects.into_iter().map(|o| Ok(o.location))).boxed();
        let mut results = self.store().delete_stream(paths);
        while let Some(r) = results.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    warn!(error = %e, "a gc delete failed");
                    return Err(CheckpointError::store("delete", self.root(), e));
                }
            }
        }
        add(&self.metrics().gc_deleted_objects, n);
        Ok(())
    }
}

/// The attempt directory `full` lies in, when it is inside `dir` as `<attempt>/...` with an
/// attempt name of this crate's exact format.
fn attempt_of(dir: &Path, full: &Path) -> Option<String> {
    let rel = relative_to(full, dir)?;
    let (first, _) = rel.split_once('/')?;
    is_attempt_name(first).then(|| first.to_owned())
}

/// Splits the objects of a directory without a manifest into the leftovers of this crate's
/// saves (files under attempt directories, and root-level copies of such files, which an
/// interrupted gc of a committed checkpoint leaves) and everything else.
fn leftover_objects(dir: &Path, objects: Vec<ObjectMeta>) -> (Vec<ObjectMeta>, Vec<ObjectMeta>) {
    let attempt_names: HashSet<String> = objects
        .iter()
        .filter(|o| attempt_of(dir, &o.location).is_some())
        .filter_map(|o| o.location.filename().map(str::to_owned))
        .collect();
    objects.into_iter().partition(|o| {
        attempt_of(dir, &o.location).is_some()
            || (relative_to(&o.location, dir).is_some_and(|r| !r.contains('/'))
                && o.location
                    .filename()
                    .is_some_and(|n| attempt_names.contains(n)))
    })
}

fn alias_names(m: &Manifest) -> Vec<String> {
    m.aliases.iter().map(|a| a.path.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, step: Option<u64>, t: u64) -> CheckpointInfo {
        CheckpointInfo {
            id: id.into(),
            step,
            created_unix_ms: t,
            committed_unix_ms: t,
            world_size: 1,
            files: 1,
            total_bytes: 1,
            attempt: "attempt-1".into(),
        }
    }

    #[test]
    fn keep_last_and_every() {
        let infos: Vec<_> = (1..=10)
            .map(|s| info(&format!("s{s}"), Some(s * 100), s))
            .collect();
        let p = RetentionPolicy {
            keep_last: 2,
            keep_every: Some(300),
        };
        let kept: Vec<u64> = infos
            .iter()
            .zip(p.keep_flags(&infos))
            .filter(|(_, k)| *k)
            .filter_map(|(i, _)| i.step)
            .collect();
        assert_eq!(kept, vec![300, 600, 900, 1000]);
    }

    #[test]
    fn latest_always_kept() {
        let infos = vec![info("a", None, 1), info("b", None, 2)];
        let p = RetentionPolicy {
            keep_last: 0,
            keep_every: Some(0),
        };
        assert_eq!(p.keep_flags(&infos), vec![false, true]);
        assert!(p.keep_flags(&[]).is_empty());
    }

    fn age(path: &std::path::Path) {
        let old = SystemTime::now() - Duration::from_secs(7200);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }

    /// Issue 40, row 8: on a local root that also holds user files, gc deleted every
    /// `<name>#<digits>` file and every empty folder anywhere under the root (and any
    /// directory without a manifest), and said nothing about it.
    #[tokio::test]
    async fn gc_touches_only_its_own_layout_on_a_shared_local_root() {
        use crate::test_util::{save, tick};
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path();
        let root = CheckpointRoot::open_url(&local.to_string_lossy()).unwrap();
        save(&root, "step_1", None, &[("a", b"1")]).await;
        tick();
        save(&root, "step_3", None, &[("a", b"3")]).await;

        // The user's things, all old, all named like what gc used to sweep.
        let user_files = [
            local.join("notes#1"),
            local.join("mydata").join("img#2"),
            local.join("step_1").join("mine#3"),
            local.join("step_1").join("readme.txt"),
            local.join("userdir").join("attempt-x").join("file"),
            local.join("userdir").join("__0_0.distcp"),
        ];
        for f in &user_files {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, b"mine").unwrap();
            age(f);
        }
        let user_empty = local.join("mydata").join("empty");
        std::fs::create_dir_all(&user_empty).unwrap();
        // What a killed save leaves: a staging file in an attempt directory.
        let dead = local
            .join("step_2")
            .join("attempt-0000000000001-0000000000000001");
        std::fs::create_dir_all(&dead).unwrap();
        let staging = dead.join("__0_0.distcp#1");
        std::fs::write(&staging, b"partial").unwrap();
        age(&staging);

        let opts = GcOptions {
            policy: RetentionPolicy {
                keep_last: 1,
                keep_every: None,
            },
            leftovers_older_than: Duration::ZERO,
            dry_run: false,
            local_root: None,
        };
        let report = root.gc(&opts).await.unwrap();
        assert_eq!(report.kept, vec!["step_3"]);
        assert_eq!(report.deleted, vec!["step_1"]);
        for f in &user_files {
            assert!(f.exists(), "{} was deleted", f.display());
        }
        assert!(user_empty.exists(), "a user's empty folder was deleted");
        assert_eq!(report.foreign_dirs, vec!["userdir"]);
        assert_eq!(report.foreign_objects, 1, "step_1/readme.txt: {report:?}");
        assert!(report.leftover_dirs_deleted.is_empty(), "{report:?}");
        // What it did remove, it reports: the staging file and the folders it emptied.
        assert_eq!(report.local_staging_files_deleted, 1);
        assert!(!staging.exists() && !local.join("step_2").exists());
        assert!(report.local_paths_deleted.contains(&staging));
        assert!(report.local_paths_deleted.contains(&local.join("step_2")));
        for p in &report.local_paths_deleted {
            assert!(
                p.starts_with(local.join("step_2")) || p.starts_with(local.join("step_1")),
                "{}",
                p.display()
            );
        }
        assert!(root.verify("step_3").await.unwrap().is_ok());
    }
}
