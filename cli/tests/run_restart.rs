//! The Indexed-Job pattern end to end without Kubernetes, with a pod lost and retried:
//! - a dataset is sharded to a local S3 server (moto on 127.0.0.1);
//! - two `shardstream run` "pods" (JOB_COMPLETION_INDEX 0 and 1, one run id, each in its own
//!   process group) each start `torchrun --nnodes 2 --node-rank $SHARDSTREAM_NODE_RANK`, whose
//!   worker streams the dataset with `shardstream.StreamingDataset`, trains a tiny model over
//!   gloo and checkpoints {model, optimizer, step, data position} to S3 with
//!   `shardstream.checkpoint.StorageWriter` every 2 steps;
//! - pod 1 is killed (SIGKILL to every process of the "pod") mid-run, then:
//!   - static rendezvous: pod 0's worker loses its peer, torchrun fails and `shardstream run`
//!     exits non-zero with it; both pods are started again, as the Job controller retries
//!     failed pods;
//!   - c10d rendezvous with `--max-restarts`, as deploy/overlays/indexed-job runs it: pod 0
//!     lives on (its torchrun restarts its worker and waits for the rendezvous), and only pod 1
//!     is started again, with the same run id, node rank and cache root, as the Job controller
//!     replaces one failed index (`backoffLimitPerIndex`);
//! - the resumed job continues at the same data position (the steps done again see the same
//!   samples, and the whole run sees each sample at most once; with the c10d job, which runs a
//!   whole epoch, exactly once), and the retried pod reuses its own node folder (same marker,
//!   the shards it had cached still there: the folder's lease accepts the same host again).

#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up helpers outside #[test] fns

use crate::support;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use shardstream_storage::testing::MotoServer;
use support::{free_port, s, shardstream, spawn_piped, venv_bin, wait_for, workspace};

const LIMIT: Duration = Duration::from_secs(500);
const RUN_ID: &str = "job-restart";
/// Samples of the dataset; two nodes of one process each take 2 per step, so 16 steps are
/// one epoch.
const SAMPLES: u64 = 64;

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

/// How the pods' torchrun meet.
#[derive(Clone, Copy)]
enum Rendezvous {
    /// `--master-addr/--master-port`: one failure fails every node.
    Static,
    /// `--rdzv-backend c10d --max-restarts 3`, node 0 hosting the store (the indexed-job
    /// overlay's endpoint is pod 0's name): a replaced pod rejoins the running ones.
    C10d,
}

/// The S3 server, the sharded dataset, and how to start a "pod" of the job.
struct Job {
    tmp: tempfile::TempDir,
    root: PathBuf,
    logs: PathBuf,
    s3_env: Vec<(&'static str, String)>,
    port: String,
    steps: u64,
    rendezvous: Rendezvous,
    _server: MotoServer,
    _runtime: tokio::runtime::Runtime,
}

impl Job {
    fn new(steps: u64, rendezvous: Rendezvous) -> Job {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let logs = tmp.path().join("logs");
        fs::create_dir_all(&logs).unwrap();

        let runtime = tokio::runtime::Runtime::new().unwrap();
        let server = runtime.block_on(MotoServer::start()).unwrap();
        runtime.block_on(server.create_bucket("data")).unwrap();
        let s3_env = vec![
            ("AWS_ENDPOINT_URL", server.endpoint()),
            ("AWS_ACCESS_KEY_ID", "testing".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "testing".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ];

        // SAMPLES samples {"id": i} in small shards (2 per shard) on S3.
        let input = tmp.path().join("data.jsonl");
        let lines: String = (0..SAMPLES).map(|i| format!("{{\"id\": {i}}}\n")).collect();
        fs::write(&input, lines).unwrap();
        let mut shard = shardstream(&["shard", &s(&input), "s3://data/ds", "--shard-size", "200B"]);
        shard.envs(s3_env.iter().map(|(k, v)| (k, v)));
        let (code, _, stderr) = support::output(&mut shard);
        assert_eq!(code, 0, "{stderr}");
        Job {
            tmp,
            root,
            logs,
            s3_env,
            port: free_port().to_string(),
            steps,
            rendezvous,
            _server: server,
            _runtime: runtime,
        }
    }

    /// Starts the "pod" of Job index `index`: `shardstream run` around torchrun.
    fn start_pod(&self, index: u32) -> Child {
        let torchrun = s(&venv_bin("torchrun"));
        let script = s(&workspace().join("cli/tests/run_support/train_resume.py"));
        let rendezvous = match self.rendezvous {
            Rendezvous::Static => r#"--master-addr 127.0.0.1 --master-port "$1""#,
            // Node 0 hosts the store, as pod 0 does where the endpoint is its DNS name.
            Rendezvous::C10d => {
                r#"--rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$1" --rdzv-conf "is_host=$([ "$SHARDSTREAM_NODE_RANK" = 0 ] && echo 1 || echo 0)" --max-restarts 3 --monitor-interval 1"#
            }
        };
        let launch = format!(
            r#"exec "$0" --nnodes 2 --node-rank "$SHARDSTREAM_NODE_RANK" --nproc-per-node 1 {rendezvous} --rdzv-id "$SHARDSTREAM_RUN_ID" "$2" s3://data/ds s3://data/ckpt "$3" "$4" 0.7"#
        );
        let mut cmd = shardstream(&[
            "run",
            "--grace-period",
            "5s",
            "--",
            "sh",
            "-c",
            &launch,
            &torchrun,
            &self.port,
            &script,
            &s(&self.logs),
            &self.steps.to_string(),
        ]);
        cmd.envs(self.s3_env.iter().map(|(k, v)| (k, v)))
            .env("HOME", self.tmp.path())
            .env("GLOO_SOCKET_IFNAME", "lo")
            .env("OMP_NUM_THREADS", "1")
            // The launcher and the dataset both key the folder <root>/<run>/<node>.
            .env("SHARDSTREAM_CACHE_ROOT", &self.root)
            .env("SHARDSTREAM_RUN_ID", RUN_ID)
            .env("JOB_COMPLETION_INDEX", index.to_string());
        spawn_piped(&mut cmd).0
    }

    fn node_dir(&self, node: u32) -> PathBuf {
        self.root.join(format!("{RUN_ID}/{node}"))
    }

    fn log(&self, node: u32) -> Vec<Attempt> {
        read_log(&self.logs.join(format!("node{node}.jsonl")))
    }

    /// Waits until node 1 has trained past the second checkpoint (steps 0..=4 logged).
    fn wait_past_second_checkpoint(&self, pods: &mut [&mut Child]) {
        let deadline = Instant::now() + LIMIT;
        loop {
            if self.log(1).first().is_some_and(|a| a.2.len() >= 5) {
                return;
            }
            for pod in pods.iter_mut() {
                assert!(
                    pod.try_wait().unwrap().is_none(),
                    "a pod ended before the kill"
                );
            }
            assert!(Instant::now() < deadline, "node 1 never got to step 5");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Checks both nodes' logs after the job ended: each node ran twice, the second time
    /// resumed from one checkpoint shared by both, in its own node folder; every step was
    /// finally trained on 4 samples, none twice, and a step run again saw the samples it saw
    /// before. Returns the samples trained and the step resumed from.
    fn check_resumed(&self) -> (BTreeSet<u64>, u64) {
        let steps = self.steps;
        let nodes = [self.log(0), self.log(1)];
        let mut resumed = BTreeSet::new();
        for (node, attempts) in nodes.iter().enumerate() {
            assert_eq!(attempts.len(), 2, "node {node}");
            assert_eq!(attempts[0].0, None);
            let last = attempts.last().unwrap();
            let from = last.0.expect("the last attempt resumed from a checkpoint");
            assert!(
                from >= 2 && from % 2 == 0 && from < steps,
                "resumed from {from}"
            );
            assert_eq!(
                last.2.keys().copied().collect::<Vec<_>>(),
                (from..steps).collect::<Vec<_>>()
            );
            resumed.insert(from);
            let dir = s(&self.node_dir(node as u32));
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

        // The job's samples per step, as finally trained (the last attempt that ran each
        // step), and as first seen (attempt 0, where both nodes got that far).
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
        for step in 0..steps {
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
        assert!(seen.iter().all(|id| *id < SAMPLES));
        (seen, from)
    }
}

fn cached_files(node_dir: &Path) -> BTreeSet<String> {
    fs::read_dir(node_dir.join("data"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_killed_pod_is_retried_and_the_job_resumes_at_the_same_data_position() {
    let job = Job::new(12, Rendezvous::Static);
    let mut pod0 = job.start_pod(0);
    let mut pod1 = job.start_pod(1);
    let node1 = job.node_dir(1);
    job.wait_past_second_checkpoint(&mut [&mut pod0, &mut pod1]);
    let marker_before = marker(&node1);
    kill_pod(&mut pod1);
    // Pod 0's worker loses its peer: torchrun fails, and the pod with it.
    let code = wait_for(&mut pod0, LIMIT).code();
    assert!(matches!(code, Some(c) if c != 0), "pod 0 exited {code:?}");

    // The Job controller retries both pods (same index, same run id).
    let mut pod0 = job.start_pod(0);
    let mut pod1 = job.start_pod(1);
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
    let (seen, from) = job.check_resumed();
    eprintln!(
        "resumed from step {from}; {} samples trained once each",
        seen.len()
    );

    // The retried pod found its own folder: same marker, and the cache it had filled.
    assert_eq!(marker(&node1), marker_before);
    assert!(!cached_files(&node1).is_empty(), "node 1's cache is empty");
}

#[test]
fn one_killed_pod_is_replaced_alone_and_rejoins_the_running_job() {
    // 16 steps of 4 samples: the whole epoch of 64.
    let job = Job::new(SAMPLES / 4, Rendezvous::C10d);
    let mut pod0 = job.start_pod(0);
    let mut pod1 = job.start_pod(1);
    let node1 = job.node_dir(1);
    job.wait_past_second_checkpoint(&mut [&mut pod0, &mut pod1]);
    let marker_before = marker(&node1);
    let cached_before = cached_files(&node1);
    assert!(!cached_before.is_empty(), "node 1 cached nothing yet");
    kill_pod(&mut pod1);

    // Pod 0 is not touched: its torchrun restarts its worker and waits for node 1. The Job
    // controller replaces index 1 only (same run id, node rank and cache root).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        pod0.try_wait().unwrap().is_none(),
        "pod 0 ended with its peer"
    );
    let mut pod1 = job.start_pod(1);
    assert_eq!(
        wait_for(&mut pod1, LIMIT).code(),
        Some(0),
        "pod 1 (replaced)"
    );
    assert_eq!(
        wait_for(&mut pod0, LIMIT).code(),
        Some(0),
        "pod 0 (never restarted)"
    );

    // Node 0's worker ran twice inside the one pod; every sample of the epoch exactly once.
    let (seen, from) = job.check_resumed();
    assert_eq!(seen, (0..SAMPLES).collect::<BTreeSet<_>>());
    eprintln!(
        "one pod replaced, resumed from step {from}; the epoch's {SAMPLES} samples once each"
    );

    // The replaced pod took its own folder back (the lease accepted the same host) and found
    // the shards it had cached before the kill.
    assert_eq!(marker(&node1), marker_before);
    let cached_after = cached_files(&node1);
    assert!(
        cached_before.is_subset(&cached_after),
        "cache of node 1 lost files: before {cached_before:?}, after {cached_after:?}"
    );
}
