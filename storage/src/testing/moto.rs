//! [`MotoServer`]: moto's S3 server as a child process on a free loopback port.
//!
//! The binary is `$SHARDSTREAM_MOTO_SERVER`, else `<workspace>/.venv/bin/moto_server`, else
//! `moto_server` on `PATH`. If none exists, [`MotoServer::start`] returns an error saying how
//! to install it: S3 tests fail rather than silently skip.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::env::Env;
use crate::error::{Result, StorageError};
use crate::location::Location;
use crate::options::{RetryPolicy, StorageOptions, Timeouts};

/// Environment variable naming the `moto_server` executable.
pub const MOTO_ENV: &str = "SHARDSTREAM_MOTO_SERVER";

/// How long moto may take to answer after being started.
const STARTUP_DEADLINE: Duration = Duration::from_secs(30);

/// A running moto S3 server; killed when dropped.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl MotoServer {
    /// Starts moto on a free port of 127.0.0.1 and waits until it answers HTTP.
    pub async fn start() -> Result<Self> {
        Self::start_binary(&find_binary()?).await
    }

    /// Starts the given `moto_server` executable (see [`MotoServer::start`]).
    pub async fn start_binary(binary: &Path) -> Result<Self> {
        if !binary.is_file() {
            return Err(harness(format!(
                "moto_server not found at {}: set {MOTO_ENV} or install moto[server]",
                binary.display()
            )));
        }
        let mut last_error = None;
        // A free port can be taken by someone else between our probe and moto's bind.
        for _ in 0..3 {
            match Self::start_once(binary).await {
                Ok(server) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| harness("moto did not start".into())))
    }

    async fn start_once(binary: &Path) -> Result<Self> {
        let port = free_port()?;
        let log = std::env::temp_dir().join(format!(
            "shardstream-moto-{}-{port}.log",
            std::process::id()
        ));
        let log_file = std::fs::File::create(&log).map_err(|e| StorageError::io(&log, e))?;
        let err_file = log_file
            .try_clone()
            .map_err(|e| StorageError::io(&log, e))?;
        let child = Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(err_file)
            .spawn()
            .map_err(|e| harness(format!("cannot run {}: {e}", binary.display())))?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
        };
        server.wait_ready().await?;
        tracing::debug!(addr = %server.addr, "moto server ready");
        Ok(server)
    }

    /// Polls until moto answers an HTTP request, the child exits, or the deadline passes.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(harness(format!(
                    "moto_server exited during startup ({status}); log:\n{}",
                    self.log_tail()
                )));
            }
            if let Ok(status) = raw_request(self.addr, "GET", "/").await {
                if status > 0 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(harness(format!(
                    "moto_server did not answer on {} within {STARTUP_DEADLINE:?}; log:\n{}",
                    self.addr,
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        text.get(start..).unwrap_or_default().to_string()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's address (e.g. to put a [`FaultProxy`](super::FaultProxy) in front).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Creates a bucket (moto accepts unsigned admin requests).
    pub async fn create_bucket(&self, name: &str) -> Result<()> {
        let status = raw_request(self.addr, "PUT", &format!("/{name}")).await?;
        if status == 200 {
            Ok(())
        } else {
            Err(harness(format!(
                "CreateBucket {name} answered HTTP {status}"
            )))
        }
    }

    /// Puts `body` at `key` in `bucket` with the key sent byte for byte, unnormalised and
    /// unsigned (moto accepts that): how a test plants a key `object_store` cannot write
    /// (`ds//x`, `ds/../x`) but another S3 client could.
    pub async fn put_raw_key(&self, bucket: &str, key: &str, body: &[u8]) -> Result<()> {
        let path = format!("/{bucket}/{key}");
        let status = raw_request_with_body(self.addr, "PUT", &path, body).await?;
        if status == 200 {
            Ok(())
        } else {
            Err(harness(format!("PUT {path} answered HTTP {status}")))
        }
    }

    /// Options pointing at this server, with short retries and timeouts suited to tests.
    pub fn storage_options(&self) -> StorageOptions {
        options_for(&self.endpoint())
    }

    /// Fake credentials (moto accepts any).
    pub fn env(&self) -> Env {
        test_env()
    }

    /// Opens `url` (an `s3://` URL) against this server.
    pub fn open(&self, url: &str) -> Result<Location> {
        Location::open_with(url, &self.storage_options(), &self.env())
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Options for a test S3 endpoint (moto, a [`FaultProxy`](super::FaultProxy), a dead port):
/// 5 retries from 10 ms backoff, 10 s retry deadline, 2 s connect and 30 s request timeouts.
pub fn options_for(endpoint: &str) -> StorageOptions {
    StorageOptions::default()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_retry(RetryPolicy {
            max_retries: 5,
            init_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
            base: 2.0,
            retry_timeout: Duration::from_secs(10),
        })
        .with_timeouts(Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(30),
            stall: Duration::from_secs(10),
        })
}

/// An environment with fake AWS credentials and nothing else.
pub fn test_env() -> Env {
    Env::from_pairs([
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ])
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| harness(format!("cannot find a free port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| harness(format!("cannot find a free port: {e}")))
}

fn find_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(MOTO_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(harness(format!(
                "{MOTO_ENV}={} is not a file",
                path.display()
            )))
        };
    }
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../.venv/bin/moto_server"
    ));
    if venv.is_file() {
        return Ok(venv);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("moto_server"))
            .find(|p| p.is_file())
    });
    on_path.ok_or_else(|| {
        harness(format!(
            "moto_server not found: set {MOTO_ENV} to its path, or install it with \
             `python -m venv .venv && .venv/bin/pip install 'moto[server]'` at the workspace root"
        ))
    })
}

/// Sends a bodiless HTTP/1.1 request and returns the status code.
async fn raw_request(addr: SocketAddr, method: &str, path: &str) -> Result<u16> {
    raw_request_with_body(addr, method, path, b"").await
}

pub(super) async fn raw_request_with_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<u16> {
    let io = |e: std::io::Error| harness(format!("{method} {path} to {addr}: {e}"));
    let mut stream = TcpStream::connect(addr).await.map_err(io)?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    stream.write_all(body).await.map_err(io)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.map_err(io)?;
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| harness(format!("{method} {path}: no HTTP status in reply")))
}

pub(super) fn harness(reason: String) -> StorageError {
    StorageError::Harness { reason }
}
