//! [`FaultProxy`]: a TCP proxy on loopback that injects faults below the HTTP client.
//!
//! Decorators cannot exercise `object_store`'s own retry loop, which runs inside its HTTP
//! client. This proxy can: it answers `503 Slow Down` (S3's throttling reply), or another error
//! status, to the next N connections, or accepts connections and never answers (a hung server),
//! and otherwise forwards bytes to the real server. It can also strip `If-None-Match` from
//! every request, to play an S3-compatible store that ignores conditional writes.
//!
//! With a request-rate limit set ([`FaultProxy::set_rate_limit`]) it plays S3's per-prefix
//! throttling instead: it reads each request, answers `503 Slow Down` when the request's prefix
//! (its path up to the last `/`) has had `limit` requests forwarded in the current one-second
//! window, and otherwise forwards it on a fresh upstream connection, one request per client
//! connection (`Connection: close`). It counts forwarded and throttled requests per prefix and
//! window ([`FaultProxy::windows`]).
//!
//! Other faults are decided per *connection*: a faulty reply closes its connection, so every
//! retry arrives on a new one; a connection already forwarding keeps forwarding. Arm the
//! faults before the client under test connects.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Result, StorageError};

/// The status line and S3 error code of a fault reply with `status`.
fn fault_reply(status: u16) -> (&'static str, &'static str) {
    match status {
        400 => ("Bad Request", "InvalidRequest"),
        403 => ("Forbidden", "AccessDenied"),
        416 => ("Requested Range Not Satisfiable", "InvalidRange"),
        429 => ("Too Many Requests", "TooManyRequests"),
        500 => ("Internal Server Error", "InternalError"),
        _ => ("Slow Down", "SlowDown"),
    }
}

/// Largest request head the proxy reads before answering a fault.
const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug)]
struct State {
    upstream: SocketAddr,
    fail_next: AtomicUsize,
    fail_status: AtomicU16,
    failed: AtomicUsize,
    blackhole: AtomicBool,
    bytes_per_sec: AtomicU64,
    strip_if_none_match: AtomicBool,
    stripped: AtomicUsize,
    rate_limit: AtomicU64,
    started: Instant,
    windows: Mutex<BTreeMap<(String, u64), WindowCount>>,
}

/// Requests of one prefix in one second of a rate-limited proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// The prefix: the request path up to its last `/` (`/bucket/ds/`).
    pub prefix: String,
    /// Whole seconds since the proxy started.
    pub second: u64,
    /// Requests forwarded to the server.
    pub forwarded: u64,
    /// Requests answered `503 Slow Down`.
    pub throttled: u64,
}

impl State {
    fn take_failure(&self) -> bool {
        self.fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A fault-injecting TCP proxy; stops (with all its connections) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| harness(format!("cannot bind proxy port: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| harness(format!("proxy has no address: {e}")))?;
        let state = Arc::new(State {
            upstream,
            fail_next: AtomicUsize::new(0),
            fail_status: AtomicU16::new(503),
            failed: AtomicUsize::new(0),
            blackhole: AtomicBool::new(false),
            bytes_per_sec: AtomicU64::new(0),
            strip_if_none_match: AtomicBool::new(false),
            stripped: AtomicUsize::new(0),
            rate_limit: AtomicU64::new(0),
            started: Instant::now(),
            windows: Mutex::new(BTreeMap::new()),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(Self { addr, state, task })
    }

    /// `http://127.0.0.1:<port>`, to use as the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers `503 Slow Down` to the next `n` connections.
    pub fn fail_next(&self, n: usize) {
        self.fail_next_with(n, 503);
    }

    /// Answers `status` (400, 403, 416, 429, 500 or 503, with S3's error code for it) to the
    /// next `n` connections.
    pub fn fail_next_with(&self, n: usize, status: u16) {
        self.state.fail_status.store(status, Ordering::SeqCst);
        self.state.fail_next.store(n, Ordering::SeqCst);
    }

    /// While on, new connections are accepted and never answered.
    pub fn set_blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::SeqCst);
    }

    /// Paces server-to-client bytes of new connections to `bytes_per_sec` (0: no limit): a
    /// slow but live link, to check that timeouts do not kill progressing transfers.
    pub fn set_bandwidth(&self, bytes_per_sec: u64) {
        self.state
            .bytes_per_sec
            .store(bytes_per_sec, Ordering::SeqCst);
    }

    /// While on, new connections forward requests without their `If-None-Match` header: the
    /// server sees plain puts, as behind a store or gateway that drops conditional headers.
    pub fn set_strip_if_none_match(&self, on: bool) {
        self.state.strip_if_none_match.store(on, Ordering::SeqCst);
    }

    /// How many `If-None-Match` headers were stripped so far.
    pub fn stripped(&self) -> usize {
        self.state.stripped.load(Ordering::SeqCst)
    }

    /// Limits every prefix to `per_second` forwarded requests per one-second window (0: no
    /// limit); requests beyond it are answered `503 Slow Down`. Applies to new connections.
    pub fn set_rate_limit(&self, per_second: u64) {
        self.state.rate_limit.store(per_second, Ordering::SeqCst);
    }

    /// What a rate-limited proxy saw so far, by prefix then second.
    pub fn windows(&self) -> Vec<WindowCount> {
        self.state
            .windows
            .lock()
            .map(|w| w.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whole seconds since the proxy started: the current window of [`FaultProxy::windows`].
    pub fn second(&self) -> u64 {
        self.state.started.elapsed().as_secs()
    }

    /// How many requests got a fault reply so far.
    pub fn failed(&self) -> usize {
        self.state.failed.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

fn harness(reason: String) -> StorageError {
    StorageError::Harness { reason }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(handle(stream, Arc::clone(&state)));
                }
                Err(e) => tracing::warn!(error = %e, "fault proxy accept failed"),
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn handle(mut client: TcpStream, state: Arc<State>) {
    if state.blackhole.load(Ordering::SeqCst) {
        // Swallow whatever arrives and never answer, until the client gives up.
        let mut sink = [0u8; 4096];
        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
        return;
    }
    if state.rate_limit.load(Ordering::SeqCst) > 0 {
        let _ = serve_limited(client, &state).await;
        return;
    }
    if state.take_failure() {
        if read_request(&mut client).await.is_ok() {
            state.failed.fetch_add(1, Ordering::SeqCst);
            let status = state.fail_status.load(Ordering::SeqCst);
            let (reason, code) = fault_reply(status);
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
                 <Message>Injected by the test proxy.</Message></Error>"
            );
            let reply = format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(reply.as_bytes()).await;
            let _ = client.shutdown().await;
        }
        return;
    }
    let mut upstream = match TcpStream::connect(state.upstream).await {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::warn!(error = %e, "fault proxy cannot reach upstream");
            return;
        }
    };
    if state.strip_if_none_match.load(Ordering::SeqCst) {
        let (client_read, mut client_write) = client.into_split();
        let (mut upstream_read, mut upstream_write) = upstream.into_split();
        let requests = async {
            let _ = forward_stripped(client_read, &mut upstream_write, &state).await;
            let _ = upstream_write.shutdown().await;
        };
        let responses = async {
            let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::join!(requests, responses);
        return;
    }
    let rate = state.bytes_per_sec.load(Ordering::SeqCst);
    if rate == 0 {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return;
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
        let _ = upstream_write.shutdown().await;
    };
    let responses = async {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = upstream_read.read(&mut buf).await {
            let Some(data) = buf.get(..n).filter(|d| !d.is_empty()) else {
                break;
            };
            if client_write.write_all(data).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(requests, responses);
}

/// The rate-limited mode: one request of `client`, throttled or forwarded.
async fn serve_limited(mut client: TcpStream, state: &State) -> std::io::Result<()> {
    let head = read_head(&mut client).await?;
    let body_len = content_length(&head);
    if body_len > 256 * 1024 * 1024 {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    let mut body = vec![0u8; body_len];
    client.read_exact(&mut body).await?;
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or(target);
    let prefix = path
        .get(..path.rfind('/').map_or(0, |i| i + 1))
        .unwrap_or("/");
    let second = state.started.elapsed().as_secs();
    let limit = state.rate_limit.load(Ordering::SeqCst);
    let forward = {
        let mut windows = state
            .windows
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let count = windows
            .entry((prefix.to_string(), second))
            .or_insert_with(|| WindowCount {
                prefix: prefix.to_string(),
                second,
                ..WindowCount::default()
            });
        if count.forwarded < limit {
            count.forwarded += 1;
            true
        } else {
            count.throttled += 1;
            false
        }
    };
    if !forward {
        state.failed.fetch_add(1, Ordering::SeqCst);
        let (reason, code) = fault_reply(503);
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
             <Message>Please reduce your request rate.</Message></Error>"
        );
        let reply = format!(
            "HTTP/1.1 503 {reason}\r\nContent-Type: application/xml\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        client.write_all(reply.as_bytes()).await?;
        return client.shutdown().await;
    }
    let mut upstream = TcpStream::connect(state.upstream).await?;
    upstream
        .write_all(with_connection_close(&head).as_bytes())
        .await?;
    upstream.write_all(&body).await?;
    let reply_head = read_head(&mut upstream).await?;
    client
        .write_all(with_connection_close(&reply_head).as_bytes())
        .await?;
    tokio::io::copy(&mut upstream, &mut client).await?;
    client.shutdown().await
}

/// Reads a request or response head, up to and including its blank line.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD || stream.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&byte);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// `head` with its `Connection`/`Keep-Alive` lines replaced by `Connection: close`.
fn with_connection_close(head: &str) -> String {
    let mut out = String::with_capacity(head.len() + 20);
    for line in head.split_inclusive("\r\n") {
        if line == "\r\n" {
            break;
        }
        let name = line
            .split_once(':')
            .map(|(n, _)| n.trim().to_ascii_lowercase());
        if matches!(name.as_deref(), Some("connection" | "keep-alive")) {
            continue;
        }
        out.push_str(line);
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// Forwards requests one by one, each head without its `If-None-Match` line and each body by
/// its `Content-Length` (object_store sends no chunked request bodies).
async fn forward_stripped(
    client: tokio::net::tcp::OwnedReadHalf,
    upstream: &mut tokio::net::tcp::OwnedWriteHalf,
    state: &State,
) -> std::io::Result<()> {
    let mut client = tokio::io::BufReader::new(client);
    loop {
        let mut head = String::new();
        loop {
            let mut line = Vec::new();
            if client.read_until(b'\n', &mut line).await? == 0 {
                return Ok(());
            }
            if head.len() > MAX_HEAD {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            let end = line == "\r\n";
            let is_condition = line
                .split_once(':')
                .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("if-none-match"));
            if is_condition {
                state.stripped.fetch_add(1, Ordering::SeqCst);
            } else {
                head.push_str(&line);
            }
            if end {
                break;
            }
        }
        upstream.write_all(head.as_bytes()).await?;
        let body = content_length(&head) as u64;
        let copied = tokio::io::copy(&mut (&mut client).take(body), upstream).await?;
        if copied < body {
            return Ok(());
        }
    }
}

/// Reads one request (head, then a `Content-Length` body) so the client sees a clean reply.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD || stream.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&byte);
    }
    let mut remaining = content_length(&String::from_utf8_lossy(&head));
    let mut buf = [0u8; 8192];
    while remaining > 0 {
        let want = remaining.min(buf.len());
        let n = stream.read(buf.get_mut(..want).unwrap_or_default()).await?;
        if n == 0 {
            break;
        }
        remaining -= n;
    }
    Ok(())
}

fn content_length(head: &str) -> usize {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_is_case_insensitive() {
        let head = "PUT /b/k HTTP/1.1\r\ncontent-length: 42\r\nHost: x\r\n\r\n";
        assert_eq!(content_length(head), 42);
        assert_eq!(content_length("GET / HTTP/1.1\r\n\r\n"), 0);
    }

    #[tokio::test]
    async fn answers_slow_down_then_forwards() {
        let upstream = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let upstream_addr = upstream.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let _ = read_request(&mut s).await;
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await
                .unwrap();
        });
        let proxy = FaultProxy::start(upstream_addr).await.unwrap();
        proxy.fail_next(1);
        let first = roundtrip(proxy.addr()).await;
        assert!(first.starts_with("HTTP/1.1 503"), "{first}");
        assert!(first.contains("<Code>SlowDown</Code>"));
        let second = roundtrip(proxy.addr()).await;
        assert!(second.starts_with("HTTP/1.1 200"), "{second}");
        assert_eq!(proxy.failed(), 1);
    }

    async fn roundtrip(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut out = vec![0u8; 1024];
        let mut total = 0;
        loop {
            let n = s.read(&mut out[total..]).await.unwrap();
            total += n;
            if n == 0 || String::from_utf8_lossy(&out[..total]).ends_with("ok") {
                break;
            }
            if String::from_utf8_lossy(&out[..total]).contains("</Error>") {
                break;
            }
        }
        String::from_utf8_lossy(&out[..total]).into_owned()
    }
}
