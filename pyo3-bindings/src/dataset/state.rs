//! A run's position (`shardstream._native.State`): the streamer's [`StreamState`], made by
//! `NativeDataset.state` or read back by `NativeDataset.parse_state`, with the length of its
//! epoch. `StreamingDataset.state_dict` stores its JSON; `load_state_dict` reads its fields.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shardstream_streamer::order::{EpochOrder, StreamState};

use super::order::PyOrder;

/// A position in a run, checked against the dataset it was made or read for.
#[pyclass(name = "State", module = "shardstream._native", frozen)]
pub struct PyState {
    state: StreamState,
    /// Global positions of the state's epoch (before padding).
    epoch_len: u64,
}

impl PyState {
    /// The state of `order`'s epoch after `consumed` global positions.
    pub(super) fn new(order: &EpochOrder, consumed: u64) -> Self {
        PyState {
            state: StreamState::new(order, consumed),
            epoch_len: order.global_len(),
        }
    }

    /// A state read back, with the order it resumes (checked against the dataset).
    pub(super) fn resumed(state: StreamState, order: &EpochOrder) -> Self {
        PyState {
            state,
            epoch_len: order.global_len(),
        }
    }
}

#[pymethods]
impl PyState {
    /// The settings that fixed the order (a resume uses these, not the new run's).
    #[getter]
    fn order(&self) -> PyOrder {
        PyOrder {
            config: self.state.config,
        }
    }

    /// The epoch in progress.
    #[getter]
    fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// Global positions of the epoch already consumed (all ranks together).
    #[getter]
    fn consumed(&self) -> u64 {
        self.state.consumed
    }

    /// Global positions of the epoch (before padding).
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// The state as JSON text (what `StreamingDataset.state_dict` stores).
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.state)
            .map_err(|e| PyValueError::new_err(format!("cannot serialise the stream state: {e}")))
    }

    fn __repr__(&self) -> String {
        format!(
            "State(epoch={}, consumed={}, epoch_len={})",
            self.state.epoch, self.state.consumed, self.epoch_len
        )
    }
}
