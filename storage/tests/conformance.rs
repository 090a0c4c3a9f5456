//! Issue 39.1: one conformance body over every real server (moto, s3s-fs, fake-gcs-server,
//! Azurite), the way `object_store`'s own CI runs one suite over each backend. What a server
//! cannot do is probed and asserted against [`expected`] (the table of `docs/storage.md`,
//! "Backends tested"), and the body then checks that the failure is a clean error, not
//! silently skipped. Each test is `conformance::<body>::<server>`; run them with
//! `cargo test -p shardstream-storage --test it conformance`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use shardstream_storage::testing::{probe, Capabilities, ServerKind, TestServer};
use shardstream_storage::{Location, PutOutcome, StorageError};

use crate::common::data;

/// What each server is known to do (`docs/storage.md`, "Backends tested").
pub fn expected(kind: ServerKind) -> Capabilities {
    kind.documented_capabilities()
}

/// A started server with a bucket `conf`, and a location under it; `None` (with the reason
/// printed) when the server is not installed outside CI.
pub async fn server(kind: ServerKind, prefix: &str) -> Option<(TestServer, Location)> {
    shardstream_storage::testing::require(kind)?;
    let server = TestServer::start(kind)
        .await
        .unwrap_or_else(|e| panic!("starting {}: {e}", kind.name()));
    server.create_bucket("conf").await.unwrap();
    let loc = server.open(&server.url("conf", prefix)).unwrap();
    Some((server, loc))
}

/// Puts `body` at `rel` of `loc`, through the server's upload API where its put fails.
pub async fn plant(server: &TestServer, loc: &Location, rel: &str, body: Bytes) {
    server.plant(loc, rel, &body).await.unwrap();
}

/// Runs each `async fn(ServerKind)` once per server, as `NAME::moto`, `NAME::s3s_fs`,
/// `NAME::fake_gcs` and `NAME::azurite`.
#[macro_export]
macro_rules! on_every_server {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use shardstream_storage::testing::ServerKind;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn moto() { super::$name(ServerKind::Moto).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn s3s_fs() { super::$name(ServerKind::S3sFs).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fake_gcs() { super::$name(ServerKind::FakeGcs).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn azurite() { super::$name(ServerKind::Azurite).await }
        }
    )*};
}

on_every_server!(
    capabilities_are_as_documented,
    objects_round_trip,
    large_object_round_trip,
    create_only_put_races,
);

async fn capabilities_are_as_documented(kind: ServerKind) {
    let Some((server, loc)) = server(kind, "caps").await else {
        return;
    };
    let found = probe(&loc, |key, body| {
        let (server, loc) = (&server, &loc);
        async move { plant(server, loc, &key, body).await }
    })
    .await;
    eprintln!("{}: {found}", kind.name());
    let want = expected(kind);
    // A lost race is certain, a won one is luck: a store documented as racing may pass a run.
    let found_but_race = Capabilities {
        atomic_create: want.atomic_create,
        ..found
    };
    assert_eq!(
        found_but_race,
        want,
        "{} no longer behaves as docs/storage.md says; update the table and \
         ServerKind::documented_capabilities",
        kind.name()
    );
    if want.atomic_create {
        assert!(
            found.atomic_create,
            "{}: racing creates had two winners",
            kind.name()
        );
    }
}

async fn objects_round_trip(kind: ServerKind) {
    let Some((server, loc)) = server(kind, "root").await else {
        return;
    };
    let names = ["a.bin", "dir/b.bin", "dir/sub/c d~e.bin", "other/x"];
    for (i, name) in names.iter().enumerate() {
        plant(&server, &loc, name, data(100 + i, i as u64)).await;
    }
    if !expected(kind).put {
        // Detected, not skipped: the write fails with an error naming the object.
        let err = loc.put("w.bin", data(10, 1)).await.unwrap_err();
        assert!(err.to_string().contains("w.bin"), "{err}");
    }
    for (i, name) in names.iter().enumerate() {
        let want = data(100 + i, i as u64);
        assert_eq!(loc.get(name).await.unwrap(), want, "{name}");
        let info = loc.head(name).await.unwrap();
        assert_eq!((info.size, info.key.as_str()), (100 + i as u64, *name));
        assert_eq!(
            loc.get_range(name, 10..60).await.unwrap(),
            want.slice(10..60)
        );
    }
    let keys = |v: Vec<shardstream_storage::ObjectInfo>| -> Vec<String> {
        v.into_iter().map(|o| o.key).collect()
    };
    assert_eq!(keys(loc.list("").await.unwrap()), names);
    assert_eq!(
        keys(loc.list("dir").await.unwrap()),
        ["dir/b.bin", "dir/sub/c d~e.bin"]
    );
    assert_eq!(loc.list_dirs("").await.unwrap(), ["dir", "other"]);
    assert!(loc.list("nothing-here").await.unwrap().is_empty());
    let sub = loc.join("dir").unwrap();
    assert_eq!(sub.get("b.bin").await.unwrap(), data(101, 1));

    let missing = loc.get("no/such.bin").await.unwrap_err();
    assert!(
        matches!(missing, StorageError::NotFound { .. }),
        "{}: {missing}",
        kind.name()
    );

    if expected(kind).copy {
        loc.copy("a.bin", "copy/a.bin").await.unwrap();
        assert_eq!(loc.get("copy/a.bin").await.unwrap(), data(100, 0));
    } else {
        let err = loc.copy("a.bin", "copy/a.bin").await.unwrap_err();
        assert!(err.to_string().contains("a.bin"), "{err}");
    }
    loc.delete("a.bin").await.unwrap();
    assert!(!loc.exists("a.bin").await.unwrap());
    loc.delete("a.bin").await.unwrap(); // deleting twice is fine
    if expected(kind).put {
        loc.put("empty", Bytes::new()).await.unwrap();
        assert!(loc.get("empty").await.unwrap().is_empty());
    }
}

async fn large_object_round_trip(kind: ServerKind) {
    let Some((server, loc)) = server(kind, "big").await else {
        return;
    };
    let loc = loc.with_options(
        loc.options()
            .clone()
            .with_part_size(5 << 20)
            .with_chunk_size(1 << 20),
    );
    let dir = tempfile::tempdir().unwrap();
    let body = data(12 << 20, 3);
    let file = dir.path().join("big.bin");
    std::fs::write(&file, &body).unwrap();
    if expected(kind).multipart {
        assert_eq!(loc.upload_file(&file, "big.bin").await.unwrap(), 12 << 20);
    } else {
        let err = loc.upload_file(&file, "big.bin").await.unwrap_err();
        assert!(err.to_string().contains("big.bin"), "{err}");
        server.put_raw("conf", "big/big.bin", &body).await.unwrap();
    }
    // Parallel ranged GETs of 1 MiB chunks put it back together.
    assert_eq!(loc.get("big.bin").await.unwrap(), body);
    let out = dir.path().join("back.bin");
    assert_eq!(
        loc.download_to_file("big.bin", &out).await.unwrap(),
        12 << 20
    );
    assert!(std::fs::read(&out).unwrap() == body);
    drop(server);
}

async fn create_only_put_races(kind: ServerKind) {
    let Some((_server, loc)) = server(kind, "race").await else {
        return;
    };
    let caps = expected(kind);
    for round in 0..3 {
        let key = format!("m{round}.json");
        let puts = (0..4).map(|i| loc.put_if_absent(&key, data(64, i)));
        let outcomes = futures::future::join_all(puts).await;
        let created = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(PutOutcome::Created)))
            .count();
        eprintln!("{} round {round}: {created} of 4 created", kind.name());
        if caps.atomic_create {
            assert_eq!(created, 1, "{}: {outcomes:?}", kind.name());
            assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
        } else if caps.put {
            // Racing writers may all "win" (the last write stays): at least one does, and
            // the object is one writer's whole body, never a mix. The checkpoint commit's
            // read-back is what tells the winners apart on such a store.
            assert!(created >= 1, "{}: {outcomes:?}", kind.name());
            let stored = loc.get(&key).await.unwrap();
            assert!(
                (0..4).any(|i| stored == data(64, i)),
                "{}: {key} holds no writer's body",
                kind.name()
            );
        } else {
            assert!(outcomes.iter().all(|o| o.is_err()), "{outcomes:?}");
        }
    }
}
