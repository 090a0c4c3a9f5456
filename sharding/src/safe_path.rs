//! Validation of names that come from untrusted files (index basenames, tar members, LitData chunk
//! names) before they are joined to a folder: no absolute paths, no `..`, no empty components.

use crate::error::{FormatError, Result};

/// Checks that `name`, read from `source`, is a relative path that stays inside its folder.
/// Returns the name unchanged when it is safe.
pub fn check_relative<'a>(source: &str, name: &'a str) -> Result<&'a str> {
    let refuse = |reason: &str| FormatError::UnsafePath {
        path: source.to_string(),
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() {
        return Err(refuse("empty name"));
    }
    if name.starts_with('/') || name.starts_with('\\') || name.contains(':') && cfg!(windows) {
        return Err(refuse("absolute path"));
    }
    if name.contains('\0') {
        return Err(refuse("NUL byte in name"));
    }
    for component in name.split(['/', '\\']) {
        match component {
            ".." => return Err(refuse("'..' component escapes the dataset folder")),
            "" | "." => return Err(refuse("empty or '.' component")),
            _ => {}
        }
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::check_relative;

    #[test]
    fn refuses_escapes() {
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "",
            "a//b",
            "./a",
            "a\0b",
        ] {
            assert!(
                check_relative("index.json", bad).is_err(),
                "{bad:?} accepted"
            );
        }
        for good in ["shard.00000.mds", "0/shard.00000.mds.zstd", "a/b/c.tar"] {
            assert_eq!(check_relative("index.json", good).unwrap(), good);
        }
    }
}
