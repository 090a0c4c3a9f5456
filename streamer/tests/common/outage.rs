//! TCP forwarders in front of moto that misbehave on cue: one on a fixed loopback port that can
//! be switched off (listener closed, open connections cut) and on again on the same port (an S3
//! server that goes down and comes back, without losing moto's in-memory objects); one that
//! stalls mid-body; one that cuts a response at a chosen byte after running a hook.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

pub struct SwitchProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl SwitchProxy {
    pub async fn start(upstream: SocketAddr) -> SwitchProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(serve(listener, upstream));
        SwitchProxy {
            addr,
            upstream,
            task: Mutex::new(Some(task)),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes the port and cuts every open connection.
    pub fn stop(&self) {
        if let Some(task) = self.task.lock().unwrap().take() {
            task.abort();
        }
    }

    /// Listens on the same port again.
    pub async fn restart(&self) {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!("rebinding {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot rebind {}: {e}", self.addr),
            }
        };
        *self.task.lock().unwrap() = Some(tokio::spawn(serve(listener, self.upstream)));
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(listener: TcpListener, upstream: SocketAddr) {
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((mut client, _)) = accepted {
                    connections.spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A TCP forwarder that passes each connection's first `limit` response bytes and then holds
/// the rest back for good (the request side flows freely): a server that stalls mid-body.
pub struct StallProxy {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl StallProxy {
    pub async fn start(upstream: SocketAddr, limit: u64) -> StallProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = accept_each(listener, move |client| stall(client, upstream, limit));
        StallProxy { addr, task }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects `client` to `upstream` with the request side forwarded by a task of its own;
/// returns the response side (the server's read half, the client's write half) and that task.
async fn forward_requests(
    client: TcpStream,
    upstream: SocketAddr,
) -> Option<(OwnedReadHalf, OwnedWriteHalf, JoinHandle<()>)> {
    let server = TcpStream::connect(upstream).await.ok()?;
    let (mut client_rd, client_wr) = client.into_split();
    let (server_rd, mut server_wr) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
    });
    Some((server_rd, client_wr, up))
}

/// Serves each connection `listener` accepts with `serve`, until the returned task is aborted
/// (which aborts the connections too).
fn accept_each<F, Fut>(listener: TcpListener, serve: F) -> JoinHandle<()>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((client, _)) = accepted {
                        connections.spawn(serve(client));
                    }
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}

async fn stall(client: TcpStream, upstream: SocketAddr, limit: u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((mut server_rd, mut client_wr, up)) = forward_requests(client, upstream).await else {
        return;
    };
    let mut left = limit;
    let mut buf = vec![0u8; 64 << 10];
    while left > 0 {
        let want = buf.len().min(left as usize);
        let n = match server_rd.read(&mut buf[..want]).await {
            Ok(n) if n > 0 => n,
            // The server closed the connection (moto closes some after their response): pass
            // that on. Held open, it would look idle and alive to the client's pool, and the
            // next request sent on it would wait out the stall timeout (30 s) for no reply.
            _ => {
                let _ = client_wr.shutdown().await;
                up.abort();
                return;
            }
        };
        if client_wr.write_all(&buf[..n]).await.is_err() {
            up.abort();
            return;
        }
        left -= n as u64;
    }
    // Hold the connection open, sending nothing more, until the proxy is dropped.
    std::future::pending::<()>().await;
    drop(up);
}

/// What a [`CutProxy`] does once armed: pass `left` more response bytes, run `before`, cut.
struct Cut {
    left: usize,
    before: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// A TCP forwarder that, once armed, passes a given number of response bytes more (over all its
/// connections), then runs a hook (replacing the object on the server, say) and only then cuts
/// the connection that carried them: the client's resumed request meets what the hook left.
pub struct CutProxy {
    addr: SocketAddr,
    armed: Arc<Mutex<Option<Cut>>>,
    task: JoinHandle<()>,
}

impl CutProxy {
    pub async fn start(upstream: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(Mutex::new(None));
        let shared = Arc::clone(&armed);
        let task = accept_each(listener, move |client| {
            cut(client, upstream, Arc::clone(&shared))
        });
        CutProxy { addr, armed, task }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts after `after` more response bytes, once `before` has run.
    pub fn arm(
        &self,
        after: usize,
        before: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        *self.armed.lock().unwrap() = Some(Cut {
            left: after,
            before: Box::pin(before),
        });
    }

    /// Whether the armed cut has happened.
    pub fn has_cut(&self) -> bool {
        self.armed.lock().unwrap().is_none()
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn cut(client: TcpStream, upstream: SocketAddr, armed: Arc<Mutex<Option<Cut>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((mut server_rd, mut client_wr, up)) = forward_requests(client, upstream).await else {
        return;
    };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match server_rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let due = {
            let mut slot = armed.lock().unwrap();
            match slot.as_mut() {
                Some(c) if c.left <= n => slot.take().map(|c| (c.left, c.before)),
                Some(c) => {
                    c.left -= n;
                    None
                }
                None => None,
            }
        };
        if let Some((pass, before)) = due {
            let _ = client_wr.write_all(&buf[..pass]).await;
            let _ = client_wr.flush().await;
            before.await;
            break;
        }
        if client_wr.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Both halves dropped: the client sees its response end early.
    up.abort();
}
