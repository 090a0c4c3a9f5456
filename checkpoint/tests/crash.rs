//! Crash consistency: a save process is SIGKILLed at each phase of a save (24 kills in all);
//! afterwards `latest` must name a complete checkpoint that verifies, a new save of the
//! interrupted id must succeed, and gc must clean up what the dead process left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardstream_checkpoint::{CheckpointRoot, GcOptions, RetentionPolicy};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_shardstream-ckpt-fault");
const TRIALS_PER_PHASE: usize = 6;

/// Runs the saver for `id`; with a pause phase, waits for `PAUSED` and SIGKILLs it.
fn run_saver(root: &std::path::Path, id: &str, pause: &str, seed: u64) -> String {
    let mut child = Command::new(BIN)
        .arg(root)
        .arg(id)
        .args(["--world-size", "3", "--files-per-rank", "2"])
        .args(["--file-size", "300000", "--part-size", "65536"])
        .args(["--seed", &seed.to_string()])
        .env("SHARDSTREAM_CKPT_PAUSE_AT", pause)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wanted = if pause == "none" {
        "COMMITTED"
    } else {
        "PAUSED"
    };
    let line = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.starts_with(wanted) => break line,
            Ok(_) => continue,
            Err(e) => {
                let _ = child.kill();
                panic!("saver for {id} at {pause}: no {wanted} line ({e})");
            }
        }
    };
    if pause == "none" {
        assert!(child.wait().unwrap().success());
    } else {
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    line
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_at_every_phase_leaves_no_torn_checkpoint() {
    let phases = [
        "mid-upload",
        "after-uploads",
        "before-manifest",
        "after-manifest",
    ];
    let mut kills = 0;
    for phase in phases {
        for trial in 0..TRIALS_PER_PHASE {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().to_path_buf();
            let root = CheckpointRoot::open_url(path.to_str().unwrap()).unwrap();
            run_saver(&path, "step_1", "none", 1);
            let paused = run_saver(&path, "step_2", phase, trial as u64);
            assert_eq!(paused, format!("PAUSED {phase}"));
            kills += 1;

            let latest = root.latest().await.unwrap().unwrap();
            let committed = phase == "after-manifest";
            let want = if committed { "step_2" } else { "step_1" };
            assert_eq!(latest.id, want, "{phase} trial {trial}");
            let report = root.verify(want).await.unwrap();
            assert_eq!(report.files_checked, 3 * 2 + 1 + 1);
            if committed {
                // Every data file is there; only the root alias copy was cut off.
                assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
                let missing = report.failures[0].to_string();
                assert!(missing.contains("step_2/.metadata is missing"), "{missing}");
            } else {
                assert!(report.is_ok(), "{phase}: {:?}", report.failures);
            }

            // torch's own reader looks for <id>/.metadata: it must not exist for an
            // uncommitted save, and a committed one whose copy was cut off is repaired.
            let root_meta = path.join("step_2").join(".metadata");
            if committed {
                assert!(!root_meta.exists());
                assert_eq!(root.publish_aliases("step_2").await.unwrap(), 1);
                assert!(root_meta.exists());
                assert!(root.verify("step_2").await.unwrap().is_ok());
            } else {
                assert!(!root_meta.exists(), "{phase}");
                // The interrupted id can be saved again, in a fresh attempt.
                run_saver(&path, "step_2", "none", 100 + trial as u64);
                assert_eq!(root.latest().await.unwrap().unwrap().id, "step_2");
                assert!(root.verify("step_2").await.unwrap().is_ok());
            }

            // gc removes the dead attempt (and, on a local root, its staging files) and keeps
            // what `latest` references.
            let report = root
                .gc(&GcOptions {
                    policy: RetentionPolicy {
                        keep_last: 2,
                        keep_every: None,
                    },
                    leftovers_older_than: Duration::ZERO,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert!(report.deleted.is_empty());
            if !committed {
                let swept = report.objects_deleted + report.local_staging_files_deleted;
                assert!(swept > 0, "{phase}: dead attempt not swept: {report:?}");
            }
            let m = root.open("step_2").await.unwrap();
            let attempts: Vec<_> = std::fs::read_dir(path.join("step_2"))
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("attempt-"))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(attempts, vec![m.manifest().attempt.clone()], "{phase}");
            let staging = walk(&path)
                .into_iter()
                .filter(|p| p.to_string_lossy().contains('#'))
                .count();
            assert_eq!(staging, 0, "{phase}: staging files left");
            assert!(root.verify("step_2").await.unwrap().is_ok());
            assert!(root.verify("step_1").await.unwrap().is_ok());
        }
    }
    assert_eq!(kills, 4 * TRIALS_PER_PHASE);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
