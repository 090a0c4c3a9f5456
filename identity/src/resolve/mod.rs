//! Who am I: the run id and node rank that key the cache (docs/cache.md), and the process rank of
//! a torchrun worker, read from the environment each launcher sets.
//!
//! Every launcher names things differently, and two of the names are traps:
//! - torchrun's `--rdzv-id` defaults to the literal `"none"`, which every unrelated run shares;
//! - a Kubeflow PyTorchJob sets `RANK` to the *node* index in the pod, before torchrun replaces
//!   it with the process rank, and an elastic restart hands out new ranks. `RANK` never keys a
//!   folder.
//!
//! An empty value counts as unset: the downward API turns a missing label into `""`, which lets
//! one pod template name the labels of several launchers.

mod command;
#[cfg(test)]
mod tests;

pub use command::{multi_node_flag, resolve_for_command};

use std::ffi::OsString;
use std::fmt;
use std::path::Path;

use tracing::{info, warn};

use crate::error::{IdentityError, Result};

/// The run id set explicitly (by the manifests from the owner's name label, by a user, or by
/// `shardstream run` for the processes it starts).
pub const RUN_ID_ENV: &str = "SHARDSTREAM_RUN_ID";
/// The node rank set explicitly (and exported by `shardstream run`).
pub const NODE_RANK_ENV: &str = "SHARDSTREAM_NODE_RANK";
/// The node's cache folder, exported by `shardstream run` and set by a pod whose volume is
/// keyed with `subPathExpr` (see `shardstream_identity::locate`).
pub const CACHE_DIR_ENV: &str = "SHARDSTREAM_CACHE_DIR";
/// The cache root (see `shardstream_identity::locate`).
pub const CACHE_ROOT_ENV: &str = "SHARDSTREAM_CACHE_ROOT";

/// Where the run id may come from, in order. After `SHARDSTREAM_RUN_ID`, the owner-name
/// variables a pod template may fill from labels with the downward API: the JobSet name first
/// (in a JobSet, or a TrainJob which is materialised as one, the `batch.kubernetes.io/job-name`
/// label names a *child* Job, different for every replicated job), then the PyTorchJob name,
/// then the Job name. torchrun's id comes last, and only if it is not its default `"none"`.
pub const RUN_ID_SOURCES: &[&str] = &[
    RUN_ID_ENV,
    "SHARDSTREAM_JOBSET_NAME",
    "SHARDSTREAM_PYTORCHJOB_NAME",
    "SHARDSTREAM_JOB_NAME",
    "TORCHELASTIC_RUN_ID",
];

/// Where the node rank may come from, in order: explicit, the Indexed Job completion index
/// (stable across pod retries), the torchrun flag env the Kubeflow operators set, and torchrun's
/// worker-group rank (inside workers only; reassigned by elastic rendezvous, so last).
pub const NODE_RANK_SOURCES: &[&str] = &[
    NODE_RANK_ENV,
    "JOB_COMPLETION_INDEX",
    "PET_NODE_RANK",
    "GROUP_RANK",
];

/// What torchrun's `--rdzv-id` defaults to: shared by every run that did not set one.
const TORCHRUN_DEFAULT_RDZV_ID: &str = "none";

/// Where a resolved value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag ([`Overrides`]).
    Flag,
    /// This environment variable.
    Env(&'static str),
    /// Nothing set it; a single-node default.
    Default,
    /// Derived by the caller from what it reads ([`Overrides::fallback_run_id`]).
    Derived,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("flag"),
            Source::Env(var) => f.write_str(var),
            Source::Default => f.write_str("default"),
            Source::Derived => f.write_str("derived from the dataset"),
        }
    }
}

/// A torchrun worker's place in the world: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`. Present only when all four are set, which torchrun does for its workers;
/// a pod env with only `RANK`/`WORLD_SIZE` (a PyTorchJob before torchrun) has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRank {
    /// Global process rank.
    pub rank: u32,
    /// Number of processes in the job.
    pub world_size: u32,
    /// Rank among the processes of this node.
    pub local_rank: u32,
    /// Number of processes on this node.
    pub local_world_size: u32,
}

/// Values that beat the environment (the `--run-id` / `--node-rank` flags), and the run id to
/// fall back on where nothing names the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--run-id`.
    pub run_id: Option<String>,
    /// `--node-rank`.
    pub node_rank: Option<u32>,
    /// A run id the caller derived from what it works on ([`derived_run_id`]: a dataset's URLs
    /// and the user), for a run that no launcher names — a plain script, a notebook,
    /// `torchrun --standalone`. Used when no source names the run, and instead of an id torchrun
    /// generated for this launch alone (a uuid in `TORCHELASTIC_RUN_ID`), so that the next run of
    /// the same script finds its cache. `None` keeps the pod contract: no run id is an error.
    pub fallback_run_id: Option<String>,
}

/// The run id of a run that no launcher names, derived from `key` (what the run reads: a
/// dataset's URLs) and the user: `auto-<16 hex digits>`. The same script run again by the same
/// user gets the same id, and so the same cache folder; another dataset or user gets another.
pub fn derived_run_id(key: &str, env: &impl Fn(&str) -> Option<String>) -> String {
    let user = env("USER")
        .or_else(|| env("LOGNAME"))
        .filter(|u| !u.is_empty())
        .unwrap_or_default();
    let h = crate::hash::stable_hash_from(crate::hash::stable_hash(key.as_bytes()), b"\n");
    format!(
        "auto-{:016x}",
        crate::hash::stable_hash_from(h, user.as_bytes())
    )
}

/// The identity of this node of this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The run id: one folder name, stable across pod retries and worker restarts.
    pub run_id: String,
    /// Where the run id came from.
    pub run_id_from: Source,
    /// The node rank: stable across pod retries.
    pub node_rank: u32,
    /// Where the node rank came from.
    pub node_rank_from: Source,
    /// The process rank, inside a torchrun worker.
    pub process: Option<ProcessRank>,
}

impl Resolved {
    /// The variables `shardstream run` exports to its command, so that every process below it
    /// (torchrun, its workers, their DataLoader workers) resolves the same identity and folder.
    pub fn exports(&self, cache_dir: &Path) -> Vec<(&'static str, OsString)> {
        vec![
            (RUN_ID_ENV, OsString::from(&self.run_id)),
            (NODE_RANK_ENV, OsString::from(self.node_rank.to_string())),
            (CACHE_DIR_ENV, cache_dir.as_os_str().to_owned()),
        ]
    }

    /// Logs the resolved values once, with their sources: the line to read when two nodes
    /// fight over a folder.
    pub fn log(&self) {
        match self.process {
            Some(p) => info!(
                run_id = %self.run_id, run_id_from = %self.run_id_from,
                node_rank = self.node_rank, node_rank_from = %self.node_rank_from,
                rank = p.rank, world_size = p.world_size,
                local_rank = p.local_rank, local_world_size = p.local_world_size,
                "resolved run"
            ),
            None => info!(
                run_id = %self.run_id, run_id_from = %self.run_id_from,
                node_rank = self.node_rank, node_rank_from = %self.node_rank_from,
                "resolved run"
            ),
        }
    }
}

/// Reads the process environment; pass it to [`resolve`] outside tests.
pub fn os_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Resolves the run from the environment alone. See [`resolve_with`].
pub fn resolve(env: &impl Fn(&str) -> Option<String>) -> Result<Resolved> {
    resolve_with(&Overrides::default(), env)
}

/// Resolves the run: flags, then the sources in [`RUN_ID_SOURCES`] and [`NODE_RANK_SOURCES`].
///
/// The node rank defaults to 0 only when nothing suggests several nodes (`PET_NNODES` or
/// `NNODES` above 1, `WORLD_SIZE` above `LOCAL_WORLD_SIZE`, or `RANK` set outside a torchrun
/// worker); otherwise it is an error, since every node would share folder 0.
pub fn resolve_with(
    overrides: &Overrides,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Resolved> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());
    let (run_id, run_id_from) = resolve_run_id(overrides, &get)?;
    let process = resolve_process(&get)?;
    let (node_rank, node_rank_from) = resolve_node_rank(overrides, &get, process.is_some())?;
    Ok(Resolved {
        run_id,
        run_id_from,
        node_rank,
        node_rank_from,
        process,
    })
}

/// The node rank alone, as [`resolve_with`] finds it, for a caller that needs no run id (a
/// local dataset read in place has no run folder to take its rank from).
pub fn resolve_node_rank_with(
    overrides: &Overrides,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(u32, Source)> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());
    let process = resolve_process(&get)?;
    resolve_node_rank(overrides, &get, process.is_some())
}

fn resolve_run_id(
    overrides: &Overrides,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(String, Source)> {
    if let Some(id) = overrides.run_id.as_deref().filter(|v| !v.is_empty()) {
        check_run_id(id, "--run-id")?;
        return Ok((id.to_string(), Source::Flag));
    }
    for &var in RUN_ID_SOURCES {
        let Some(id) = get(var) else { continue };
        if var == "TORCHELASTIC_RUN_ID" {
            if id == TORCHRUN_DEFAULT_RDZV_ID {
                continue;
            }
            if looks_like_uuid(&id) {
                // `torchrun --standalone` (and a single-node static launch) invents a uuid4 per
                // invocation: usable, but the next invocation gets a cold cache. A caller that
                // can name the run by what it reads does better.
                if let Some(derived) = fallback(overrides)? {
                    return Ok(derived);
                }
                warn!(
                    run_id = %id,
                    "TORCHELASTIC_RUN_ID looks generated by torchrun --standalone; set \
                     SHARDSTREAM_RUN_ID to keep the cache across restarts"
                );
            }
        }
        check_run_id(&id, var)?;
        return Ok((id, Source::Env(var)));
    }
    if let Some(derived) = fallback(overrides)? {
        return Ok(derived);
    }
    Err(IdentityError::MissingRunId {
        torchelastic: get("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "unset".to_string()),
    })
}

/// The caller's derived run id, checked like any other.
fn fallback(overrides: &Overrides) -> Result<Option<(String, Source)>> {
    match overrides
        .fallback_run_id
        .as_deref()
        .filter(|v| !v.is_empty())
    {
        Some(id) => {
            check_run_id(id, "the derived run id")?;
            Ok(Some((id.to_string(), Source::Derived)))
        }
        None => Ok(None),
    }
}

fn resolve_node_rank(
    overrides: &Overrides,
    get: &impl Fn(&str) -> Option<String>,
    in_worker: bool,
) -> Result<(u32, Source)> {
    if let Some(rank) = overrides.node_rank {
        return Ok((rank, Source::Flag));
    }
    for &var in NODE_RANK_SOURCES {
        if let Some(value) = get(var) {
            return Ok((parse_u32(var, &value)?, Source::Env(var)));
        }
    }
    match multi_node_hint(get, in_worker)? {
        Some(hint) => Err(IdentityError::MissingNodeRank { hint }),
        None => Ok((0, Source::Default)),
    }
}

/// Why the environment looks like one node of several, if it does.
fn multi_node_hint(
    get: &impl Fn(&str) -> Option<String>,
    in_worker: bool,
) -> Result<Option<String>> {
    for var in ["PET_NNODES", "NNODES"] {
        if let Some(value) = get(var) {
            // torchrun accepts `N` or `MIN:MAX`; the maximum decides.
            let max = value.rsplit(':').next().unwrap_or(&value);
            if max.trim().parse::<u32>().is_ok_and(|n| n > 1) {
                return Ok(Some(format!("{var}={value}")));
            }
        }
    }
    if let (Some(world), Some(local)) = (get("WORLD_SIZE"), get("LOCAL_WORLD_SIZE")) {
        let (world, local) = (
            parse_u32("WORLD_SIZE", &world)?,
            parse_u32("LOCAL_WORLD_SIZE", &local)?,
        );
        if world > local {
            return Ok(Some(format!(
                "WORLD_SIZE={world} > LOCAL_WORLD_SIZE={local}"
            )));
        }
    }
    if !in_worker {
        if let Some(rank) = get("RANK") {
            return Ok(Some(format!(
                "RANK={rank} is set outside a torchrun worker (a PyTorchJob or Volcano pod sets it \
                 to the node index, which is not used as a cache key)"
            )));
        }
    }
    Ok(None)
}

fn resolve_process(get: &impl Fn(&str) -> Option<String>) -> Result<Option<ProcessRank>> {
    let (Some(rank), Some(world), Some(local), Some(local_world)) = (
        get("RANK"),
        get("WORLD_SIZE"),
        get("LOCAL_RANK"),
        get("LOCAL_WORLD_SIZE"),
    ) else {
        return Ok(None);
    };
    let p = ProcessRank {
        rank: parse_u32("RANK", &rank)?,
        world_size: parse_u32("WORLD_SIZE", &world)?,
        local_rank: parse_u32("LOCAL_RANK", &local)?,
        local_world_size: parse_u32("LOCAL_WORLD_SIZE", &local_world)?,
    };
    if p.rank >= p.world_size || p.local_rank >= p.local_world_size {
        return Err(IdentityError::InconsistentRanks {
            reason: format!(
                "RANK={} WORLD_SIZE={} LOCAL_RANK={} LOCAL_WORLD_SIZE={}",
                p.rank, p.world_size, p.local_rank, p.local_world_size
            ),
        });
    }
    Ok(Some(p))
}

fn parse_u32(var: &'static str, value: &str) -> Result<u32> {
    value
        .trim()
        .parse::<u32>()
        .map_err(|_| IdentityError::InvalidInteger {
            var,
            value: value.to_string(),
        })
}

/// Checks that `id` can be one folder name under the cache root, and says why not.
pub fn validate_run_id(id: &str) -> std::result::Result<(), &'static str> {
    if id.is_empty() {
        Err("empty")
    } else if id.len() > 255 {
        Err("longer than 255 bytes")
    } else if id.starts_with('.') {
        Err("starts with '.' (reserved for '.', '..' and the gc's own folders)")
    } else if id.contains("..") {
        Err("contains '..'")
    } else if id.contains(['/', '\\']) {
        Err("contains a path separator")
    } else if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Err("contains whitespace or a control character")
    } else {
        Ok(())
    }
}

fn check_run_id(id: &str, var: &'static str) -> Result<()> {
    validate_run_id(id).map_err(|reason| IdentityError::InvalidRunId {
        var,
        value: id.to_string(),
        reason,
    })
}

/// `8-4-4-4-12` hex digits, as `str(uuid.uuid4())` prints.
fn looks_like_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}
