//! The mount point as a pod sees it, decided without mounting: is a live mount there, a dead
//! one, or none; may this process ask for `allow_other`.
//!
//! A FUSE sidecar killed with `SIGKILL` (OOM, a failed liveness probe, a node drain that ran out
//! of grace) leaves its mount behind with no server: every request that reaches it (`statfs`, a
//! listing, a read; not always a `stat` of its root, which the kernel may answer from its cache)
//! then fails with `ENOTCONN` ("Transport endpoint is not connected"), and a new mount would
//! stack on the dead one.
//! [`mount()`](crate::mount()) therefore looks first ([`probe`]) and detaches a dead mount
//! ([`clear_dead`]: `fusermount3 -uz`) before it mounts again. The liveness probe of a sidecar
//! (`shardstream mount-check DIR`) is [`probe`] with a time limit: a live mount answers, a dead
//! one says `ENOTCONN`, a hung one does not answer.
//!
//! ```
//! use shardstream_fuse::mountpoint::{allow_other_refusal, is_listed};
//! let mountinfo = "36 35 0:42 / /data/mnt rw,nosuid - fuse.shardstream shardstream:ds ro\n";
//! assert!(is_listed(mountinfo, std::path::Path::new("/data/mnt")));
//! // A non-root user may ask for allow_other only when /etc/fuse.conf says user_allow_other.
//! assert!(allow_other_refusal(1000, Some("#user_allow_other\n")).is_some());
//! assert!(allow_other_refusal(1000, Some("user_allow_other\n")).is_none());
//! assert!(allow_other_refusal(0, None).is_none());
//! ```

use std::io;
use std::path::{Path, PathBuf};

/// The FUSE configuration file that `fusermount3` reads.
pub const FUSE_CONF: &str = "/etc/fuse.conf";

/// What is at a mount point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountState {
    /// A mount whose server answers.
    Live,
    /// A mount whose server is gone: `stat` fails with `ENOTCONN`.
    Dead,
    /// A folder with nothing mounted on it.
    NotMounted,
}

impl MountState {
    /// The state as a probe reports it.
    pub fn describe(self) -> &'static str {
        match self {
            MountState::Live => "mounted and answering",
            MountState::Dead => {
                "a dead mount (ENOTCONN: its server is gone; `shardstream mount` clears it)"
            }
            MountState::NotMounted => "not a mount point",
        }
    }
}

/// Looks at `path`: `ENOTCONN` from `statfs` is a dead mount (`statfs` always reaches the
/// server; a `stat` of the mount's root may be answered from the kernel's attribute cache even
/// when the server is gone); otherwise it is live when `/proc/self/mountinfo` lists it (or,
/// without `/proc`, when its device differs from its parent's). Other errors (no such folder)
/// are returned.
pub fn probe(path: &Path) -> io::Result<MountState> {
    match rustix::fs::statvfs(path) {
        Err(e) if e == rustix::io::Errno::NOTCONN => return Ok(MountState::Dead),
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    let path = absolute(path)?;
    let mounted = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => is_listed(&text, &path),
        Err(_) => other_device_than_parent(&path)?,
    };
    Ok(if mounted {
        MountState::Live
    } else {
        MountState::NotMounted
    })
}

/// Detaches the mount at `path` if it is dead ([`probe`]), with `fusermount3 -uz` (or
/// `fusermount -uz`, `umount -l`); returns whether there was one. A live mount or an empty
/// folder is left alone.
pub fn clear_dead(path: &Path) -> io::Result<bool> {
    if probe_or_missing(path)? != Some(MountState::Dead) {
        return Ok(false);
    }
    tracing::warn!(
        mountpoint = %path.display(),
        "a dead mount (ENOTCONN) is left at the mount point: unmounting it lazily"
    );
    crate::mount::lazy_unmount(path)?;
    match probe_or_missing(path)? {
        Some(MountState::Dead) => Err(io::Error::other(
            "the dead mount is still there after a lazy unmount",
        )),
        _ => Ok(true),
    }
}

fn probe_or_missing(path: &Path) -> io::Result<Option<MountState>> {
    match probe(path) {
        Ok(state) => Ok(Some(state)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why this process may not ask for `allow_other`, if it may not: a user other than root
/// needs a line `user_allow_other` in [`FUSE_CONF`] (`fuse_conf`: its text, `None` when it
/// cannot be read), or `fusermount3` refuses the mount.
pub fn allow_other_refusal(uid: u32, fuse_conf: Option<&str>) -> Option<String> {
    if uid == 0 {
        return None;
    }
    let allowed = fuse_conf.is_some_and(|text| {
        text.lines()
            .any(|line| line.split('#').next().unwrap_or("").trim() == "user_allow_other")
    });
    (!allowed).then(|| {
        format!(
            "--allow-other needs `user_allow_other` on a line of its own in {FUSE_CONF} when \
             mounting as a user other than root (uid {uid}): add it to the image, or mount \
             as root"
        )
    })
}

/// Whether `/proc/self/mountinfo`'s text lists a mount at `path` (its fifth field, with the
/// kernel's octal escapes of space, tab, newline and backslash).
pub fn is_listed(mountinfo: &str, path: &Path) -> bool {
    let Some(want) = path.to_str() else {
        return false;
    };
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|field| unescape(field) == want)
}

fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn absolute(path: &Path) -> io::Result<PathBuf> {
    // Not `canonicalize` of the folder itself: a symlink to a mount point is not the mount.
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => std::fs::canonicalize(p)?,
        _ => std::env::current_dir()?,
    };
    Ok(match path.file_name() {
        Some(name) => parent.join(name),
        None => std::fs::canonicalize(path)?,
    })
}

fn other_device_than_parent(path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = path.parent() else {
        return Ok(true);
    };
    Ok(std::fs::metadata(path)?.dev() != std::fs::metadata(parent)?.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped_and_matched_whole() {
        let text = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    40 22 0:50 / /tmp/a\\040b rw - fuse.shardstream shardstream:x ro\n";
        assert!(is_listed(text, Path::new("/tmp/a b")));
        assert!(is_listed(text, Path::new("/")));
        assert!(!is_listed(text, Path::new("/tmp/a")));
        assert!(!is_listed(text, Path::new("/tmp")));
    }

    #[test]
    fn allow_other_needs_the_fuse_conf_line_for_a_user_only() {
        assert_eq!(allow_other_refusal(0, None), None);
        assert_eq!(allow_other_refusal(1000, Some("user_allow_other\n")), None);
        assert_eq!(
            allow_other_refusal(1000, Some("  user_allow_other  # shared\nmount_max = 9\n")),
            None
        );
        for conf in [
            None,
            Some(""),
            Some("#user_allow_other\n"),
            Some("mount_max = 1\n"),
        ] {
            let refusal = allow_other_refusal(1000, conf).unwrap_or_default();
            assert!(
                refusal.contains("user_allow_other") && refusal.contains(FUSE_CONF),
                "{conf:?}: {refusal}"
            );
        }
    }

    #[test]
    fn a_plain_folder_is_not_mounted_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe(dir.path()).unwrap(), MountState::NotMounted);
        assert!(!clear_dead(dir.path()).unwrap());
        assert!(!clear_dead(&dir.path().join("gone")).unwrap());
        assert_eq!(
            probe(&dir.path().join("gone")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(probe(Path::new("/proc")).unwrap(), MountState::Live);
    }
}
