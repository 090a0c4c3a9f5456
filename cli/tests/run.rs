//! `shardstream run` as a pod would use it, against real child processes and real signals:
//! exit codes, the exported environment, SIGTERM/SIGINT forwarding and the grace period, the
//! refusals (no run id, torchrun's "none", a folder of another run), two runs side by side,
//! and a `--mount` that fails before the command starts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up helpers outside #[test] fns

use crate::support;
use std::fs;
use std::time::{Duration, Instant};

use support::{kill, next_line, output, s, sh_wait_for_file, shardstream, spawn_piped, wait_for};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn exit_code_is_the_commands() {
    let root = tempfile::tempdir().unwrap();
    let root_s = s(root.path());
    for (script, code) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 42", 42),
        // Killed by a signal: 128 + n, as a shell (and Kubernetes) reports it.
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
    ] {
        let (got, _, stderr) = output(shardstream(&[
            "run",
            "--run-id",
            "codes",
            "--cache-root",
            &root_s,
            "--",
            "sh",
            "-c",
            script,
        ]));
        assert_eq!(got, code, "{script}: {stderr}");
    }
    // A command that cannot be started is a one-line error (its cause said once) and 127, as a
    // shell reports a command not found.
    let (got, _, stderr) = output(shardstream(&[
        "run",
        "--run-id",
        "codes",
        "--cache-root",
        &root_s,
        "--",
        "/nonexistent/trainer",
    ]));
    assert_eq!(got, 127, "{stderr}");
    assert!(
        stderr.contains("could not start /nonexistent/trainer"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    // Found but not executable: 126, as a shell reports it.
    let script = root.path().join("not-executable.sh");
    fs::write(&script, "exit 0\n").unwrap();
    let (got, _, stderr) = output(shardstream(&[
        "run",
        "--run-id",
        "codes",
        "--cache-root",
        &root_s,
        "--",
        &s(&script),
    ]));
    assert_eq!(got, 126, "{stderr}");
}

#[test]
fn the_resolved_env_is_exported_as_documented() {
    let root = tempfile::tempdir().unwrap();
    let echo = r#"echo "$SHARDSTREAM_RUN_ID|$SHARDSTREAM_NODE_RANK|$SHARDSTREAM_CACHE_DIR""#;

    // An Indexed Job pod: run id from the manifest's SHARDSTREAM_RUN_ID, node rank from
    // JOB_COMPLETION_INDEX; the folder under --cache-root.
    let (code, stdout, stderr) = output(
        shardstream(&[
            "-v",
            "--log-format",
            "json",
            "run",
            "--cache-root",
            &s(root.path()),
            "--",
            "sh",
            "-c",
            echo,
        ])
        .env("SHARDSTREAM_RUN_ID", "train-abc")
        .env("JOB_COMPLETION_INDEX", "3"),
    );
    assert_eq!(code, 0, "{stderr}");
    let dir = root.path().join("train-abc/3");
    assert_eq!(stdout.trim(), format!("train-abc|3|{}", dir.display()));
    let marker: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("SHARDSTREAM-RUN")).unwrap()).unwrap();
    assert_eq!(marker["run_id"], "train-abc");
    assert_eq!(marker["node_rank"], 3);
    // The resolved values are logged once, with where each came from.
    let logged: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "resolved run")
        .collect();
    assert_eq!(logged.len(), 1, "{stderr}");
    assert_eq!(logged[0]["run_id"], "train-abc");
    assert_eq!(logged[0]["run_id_from"], "SHARDSTREAM_RUN_ID");
    assert_eq!(logged[0]["node_rank"], 3);
    assert_eq!(logged[0]["node_rank_from"], "JOB_COMPLETION_INDEX");

    // A PyTorchJob pod: RANK is the node index there and must not key anything; PET_NODE_RANK
    // does. The run id comes from the owner-name variable; the folder from SHARDSTREAM_CACHE_ROOT.
    let (code, stdout, stderr) = output(
        shardstream(&["run", "--", "sh", "-c", echo])
            .env("SHARDSTREAM_PYTORCHJOB_NAME", "ptj")
            .env("PET_NODE_RANK", "1")
            .env("RANK", "7")
            .env("SHARDSTREAM_CACHE_ROOT", root.path()),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("ptj|1|{}", root.path().join("ptj/1").display())
    );

    // The manifests key the folder with subPathExpr and pass it as SHARDSTREAM_CACHE_DIR: used
    // as is, even with SHARDSTREAM_CACHE_ROOT set too.
    let mounted = root.path().join("subpath-mount");
    let (code, stdout, stderr) = output(
        shardstream(&["run", "--", "sh", "-c", echo])
            .env("SHARDSTREAM_RUN_ID", "job-x")
            .env("SHARDSTREAM_NODE_RANK", "0")
            .env("SHARDSTREAM_CACHE_DIR", &mounted)
            .env("SHARDSTREAM_CACHE_ROOT", root.path()),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), format!("job-x|0|{}", mounted.display()));

    // Flags beat the environment; TORCHELASTIC_RUN_ID is used when it is not "none".
    let (code, stdout, stderr) = output(
        shardstream(&[
            "run",
            "--run-id",
            "flag-id",
            "--node-rank",
            "5",
            "--cache-root",
            &s(root.path()),
            "--",
            "sh",
            "-c",
            echo,
        ])
        .env("SHARDSTREAM_RUN_ID", "env-id")
        .env("JOB_COMPLETION_INDEX", "2"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("flag-id|5|"), "{stdout}");
    let (code, stdout, stderr) = output(
        shardstream(&[
            "run",
            "--cache-root",
            &s(root.path()),
            "--",
            "sh",
            "-c",
            echo,
        ])
        .env("TORCHELASTIC_RUN_ID", "elastic-7"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("elastic-7|0|"), "{stdout}");
}

#[test]
fn no_run_id_is_a_clear_error_and_torchelastic_none_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let started = root.path().join("started");
    let touch = format!("touch '{}'", started.display());
    let args = [
        "run",
        "--cache-root",
        &s(root.path()),
        "--",
        "sh",
        "-c",
        &touch,
    ];

    let (code, _, stderr) = output(&mut shardstream(&args));
    assert_eq!(code, 78, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(
            "shardstream: error: resolving the run: no run id: set SHARDSTREAM_RUN_ID"
        ) && stderr.contains("--run-id")
            && stderr.contains("TORCHELASTIC_RUN_ID is unset"),
        "{stderr}"
    );

    // torchrun's default --rdzv-id, shared by every run that did not set one.
    let (code, _, stderr) = output(shardstream(&args).env("TORCHELASTIC_RUN_ID", "none"));
    assert_eq!(code, 78, "{stderr}");
    assert!(
        stderr.contains("no run id") && stderr.contains("TORCHELASTIC_RUN_ID is none"),
        "{stderr}"
    );

    // A run id that is not one folder name.
    let (code, _, stderr) = output(shardstream(&args).env("SHARDSTREAM_RUN_ID", "../escape"));
    assert_eq!(code, 78, "{stderr}");
    assert!(stderr.contains("not usable as a folder name"), "{stderr}");

    // Several nodes and no node rank: refused rather than every node sharing folder 0.
    let (code, _, stderr) = output(
        shardstream(&args)
            .env("SHARDSTREAM_RUN_ID", "multi")
            .env("PET_NNODES", "4"),
    );
    assert_eq!(code, 78, "{stderr}");
    assert!(stderr.contains("no node rank: PET_NNODES=4"), "{stderr}");

    assert!(!started.exists(), "the command ran despite the error");
    assert!(!root.path().join("multi").exists());
}

#[test]
fn sigterm_is_forwarded_and_the_command_drains_within_the_grace_period() {
    let root = tempfile::tempdir().unwrap();
    // The trap stands in for a checkpoint upload: takes a moment, writes a marker, exits 0.
    let script = r#"
        trap 'sleep 0.5; echo drained > "$SHARDSTREAM_CACHE_DIR/drained"; exit 0' TERM
        echo ready
        i=0; while [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; exit 99
    "#;
    let (mut run, mut lines) = spawn_piped(&mut shardstream(&[
        "run",
        "--run-id",
        "term",
        "--cache-root",
        &s(root.path()),
        "--grace-period",
        "30s",
        "--",
        "sh",
        "-c",
        script,
    ]));
    assert_eq!(next_line(&mut lines), "ready");
    let start = Instant::now();
    kill("TERM", run.id());
    let status = wait_for(&mut run, LIMIT);
    // The command exited 0, but it was stopped, not finished: 128 + SIGTERM, so that a Job
    // does not count the index as succeeded.
    assert_eq!(status.code(), Some(143));
    assert_eq!(
        fs::read_to_string(root.path().join("term/0/drained")).unwrap(),
        "drained\n"
    );
    // It ended when the command did, not at the end of the grace period.
    assert!(
        start.elapsed() < Duration::from_secs(25),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let root = tempfile::tempdir().unwrap();
    let script = r#"
        trap '' TERM
        echo ready
        i=0; while [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; exit 99
    "#;
    let (mut run, mut lines) = spawn_piped(&mut shardstream(&[
        "run",
        "--run-id",
        "stubborn",
        "--cache-root",
        &s(root.path()),
        "--grace-period",
        "1s",
        "--",
        "sh",
        "-c",
        script,
    ]));
    assert_eq!(next_line(&mut lines), "ready");
    let start = Instant::now();
    kill("TERM", run.id());
    let status = wait_for(&mut run, LIMIT);
    let took = start.elapsed();
    assert_eq!(status.code(), Some(137));
    assert!(took >= Duration::from_secs(1), "killed after {took:?}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn sigint_is_forwarded_and_its_exit_code_kept() {
    let root = tempfile::tempdir().unwrap();
    let script = r#"
        trap 'exit 5' INT
        echo ready
        i=0; while [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; exit 99
    "#;
    let (mut run, mut lines) = spawn_piped(&mut shardstream(&[
        "run",
        "--run-id",
        "int",
        "--cache-root",
        &s(root.path()),
        "--",
        "sh",
        "-c",
        script,
    ]));
    assert_eq!(next_line(&mut lines), "ready");
    kill("INT", run.id());
    assert_eq!(wait_for(&mut run, LIMIT).code(), Some(5));
}

#[test]
fn two_concurrent_runs_on_one_root_never_share_a_folder() {
    let root = tempfile::tempdir().unwrap();
    let go = root.path().join("go");
    // Each run's command claims its folder, reports it, and holds it until `go` exists.
    let script = format!(
        r#"echo "$SHARDSTREAM_RUN_ID" > "$SHARDSTREAM_CACHE_DIR/owner"; echo "$SHARDSTREAM_CACHE_DIR"; {}"#,
        sh_wait_for_file(&go)
    );
    let start = |run_id: &str| {
        spawn_piped(&mut shardstream(&[
            "run",
            "--run-id",
            run_id,
            "--cache-root",
            &s(root.path()),
            "--",
            "sh",
            "-c",
            &script,
        ]))
    };
    let (mut a, mut a_lines) = start("run-a");
    let (mut b, mut b_lines) = start("run-b");
    let dir_a = next_line(&mut a_lines);
    let dir_b = next_line(&mut b_lines);
    assert_eq!(dir_a, s(&root.path().join("run-a/0")));
    assert_eq!(dir_b, s(&root.path().join("run-b/0")));

    // A third run that is pointed at run-a's folder (a hand-written SHARDSTREAM_CACHE_DIR)
    // while run-a is live is refused, and so is one with another node rank.
    for (run_id, node) in [("run-c", "0"), ("run-a", "1")] {
        let (code, _, stderr) = output(
            shardstream(&["run", "--", "true"])
                .env("SHARDSTREAM_RUN_ID", run_id)
                .env("SHARDSTREAM_NODE_RANK", node)
                .env("SHARDSTREAM_CACHE_DIR", &dir_a),
        );
        assert_eq!(code, 78, "{stderr}");
        assert!(
            stderr.contains("belongs to run \"run-a\" node 0") && stderr.contains("never share"),
            "{stderr}"
        );
    }

    fs::write(&go, "").unwrap();
    assert_eq!(wait_for(&mut a, LIMIT).code(), Some(0));
    assert_eq!(wait_for(&mut b, LIMIT).code(), Some(0));
    assert_eq!(
        fs::read_to_string(format!("{dir_a}/owner")).unwrap(),
        "run-a\n"
    );
    assert_eq!(
        fs::read_to_string(format!("{dir_b}/owner")).unwrap(),
        "run-b\n"
    );
}

#[test]
fn a_mount_that_fails_stops_the_run_before_the_command() {
    let root = tempfile::tempdir().unwrap();
    let started = root.path().join("started");
    let mnt = root.path().join("mnt");
    let spec = format!(
        "{}:{}",
        root.path().join("no-such-dataset").display(),
        mnt.display()
    );
    let touch = format!("touch '{}'", started.display());
    let (code, _, stderr) = output(&mut shardstream(&[
        "run",
        "--run-id",
        "mnt",
        "--cache-root",
        &s(root.path()),
        "--mount",
        &spec,
        "--mount-timeout",
        "60s",
        "--",
        "sh",
        "-c",
        &touch,
    ]));
    assert_eq!(code, 1, "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("shardstream: error: mounting ") && last.contains("failed"),
        "{stderr}"
    );
    assert!(!started.exists(), "the command ran without its mount");

    // A value that is not DATASET:PATH is refused by the argument parser.
    let (code, _, stderr) = output(&mut shardstream(&[
        "run",
        "--run-id",
        "mnt",
        "--mount",
        "s3://bucket/ds",
        "--",
        "true",
    ]));
    assert_eq!(code, 2);
    assert!(stderr.contains("expected DATASET:PATH"), "{stderr}");
}

fn is_mounted(path: &std::path::Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let want = s(path);
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

#[test]
fn a_mount_is_ready_before_the_command_starts_and_gone_after_it_ends() {
    let root = tempfile::tempdir().unwrap();
    let input = root.path().join("data.jsonl");
    let lines: String = (0..20).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    fs::write(&input, lines).unwrap();
    let ds = root.path().join("ds");
    let (code, _, stderr) = output(&mut shardstream(&["shard", &s(&input), &s(&ds)]));
    assert_eq!(code, 0, "{stderr}");
    let mnt = root.path().join("mnt");
    let spec = format!("{}:{}", ds.display(), mnt.display());

    // The command finds the dataset mounted (the index served through FUSE is the dataset's),
    // and its exit code is kept; after it, the mount is gone.
    let check = format!(
        "grep -q ' {mnt} fuse' /proc/self/mounts && cmp -s '{ds}/index.json' '{mnt}/shards/index.json' && echo mounted; exit 3",
        mnt = mnt.display(),
        ds = ds.display()
    );
    for _ in 0..2 {
        // Twice: the second run mounts again at the same place, so the first one let go.
        let (code, stdout, stderr) = output(&mut shardstream(&[
            "run",
            "--run-id",
            "mounted",
            "--cache-root",
            &s(&root.path().join("cache")),
            "--mount",
            &spec,
            "--",
            "sh",
            "-c",
            &check,
        ]));
        assert_eq!(code, 3, "{stderr}");
        assert_eq!(stdout, "mounted\n", "{stderr}");
        assert!(!is_mounted(&mnt), "still mounted after the run");
    }
}

#[test]
fn sigterm_while_a_mount_is_pending_stops_the_run_before_the_command() {
    let root = tempfile::tempdir().unwrap();
    // An "S3 server" that accepts connections and never answers: the mount waits on it.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", server.local_addr().unwrap());
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in server.incoming().flatten() {
            held.push(conn);
            let _ = accepted_tx.send(());
        }
    });
    let mnt = root.path().join("mnt");
    let started = root.path().join("started");
    let touch = format!("touch '{}'", started.display());
    let spec = format!("s3://bucket/ds:{}", mnt.display());
    let (mut run, _stdout) = spawn_piped(
        shardstream(&[
            "run",
            "--run-id",
            "pending",
            "--cache-root",
            &s(root.path()),
            "--mount",
            &spec,
            "--",
            "sh",
            "-c",
            &touch,
        ])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1"),
    );
    // The mount process is waiting on the server: the pod is deleted now.
    accepted.recv_timeout(LIMIT).unwrap();
    let start = Instant::now();
    kill("TERM", run.id());
    let status = wait_for(&mut run, LIMIT);
    assert_eq!(status.code(), Some(143));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(!started.exists(), "the command started after SIGTERM");
    // No mount process is left behind.
    let needle = s(&mnt);
    let left: Vec<String> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
