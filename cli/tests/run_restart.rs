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

use crate::support::restart_job::*;
use crate::support::{torchrun_turn, wait_for};

#[test]
fn a_killed_pod_is_retried_and_the_job_resumes_at_the_same_data_position() {
    let _turn = torchrun_turn();
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
