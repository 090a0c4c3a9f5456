//! Making the node's cache folder safely on a root that other users may share (an NFS/EFS volume,
//! a node's `/var/cache`): the folder is created private (0700, or the mode the knob
//! `SHARDSTREAM_CACHE_MODE` names for a group-shared root), never reached through a link another
//! user planted, owned by the current user, and a folder that holds someone's files but no
//! shardstream marker is never adopted. `shardstream run` (the launcher's lease) and every dataset
//! (the streamer's cache) call [`prepare_node_folder`] before they put anything in a folder.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The knob for a group-shared cache root: the octal mode new cache folders get (default 0700).
pub const CACHE_MODE_ENV: &str = "SHARDSTREAM_CACHE_MODE";
/// The mode new cache folders get when the knob is not set: the user's alone.
pub const DEFAULT_CACHE_MODE: u32 = 0o700;
/// Files whose presence shows a folder was made by shardstream (the launcher's lease marker and
/// the streamer cache's layout marker).
pub const FOLDER_MARKERS: &[&str] = &["SHARDSTREAM-RUN", "SHARDSTREAM-CACHE"];

/// Why a cache folder was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FolderError {
    /// The folder (or its parent) is a symbolic link that the current user did not make.
    #[error(
        "cache folder {path} is a symbolic link owned by uid {owner}, not by you (uid {uid}): \
         refusing to follow it; remove it, or give the real folder with local= / --cache-dir"
    )]
    ForeignLink {
        /// The link.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The current user.
        uid: u32,
    },
    /// The folder itself is a symbolic link.
    #[error(
        "cache folder {path} is a symbolic link: refusing to follow it (another user of a shared \
         root could point it at your files); give the real folder with local= / --cache-dir"
    )]
    Link {
        /// The link.
        path: PathBuf,
    },
    /// The folder belongs to another user.
    #[error(
        "cache folder {path} belongs to uid {owner}, not to you (uid {uid}): refusing to use it; \
         pick another cache root (SHARDSTREAM_CACHE_ROOT) or run id"
    )]
    ForeignOwner {
        /// The folder.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The current user.
        uid: u32,
    },
    /// Anyone may write into the folder.
    #[error(
        "cache folder {path} is writable by every user (mode {mode:o}): refusing to use it; \
         `chmod o-w` it or pick another cache root"
    )]
    WorldWritable {
        /// The folder.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// The path exists and is not a folder.
    #[error("cache folder {path} exists and is not a folder")]
    NotAFolder {
        /// The path.
        path: PathBuf,
    },
    /// A folder with files in it but no shardstream marker.
    #[error(
        "cache folder {path} already holds files ({example:?}, ...) and no shardstream marker: \
         refusing to adopt it, since eviction and crash recovery would delete files in it; \
         give an empty or new folder"
    )]
    NotOurs {
        /// The folder.
        path: PathBuf,
        /// One of the files it holds.
        example: String,
    },
    /// `SHARDSTREAM_CACHE_MODE` is not an octal mode the rules allow.
    #[error(
        "{CACHE_MODE_ENV}={value:?} is not a usable folder mode: give octal digits such as 0700 \
         (private) or 0770 (shared with the group); others may not write"
    )]
    BadMode {
        /// The value.
        value: String,
    },
    /// A file-system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FolderError + 'a {
    move |source| FolderError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The mode new cache folders get: `SHARDSTREAM_CACHE_MODE` (octal) or 0700.
pub fn cache_mode(env: &impl Fn(&str) -> Option<String>) -> Result<u32, FolderError> {
    let Some(value) = env(CACHE_MODE_ENV).filter(|v| !v.trim().is_empty()) else {
        return Ok(DEFAULT_CACHE_MODE);
    };
    match u32::from_str_radix(value.trim().trim_start_matches("0o"), 8) {
        // The owner must be able to use it; others never write.
        Ok(mode) if mode <= 0o777 && mode & 0o700 == 0o700 && mode & 0o002 == 0 => Ok(mode),
        _ => Err(FolderError::BadMode { value }),
    }
}

/// Creates `dir` (and its missing parents, with the cache mode) if needed, and checks that it is
/// safe to keep a cache in: not a symbolic link, its parent not another user's link, owned by
/// the current user, not writable by everyone, and either empty or already shardstream's.
pub fn prepare_node_folder(
    dir: &Path,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(), FolderError> {
    let mode = cache_mode(env)?;
    let uid = rustix::process::geteuid().as_raw();
    // A link planted in the parent's place by another user is refused before anything is made
    // through it.
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Ok(meta) = fs::symlink_metadata(parent) {
            if meta.file_type().is_symlink() && meta.uid() != uid && meta.uid() != 0 {
                return Err(FolderError::ForeignLink {
                    path: parent.to_path_buf(),
                    owner: meta.uid(),
                    uid,
                });
            }
        }
    }
    let existed = match fs::symlink_metadata(dir) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match DirBuilder::new().recursive(true).mode(mode).create(dir) {
                Ok(()) => {}
                // A racing process made it first: checked below like any existing folder.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("create folder", dir)(e)),
            }
            // The umask may have taken bits the knob asked for (a group-shared root).
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode));
            false
        }
        Err(e) => return Err(io_err("stat", dir)(e)),
    };
    let meta = fs::symlink_metadata(dir).map_err(io_err("stat", dir))?;
    if meta.file_type().is_symlink() {
        return Err(FolderError::Link {
            path: dir.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(FolderError::NotAFolder {
            path: dir.to_path_buf(),
        });
    }
    if meta.uid() != uid {
        return Err(FolderError::ForeignOwner {
            path: dir.to_path_buf(),
            owner: meta.uid(),
            uid,
        });
    }
    let bits = meta.mode() & 0o7777;
    if bits & 0o002 != 0 {
        return Err(FolderError::WorldWritable {
            path: dir.to_path_buf(),
            mode: bits,
        });
    }
    if existed {
        check_adoptable(dir)?;
    }
    Ok(())
}

/// A folder that existed before: shardstream's (a marker), or empty.
fn check_adoptable(dir: &Path) -> Result<(), FolderError> {
    if FOLDER_MARKERS.iter().any(|m| dir.join(m).exists()) {
        return Ok(());
    }
    let mut entries = fs::read_dir(dir).map_err(io_err("list", dir))?;
    match entries.next() {
        None => Ok(()),
        Some(entry) => {
            let entry = entry.map_err(io_err("list", dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // A run's lease lock or a half-written marker: shardstream's own, made a moment ago.
            if name.starts_with("SHARDSTREAM-") || name.starts_with(".SHARDSTREAM-") {
                return Ok(());
            }
            Err(FolderError::NotOurs {
                path: dir.to_path_buf(),
                example: name,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn a_new_folder_is_private_and_an_existing_one_of_ours_is_reused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run").join("0");
        prepare_node_folder(&dir, &no_env).unwrap();
        let mode = fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "{mode:o}");
        let parent_mode = fs::metadata(dir.parent().unwrap()).unwrap().mode() & 0o777;
        assert_eq!(parent_mode & 0o077, 0, "{parent_mode:o}");
        fs::write(dir.join("SHARDSTREAM-CACHE"), "{\"layout\":1}\n").unwrap();
        fs::write(dir.join("data.bin"), "x").unwrap();
        prepare_node_folder(&dir, &no_env).unwrap();
    }

    #[test]
    fn a_planted_link_is_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let victim = root.path().join("victim");
        fs::create_dir(&victim).unwrap();
        fs::write(victim.join("precious.txt"), "keep me").unwrap();
        let run = root.path().join("run");
        fs::create_dir(&run).unwrap();
        std::os::unix::fs::symlink(&victim, run.join("0")).unwrap();
        let err = prepare_node_folder(&run.join("0"), &no_env).unwrap_err();
        assert!(matches!(err, FolderError::Link { .. }), "{err}");
        assert_eq!(
            fs::read_to_string(victim.join("precious.txt")).unwrap(),
            "keep me"
        );
    }

    #[test]
    fn a_folder_of_someone_elses_files_is_not_adopted() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("thesis.tex"), "years of work").unwrap();
        let err = prepare_node_folder(root.path(), &no_env).unwrap_err();
        assert!(
            matches!(&err, FolderError::NotOurs { example, .. } if example == "thesis.tex"),
            "{err}"
        );
        // An empty folder (a fresh volume, Mosaic's `local`) is fine.
        let empty = tempfile::tempdir().unwrap();
        prepare_node_folder(empty.path(), &no_env).unwrap();
    }

    #[test]
    fn a_world_writable_folder_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("open");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_node_folder(&dir, &no_env).unwrap_err();
        assert!(matches!(err, FolderError::WorldWritable { .. }), "{err}");
    }

    #[test]
    fn the_mode_knob_allows_a_group_but_never_others_to_write() {
        let env = |v: &'static str| move |k: &str| (k == CACHE_MODE_ENV).then(|| v.to_string());
        assert_eq!(cache_mode(&no_env).unwrap(), 0o700);
        assert_eq!(cache_mode(&env("0770")).unwrap(), 0o770);
        assert_eq!(cache_mode(&env("750")).unwrap(), 0o750);
        for bad in ["0777", "0600", "rwx", "99"] {
            assert!(cache_mode(&env(bad)).is_err(), "{bad}");
        }
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("shared");
        prepare_node_folder(&dir, &env("0770")).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o770);
    }
}
