//! Issue 39.6: secrets never appear in errors or `Debug` output. Unique markers stand in for
//! an AWS secret key and session token and an Azure SAS signature; failing calls against a
//! real moto server (a missing bucket, a 403, an unreachable endpoint) and an Azure endpoint
//! that refuses or is not there must not echo them anywhere in the error, its `Debug`, or its
//! source chain (what `anyhow`'s `{:#}` prints).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use shardstream_storage::testing::{free_port, options_for, FaultProxy, MotoServer};
use shardstream_storage::{Env, Location, RetryPolicy, S3Settings, StorageError, StorageOptions};

const SECRET: &str = "MARKsecret7f3a9c1e";
const TOKEN: &str = "MARKtoken51b2e0d4";
const SAS_SIG: &str = "MARKsas0c4d88b2";
const MARKERS: [&str; 3] = [SECRET, TOKEN, SAS_SIG];

fn aws_env() -> Env {
    Env::from_pairs([
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_SESSION_TOKEN", TOKEN),
    ])
}

fn azure_env(endpoint: &str) -> Env {
    Env::from_pairs([
        ("AZURE_STORAGE_ACCOUNT_NAME", "acct"),
        (
            "AZURE_STORAGE_SAS_KEY",
            &*format!("sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&sig={SAS_SIG}"),
        ),
        ("AZURE_STORAGE_ENDPOINT", endpoint),
    ])
}

/// Quick failures: one retry, short backoff.
fn quick(endpoint: &str) -> StorageOptions {
    options_for(endpoint).with_retry(RetryPolicy {
        max_retries: 1,
        init_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(10),
        base: 2.0,
        retry_timeout: Duration::from_secs(2),
    })
}

/// Everything an error can print: `Display`, `Debug`, and each source's.
fn all_text(e: &StorageError) -> String {
    let mut text = format!("{e}\n{e:?}\n");
    let mut current = std::error::Error::source(e);
    while let Some(s) = current {
        text.push_str(&format!("{s}\n{s:?}\n"));
        current = s.source();
    }
    text
}

fn assert_clean(what: &str, text: &str) {
    for marker in MARKERS {
        assert!(!text.contains(marker), "{what} leaks {marker}:\n{text}");
    }
}

async fn failures(loc: &Location) -> Vec<StorageError> {
    vec![
        loc.get("some/object.bin").await.unwrap_err(),
        loc.head("x").await.unwrap_err(),
        loc.list("").await.unwrap_err(),
        loc.put("y", Bytes::from_static(b"y")).await.unwrap_err(),
    ]
}

#[tokio::test]
async fn s3_errors_and_debug_hold_no_credentials() {
    let moto = MotoServer::start().await.unwrap();
    // A missing bucket: 404s from a live server.
    let missing = Location::open_with(
        "s3://no-such-bucket/p",
        &quick(&moto.endpoint()),
        &aws_env(),
    )
    .unwrap();
    assert_clean("Location Debug", &format!("{missing:?}"));
    for e in failures(&missing).await {
        assert_clean("missing-bucket error", &all_text(&e));
    }

    // Credentials refused: 403 AccessDenied on every request.
    moto.create_bucket("sec").await.unwrap();
    let proxy = FaultProxy::start(moto.addr()).await.unwrap();
    proxy.fail_next_with(1000, 403);
    let denied = Location::open_with("s3://sec/p", &quick(&proxy.endpoint()), &aws_env()).unwrap();
    for e in failures(&denied).await {
        assert!(e.to_string().contains("403"), "{e}");
        assert_clean("403 error", &all_text(&e));
    }

    // Nobody listening.
    let dead = format!("http://127.0.0.1:{}", free_port().unwrap());
    let unreachable = Location::open_with("s3://sec/p", &quick(&dead), &aws_env()).unwrap();
    for e in failures(&unreachable).await {
        assert_clean("unreachable error", &all_text(&e));
    }

    let settings = S3Settings::resolve(&aws_env(), &quick(&dead)).unwrap();
    assert_clean("S3Settings Debug", &format!("{settings:?}"));
    assert_clean("Env Debug", &format!("{:?}", aws_env()));
}

#[tokio::test]
async fn azure_sas_never_leaves_the_request() {
    // The SAS signature is in every request URL; object_store's errors print that URL.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = FaultProxy::start(upstream.local_addr().unwrap())
        .await
        .unwrap();
    proxy.fail_next_with(1000, 403);
    let refused = Location::open_with(
        "az://cont/p",
        &quick(&proxy.endpoint()),
        &azure_env(&proxy.endpoint()),
    )
    .unwrap();
    assert_clean("Location Debug", &format!("{refused:?}"));
    assert_clean("Env Debug", &format!("{:?}", azure_env(&proxy.endpoint())));
    for e in failures(&refused).await {
        assert_clean("azure 403 error", &all_text(&e));
    }

    let dead = format!("http://127.0.0.1:{}", free_port().unwrap());
    let unreachable = Location::open_with("az://cont/p", &quick(&dead), &azure_env(&dead)).unwrap();
    for e in failures(&unreachable).await {
        let text = all_text(&e);
        assert_clean("azure unreachable error", &text);
        // Still useful: the object is named.
        assert!(text.contains("az://cont/p"), "{text}");
    }
}

#[test]
fn configuration_errors_do_not_quote_secrets() {
    let err = Location::open_with(
        "az://cont/p?sv=1&sig=MARKsas0c4d88b2",
        &StorageOptions::default(),
        &Env::default(),
    )
    .unwrap_err();
    assert_clean("invalid URL error", &all_text(&err));
}
