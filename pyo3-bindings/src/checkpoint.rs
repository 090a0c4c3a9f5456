//! Checkpoint storage for `shardstream.checkpoint` (torch.distributed.checkpoint backends).
//!
//! The Python `StorageWriter`/`StorageReader` only adapt DCP's calls; the bytes go through here:
//! - [`CheckpointStore`]: one checkpoint root (`begin_save`, `rank_writer`, `commit`, `open`,
//!   `latest`, `list`, `verify`);
//! - [`RankFileWriter`]: one data file of one rank, streamed into the checkpoint crate's
//!   bounded, parallel, checksumming uploader (torch.save's output is copied out of its
//!   buffer with the GIL held, then into the part buffer with the GIL released);
//! - [`CheckpointFiles`]: ranged, checked reads of a committed checkpoint, or of a plain DCP
//!   directory written by torch's own `FileSystemWriter` (no manifest, so nothing to check).
//!
//! Every call that touches storage runs on the process's tokio runtime ([`crate::runtime`]) with
//! the GIL released ([`crate::blocking`]), and publishes the process's checkpoint counters into
//! the node's metrics when it returns ([`node_counters`]: under `shardstream run` they are in
//! the node's sum that `run` serves).

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use shardstream_checkpoint::checksum::{crc32c, crc32c_combine};
use shardstream_checkpoint::fetch::{cut, read_pieces, ReadTarget};
use shardstream_checkpoint::{
    CheckpointError as CoreError, CheckpointInfo, CheckpointMetrics, CheckpointReader,
    CheckpointRoot, CommitRequest, FileRecord, FileWriter, RankWriter, SaveAttempt, UploadConfig,
};
use shardstream_streamer::dataset::{NamedCounters, ProcessCounters};

use shardstream_storage::{named_options, Env, Location, StorageOptions};

use crate::runtime::runtime;
use crate::{blocking, errors};

/// Spans fetched at once by one `read_ranges` call (each is itself cut into parallel GETs).
const SPAN_CONCURRENCY: usize = 4;
/// Piece size of reads of a plain DCP directory (no manifest, so no parts to align to).
const PLAIN_CHUNK: u64 = 16 << 20;
/// Pieces of one span of a plain DCP directory read at once.
const PLAIN_CONCURRENCY: usize = 8;
/// Largest span of touching items fetched as one range.
const MAX_SPAN: u64 = 256 << 20;

/// Runs the future `make` returns on the process runtime with the GIL released and maps its
/// error (see [`blocking::block_on`]: Ctrl-C raises `KeyboardInterrupt` and drops the future,
/// which aborts its multipart uploads).
fn block_on<T, F>(py: Python<'_>, make: impl FnOnce() -> F + Send) -> PyResult<T>
where
    T: Send,
    F: std::future::Future<Output = Result<T, CoreError>>,
{
    let result = blocking::block_on(py, make);
    node_counters().publish(checkpoint_counters);
    result?.map_err(to_py)
}

/// This process's checkpoint counters in the node folder that `shardstream run` exported
/// (nothing outside `run`): one file per process, whatever the number of roots opened.
fn node_counters() -> &'static ProcessCounters {
    static COUNTERS: OnceLock<ProcessCounters> = OnceLock::new();
    COUNTERS.get_or_init(ProcessCounters::from_env)
}

/// The process-wide checkpoint counters under their metric names.
fn checkpoint_counters() -> NamedCounters {
    NamedCounters::new(CheckpointMetrics::global().snapshot().named())
}

/// The one mapping from checkpoint errors to the Python exception tree.
fn to_py(e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::ChecksumMismatch { .. } | CoreError::SizeMismatch { .. } => {
            errors::HASH_MISMATCH.new_err(msg)
        }
        CoreError::InvalidManifest { .. } => errors::CORRUPT_DATA.new_err(msg),
        CoreError::MissingObject { .. } => errors::NOT_FOUND.new_err(msg),
        CoreError::Store { .. } | CoreError::Location { .. } => errors::StorageError::new_err(msg),
        _ => errors::CheckpointError::new_err(msg),
    }
}

/// A checkpoint root at `url` with `storage_options` over the process environment.
fn open_root(url: &str, storage_options: &[(String, String)]) -> Result<CheckpointRoot, CoreError> {
    let location = named_options::apply(url, storage_options, StorageOptions::default())
        .and_then(|options| Location::open_with(url, &options, &Env::from_process()))
        .map_err(|source| CoreError::Location {
            url: url.to_owned(),
            source: Box::new(source),
        })?;
    Ok(CheckpointRoot::from_location(&location))
}

fn json_err(what: &str, e: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("{what}: {e}"))
}

/// A checkpoint root: `<root>/<checkpoint-id>/…` in an object store or directory.
#[pyclass(module = "shardstream._native", frozen)]
pub struct CheckpointStore {
    root: CheckpointRoot,
    url: String,
}

#[pymethods]
impl CheckpointStore {
    /// Opens a root URL (`s3://…`, `gs://…`, `az://…`, `file://…`) or a local path, with
    /// per-call storage options (`(name, value)` pairs, see `shardstream_storage::named_options`).
    #[new]
    #[pyo3(signature = (url, storage_options=Vec::new()))]
    fn new(url: &str, storage_options: Vec<(String, String)>) -> PyResult<Self> {
        let root = open_root(url, &storage_options).map_err(to_py)?;
        node_counters().start(checkpoint_counters);
        Ok(Self {
            root,
            url: url.to_owned(),
        })
    }

    /// The URL it was opened with.
    #[getter]
    fn url(&self) -> &str {
        &self.url
    }

    fn __repr__(&self) -> String {
        format!("CheckpointStore({:?})", self.url)
    }

    /// Coordinator: starts a save of `id` and returns the attempt directory name. Raises
    /// `CheckpointError` if `id` is already committed.
    fn begin_save(&self, py: Python<'_>, id: &str) -> PyResult<String> {
        let a = block_on(py, || self.root.begin_save(id))?;
        Ok(a.attempt().to_owned())
    }

    /// A writer for file `name` of `rank` in attempt `attempt` of checkpoint `id`, with a
    /// buffer budget of its own.
    #[pyo3(signature = (id, attempt, rank, name, part_size=None, memory_budget=None, max_concurrent_requests=None))]
    #[allow(clippy::too_many_arguments)]
    fn create_file(
        &self,
        id: &str,
        attempt: &str,
        rank: u32,
        name: &str,
        part_size: Option<u64>,
        memory_budget: Option<u64>,
        max_concurrent_requests: Option<usize>,
    ) -> PyResult<RankFileWriter> {
        self.rank_writer(
            id,
            attempt,
            rank,
            part_size,
            memory_budget,
            max_concurrent_requests,
            None,
        )?
        .create(name, None)
    }

    /// The writer of `rank`'s files in attempt `attempt` of checkpoint `id`: every file it
    /// creates shares one buffer budget and one request cap, so several files can upload at
    /// once (`RankFileWriter.start_finish`) while host memory stays within `memory_budget`.
    #[pyo3(signature = (id, attempt, rank, part_size=None, memory_budget=None, max_concurrent_requests=None, single_put_max=None))]
    #[allow(clippy::too_many_arguments)] // the Python keyword arguments, one each
    fn rank_writer(
        &self,
        id: &str,
        attempt: &str,
        rank: u32,
        part_size: Option<u64>,
        memory_budget: Option<u64>,
        max_concurrent_requests: Option<usize>,
        single_put_max: Option<u64>,
    ) -> PyResult<CheckpointRankWriter> {
        let mut config = UploadConfig::default();
        if let Some(p) = part_size {
            config.part_size = p;
            config.memory_budget = config.memory_budget.max(2 * p);
        }
        if let Some(b) = memory_budget {
            config.memory_budget = b;
        }
        if let Some(c) = max_concurrent_requests {
            config.max_concurrent_requests = c;
        }
        if let Some(m) = single_put_max {
            config.single_put_max = m;
        }
        let attempt = SaveAttempt::new(id, attempt).map_err(to_py)?;
        let writer = self
            .root
            .rank_writer(&attempt, rank, &config)
            .map_err(to_py)?;
        Ok(CheckpointRankWriter {
            writer,
            part_size: config.part_size,
        })
    }

    /// Coordinator: commits `id` (attempt `attempt`) with every rank's file records (JSON
    /// strings from `RankFileWriter.finish`). `metadata_json` is a JSON object stored in the
    /// manifest; `aliases` are `(root name, attempt file name)` pairs published after the commit.
    /// Returns the manifest as JSON.
    #[pyo3(signature = (id, attempt, records, world_size, step=None, metadata_json=None, aliases=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        py: Python<'_>,
        id: &str,
        attempt: &str,
        records: Vec<String>,
        world_size: u32,
        step: Option<u64>,
        metadata_json: Option<&str>,
        aliases: Vec<(String, String)>,
    ) -> PyResult<String> {
        let attempt = SaveAttempt::new(id, attempt).map_err(to_py)?;
        let records = records
            .iter()
            .map(|r| serde_json::from_str::<FileRecord>(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| json_err("file record", e))?;
        let metadata = match metadata_json {
            Some(s) => serde_json::from_str(s).map_err(|e| json_err("manifest metadata", e))?,
            None => serde_json::Map::new(),
        };
        let req = CommitRequest {
            records,
            world_size,
            step,
            metadata,
            aliases,
        };
        let manifest = block_on(py, || self.root.commit(&attempt, req))?;
        manifest
            .to_json()
            .map_err(to_py)
            .and_then(|v| String::from_utf8(v).map_err(|e| PyValueError::new_err(e.to_string())))
    }

    /// The committed checkpoints, oldest first, as dicts.
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let infos = block_on(py, || self.root.list())?;
        let dicts = infos
            .iter()
            .map(|i| info_dict(py, i))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, dicts)
    }

    /// The newest committed checkpoint as a dict, or `None`.
    fn latest<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match block_on(py, || self.root.latest())? {
            Some(i) => Ok(Some(info_dict(py, &i)?)),
            None => Ok(None),
        }
    }

    /// Reads every byte of `id` and checks it; returns `(files, bytes, [problems])`.
    fn verify(&self, py: Python<'_>, id: &str) -> PyResult<(usize, u64, Vec<String>)> {
        let r = block_on(py, || self.root.verify(id))?;
        let failures = r.failures.iter().map(|f| f.to_string()).collect();
        Ok((r.files_checked, r.bytes_checked, failures))
    }

    /// Opens checkpoint `id` for reading: committed (manifest, checked reads), or, when it has
    /// no manifest but a DCP `.metadata` (torch's `FileSystemWriter`), as a plain directory
    /// whose reads cannot be checked.
    fn open(&self, py: Python<'_>, id: &str) -> PyResult<CheckpointFiles> {
        let root = self.root.clone();
        let id_owned = id.to_owned();
        let source = block_on(py, move || async move {
            match root.open(&id_owned).await {
                Ok(r) => Ok(Source::Committed(r)),
                Err(CoreError::NotCommitted { id, path }) => {
                    let dir = root.checkpoint_dir(&id);
                    let meta = shardstream_checkpoint::layout::join(&dir, ".metadata");
                    match root.store().head(&meta).await {
                        Ok(_) => Ok(Source::Plain {
                            store: root.store().clone(),
                            dir,
                            local_dir: root.local_root().map(|r| r.join(&id)),
                        }),
                        Err(object_store::Error::NotFound { .. }) => {
                            Err(CoreError::NotCommitted { id, path })
                        }
                        Err(e) => Err(CoreError::store("head", &meta, e)),
                    }
                }
                Err(e) => Err(e),
            }
        })?;
        Ok(CheckpointFiles {
            source: Arc::new(source),
        })
    }
}

fn info_dict<'py>(py: Python<'py>, i: &CheckpointInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", &i.id)?;
    d.set_item("step", i.step)?;
    d.set_item("created_unix_ms", i.created_unix_ms)?;
    d.set_item("world_size", i.world_size)?;
    d.set_item("files", i.files)?;
    d.set_item("total_bytes", i.total_bytes)?;
    d.set_item("attempt", &i.attempt)?;
    Ok(d)
}

/// One rank's writer in one save attempt (from `CheckpointStore.rank_writer`).
#[pyclass(module = "shardstream._native", frozen)]
pub struct CheckpointRankWriter {
    writer: RankWriter,
    part_size: u64,
}

#[pymethods]
impl CheckpointRankWriter {
    /// Starts file `name` (relative to the attempt directory). `size`, the file's expected size
    /// (an upper bound), plans its upload: one PUT up to the single-PUT bound, else even parts.
    #[pyo3(signature = (name, size=None))]
    fn create(&self, name: &str, size: Option<u64>) -> PyResult<RankFileWriter> {
        let mut file = self.writer.create(name).map_err(to_py)?;
        if let Some(n) = size {
            file = file.with_expected_size(n).map_err(to_py)?;
        }
        Ok(RankFileWriter {
            inner: Mutex::new(Some(file)),
            name: name.to_owned(),
            item_crc: Mutex::new(0),
        })
    }

    /// The part size: a file no larger goes up in one PUT.
    #[getter]
    fn part_size(&self) -> u64 {
        self.part_size
    }
}

/// One data file being uploaded. `write` appends an item and returns its CRC32C; `finish`
/// completes the upload and returns the file's record as JSON. Dropped unfinished, its
/// multipart upload is aborted.
#[pyclass(module = "shardstream._native", frozen)]
pub struct RankFileWriter {
    inner: Mutex<Option<FileWriter>>,
    name: String,
    /// CRC32C of the bytes written since the last `take_item_crc`.
    item_crc: Mutex<u32>,
}

impl RankFileWriter {
    fn take(&self) -> PyResult<FileWriter> {
        self.inner
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("file writer lock poisoned"))?
            .take()
            .ok_or_else(|| {
                errors::CheckpointError::new_err(format!(
                    "checkpoint file {}: already finished or failed",
                    self.name
                ))
            })
    }

    fn put_back(&self, w: FileWriter) -> PyResult<()> {
        *self
            .inner
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("file writer lock poisoned"))? = Some(w);
        Ok(())
    }
}

#[pymethods]
impl RankFileWriter {
    /// Appends `data` (any contiguous buffer: bytes, a memoryview of torch.save's output) and
    /// returns its CRC32C. The bytes are copied out of the Python buffer with the GIL held
    /// (at most 16 MiB at a time from `torch.save`), and uploaded with it released: the
    /// buffer's owner (a tensor another thread trains on) may change it as soon as Python
    /// runs again, so no reference to its memory outlives the GIL. Blocks only while the
    /// upload's memory budget is full; Ctrl-C while it blocks raises `KeyboardInterrupt` and
    /// aborts the file's multipart upload.
    fn write(&self, py: Python<'_>, data: PyBuffer<u8>) -> PyResult<u32> {
        if !data.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "checkpoint file {}: write() needs a contiguous buffer",
                self.name
            )));
        }
        let len = data.len_bytes() as u64;
        // A copy made while no Python thread can write the buffer (issue 40, row 14: a slice of
        // it read with the GIL released raced with a thread mutating it, and the CRC recorded
        // could disagree with the bytes uploaded).
        let owned = data.to_vec(py)?;
        // Released with the GIL held (a `PyBuffer` would otherwise take it to drop).
        drop(data);
        let mut w = self.take()?;
        let bytes = owned.as_slice();
        let res = block_on(py, || async {
            let crc = crc32c(bytes);
            w.write(bytes).await.map(|()| crc)
        });
        match res {
            Ok(crc) => {
                self.put_back(w)?;
                let mut item = self
                    .item_crc
                    .lock()
                    .map_err(|_| errors::CheckpointError::new_err("file writer lock poisoned"))?;
                *item = crc32c_combine(*item, crc, len);
                Ok(crc)
            }
            // Dropping the writer aborts its multipart upload (inside the runtime); the file
            // is then finished for good, so no manifest can ever list it.
            Err(e) => {
                let _guard = runtime()?.enter();
                drop(w);
                Err(e)
            }
        }
    }

    /// The CRC32C of everything written since the previous call (one item written in several
    /// `write` calls), and starts the next item.
    fn take_item_crc(&self) -> PyResult<u32> {
        let mut item = self
            .item_crc
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("file writer lock poisoned"))?;
        Ok(std::mem::take(&mut *item))
    }

    /// Bytes written so far.
    fn bytes_written(&self) -> PyResult<u64> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("file writer lock poisoned"))?;
        Ok(guard.as_ref().map_or(0, |w| w.bytes_written()))
    }

    /// Uploads the rest and returns the file's record (JSON) for the commit.
    fn finish(&self, py: Python<'_>) -> PyResult<String> {
        let w = self.take()?;
        let record = block_on(py, move || w.finish())?;
        serde_json::to_string(&record).map_err(|e| json_err("file record", e))
    }

    /// Starts uploading the rest and completing the file in the background, and returns at
    /// once; `PendingFinish.wait()` returns the record. Lets the next file fill while this
    /// one goes up (within the rank writer's shared budget).
    fn start_finish(&self) -> PyResult<PendingFinish> {
        let w = self.take()?;
        let task = runtime()?.spawn(w.finish());
        Ok(PendingFinish {
            task: Mutex::new(Some(task)),
        })
    }

    /// Abandons the file (its multipart upload is aborted). Idempotent.
    fn abort(&self) -> PyResult<()> {
        let w = self
            .inner
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("file writer lock poisoned"))?
            .take();
        if let Some(w) = w {
            let _guard = runtime()?.enter();
            drop(w);
        }
        Ok(())
    }
}

impl Drop for RankFileWriter {
    fn drop(&mut self) {
        let w = self.inner.get_mut().ok().and_then(|o| o.take());
        if let (Some(w), Ok(rt)) = (w, runtime()) {
            let _guard = rt.enter();
            drop(w);
        }
    }
}

enum Source {
    Committed(CheckpointReader),
    Plain {
        store: Arc<dyn ObjectStore>,
        dir: Path,
        /// The checkpoint directory on local disk, when the root is one (read with `pread`).
        local_dir: Option<std::path::PathBuf>,
    },
}

impl Source {
    async fn read(&self, path: &str, range: Range<u64>) -> Result<Bytes, CoreError> {
        match self {
            Source::Committed(r) => r.read_range(path, range).await,
            Source::Plain {
                store,
                dir,
                local_dir,
            } => {
                shardstream_checkpoint::layout::validate_relative_path(path)?;
                let full = shardstream_checkpoint::layout::join(dir, path);
                let local = local_dir
                    .as_ref()
                    .map(|d| path.split('/').fold(d.clone(), |p, part| p.join(part)));
                let target = ReadTarget {
                    store,
                    path: &full,
                    local: local.as_deref(),
                };
                let pieces = cut(range, PLAIN_CHUNK, 0);
                let metrics = CheckpointMetrics::global();
                let (bytes, _) = read_pieces(target, &pieces, PLAIN_CONCURRENCY, &metrics).await?;
                Ok(bytes)
            }
        }
    }

    async fn read_whole(&self, path: &str) -> Result<Bytes, CoreError> {
        match self {
            Source::Committed(r) => r.read_file(path).await,
            Source::Plain { store, dir, .. } => {
                let full = shardstream_checkpoint::layout::join(dir, path);
                let got = store
                    .get(&full)
                    .await
                    .map_err(|e| CoreError::store("get", &full, e))?;
                got.bytes()
                    .await
                    .map_err(|e| CoreError::store("get", &full, e))
            }
        }
    }

    /// The bytes of a read of `range` that the source itself checks (the whole parts of a
    /// committed file); an item inside them needs no check of its own.
    fn checked_within(&self, path: &str, range: Range<u64>) -> Range<u64> {
        match self {
            Source::Committed(r) => r
                .checked_within(path, range.clone())
                .unwrap_or(range.start..range.start),
            Source::Plain { .. } => range.start..range.start,
        }
    }

    fn object_name(&self, path: &str) -> String {
        match self {
            Source::Committed(r) => r
                .object_path(path)
                .map(|p| p.to_string())
                .unwrap_or_else(|_| path.to_owned()),
            Source::Plain { dir, .. } => {
                shardstream_checkpoint::layout::join(dir, path).to_string()
            }
        }
    }
}

/// Bytes read by the native side, lent to Python without a copy: `memoryview(buf)` is a
/// read-only view of them, and they live as long as any view does.
#[pyclass(module = "shardstream._native", frozen)]
pub struct CheckpointBuffer {
    data: Bytes,
}

// The buffer protocol needs raw pointers: this is the one unsafe block of the checkpoint
// binding. It is sound because `data` is immutable for the object's lifetime (a frozen class
// over `Bytes`), the view is read-only, and `PyBuffer_FillInfo` takes a reference to the
// object, so the memory outlives every view.
#[allow(unsafe_code)]
#[pymethods]
impl CheckpointBuffer {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// # Safety
    /// Called by CPython with a valid `Py_buffer` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        if flags & pyo3::ffi::PyBUF_WRITABLE != 0 {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "checkpoint buffers are read-only",
            ));
        }
        let data = &slf.get().data;
        let len = isize::try_from(data.len())
            .map_err(|_| pyo3::exceptions::PyBufferError::new_err("buffer too large"))?;
        // SAFETY: see the comment on this impl; readonly = 1.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::os::raw::c_void,
                len,
                1,
                flags,
            )
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Nothing to release: the memory is owned by the object.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// The completion of one file started by `RankFileWriter.start_finish`. Dropped or cancelled
/// unfinished, the upload is aborted (nothing is committed without its record anyway).
#[pyclass(module = "shardstream._native", frozen)]
pub struct PendingFinish {
    task: Mutex<Option<tokio::task::JoinHandle<Result<FileRecord, CoreError>>>>,
}

#[pymethods]
impl PendingFinish {
    /// The file's record (JSON) for the commit, once uploaded (Ctrl-C while waiting raises
    /// `KeyboardInterrupt` and aborts the upload).
    fn wait(&self, py: Python<'_>) -> PyResult<String> {
        let task = self
            .task
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("finish lock poisoned"))?
            .take()
            .ok_or_else(|| errors::CheckpointError::new_err("this upload was already waited on"))?;
        let abort = task.abort_handle();
        let record = block_on(py, move || async move {
            task.await.map_err(|e| CoreError::Store {
                op: "put",
                path: Path::from("upload task"),
                source: object_store::Error::JoinError { source: e },
            })?
        });
        if record.is_err() {
            abort.abort();
        }
        serde_json::to_string(&record?).map_err(|e| json_err("file record", e))
    }

    /// Aborts the upload if it has not finished. Idempotent.
    fn cancel(&self) -> PyResult<()> {
        let task = self
            .task
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("finish lock poisoned"))?
            .take();
        if let Some(task) = task {
            task.abort();
        }
        Ok(())
    }
}

impl Drop for PendingFinish {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(|t| t.take()) {
            task.abort();
        }
    }
}

/// The background task of a [`PendingRead`]: every item's bytes, in request order.
type ReadTask = tokio::task::JoinHandle<Result<Vec<Bytes>, CoreError>>;

/// A read started by `CheckpointFiles.start_read`, running on the native runtime while
/// Python does other work (decodes the previous batch). `wait` returns its buffers; dropping
/// it unfinished cancels the read.
#[pyclass(module = "shardstream._native", frozen)]
pub struct PendingRead {
    task: Mutex<Option<ReadTask>>,
}

#[pymethods]
impl PendingRead {
    /// The bytes of every item, in request order, as `CheckpointBuffer`s (Ctrl-C while
    /// waiting raises `KeyboardInterrupt` and cancels the read).
    fn wait(&self, py: Python<'_>) -> PyResult<Vec<CheckpointBuffer>> {
        let task = self
            .task
            .lock()
            .map_err(|_| errors::CheckpointError::new_err("read lock poisoned"))?
            .take()
            .ok_or_else(|| errors::CheckpointError::new_err("this read was already waited on"))?;
        let abort = task.abort_handle();
        let got = block_on(py, move || async move {
            task.await.map_err(|e| CoreError::Store {
                op: "get",
                path: Path::from("read task"),
                source: object_store::Error::JoinError { source: e },
            })?
        });
        if got.is_err() {
            abort.abort();
        }
        Ok(got?
            .into_iter()
            .map(|data| CheckpointBuffer { data })
            .collect())
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(|t| t.take()) {
            task.abort();
        }
    }
}

/// The files of one checkpoint, opened for reading.
#[pyclass(module = "shardstream._native", frozen)]
pub struct CheckpointFiles {
    source: Arc<Source>,
}

#[pymethods]
impl CheckpointFiles {
    /// True when the checkpoint has a shardstream manifest (every read is checked).
    #[getter]
    fn committed(&self) -> bool {
        matches!(*self.source, Source::Committed(_))
    }

    /// The manifest as JSON, or `None` for a plain DCP directory.
    fn manifest_json(&self) -> PyResult<Option<String>> {
        match &*self.source {
            Source::Committed(r) => {
                let v = r.manifest().to_json().map_err(to_py)?;
                String::from_utf8(v)
                    .map(Some)
                    .map_err(|e| PyValueError::new_err(e.to_string()))
            }
            Source::Plain { .. } => Ok(None),
        }
    }

    /// All of file `path` (relative to the checkpoint directory), checked when committed.
    fn read_file<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let b = block_on(py, || self.source.read_whole(path))?;
        Ok(PyBytes::new(py, &b))
    }

    /// Reads `(path, offset, length, crc32c or None)` items and returns their bytes in order,
    /// as `CheckpointBuffer`s (`memoryview(buf)` reads them without a copy). Items that touch
    /// or overlap in one file are fetched as one span (cut into part-aligned ranged GETs, or
    /// `pread`s for a local directory, in parallel, straight into one buffer), so a full load
    /// makes few large requests and a partial one fetches only the items asked for. A given
    /// CRC32C is checked against the item's bytes unless the span's own part checksums already
    /// covered them; a mismatch raises `HashMismatchError` naming the object and the range.
    fn read_ranges(
        &self,
        py: Python<'_>,
        requests: Vec<(String, u64, u64, Option<u32>)>,
    ) -> PyResult<Vec<CheckpointBuffer>> {
        self.start_read(requests)?.wait(py)
    }

    /// Like `read_ranges`, but returns at once: the read runs in the background and
    /// `PendingRead.wait()` returns its buffers.
    fn start_read(&self, requests: Vec<(String, u64, u64, Option<u32>)>) -> PyResult<PendingRead> {
        let source = self.source.clone();
        let task = runtime()?.spawn(read_items(source, requests));
        Ok(PendingRead {
            task: Mutex::new(Some(task)),
        })
    }
}

/// One ranged fetch covering several requested items of one file.
struct Span {
    path: String,
    start: u64,
    end: u64,
    /// Indices into the request list.
    members: Vec<usize>,
}

/// Groups items into spans of touching or overlapping ranges per file (at most `MAX_SPAN`).
fn spans(requests: &[(String, u64, u64, Option<u32>)]) -> Result<Vec<Span>, CoreError> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| (&requests[a].0, requests[a].1).cmp(&(&requests[b].0, requests[b].1)));
    let mut out: Vec<Span> = Vec::new();
    for i in order {
        let (path, off, len, _) = &requests[i];
        let end = off
            .checked_add(*len)
            .ok_or_else(|| CoreError::RangeOutOfBounds {
                path: Path::from(path.as_str()),
                start: *off,
                end: u64::MAX,
                size: u64::MAX,
            })?;
        match out.last_mut() {
            Some(s) if s.path == *path && *off <= s.end && end.max(s.end) - s.start <= MAX_SPAN => {
                s.end = s.end.max(end);
                s.members.push(i);
            }
            _ => out.push(Span {
                path: path.clone(),
                start: *off,
                end,
                members: vec![i],
            }),
        }
    }
    Ok(out)
}

async fn read_items(
    source: Arc<Source>,
    requests: Vec<(String, u64, u64, Option<u32>)>,
) -> Result<Vec<Bytes>, CoreError> {
    let spans = spans(&requests)?;
    let fetched: Vec<(Span, Bytes, Range<u64>)> =
        futures::stream::iter(spans.into_iter().map(|span| {
            let source = source.clone();
            async move {
                let b = source.read(&span.path, span.start..span.end).await?;
                let checked = source.checked_within(&span.path, span.start..span.end);
                Ok::<_, CoreError>((span, b, checked))
            }
        }))
        .buffer_unordered(SPAN_CONCURRENCY)
        .try_collect()
        .await?;
    let mut out = vec![Bytes::new(); requests.len()];
    for (span, bytes, checked) in fetched {
        for i in span.members {
            let (path, off, len, crc) = &requests[i];
            let lo = usize::try_from(off - span.start).unwrap_or(usize::MAX);
            let hi = usize::try_from(off + len - span.start).unwrap_or(usize::MAX);
            if hi > bytes.len() {
                return Err(CoreError::SizeMismatch {
                    path: Path::from(source.object_name(path)),
                    expected: span.end - span.start,
                    actual: bytes.len() as u64,
                });
            }
            let item = bytes.slice(lo..hi);
            let covered = checked.start <= *off && off + len <= checked.end;
            if let (Some(expected), false) = (*crc, covered) {
                let actual = crc32c(&item);
                if actual != expected {
                    return Err(CoreError::ChecksumMismatch {
                        path: Path::from(format!(
                            "{} bytes {off}..{}",
                            source.object_name(path),
                            off + len
                        )),
                        part: None,
                        expected,
                        actual,
                    });
                }
            }
            if let Some(slot) = out.get_mut(i) {
                *slot = item;
            }
        }
    }
    Ok(out)
}

/// Adds this module's classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CheckpointStore>()?;
    m.add_class::<RankFileWriter>()?;
    m.add_class::<CheckpointFiles>()?;
    // `CheckpointBuffer` and `PendingRead` are only ever returned, never constructed from
    // Python, so they are not module attributes.
    Ok(())
}
