//! Validation of relative object names (keys below a location's prefix).
//!
//! Names come from index files, manifests and command lines, so they are untrusted: a name
//! must never climb out of its root (`..`), be absolute, or hide an empty component that
//! stores and filesystems would treat differently (`a//b`).

use crate::error::{Result, StorageError};

/// Checks a relative name made of `/`-separated components and returns its components.
///
/// Refused: the empty name, a leading `/` (absolute), empty components (`a//b`, a trailing
/// `/`), `.` and `..` components, and NUL or other control characters.
pub fn components(name: &str) -> Result<Vec<&str>> {
    let unsafe_path = |reason| {
        Err(StorageError::UnsafePath {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return unsafe_path("empty name");
    }
    if name.starts_with('/') {
        return unsafe_path("absolute name; expected a path relative to the location");
    }
    if name.chars().any(char::is_control) {
        return unsafe_path("control character in name");
    }
    let parts: Vec<&str> = name.split('/').collect();
    for part in &parts {
        match *part {
            "" => return unsafe_path("empty path component"),
            "." | ".." => return unsafe_path("`.` or `..` component"),
            _ => {}
        }
    }
    Ok(parts)
}

/// Like [`components`] but for an optional prefix, where the empty string means "everything".
pub fn optional_components(name: &str) -> Result<Vec<&str>> {
    let trimmed = name.strip_suffix('/').unwrap_or(name);
    if trimmed.is_empty() {
        Ok(Vec::new())
    } else {
        components(trimmed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        assert_eq!(components("a/b/c.mds").unwrap(), vec!["a", "b", "c.mds"]);
        assert_eq!(components("shard.00000.mds.zstd").unwrap().len(), 1);
        assert_eq!(components("a b/~x#1").unwrap(), vec!["a b", "~x#1"]);
    }

    #[test]
    fn refuses_escapes_and_empty_components() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a/./b",
            "a//b",
            "a/",
            "a\0b",
            "\n",
        ] {
            let err = components(bad).unwrap_err();
            match err {
                StorageError::UnsafePath { name, .. } => assert_eq!(name, bad),
                other => panic!("unexpected error {other:?}"),
            }
        }
    }

    #[test]
    fn optional_prefix_allows_empty_and_trailing_slash() {
        assert!(optional_components("").unwrap().is_empty());
        assert_eq!(optional_components("ckpt/").unwrap(), vec!["ckpt"]);
        assert!(optional_components("../").is_err());
    }
}
