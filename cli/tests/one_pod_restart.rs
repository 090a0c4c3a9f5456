//! One pod of a two-pod job killed and replaced alone, as the Job controller replaces one failed
//! index (`backoffLimitPerIndex`) of an elastic (c10d, `--max-restarts`) torchrun job; the job
//! machinery and the scenario are described in `run_restart.rs`.
//!
//! The rejoin depends on `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (set by the base ConfigMap and by
//! the job here): when the replaced pod took group rank 0 of the next round, torch's shared
//! rendezvous store left the surviving agent on the round before's bootstrap address and both
//! agents timed out on each other after 60 s (about half the runs, depending on the ranks drawn).
//! Kept in a test binary of its own: a fresh process for the two pods' agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "run_support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::restart_job::*;
use support::{torchrun_turn, wait_for};

#[test]
fn one_killed_pod_is_replaced_alone_and_rejoins_the_running_job() {
    let _turn = torchrun_turn();
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
