//! Where this node's cache folder is: `<cache-root>/<run-id>/<node-rank>/` (the cache-layout
//! contract in docs/cache.md), and the one precedence every entry point follows — `shardstream
//! run`, `stream`, `mount`, the Rust `StreamingDataset` and the Python binding all call
//! [`locate`] (or [`locate_resolved`] once they hold a [`Resolved`]).

use std::path::{Path, PathBuf};

use crate::error::{IdentityError, Result};
use crate::resolve::{
    resolve_with, validate_run_id, Overrides, Resolved, CACHE_DIR_ENV, CACHE_ROOT_ENV,
};

/// What a caller was told explicitly (command-line flags, function arguments); every field left
/// `None` falls back on the environment, then on the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheOverrides {
    /// The node's folder itself (`--cache-dir`, Mosaic's `local`): beats everything else and
    /// needs no run id.
    pub cache_dir: Option<PathBuf>,
    /// The cache root (`--cache-root`, `cache_root=`).
    pub cache_root: Option<PathBuf>,
    /// The run id and node rank (`--run-id`, `--node-rank`).
    pub run: Overrides,
}

/// The cache root when no flag names one: `SHARDSTREAM_CACHE_ROOT`, else
/// `$XDG_CACHE_HOME/shardstream`, else `$HOME/.cache/shardstream`, else an error
/// ([`IdentityError::NoCacheRoot`]): a predictable folder in `/tmp` would let another user of the
/// machine plant it first. The deploy manifests always set the root (or the folder itself).
pub fn default_cache_root(env: &impl Fn(&str) -> Option<String>) -> Result<PathBuf> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());
    if let Some(root) = get(CACHE_ROOT_ENV) {
        return Ok(PathBuf::from(root));
    }
    if let Some(xdg) = get("XDG_CACHE_HOME") {
        return Ok(Path::new(&xdg).join("shardstream"));
    }
    if let Some(home) = get("HOME") {
        return Ok(Path::new(&home).join(".cache").join("shardstream"));
    }
    Err(IdentityError::NoCacheRoot)
}

/// The root the node folders of this process go under: the explicit root, else
/// [`default_cache_root`].
pub fn cache_root(
    overrides: &CacheOverrides,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<PathBuf> {
    match &overrides.cache_root {
        Some(root) => Ok(root.clone()),
        None => default_cache_root(env),
    }
}

/// `<root>/<run_id>/<node_rank>`: the one place the node-folder path is built. The run id is
/// checked with [`validate_run_id`], so no caller can make a path that leaves the root.
pub fn node_dir(root: &Path, run_id: &str, node_rank: u32) -> Result<PathBuf> {
    validate_run_id(run_id).map_err(|reason| IdentityError::InvalidRunId {
        var: "run_id",
        value: run_id.to_string(),
        reason,
    })?;
    Ok(root.join(run_id).join(node_rank.to_string()))
}

/// Where this node's cache folder is, in order:
/// 1. the explicit folder ([`CacheOverrides::cache_dir`]), with no run id needed;
/// 2. `<explicit root>/<run-id>/<node-rank>`;
/// 3. `SHARDSTREAM_CACHE_DIR` as is: the folder was keyed outside, by a volume mounted with
///    `subPathExpr: $(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)` (deploy/), or by a parent
///    `shardstream run` that exported it;
/// 4. `<SHARDSTREAM_CACHE_ROOT or the default root>/<run-id>/<node-rank>`.
///
/// The run id and node rank are resolved ([`resolve_with`]) only where the folder is keyed by
/// them (2 and 4); their errors are returned as they are.
pub fn locate(
    overrides: &CacheOverrides,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<PathBuf> {
    if let Some(dir) = &overrides.cache_dir {
        return Ok(dir.clone());
    }
    if overrides.cache_root.is_none() {
        if let Some(dir) = env(CACHE_DIR_ENV).filter(|v| !v.is_empty()) {
            return Ok(PathBuf::from(dir));
        }
    }
    let resolved = resolve_with(&overrides.run, env)?;
    locate_resolved(overrides, &resolved, env)
}

/// [`locate`] for a caller that has already resolved the run (`shardstream run`, which keeps
/// the [`Resolved`] for the folder's marker and the exports).
pub fn locate_resolved(
    overrides: &CacheOverrides,
    resolved: &Resolved,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<PathBuf> {
    if let Some(dir) = &overrides.cache_dir {
        return Ok(dir.clone());
    }
    if let Some(root) = &overrides.cache_root {
        return node_dir(root, &resolved.run_id, resolved.node_rank);
    }
    if let Some(dir) = env(CACHE_DIR_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    node_dir(
        &default_cache_root(env)?,
        &resolved.run_id,
        resolved.node_rank,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Source;

    fn resolved(run: &str, node: u32) -> Resolved {
        Resolved {
            run_id: run.into(),
            run_id_from: Source::Flag,
            node_rank: node,
            node_rank_from: Source::Flag,
            process: None,
        }
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn root(path: &str) -> CacheOverrides {
        CacheOverrides {
            cache_root: Some(PathBuf::from(path)),
            ..CacheOverrides::default()
        }
    }

    #[test]
    fn keyed_by_run_and_node_and_refuses_escapes() {
        assert_eq!(
            node_dir(Path::new("/efs"), "run1", 3),
            Ok(PathBuf::from("/efs/run1/3"))
        );
        for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", ".hidden", "a b"] {
            assert!(
                matches!(
                    node_dir(Path::new("/efs"), bad, 0),
                    Err(IdentityError::InvalidRunId { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn location_precedence() {
        let r = resolved("r", 1);
        let env = env_of(&[
            ("SHARDSTREAM_CACHE_DIR", "/mnt/node"),
            ("SHARDSTREAM_CACHE_ROOT", "/root"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(
            locate_resolved(&root("/flag"), &r, &env),
            Ok(PathBuf::from("/flag/r/1"))
        );
        let none = CacheOverrides::default();
        assert_eq!(
            locate_resolved(&none, &r, &env),
            Ok(PathBuf::from("/mnt/node"))
        );
        let explicit = CacheOverrides {
            cache_dir: Some(PathBuf::from("/local")),
            ..root("/flag")
        };
        assert_eq!(
            locate_resolved(&explicit, &r, &env),
            Ok(PathBuf::from("/local"))
        );
        let env = env_of(&[("SHARDSTREAM_CACHE_ROOT", "/root"), ("HOME", "/home/u")]);
        assert_eq!(
            locate_resolved(&none, &r, &env),
            Ok(PathBuf::from("/root/r/1"))
        );
        let env = env_of(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")]);
        assert_eq!(
            default_cache_root(&env),
            Ok(PathBuf::from("/xdg/shardstream"))
        );
        let env = env_of(&[("SHARDSTREAM_CACHE_DIR", ""), ("HOME", "/home/u")]);
        assert_eq!(
            locate_resolved(&none, &r, &env),
            Ok(PathBuf::from("/home/u/.cache/shardstream/r/1"))
        );
        assert_eq!(
            default_cache_root(&env_of(&[])),
            Err(IdentityError::NoCacheRoot)
        );
    }

    #[test]
    fn an_explicit_folder_needs_no_run_id() {
        let explicit = CacheOverrides {
            cache_dir: Some(PathBuf::from("/local")),
            ..CacheOverrides::default()
        };
        assert_eq!(locate(&explicit, &env_of(&[])), Ok(PathBuf::from("/local")));
        assert!(matches!(
            locate(&CacheOverrides::default(), &env_of(&[])),
            Err(IdentityError::MissingRunId { .. })
        ));
        let keyed_outside = env_of(&[("SHARDSTREAM_CACHE_DIR", "/mnt/node")]);
        assert_eq!(
            locate(&CacheOverrides::default(), &keyed_outside),
            Ok(PathBuf::from("/mnt/node"))
        );
        let env = env_of(&[("SHARDSTREAM_RUN_ID", "r"), ("HOME", "/h")]);
        assert_eq!(
            locate(&CacheOverrides::default(), &env),
            Ok(PathBuf::from("/h/.cache/shardstream/r/0"))
        );
    }
}
