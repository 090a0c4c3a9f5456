//! [`GateStore`]: a server that stalls after the first part of a large object. GETs of the
//! object deliver its bytes up to an offset, then stop (mid-body, the connection open) until
//! the test opens the gate.

use std::fmt;
use std::sync::Arc;

use crate::decorate::Decorator;
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ObjectStore};
use tokio::sync::watch;

use super::counting::map_body;

/// What the gate has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateCounts {
    /// GET bodies stalled at the offset (so far, in all).
    pub held: usize,
    /// Stalled bodies let go on after the gate opened.
    pub released: usize,
}

#[derive(Debug)]
struct Gate {
    open: watch::Sender<bool>,
    counts: watch::Sender<GateCounts>,
}

/// Stalls the body of every GET of an object whose path contains `needle` at byte `from` of
/// the object, until [`GateStore::open`]: the bytes before `from` are delivered, the rest wait
/// (a GET whose range starts at or past `from` delivers nothing until then). Everything else
/// passes through at once.
#[derive(Debug, Clone)]
pub struct GateStore {
    inner: Arc<dyn ObjectStore>,
    needle: String,
    from: u64,
    gate: Arc<Gate>,
}

impl GateStore {
    /// A closed gate in front of `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, needle: impl Into<String>, from: u64) -> Self {
        Self {
            inner,
            needle: needle.into(),
            from,
            gate: Arc::new(Gate {
                open: watch::Sender::new(false),
                counts: watch::Sender::new(GateCounts::default()),
            }),
        }
    }

    /// Lets the held requests, and all later ones, through.
    pub fn open(&self) {
        self.gate.open.send_replace(true);
    }

    /// What the gate has seen so far.
    pub fn counts(&self) -> GateCounts {
        *self.gate.counts.borrow()
    }

    /// Waits until at least `n` GET bodies have been stalled.
    pub async fn wait_held(&self, n: usize) {
        let mut rx = self.gate.counts.subscribe();
        // The sender lives in `self`, so this ends only when the condition holds.
        let _ = rx.wait_for(|c| c.held >= n).await;
    }

    fn applies(&self, location: &Path, options: &GetOptions) -> bool {
        !options.head && location.as_ref().contains(&self.needle)
    }
}

/// One GET body going through the gate.
struct Body {
    inner: BoxStream<'static, object_store::Result<Bytes>>,
    /// Object offset of the next byte.
    pos: u64,
    /// Bytes past the gate's offset, held back from a frame that straddled it.
    rest: Option<Bytes>,
    from: u64,
    gate: Arc<Gate>,
}

/// Waits for the gate to open, counting the stall.
async fn stall(gate: &Gate) {
    let mut open = gate.open.subscribe();
    if *open.borrow() {
        return;
    }
    gate.counts.send_modify(|c| c.held += 1);
    let _ = open.wait_for(|o| *o).await;
    gate.counts.send_modify(|c| c.released += 1);
}

impl Body {
    async fn next(mut self) -> Option<(object_store::Result<Bytes>, Body)> {
        if let Some(rest) = self.rest.take() {
            stall(&self.gate).await;
            return Some((Ok(rest), self));
        }
        let frame = match self.inner.next().await? {
            Ok(frame) => frame,
            Err(e) => return Some((Err(e), self)),
        };
        let (start, end) = (self.pos, self.pos + frame.len() as u64);
        self.pos = end;
        let open = *self.gate.open.borrow();
        if open || end <= self.from {
            return Some((Ok(frame), self));
        }
        if start >= self.from {
            stall(&self.gate).await;
            return Some((Ok(frame), self));
        }
        let mut before = frame;
        self.rest = Some(before.split_off((self.from - start) as usize));
        Some((Ok(before), self))
    }
}

impl fmt::Display for GateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GateStore({})", self.inner)
    }
}

#[async_trait]
impl Decorator for GateStore {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let applies = self.applies(location, &options);
        let result = self.inner.get_opts(location, options).await?;
        if !applies {
            return Ok(result);
        }
        let (pos, from, gate) = (result.range.start, self.from, Arc::clone(&self.gate));
        Ok(map_body(result, move |inner| {
            let body = Body {
                inner,
                pos,
                rest: None,
                from,
                gate,
            };
            futures::stream::unfold(body, Body::next).boxed()
        }))
    }
}

crate::object_store_decorator!(GateStore);
