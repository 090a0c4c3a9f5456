//! The Indexed-Job pattern end to end without Kubernetes, with a pod lost and retried:
//! - a dataset is sharded to a local S3 server (moto on 127.0.0.1);
//! - two `shardstream run` "pods" (JOB_COMPLETION_INDEX 0 and 1, one run id, each in its own
//!   process group) each start `torchrun --nnodes 2 --node-rank $SHARDSTREAM_NODE_RANK` with
//!   the static rendezvous of deploy/overlays/indexed-job, whose worker streams the dataset
//!   with `shardstream.StreamingDataset`, trains a tiny model over gloo and checkpoints
//!   {model, optimizer, step, data position} to S3 with `shardstream.checkpoint.StorageWriter`
//!   every 2 steps;
//! - pod 1 is killed (SIGKILL to every process of the "pod") mid-run; pod 0's worker loses its
//!   peer, torchrun fails and `shardstream run` exits non-zero with it; both pods are started
//!   again, as the Job controller retries failed pods (`backoffLimit`), resume from
//!   `shardstream.checkpoint.latest`, and exit 0;
//! - the resumed job continues at the same data position (the steps done again see the same
//!   samples, and the whole run sees each sample at most once), and the retried pod reuses its
//!   own node folder (same marker, warm cache).

#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up helpers outside #[test] fns

use crate::support;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use shardstream_storage::testing::MotoServer;
use support::{free_port, s, shardstream, spawn_piped, venv_bin, wait_for, workspace};

const LIMIT: Duration = Duration::from_secs(500);
const STEPS: u64 = 12;
const RUN_ID: &str = "job-restart";

/// Every process descended from `pid` (children first found by their parent in /proc).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so read after the last ')'.
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// What a container's death does: SIGKILL to the pod's process and all it started.
fn kill_pod(pod: &mut Child) {
    let tree = descendants(pod.id());
    pod.kill().unwrap();
    for pid in tree {
        // Some may have exited already.
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    pod.wait().unwrap();
}

/// One node's log: a list of attempts, each (resumed_from, cache_dir, steps: step -> ids).
type Attempt = (Option<u64>, String, BTreeMap<u64, Vec<u64>>);

fn read_log(path: &Path) -> Vec<Attempt> {
    let mut attempts: Vec<Attempt> = Vec::new();
    for line in fs::read_to_string(path).unwrap_or_default().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        match v["event"].as_str().unwrap() {
            "start" => attempts.push((
                v["resumed_from"].as_u64(),
                v["cache_dir"].as_str().unwrap().to_string(),
                BTreeMap::new(),
            )),
            "step" => {
                let ids = v["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_u64().unwrap())
                    .collect();
                attempts
                    .last_mut()
                    .unwrap()
                    .2
                    .insert(v["step"].as_u64().unwrap(), ids);
            }
            _ => {}
        }
    }
    attempts
}

fn marker(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join("SHARDSTREAM-RUN")).unwrap()).unwrap()
}

#[test]
fn a_killed_pod_is_retried_and_the_job_resumes_at_the_same_data_position() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache");
    let logs = tmp.path().join("logs");
    fs::create_dir_all(&logs).unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = runtime.block_on(MotoServer::start()).unwrap();
    runtime.block_on(server.create_bucket("data")).unwrap();
    let s3_env = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_ACCESS_KEY_ID", "testing".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];

    // 64 samples {"id": i} in 32 small shards on S3.
    let input = tmp.path().join("data.jsonl");
    let lines: String = (0..64).map(|i| format!("{{\"id\": {i}}}\n")).collect();
    fs::write(&input, lines).unwrap();
    let mut shard = shardstream(&["shard", &s(&input), "s3://data/ds", "--shard-size", "200B"]);
    shard.envs(s3_env.iter().map(|(k, v)| (k, v)));
    let (code, _, stderr) = support::output(&mut shard);
    assert_eq!(code, 0, "{stderr}");

    let torchrun = s(&venv_bin("torchrun"));
    let script = s(&workspace().join("cli/tests/run_support/train_resume.py"));
    let master_port = free_port().to_string();
    let launch = r#"exec "$0" --nnodes 2 --node-rank "$SHARDSTREAM_NODE_RANK" --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$1" --rdzv-id "$SHARDSTREAM_RUN_ID" "$2" s3://data/ds s3://data/ckpt "$3" "$4" 0.7"#;
    let start_pod = |index: u32| {
        let mut cmd = shardstream(&[
            "run",
            "--grace-period",
            "5s",
            "--",
            "sh",
            "-c",
            launch,
            &torchrun,
            &master_port,
            &script,
            &s(&logs),
            &STEPS.to_string(),
        ]);
        cmd.envs(s3_env.iter().map(|(k, v)| (k, v)))
            .env("HOME", tmp.path())
            .env("GLOO_SOCKET_IFNAME", "lo")
            .env("OMP_NUM_THREADS", "1")
            // The launcher and the dataset both key the folder <root>/<run>/<node>.
            .env("SHARDSTREAM_CACHE_ROOT", &root)
            .env("SHARDSTREAM_RUN_ID", RUN_ID)
            .env("JOB_COMPLETION_INDEX", index.to_string());
        spawn_piped(&mut cmd).0
    };

    let mut pod0 = start_pod(0);
    let mut pod1 = start_pod(1);
    let node1 = root.join(format!("{RUN_ID}/1"));
    let log_of = |node: u32| logs.join(format!("node{node}.jsonl"));

    // Wait until node 1 has trained past the second checkpoint (steps 0..=4 logged).
    let deadline = Instant::now() + LIMIT;
    loop {
        let attempts = read_log(&log_of(1));
        if attempts.first().is_some_and(|a| a.2.len() >= 5) {
            break;
        }
        assert!(
            pod0.try_wait().unwrap().is_none() && pod1.try_wait().unwrap().is_none(),
            "a pod ended before the kill"
        );
        assert!(Instant::now() < deadline, "node 1 never got to step 5");
        std::thread::sleep(Duration::from_millis(100));
    }
    let marker_before = marker(&node1);
    kill_pod(&mut pod1);
    // Pod 0's worker loses its peer: torchrun fails, and the pod with it.
    let code = wait_for(&mut pod0, LIMIT).code();
    assert!(matches!(code, Some(c) if c != 0), "pod 0 exited {code:?}");

    // The Job controller retries both pods (same index, same run id).
    let mut pod0 = start_pod(0);
    let mut pod1 = start_pod(1);
    assert_eq!(
        wait_for(&mut pod0, LIMIT).code(),
        Some(0),
        "pod 0 (retried)"
    );
    assert_eq!(
        wait_for(&mut pod1, LIMIT).code(),
        Some(0),
        "pod 1 (retried)"
    );

    let nodes = [read_log(&log_of(0)), read_log(&log_of(1))];
    // Each node: the first attempt started fresh, the last resumed from a committed
    // checkpoint, and every attempt streamed through its own node folder.
    let mut resumed = BTreeSet::new();
    for (node, attempts) in nodes.iter().enumerate() {
        assert_eq!(attempts.len(), 2, "node {node}");
        assert_eq!(attempts[0].0, None);
        let last = attempts.last().unwrap();
        let from = last.0.expect("the last attempt resumed from a checkpoint");
        assert!(
            from >= 2 && from % 2 == 0 && from < STEPS,
            "resumed from {from}"
        );
        assert_eq!(
            last.2.keys().copied().collect::<Vec<_>>(),
            (from..STEPS).collect::<Vec<_>>()
        );
        resumed.insert(from);
        let dir = s(&root.join(format!("{RUN_ID}/{node}")));
        for a in attempts {
            assert_eq!(a.1, dir, "node {node}");
        }
    }
    assert_eq!(
        resumed.len(),
        1,
        "the nodes resumed from different checkpoints"
    );
    let from = *resumed.iter().next().unwrap();

    // The job's samples per step, as finally trained (the last attempt that ran each step),
    // and as first seen (attempt 0, where both nodes got that far).
    let final_step = |step: u64| -> BTreeSet<u64> {
        nodes
            .iter()
            .flat_map(|attempts| {
                attempts
                    .iter()
                    .rev()
                    .find_map(|a| a.2.get(&step))
                    .unwrap()
                    .clone()
            })
            .collect()
    };
    let mut seen = BTreeSet::new();
    for step in 0..STEPS {
        let ids = final_step(step);
        assert_eq!(ids.len(), 4, "step {step}: {ids:?}");
        for id in &ids {
            assert!(seen.insert(*id), "sample {id} trained twice");
        }
        let first: Option<BTreeSet<u64>> = nodes
            .iter()
            .map(|attempts| attempts[0].2.get(&step).cloned())
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect());
        if let Some(first) = first {
            // A step run again after the resume saw exactly the samples it saw before.
            assert_eq!(first, ids, "step {step} (resumed from {from})");
        }
    }
    assert!(seen.iter().all(|id| *id < 64));
    eprintln!(
        "resumed from step {from}; {} samples trained once each",
        seen.len()
    );

    // The retried pod found its own folder: same marker, and the cache it had filled.
    assert_eq!(marker(&node1), marker_before);
    assert!(
        fs::read_dir(node1.join("data")).unwrap().count() > 0,
        "node 1's cache is empty"
    );
}
