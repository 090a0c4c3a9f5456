//! What Python passes to open a dataset (`NativeDataset(...)`), and the wording of the errors
//! of opening one.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shardstream_streamer::order::Weight;
use shardstream_streamer::{StreamSpec, StreamerError};

use crate::errors::from_streamer;

/// One stream of a mix as Python passes it: `(remote, split, weight kind, weight value)`, the
/// kind one of `natural`, `proportion`, `repeat`, `choose` (Mosaic's `Stream` arguments).
pub(super) type PyStream = (String, Option<String>, String, f64);

pub(super) fn stream_spec((remote, split, kind, value): PyStream) -> PyResult<StreamSpec> {
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
pub(super) fn open_error(err: StreamerError) -> PyErr {
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
