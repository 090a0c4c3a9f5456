//! The Indexed-Job pattern without Kubernetes, shared by the restart tests
//! (`run_restart.rs` in the `it` binary, `one_pod_restart.rs` in its own): see `run_restart.rs`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{free_port, s, shardstream, spawn_piped, venv_bin, workspace};
use serde_json::Value;
use shardstream_storage::testing::MotoServer;

pub const LIMIT: Duration = Duration::from_secs(500);
pub const RUN_ID: &str = "job-restart";
/// Samples of the dataset; two nodes of one process each take 2 per step, so 16 steps are
/// one epoch.
pub const SAMPLES: u64 = 64;

/// Every process descended from `pid` (children first found by their parent in /proc).
pub fn descendants(pid: u32) -> Vec<u32> {
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
pub fn kill_pod(pod: &mut Child) {
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
pub type Attempt = (Option<u64>, String, BTreeMap<u64, Vec<u64>>);

pub fn read_log(path: &Path) -> Vec<Attempt> {
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

pub fn marker(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join("SHARDSTREAM-RUN")).unwrap()).unwrap()
}

/// How the pods' torchrun meet.
#[derive(Clone, Copy)]
pub enum Rendezvous {
    /// `--master-addr/--master-port`: one failure fails every node.
    Static,
    /// `--rdzv-backend c10d --max-restarts 3`, node 0 hosting the store (the indexed-job
    /// overlay's endpoint is pod 0's name): a replaced pod rejoins the running ones.
    C10d,
}

/// The S3 server, the sharded dataset, and how to start a "pod" of the job.
pub struct Job {
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
    pub fn new(steps: u64, rendezvous: Rendezvous) -> Job {
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
        let (code, _, stderr) = super::output(&mut shard);
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
    pub fn start_pod(&self, index: u32) -> Child {
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
            // As the base ConfigMap sets it: see docs/deploy.md on elastic rejoins.
            .env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
            .env("OMP_NUM_THREADS", "1")
            // The launcher and the dataset both key the folder <root>/<run>/<node>.
            .env("SHARDSTREAM_CACHE_ROOT", &self.root)
            .env("SHARDSTREAM_RUN_ID", RUN_ID)
            .env("JOB_COMPLETION_INDEX", index.to_string());
        spawn_piped(&mut cmd).0
    }

    pub fn node_dir(&self, node: u32) -> PathBuf {
        self.root.join(format!("{RUN_ID}/{node}"))
    }

    pub fn log(&self, node: u32) -> Vec<Attempt> {
        read_log(&self.logs.join(format!("node{node}.jsonl")))
    }

    /// Waits until node 1 has trained past the second checkpoint (steps 0..=4 logged).
    pub fn wait_past_second_checkpoint(&self, pods: &mut [&mut Child]) {
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
    pub fn check_resumed(&self) -> (BTreeSet<u64>, u64) {
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

pub fn cached_files(node_dir: &Path) -> BTreeSet<String> {
    fs::read_dir(node_dir.join("data"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
