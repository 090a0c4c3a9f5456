//! A deterministic walk of a folder's regular files, refusing symlinks that leave the folder.

use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};

/// One regular file found under the root.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Path relative to the root, components joined with `/`.
    pub rel: String,
    /// Path to open (the root joined with `rel`).
    pub path: PathBuf,
}

/// Every regular file under `root`, sorted by relative path (byte order, which for UTF-8 is code
/// point order). Symlinks are followed when they resolve inside `root`; one that resolves outside,
/// a symlink loop or a name that is not UTF-8 is an error naming it.
pub(crate) fn walk_files(root: &Path) -> Result<Vec<Entry>> {
    walk_files_within(root, root)
}

/// Like [`walk_files`], but symlinks may resolve anywhere inside `boundary` (a folder that holds
/// `root`), and `root` itself must resolve inside it.
pub(crate) fn walk_files_within(root: &Path, boundary: &Path) -> Result<Vec<Entry>> {
    let canonical_boundary = boundary
        .canonicalize()
        .map_err(|e| FormatError::io(boundary, e))?;
    let canonical_root = root.canonicalize().map_err(|e| FormatError::io(root, e))?;
    if !canonical_root.starts_with(&canonical_boundary) {
        return Err(FormatError::UnsafePath {
            path: boundary.display().to_string(),
            name: relative_name(boundary, root)?,
            reason: format!(
                "symlink to {} leaves the input folder",
                canonical_root.display()
            ),
        });
    }
    if !canonical_root.is_dir() {
        return Err(FormatError::InvalidInput {
            path: root.display().to_string(),
            reason: "not a folder".into(),
        });
    }
    let mut entries = Vec::new();
    for entry in walkdir::WalkDir::new(root).follow_links(true).min_depth(1) {
        let entry = entry.map_err(|e| walk_error(root, e))?;
        let rel = relative_name(root, entry.path())?;
        if entry.path_is_symlink() {
            let target = entry
                .path()
                .canonicalize()
                .map_err(|e| FormatError::io(entry.path(), e))?;
            if !target.starts_with(&canonical_boundary) {
                return Err(FormatError::UnsafePath {
                    path: root.display().to_string(),
                    name: rel,
                    reason: format!("symlink to {} leaves the input folder", target.display()),
                });
            }
        }
        if entry.file_type().is_file() {
            entries.push(Entry {
                rel,
                path: entry.path().to_path_buf(),
            });
        }
    }
    entries.sort_unstable_by(|a, b| a.rel.cmp(&b.rel));
    Ok(entries)
}

/// `path` relative to `root`, as a `/`-joined UTF-8 string.
pub(crate) fn relative_name(root: &Path, path: &Path) -> Result<String> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let mut parts = Vec::new();
    for component in rel.components() {
        let part = component
            .as_os_str()
            .to_str()
            .ok_or_else(|| FormatError::InvalidInput {
                path: path.display().to_string(),
                reason: "file name is not valid UTF-8".into(),
            })?;
        parts.push(part);
    }
    Ok(parts.join("/"))
}

fn walk_error(root: &Path, e: walkdir::Error) -> FormatError {
    let path = e.path().unwrap_or(root).to_path_buf();
    if e.loop_ancestor().is_some() {
        return FormatError::InvalidInput {
            path: path.display().to_string(),
            reason: "symlink loop".into(),
        };
    }
    match e.into_io_error() {
        Some(io) => FormatError::io(&path, io),
        None => FormatError::InvalidInput {
            path: path.display().to_string(),
            reason: "cannot walk the folder".into(),
        },
    }
}
