//! Issue 39.5 for checkpoints: keys under a checkpoint root that `object_store` cannot
//! represent (`root//x`, `root/../x`, `root/<id>/./x`), planted byte for byte in moto as another
//! S3 client could write them, are skipped with a warning: `list` and `gc` still work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::save;
use shardstream_checkpoint::{CheckpointRoot, GcOptions, RetentionPolicy};
use shardstream_storage::testing::MotoServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_gc_survive_odd_keys_under_the_root() {
    let moto = MotoServer::start().await.unwrap();
    moto.create_bucket("ckpt").await.unwrap();
    let root = CheckpointRoot::from_location(&moto.open("s3://ckpt/runs/a").unwrap());
    save(&root, "step_1", 2, 1000).await;
    save(&root, "step_2", 2, 1000).await;
    for key in [
        "runs/a//stray",
        "runs/a/../escape",
        "runs/a/step_1/./x",
        "runs/a/step_1//y",
        "runs/a/step_2/../z",
    ] {
        moto.put_raw_key("ckpt", key, b"odd").await.unwrap();
    }

    let ids: Vec<String> = root
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, vec!["step_1", "step_2"]);

    let opts = GcOptions {
        policy: RetentionPolicy {
            keep_last: 1,
            keep_every: None,
        },
        ..Default::default()
    };
    let report = root.gc(&opts).await.unwrap();
    assert_eq!(report.deleted, vec!["step_1"]);
    let ids: Vec<String> = root
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, vec!["step_2"]);
    root.open("step_2").await.unwrap();
}
