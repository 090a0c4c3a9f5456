//! `shardstream mount` as a pod's FUSE sidecar uses it: a sidecar killed with `SIGKILL` leaves
//! a dead mount (`ENOTCONN`) that the restarted sidecar's `mount` clears before mounting again
//! on the same folder, and `shardstream mount-check`, the liveness probe, fails on the dead
//! mount and on a plain folder and passes on a live one.
// The helpers are part of the tests: a failed set-up step panics with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::mount::{is_mounted, signal, Daemon};

use common::*;

/// ENOTCONN ("Transport endpoint is not connected") on Linux.
const ENOTCONN: i32 = 107;

fn file_count(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_sigkilled_sidecar_leaves_enotconn_and_mount_again_clears_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    files_tree(&input, 12, 500);
    let dataset = dir.path().join("ds");
    run(&["shard", s(&input), s(&dataset)]).ok();
    let cache = dir.path().join("cache");
    let mnt = dir.path().join("mnt");
    let check = || run(&["mount-check", s(&mnt), "--timeout", "10s"]);

    // Nothing mounted yet: the probe fails.
    std::fs::create_dir_all(&mnt).unwrap();
    let plain = check().failed();
    assert!(
        plain.stderr.contains("not a mount point"),
        "{}",
        plain.stderr
    );

    let mut first = Daemon::start(s(&dataset), &mnt, &cache, &[], &[]);
    let live = check().ok();
    assert!(live.stdout.contains("answering"), "{}", live.stdout);
    let files = file_count(&mnt.join("shards"));
    assert!(files > 1);

    // SIGKILL, as the kubelet or the OOM killer does: the mount stays, dead.
    signal(first.pid(), "-KILL");
    first.child.take().unwrap().wait().unwrap();
    let _ = std::fs::remove_file(&first.ready);
    // (A listing: a `stat` of the root may come from the kernel's attribute cache.)
    let err = std::fs::read_dir(&mnt).map(drop).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(ENOTCONN), "got {err}");
    assert!(is_mounted(&mnt));
    let dead = check().failed();
    assert!(dead.stderr.contains("ENOTCONN"), "{}", dead.stderr);

    // The restarted sidecar mounts on the same folder with no one unmounting first.
    let mut second = Daemon::start(s(&dataset), &mnt, &cache, &[], &[]);
    assert_eq!(file_count(&mnt.join("shards")), files);
    check().ok();
    assert!(second.stop());
    assert!(!is_mounted(&mnt));
    check().failed();
}
