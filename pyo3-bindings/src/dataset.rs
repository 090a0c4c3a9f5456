//! `NativeDataset` and `NativeStream`: the native half of `shardstream.StreamingDataset`.
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

use bytes::Bytes;
use crossbeam_channel::{bounded as sync_channel, Receiver, RecvTimeoutError};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use shardstream_sharding::mds::Encoding;
use shardstream_sharding::value::DType;
use shardstream_sharding::FormatError;
use shardstream_streamer::buffers::{BufferPool, PooledBuffer};
use shardstream_streamer::order::{
    EpochOrder, OrderConfig, Rank, Remainder, Sampling, StreamState, Weight, World,
};
use shardstream_streamer::{
    DeferredSample, Prefetch, RawSample, StreamItem, StreamPlan, StreamSpec, StreamerError,
    StreamingConfig, StreamingDataset,
};

use crate::arena::{self, SlotBytes, SlotWriter};
use crate::blocking;
use crate::buffer::{Buffer, ColumnBuffer};
use crate::decode::{parse_sample, Decoder, ParsedSample};
use crate::errors::{from_format, from_streamer};

/// Most samples the reader thread hands over at once.
const MAX_CHUNK: usize = 64;
/// Most bytes the reader thread gathers before handing a chunk over.
const MAX_CHUNK_BYTES: u64 = 4 << 20;
/// Share of `memory_limit` kept for the samples this binding holds between the streamer and
/// Python (chunks in the channel, the one being filled, the one being handed out) and for the
/// column buffers of dropped `iter_batches` batches it keeps for reuse: 1/4. The
/// streamer's own budget gets the rest, so that the two together stay within the limit.
const BINDING_SHARE: u64 = 4;
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

/// An opened dataset (native half of `shardstream.StreamingDataset`).
#[pyclass(module = "shardstream._native", frozen)]
pub struct NativeDataset {
    ds: Arc<StreamingDataset>,
    /// Bytes of samples per chunk handed from the reader thread (at most 4 chunks are held).
    chunk_bytes: usize,
    decoder: Arc<Decoder>,
    /// Column buffers of `iter_batches` batches Python has dropped, for the next batches.
    batch_buffers: Arc<BufferPool>,
}

fn remainder_of(name: &str) -> PyResult<Remainder> {
    match name {
        "pad" => Ok(Remainder::Pad),
        "drop" => Ok(Remainder::Drop),
        other => Err(PyValueError::new_err(format!(
            "remainder must be 'pad' or 'drop', got {other:?}"
        ))),
    }
}

fn remainder_name(r: Remainder) -> &'static str {
    match r {
        Remainder::Pad => "pad",
        Remainder::Drop => "drop",
    }
}

/// One stream of a mix as Python passes it: `(remote, split, weight kind, weight value)`, the
/// kind one of `natural`, `proportion`, `repeat`, `choose` (Mosaic's `Stream` arguments).
type PyStream = (String, Option<String>, String, f64);

fn stream_spec((remote, split, kind, value): PyStream) -> PyResult<StreamSpec> {
    let weight = match kind.as_str() {
        "natural" => Weight::Natural,
        "proportion" => Weight::Proportion(value),
        "repeat" => Weight::Repeat(value),
        "choose" if value >= 0.0 && value.fract() == 0.0 && value < u64::MAX as f64 => {
            Weight::Choose(value as u64)
        }
        "choose" => {
            return Err(PyValueError::new_err(format!(
                "choose must be a whole number of samples, got {value}"
            )))
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "stream weight must be natural, proportion, repeat or choose, got {other:?}"
            )))
        }
    };
    Ok(StreamSpec {
        remote,
        split,
        weight,
        location: None,
    })
}

/// An error from opening a dataset, worded for Python: the run-id resolver names the CLI flags
/// (`--run-id`, `--node-rank`); a Python caller passes `run_id=` / `node_rank=` instead.
fn open_error(err: StreamerError) -> PyErr {
    let run_setting = matches!(&err, StreamerError::InvalidConfig { setting, .. }
        if setting.contains("run_id") || setting.contains("node_rank"));
    if !run_setting {
        return from_streamer(err);
    }
    PyValueError::new_err(python_wording(&err.to_string()))
}

/// Rewrites the CLI's flag names in a run-id message into `StreamingDataset`'s arguments, and
/// makes sure a missing run id names both ways to give one. A message already worded for
/// Python is kept.
fn python_wording(msg: &str) -> String {
    let mut out = msg.to_string();
    if !out.contains("run_id=") {
        out = out.replace("--run-id", "run_id=");
    }
    if !out.contains("node_rank=") {
        out = out.replace("--node-rank", "node_rank=");
    }
    if out.to_lowercase().contains("no run id")
        && !(out.contains("run_id=") && out.contains("SHARDSTREAM_RUN_ID"))
    {
        out.push_str(
            " (from Python: pass StreamingDataset(..., run_id=...) or set SHARDSTREAM_RUN_ID)",
        );
    }
    out
}

fn order_config(
    seed: u64,
    shuffle: bool,
    window: u32,
    lanes: u32,
    remainder: &str,
    ramp: bool,
    sample_ramp: bool,
) -> PyResult<OrderConfig> {
    let config = OrderConfig {
        seed,
        shuffle,
        window,
        lanes,
        remainder: remainder_of(remainder)?,
        ramp,
        sample_ramp,
    };
    config.validate().map_err(from_streamer)?;
    Ok(config)
}

#[pymethods]
impl NativeDataset {
    #[new]
    /// `streams` (each `(remote, split, weight kind, weight value)`) mixes several datasets as
    /// Mosaic's `streams=` does; `remote` and `split` are then ignored. `zero_copy` gives `bytes`
    /// columns as `Buffer`s.
    #[pyo3(signature = (remote, *, split=None, local=None, cache_root=None, run_id=None,
        node_rank=None, memory_limit=None, cache_limit=None, copy_local=false,
        validate_hash=false, allow_unsafe_types=false, streams=None, epoch_size=None,
        zero_copy=false, sampling_method="balanced"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        remote: String,
        split: Option<String>,
        local: Option<std::path::PathBuf>,
        cache_root: Option<std::path::PathBuf>,
        run_id: Option<String>,
        node_rank: Option<u64>,
        memory_limit: Option<u64>,
        cache_limit: Option<u64>,
        copy_local: bool,
        validate_hash: bool,
        allow_unsafe_types: bool,
        streams: Option<Vec<PyStream>>,
        epoch_size: Option<u64>,
        zero_copy: bool,
        sampling_method: &str,
    ) -> PyResult<Self> {
        let sampling = match sampling_method {
            "balanced" => Sampling::Balanced,
            "fixed" => Sampling::Fixed,
            other => {
                return Err(PyValueError::new_err(format!(
                    "sampling_method must be 'balanced' or 'fixed', got {other:?}"
                )))
            }
        };
        let limit = memory_limit.unwrap_or(shardstream_streamer::dataset::DEFAULT_MEMORY_LIMIT);
        let binding_bytes = limit / BINDING_SHARE;
        // Half the share for the (at most 4) chunks in flight, half for the batch pool below.
        let chunk_bytes = (binding_bytes / 8).clamp(1, MAX_CHUNK_BYTES) as usize;
        let memory_limit = Some(limit - binding_bytes);
        let config = StreamingConfig {
            remote,
            split,
            local,
            cache_root,
            run_id,
            node_rank,
            memory_limit,
            cache_limit,
            copy_local,
            validate_hash,
            allow_unsafe_types,
            sampling,
        };
        let specs = streams
            .map(|s| s.into_iter().map(stream_spec).collect::<PyResult<Vec<_>>>())
            .transpose()?;
        // Mosaic's `epoch_size` also resizes the epoch of a lone dataset: it is then a mix of
        // one stream, whose sampling (each sample `f` times plus a fresh subset) is the mix's.
        let specs = match (specs, epoch_size) {
            (None, Some(_)) => Some(vec![StreamSpec {
                remote: config.remote.clone(),
                split: config.split.clone(),
                weight: Weight::Natural,
                location: None,
            }]),
            (specs, _) => specs,
        };
        let ds = blocking::run(py, move || match specs {
            Some(specs) => StreamingDataset::open_streams(config, specs, epoch_size),
            None => StreamingDataset::open(config),
        })?
        .map_err(open_error)?;
        let mut names = Vec::new();
        let mut encodings = Vec::new();
        for (name, enc) in ds.columns() {
            names.push(name.clone());
            encodings.push(Encoding::parse(enc).map_err(from_format)?);
        }
        let decoder = Arc::new(Decoder::new(py, names, encodings, zero_copy));
        // Python holds the previous batch while the next one is gathered, so one kept buffer
        // per column is what a steady loop reuses; the other half of the binding's share
        // bounds them.
        let pool_bytes = (binding_bytes / 2) as usize;
        Ok(NativeDataset {
            ds: Arc::new(ds),
            chunk_bytes,
            decoder,
            batch_buffers: BufferPool::for_batches(pool_bytes),
        })
    }

    /// Samples in the dataset.
    #[getter]
    fn num_samples(&self) -> u64 {
        self.ds.num_samples()
    }

    /// Shards in the dataset.
    #[getter]
    fn num_shards(&self) -> usize {
        self.ds.num_shards()
    }

    /// `(name, encoding)` of every column, in the index's order.
    #[getter]
    fn columns(&self) -> Vec<(String, String)> {
        self.ds.columns().to_vec()
    }

    /// The node's cache folder for this dataset.
    #[getter]
    fn cache_dir(&self) -> std::path::PathBuf {
        self.ds.cache_dir().to_path_buf()
    }

    /// Sample count of every shard, in index order (the shards of all streams, one stream
    /// after the other).
    fn shard_sizes(&self) -> Vec<u64> {
        let shape = self.ds.shape();
        (0..shape.num_shards())
            .map(|s| shape.shard_len(s).unwrap_or(0))
            .collect()
    }

    /// Per stream, in order: `(samples, samples per epoch)` (the second is the stream's
    /// weight resolved as Mosaic resolves `proportion`, `repeat` and `choose`).
    fn stream_sizes(&self) -> Vec<(u64, u64)> {
        self.ds
            .shape()
            .streams()
            .iter()
            .map(|e| (e.shape.num_samples(), e.choose))
            .collect()
    }

    /// Shards of each stream, in order.
    fn stream_shards(&self) -> Vec<u64> {
        self.ds
            .shape()
            .streams()
            .iter()
            .map(|e| e.shape.num_shards() as u64)
            .collect()
    }

    /// Sample `index` decoded as Mosaic decodes it (fetches its shard if needed).
    fn get<'py>(&self, py: Python<'py>, index: i64) -> PyResult<Bound<'py, PyDict>> {
        let n = self.ds.num_samples();
        let index = if index < 0 { n as i64 + index } else { index };
        if index < 0 || index as u64 >= n {
            return Err(PyIndexError::new_err(format!(
                "sample {index} is out of range (the dataset has {n})"
            )));
        }
        // The shard open already and the sample on disk: read and parse it here with the GIL
        // released, without the helper thread (a thread per call cost more than the read).
        let (decoder, ds) = (&self.decoder, &self.ds);
        let now = py.detach(|| {
            ds.sample_now(index as u64)
                .map(|raw| parse_raw(decoder, raw, ds).map_err(from_format))
        });
        if let Some(parsed) = now {
            return self.decoder.to_python(py, parsed?);
        }
        let decoder = Arc::clone(&self.decoder);
        let ds = Arc::clone(&self.ds);
        let parsed = blocking::run(py, move || -> PyResult<ParsedSample> {
            let raw = ds.sample(index as u64).map_err(from_streamer)?;
            parse_raw(&decoder, raw, &ds).map_err(from_format)
        })??;
        self.decoder.to_python(py, parsed)
    }

    /// The number of global positions of an epoch under this order (before padding).
    #[pyo3(signature = (seed, shuffle, window, lanes, remainder, epoch, ramp=true, sample_ramp=true))]
    #[allow(clippy::too_many_arguments)]
    fn epoch_len(
        &self,
        py: Python<'_>,
        seed: u64,
        shuffle: bool,
        window: u32,
        lanes: u32,
        remainder: &str,
        epoch: u64,
        ramp: bool,
        sample_ramp: bool,
    ) -> PyResult<u64> {
        let config = order_config(seed, shuffle, window, lanes, remainder, ramp, sample_ramp)?;
        let order = self.epoch_order(py, &config, epoch)?;
        Ok(order.global_len())
    }

    /// A `StreamState` as JSON text: the position after `consumed` global positions of `epoch`.
    #[pyo3(signature = (seed, shuffle, window, lanes, remainder, epoch, consumed, ramp=true,
        sample_ramp=true))]
    #[allow(clippy::too_many_arguments)]
    fn state_json(
        &self,
        py: Python<'_>,
        seed: u64,
        shuffle: bool,
        window: u32,
        lanes: u32,
        remainder: &str,
        epoch: u64,
        consumed: u64,
        ramp: bool,
        sample_ramp: bool,
    ) -> PyResult<String> {
        let config = order_config(seed, shuffle, window, lanes, remainder, ramp, sample_ramp)?;
        let order = self.epoch_order(py, &config, epoch)?;
        serde_json::to_string(&StreamState::new(&order, consumed))
            .map_err(|e| PyValueError::new_err(format!("cannot serialise the stream state: {e}")))
    }

    /// Checks a `StreamState` JSON against this dataset; returns
    /// `(seed, shuffle, window, lanes, remainder, epoch, consumed, epoch_len, ramp,
    /// sample_ramp)`.
    fn parse_state<'py>(&self, py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyTuple>> {
        let state: StreamState = serde_json::from_str(text)
            .map_err(|e| PyValueError::new_err(format!("invalid stream state: {e}")))?;
        let order = py
            .detach(|| state.resume(self.ds.shape()))
            .map_err(from_streamer)?;
        let c = state.config;
        (
            c.seed,
            c.shuffle,
            c.window,
            c.lanes,
            remainder_name(c.remainder),
            state.epoch,
            state.consumed,
            order.global_len(),
            c.ramp,
            c.sample_ramp,
        )
            .into_pyobject(py)
    }

    /// This process's counters (bytes fetched, cache hits, memory in use, ...).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.ds.metrics();
        let d = PyDict::new(py);
        d.set_item("fetch_bytes", m.fetch_bytes)?;
        d.set_item("fetch_requests", m.fetch_requests)?;
        d.set_item("fetch_retries", m.fetch_retries)?;
        d.set_item("shards_fetched", m.shards_fetched)?;
        d.set_item("shards_joined", m.shards_joined)?;
        d.set_item("cache_hits", m.cache_hits)?;
        d.set_item("cache_misses", m.cache_misses)?;
        d.set_item("cache_evictions", m.cache_evictions)?;
        d.set_item("cache_bytes", m.cache_bytes)?;
        d.set_item("samples", m.samples)?;
        d.set_item("sample_bytes", m.sample_bytes)?;
        d.set_item("sample_reads", m.sample_reads)?;
        d.set_item("deferred_reads", m.deferred_reads)?;
        d.set_item("stall_seconds", m.stall_seconds)?;
        d.set_item("memory_in_use", m.memory_in_use)?;
        d.set_item("memory_limit", m.memory_limit)?;
        Ok(d)
    }

    /// Starts downloading, in the background of this process, the first shards (at most
    /// `max_shards`) of one process's part of an epoch, in the order the part needs them
    /// (`StreamingDataset::prefetch`). Returns at once.
    #[pyo3(signature = (*, seed, shuffle, window, lanes, remainder, epoch, nodes,
        processes_per_node, node, local_process, start, max_shards, ramp=true, sample_ramp=true))]
    #[allow(clippy::too_many_arguments)]
    fn prefetch(
        &self,
        py: Python<'_>,
        seed: u64,
        shuffle: bool,
        window: u32,
        lanes: u32,
        remainder: &str,
        epoch: u64,
        nodes: u32,
        processes_per_node: u32,
        node: u32,
        local_process: u32,
        start: u64,
        max_shards: usize,
        ramp: bool,
        sample_ramp: bool,
    ) -> PyResult<NativePrefetch> {
        // One process's part: its DataLoader workers split it by batch, and together need the
        // same shards first, whatever the batch size.
        let plan = StreamPlan {
            order: order_config(seed, shuffle, window, lanes, remainder, ramp, sample_ramp)?,
            epoch,
            world: World::new(nodes, processes_per_node, 1, 1).map_err(from_streamer)?,
            rank: Rank {
                node,
                local_process,
                worker: 0,
            },
            start,
        };
        let ds = Arc::clone(&self.ds);
        // Opening the cache folder may wait for another process's recovery of it.
        let prefetch =
            blocking::run(py, move || ds.prefetch(plan, max_shards))?.map_err(from_streamer)?;
        Ok(NativePrefetch { prefetch })
    }

    /// Streams one rank's part of an epoch. `raw=True` yields column batches for
    /// `NativeStream.next_columns` instead of decoded samples.
    #[pyo3(signature = (*, seed, shuffle, window, lanes, remainder, epoch, nodes,
        processes_per_node, workers, batch_size, node, local_process, worker, start, raw=false,
        ramp=true, sample_ramp=true))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        seed: u64,
        shuffle: bool,
        window: u32,
        lanes: u32,
        remainder: &str,
        epoch: u64,
        nodes: u32,
        processes_per_node: u32,
        workers: u32,
        batch_size: u32,
        node: u32,
        local_process: u32,
        worker: u32,
        start: u64,
        raw: bool,
        ramp: bool,
        sample_ramp: bool,
    ) -> PyResult<NativeStream> {
        let plan = StreamPlan {
            order: order_config(seed, shuffle, window, lanes, remainder, ramp, sample_ramp)?,
            epoch,
            world: World::new(nodes, processes_per_node, workers, batch_size)
                .map_err(from_streamer)?,
            rank: Rank {
                node,
                local_process,
                worker,
            },
            start,
        };
        let ds = Arc::clone(&self.ds);
        let decoder = Arc::clone(&self.decoder);
        let (tx, rx) = sync_channel::<Chunk>(CHANNEL_CHUNKS);
        let wanted = Arc::new(AtomicBool::new(false));
        let reader_wanted = Arc::clone(&wanted);
        let reader_decoder = Arc::clone(&decoder);
        let reader_ds = Arc::clone(&self.ds);
        let chunk_bytes = self.chunk_bytes;
        std::thread::Builder::new()
            .name("shardstream-reader".into())
            .spawn(move || {
                // Made here, not on the Python thread: opening may wait on storage, and the
                // Python side waits interruptibly on the channel.
                let mut stream = match ds.stream(plan) {
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
                                parse_raw(&reader_decoder, s.sample, &reader_ds)
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
            ds: Arc::clone(&self.ds),
            batch_buffers: Arc::clone(&self.batch_buffers),
        })
    }
}

impl NativeDataset {
    /// The order of `epoch` (built without the GIL: O(shards) work).
    fn epoch_order(
        &self,
        py: Python<'_>,
        config: &OrderConfig,
        epoch: u64,
    ) -> PyResult<EpochOrder> {
        py.detach(|| EpochOrder::new(self.ds.shape(), config, epoch))
            .map_err(from_streamer)
    }
}

/// A background prefetch (`NativeDataset.prefetch`). Dropping it starts no further download.
#[pyclass(module = "shardstream._native", frozen)]
pub struct NativePrefetch {
    prefetch: Prefetch,
}

#[pymethods]
impl NativePrefetch {
    /// Starts no further download; those under way finish in the background.
    fn cancel(&self) {
        self.prefetch.cancel();
    }

    /// Whether every download it started has ended.
    #[getter]
    fn finished(&self) -> bool {
        self.prefetch.is_finished()
    }

    /// The shards it chose, in the order it downloads them.
    #[getter]
    fn shards(&self) -> Vec<usize> {
        self.prefetch.shards().to_vec()
    }

    /// `{"planned", "ready", "failed"}`: shards chosen, complete in the cache, failed.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.prefetch.report();
        let d = PyDict::new(py);
        d.set_item("planned", r.planned)?;
        d.set_item("ready", r.ready)?;
        d.set_item("failed", r.failed)?;
        Ok(d)
    }

    /// Waits until every download it started has ended (at most `timeout` seconds); returns
    /// whether they had. Ctrl-C interrupts it (the wait wakes every [`blocking::POLL`] to check).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline =
            timeout.map(|t| std::time::Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let prefetch = &self.prefetch;
        let done =
            blocking::wait_until(py, deadline, |slice| match prefetch.wait_timeout(slice) {
                Ok(false) => None,
                done => Some(done),
            })?;
        Ok(done.transpose().map_err(from_streamer)?.unwrap_or(false))
    }
}

/// Parses a sample's columns; errors name its shard file (URL or path).
fn parse_raw(
    decoder: &Decoder,
    raw: RawSample,
    ds: &StreamingDataset,
) -> Result<ParsedSample, FormatError> {
    let shard = raw.shard();
    let name = || {
        ds.shard_name(shard)
            .map_or_else(|| format!("shard {shard}"), str::to_string)
    };
    parse_sample(decoder.encodings(), decoder.names(), raw, name)
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
}

impl NativeStream {
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
    /// bytes, waiting (GIL released, signals checked) until at least `wait_for` (at most `n`)
    /// are there, the byte bound is reached, or the stream ends.
    fn take(
        &self,
        py: Python<'_>,
        n: usize,
        wait_for: usize,
        max_bytes: usize,
    ) -> PyResult<Vec<Item>> {
        let wait_for = wait_for.min(n);
        let mut out = Vec::with_capacity(n.min(4096));
        let mut bytes = 0usize;
        loop {
            {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                while out.len() < n && (out.is_empty() || bytes < max_bytes) {
                    match pending.pop_front() {
                        Some(item) => {
                            bytes += item.stored_bytes();
                            out.push(item);
                        }
                        None => break,
                    }
                }
            }
            if out.len() >= wait_for || (!out.is_empty() && bytes >= max_bytes) {
                return Ok(out);
            }
            let mut rx_guard = self.rx.lock().unwrap_or_else(|p| p.into_inner());
            let Some(rx) = rx_guard.as_ref() else {
                return Ok(out);
            };
            // About to wait: the reader thread may leave its next large sample to this thread.
            if rx.is_empty() {
                self.wanted.store(true, Ordering::Release);
            }
            // One slice of `blocking::wait` written out: the lock on `rx` must be let go before
            // the signal handlers run (one may close this stream).
            let got = py.detach(|| rx.recv_timeout(blocking::POLL));
            match got {
                Ok(Ok(chunk)) => {
                    self.wanted.store(false, Ordering::Release);
                    let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                    pending.extend(chunk);
                }
                Ok(Err(e)) => {
                    *rx_guard = None;
                    return Err(e);
                }
                Err(RecvTimeoutError::Timeout) => {
                    drop(rx_guard);
                    py.check_signals()?;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    *rx_guard = None;
                    return Ok(out);
                }
            }
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
                    let parsed = parse_raw(&self.decoder, raw, &self.ds).map_err(from_format)?;
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
                    let (index, decoder, ds) = (d.index, &self.decoder, &self.ds);
                    let parsed = self.read_deferred(py, d, |raw| {
                        parse_raw(decoder, raw, ds).map_err(from_format)
                    })?;
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
            let data = match (g.data, g.fixed.is_some()) {
                // Numeric columns are Python's to write (`ColumnBuffer`); variable ones are
                // sliced into values and may lie in a worker's arena.
                (GatheredBytes::Heap(b), true) => {
                    ColumnBuffer::new(b).into_pyobject(py)?.into_any()
                }
                (GatheredBytes::Heap(b), false) => Buffer::new(Bytes::from_owner(b))
                    .into_pyobject(py)?
                    .into_any(),
                (GatheredBytes::Slot(b), _) => Buffer::in_slot(b).into_pyobject(py)?.into_any(),
            };
            let value = match g.fixed {
                Some((dtype, shape)) => (
                    Some(dtype.name()),
                    PyTuple::new(py, &shape)?.into_any(),
                    data,
                )
                    .into_pyobject(py)?,
                None => {
                    let offsets = Buffer::new(g.offsets.into()).into_pyobject(py)?;
                    (None::<&str>, offsets.into_any(), data).into_pyobject(py)?
                }
            };
            out.set_item(&names[c], value)?;
        }
        Ok((count, out))
    }

    /// Stops the stream: the reader thread ends and its prefetched shards are released.
    fn close(&self) {
        *self.rx.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// One column of a batch, laid end to end.
struct Gathered {
    /// `(dtype, shape)` when every value is one fixed-size number or array.
    fixed: Option<(DType, Vec<u64>)>,
    /// Otherwise `count + 1` little-endian u64 offsets into `data`.
    offsets: Vec<u8>,
    data: GatheredBytes,
}

/// Where a gathered column's bytes lie.
enum GatheredBytes {
    /// Goes back to the dataset's batch pool when Python drops the column.
    Heap(PooledBuffer),
    /// A worker-arena slot, freed when its last holder (here or in the main process) drops it.
    Slot(SlotBytes),
}

/// Value `c` of a sample's columns (empty when the sample has fewer).
fn value_of(raw: &RawSample, c: usize) -> &[u8] {
    raw.column(c).unwrap_or(&[])
}

/// One column of a batch being laid end to end as its samples arrive, in an allocation from the
/// dataset's batch pool when one fits: a batch of large values would otherwise fault in and
/// zero fresh pages for every batch (64 MB for 64 samples of 1 MB).
struct ColumnGather {
    column: usize,
    /// `(dtype, shape)` while every value so far is one fixed-size number or array.
    fixed: Option<(DType, Vec<u64>)>,
    offsets: Vec<u8>,
    data: Vec<u8>,
    /// The arena slot the values go to instead of `data`, while they fit in it.
    slot: Option<SlotWriter>,
    end: u64,
}

impl ColumnGather {
    fn new(
        column: usize,
        enc: &Encoding,
        pool: &BufferPool,
        expected_bytes: usize,
        slot: Option<SlotWriter>,
    ) -> Self {
        let data = if slot.is_some() {
            Vec::new()
        } else {
            let mut data = pool.take(expected_bytes);
            data.clear();
            data.reserve(expected_bytes);
            data
        };
        ColumnGather {
            column,
            fixed: fixed_numeric(enc),
            offsets: 0u64.to_le_bytes().to_vec(),
            data,
            slot,
            end: 0,
        }
    }

    fn push(&mut self, value: &[u8]) {
        let in_slot = self.slot.as_mut().map(|w| w.push(value));
        if in_slot == Some(false) {
            // The batch outgrew the slot: it goes on the heap, and the slot back to the arena.
            if let Some(w) = self.slot.take() {
                self.data.extend_from_slice(w.written());
            }
        }
        if in_slot != Some(true) {
            self.data.extend_from_slice(value);
        }
        self.end += value.len() as u64;
        self.offsets.extend_from_slice(&self.end.to_le_bytes());
        if let Some((dtype, shape)) = &self.fixed {
            if value.len() as u64 != elem_bytes(*dtype, shape) {
                self.fixed = None;
            }
        }
    }

    fn finish(self, pool: &Arc<BufferPool>) -> Gathered {
        Gathered {
            offsets: if self.fixed.is_some() {
                Vec::new()
            } else {
                self.offsets
            },
            fixed: self.fixed,
            data: match self.slot {
                Some(w) => GatheredBytes::Slot(w.finish()),
                None => GatheredBytes::Heap(PooledBuffer::pooled(self.data, pool)),
            },
        }
    }
}

/// A column whose every value is a fixed-size little-endian number or array.
fn fixed_numeric(enc: &Encoding) -> Option<(DType, Vec<u64>)> {
    match enc {
        Encoding::Int => Some((DType::I64, Vec::new())),
        Encoding::Scalar(d) => Some((*d, Vec::new())),
        Encoding::NdArray {
            dtype: Some(d),
            shape: Some(shape),
        } => Some((*d, shape.clone())),
        _ => None,
    }
}

fn elem_bytes(dtype: DType, shape: &[u64]) -> u64 {
    shape.iter().product::<u64>() * dtype.size() as u64
}

/// Frees the read buffers the process keeps for its next datasets (called before `fork`; see
/// `shardstream_streamer::buffers::release_kept_buffers`), and hands the memory back to the
/// kernel: freed 1 MiB buffers usually stay in malloc's free lists, which the children would
/// inherit all the same. Holds the GIL: it only frees memory, and Python's fork hooks run with
/// it. Trims only when buffers were freed (a DataLoader forks once per worker).
#[pyfunction]
fn release_read_buffers() {
    if shardstream_streamer::buffers::release_kept_buffers() > 0 {
        crate::allocator::trim();
    }
}

thread_local! {
    /// The streamer's process-wide locks, held by the forking thread from the prepare handler
    /// to the parent's or child's handler (`register_fork_handlers`).
    static FORK_HOLD: std::cell::RefCell<Option<shardstream_streamer::fork::ForkHold>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: takes the streamer's process-wide locks
/// (`shardstream_streamer::fork`) so that no other thread is inside one at the fork.
///
/// Not a Python `os.register_at_fork` hook: Python may run other hooks (Python code) after
/// it, and the interpreter can hand the GIL to another thread between them; a thread dropping
/// a dataset with the GIL held then waited for the lock table this thread held, while this
/// thread waited for the GIL (found by `tests/python/test_fork_hold.py`). libc runs this
/// handler inside `fork()` itself, after every Python hook, with no Python code until the
/// parent or child handler has released the locks. The holders of these locks never need the
/// GIL, so the forking thread holding it cannot block them.
extern "C" fn fork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        FORK_HOLD.with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                if h.is_none() {
                    *h = Some(shardstream_streamer::fork::prepare());
                }
            }
        });
    });
}

/// `pthread_atfork` parent and child handler: releases what `fork_prepare` took.
extern "C" fn fork_release() {
    let _ = std::panic::catch_unwind(|| {
        FORK_HOLD.with(|h| {
            if let Ok(mut h) = h.try_borrow_mut() {
                drop(h.take());
            }
        });
    });
}

/// Registers the fork handlers once per process (at module import; a forked child inherits
/// them, as libc keeps the registrations across `fork`).
#[cfg(unix)]
#[allow(unsafe_code)] // one FFI call registering three functions without arguments
fn register_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions without arguments that live for the
        // whole program, never unwind (each catches panics), and only lock and unlock Rust
        // mutexes and touch this thread's thread-local storage.
        let rc = unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_release), Some(fork_release))
        };
        if rc != 0 {
            tracing::warn!(
                rc,
                "pthread_atfork failed: forks while other threads stream may hang"
            );
        }
    });
}

#[cfg(not(unix))]
fn register_fork_handlers() {}

/// Adds this module's classes and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(release_read_buffers, m)?)?;
    register_fork_handlers();
    m.add_class::<NativeDataset>()?;
    m.add_class::<NativeStream>()?;
    m.add_class::<NativePrefetch>()?;
    Ok(())
}
