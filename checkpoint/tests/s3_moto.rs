//! The protocol against a real S3 API: moto's server on a loopback port (started by the
//! storage crate's `MotoServer`). Checks that the create-if-absent manifest put works over S3
//! (`If-None-Match: *`), with real 5 MiB multipart parts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use shardstream_checkpoint::{
    CheckpointError, CheckpointRoot, CommitRequest, GcOptions, RetentionPolicy, SaveAttempt,
    UploadConfig,
};
use shardstream_storage::testing::MotoServer;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn config() -> UploadConfig {
    UploadConfig {
        part_size: 5 * MIB as u64,
        memory_budget: 20 * MIB as u64,
        // Files of a few MiB stand in for large ones here: keep them multipart.
        single_put_max: 0,
        ..Default::default()
    }
}

fn data(seed: u8, len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

async fn upload(root: &CheckpointRoot, a: &SaveAttempt, sizes: &[usize]) -> CommitRequest {
    let mut records = Vec::new();
    for (rank, &size) in sizes.iter().enumerate() {
        let w = root.rank_writer(a, rank as u32, &config()).unwrap();
        let name = format!("__{rank}_0.distcp");
        records.push(w.upload_bytes(&name, data(rank as u8, size)).await.unwrap());
    }
    CommitRequest {
        records,
        world_size: sizes.len() as u32,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_save_commit_race_read_gc() {
    let moto = MotoServer::start().await.unwrap();
    moto.create_bucket("ckpt").await.unwrap();
    let root = CheckpointRoot::from_location(&moto.open("s3://ckpt/runs/a").unwrap());

    // Multipart (11 MiB = 3 parts of 5 MiB) and single-PUT files.
    let a = root.begin_save("step_10").await.unwrap();
    let req = upload(&root, &a, &[11 * MIB, 1000]).await;
    assert_eq!(req.records[0].parts.len(), 3);
    assert!(req.records[1].parts.is_empty());
    root.commit(&a, req).await.unwrap();
    assert!(matches!(
        root.begin_save("step_10").await.unwrap_err(),
        CheckpointError::AlreadyCommitted { .. }
    ));

    let reader = root.open("step_10").await.unwrap();
    let path = reader.manifest().files[0].path.clone();
    let expected = data(0, 11 * MIB);
    let (s, e) = (5 * MIB - 10, 5 * MIB + 10);
    assert_eq!(
        reader.read_range(&path, s as u64..e as u64).await.unwrap(),
        expected.slice(s..e)
    );
    assert_eq!(reader.read_file(&path).await.unwrap(), expected);
    assert!(root.verify("step_10").await.unwrap().is_ok());

    // Two coordinators race for step_20: the conditional put lets exactly one in.
    let (x, y) = (
        root.begin_save("step_20").await.unwrap(),
        root.begin_save("step_20").await.unwrap(),
    );
    let (rx, ry) = (
        upload(&root, &x, &[2000, 3000]).await,
        upload(&root, &y, &[2000, 3000]).await,
    );
    let (cx, cy) = tokio::join!(root.commit(&x, rx), root.commit(&y, ry));
    let winner = match (cx, cy) {
        (Ok(m), Err(CheckpointError::AlreadyCommitted { .. }))
        | (Err(CheckpointError::AlreadyCommitted { .. }), Ok(m)) => m,
        other => panic!("expected one winner: {other:?}"),
    };
    assert_eq!(
        root.open("step_20").await.unwrap().manifest().attempt,
        winner.attempt
    );
    assert_eq!(root.latest().await.unwrap().unwrap().id, "step_20");

    // A flipped byte in part 2 of the big file is caught and named.
    let full = reader.object_path(&path).unwrap();
    let mut bytes = expected.to_vec();
    bytes[10 * MIB] ^= 0x80;
    root.store()
        .put(&full, PutPayload::from(bytes))
        .await
        .unwrap();
    match reader.read_file(&path).await.unwrap_err() {
        CheckpointError::ChecksumMismatch { path: p, part, .. } => {
            assert_eq!((p, part), (full.clone(), Some(2)));
        }
        e => panic!("{e}"),
    }
    let report = root.verify("step_10").await.unwrap();
    assert_eq!(report.failures.len(), 1);

    // gc: keep the latest only; the loser's attempt inside step_20 goes too.
    let report = root
        .gc(&GcOptions {
            policy: RetentionPolicy {
                keep_last: 1,
                keep_every: None,
            },
            leftovers_older_than: Duration::ZERO,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(report.deleted, vec!["step_10"]);
    assert_eq!(report.kept, vec!["step_20"]);
    // step_10: manifest + 2 files; step_20: the loser's 2 files.
    assert_eq!(report.objects_deleted, 5);
    assert!(root.verify("step_20").await.unwrap().is_ok());
    assert_eq!(root.list().await.unwrap().len(), 1);
}

/// Kills the saver process mid-multipart and before the manifest, against S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_kill_before_commit_keeps_previous_latest() {
    let moto = MotoServer::start().await.unwrap();
    moto.create_bucket("ckpt").await.unwrap();
    let url = "s3://ckpt/kill";
    let root = CheckpointRoot::from_location(&moto.open(url).unwrap());
    let run = |id: &str, pause: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardstream-ckpt-fault"))
            .args([url, id, "--world-size", "2", "--files-per-rank", "1"])
            .args(["--file-size", &(11 * MIB).to_string()])
            .args(["--part-size", &(5 * MIB).to_string()])
            .env("SHARDSTREAM_CKPT_PAUSE_AT", pause)
            .env("AWS_ENDPOINT_URL", moto.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let first = out.lines().map_while(Result::ok).next().unwrap_or_default();
        if pause == "none" {
            assert!(child.wait().unwrap().success());
        } else {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        first
    };
    let line = tokio::task::block_in_place(|| run("step_1", "none"));
    assert!(line.starts_with("COMMITTED step_1"), "{line}");
    for phase in ["mid-upload", "before-manifest"] {
        let line = tokio::task::block_in_place(|| run("step_2", phase));
        assert_eq!(line, format!("PAUSED {phase}"));
        let latest = root.latest().await.unwrap().unwrap();
        assert_eq!(latest.id, "step_1", "{phase}");
        assert!(root.verify("step_1").await.unwrap().is_ok());
        assert!(matches!(
            root.open("step_2").await.unwrap_err(),
            CheckpointError::NotCommitted { .. }
        ));
    }
    let line = tokio::task::block_in_place(|| run("step_2", "none"));
    assert!(line.starts_with("COMMITTED step_2"), "{line}");
    assert!(root.verify("step_2").await.unwrap().is_ok());
    // torch's reader finds .metadata at the checkpoint root of the committed save.
    let meta = root.checkpoint_dir("step_2").join(".metadata");
    assert!(root.store().head(&meta).await.is_ok());
}

/// A store that answers 503 SlowDown for a while: the save (multipart and single-PUT files and
/// the manifest) completes after backoff with the default retry policy, and reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_save_completes_after_slow_down_replies() {
    use shardstream_storage::testing::{options_for, test_env, FaultProxy};
    use shardstream_storage::{Location, RetryPolicy};

    let moto = MotoServer::start().await.unwrap();
    moto.create_bucket("ckpt").await.unwrap();
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    // The default policy's retry count, with short backoffs to keep the test quick.
    let options = options_for(&proxy.endpoint()).with_retry(RetryPolicy {
        max_retries: 10,
        init_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
        base: 2.0,
        retry_timeout: Duration::from_secs(30),
    });
    let location = Location::open_with("s3://ckpt/runs/b", &options, &test_env()).unwrap();
    let root = CheckpointRoot::from_location(&location);

    // Throttled from the first request of the save on: parts, PUTs and the commit meet 503s.
    proxy.fail_next(8);
    let a = root.begin_save("step_1").await.unwrap();
    let req = upload(&root, &a, &[11 * MIB, 1000]).await;
    root.commit(&a, req).await.unwrap();
    assert_eq!(proxy.failed(), 8, "every throttled request was retried");

    assert_eq!(root.latest().await.unwrap().unwrap().id, "step_1");
    let report = root.verify("step_1").await.unwrap();
    assert!(report.is_ok(), "{:?}", report.failures);
    let reader = root.open("step_1").await.unwrap();
    for (rank, size) in [(0u8, 11 * MIB), (1, 1000)] {
        let path = reader
            .manifest()
            .files
            .iter()
            .find(|f| f.path.ends_with(&format!("__{rank}_0.distcp")))
            .map(|f| f.path.clone())
            .unwrap();
        let got = reader.read_range(&path, 0..size as u64).await.unwrap();
        assert!(got == data(rank, size), "rank {rank}'s file differs");
    }
}
