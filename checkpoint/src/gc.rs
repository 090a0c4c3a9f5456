//! Retention and garbage collection.
//!
//! `gc` deletes committed checkpoints the [`RetentionPolicy`] does not keep (never the latest;
//! the manifest goes first, so a crash mid-delete leaves an uncommitted leftover, never a torn
//! checkpoint), deletes leftovers of dead saves (uncommitted directories, and objects of other
//! attempts inside committed ones) once their newest object is older than a threshold, and
//! leaves alone any directory whose manifest does not read (it may be a newer format).
//!
//! Orphaned multipart uploads: `object_store` exposes no ListMultipartUploads, so gc cannot see
//! the parts a killed process left behind on S3. Every failed or dropped upload is aborted by
//! the writer itself; for processes killed outright, configure the bucket lifecycle rule
//! `AbortIncompleteMultipartUpload` (`docs/checkpoints.md` has it). On a POSIX directory the
//! equivalent leftovers are `<file>#<n>` staging files, which `object_store` hides from listings;
//! when [`GcOptions::local_root`] names the directory, gc removes those (and empty directories).

use crate::catalog::{CheckpointInfo, Entry};
use crate::error::{CheckpointError, Result};
use crate::layout::join;
use crate::metrics::add;
use crate::CheckpointRoot;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{info, info_span, warn, Instrument};

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
    /// Local staging files (`<file>#<n>`) removed.
    pub local_staging_files_deleted: u64,
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
                Entry::Committed(m) => committed.push(*m),
                Entry::Uncommitted(id) => uncommitted.push(id),
                Entry::Unreadable(id) => report.unreadable.push(id),
            }
        }
        let mut infos: Vec<(CheckpointInfo, usize)> = committed
            .iter()
            .enumerate()
            .map(|(i, m)| (CheckpointInfo::from_manifest(m), i))
            .collect();
        infos.sort_by(|a, b| a.0.order(&b.0));
        let sorted: Vec<CheckpointInfo> = infos.iter().map(|(c, _)| c.clone()).collect();
        let flags = opts.policy.keep_flags(&sorted);

        for ((info, idx), keep) in infos.iter().zip(flags) {
            let Some(m) = committed.get(*idx) else {
                continue;
            };
            if keep {
                report.kept.push(info.id.clone());
                // Objects of other attempts in a committed directory are dead.
                let dir = self.checkpoint_dir(&info.id);
                let mut live: HashSet<Path> = m.files.iter().map(|f| join(&dir, &f.path)).collect();
                live.extend(m.aliases.iter().map(|a| join(&dir, &a.path)));
                live.insert(self.manifest_path(&info.id));
                let objects = self.list_dir(&info.id).await?;
                let (old, young): (Vec<_>, Vec<_>) = objects
                    .into_iter()
                    .filter(|o| !live.contains(&o.location))
                    .partition(|o| o.last_modified.timestamp_millis() <= cutoff_ms);
                if !young.is_empty() {
                    report.young_leftovers += 1;
                }
                self.delete_objects(old, opts.dry_run, &mut report).await?;
            } else {
                info!(id = %info.id, step = ?info.step, "deleting checkpoint outside the retention policy");
                report.deleted.push(info.id.clone());
                let mpath = self.manifest_path(&info.id);
                if !opts.dry_run {
                    // The manifest first: from here on the checkpoint no longer exists.
                    match self.store().delete(&mpath).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(CheckpointError::store("delete", &mpath, e)),
                    }
                    add(&self.metrics().gc_deleted_objects, 1);
                }
                report.objects_deleted += 1;
                // Then the root aliases, so torch's reader stops seeing it before data goes.
                let dir = self.checkpoint_dir(&info.id);
                let aliases: HashSet<Path> =
                    m.aliases.iter().map(|a| join(&dir, &a.path)).collect();
                let (first, rest): (Vec<ObjectMeta>, Vec<ObjectMeta>) = self
                    .list_dir(&info.id)
                    .await?
                    .into_iter()
                    .filter(|o| o.location != mpath)
                    .partition(|o| aliases.contains(&o.location));
                self.delete_objects(first, opts.dry_run, &mut report)
                    .await?;
                self.delete_objects(rest, opts.dry_run, &mut report).await?;
            }
        }

        for id in uncommitted {
            let objects = self.list_dir(&id).await?;
            let newest = objects
                .iter()
                .map(|o| o.last_modified.timestamp_millis())
                .max();
            match newest {
                Some(t) if t <= cutoff_ms => {
                    info!(
                        id,
                        objects = objects.len(),
                        "deleting an uncommitted leftover"
                    );
                    report.leftover_dirs_deleted.push(id);
                    self.delete_objects(objects, opts.dry_run, &mut report)
                        .await?;
                }
                Some(_) => report.young_leftovers += 1,
                None => {}
            }
        }

        let local_root = opts.local_root.as_deref().or(self.local_root());
        if let (Some(local), false) = (local_root, opts.dry_run) {
            let local = local.to_path_buf();
            let cutoff = SystemTime::now()
                .checked_sub(opts.leftovers_older_than)
                .unwrap_or(UNIX_EPOCH);
            let removed = tokio::task::spawn_blocking(move || sweep_local(&local, cutoff, 0))
                .await
                .unwrap_or(0);
            report.local_staging_files_deleted = removed;
        }
        Ok(report)
    }

    async fn list_dir(&self, id: &str) -> Result<Vec<ObjectMeta>> {
        let dir = self.checkpoint_dir(id);
        match self.store().list(Some(&dir)).try_collect().await {
            Ok(v) => Ok(v),
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
        report.bytes_deleted += objects.iter().map(|o| o.size).sum::<u64>();
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

/// Removes `object_store` staging files (`<name>#<digits>`) older than `cutoff` and then empty
/// directories under `dir` (not `dir` itself at depth 0). Returns the staging files removed.
fn sweep_local(dir: &std::path::Path, cutoff: SystemTime, depth: usize) -> u64 {
    if depth > 16 {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            removed += sweep_local(&path, cutoff, depth + 1);
            // Fails harmlessly when not empty.
            let _ = std::fs::remove_dir(&path);
        } else if ft.is_file() && is_staging_name(&entry.file_name().to_string_lossy()) {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| t <= cutoff)
                .unwrap_or(false);
            if old && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

fn is_staging_name(name: &str) -> bool {
    match name.rsplit_once('#') {
        Some((base, suffix)) => {
            !base.is_empty() && !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, step: Option<u64>, t: u64) -> CheckpointInfo {
        CheckpointInfo {
            id: id.into(),
            step,
            created_unix_ms: t,
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

    #[test]
    fn staging_names() {
        assert!(is_staging_name("__0_0.distcp#1"));
        assert!(is_staging_name("x#123"));
        assert!(!is_staging_name("x#"));
        assert!(!is_staging_name("#1"));
        assert!(!is_staging_name("x#a1"));
        assert!(!is_staging_name("plain"));
    }
}
