//! The storage contract, one body per behaviour, run against a local directory and a real
//! moto S3 server over HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use std::sync::Arc;

use bytes::Bytes;
use common::{data, decorate, Backend};
use shardstream_storage::testing::{CountingStore, FailRule, FailingStore, Fault, OpKind};
use shardstream_storage::{
    sync_down, sync_up, Location, PutOutcome, StorageError, StorageOptions, SyncReport,
};

const CHUNK: usize = 64 * 1024;

on_every_backend!(
    put_get_list_head,
    missing_objects_and_unsafe_names,
    parallel_get_matches_content_around_chunk_boundaries,
    get_range_spans_chunks,
    download_is_atomic_and_bounded,
    download_failure_leaves_no_file,
    multipart_upload_of_24_mib,
    failed_multipart_upload_leaves_nothing,
    put_if_absent_creates_once,
    concurrent_put_if_absent_has_one_winner,
    sync_round_trip_is_resumable,
);

async fn put_get_list_head(b: Backend) {
    let loc = b.location();
    let names = ["a.bin", "dir/b.bin", "dir/sub/c d~e.bin", "other/x"];
    for (i, name) in names.iter().enumerate() {
        loc.put(name, data(100 + i, i as u64)).await.unwrap();
    }
    for (i, name) in names.iter().enumerate() {
        assert_eq!(
            loc.get(name).await.unwrap(),
            data(100 + i, i as u64),
            "{name}"
        );
        let info = loc.head(name).await.unwrap();
        assert_eq!(info.size, 100 + i as u64);
        assert_eq!(info.key, *name);
    }
    let all: Vec<String> = loc
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(all, names);
    let dir: Vec<String> = loc
        .list("dir")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(dir, ["dir/b.bin", "dir/sub/c d~e.bin"]);
    assert_eq!(loc.list_dirs("").await.unwrap(), ["dir", "other"]);
    assert!(loc.list("nothing-here").await.unwrap().is_empty());

    // A joined location sees the same objects under shorter names.
    let sub = loc.join("dir").unwrap();
    assert_eq!(sub.get("b.bin").await.unwrap(), data(101, 1));
    assert!(sub.url().ends_with("/root/dir"), "{}", sub.url());

    loc.copy("a.bin", "copy/a.bin").await.unwrap();
    assert_eq!(loc.get("copy/a.bin").await.unwrap(), data(100, 0));
    loc.delete("a.bin").await.unwrap();
    assert!(!loc.exists("a.bin").await.unwrap());
    loc.delete("a.bin").await.unwrap(); // deleting twice is fine
    loc.put("empty", Bytes::new()).await.unwrap();
    assert!(loc.get("empty").await.unwrap().is_empty());
}

async fn missing_objects_and_unsafe_names(b: Backend) {
    let loc = b.location();
    match loc.get("no/such.bin").await.unwrap_err() {
        StorageError::NotFound { url } => assert!(url.ends_with("root/no/such.bin"), "{url}"),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        loc.head("nope").await,
        Err(StorageError::NotFound { .. })
    ));
    for bad in ["../escape", "/abs", "a//b", "a/./b", ""] {
        let err = loc.put(bad, Bytes::from_static(b"x")).await.unwrap_err();
        assert!(
            matches!(err, StorageError::UnsafePath { ref name, .. } if name == bad),
            "{err}"
        );
        assert!(loc.join(bad).is_err());
    }
    match loc.local_path("x/y").unwrap() {
        Some(p) => assert!(!b.is_s3() && p.ends_with("root/x/y")),
        None => assert!(b.is_s3()),
    }
}

async fn parallel_get_matches_content_around_chunk_boundaries(b: Backend) {
    let loc = b.location_with(|o| o.with_chunk_size(CHUNK));
    for (i, size) in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17]
        .into_iter()
        .enumerate()
    {
        let name = format!("obj-{size}");
        let content = data(size, i as u64);
        loc.put(&name, content.clone()).await.unwrap();
        let (counting, counted) = decorate(&loc, CountingStore::new);
        let got = counted.get_parallel(&name, CHUNK, 4).await.unwrap();
        assert_eq!(got.len(), size);
        assert!(got == content, "content differs for size {size}");
        let counts = counting.counts();
        assert_eq!(
            counts.get,
            size.div_ceil(CHUNK).max(1) as u64,
            "GETs for size {size}"
        );
        assert!(counts.max_concurrent_gets <= 4, "{counts:?}");
    }
}

async fn get_range_spans_chunks(b: Backend) {
    let loc = b.location_with(|o| o.with_chunk_size(CHUNK).with_concurrency(3));
    let content = data(5 * CHUNK, 7);
    loc.put("big", content.clone()).await.unwrap();
    for range in [
        0..1,
        10..CHUNK as u64 + 10,
        3..(4 * CHUNK as u64 + 5),
        0..(5 * CHUNK as u64),
    ] {
        let got = loc.get_range("big", range.clone()).await.unwrap();
        let (s, e) = (range.start as usize, range.end as usize);
        assert!(got == content.slice(s..e), "range {range:?}");
    }
    assert!(loc.get_range("big", 7..7).await.unwrap().is_empty());
    let past_end = loc
        .get_range("big", 0..(5 * CHUNK as u64 + 1))
        .await
        .unwrap_err();
    assert!(
        matches!(past_end, StorageError::SizeMismatch { .. }),
        "{past_end}"
    );
}

async fn download_is_atomic_and_bounded(b: Backend) {
    let loc = b.location_with(|o| o.with_chunk_size(CHUNK).with_concurrency(3));
    let content = data(10 * CHUNK + 5, 3);
    loc.put("shard.mds", content.clone()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("cache/run/shard.mds");
    let (counting, counted) = decorate(&loc, CountingStore::new);
    let n = counted.download_to_file("shard.mds", &dest).await.unwrap();
    assert_eq!(n, content.len() as u64);
    assert!(std::fs::read(&dest).unwrap() == content);
    let counts = counting.counts();
    assert_eq!(counts.get, 11);
    assert!(counts.max_concurrent_gets <= 3, "{counts:?}");
    assert_eq!(
        std::fs::read_dir(dest.parent().unwrap()).unwrap().count(),
        1
    );
}

async fn download_failure_leaves_no_file(b: Backend) {
    let loc = b.location_with(|o| o.with_chunk_size(CHUNK).with_concurrency(2));
    loc.put("shard.mds", data(6 * CHUNK, 4)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("shard.mds");
    std::fs::write(&dest, b"previous version").unwrap();
    let rule = FailRule::new(Fault::Unavailable).on(OpKind::Get).after(3);
    let (failing, faulty) = decorate(&loc, |s| FailingStore::new(s).with_rule(rule));
    let err = faulty
        .download_to_file("shard.mds", &dest)
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Backend { .. }), "{err}");
    assert!(failing.injected() >= 1);
    // The old file is untouched and no temporary file is left behind.
    assert_eq!(std::fs::read(&dest).unwrap(), b"previous version");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // A missing object fails the same way, before creating anything.
    let err = loc
        .download_to_file("missing", &dir.path().join("m"))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::NotFound { .. }));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

async fn multipart_upload_of_24_mib(b: Backend) {
    let loc = b.location_with(|o| o.with_part_size(8 << 20).with_concurrency(3));
    let dir = tempfile::tempdir().unwrap();
    let content = data(24 << 20, 5);
    let big = dir.path().join("big.bin");
    std::fs::write(&big, &content).unwrap();
    let small = dir.path().join("small.bin");
    std::fs::write(&small, b"small").unwrap();

    let (counting, counted) = decorate(&loc, CountingStore::new);
    assert_eq!(
        counted.upload_file(&big, "up/big.bin").await.unwrap(),
        24 << 20
    );
    assert_eq!(
        counted.upload_file(&small, "up/small.bin").await.unwrap(),
        5
    );
    let counts = counting.counts();
    assert_eq!(
        (counts.put_multipart, counts.put_part, counts.complete),
        (1, 3, 1)
    );
    assert_eq!(counts.put, 1);
    assert!(loc.get("up/big.bin").await.unwrap() == content);
    assert_eq!(loc.get("up/small.bin").await.unwrap(), &b"small"[..]);
}

async fn failed_multipart_upload_leaves_nothing(b: Backend) {
    let loc = b.location_with(|o| o.with_part_size(5 << 20).with_concurrency(2));
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.bin");
    std::fs::write(&big, data(16 << 20, 6)).unwrap();
    let rule = FailRule::new(Fault::Unavailable)
        .on(OpKind::PutPart)
        .after(2);
    let (_, faulty) = decorate(&loc, |s| FailingStore::new(s).with_rule(rule));
    let err = faulty.upload_file(&big, "up/big.bin").await.unwrap_err();
    assert!(matches!(err, StorageError::Backend { .. }), "{err}");
    assert!(!loc.exists("up/big.bin").await.unwrap());
    assert!(loc.list("").await.unwrap().is_empty());
}

async fn put_if_absent_creates_once(b: Backend) {
    let loc = b.location();
    let first = loc
        .put_if_absent("ckpt/manifest.json", Bytes::from_static(b"one"))
        .await;
    assert_eq!(first.unwrap(), PutOutcome::Created);
    let second = loc
        .put_if_absent("ckpt/manifest.json", Bytes::from_static(b"two"))
        .await;
    assert_eq!(second.unwrap(), PutOutcome::AlreadyExists);
    assert_eq!(loc.get("ckpt/manifest.json").await.unwrap(), &b"one"[..]);
}

async fn concurrent_put_if_absent_has_one_winner(b: Backend) {
    let loc = b.location();
    let tasks: Vec<_> = (0..8u8)
        .map(|i| {
            let loc = loc.clone();
            tokio::spawn(async move {
                (
                    i,
                    loc.put_if_absent("commit", Bytes::from(vec![i; 16]))
                        .await
                        .unwrap(),
                )
            })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        let (i, outcome) = t.await.unwrap();
        if outcome == PutOutcome::Created {
            winners.push(i);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(loc.get("commit").await.unwrap(), vec![winners[0]; 16]);
}

async fn sync_round_trip_is_resumable(b: Backend) {
    let loc = b.location_with(|o| {
        o.with_part_size(5 << 20)
            .with_chunk_size(1 << 20)
            .with_concurrency(4)
    });
    let src = tempfile::tempdir().unwrap();
    let files = [
        ("a.txt", 10usize),
        ("d/b.bin", 3 << 20),
        ("d/e/c.bin", 6 << 20),
        ("empty", 0),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        let path = src.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data(*len, i as u64)).unwrap();
    }
    let total: u64 = files.iter().map(|(_, l)| *l as u64).sum();
    let up = sync_up(src.path(), &loc).await.unwrap();
    assert_eq!(
        up,
        SyncReport {
            transferred: 4,
            skipped: 0,
            bytes: total
        }
    );
    let again = sync_up(src.path(), &loc).await.unwrap();
    assert_eq!(
        again,
        SyncReport {
            transferred: 0,
            skipped: 4,
            bytes: 0
        }
    );

    let dst = tempfile::tempdir().unwrap();
    let down = sync_down(&loc, dst.path()).await.unwrap();
    assert_eq!(
        down,
        SyncReport {
            transferred: 4,
            skipped: 0,
            bytes: total
        }
    );
    for (name, _) in files {
        assert!(
            std::fs::read(src.path().join(name)).unwrap()
                == std::fs::read(dst.path().join(name)).unwrap()
        );
    }
    // A truncated local copy (an interrupted earlier tool) is fetched again; the rest is kept.
    std::fs::write(dst.path().join("d/b.bin"), b"partial").unwrap();
    let resumed = sync_down(&loc, dst.path()).await.unwrap();
    assert_eq!(
        resumed,
        SyncReport {
            transferred: 1,
            skipped: 3,
            bytes: 3 << 20
        }
    );
    assert_eq!(
        std::fs::read(dst.path().join("d/b.bin")).unwrap().len(),
        3 << 20
    );
}

/// S3 only: a same-size change is caught by the MD5 ETag (local stores have no content ETag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_sync_detects_same_size_changes_by_etag() {
    let b = Backend::s3().await;
    let loc = b.location_with(|o| o.with_part_size(5 << 20).with_concurrency(2));
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("small"), data(1000, 1)).unwrap();
    std::fs::write(src.path().join("multi"), data(11 << 20, 2)).unwrap();
    sync_up(src.path(), &loc).await.unwrap();
    assert_eq!(sync_up(src.path(), &loc).await.unwrap().skipped, 2);
    std::fs::write(src.path().join("small"), data(1000, 3)).unwrap();
    std::fs::write(src.path().join("multi"), data(11 << 20, 4)).unwrap();
    let report = sync_up(src.path(), &loc).await.unwrap();
    assert_eq!(report.transferred, 2, "{report:?}");
    assert!(loc.get("multi").await.unwrap() == data(11 << 20, 4));
}

/// The options used by a location opened through `MotoServer::open` point at moto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_open_uses_path_style_and_conditional_put() {
    let Backend::S3(moto) = Backend::s3().await else {
        unreachable!()
    };
    let loc: Location = moto.open("s3://test/p").unwrap();
    assert_eq!(loc.url(), "s3://test/p");
    loc.put("k", Bytes::from_static(b"v")).await.unwrap();
    assert_eq!(
        loc.put_if_absent("k", Bytes::from_static(b"w"))
            .await
            .unwrap(),
        PutOutcome::AlreadyExists
    );
    let opts: &StorageOptions = loc.options();
    assert_eq!(opts.endpoint.as_deref(), Some(moto.endpoint().as_str()));
    let _keep: Arc<_> = Arc::clone(loc.store());
}

on_every_backend!(object_changed_mid_read_is_detected);

/// The object is overwritten right after the first GET of a chunked read: the next chunk,
/// pinned to the first one's ETag, must fail rather than splice two versions together.
async fn object_changed_mid_read_is_detected(b: Backend) {
    let loc = b.location_with(|o| o.with_chunk_size(CHUNK).with_concurrency(1));
    loc.put("obj", data(4 * CHUNK, 1)).await.unwrap();
    let (_, racing) = decorate(&loc, |inner| {
        common::overwrite::OverwriteAfterFirstGet::new(inner, data(4 * CHUNK, 2))
    });
    let err = racing.get("obj").await.unwrap_err();
    assert!(
        matches!(err, StorageError::Changed { ref url } if url.ends_with("root/obj")),
        "{err}"
    );
    // Nothing was cached or half-read: a fresh read returns the new version whole.
    assert!(loc.get("obj").await.unwrap() == data(4 * CHUNK, 2));
}
