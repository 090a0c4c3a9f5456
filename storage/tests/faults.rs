//! Transport faults below the HTTP client, where `object_store`'s retries and timeouts act:
//! throttling (503 SlowDown), requests the server refuses (4xx), a dead endpoint, a hung server,
//! and a slow but live link.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use shardstream_storage::object_store::ObjectStoreExt;
use shardstream_storage::testing::{free_port, options_for, test_env, FaultProxy, MotoServer};
use shardstream_storage::{Location, RetryPolicy, StorageError, StorageOptions, Timeouts};

async fn moto_with_bucket() -> MotoServer {
    let moto = MotoServer::start()
        .await
        .unwrap_or_else(|e| panic!("S3 tests need moto_server: {e}"));
    moto.create_bucket("test").await.unwrap();
    moto
}

fn open(endpoint: &str, tweak: impl FnOnce(StorageOptions) -> StorageOptions) -> Location {
    let options = tweak(options_for(endpoint));
    Location::open_with("s3://test/root", &options, &test_env()).unwrap()
}

fn retries(max_retries: usize) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        init_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        base: 2.0,
        retry_timeout: Duration::from_secs(20),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_down_replies_are_retried_until_success() {
    let moto = moto_with_bucket().await;
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.fail_next(3);
    let loc = open(&proxy.endpoint(), |o| o.with_retry(retries(5)));
    loc.put("k", Bytes::from_static(b"payload")).await.unwrap();
    assert_eq!(proxy.failed(), 3);

    // A fresh client, so that its first connections meet the faults.
    proxy.fail_next(2);
    let reader = open(&proxy.endpoint(), |o| o.with_retry(retries(5)));
    assert_eq!(reader.get("k").await.unwrap(), &b"payload"[..]);
    assert_eq!(proxy.failed(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_slow_down_gives_up_after_max_retries() {
    let moto = moto_with_bucket().await;
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.fail_next(usize::MAX);
    let loc = open(&proxy.endpoint(), |o| o.with_retry(retries(3)));
    let started = Instant::now();
    let err = loc.get("k").await.unwrap_err();
    assert!(matches!(err, StorageError::Backend { .. }), "{err}");
    assert!(err.to_string().contains("503"), "{err}");
    assert_eq!(proxy.failed(), 4, "one attempt and three retries");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_fails_at_once_naming_its_status() {
    let moto = moto_with_bucket().await;
    let loc = open(&moto.endpoint(), |o| o);
    // The second key's characters are percent-encoded in the request's URI.
    let keys = ["k", "dir/a key, with+plus & é.mds"];
    for key in keys {
        loc.put(key, Bytes::from_static(b"payload")).await.unwrap();
    }
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    let reader = open(&proxy.endpoint(), |o| o.with_retry(retries(5)));
    // A 416 is followed by one HEAD (an empty object answers 416 to any range), never retried.
    for (key, (status, requests)) in keys
        .into_iter()
        .flat_map(|k| [(k, (400u16, 1)), (k, (416, 2))])
    {
        proxy.fail_next_with(usize::MAX, status);
        let before = proxy.failed();
        let err = reader.get(key).await.unwrap_err();
        // Also pins the wording of object_store's status errors, which `Rejected` relies on.
        assert!(
            matches!(&err, StorageError::Rejected { status: s, url, .. }
                if *s == status && url.ends_with(&format!("root/{key}"))),
            "{key}: {err:?}"
        );
        assert!(!err.is_transient(), "{err}");
        assert!(err.to_string().contains(&format!("HTTP {status}")), "{err}");
        assert_eq!(
            proxy.failed() - before,
            requests,
            "{key}: a {status} is not retried"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_requests_is_retried_and_stays_transient() {
    let moto = moto_with_bucket().await;
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.fail_next_with(usize::MAX, 429);
    let loc = open(&proxy.endpoint(), |o| o.with_retry(retries(2)));
    let err = loc.get("k").await.unwrap_err();
    assert!(matches!(err, StorageError::Backend { .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(proxy.failed(), 3, "one attempt and two retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_endpoint_fails_in_bounded_time() {
    let endpoint = format!("http://127.0.0.1:{}", free_port().unwrap());
    let loc = open(&endpoint, |o| o.with_retry(retries(3)));
    let started = Instant::now();
    let err = loc.get("k").await.unwrap_err();
    assert!(matches!(err, StorageError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains("s3://test/root/k"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_server_times_out_instead_of_hanging() {
    let moto = moto_with_bucket().await;
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.set_blackhole(true);
    let timeouts = Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(1),
        stall: Duration::from_secs(1),
    };
    let loc = open(&proxy.endpoint(), |o| {
        o.with_retry(retries(1)).with_timeouts(timeouts)
    });
    let started = Instant::now();
    let err = loc.get("k").await.unwrap_err();
    assert!(matches!(err, StorageError::Timeout { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

/// A 2 MiB object over a 1 MiB/s link takes ~2 s, twice the 1 s request timeout: as 256 KiB
/// ranged chunks it downloads fine, while one whole-object GET times out on every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_but_progressing_transfer_is_not_killed_by_timeouts() {
    let moto = moto_with_bucket().await;
    let content = Bytes::from(vec![7u8; 2 << 20]);
    moto.open("s3://test/root")
        .unwrap()
        .put("big", content.clone())
        .await
        .unwrap();

    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.set_bandwidth(1 << 20);
    let timeouts = Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(1),
        stall: Duration::from_secs(1),
    };
    let loc = open(&proxy.endpoint(), |o| {
        o.with_retry(retries(1))
            .with_timeouts(timeouts)
            .with_chunk_size(256 << 10)
            .with_concurrency(1)
    });
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("big");
    let started = Instant::now();
    assert_eq!(loc.download_to_file("big", &dest).await.unwrap(), 2 << 20);
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the link was not slow"
    );
    assert!(std::fs::read(&dest).unwrap() == content);

    let whole = loc.store().get(&loc.path("big").unwrap()).await;
    let whole = match whole {
        Ok(r) => r.bytes().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = StorageError::from_backend("s3://test/root/big", whole.unwrap_err());
    assert!(matches!(err, StorageError::Timeout { .. }), "{err}");
}

#[tokio::test]
async fn missing_moto_binary_is_a_clear_error() {
    let err = MotoServer::start_binary("/nonexistent/moto_server".as_ref())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/moto_server") && msg.contains("SHARDSTREAM_MOTO_SERVER"),
        "{msg}"
    );
}
