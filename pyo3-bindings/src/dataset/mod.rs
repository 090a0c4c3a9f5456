//! `NativeDataset`: the native half of `shardstream.StreamingDataset`, and the registration of
//! the dataset classes.
//!
//! - [`config`]: what Python passes to open a dataset;
//! - [`order`]: the order of a run, the shape of the job, one reader in it and what it streams
//!   (`Order`, `World`, `Rank`, `Plan`), built in Python and passed to the calls below;
//! - [`state`]: a run's position (`State`), for `state_dict` and `load_state_dict`;
//! - [`stream`]: `NativeStream`, one rank's part of an epoch, read by a background thread;
//! - [`gather`]: a batch's columns laid end to end (`NativeStream.next_columns`);
//! - [`prefetch`]: `NativePrefetch`, downloads started before the stream;
//! - [`fork`]: what the process does around `fork` (DataLoader workers).

mod config;
mod fork;
mod gather;
mod order;
mod prefetch;
mod state;
mod stream;

use std::sync::Arc;

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use shardstream_sharding::mds::Encoding;
use shardstream_streamer::buffers::BufferPool;
use shardstream_streamer::order::{EpochOrder, OrderConfig, Rank, StreamState, World};
use shardstream_streamer::{settings, MemoryPlan, StreamPlan, StreamingDataset};

use crate::blocking;
use crate::decode::{Decoder, ParsedSample};
use crate::errors::{from_format, from_streamer};

use config::{open_error, OpenConfig, Opening};
use order::{PyOrder, PyPlan, PyRank, PyWorld};
use prefetch::NativePrefetch;
use state::PyState;
use stream::{parse_raw, NativeStream};

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

#[pymethods]
impl NativeDataset {
    #[new]
    /// Opens the dataset `config` describes (see [`OpenConfig`]).
    fn new(py: Python<'_>, config: OpenConfig) -> PyResult<Self> {
        // The binding keeps a share of the limit for the samples it holds between the engine
        // and Python (the memory plan: chunks in flight, kept batch buffers); the engine plans
        // the rest. `memory_limit=None` reads SHARDSTREAM_MEMORY_LIMIT like the engine does.
        let limit = settings::byte_size(
            config.memory_limit,
            settings::MEMORY_LIMIT_ENV,
            &|name: &str| std::env::var(name).ok(),
        )
        .map_err(open_error)?;
        let plan = MemoryPlan::with_binding(limit);
        let chunk_bytes = usize::try_from(plan.binding_chunk).unwrap_or(usize::MAX);
        let zero_copy = config.zero_copy;
        let Opening {
            config,
            streams,
            epoch_size,
        } = config.into_opening(Some(plan.engine))?;
        let allow_unsafe = config.allow_unsafe_types;
        let ds = blocking::run(py, move || match streams {
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
        let decoder = Arc::new(Decoder::new(py, names, encodings, zero_copy, allow_unsafe));
        // Python holds the previous batch while the next one is gathered, so one kept buffer
        // per column is what a steady loop reuses; the plan's batch pool bounds them.
        let pool_bytes = usize::try_from(plan.batch_pool).unwrap_or(usize::MAX);
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
        let ds = &self.ds;
        let now = py.detach(|| {
            ds.sample_now(index as u64)
                .map(|raw| parse_raw(raw, ds).map_err(from_format))
        });
        if let Some(parsed) = now {
            return self.decoder.to_python(py, parsed?);
        }
        let ds = Arc::clone(&self.ds);
        let parsed = blocking::run(py, move || -> PyResult<ParsedSample> {
            let raw = ds.sample(index as u64).map_err(from_streamer)?;
            parse_raw(raw, &ds).map_err(from_format)
        })??;
        self.decoder.to_python(py, parsed)
    }

    /// The number of global positions of `epoch` under `order` (before padding).
    fn epoch_len(&self, py: Python<'_>, order: &PyOrder, epoch: u64) -> PyResult<u64> {
        Ok(self.epoch_order(py, &order.config, epoch)?.global_len())
    }

    /// The position after `consumed` global positions of `epoch` under `order`.
    fn state(
        &self,
        py: Python<'_>,
        order: &PyOrder,
        epoch: u64,
        consumed: u64,
    ) -> PyResult<PyState> {
        let order = self.epoch_order(py, &order.config, epoch)?;
        Ok(PyState::new(&order, consumed))
    }

    /// Reads a state's JSON (`State.to_json`) and checks it against this dataset.
    fn parse_state(&self, py: Python<'_>, text: &str) -> PyResult<PyState> {
        let state: StreamState = serde_json::from_str(text)
            .map_err(|e| PyValueError::new_err(format!("invalid stream state: {e}")))?;
        let order = py
            .detach(|| state.resume(self.ds.shape()))
            .map_err(from_streamer)?;
        Ok(PyState::resumed(state, &order))
    }

    /// This process's counters (bytes fetched, cache hits, memory in use, ...).
    #[pyo3(signature = (node=false))]
    fn metrics<'py>(&self, py: Python<'py>, node: bool) -> PyResult<Bound<'py, PyDict>> {
        let m = if node {
            // The node's sum: every process that published into this dataset's node folder
            // (ranks, DataLoader workers, mounts), exited ones included.
            let dir = self.ds.cache_dir().to_path_buf();
            blocking::run(py, move || {
                shardstream_streamer::dataset::node_metrics(&dir)
            })?
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?
        } else {
            self.ds.metrics()
        };
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
    /// (`StreamingDataset::prefetch`). Returns at once. The part is that of the plan's rank's
    /// process: the plan's DataLoader workers, batch size and worker are not used.
    fn prefetch(
        &self,
        py: Python<'_>,
        plan: &PyPlan,
        max_shards: usize,
    ) -> PyResult<NativePrefetch> {
        // One process's part: its DataLoader workers split it by batch, and together need the
        // same shards first, whatever the batch size.
        let StreamPlan { world, rank, .. } = plan.plan;
        let plan = StreamPlan {
            world: World::new(world.nodes(), world.processes_per_node(), 1, 1)
                .map_err(from_streamer)?,
            rank: Rank { worker: 0, ..rank },
            ..plan.plan
        };
        let ds = Arc::clone(&self.ds);
        // Opening the cache folder may wait for another process's recovery of it.
        let prefetch =
            blocking::run(py, move || ds.prefetch(plan, max_shards))?.map_err(from_streamer)?;
        Ok(NativePrefetch { prefetch })
    }

    /// Every shard as the index describes it, in id order: `(name, stream, file, file_bytes,
    /// compression, raw_bytes, samples, first_sample, cache_bytes)` (`ShardInfo`).
    #[allow(clippy::type_complexity)]
    fn shard_infos(
        &self,
    ) -> Vec<(
        String,
        usize,
        String,
        u64,
        Option<&'static str>,
        u64,
        u64,
        u64,
        u64,
    )> {
        (0..self.ds.num_shards())
            .filter_map(|s| self.ds.shard_info(s))
            .map(|i| {
                let shardstream_streamer::dataset::ShardInfo {
                    name,
                    stream,
                    file,
                    file_bytes,
                    compression,
                    raw_bytes,
                    samples,
                    first_sample,
                    cache_bytes,
                } = i;
                (
                    name,
                    stream,
                    file,
                    file_bytes,
                    compression,
                    raw_bytes,
                    samples,
                    first_sample,
                    cache_bytes,
                )
            })
            .collect()
    }

    /// The global sample ids `epoch` takes under `order` (a repeated sample once per time it
    /// is taken), sorted, as little-endian `u64`s: the epoch's resampled streams, as Mosaic's
    /// `resample_streams` lists them. O(epoch) work, without the GIL.
    fn epoch_samples<'py>(
        &self,
        py: Python<'py>,
        order: &PyOrder,
        epoch: u64,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let order = self.epoch_order(py, &order.config, epoch)?;
        let bytes = py.detach(|| {
            let mut ids: Vec<u64> = (0..order.global_len())
                .filter_map(|pos| order.sample_at(pos).map(|s| s.sample))
                .collect();
            ids.sort_unstable();
            ids.iter()
                .flat_map(|id| id.to_le_bytes())
                .collect::<Vec<u8>>()
        });
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// Whether shard `shard` is readable without a download (read in place, or in the node's
    /// cache now).
    fn shard_cached(&self, py: Python<'_>, shard: usize) -> PyResult<bool> {
        let ds = Arc::clone(&self.ds);
        blocking::run(py, move || ds.shard_cached(shard))?.map_err(from_streamer)
    }

    /// Downloads shard `shard` into the node's cache (or joins the download of another process
    /// of the node) and waits until it is complete there, with the GIL released.
    fn prepare_shard(&self, py: Python<'_>, shard: usize) -> PyResult<()> {
        let ds = Arc::clone(&self.ds);
        blocking::run(py, move || ds.prepare_shard(shard))?.map_err(from_streamer)
    }

    /// Starts downloading `shards` into the node's cache in the background; returns at once.
    fn prepare_shards(&self, py: Python<'_>, shards: Vec<usize>) -> PyResult<NativePrefetch> {
        let ds = Arc::clone(&self.ds);
        let prefetch =
            blocking::run(py, move || ds.prepare_shards(shards))?.map_err(from_streamer)?;
        Ok(NativePrefetch { prefetch })
    }

    /// Deletes shard `shard` from the node's cache: the bytes freed, or `None` when a process
    /// of the node uses it.
    fn evict_shard(&self, py: Python<'_>, shard: usize) -> PyResult<Option<u64>> {
        let ds = Arc::clone(&self.ds);
        blocking::run(py, move || ds.evict_shard(shard))?.map_err(from_streamer)
    }

    /// Deletes the least recently used unused shard of this dataset from the node's cache;
    /// its id, or `None` when there is none.
    fn evict_coldest_shard(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        let ds = Arc::clone(&self.ds);
        blocking::run(py, move || ds.evict_coldest_shard())?.map_err(from_streamer)
    }

    /// Bytes of shard files in the node's cache folder now (every process of the node).
    fn cache_usage(&self, py: Python<'_>) -> PyResult<u64> {
        let ds = Arc::clone(&self.ds);
        blocking::run(py, move || ds.cache_usage())?.map_err(from_streamer)
    }

    /// Streams what `plan` says. `raw=True` yields column batches for
    /// `NativeStream.next_columns` instead of decoded samples.
    #[pyo3(signature = (plan, raw=false))]
    fn stream(&self, plan: &PyPlan, raw: bool) -> PyResult<NativeStream> {
        NativeStream::start(
            Arc::clone(&self.ds),
            Arc::clone(&self.decoder),
            Arc::clone(&self.batch_buffers),
            self.chunk_bytes,
            plan.plan,
            raw,
        )
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

/// Adds this module's classes and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fork::register(m)?;
    m.add_class::<NativeDataset>()?;
    m.add_class::<NativeStream>()?;
    m.add_class::<NativePrefetch>()?;
    m.add_class::<PyOrder>()?;
    m.add_class::<PyWorld>()?;
    m.add_class::<PyRank>()?;
    m.add_class::<PyPlan>()?;
    m.add_class::<PyState>()?;
    Ok(())
}
