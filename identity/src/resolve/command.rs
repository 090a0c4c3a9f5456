//! What the wrapped command line says about the number of nodes. `shardstream run -- torchrun
//! --nnodes=2 ...` with no node rank anywhere would put both nodes in folder 0; the environment
//! check ([`super::resolve_with`]) cannot see a flag, so the launcher passes its command here.
//!
//! Read from the arguments alone (no I/O): `--nnodes N`, `--nnodes=N` and the elastic
//! `MIN:MAX` form (the maximum decides) of torchrun and `python -m torch.distributed.run`,
//! DeepSpeed's `--num_nodes` and Accelerate's `--num_machines` (either spelling, `-` or `_`).
//! Every argument is read, also those after the training script: a script's own `--nnodes 2`
//! makes a false alarm, which costs setting `SHARDSTREAM_NODE_RANK` (or `--node-rank`), while
//! a miss would make two nodes share a cache folder. A command that hides its flags (`sh -c
//! "torchrun ..."`, a wrapper script) is not seen through: set the node rank there.

use std::ffi::OsStr;

use super::{resolve_with, Overrides, Resolved, Source};
use crate::error::{IdentityError, Result};

/// The flags that give a launcher's number of nodes.
const NNODES_FLAGS: &[&str] = &[
    "--nnodes",
    "--num-nodes",
    "--num_nodes",
    "--num-machines",
    "--num_machines",
];

/// The flag (as written, `--nnodes=2`) by which `command` says it runs on more than one node,
/// if it does.
pub fn multi_node_flag<S: AsRef<OsStr>>(command: &[S]) -> Option<String> {
    let args: Vec<String> = command
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    for (i, arg) in args.iter().enumerate() {
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (arg.as_str(), args.get(i + 1).map(String::as_str)),
        };
        if !NNODES_FLAGS.contains(&flag) {
            continue;
        }
        let Some(value) = value else { continue };
        // `N` or `MIN:MAX`: the maximum decides.
        let max = value.rsplit(':').next().unwrap_or(value);
        if max.trim().parse::<u32>().is_ok_and(|n| n > 1) {
            return Some(format!("the command says {flag}={value}"));
        }
    }
    None
}

/// [`resolve_with`] for a launcher about to run `command`: as well as the environment, the
/// command's own flags ([`multi_node_flag`]) may say there are several nodes, and then a node
/// rank that nothing set is refused ([`IdentityError::MissingNodeRank`]) instead of defaulting
/// to 0.
pub fn resolve_for_command<S: AsRef<OsStr>>(
    overrides: &Overrides,
    command: &[S],
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Resolved> {
    let resolved = resolve_with(overrides, env)?;
    if resolved.node_rank_from == Source::Default {
        if let Some(hint) = multi_node_flag(command) {
            return Err(IdentityError::MissingNodeRank { hint });
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnodes_in_every_form() {
        for (command, want) in [
            (
                &["torchrun", "--nnodes=2", "train.py"][..],
                Some("--nnodes=2"),
            ),
            (
                &["torchrun", "--nnodes", "2", "train.py"],
                Some("--nnodes=2"),
            ),
            (&["torchrun", "--nnodes=1:4", "t.py"], Some("--nnodes=1:4")),
            (
                &["torchrun", "--nnodes", "2:2", "t.py"],
                Some("--nnodes=2:2"),
            ),
            (
                &["python", "-m", "torch.distributed.run", "--nnodes", "3"],
                Some("--nnodes=3"),
            ),
            (
                &["deepspeed", "--num_nodes", "2", "t.py"],
                Some("--num_nodes=2"),
            ),
            (
                &["accelerate", "launch", "--num-machines=2"],
                Some("--num-machines=2"),
            ),
            (
                &["torchrun", "--nnodes=1", "--nproc-per-node=8", "t.py"],
                None,
            ),
            (&["torchrun", "--nnodes", "1:1", "t.py"], None),
            (&["torchrun", "--standalone", "t.py"], None),
            (&["torchrun", "--nnodes"], None),
            (&["torchrun", "--nnodes", "x"], None),
            (&["sh", "-c", "torchrun --nnodes=2 t.py"], None),
        ] {
            let got = multi_node_flag(command);
            assert_eq!(
                got.as_deref(),
                want.map(|w| format!("the command says {w}")).as_deref(),
                "{command:?}"
            );
        }
    }

    #[test]
    fn a_multi_node_command_needs_a_node_rank() {
        let env = |name: &str| (name == "SHARDSTREAM_RUN_ID").then(|| "run".to_string());
        let command = ["torchrun", "--nnodes=2", "train.py"];
        let err = resolve_for_command(&Overrides::default(), &command, &env).unwrap_err();
        assert!(
            matches!(&err, IdentityError::MissingNodeRank { hint } if hint.contains("--nnodes=2")),
            "{err}"
        );
        assert!(err.to_string().contains("SHARDSTREAM_NODE_RANK"), "{err}");
        // A node rank from anywhere settles it.
        let flag = Overrides {
            node_rank: Some(1),
            ..Overrides::default()
        };
        assert_eq!(
            resolve_for_command(&flag, &command, &env)
                .unwrap()
                .node_rank,
            1
        );
        let env_rank = |name: &str| match name {
            "SHARDSTREAM_RUN_ID" => Some("run".to_string()),
            "JOB_COMPLETION_INDEX" => Some("1".to_string()),
            _ => None,
        };
        let r = resolve_for_command(&Overrides::default(), &command, &env_rank).unwrap();
        assert_eq!(r.node_rank, 1);
        // One node: 0 by default, as before.
        let single = ["torchrun", "--nnodes=1", "train.py"];
        let r = resolve_for_command(&Overrides::default(), &single, &env).unwrap();
        assert_eq!((r.node_rank, r.node_rank_from), (0, Source::Default));
    }
}
