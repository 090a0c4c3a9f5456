//! Commands declared for their interface but not in this build: `--help` shows their flags, and
//! running them fails with a pointer to their issue.

mod common;

use common::*;

#[test]
fn unbuilt_commands_point_at_their_issue() {
    for (args, issue) in [
        (vec!["stream", "s3://b/ds", "--shuffle", "--seed", "3"], 3),
        (vec!["mount", "s3://b/ds", "/mnt/ds"], 5),
        (vec!["ckpt", "ls", "s3://b/ckpt"], 6),
        (
            vec!["run", "--run-id", "r1", "--", "torchrun", "train.py"],
            7,
        ),
    ] {
        let failed = run(&args).failed();
        assert_eq!(
            failed.stderr.trim(),
            format!("shardstream: error: not available yet in this build: see issue {issue}")
        );
    }
}

#[test]
fn help_lists_every_command_and_the_promised_flags() {
    let help = run(&["--help"]).ok().stdout;
    for command in [
        "shard",
        "merge-index",
        "upload",
        "download",
        "inspect",
        "verify",
        "cat",
        "stream",
        "mount",
        "ckpt",
        "run",
    ] {
        assert!(
            help.contains(&format!("  {command} ")),
            "{command} missing from:\n{help}"
        );
    }
    let shard = run(&["shard", "--help"]).ok().stdout;
    for flag in [
        "--format",
        "--compression",
        "--shard-size",
        "--hashes",
        "--input-format",
        "--workers",
        "--part",
        "--columns",
        "--allow-unsafe-types",
    ] {
        assert!(shard.contains(flag), "{flag} missing from shard --help");
    }
    let stream = run(&["stream", "--help"]).ok().stdout;
    for flag in [
        "--cache-root",
        "--run-id",
        "--node-rank",
        "--num-nodes",
        "--shuffle",
        "--seed",
        "--epoch",
        "--memory-limit",
        "--cache-limit",
    ] {
        assert!(stream.contains(flag), "{flag} missing from stream --help");
    }
    assert!(run(&["mount", "--help"])
        .ok()
        .stdout
        .contains("--foreground"));
    assert!(run(&["cat", "--help"]).ok().stdout.contains("--limit"));
    let ckpt = run(&["ckpt", "--help"]).ok().stdout;
    for action in ["ls", "latest", "verify", "gc", "download"] {
        assert!(ckpt.contains(action), "{action} missing from ckpt --help");
    }
}
