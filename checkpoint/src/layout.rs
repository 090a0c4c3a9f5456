//! Where things live under a checkpoint root, and which names are allowed.
//!
//! ```text
//! <root>/<checkpoint-id>/
//!     _shardstream_manifest.json     the commit point, written last with a create-if-absent put
//!     .metadata                      DCP's metadata, copied here from the attempt only after commit
//!     <attempt>/__0_0.distcp         rank files of one save attempt
//!     <attempt>/.metadata            ...
//! ```
//!
//! Each save runs in a fresh attempt directory (`attempt-<unix-ms>-<random>`), so a rank of a dead
//! attempt that is still writing can only touch its own attempt's objects, never the files a later
//! attempt commits. Names are restricted to a conservative character set so that a key means the
//! same on S3, GCS, Azure and a POSIX directory, and no name can climb out of its directory.

use crate::error::{CheckpointError, Result};
use object_store::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// File name of the manifest inside a checkpoint directory.
pub const MANIFEST_NAME: &str = "_shardstream_manifest.json";

/// Prefix of attempt directory names.
pub const ATTEMPT_PREFIX: &str = "attempt-";

/// Longest allowed path segment, in bytes.
const MAX_SEGMENT: usize = 255;
/// Longest allowed relative path, in bytes.
pub(crate) const MAX_REL_PATH: usize = 1024;
/// Deepest allowed relative path.
const MAX_DEPTH: usize = 8;

fn invalid(name: &str, reason: &'static str) -> CheckpointError {
    CheckpointError::InvalidName {
        name: name.to_owned(),
        reason,
    }
}

fn check_segment(whole: &str, seg: &str) -> Result<()> {
    if seg.is_empty() {
        return Err(invalid(whole, "empty path segment"));
    }
    if seg == "." || seg == ".." {
        return Err(invalid(whole, "'.' and '..' segments are not allowed"));
    }
    if seg.len() > MAX_SEGMENT {
        return Err(invalid(whole, "a path segment is longer than 255 bytes"));
    }
    let ok = seg
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-=+@,".contains(&b));
    if !ok {
        return Err(invalid(
            whole,
            "only ASCII letters, digits and . _ - = + @ , are allowed",
        ));
    }
    Ok(())
}

/// Checks a checkpoint id: one path segment that does not start with `.` or `_` (those names are
/// reserved for files inside a checkpoint directory and for tooling).
pub fn validate_checkpoint_id(id: &str) -> Result<()> {
    check_segment(id, id)?;
    if id.starts_with('.') || id.starts_with('_') {
        return Err(invalid(id, "a checkpoint id may not start with '.' or '_'"));
    }
    Ok(())
}

/// Checks a path relative to a checkpoint directory (`attempt-…/__0_0.distcp`, `.metadata`).
pub fn validate_relative_path(rel: &str) -> Result<()> {
    if rel.len() > MAX_REL_PATH {
        return Err(invalid(rel, "path longer than 1024 bytes"));
    }
    let mut depth = 0;
    for seg in rel.split('/') {
        check_segment(rel, seg)?;
        depth += 1;
    }
    if depth > MAX_DEPTH {
        return Err(invalid(rel, "path deeper than 8 segments"));
    }
    if rel == MANIFEST_NAME {
        return Err(invalid(rel, "the manifest name is reserved"));
    }
    Ok(())
}

/// Checks an attempt directory name.
pub fn validate_attempt(attempt: &str) -> Result<()> {
    check_segment(attempt, attempt)?;
    if !attempt.starts_with(ATTEMPT_PREFIX) {
        return Err(invalid(attempt, "an attempt name starts with 'attempt-'"));
    }
    Ok(())
}

/// Whether `name` is exactly what [`new_attempt_name`] makes: `attempt-`, 13 digits, `-`, 16
/// lowercase hex digits. gc deletes only objects under directories named so (and the
/// manifests and aliases it knows), so a user's folder that merely starts with `attempt-` is
/// not mistaken for a dead save.
pub fn is_attempt_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(ATTEMPT_PREFIX) else {
        return false;
    };
    let b = rest.as_bytes();
    b.len() == 13 + 1 + 16
        && b[..13].iter().all(u8::is_ascii_digit)
        && b[13] == b'-'
        && b[14..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// A fresh attempt name: `attempt-<unix-ms, 13 digits>-<64 random bits in hex>`. Names sort by
/// start time, which makes leftovers easy to read in a listing.
pub fn new_attempt_name() -> String {
    let ms = now_unix_ms();
    let r: u64 = rand::random();
    format!("{ATTEMPT_PREFIX}{ms:013}-{r:016x}")
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The training step encoded in an id: its trailing decimal digits (`step_100`, `global_step100`,
/// `epoch=3-step=1000`, `100`). `None` when the id does not end in a digit or the number
/// overflows `u64`.
pub fn step_from_id(id: &str) -> Option<u64> {
    let digits = id.len() - id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    id.get(id.len() - digits..)?.parse().ok()
}

/// `<root>/<id>`.
pub fn checkpoint_dir(root: &Path, id: &str) -> Path {
    root.clone().join(id)
}

/// `<root>/<id>/_shardstream_manifest.json`.
pub fn manifest_path(root: &Path, id: &str) -> Path {
    checkpoint_dir(root, id).join(MANIFEST_NAME)
}

/// `<dir>/<rel>` for an already validated relative path.
pub fn join(dir: &Path, rel: &str) -> Path {
    rel.split('/').fold(dir.clone(), |p, seg| p.join(seg))
}

/// The part of `full` below `dir` as a `/`-joined string, if `full` is inside `dir`.
pub fn relative_to(full: &Path, dir: &Path) -> Option<String> {
    let parts: Vec<String> = full
        .prefix_match(dir)?
        .map(|p| p.as_ref().to_owned())
        .collect();
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in [
            "step_100",
            "global_step100",
            "epoch=3-step=1000",
            "7",
            "a.b",
        ] {
            validate_checkpoint_id(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "_x",
            ".metadata",
            "sp ace",
            "a#1",
            "ü",
            "x\n",
        ] {
            assert!(validate_checkpoint_id(bad).is_err(), "{bad:?}");
        }
        assert!(validate_checkpoint_id(&"a".repeat(256)).is_err());
    }

    #[test]
    fn relative_paths() {
        validate_relative_path("attempt-1/__0_0.distcp").unwrap();
        validate_relative_path(".metadata").unwrap();
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            "a/../b",
            "../x",
            MANIFEST_NAME,
            "a\\b",
        ] {
            assert!(validate_relative_path(bad).is_err(), "{bad:?}");
        }
        assert!(validate_relative_path(&["a"; 9].join("/")).is_err());
    }

    #[test]
    fn steps() {
        assert_eq!(step_from_id("step_100"), Some(100));
        assert_eq!(step_from_id("global_step100"), Some(100));
        assert_eq!(step_from_id("epoch=3-step=1000"), Some(1000));
        assert_eq!(step_from_id("42"), Some(42));
        assert_eq!(step_from_id("final"), None);
        assert_eq!(step_from_id("step_99999999999999999999999"), None);
    }

    #[test]
    fn attempts_are_valid_and_distinct() {
        let a = new_attempt_name();
        let b = new_attempt_name();
        validate_attempt(&a).unwrap();
        assert!(is_attempt_name(&a), "{a}");
        assert_ne!(a, b);
        for not_ours in [
            "attempt-1",
            "attempt-1-00",
            "attempt-0000000000001-00000000000000AB",
            "attempt-0000000000001-00000000000000ab-x",
            "xattempt-0000000000001-00000000000000ab",
        ] {
            assert!(!is_attempt_name(not_ours), "{not_ours}");
        }
        assert!(validate_attempt("step_1").is_err());
    }

    #[test]
    fn join_and_relative() {
        let dir = Path::from("root/step_1");
        let full = join(&dir, "attempt-1/__0_0.distcp");
        assert_eq!(full.as_ref(), "root/step_1/attempt-1/__0_0.distcp");
        assert_eq!(
            relative_to(&full, &dir).as_deref(),
            Some("attempt-1/__0_0.distcp")
        );
        assert_eq!(relative_to(&dir, &dir), None);
    }
}
