//! Reads of objects whose size is untrusted (an index, a manifest): refused from the size the
//! first response reports, before the rest is fetched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shardstream_storage::{Env, Location, StorageError, StorageOptions};

fn local(dir: &tempfile::TempDir) -> Location {
    Location::open_with(
        dir.path().to_str().unwrap(),
        &StorageOptions::default().with_chunk_size(16),
        &Env::default(),
    )
    .unwrap()
}

#[tokio::test]
async fn an_object_over_the_callers_limit_is_refused_from_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let loc = local(&dir);
    loc.put("index.json", bytes::Bytes::from(vec![b'x'; 100]))
        .await
        .unwrap();
    let err = loc.get_at_most("index.json", 99).await.unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::TooLarge {
                size: 100,
                limit: 99,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("index.json"), "{err}");
    assert_eq!(loc.get_at_most("index.json", 100).await.unwrap().len(), 100);
}
