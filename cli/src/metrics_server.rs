//! A small, bounded Prometheus endpoint: `GET` any path returns the text exposition that
//! `render` makes at that moment. Used by `stream --metrics-addr` (its dataset's counters) and by
//! `shardstream run` (the node's sum, `SHARDSTREAM_METRICS_ADDR`).
//!
//! Bounded so that a scraper gone wrong cannot hurt training: at most [`MAX_CONNECTIONS`]
//! requests at once (more are closed at once), a request head of at most 8 KiB read within
//! [`READ_TIMEOUT`], and an `accept` that fails (out of file descriptors) backs off instead of
//! spinning.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::runtime;

/// Requests served at once.
const MAX_CONNECTIONS: usize = 16;
/// How long a client has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head read.
const MAX_HEAD: usize = 8192;
/// The pause after a failed `accept`.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A running endpoint; dropping it stops the server.
pub struct MetricsServer {
    /// The address it listens on (with the port the kernel chose for `:0`).
    pub addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
}

/// Listens on `addr` and serves `render()` to every request until the server is dropped.
pub fn serve(
    addr: &str,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> anyhow::Result<MetricsServer> {
    let rt = runtime::build(1)?;
    let listener = rt
        .block_on(TcpListener::bind(addr))
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let bound = listener
        .local_addr()
        .context("metrics listener has no address")?;
    tracing::info!(addr = %bound, "serving metrics");
    let render = Arc::new(render);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    rt.spawn(async move {
        loop {
            let conn = match listener.accept().await {
                Ok((conn, _)) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint cannot accept; backing off");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                drop(conn);
                continue;
            };
            let render = Arc::clone(&render);
            tokio::spawn(async move {
                let _slot = slot;
                let _ = answer(conn, &*render).await;
            });
        }
    });
    Ok(MetricsServer {
        addr: bound,
        _rt: rt,
    })
}

async fn answer(
    mut conn: TcpStream,
    render: &(dyn Fn() -> String + Send + Sync),
) -> std::io::Result<()> {
    // Read the request head (bounded, timed); the reply does not depend on it.
    let mut buf = vec![0u8; MAX_HEAD];
    let mut seen = 0;
    let read_head = async {
        while seen < buf.len() {
            match conn.read(&mut buf[seen..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    seen += n;
                    if buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    };
    if tokio::time::timeout(READ_TIMEOUT, read_head).await.is_err() {
        return Ok(());
    }
    let body = render();
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes()).await?;
    conn.shutdown().await
}
