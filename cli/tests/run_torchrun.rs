//! `shardstream run` wrapping a real `torchrun` (the workspace venv's, gloo on 127.0.0.1):
//! - one node, two processes: every worker sees the run id, node rank and cache folder that
//!   `shardstream run` resolved, not torchrun's own rendezvous id;
//! - the Indexed Job pattern without Kubernetes: two `shardstream run` "pods" (node ranks 0 and
//!   1 through JOB_COMPLETION_INDEX, same run id, each in a process group of its own) each start
//!   `torchrun --nnodes 2 --node-rank $SHARDSTREAM_NODE_RANK`; the workers all-reduce across the
//!   two, both pods exit 0 and each node wrote only into its own `<root>/<run>/<node>/`;
//!   once on 127.0.0.1, once with each pod in a network namespace of its own (`ip netns`, a
//!   veth pair between them: two hosts sharing only the cache volume).

#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up helpers outside #[test] fns

use crate::support;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{
    free_port, s, shardstream, spawn_piped, torchrun_turn, venv_bin, wait_for, workspace,
};

/// torch's import and gloo's rendezvous are slow on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(400);

fn worker_script() -> String {
    s(&workspace().join("cli/tests/run_support/worker.py"))
}

/// The environment torch needs besides what `shardstream()` keeps.
fn torch_env(cmd: &mut Command, home: &Path) {
    cmd.env("HOME", home)
        .env("GLOO_SOCKET_IFNAME", "lo")
        .env("OMP_NUM_THREADS", "1");
}

fn read_rank(out: &Path, rank: u64) -> Value {
    let path = out.join(format!("rank{rank}.json"));
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the worker did not finish)", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The files a node's workers left in its cache folder (the launcher's own files aside).
fn worker_files(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rank"))
        .collect()
}

#[test]
fn torchrun_workers_see_the_resolved_run_node_and_cache_folder() {
    let _turn = torchrun_turn();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache");
    let out = tmp.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let port = free_port().to_string();
    let torchrun = s(&venv_bin("torchrun"));
    let mut cmd = shardstream(&[
        "run",
        "--cache-root",
        &s(&root),
        "--",
        &torchrun,
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        &port,
        &worker_script(),
        &s(&out),
    ]);
    torch_env(&mut cmd, tmp.path());
    // An Indexed Job pod: the run id from the Job-name variable, the node rank from the index.
    cmd.env("SHARDSTREAM_JOB_NAME", "tr-job")
        .env("JOB_COMPLETION_INDEX", "0");
    let (mut run, _stdout) = spawn_piped(&mut cmd);
    let status = wait_for(&mut run, LIMIT);
    assert_eq!(status.code(), Some(0));

    let dir = root.join("tr-job/0");
    let mut ranks = BTreeSet::new();
    for rank in 0..2 {
        let seen = read_rank(&out, rank);
        assert_eq!(seen["SHARDSTREAM_RUN_ID"], "tr-job", "{seen}");
        assert_eq!(seen["SHARDSTREAM_NODE_RANK"], "0", "{seen}");
        assert_eq!(seen["SHARDSTREAM_CACHE_DIR"], s(&dir), "{seen}");
        // torchrun's own id is its default, shared by every run: not what keys the cache.
        assert_eq!(seen["TORCHELASTIC_RUN_ID"], "none", "{seen}");
        assert_eq!(seen["WORLD_SIZE"], "2");
        assert_eq!(seen["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(seen["sum"], 3.0);
        ranks.insert(seen["RANK"].as_str().unwrap().to_string());
    }
    assert_eq!(ranks, BTreeSet::from(["0".into(), "1".into()]));
    assert_eq!(
        worker_files(&dir),
        BTreeSet::from(["rank0".into(), "rank1".into()])
    );
}

/// Two network namespaces joined by a veth pair: two "hosts", 10.231.0.1 and 10.231.0.2,
/// which reach each other only through that link. Removed on drop.
struct Hosts {
    netns: [String; 2],
    ifaces: [String; 2],
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}");
}

impl Hosts {
    fn new() -> Hosts {
        let tag = std::process::id() % 100_000;
        let hosts = Hosts {
            netns: [format!("ss{tag}a"), format!("ss{tag}b")],
            ifaces: [format!("ss{tag}va"), format!("ss{tag}vb")],
        };
        let [na, nb] = &hosts.netns;
        let [va, vb] = &hosts.ifaces;
        ip(&["netns", "add", na]);
        ip(&["netns", "add", nb]);
        ip(&["link", "add", va, "type", "veth", "peer", "name", vb]);
        for (i, (ns, iface)) in hosts.netns.iter().zip(&hosts.ifaces).enumerate() {
            ip(&["link", "set", iface, "netns", ns]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", Hosts::addr(i)),
                "dev",
                iface,
            ]);
            ip(&["-n", ns, "link", "set", iface, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        hosts
    }

    fn addr(i: usize) -> String {
        format!("10.231.0.{}", i + 1)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        // Left in this namespace only if setting up failed half-way.
        let _ = Command::new("ip")
            .args(["link", "del", &self.ifaces[0]])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Two `shardstream run` "pods" of an Indexed Job, each wrapping
/// `torchrun --nnodes 2 --node-rank $SHARDSTREAM_NODE_RANK`, on 127.0.0.1 or each in a
/// network namespace of its own; asserts what each node's worker saw and wrote.
fn two_pods(hosts: Option<&Hosts>) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache");
    let out = tmp.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let port = free_port().to_string();
    let master = match hosts {
        Some(_) => Hosts::addr(0),
        None => "127.0.0.1".to_string(),
    };
    let torchrun = s(&venv_bin("torchrun"));
    // As in deploy/overlays/indexed-job: torchrun's --node-rank and --rdzv-id come from what
    // `shardstream run` exported (Kubernetes expands $(VAR) there; a shell does it here).
    let launch = r#"exec "$0" --nnodes 2 --node-rank "$SHARDSTREAM_NODE_RANK" --nproc-per-node 1 --master-addr "$4" --master-port "$1" --rdzv-id "$SHARDSTREAM_RUN_ID" "$2" "$3""#;
    let pods: Vec<_> = (0..2)
        .map(|index| {
            let args = [
                "run",
                "--cache-root",
                &s(&root),
                "--",
                "sh",
                "-c",
                launch,
                &torchrun,
                &port,
                &worker_script(),
                &s(&out),
                &master,
            ];
            let mut cmd = match hosts {
                None => shardstream(&args),
                Some(h) => {
                    // The same binary and clean environment, inside the pod's namespace.
                    let base = shardstream(&[]);
                    let mut ns = Command::new("ip");
                    ns.env_clear()
                        .envs(base.get_envs().filter_map(|(k, v)| Some((k, v?))))
                        .args(["netns", "exec", &h.netns[index]])
                        .arg(base.get_program())
                        .args(args);
                    ns
                }
            };
            torch_env(&mut cmd, tmp.path());
            let iface = hosts.map_or("lo", |h| h.ifaces[index].as_str());
            cmd.env("GLOO_SOCKET_IFNAME", iface)
                .env("SHARDSTREAM_RUN_ID", "job-e2e")
                .env("JOB_COMPLETION_INDEX", index.to_string());
            spawn_piped(&mut cmd)
        })
        .collect();
    for (index, (mut pod, _stdout)) in pods.into_iter().enumerate() {
        let status = wait_for(&mut pod, LIMIT);
        assert_eq!(status.code(), Some(0), "pod {index}");
    }

    for node in 0..2u64 {
        // One process per node: global rank = node rank.
        let seen = read_rank(&out, node);
        let dir = root.join(format!("job-e2e/{node}"));
        assert_eq!(seen["SHARDSTREAM_RUN_ID"], "job-e2e", "{seen}");
        assert_eq!(seen["SHARDSTREAM_NODE_RANK"], node.to_string(), "{seen}");
        assert_eq!(seen["GROUP_RANK"], node.to_string(), "{seen}");
        assert_eq!(seen["SHARDSTREAM_CACHE_DIR"], s(&dir), "{seen}");
        assert_eq!(seen["TORCHELASTIC_RUN_ID"], "job-e2e", "{seen}");
        assert_eq!(seen["WORLD_SIZE"], "2");
        // The all-reduce crossed the two "pods": 1 + 2.
        assert_eq!(seen["sum"], 3.0);
        assert_eq!(worker_files(&dir), BTreeSet::from([format!("rank{node}")]));
        let marker: Value =
            serde_json::from_str(&fs::read_to_string(dir.join("SHARDSTREAM-RUN")).unwrap())
                .unwrap();
        assert_eq!(marker["run_id"], "job-e2e");
        assert_eq!(marker["node_rank"], node);
    }
}

#[test]
fn two_pods_of_an_indexed_job_each_use_their_own_node_folder() {
    let _turn = torchrun_turn();
    two_pods(None);
}

#[test]
fn two_pods_on_separate_hosts_network_namespaces() {
    let _turn = torchrun_turn();
    let hosts = Hosts::new();
    two_pods(Some(&hosts));
}
