//! How the CLI behaves around the edges (issue 38 part 6, issue 37 parts 4 and 5): a closed
//! stdout ends a command quietly, each cause is printed once, `--json` errors are JSON, a
//! mistyped checkpoint root is an error, completions are generated, configuration errors exit
//! 78, a multi-node command without a node rank is refused, a node folder has one host at a time,
//! and a local dataset streams without `--node-rank`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up helpers outside #[test] fns

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support;
use bytes::Bytes;
use serde_json::Value;
use shardstream_checkpoint::{CheckpointRoot, CommitRequest, UploadConfig};
use shardstream_storage::testing::MotoServer;
use support::{next_line, output, s, sh_wait_for_file, shardstream, spawn_piped, wait_for};

const LIMIT: Duration = Duration::from_secs(120);

/// A small MDS dataset (many samples, so that `cat` and `inspect` have lines to print).
fn dataset(dir: &Path) -> PathBuf {
    let (input, out) = (dir.join("in"), dir.join("ds"));
    for i in 0..300 {
        crate::common::write(
            &input,
            &format!("f{i:04}.txt"),
            format!("sample {i}").as_bytes(),
        );
    }
    let (code, _, stderr) = output(shardstream(&["shard", &s(&input), &s(&out)]));
    assert_eq!(code, 0, "{stderr}");
    out
}

/// Two committed checkpoints under a local `root`, written by the checkpoint crate.
fn checkpoints(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ckpt = CheckpointRoot::open_url(&s(root)).unwrap();
    rt.block_on(async {
        for step in [1, 2] {
            let attempt = ckpt.begin_save(&format!("step_{step}")).await.unwrap();
            let w = ckpt
                .rank_writer(&attempt, 0, &UploadConfig::default())
                .unwrap();
            let rec = w
                .upload_bytes("__0_0.distcp", Bytes::from_static(b"weights"))
                .await
                .unwrap();
            let req = CommitRequest {
                records: vec![rec],
                world_size: 1,
                ..Default::default()
            };
            ckpt.commit(&attempt, req).await.unwrap();
        }
    });
}

/// Runs `cmd` with its stdout closed before it writes anything: (exit code, stderr).
fn with_stdout_closed(mut cmd: Command) -> (i32, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The only read end is ours: dropping it makes every write of the child fail with EPIPE.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = wait_for(&mut child, LIMIT);
    (status.code().unwrap_or(-1), stderr)
}

/// The one JSON object a failed `--json` command writes on stderr.
fn json_error(stderr: &str) -> Value {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"))
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let ckpt = dir.path().join("ckpt");
    checkpoints(&ckpt);
    let (ds, ckpt) = (s(&ds), s(&ckpt));
    for args in [
        vec!["inspect", &ds],
        vec!["inspect", &ds, "--json"],
        vec!["verify", &ds],
        vec!["cat", &ds],
        vec!["cat", &ds, "--json"],
        vec!["ckpt", "ls", &ckpt],
        vec!["ckpt", "latest", &ckpt],
        vec!["completions", "bash"],
    ] {
        let (code, stderr) = with_stdout_closed(shardstream(&args));
        // 128 + SIGPIPE, as a shell reports a Unix tool that the closed pipe ended; no panic,
        // no error line.
        assert_eq!(code, 141, "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn each_cause_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-input");
    let (code, _, stderr) = output(shardstream(&[
        "shard",
        &s(&missing),
        &s(&dir.path().join("out")),
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains(&s(&missing)), "{stderr}");
}

#[test]
fn json_commands_fail_with_one_json_object_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let missing = s(&dir.path().join("nothing-here"));
    for args in [
        vec!["inspect", &missing, "--json"],
        vec!["verify", &missing, "--json"],
        vec!["ckpt", "ls", &missing, "--json"],
    ] {
        let (code, stdout, stderr) = output(shardstream(&args));
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        let v = json_error(&stderr);
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains(&missing)),
            "{args:?}: {v}"
        );
        assert!(v["causes"].is_array(), "{v}");
        assert_eq!(v["exit_code"], 1, "{v}");
    }

    // A usage error under --json: JSON too, with clap's code.
    let (code, _, stderr) = output(shardstream(&["inspect", "--json", "--no-such-flag"]));
    assert_eq!(code, 2, "{stderr}");
    let v = json_error(&stderr);
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("--no-such-flag")),
        "{v}"
    );
    assert_eq!(v["exit_code"], 2);

    // `run` has no --json, but JSON logs make its error JSON: a configuration error, 78.
    let (code, _, stderr) = output(shardstream(&[
        "--log-format",
        "json",
        "run",
        "--cache-root",
        &s(dir.path()),
        "--",
        "true",
    ]));
    assert_eq!(code, 78, "{stderr}");
    let v = json_error(&stderr);
    assert_eq!(v["error"], "resolving the run", "{v}");
    assert!(
        v["causes"][0]
            .as_str()
            .is_some_and(|c| c.contains("SHARDSTREAM_RUN_ID")),
        "{v}"
    );
    assert_eq!(v["exit_code"], 78);

    // The pod's ConfigMap sets the log format through SHARDSTREAM_LOG_FORMAT: the same.
    let mut cmd = shardstream(&["run", "--cache-root", &s(dir.path()), "--", "true"]);
    cmd.env("SHARDSTREAM_LOG_FORMAT", "json");
    let (code, _, stderr) = output(cmd);
    assert_eq!(code, 78, "{stderr}");
    assert_eq!(json_error(&stderr)["exit_code"], 78);
}

#[test]
fn a_refused_setting_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    crate::common::write(&input, "a.txt", b"a");
    let (input, out) = (s(&input), s(&dir.path().join("out")));
    for extra in [&["--hashes", "sha1"][..], &["--compression", "zstd"]] {
        let mut args = vec!["shard", &input, &out, "--format", "wds"];
        args.extend_from_slice(extra);
        let (code, _, stderr) = output(shardstream(&args));
        assert_eq!(code, 78, "{extra:?}: {stderr}");
    }
    let ds = dataset(dir.path());
    let (code, _, stderr) = output(shardstream(&[
        "stream",
        &s(&ds),
        "--cache-root",
        &s(&dir.path().join("cache")),
        "--num-workers",
        "99999999999",
    ]));
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.contains("--num-workers 99999999999 is too large"),
        "{stderr}"
    );
}

#[test]
fn a_mistyped_local_checkpoint_root_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = s(&dir.path().join("ckpts-typo"));
    for action in ["ls", "gc"] {
        let (code, stdout, stderr) = output(shardstream(&["ckpt", action, &missing]));
        assert_eq!(code, 1, "{action}: {stderr}");
        assert!(stdout.is_empty(), "{action}: {stdout}");
        assert!(
            stderr.contains(&format!("checkpoint root {missing} does not exist")),
            "{action}: {stderr}"
        );
    }
    // A root that exists but holds no checkpoint yet is fine (a run before its first save).
    let empty = dir.path().join("ckpts");
    std::fs::create_dir(&empty).unwrap();
    let (code, stdout, stderr) = output(shardstream(&["ckpt", "ls", &s(&empty)]));
    assert_eq!((code, stdout.as_str()), (0, ""), "{stderr}");
    let (code, _, stderr) = output(shardstream(&["ckpt", "gc", &s(&empty), "--dry-run"]));
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_mistyped_s3_checkpoint_root_is_an_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(MotoServer::start()).unwrap();
    rt.block_on(server.create_bucket("ckpts")).unwrap();
    let cli = |args: &[&str]| {
        let mut cmd = shardstream(args);
        cmd.env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ALLOW_HTTP", "true");
        output(cmd)
    };
    for action in ["ls", "gc"] {
        let (code, _, stderr) = cli(&["ckpt", action, "s3://ckpts/run-typo"]);
        assert_eq!(code, 1, "{action}: {stderr}");
        assert!(
            stderr.contains("checkpoint root s3://ckpts/run-typo does not exist"),
            "{action}: {stderr}"
        );
    }
    // Once something is stored under the prefix, the root exists (empty of checkpoints).
    let location = server.open("s3://ckpts/run").unwrap();
    rt.block_on(location.put("notes.txt", Bytes::from_static(b"x")))
        .unwrap();
    let (code, stdout, stderr) = cli(&["ckpt", "ls", "s3://ckpts/run"]);
    assert_eq!((code, stdout.as_str()), (0, ""), "{stderr}");
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, stdout, stderr) = output(shardstream(&["completions", shell]));
        assert_eq!(code, 0, "{shell}: {stderr}");
        for sub in ["inspect", "ckpt", "completions"] {
            assert!(stdout.contains(sub), "{shell} completions lack {sub}");
        }
    }
    let (code, _, _) = output(shardstream(&["completions", "tcsh"]));
    assert_eq!(code, 2);
}

#[test]
fn a_multi_node_command_without_a_node_rank_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let started = root.path().join("started");
    let touch = format!("touch '{}'", started.display());
    let root_s = s(root.path());
    for nnodes in [&["--nnodes=2"][..], &["--nnodes", "2"], &["--nnodes=1:4"]] {
        // `sh -c SCRIPT NAME ARGS...`: the flags are the command's own arguments ($0, $1).
        let mut args = vec![
            "run",
            "--run-id",
            "multi",
            "--cache-root",
            &root_s,
            "--",
            "sh",
            "-c",
            &touch,
        ];
        args.extend_from_slice(nnodes);
        let (code, _, stderr) = output(shardstream(&args));
        assert_eq!(code, 78, "{nnodes:?}: {stderr}");
        assert!(
            stderr.contains("no node rank: the command says --nnodes")
                && stderr.contains("set SHARDSTREAM_NODE_RANK"),
            "{stderr}"
        );
        assert!(!started.exists(), "the command ran despite the refusal");
    }
    // With a node rank (flag or environment), or one node, it runs.
    let mut args = vec![
        "run",
        "--run-id",
        "multi",
        "--cache-root",
        &root_s,
        "--",
        "sh",
        "-c",
        &touch,
        "--nnodes=2",
    ];
    let (code, _, stderr) = output(shardstream(&args).env("SHARDSTREAM_NODE_RANK", "1"));
    assert_eq!(code, 0, "{stderr}");
    assert!(root.path().join("multi/1").is_dir());
    if let Some(last) = args.last_mut() {
        *last = "--nnodes=1";
    }
    let (code, _, stderr) = output(shardstream(&args));
    assert_eq!(code, 0, "{stderr}");
    assert!(root.path().join("multi/0").is_dir());
}

#[test]
fn a_second_host_cannot_take_a_node_folder_while_the_first_holds_it() {
    let root = tempfile::tempdir().unwrap();
    let go = root.path().join("go");
    let root_s = s(root.path());
    let hold = format!("echo ready; {}", sh_wait_for_file(&go));
    let run_as = |host: &str, script: &str| {
        let mut cmd = shardstream(&[
            "run",
            "--run-id",
            "hosts",
            "--cache-root",
            &root_s,
            "--",
            "sh",
            "-c",
            script,
        ]);
        cmd.env("HOSTNAME", host);
        cmd
    };
    let (mut a, mut a_lines) = spawn_piped(&mut run_as("pod-a", &hold));
    assert_eq!(next_line(&mut a_lines), "ready");

    // Another host (a second pod given the same node rank, or a replacement started while the
    // old pod terminates) is refused, with a failure a retry can cure (not 78).
    let (code, _, stderr) = output(run_as("pod-b", "true"));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("is in use by host pod-a (this is pod-b)"),
        "{stderr}"
    );
    // The same host (a container restart) shares it.
    let (code, _, stderr) = output(run_as("pod-a", "true"));
    assert_eq!(code, 0, "{stderr}");

    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_for(&mut a, LIMIT).code(), Some(0));
    // Released: the new host takes it over.
    let (code, _, stderr) = output(run_as("pod-b", "true"));
    assert_eq!(code, 0, "{stderr}");
    let marker = std::fs::read_to_string(root.path().join("hosts/0/SHARDSTREAM-RUN")).unwrap();
    let marker: Value = serde_json::from_str(&marker).unwrap();
    assert_eq!(marker["host"], "pod-b");
}

#[test]
fn a_local_dataset_streams_without_a_node_rank() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path());
    let (code, stdout, stderr) = output(shardstream(&[
        "stream",
        &s(&ds),
        "--cache-root",
        &s(&dir.path().join("cache")),
        "--json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["samples"], 300);
    // Several nodes by the environment and no rank: refused, as a configuration error.
    let (code, _, stderr) = output(
        shardstream(&[
            "stream",
            &s(&ds),
            "--cache-root",
            &s(&dir.path().join("cache")),
        ])
        .env("PET_NNODES", "2"),
    );
    assert_eq!(code, 78, "{stderr}");
    assert!(stderr.contains("SHARDSTREAM_NODE_RANK"), "{stderr}");
}
