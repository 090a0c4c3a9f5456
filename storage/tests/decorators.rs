//! The test decorators themselves, over a local directory, under tokio's paused clock (the
//! slow store's sleeps advance virtual time; nothing waits for real).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use common::data;
use shardstream_storage::testing::{FailRule, FailingStore, Fault, OpKind, SlowStore};
use shardstream_storage::{Env, Location, StorageError, StorageOptions};
use tokio::time::Instant;

const CHUNK: usize = 64 * 1024;

fn local(dir: &tempfile::TempDir) -> Location {
    let options = StorageOptions::default().with_chunk_size(CHUNK);
    Location::open_with(dir.path().to_str().unwrap(), &options, &Env::default()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn slow_store_shows_that_chunks_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let loc = local(&dir);
    loc.put("obj", data(8 * CHUNK, 1)).await.unwrap();
    let slow = loc.map_store(|s| Arc::new(SlowStore::new(s, Duration::from_millis(100))));

    let started = Instant::now();
    assert_eq!(
        slow.get_parallel("obj", CHUNK, 1).await.unwrap().len(),
        8 * CHUNK
    );
    let sequential = started.elapsed();
    let started = Instant::now();
    assert_eq!(
        slow.get_parallel("obj", CHUNK, 4).await.unwrap().len(),
        8 * CHUNK
    );
    let parallel = started.elapsed();

    // First request alone, then 7 chunks: 7 waves of one, or 2 waves of four.
    assert!(sequential >= Duration::from_millis(800), "{sequential:?}");
    assert!(parallel >= Duration::from_millis(300), "{parallel:?}");
    assert!(parallel < Duration::from_millis(400), "{parallel:?}");
}

#[tokio::test(start_paused = true)]
async fn slow_store_caps_bandwidth() {
    let dir = tempfile::tempdir().unwrap();
    let loc = local(&dir);
    loc.put("obj", data(512 * 1024, 2)).await.unwrap();
    let slow =
        loc.map_store(|s| Arc::new(SlowStore::new(s, Duration::ZERO).with_bandwidth(1024 * 1024)));
    let started = Instant::now();
    slow.get_parallel("obj", 512 * 1024, 1).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn failing_store_rules_pick_requests_and_map_to_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let loc = local(&dir);
    loc.put("a/shard.0", data(10, 1)).await.unwrap();
    loc.put("a/shard.1", data(10, 2)).await.unwrap();
    let failing = Arc::new(
        FailingStore::new(Arc::clone(loc.store()))
            .with_rule(FailRule::new(Fault::Timeout).on(OpKind::Head).times(1))
            .with_rule(
                FailRule::new(Fault::NotFound)
                    .on(OpKind::Get)
                    .path_contains("shard.1"),
            ),
    );
    let faulty = loc.map_store(|_| failing.clone());

    let err = faulty.head("a/shard.0").await.unwrap_err();
    assert!(matches!(err, StorageError::Timeout { .. }), "{err}");
    assert_eq!(faulty.head("a/shard.0").await.unwrap().size, 10);
    assert_eq!(faulty.get("a/shard.0").await.unwrap(), data(10, 1));
    let err = faulty.get("a/shard.1").await.unwrap_err();
    assert!(matches!(err, StorageError::NotFound { ref url } if url.ends_with("a/shard.1")));
    assert_eq!(failing.injected(), 2);

    failing.clear();
    failing.add_rule(FailRule::new(Fault::PermissionDenied).on(OpKind::List));
    let err = faulty.list("a").await.unwrap_err();
    assert!(
        matches!(err, StorageError::PermissionDenied { .. }),
        "{err}"
    );
}

#[test]
fn create_is_atomic_only_where_it_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let loc = local(&dir);
    assert!(
        loc.create_is_atomic(),
        "a local directory's create is a hard link"
    );
    // A decorated store is another store: not vouched for.
    assert!(!loc
        .map_store(|s| Arc::new(SlowStore::new(s, Duration::ZERO)))
        .create_is_atomic());
    let open = |url: &str, env: &[(&str, &str)]| {
        Location::open_with(
            url,
            &StorageOptions::default(),
            &Env::from_pairs(env.to_vec()),
        )
        .unwrap()
        .create_is_atomic()
    };
    let keys = [("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")];
    assert!(open("s3://bucket/p", &keys), "Amazon S3's own endpoint");
    let custom = [&keys[..], &[("AWS_ENDPOINT_URL", "http://127.0.0.1:9")]].concat();
    assert!(
        !open("s3://bucket/p", &custom),
        "an S3-compatible server may check, then write"
    );
    // Azure (and GCS): their emulators are not told apart from the service, so never trusted.
    let azure = [
        ("AZURE_STORAGE_ACCOUNT_NAME", "a"),
        ("AZURE_STORAGE_ACCOUNT_KEY", "a2V5"),
    ];
    assert!(!open("az://container/p", &azure));
}
