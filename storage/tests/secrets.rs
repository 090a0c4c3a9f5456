//! Issue 39.6: secrets never appear in errors or `Debug` output. Unique markers stand in for
//! an AWS secret key and session token and an Azure SAS signature; failing calls against a
//! real moto server (a missing bucket, a 403, an unreachable endpoint) and an Azure endpoint
//! that refuses or is not there must not echo them anywhere in the error, its `Debug`, or its
//! source chain (what `anyhow`'s `{:#}` prints).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use shardstream_storage::testing::{
    free_port, options_for, require, FaultProxy, MotoServer, ServerKind, TestServer,
    AZURITE_ACCOUNT,
};
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

/// The same grep over every server of the conformance suite, each failing for its own reason
/// with a secret of its own kind in its configuration: moto (a missing bucket) and s3s-fs (a
/// wrong secret key: 403) with a secret key and session token; fake-gcs-server (missing
/// objects, refused writes) with a bearer token; Azurite (403) with a SAS token, and with a
/// wrong account key.
async fn server_errors_hold_no_secrets(kind: ServerKind) {
    if require(kind).is_none() {
        return;
    }
    let server = TestServer::start(kind).await.unwrap();
    let endpoint = server.endpoint();
    let envs: Vec<Env> = match kind {
        ServerKind::Moto => vec![aws_env()],
        ServerKind::S3sFs => {
            server.create_bucket("no-such-bucket").await.unwrap();
            vec![Env::from_pairs([
                ("AWS_ACCESS_KEY_ID", "conformance"),
                ("AWS_SECRET_ACCESS_KEY", SECRET),
                ("AWS_SESSION_TOKEN", TOKEN),
            ])]
        }
        ServerKind::FakeGcs => vec![Env::from_pairs([
            ("GOOGLE_BEARER_TOKEN", TOKEN),
            ("GOOGLE_BASE_URL", endpoint.as_str()),
        ])],
        ServerKind::Azurite => {
            server.create_bucket("no-such-bucket").await.unwrap();
            let account_endpoint = format!("{endpoint}/{AZURITE_ACCOUNT}");
            let sas_value =
                format!("sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&sig={SAS_SIG}");
            let sas = Env::from_pairs([
                ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT),
                ("AZURE_STORAGE_SAS_KEY", sas_value.as_str()),
                ("AZURE_STORAGE_ENDPOINT", account_endpoint.as_str()),
            ]);
            // A well-formed but wrong key: base64 of the marker.
            let wrong_key = Env::from_pairs([
                ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT),
                ("AZURE_STORAGE_ACCOUNT_KEY", WRONG_KEY_B64),
                ("AZURE_STORAGE_ENDPOINT", account_endpoint.as_str()),
            ]);
            vec![sas, wrong_key]
        }
    };
    for env in envs {
        let loc = Location::open_with(&server.url("no-such-bucket", "p"), &quick(&endpoint), &env)
            .unwrap();
        assert_clean("Location Debug", &format!("{loc:?}"));
        assert_clean("Env Debug", &format!("{env:?}"));
        let attempts = [
            loc.get("some/object.bin").await.err(),
            loc.head("x").await.err(),
            loc.list("").await.err(),
            loc.put("y", Bytes::from_static(b"y")).await.err(),
        ];
        let errors: Vec<StorageError> = attempts.into_iter().flatten().collect();
        assert!(errors.len() >= 2, "{}: too few failures", kind.name());
        for e in &errors {
            let text = all_text(e);
            assert_clean(kind.name(), &text);
            assert!(
                !text.contains(WRONG_KEY_B64) && !text.contains("MARKkey"),
                "{}: {text}",
                kind.name()
            );
        }
        eprintln!("{}: {}", kind.name(), errors[0]);
    }
}

/// `base64("MARKkey9e1f2a3b4c5d6e7f80")`, a well-formed Azure account key that is not Azurite's.
const WRONG_KEY_B64: &str = "TUFSS2tleTllMWYyYTNiNGM1ZDZlN2Y4MA==";

mod every_server {
    use shardstream_storage::testing::ServerKind;
    #[tokio::test]
    async fn moto() {
        super::server_errors_hold_no_secrets(ServerKind::Moto).await
    }
    #[tokio::test]
    async fn s3s_fs() {
        super::server_errors_hold_no_secrets(ServerKind::S3sFs).await
    }
    #[tokio::test]
    async fn fake_gcs() {
        super::server_errors_hold_no_secrets(ServerKind::FakeGcs).await
    }
    #[tokio::test]
    async fn azurite() {
        super::server_errors_hold_no_secrets(ServerKind::Azurite).await
    }
}
