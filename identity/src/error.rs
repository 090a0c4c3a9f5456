//! The identity crate's error type: one enum, each variant naming the variable or value it is
//! about, worded so that the one-line message tells the user what to set or fix.

/// A `Result` with [`IdentityError`].
pub type Result<T, E = IdentityError> = std::result::Result<T, E>;

/// Why this process's run, node or cache folder could not be worked out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// No source gave a run id. A random one would orphan the cache at the next restart, so the
    /// resolver refuses instead.
    #[error(
        "no run id: set SHARDSTREAM_RUN_ID (the deploy/ manifests pass the Job, JobSet or \
         PyTorchJob name into it) or pass --run-id; TORCHELASTIC_RUN_ID is {torchelastic}"
    )]
    MissingRunId {
        /// What `TORCHELASTIC_RUN_ID` held (`unset`, or torchrun's default `"none"`).
        torchelastic: String,
    },
    /// A run id that cannot be used as one folder name.
    #[error("run id {value:?} (from {var}) is not usable as a folder name: {reason}")]
    InvalidRunId {
        /// Where it came from (an environment variable, `--run-id`, or `run_id`).
        var: &'static str,
        /// The value.
        value: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// No source gave a node rank while the environment says there are several nodes, so a
    /// default of 0 would make every node share one cache folder.
    #[error(
        "no node rank: {hint}; set SHARDSTREAM_NODE_RANK (for an elastic PyTorchJob, from the \
         pod label training.kubeflow.org/replica-index) or run under an Indexed Job"
    )]
    MissingNodeRank {
        /// What in the environment shows this is a multi-node run.
        hint: String,
    },
    /// An environment variable that must hold a non-negative integer does not.
    #[error("{var}={value:?} is not a non-negative integer")]
    InvalidInteger {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// No cache root is set and there is no home folder to put the default one in.
    #[error(
        "no cache root: set SHARDSTREAM_CACHE_ROOT (or pass --cache-root / cache_root=); \
         neither XDG_CACHE_HOME nor HOME is set, and a predictable folder in /tmp would let \
         another user of the machine plant it first"
    )]
    NoCacheRoot,
    /// The process rank variables contradict each other.
    #[error("inconsistent torchrun environment: {reason}")]
    InconsistentRanks {
        /// Which numbers disagree.
        reason: String,
    },
}
