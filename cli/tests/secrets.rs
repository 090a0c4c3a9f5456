//! Secrets never printed by a failing command, on every server of the conformance suite: the
//! `shardstream` binary is run against moto, s3s-fs, fake-gcs-server and Azurite with a secret of
//! each backend's own kind in its environment (secret key + session token; bearer token; SAS token;
//! a wrong account key), each command fails for the server's own reason (a missing bucket, 403,
//! a refused write), with debug logs on and with `--json`, and its stdout and stderr are grepped
//! for the secret. The storage layer's own errors are checked in `storage/tests/secrets.rs`; this
//! is what a user sees in a terminal or a pod's log.
#![allow(clippy::unwrap_used, clippy::expect_used)] // set-up steps outside #[test] fns

use crate::common::run_env;
use shardstream_storage::testing::{require, ServerKind, TestServer, AZURITE_ACCOUNT};

const SECRET: &str = "MARKsecret7f3a9c1e";
const TOKEN: &str = "MARKtoken51b2e0d4";
const SAS_SIG: &str = "MARKsas0c4d88b2";
/// `base64("MARKkey9e1f2a3b4c5d6e7f80")`: a well-formed Azure account key that is not Azurite's.
const WRONG_KEY_B64: &str = "TUFSS2tleTllMWYyYTNiNGM1ZDZlN2Y4MA==";
const MARKERS: [&str; 5] = [SECRET, TOKEN, SAS_SIG, WRONG_KEY_B64, "MARKkey"];

/// The environments a user would set for `kind`, each holding a secret and each failing.
fn environments(kind: ServerKind, endpoint: &str) -> Vec<Vec<(&'static str, String)>> {
    let common = vec![
        // Bounded: a failure must come back in seconds, not after the default retry window.
        ("SHARDSTREAM_RETRY_WINDOW", "2".to_string()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
    ];
    let with = |extra: Vec<(&'static str, String)>| {
        let mut env = common.clone();
        env.extend(extra);
        env
    };
    match kind {
        ServerKind::Moto | ServerKind::S3sFs => vec![with(vec![
            ("AWS_ENDPOINT_URL", endpoint.to_string()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ACCESS_KEY_ID", "conformance".to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
            ("AWS_SESSION_TOKEN", TOKEN.to_string()),
        ])],
        ServerKind::FakeGcs => vec![with(vec![
            ("GOOGLE_BEARER_TOKEN", TOKEN.to_string()),
            ("GOOGLE_BASE_URL", endpoint.to_string()),
        ])],
        ServerKind::Azurite => {
            let account_endpoint = format!("{endpoint}/{AZURITE_ACCOUNT}");
            vec![
                with(vec![
                    ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT.to_string()),
                    (
                        "AZURE_STORAGE_SAS_KEY",
                        format!(
                            "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&sig={SAS_SIG}"
                        ),
                    ),
                    ("AZURE_STORAGE_ENDPOINT", account_endpoint.clone()),
                    ("AZURE_ALLOW_HTTP", "true".to_string()),
                ]),
                with(vec![
                    ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT.to_string()),
                    ("AZURE_STORAGE_ACCOUNT_KEY", WRONG_KEY_B64.to_string()),
                    ("AZURE_STORAGE_ENDPOINT", account_endpoint),
                    ("AZURE_ALLOW_HTTP", "true".to_string()),
                ]),
            ]
        }
    }
}

async fn failing_commands_print_no_secret(kind: ServerKind) {
    if require(kind).is_none() {
        return;
    }
    let server = TestServer::start(kind).await.unwrap();
    let endpoint = server.endpoint();
    if matches!(kind, ServerKind::S3sFs | ServerKind::Azurite) {
        // The bucket exists: the failure is the server refusing the credentials.
        server.create_bucket("no-such-bucket").await.unwrap();
    }
    let url = server.url("no-such-bucket", "ds");
    let ckpt = server.url("no-such-bucket", "ckpt");
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("dl");
    let dest = dest.to_str().unwrap();
    let commands: [Vec<&str>; 5] = [
        vec!["inspect", "-vv", &url],
        vec!["--json", "inspect", &url],
        vec!["verify", "-vv", &url],
        vec!["download", "-vv", &url, dest],
        vec!["ckpt", "ls", "-vv", &ckpt],
    ];
    for env in environments(kind, &endpoint) {
        for args in &commands {
            let run = run_env(args, &env);
            assert_ne!(
                run.code,
                0,
                "{}: {args:?} succeeded:\n{}",
                kind.name(),
                run.stdout
            );
            let text = format!("{}\n{}", run.stdout, run.stderr);
            assert!(
                !text.trim().is_empty(),
                "{}: {args:?} failed silently",
                kind.name()
            );
            for marker in MARKERS {
                assert!(
                    !text.contains(marker),
                    "{}: {args:?} printed {marker}:\n{text}",
                    kind.name()
                );
            }
        }
    }
}

mod every_server {
    use shardstream_storage::testing::ServerKind;
    #[tokio::test]
    async fn moto() {
        super::failing_commands_print_no_secret(ServerKind::Moto).await
    }
    #[tokio::test]
    async fn s3s_fs() {
        super::failing_commands_print_no_secret(ServerKind::S3sFs).await
    }
    #[tokio::test]
    async fn fake_gcs() {
        super::failing_commands_print_no_secret(ServerKind::FakeGcs).await
    }
    #[tokio::test]
    async fn azurite() {
        super::failing_commands_print_no_secret(ServerKind::Azurite).await
    }
}
