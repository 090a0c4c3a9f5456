//! `Buffer`: read-only bytes owned by Rust, handed to Python through the buffer protocol; and
//! `ColumnBuffer`, a batch's numeric column, which Python owns and may write.
//!
//! Sample bytes reach Python without a copy: a `Buffer` holds a [`Bytes`] (a slice of the
//! streamer's read buffer, or a buffer this binding filled with the GIL released) and lends it
//! to `memoryview`, `numpy.frombuffer`, `torch.frombuffer` and anything else that takes a
//! buffer. `bytes(buf)` makes a copy when a real `bytes` object is needed.
//!
//! A buffer keeps alive the memory it points into: for a slice of a sample, that is the read
//! the sample came from (at most one run of consecutive samples, 1 MiB, or the sample itself
//! when larger). Drop buffers you are done with, as you would drop `bytes`.

// The buffer protocol is a C interface (`__getbuffer__` fills a raw `Py_buffer`); this module
// is the one place of the binding that needs `unsafe`, and each use says why it holds.
#![allow(unsafe_code)]

use std::os::raw::c_int;

use bytes::Bytes;
use pyo3::exceptions::{PyBufferError, PyIndexError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PySlice, PyTuple};
use shardstream_streamer::buffers::PooledBuffer;
use shardstream_streamer::RawSample;
use std::sync::Arc;

use crate::arena::{SlotAddress, SlotBytes};

/// Read-only bytes owned by Rust (exported as `shardstream.Buffer`).
#[pyclass(module = "shardstream._native", name = "Buffer", frozen)]
pub struct Buffer {
    data: Bytes,
    /// The worker-arena slot `data` lies in, when it does (see `crate::arena`): pickled for a
    /// DataLoader's queue, such a buffer sends its slot's address instead of its bytes.
    slot: Option<Arc<SlotBytes>>,
}

impl Buffer {
    /// A buffer over `data` (no copy).
    pub fn new(data: Bytes) -> Self {
        Buffer { data, slot: None }
    }

    /// A buffer over a slot of a worker arena (no copy).
    pub fn in_slot(slot: SlotBytes) -> Self {
        let slot = Arc::new(slot);
        Buffer {
            data: Bytes::from_owner(SharedSlot(Arc::clone(&slot))),
            slot: Some(slot),
        }
    }

    /// Column `column` of `sample`, without a copy: the buffer shares the sample's read.
    pub fn column(sample: &RawSample, column: usize) -> Option<Self> {
        // `column()` returns a slice of the sample's `Arc`-held read; keeping a clone of the
        // sample keeps that read alive, and its bytes are never written after the read.
        if column >= sample.num_columns() {
            return None;
        }
        Some(Buffer::new(Bytes::from_owner(ColumnOf {
            sample: sample.clone(),
            column,
        })))
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }
}

/// A slot's bytes as an owner for [`Bytes::from_owner`], shared with the `Buffer` that may
/// send the slot's address.
struct SharedSlot(Arc<SlotBytes>);

impl AsRef<[u8]> for SharedSlot {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().as_ref()
    }
}

/// One column of a sample, as an owner for [`Bytes::from_owner`].
struct ColumnOf {
    sample: RawSample,
    column: usize,
}

impl AsRef<[u8]> for ColumnOf {
    fn as_ref(&self) -> &[u8] {
        // `Buffer::column` checked the index; the same sample always gives the same slice.
        self.sample.column(self.column).unwrap_or(&[])
    }
}

#[pymethods]
impl Buffer {
    /// Exports the bytes read-only (`PyBUF_WRITABLE` requests fail).
    ///
    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no buffer view to fill"));
        }
        if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a shardstream Buffer is read-only"));
        }
        let data = slf.get().data.as_ref();
        // SAFETY: the pointer stays valid for the view's whole life. `fill_view` stores a new
        // reference to `slf` in `view.obj`, so the `Buffer` (and the `Bytes` it owns) lives
        // until the consumer releases the view; the struct is frozen and `Bytes` is immutable,
        // so the bytes behind the pointer never move or change. The view is read-only, so no
        // consumer writes through the `*mut` cast either.
        unsafe {
            fill_view(
                slf.py(),
                slf.as_ptr(),
                view,
                data.as_ptr().cast_mut(),
                data.len(),
                true,
                flags,
            )
        }
    }

    /// Nothing to free: the view's format string is static and CPython drops `view.obj`.
    ///
    /// # Safety
    /// Called by CPython with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.data.len()
    }

    /// A `bytes` copy.
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    /// `buf[i]` is an int (as for `bytes`); `buf[a:b]` is a `Buffer` over the same bytes.
    fn __getitem__<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let n = self.data.len();
        if let Ok(slice) = key.cast::<PySlice>() {
            let ind = slice.indices(n as isize)?;
            if ind.step == 1 {
                let (start, stop) = (ind.start as usize, (ind.stop.max(ind.start)) as usize);
                return Ok(Buffer::new(self.data.slice(start..stop))
                    .into_pyobject(py)?
                    .into_any()
                    .unbind());
            }
            let picked: Vec<u8> = (0..ind.slicelength)
                .map(|k| self.data[(ind.start + k as isize * ind.step) as usize])
                .collect();
            return Ok(PyBytes::new(py, &picked).into_any().unbind());
        }
        let i: isize = key.extract()?;
        let at = if i < 0 { i + n as isize } else { i };
        if at < 0 || at as usize >= n {
            return Err(PyIndexError::new_err(format!(
                "index {i} out of range for a buffer of {n} bytes"
            )));
        }
        Ok(self.data[at as usize]
            .into_pyobject(py)?
            .into_any()
            .unbind())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<Buffer>() {
            Ok(b) => b.get().data == self.data,
            Err(_) => other
                .cast::<PyBytes>()
                .is_ok_and(|b| b.as_bytes() == self.data.as_ref()),
        }
    }

    /// For the reducer a DataLoader worker registers with `ForkingPickler`: the address of the
    /// arena slot the bytes lie in, `(pid, fd, inode, token, slot, generation, len)`, counting
    /// the copy about to be sent as a holder of the slot until a receiver attaches it (an
    /// address never attached keeps its slot held); `None` for a buffer outside an arena (or a
    /// slice of one), which is sent as `bytes`.
    fn _share(&self) -> Option<SlotAddress> {
        let slot = self.slot.as_ref()?;
        Some(slot.share())
    }

    /// Pickles as `bytes` (a DataLoader worker sends it to the main process that way).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let bytes_type = py.get_type::<PyBytes>();
        (bytes_type, (PyBytes::new(py, &self.data),)).into_pyobject(py)
    }

    fn __repr__(&self) -> String {
        format!("shardstream.Buffer({} bytes)", self.data.len())
    }
}

/// The bytes of one batch's fixed-size numeric column (exported as
/// `shardstream._native.ColumnBuffer`), owned by that batch alone and exported *writable*: the
/// numpy arrays `iter_batches` makes over it are writable, as a plain dict's arrays are. torch's
/// default conversion (`DataLoader(..., batch_size=None)` applies it to every batch) turns them
/// into tensors in place; over a read-only buffer it warns that writing to the tensor is
/// undefined behaviour. Unlike a [`Buffer`], it is never sliced, shared between batches or read
/// by Rust after it is filled: Python owns its bytes, and its allocation goes back to the batch
/// pool when the last array over it is dropped.
#[pyclass(module = "shardstream._native", name = "ColumnBuffer")]
pub struct ColumnBuffer {
    data: PooledBuffer,
}

impl ColumnBuffer {
    /// A column gathered into `data`.
    pub fn new(data: PooledBuffer) -> Self {
        ColumnBuffer { data }
    }
}

#[pymethods]
impl ColumnBuffer {
    /// Exports the bytes writable.
    ///
    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(
        mut slf: PyRefMut<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no buffer view to fill"));
        }
        let data = slf.data.as_mut_slice();
        let (ptr, len) = (data.as_mut_ptr(), data.len());
        // SAFETY: `fill_view` stores a new reference to `slf` in `view.obj`, so the object,
        // and the allocation it owns (never resized once filled), live until the consumer
        // releases the view. The pointer comes from a `&mut` borrow: after this call the bytes
        // are reached only through exported views (Python code, under the GIL), as a
        // `bytearray`'s are; no Rust code reads or writes them until the object is dropped.
        unsafe { fill_view(slf.py(), slf.as_ptr(), view, ptr, len, false, flags) }
    }

    /// Nothing to free: the view's format string is static and CPython drops `view.obj`.
    ///
    /// # Safety
    /// Called by CPython with the view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __repr__(&self) -> String {
        format!("shardstream.ColumnBuffer({} bytes)", self.data.len())
    }
}

/// Fills `view` with `len` bytes at `ptr`, owned by `owner` (`PyBuffer_FillInfo`, which keeps a
/// reference to `owner` in the view and refuses a writable request for a read-only view).
///
/// # Safety
/// `view` is the non-null view CPython passed to `__getbuffer__`, and `ptr..ptr + len` stays
/// valid (and, when `readonly`, unwritten) for as long as `owner` lives.
unsafe fn fill_view(
    py: Python<'_>,
    owner: *mut ffi::PyObject,
    view: *mut ffi::Py_buffer,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
    flags: c_int,
) -> PyResult<()> {
    let len = ffi::Py_ssize_t::try_from(len)
        .map_err(|_| PyBufferError::new_err("buffer larger than Py_ssize_t"))?;
    // SAFETY: the caller's contract above.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner,
            ptr.cast::<std::ffi::c_void>(),
            len,
            c_int::from(readonly),
            flags,
        )
    };
    if rc != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(())
}

/// A `Buffer` over an arena slot another process shared (`Buffer._share`'s address): what a
/// DataLoader's main process unpickles a worker's batch column into.
#[pyfunction]
pub fn _attach_buffer(address: SlotAddress) -> PyResult<Buffer> {
    let pid = address.0;
    SlotBytes::attach(address)
        .map(Buffer::in_slot)
        .map_err(|e| {
            crate::errors::ShardstreamError::new_err(format!(
                "cannot map the batch arena of DataLoader worker {pid} (/proc/{pid}/fd/{}): {e}; \
             set SHARDSTREAM_WORKER_SHM=0 to send batches through the pipe instead",
                address.1
            ))
        })
}
