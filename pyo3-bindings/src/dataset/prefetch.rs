//! `NativePrefetch`: downloads of one process's first shards, started before its stream.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use shardstream_streamer::Prefetch;

use crate::blocking;
use crate::errors::from_streamer;

/// A background prefetch (`NativeDataset.prefetch`). Dropping it starts no further download.
#[pyclass(module = "shardstream._native", frozen)]
pub struct NativePrefetch {
    pub(super) prefetch: Prefetch,
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
