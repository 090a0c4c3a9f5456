//! The AWS credential chain against moto: a profile from a shared credentials file, web
//! identity through moto's STS, container credentials from a loopback server, and the error
//! when nothing is found.
//!
//! The chain reads part of its settings from the process environment (see
//! `shardstream_storage::aws_chain`), so each case runs in a child process of this test binary
//! with a cleared environment holding only what the case sets: nothing of the developer's
//! `~/.aws` or of the CI's environment leaks in, and the parallel tests of this binary keep
//! their environment. Every metadata endpoint the SDK or `object_store` reads points at a
//! closed loopback port; every request goes through a recording proxy in front of moto, which
//! shows which access key id signed the S3 requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use shardstream_storage::testing::{free_port, MotoServer};
use shardstream_storage::{Env, Location, StorageOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Set in a child process: the case to run.
const CHILD: &str = "SHARDSTREAM_CREDENTIALS_CASE";

/// A TCP proxy to `upstream` that keeps every byte sent by clients, for assertions on the
/// requests (`Authorization: ... Credential=<key id>/...`) and on the replies.
struct Recorder {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<u8>>>,
    replies: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(Vec::new()));
        let (req, rep) = (Arc::clone(&requests), Arc::clone(&replies));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (req, rep) = (Arc::clone(&req), Arc::clone(&rep));
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(tee(cr, sw, req), tee(sr, cw, rep));
                });
            }
        });
        Self {
            addr,
            requests,
            replies,
            task,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> String {
        String::from_utf8_lossy(&self.requests.lock().unwrap()).into_owned()
    }

    fn replies(&self) -> String {
        String::from_utf8_lossy(&self.replies.lock().unwrap()).into_owned()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tee(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    log: Arc<Mutex<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                log.lock().unwrap().extend_from_slice(&buf[..n]);
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// The access key ids that signed requests (`Credential=<id>/<date>/...`).
fn signing_key_ids(requests: &str) -> Vec<String> {
    requests
        .split("Credential=")
        .skip(1)
        .filter_map(|rest| rest.split('/').next())
        .map(String::from)
        .collect()
}

/// The environment every child starts from: a temporary HOME, every metadata endpoint on a
/// closed loopback port, S3 through the recorder.
fn base_env(home: &std::path::Path, s3: &Recorder) -> Vec<(String, String)> {
    let closed = format!("http://127.0.0.1:{}", free_port().unwrap());
    [
        ("HOME", home.to_str().unwrap().to_string()),
        ("AWS_ENDPOINT_URL", s3.endpoint()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed.clone()),
        ("AWS_METADATA_ENDPOINT", closed),
        (
            "AWS_CONFIG_FILE",
            home.join("config").to_str().unwrap().into(),
        ),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            home.join("credentials").to_str().unwrap().into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Runs `case` (one of the `#[ignore]`d `child_*` tests below) in a child process with
/// exactly `env`; returns its combined output, failing the test if the child failed.
fn run_child(case: &str, env: &[(String, String)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            &format!("credentials::{case}"),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(CHILD, case)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {case} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {case} did not run:\n{text}"
    );
    text
}

fn in_child(case: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|c| c == case)
}

/// Puts and reads one object with the process environment: what the children do.
async fn round_trip() -> Result<(), shardstream_storage::StorageError> {
    let location = Location::open_with(
        "s3://creds/ds",
        &StorageOptions::default(),
        &Env::from_process(),
    )?;
    location
        .put("hello.txt", Bytes::from_static(b"hello"))
        .await?;
    let back = location.get("hello.txt").await?;
    assert_eq!(&back[..], b"hello");
    Ok(())
}

async fn moto_with_bucket() -> (MotoServer, Recorder) {
    let moto = MotoServer::start()
        .await
        .unwrap_or_else(|e| panic!("credential tests need moto_server: {e}"));
    moto.create_bucket("creds").await.unwrap();
    let recorder = Recorder::start(moto.addr()).await;
    (moto, recorder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_in_shared_credentials_file_signs_the_requests() {
    let (_moto, s3) = moto_with_bucket().await;
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("credentials"),
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n\n\
         [training]\naws_access_key_id = AKIDTRAINING\naws_secret_access_key = s2\n",
    )
    .unwrap();
    std::fs::write(
        home.path().join("config"),
        "[profile training]\nregion = eu-west-1\n",
    )
    .unwrap();
    let mut env = base_env(home.path(), &s3);
    env.retain(|(k, _)| k != "AWS_REGION");
    env.push(("AWS_PROFILE".into(), "training".into()));
    env.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    run_child("child_round_trip", &env);
    let requests = s3.requests();
    let ids = signing_key_ids(&requests);
    assert!(!ids.is_empty(), "no signed request:\n{requests}");
    assert!(ids.iter().all(|id| id == "AKIDTRAINING"), "{ids:?}");
    assert!(
        requests.contains("/eu-west-1/s3/aws4_request"),
        "the profile's region was not used"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_token_is_exchanged_at_sts() {
    let (_moto, s3) = moto_with_bucket().await;
    let home = tempfile::tempdir().unwrap();
    let token = home.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.e30.c2ln").unwrap();
    let mut env = base_env(home.path(), &s3);
    env.extend([
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE".into(),
            token.to_str().unwrap().into(),
        ),
        (
            "AWS_ROLE_ARN".into(),
            "arn:aws:iam::123456789012:role/trainer".into(),
        ),
        ("AWS_ENDPOINT_URL_STS".into(), s3.endpoint()),
    ]);
    run_child("child_round_trip", &env);
    let requests = s3.requests();
    assert!(
        requests.contains("Action=AssumeRoleWithWebIdentity"),
        "STS was not called:\n{requests}"
    );
    let replies = s3.replies();
    let issued = replies
        .split("<AccessKeyId>")
        .nth(1)
        .and_then(|r| r.split("</AccessKeyId>").next())
        .unwrap_or_else(|| panic!("no key in STS reply:\n{replies}"));
    let ids = signing_key_ids(&requests);
    assert!(!ids.is_empty(), "no signed request:\n{requests}");
    assert!(ids.iter().all(|id| id == issued), "{ids:?} vs {issued}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_credentials_from_a_loopback_endpoint() {
    let (_moto, s3) = moto_with_bucket().await;
    let served = Arc::new(Mutex::new(0usize));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let creds_addr = listener.local_addr().unwrap();
    let count = Arc::clone(&served);
    let server = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
            let body = if head.contains("authorization: pod-token") {
                *count.lock().unwrap() += 1;
                r#"{"AccessKeyId":"AKIDCONTAINER","SecretAccessKey":"s3cr3t","Token":"tok","Expiration":"2099-01-01T00:00:00Z"}"#
            } else {
                r#"{"code":"Unauthorized"}"#
            };
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes()).await;
        }
    });
    let home = tempfile::tempdir().unwrap();
    let mut env = base_env(home.path(), &s3);
    env.extend([
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI".into(),
            format!("http://{creds_addr}/v1/credentials"),
        ),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN".into(),
            "pod-token".into(),
        ),
    ]);
    run_child("child_round_trip", &env);
    server.abort();
    assert!(
        *served.lock().unwrap() >= 1,
        "the credentials endpoint was not asked"
    );
    let ids = signing_key_ids(&s3.requests());
    assert!(
        !ids.is_empty() && ids.iter().all(|id| id == "AKIDCONTAINER"),
        "{ids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credentials_error_names_what_was_looked_at_before_any_request() {
    let (_moto, s3) = moto_with_bucket().await;
    let home = tempfile::tempdir().unwrap();
    let env = base_env(home.path(), &s3);
    let output = run_child("child_no_credentials", &env);
    let message = output
        .split("ERROR: ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no error line:\n{output}"));
    for needle in [
        "no AWS credentials found",
        "AWS_ACCESS_KEY_ID",
        "profile \"default\"",
        &home.path().join("credentials").display().to_string(),
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "instance metadata at http://127.0.0.1:",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from: {message}"
        );
    }
    assert!(!message.contains("cannot reach"), "{message}");
    assert_eq!(s3.requests(), "", "a request reached the bucket");

    // With the metadata service switched off, the error says so.
    let mut env = base_env(home.path(), &s3);
    env.push(("AWS_EC2_METADATA_DISABLED".into(), "true".into()));
    let output = run_child("child_no_credentials", &env);
    assert!(
        output.contains("instance metadata (disabled by AWS_EC2_METADATA_DISABLED)"),
        "{output}"
    );
    assert_eq!(s3.requests(), "", "a request reached the bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_access_sends_unsigned_requests() {
    let (moto, s3) = moto_with_bucket().await;
    let options = StorageOptions::default()
        .with_endpoint(s3.endpoint())
        .with_anonymous(true);
    let location = Location::open_with("s3://creds/public", &options, &Env::default()).unwrap();
    // moto takes an anonymous PUT into a bucket, and refuses an anonymous GET of the
    // (private) object it made: both show the requests arrived unsigned.
    location
        .put("x.bin", Bytes::from_static(b"x"))
        .await
        .unwrap();
    let err = location.get("x.bin").await.unwrap_err();
    assert!(
        matches!(
            err,
            shardstream_storage::StorageError::PermissionDenied { .. }
        ),
        "{err}"
    );
    let requests = s3.requests();
    assert!(requests.contains("PUT /creds/public/x.bin"), "{requests}");
    assert!(!requests.contains("Authorization"), "{requests}");
    drop(moto);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_call_keys_replace_the_environment_credentials() {
    let (_moto, s3) = moto_with_bucket().await;
    let env = Env::from_pairs([
        ("AWS_ACCESS_KEY_ID", "AKIDFROMENV"),
        ("AWS_SECRET_ACCESS_KEY", "env-secret"),
        ("AWS_SESSION_TOKEN", "env-token"),
    ]);
    let options = shardstream_storage::named_options::apply(
        "s3://creds/opt",
        &[
            ("endpoint_url", s3.endpoint()),
            ("key", "AKIDFROMOPTIONS".into()),
            ("secret", "opt-secret".into()),
        ],
        StorageOptions::default(),
    )
    .unwrap();
    let location = Location::open_with("s3://creds/opt", &options, &env).unwrap();
    location.put("y", Bytes::from_static(b"y")).await.unwrap();
    let requests = s3.requests();
    let ids = signing_key_ids(&requests);
    assert!(
        !ids.is_empty() && ids.iter().all(|id| id == "AKIDFROMOPTIONS"),
        "{ids:?}"
    );
    assert!(
        !requests.contains("env-token"),
        "the environment's session token was mixed in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the tests above in a child process"]
async fn child_round_trip() {
    if !in_child("child_round_trip") {
        return;
    }
    round_trip().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the tests above in a child process"]
async fn child_no_credentials() {
    if !in_child("child_no_credentials") {
        return;
    }
    let err = round_trip().await.unwrap_err();
    println!("ERROR: {err}");
    assert!(
        matches!(err, shardstream_storage::StorageError::Config { .. }),
        "{err:?}"
    );
}
