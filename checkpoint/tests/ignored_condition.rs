//! Issue 39.4: commits on a store that ignores `If-None-Match`. moto honours the header; a
//! `FaultProxy` in front of it that strips the header plays a store that does not. On both,
//! of two racing commits of one id exactly one succeeds and the manifest is the winner's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::upload;
use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStore, PutOptions, PutPayload, PutResult};
use shardstream_checkpoint::{CheckpointError, CheckpointRoot, CommitRequest, Manifest};
use shardstream_storage::decorate::Decorator;
use shardstream_storage::testing::{options_for, test_env, FaultProxy, MotoServer};
use shardstream_storage::Location;
use std::sync::Arc;
use tokio::sync::Barrier;

async fn commit_one(
    root: &CheckpointRoot,
    id: &str,
    seed_files: u32,
) -> Result<Manifest, CheckpointError> {
    // A committed id is refused here already; racing saves both get past it.
    let attempt = root.begin_save(id).await?;
    let records = upload(root, &attempt, 2, seed_files, 1000).await;
    root.commit(
        &attempt,
        CommitRequest {
            records,
            world_size: 2,
            ..Default::default()
        },
    )
    .await
}

/// Two coordinators commit `id` at once: exactly one wins, the other is told why, and the
/// stored manifest is the winner's.
async fn race(root: &CheckpointRoot, id: &str) -> Manifest {
    let (a, b) = tokio::join!(commit_one(root, id, 1), commit_one(root, id, 2));
    let (won, lost) = match (a, b) {
        (Ok(m), Err(e)) | (Err(e), Ok(m)) => (m, e),
        (Ok(a), Ok(b)) => panic!(
            "two commits of {id} succeeded: {} and {}",
            a.attempt, b.attempt
        ),
        (Err(a), Err(b)) => panic!("no commit of {id} succeeded: {a}; {b}"),
    };
    assert!(
        matches!(
            lost,
            CheckpointError::AlreadyCommitted { .. }
                | CheckpointError::ConditionalPutIgnored { .. }
        ),
        "unexpected loser error: {lost}"
    );
    eprintln!("race for {id}: the loser got: {lost}");
    assert_eq!(root.read_manifest(id).await.unwrap().attempt, won.attempt);
    won
}

async fn roots() -> (MotoServer, FaultProxy, CheckpointRoot, CheckpointRoot) {
    let moto = MotoServer::start().await.unwrap();
    moto.create_bucket("ckpt").await.unwrap();
    let honest = CheckpointRoot::from_location(&moto.open("s3://ckpt/honest").unwrap());
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.set_strip_if_none_match(true);
    let loc = Location::open_with(
        "s3://ckpt/ignoring",
        &options_for(&proxy.endpoint()),
        &test_env(),
    )
    .unwrap();
    let ignoring = CheckpointRoot::from_location(&loc);
    (moto, proxy, honest, ignoring)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn honest_store_is_detected_and_races_have_one_winner() {
    let (_moto, _proxy, root, _) = roots().await;
    let attempt = root.begin_save("probe").await.unwrap();
    assert!(root.conditional_put_honoured(&attempt).await.unwrap());
    commit_one(&root, "step_1", 1).await.unwrap();
    race(&root, "step_2").await;
    for _ in 0..3 {
        let again = commit_one(&root, "step_1", 3).await.unwrap_err();
        assert!(
            matches!(again, CheckpointError::AlreadyCommitted { .. }),
            "{again}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_ignoring_if_none_match_keeps_one_commit_per_id() {
    let (_moto, proxy, _, root) = roots().await;
    let attempt = root.begin_save("probe").await.unwrap();
    assert!(
        !root.conditional_put_honoured(&attempt).await.unwrap(),
        "the proxy strips the header: the probe must see the second put succeed"
    );
    assert!(proxy.stripped() >= 2);

    // A later save of a committed id is refused and the committed manifest kept.
    let first = commit_one(&root, "step_1", 1).await.unwrap();
    let again = commit_one(&root, "step_1", 2).await.unwrap_err();
    assert!(
        matches!(again, CheckpointError::AlreadyCommitted { .. }),
        "{again}"
    );
    assert_eq!(
        root.read_manifest("step_1").await.unwrap().attempt,
        first.attempt
    );

    // Racing saves: both puts land (the header is gone), the read-back decides.
    for id in ["step_2", "step_3"] {
        race(&root, id).await;
    }
    let ids: Vec<String> = root
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, vec!["step_1", "step_2", "step_3"]);
    for id in &ids {
        root.open(id).await.unwrap().verify().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_puts_on_an_ignoring_store_are_caught_by_the_read_back() {
    // The worst interleaving, forced: both commits pass their check (no manifest yet), then
    // both manifest puts land, since the header is stripped. Only the read-back can tell.
    let (_moto, proxy, _, root) = roots().await;
    let met = CheckpointRoot::new(
        Arc::new(MeetAtManifestPut {
            inner: Arc::clone(root.store()),
            barrier: Barrier::new(2),
        }),
        root.root().clone(),
    );
    let (a, b) = tokio::join!(commit_one(&met, "step_9", 1), commit_one(&met, "step_9", 1));
    let (won, lost) = match (a, b) {
        (Ok(m), Err(e)) | (Err(e), Ok(m)) => (m, e),
        (Ok(a), Ok(b)) => panic!("two commits succeeded: {} and {}", a.attempt, b.attempt),
        (Err(a), Err(b)) => panic!("no commit succeeded: {a}; {b}"),
    };
    assert!(
        matches!(&lost, CheckpointError::ConditionalPutIgnored { id, winner, .. }
            if id == "step_9" && *winner == won.attempt),
        "{lost}"
    );
    assert!(
        lost.to_string()
            .contains("ignored the create-only condition"),
        "{lost}"
    );
    assert_eq!(
        root.read_manifest("step_9").await.unwrap().attempt,
        won.attempt
    );
    assert!(proxy.stripped() >= 2);
}

/// Holds each manifest put until two have arrived.
#[derive(Debug)]
struct MeetAtManifestPut {
    inner: Arc<dyn ObjectStore>,
    barrier: Barrier,
}

impl std::fmt::Display for MeetAtManifestPut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MeetAtManifestPut({})", self.inner)
    }
}

#[async_trait]
impl Decorator for MeetAtManifestPut {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if location.as_ref().ends_with("_shardstream_manifest.json") {
            self.barrier.wait().await;
        }
        self.inner.put_opts(location, payload, opts).await
    }
}

shardstream_storage::object_store_decorator!(MeetAtManifestPut);
