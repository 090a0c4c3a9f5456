//! gc's sweep of a checkpoint root that is a local directory: the `<file>#<n>` staging files
//! that `object_store` writes before renaming a file into place (hidden from its listings, so
//! only a walk of the directory finds the ones a killed process left), and the folders that
//! became empty.
//!
//! A root may hold other things than checkpoints, so the sweep recognises only its own layout:
//! it enters `<root>/<id>/` only for a valid checkpoint id that is committed or holds an attempt
//! directory of the exact format ([`is_attempt_name`]), never a directory whose manifest does
//! not read, and never follows a symlink. Inside, it removes old staging files anywhere under an
//! attempt directory, and at the checkpoint's top level only staging files of the manifest or of
//! an alias; then attempt folders that are empty, and the checkpoint folder if it became empty.
//! Every removal is logged and returned.

use crate::layout::{is_attempt_name, validate_checkpoint_id, MANIFEST_NAME};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tracing::info;

/// Deepest folder the sweep enters below an attempt directory (rank files are at most a few
/// levels deep; the bound keeps a pathological tree from costing unbounded time).
const MAX_DEPTH: usize = 16;

/// What to sweep.
#[derive(Debug)]
pub(crate) struct LocalSweep {
    /// The checkpoint root as a local directory.
    pub root: PathBuf,
    /// Committed checkpoint ids, with the names of their root aliases.
    pub committed: HashMap<String, Vec<String>>,
    /// Ids never to enter (their manifest does not read).
    pub skip: HashSet<String>,
    /// Staging files modified after this may belong to a running save: kept.
    pub cutoff: SystemTime,
}

/// What a sweep removed.
#[derive(Debug, Default)]
pub(crate) struct Swept {
    /// Staging files removed.
    pub staging_files: u64,
    /// Every file and folder removed.
    pub paths: Vec<PathBuf>,
}

impl LocalSweep {
    /// Runs the sweep (blocking file system calls).
    pub(crate) fn run(&self) -> Swept {
        let mut swept = Swept::default();
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return swept;
        };
        for entry in entries.flatten() {
            // `file_type` does not follow symlinks: a link named like a checkpoint is skipped.
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if !ft.is_dir() || validate_checkpoint_id(id).is_err() || self.skip.contains(id) {
                continue;
            }
            self.sweep_checkpoint(&entry.path(), self.committed.get(id), &mut swept);
        }
        swept
    }

    fn sweep_checkpoint(&self, dir: &Path, aliases: Option<&Vec<String>>, swept: &mut Swept) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut has_attempt = false;
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            if ft.is_dir() && is_attempt_name(name) {
                has_attempt = true;
                self.sweep_tree(&path, 0, swept);
                remove_empty_dir(&path, swept);
            } else if ft.is_file() {
                let ours = staging_base(name).is_some_and(|base| {
                    base == MANIFEST_NAME || aliases.is_some_and(|a| a.iter().any(|n| n == base))
                });
                if ours {
                    self.remove_if_old(&path, swept);
                }
            }
        }
        if aliases.is_some() || has_attempt {
            remove_empty_dir(dir, swept);
        }
    }

    /// Everything below an attempt directory is the save's: old staging files go, and
    /// folders that end up empty.
    fn sweep_tree(&self, dir: &Path, depth: usize, swept: &mut Swept) {
        if depth > MAX_DEPTH {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let path = entry.path();
            if ft.is_dir() {
                self.sweep_tree(&path, depth + 1, swept);
                remove_empty_dir(&path, swept);
            } else if ft.is_file()
                && entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| staging_base(n).is_some())
            {
                self.remove_if_old(&path, swept);
            }
        }
    }

    fn remove_if_old(&self, path: &Path, swept: &mut Swept) {
        let old = std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t <= self.cutoff);
        if old && std::fs::remove_file(path).is_ok() {
            info!(path = %path.display(), "gc removed a staging file of a killed upload");
            swept.staging_files += 1;
            swept.paths.push(path.to_path_buf());
        }
    }
}

/// Removes `dir` if it is empty (the call fails harmlessly otherwise).
fn remove_empty_dir(dir: &Path, swept: &mut Swept) {
    if std::fs::remove_dir(dir).is_ok() {
        info!(path = %dir.display(), "gc removed an empty folder");
        swept.paths.push(dir.to_path_buf());
    }
}

/// For an `object_store` staging name `<base>#<digits>`, its base.
fn staging_base(name: &str) -> Option<&str> {
    let (base, suffix) = name.rsplit_once('#')?;
    (!base.is_empty() && !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()))
        .then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names() {
        assert_eq!(staging_base("__0_0.distcp#1"), Some("__0_0.distcp"));
        assert_eq!(staging_base("x#123"), Some("x"));
        assert_eq!(staging_base("x#"), None);
        assert_eq!(staging_base("#1"), None);
        assert_eq!(staging_base("x#a1"), None);
        assert_eq!(staging_base("plain"), None);
    }
}
