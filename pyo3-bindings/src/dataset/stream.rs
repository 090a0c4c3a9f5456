//! `NativeStream`: one rank's part of an epoch (the native half of the iterator
//! `shardstream.StreamingDataset.__iter__` returns, and of `iter_batches`).
//!
//! A stream is read by one background thread per stream (made in the process that iterates, so
//! DataLoader workers under `fork` and `spawn` each have their own). That thread pulls samples
//! from the streamer's prefetching [`SampleStream`] and parses their columns with no GIL; the
//! Python side takes them in batches, waiting with the GIL released and checking for signals
//! every [`blocking::POLL`], so Ctrl-C interrupts a blocked iteration.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded as sync_channel, Receiver, RecvTimeoutError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shardstream_sharding::FormatError;
use shardstream_streamer::buffers::BufferPool;
use shardstream_streamer::{DeferredSample, RawSample, StreamItem, StreamPlan, StreamingDataset};

use super::gather::{fixed_numeric, value_of, ColumnGather, Gathered};
use crate::arena;
use crate::blocking;
use crate::decode::{parse_sample, Decoder, ParsedSample};
use crate::errors::{from_format, from_streamer};
use shardstream_streamer::SampleSchema;

/// Most samples the reader thread hands over at once.
const MAX_CHUNK: usize = 64;
/// Chunks waiting in the channel.
const CHANNEL_CHUNKS: usize = 2;
/// Most stored bytes one `next_samples` call turns into Python objects (at least one sample).
/// Python frees a sample's `bytes` soon after the next is made, and malloc hands that memory
/// to the next sample of its size; a call that makes many large ones at once makes malloc grow
/// the heap by all of them, fault every page in, and trim it again once they are freed (1 MB
/// samples with `batch_size=64`: 190 against 100 µs a sample).
const DECODE_BYTES: usize = 1 << 20;
/// Smallest sample the Python thread reads itself when it has run out of samples (see
/// `SampleStream::defer_on_demand`). A 1 MB sample read warm from the page cache took the
/// reader thread 100-140 µs, against the Python thread's 50 µs to copy it into `bytes`: with
/// one thread reading, the Python thread waited for half of every epoch. Below half a run of
/// reads, handing a sample over costs more than its read, and the stream reads such samples
/// several at a time.
const DEFER_MIN_BYTES: u64 = 512 << 10;

/// Parses a sample's columns; errors name its shard file (URL or path).
pub(super) fn parse_raw(
    raw: RawSample,
    ds: &StreamingDataset,
) -> Result<ParsedSample, FormatError> {
    let shard = raw.shard();
    let name = || {
        ds.shard_name(shard)
            .map_or_else(|| format!("shard {shard}"), str::to_string)
    };
    parse_sample(raw, name)
}

enum Item {
    /// A decoded sample and its global index.
    Parsed(u64, ParsedSample),
    Raw(RawSample),
    /// A sample for the Python thread to read (see [`NativeStream::wanted`]).
    Deferred(DeferredSample),
}

impl Item {
    /// The sample's bytes as stored in its shard.
    fn stored_bytes(&self) -> usize {
        match self {
            Item::Parsed(_, p) => p.stored_bytes(),
            Item::Raw(raw) => raw.bytes().len(),
            Item::Deferred(d) => d.len() as usize,
        }
    }
}

type Chunk = Result<Vec<Item>, PyErr>;

/// One rank's stream of an epoch (native half of the iterator `StreamingDataset.__iter__`
/// returns).
#[pyclass(module = "shardstream._native", frozen)]
pub struct NativeStream {
    rx: Mutex<Option<Receiver<Chunk>>>,
    pending: Mutex<VecDeque<Item>>,
    /// Set while the Python thread waits for samples: the reader thread then leaves the next
    /// large sample unread for the Python thread to read (`SampleStream::defer_on_demand`).
    wanted: Arc<AtomicBool>,
    decoder: Arc<Decoder>,
    ds: Arc<StreamingDataset>,
    batch_buffers: Arc<BufferPool>,
    /// The process that made the stream and its reader thread. A forked child holds a copy of
    /// the stream whose channel (and its waker's mutex) a parent thread may have held locked at
    /// the fork; no thread of the child can ever unlock it, so the child never touches it.
    owner_pid: u32,
}

impl NativeStream {
    /// Whether this is a forked child's copy of a stream made in its parent.
    fn forked_copy(&self) -> bool {
        std::process::id() != self.owner_pid
    }

    /// Starts the reader thread of one rank's part of an epoch (`NativeDataset.stream`).
    /// `raw` leaves the samples unparsed, for `next_columns`.
    pub(super) fn start(
        ds: Arc<StreamingDataset>,
        decoder: Arc<Decoder>,
        batch_buffers: Arc<BufferPool>,
        chunk_bytes: usize,
        plan: StreamPlan,
        raw: bool,
    ) -> PyResult<Self> {
        let (tx, rx) = sync_channel::<Chunk>(CHANNEL_CHUNKS);
        let wanted = Arc::new(AtomicBool::new(false));
        let reader_wanted = Arc::clone(&wanted);
        let reader_ds = Arc::clone(&ds);
        std::thread::Builder::new()
            .name("shardstream-reader".into())
            .spawn(move || {
                // Made here, not on the Python thread: opening may wait on storage, and the
                // Python side waits interruptibly on the channel.
                let mut stream = match reader_ds.stream(plan) {
                    Ok(stream) => stream,
                    Err(e) => {
                        let _ = tx.send(Err(from_streamer(e)));
                        return;
                    }
                };
                stream.defer_on_demand(reader_wanted, DEFER_MIN_BYTES);
                let mut chunk: Vec<Item> = Vec::new();
                let mut bytes = 0usize;
                let mut target = 1usize;
                while let Some(next) = stream.next_item() {
                    // A sample left unread goes out at once: the Python thread asked for it
                    // because it had nothing else to do.
                    let mut send_now = false;
                    let item = match next {
                        Ok(StreamItem::Deferred(d)) => {
                            send_now = true;
                            Ok(Item::Deferred(d))
                        }
                        Ok(StreamItem::Read(s)) => {
                            bytes += s.sample.bytes().len();
                            if raw {
                                Ok(Item::Raw(s.sample))
                            } else {
                                let index = s.sample.index();
                                parse_raw(s.sample, &reader_ds)
                                    .map(|parsed| Item::Parsed(index, parsed))
                                    .map_err(|e| from_streamer(e.into()))
                            }
                        }
                        Err(e) => Err(from_streamer(e)),
                    };
                    let failed = item.is_err();
                    match item {
                        Ok(item) => chunk.push(item),
                        Err(e) => {
                            if !chunk.is_empty() && tx.send(Ok(std::mem::take(&mut chunk))).is_err()
                            {
                                return;
                            }
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                    if send_now || failed || chunk.len() >= target || bytes >= chunk_bytes {
                        if tx.send(Ok(std::mem::take(&mut chunk))).is_err() {
                            return;
                        }
                        bytes = 0;
                        target = (target * 2).min(MAX_CHUNK);
                    }
                }
                if !chunk.is_empty() {
                    let _ = tx.send(Ok(chunk));
                }
            })
            .map_err(|e| {
                pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "cannot start the reader thread: {e}"
                ))
            })?;
        Ok(NativeStream {
            rx: Mutex::new(Some(rx)),
            pending: Mutex::new(VecDeque::new()),
            wanted,
            decoder,
            ds,
            batch_buffers,
            owner_pid: std::process::id(),
        })
    }

    /// Reads a sample the reader thread left for this thread (see [`NativeStream::wanted`]) and
    /// passes it through `then` (the decoding the reader thread would have done), with the GIL
    /// released. An error ends the stream, as the reader thread's errors do.
    fn read_deferred<T: Send>(
        &self,
        py: Python<'_>,
        d: DeferredSample,
        then: impl FnOnce(RawSample) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| d.read().map_err(from_streamer).and_then(then))
            .inspect_err(|_| self.close())
    }

    /// Takes up to `n` items, and past the first no more once they hold `max_bytes` of stored
    /// bytes, waiting ([`blocking::wait`]) until at least `wait_for` (at most `n`) are there,
    /// the byte bound is reached, or the stream ends. What has arrived already is taken with
    /// the GIL held.
    fn take(
        &self,
        py: Python<'_>,
        n: usize,
        wait_for: usize,
        max_bytes: usize,
    ) -> PyResult<Vec<Item>> {
        let want = Want {
            n,
            wait_for: wait_for.min(n),
            max_bytes,
        };
        let mut taken = Taken {
            items: Vec::with_capacity(n.min(4096)),
            bytes: 0,
        };
        if !self.take_pending(&want, &mut taken) {
            blocking::wait(py, |slice| self.receive(&want, &mut taken, slice))??;
        }
        Ok(taken.items)
    }

    /// Moves arrived items to `taken` as `want` allows; whether `taken` is enough.
    fn take_pending(&self, want: &Want, taken: &mut Taken) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while taken.items.len() < want.n && (taken.items.is_empty() || taken.bytes < want.max_bytes)
        {
            match pending.pop_front() {
                Some(item) => {
                    taken.bytes += item.stored_bytes();
                    taken.items.push(item);
                }
                None => break,
            }
        }
        taken.items.len() >= want.wait_for
            || (!taken.items.is_empty() && taken.bytes >= want.max_bytes)
    }

    /// One slice of [`NativeStream::take`]'s wait (GIL released): waits at most `slice` for
    /// the reader thread's next chunk and takes from it. `None` while `taken` is not enough;
    /// the lock on the channel is let go on return, before the signal handlers run (one may
    /// close this stream).
    fn receive(&self, want: &Want, taken: &mut Taken, slice: Duration) -> Option<PyResult<()>> {
        let mut rx_guard = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(rx) = rx_guard.as_ref() else {
            return Some(Ok(()));
        };
        // About to wait: the reader thread may leave its next large sample to this thread.
        if rx.is_empty() {
            self.wanted.store(true, Ordering::Release);
        }
        match rx.recv_timeout(slice) {
            Ok(Ok(chunk)) => {
                self.wanted.store(false, Ordering::Release);
                self.pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(chunk);
                drop(rx_guard);
                self.take_pending(want, taken).then_some(Ok(()))
            }
            Ok(Err(e)) => {
                *rx_guard = None;
                Some(Err(e))
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                *rx_guard = None;
                Some(Ok(()))
            }
        }
    }
}

/// How much [`NativeStream::take`] takes: see there.
struct Want {
    n: usize,
    wait_for: usize,
    max_bytes: usize,
}

/// The items [`NativeStream::take`] has taken, and their stored bytes.
struct Taken {
    items: Vec<Item>,
    bytes: usize,
}

impl Drop for NativeStream {
    fn drop(&mut self) {
        if self.forked_copy() {
            // As in `close`: a forked child's copy of the channel, and the samples it holds,
            // are never dropped there (see `owner_pid`).
            std::mem::forget(self.rx.get_mut().unwrap_or_else(|p| p.into_inner()).take());
            std::mem::forget(std::mem::take(
                self.pending.get_mut().unwrap_or_else(|p| p.into_inner()),
            ));
        }
    }
}

#[pymethods]
impl NativeStream {
    /// Up to `n` decoded samples (dicts): those that have arrived, at least one; an empty list
    /// at the end of the stream. With `with_index`, each is `(global index, dict)`: what a
    /// subclass's `__getitem__` is called with.
    #[pyo3(signature = (n, with_index=false))]
    fn next_samples<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        with_index: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        // Whatever has arrived, at least one sample: waiting for all `n` would hold the first
        // sample back until a whole batch had been read (64 MB of 1 MB samples).
        let items = self.take(py, n.max(1), 1, DECODE_BYTES)?;
        let list = PyList::empty(py);
        let mut items = items.into_iter();
        while let Some(item) = items.next() {
            let (index, parsed) = match item {
                Item::Parsed(index, p) => (index, p),
                Item::Raw(raw) => {
                    let index = raw.index();
                    let parsed = parse_raw(raw, &self.ds).map_err(from_format)?;
                    (index, parsed)
                }
                // Read first in the next call: the samples made so far reach Python even if
                // this read fails, as samples before a reader thread's error do.
                Item::Deferred(d) if !list.is_empty() => {
                    let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                    for item in std::iter::once(Item::Deferred(d)).chain(items).rev() {
                        pending.push_front(item);
                    }
                    break;
                }
                Item::Deferred(d) => {
                    let (index, ds) = (d.index, &self.ds);
                    let parsed =
                        self.read_deferred(py, d, |raw| parse_raw(raw, ds).map_err(from_format))?;
                    (index, parsed)
                }
            };
            let sample = self.decoder.to_python(py, parsed)?;
            if with_index {
                list.append((index, sample))?;
            } else {
                list.append(sample)?;
            }
        }
        Ok(list)
    }

    /// Up to `n` samples as columns: `(count, {name: column})`, where a fixed-size numeric
    /// column is `(dtype, shape, Buffer)` ready for `np.frombuffer(...).reshape(count, *shape)`
    /// and any other column is `(None, offsets, Buffer)`: the columns' bytes laid end to end and
    /// a `Buffer` of `count + 1` little-endian u64 offsets into them. One copy per column per
    /// batch, made with the GIL released; no Python object per sample.
    ///
    /// With `shared` (a DataLoader worker), each variable column's bytes go to a slot of the
    /// process's batch arena (`crate::arena`) when one is free, so that the batch crosses to
    /// the main process by address.
    #[pyo3(signature = (n, columns=None, shared=false))]
    fn next_columns<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        columns: Option<Vec<String>>,
        shared: bool,
    ) -> PyResult<(usize, Bound<'py, PyDict>)> {
        let n = n.max(1);
        let names = self.decoder.names();
        let wanted: Vec<usize> = match &columns {
            None => (0..names.len()).collect(),
            Some(cols) => cols
                .iter()
                .map(|c| {
                    names.iter().position(|n| n == c).ok_or_else(|| {
                        PyValueError::new_err(format!("no column {c:?}; the dataset has {names:?}"))
                    })
                })
                .collect::<PyResult<_>>()?,
        };
        let encodings = self.decoder.encodings();
        let pool = &self.batch_buffers;
        // Each column's values laid end to end with the GIL released, chunk by chunk as the
        // samples arrive: the one copy of the batch path. Each sample is dropped once copied,
        // so its read buffer goes back to the engine's pool for the next reads instead of the
        // whole batch's reads being held until the last one arrives.
        let mut gathers: Vec<ColumnGather> = Vec::new();
        let mut count = 0;
        while count < n {
            let items = self.take(py, n - count, 1, usize::MAX)?;
            if items.is_empty() {
                break;
            }
            let raws: Vec<RawSample> = items
                .into_iter()
                .map(|item| match item {
                    Item::Raw(r) => Ok(r),
                    Item::Deferred(d) => self.read_deferred(py, d, Ok),
                    Item::Parsed(..) => Err(PyValueError::new_err(
                        "this stream decodes samples; open it with raw=True for column batches",
                    )),
                })
                .collect::<PyResult<_>>()?;
            // Column batches lay each column out by its place in the dataset's first schema: a
            // sample of a stream with other columns (or a WebDataset sample) cannot join them.
            if let Some(other) = raws
                .iter()
                .find(|r| r.column_names() != names || !matches!(r.schema(), SampleSchema::Mds(_)))
            {
                return Err(PyValueError::new_err(format!(
                    "column batches need every stream to have the first one's MDS columns \
                     {names:?}; a sample of {} has {:?}: iterate samples instead",
                    self.ds.shard_name(other.shard()).unwrap_or("a shard"),
                    other.column_names()
                )));
            }
            let first = count == 0;
            count += raws.len();
            py.detach(|| {
                if first {
                    // Sized from the first samples, for the whole batch.
                    gathers = wanted
                        .iter()
                        .map(|&c| {
                            let seen: usize = raws.iter().map(|r| value_of(r, c).len()).sum();
                            let expected = seen / raws.len().max(1) * n;
                            let slot = if shared
                                && expected >= arena::MIN_SHARED_BYTES
                                && fixed_numeric(&encodings[c]).is_none()
                            {
                                // Room for batches a quarter larger than the first samples say.
                                arena::for_worker(expected + expected / 4, pool.max_bytes())
                                    .and_then(|a| a.take())
                            } else {
                                None
                            };
                            ColumnGather::new(c, &encodings[c], pool, expected, slot)
                        })
                        .collect();
                }
                for raw in &raws {
                    for gather in &mut gathers {
                        gather.push(value_of(raw, gather.column));
                    }
                }
            });
        }
        let gathered: Vec<(usize, Gathered)> = gathers
            .into_iter()
            .map(|g| (g.column, g.finish(pool)))
            .collect();
        let out = PyDict::new(py);
        for (c, g) in gathered {
            out.set_item(&names[c], g.into_python(py)?)?;
        }
        Ok((count, out))
    }

    /// Stops the stream: the reader thread ends and its prefetched shards are released.
    fn close(&self) {
        if self.forked_copy() {
            // Dropping the receiver would lock the channel's waker, which a parent thread may
            // have held at the fork (a child hung there, 1 in 120 forks of test_fork_hold.py):
            // the copy is left as it is, and `Drop` leaks it with the process.
            return;
        }
        *self.rx.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
