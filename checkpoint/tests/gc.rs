//! Retention and garbage collection over an in-memory store and a local directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use bytes::Bytes;
use common::{backends, save, upload};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use shardstream_checkpoint::{CheckpointRoot, GcOptions, RetentionPolicy};
use std::time::{Duration, SystemTime};

async fn objects_under(root: &CheckpointRoot, id: &str) -> usize {
    let dir = root.checkpoint_dir(id);
    root.store()
        .list(Some(&dir))
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .len()
}

fn ids(infos: Vec<shardstream_checkpoint::CheckpointInfo>) -> Vec<String> {
    infos.into_iter().map(|c| c.id).collect()
}

fn opts(keep_last: usize, keep_every: Option<u64>, older_than: Duration) -> GcOptions {
    GcOptions {
        policy: RetentionPolicy {
            keep_last,
            keep_every,
        },
        leftovers_older_than: older_than,
        ..Default::default()
    }
}

#[tokio::test]
async fn retention_keeps_last_n_and_every_kth() {
    for b in backends() {
        let root = &b.root;
        for s in 1..=6 {
            save(root, &format!("step_{s}"), 2, 1000).await;
        }
        let dry = GcOptions {
            dry_run: true,
            ..opts(2, Some(3), Duration::ZERO)
        };
        let report = root.gc(&dry).await.unwrap();
        assert_eq!(
            report.deleted,
            vec!["step_1", "step_2", "step_4"],
            "{}",
            b.name
        );
        assert_eq!(
            ids(root.list().await.unwrap()).len(),
            6,
            "dry run deleted something"
        );

        let report = root.gc(&opts(2, Some(3), Duration::ZERO)).await.unwrap();
        assert_eq!(report.kept, vec!["step_3", "step_5", "step_6"]);
        assert_eq!(report.deleted, vec!["step_1", "step_2", "step_4"]);
        // 3 checkpoints x (manifest + 4 files).
        assert_eq!(report.objects_deleted, 15);
        assert_eq!(
            ids(root.list().await.unwrap()),
            vec!["step_3", "step_5", "step_6"]
        );
        for gone in ["step_1", "step_2", "step_4"] {
            assert_eq!(objects_under(root, gone).await, 0, "{gone}");
        }
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_6");
        assert!(root.verify("step_6").await.unwrap().is_ok());
        assert_eq!(b.metrics.snapshot().gc_deleted_objects, 15);
    }
}

#[tokio::test]
async fn gc_never_deletes_the_latest() {
    for b in backends() {
        let root = &b.root;
        save(root, "final", 1, 10).await; // no step: sorts before stepped checkpoints
        save(root, "step_1", 1, 10).await;
        save(root, "step_2", 1, 10).await;
        let report = root.gc(&opts(0, Some(0), Duration::ZERO)).await.unwrap();
        assert_eq!(report.kept, vec!["step_2"]);
        assert_eq!(ids(root.list().await.unwrap()), vec!["step_2"]);
        assert!(root.verify("step_2").await.unwrap().is_ok());
        // Running it again changes nothing.
        let again = root.gc(&opts(0, None, Duration::ZERO)).await.unwrap();
        assert!(again.deleted.is_empty() && again.objects_deleted == 0);
    }
}

#[tokio::test]
async fn leftovers_are_swept_only_when_old() {
    for b in backends() {
        let root = &b.root;
        // step_2: a dead attempt next to the committed one; step_3: never committed.
        let dead = root.begin_save("step_2").await.unwrap();
        upload(root, &dead, 1, 2, 500).await;
        save(root, "step_2", 1, 500).await;
        let pending = root.begin_save("step_3").await.unwrap();
        upload(root, &pending, 2, 1, 500).await;
        assert_eq!(objects_under(root, "step_2").await, 5);

        // Young leftovers stay (a save may still be running).
        let report = root
            .gc(&opts(5, None, Duration::from_secs(3600)))
            .await
            .unwrap();
        assert_eq!(report.young_leftovers, 2, "{}", b.name);
        assert_eq!(report.objects_deleted, 0);
        assert_eq!(objects_under(root, "step_3").await, 2);

        let report = root.gc(&opts(5, None, Duration::ZERO)).await.unwrap();
        assert_eq!(report.leftover_dirs_deleted, vec!["step_3"]);
        assert_eq!(report.objects_deleted, 4);
        assert_eq!(objects_under(root, "step_3").await, 0);
        assert_eq!(objects_under(root, "step_2").await, 3);
        assert!(root.verify("step_2").await.unwrap().is_ok());
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_2");
    }
}

#[tokio::test]
async fn unreadable_manifests_are_left_alone() {
    for b in backends() {
        let root = &b.root;
        save(root, "step_1", 1, 10).await;
        // E.g. written by a newer shardstream: gc must not treat it as a leftover.
        root.store()
            .put(
                &root.manifest_path("step_9"),
                PutPayload::from(Bytes::from_static(
                    b"{\"format\":\"shardstream-checkpoint\",\"version\":99}",
                )),
            )
            .await
            .unwrap();
        let report = root.gc(&opts(1, None, Duration::ZERO)).await.unwrap();
        assert_eq!(report.unreadable, vec!["step_9"]);
        assert_eq!(objects_under(root, "step_9").await, 1);
        assert_eq!(root.latest().await.unwrap().unwrap().id, "step_1");
    }
}

#[tokio::test]
async fn local_staging_files_of_killed_uploads_are_swept() {
    let b = backends().remove(1);
    let local = b.dir.as_ref().unwrap().path().join("ckpt");
    save(&b.root, "step_1", 1, 10).await;
    // What a process killed mid-multipart leaves: `<file>#<n>`, invisible to listings.
    let dead_dir = local
        .join("step_2")
        .join("attempt-0000000000001-0000000000000001");
    std::fs::create_dir_all(&dead_dir).unwrap();
    let staging = dead_dir.join("__0_0.distcp#1");
    std::fs::write(&staging, b"partial").unwrap();
    let fresh = local.join("step_1").join("__x#2");
    std::fs::write(&fresh, b"in progress").unwrap();
    let old = SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&staging)
        .unwrap()
        .set_modified(old)
        .unwrap();

    let report = b
        .root
        .gc(&GcOptions {
            local_root: Some(local.clone()),
            ..opts(1, None, Duration::from_secs(3600))
        })
        .await
        .unwrap();
    assert_eq!(report.local_staging_files_deleted, 1);
    assert!(!staging.exists());
    assert!(
        !local.join("step_2").exists(),
        "empty directories are removed"
    );
    assert!(fresh.exists(), "young staging files stay");
    assert!(b.root.verify("step_1").await.unwrap().is_ok());
}
