//! Parsing of the location strings users type: `s3://`, `gs://`, `az://`, `file://` and paths.
//!
//! Parsing is pure (no environment, no network): the result says which backend to build and
//! where the prefix is. Relative paths are resolved against a working directory passed in, so
//! that the rules are testable without touching the process.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::error::{Result, StorageError};
use crate::key;

/// A parsed storage location: which backend, which bucket/container, which prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageUrl {
    /// Amazon S3 or an S3-compatible server (`s3://bucket/prefix`, also `s3a://`).
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix, no leading or trailing `/`; empty for the bucket root.
        prefix: String,
    },
    /// Google Cloud Storage (`gs://bucket/prefix`, also `gcs://`).
    Gcs {
        /// Bucket name.
        bucket: String,
        /// Key prefix, no leading or trailing `/`.
        prefix: String,
    },
    /// Azure Blob Storage: `az://container/prefix`, `azure://container/prefix`, or
    /// `abfs[s]://container@account.dfs.core.windows.net/prefix`.
    Azure {
        /// The URL as given, minus its prefix (the Azure builder reads account and container
        /// from it).
        base: String,
        /// Key prefix, no leading or trailing `/`.
        prefix: String,
    },
    /// A local directory (local disk, NFS, EFS), always absolute and normalized.
    Local {
        /// Absolute directory path.
        root: PathBuf,
    },
}

impl StorageUrl {
    /// Parses `s`, resolving a relative path against the process's working directory.
    pub fn parse(s: &str) -> Result<Self> {
        let cwd = std::env::current_dir().map_err(|e| StorageError::io(".", e))?;
        Self::parse_in(s, &cwd)
    }

    /// Parses `s`, resolving a relative path against `cwd`.
    pub fn parse_in(s: &str, cwd: &Path) -> Result<Self> {
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Err(invalid(s, "empty location"));
        }
        match trimmed.split_once("://") {
            Some((scheme, _)) => Self::parse_url(trimmed, &scheme.to_ascii_lowercase()),
            None => Ok(Self::Local {
                root: normalize(&cwd.join(trimmed)),
            }),
        }
    }

    /// True for local directories (where files can be read in place).
    pub fn is_local(&self) -> bool {
        matches!(self, Self::Local { .. })
    }

    fn parse_url(s: &str, scheme: &str) -> Result<Self> {
        let url = url::Url::parse(s).map_err(|e| invalid(s, &e.to_string()))?;
        match scheme {
            "s3" | "s3a" => {
                let (bucket, prefix) = bucket_and_prefix(s, &url)?;
                Ok(Self::S3 { bucket, prefix })
            }
            "gs" | "gcs" => {
                let (bucket, prefix) = bucket_and_prefix(s, &url)?;
                Ok(Self::Gcs { bucket, prefix })
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let (_, prefix) = bucket_and_prefix(s, &url)?;
                let mut base = url.clone();
                base.set_path("");
                Ok(Self::Azure {
                    base: base.to_string().trim_end_matches('/').to_string(),
                    prefix,
                })
            }
            "file" => file_url(s, &url),
            other => Err(invalid(
                s,
                &format!(
                    "unsupported scheme `{other}://`; use s3://, gs://, az://, azure://, \
                     abfs://, file:// or a plain path"
                ),
            )),
        }
    }
}

impl fmt::Display for StorageUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with_prefix = |f: &mut fmt::Formatter<'_>, base: String, prefix: &str| {
            if prefix.is_empty() {
                write!(f, "{base}")
            } else {
                write!(f, "{base}/{prefix}")
            }
        };
        match self {
            Self::S3 { bucket, prefix } => with_prefix(f, format!("s3://{bucket}"), prefix),
            Self::Gcs { bucket, prefix } => with_prefix(f, format!("gs://{bucket}"), prefix),
            Self::Azure { base, prefix } => with_prefix(f, base.clone(), prefix),
            Self::Local { root } => write!(f, "{}", root.display()),
        }
    }
}

fn invalid(url: &str, reason: &str) -> StorageError {
    StorageError::InvalidUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    }
}

/// Splits `scheme://bucket/some/prefix` into the bucket and a validated prefix.
fn bucket_and_prefix(s: &str, url: &url::Url) -> Result<(String, String)> {
    let bucket = url.host_str().unwrap_or_default();
    if bucket.is_empty() {
        return Err(invalid(s, "missing bucket or container name"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(s, "query strings and fragments are not supported"));
    }
    // The raw text, not `url.path()`: the URL parser resolves `a/../..` silently, and a
    // location that climbs out of its own prefix must be refused, not reinterpreted.
    let raw_path = s
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map_or("", |(_, path)| path);
    let path = object_store::path::Path::from_url_path(raw_path)
        .map_err(|e| invalid(s, &e.to_string()))?;
    let prefix = path.as_ref().to_string();
    key::optional_components(&prefix)?;
    Ok((bucket.to_string(), prefix))
}

fn file_url(s: &str, url: &url::Url) -> Result<StorageUrl> {
    match url.host_str() {
        None | Some("") | Some("localhost") => {}
        Some(_) => return Err(invalid(s, "file:// URLs must not name a remote host")),
    }
    let path = url
        .to_file_path()
        .map_err(|()| invalid(s, "not an absolute file path"))?;
    Ok(StorageUrl::Local {
        root: normalize(&path),
    })
}

/// Lexically normalizes an absolute path: drops `.`, resolves `..` against the parent, and
/// removes a trailing `/`. Symlinks are not resolved, so an NFS mount point stays as typed.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<StorageUrl> {
        StorageUrl::parse_in(s, Path::new("/work/dir"))
    }

    #[test]
    fn s3_bucket_and_prefix() {
        let url = parse("s3://my-bucket/data/train/").unwrap();
        assert_eq!(
            url,
            StorageUrl::S3 {
                bucket: "my-bucket".into(),
                prefix: "data/train".into()
            }
        );
        assert_eq!(url.to_string(), "s3://my-bucket/data/train");
        let root = parse("s3://b").unwrap();
        assert_eq!(root.to_string(), "s3://b");
        assert!(matches!(parse("S3A://b/x").unwrap(), StorageUrl::S3 { .. }));
    }

    #[test]
    fn percent_encoded_prefix_is_decoded() {
        let url = parse("s3://b/my%20data/x").unwrap();
        assert!(matches!(url, StorageUrl::S3 { prefix, .. } if prefix == "my data/x"));
    }

    #[test]
    fn gcs_and_azure() {
        assert_eq!(
            parse("gs://bkt/p").unwrap(),
            StorageUrl::Gcs {
                bucket: "bkt".into(),
                prefix: "p".into()
            }
        );
        for s in ["az://cont/a/b", "azure://cont/a/b"] {
            match parse(s).unwrap() {
                StorageUrl::Azure { base, prefix } => {
                    assert!(base.ends_with("://cont"), "{base}");
                    assert_eq!(prefix, "a/b");
                }
                other => panic!("{other:?}"),
            }
        }
        match parse("abfss://cont@acct.dfs.core.windows.net/x").unwrap() {
            StorageUrl::Azure { base, prefix } => {
                assert_eq!(base, "abfss://cont@acct.dfs.core.windows.net");
                assert_eq!(prefix, "x");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn plain_paths_are_resolved_and_normalized() {
        assert_eq!(
            parse("data/../shards/./x/").unwrap(),
            StorageUrl::Local {
                root: "/work/dir/shards/x".into()
            }
        );
        assert_eq!(
            parse("/mnt/efs/ds").unwrap(),
            StorageUrl::Local {
                root: "/mnt/efs/ds".into()
            }
        );
        assert_eq!(
            parse("file:///mnt/efs/a%20b").unwrap(),
            StorageUrl::Local {
                root: "/mnt/efs/a b".into()
            }
        );
        assert!(parse("/x").unwrap().is_local());
    }

    #[test]
    fn refusals_name_the_input() {
        for bad in [
            "",
            "s3://",
            "s3:///prefix",
            "http://host/x",
            "file://otherhost/x",
            "s3://b/a/../../etc",
            "s3://b/a//b",
            "s3://b/x?versionId=1",
        ] {
            let err = parse(bad).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(
                    err,
                    StorageError::InvalidUrl { .. } | StorageError::UnsafePath { .. }
                ),
                "{bad}: {msg}"
            );
        }
        let msg = parse("ftp://x/y").unwrap_err().to_string();
        assert!(
            msg.contains("ftp://x/y") && msg.contains("unsupported scheme"),
            "{msg}"
        );
    }
}
