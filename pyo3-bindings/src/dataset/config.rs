//! What Python passes to open a dataset ([`OpenConfig`], the mapping `NativeDataset(config)`
//! takes), turned into the streamer's settings, and the wording of the errors of opening one.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shardstream_streamer::order::{Sampling, Weight};
use shardstream_streamer::{StreamSpec, StreamerError, StreamingConfig};

use crate::errors::from_streamer;

/// The settings of `NativeDataset(config)`, read from a mapping (the `_open_args` dict that
/// `shardstream.StreamingDataset` builds, and pickles with itself); a missing key takes its
/// default. `streams` (each `(remote, split, weight kind, weight value)`) mixes several datasets
/// as Mosaic's `streams=` does; `remote` and `split` are then ignored. `zero_copy` gives `bytes`
/// columns as `Buffer`s.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(super) struct OpenConfig {
    remote: String,
    #[pyo3(default)]
    split: Option<String>,
    #[pyo3(default)]
    local: Option<PathBuf>,
    #[pyo3(default)]
    cache_root: Option<PathBuf>,
    #[pyo3(default)]
    run_id: Option<String>,
    #[pyo3(default)]
    node_rank: Option<u64>,
    #[pyo3(default)]
    pub(super) memory_limit: Option<u64>,
    #[pyo3(default)]
    cache_limit: Option<u64>,
    #[pyo3(default)]
    copy_local: bool,
    #[pyo3(default)]
    validate_hash: bool,
    #[pyo3(default)]
    allow_unsafe_types: bool,
    #[pyo3(default)]
    streams: Option<Vec<PyStream>>,
    #[pyo3(default)]
    epoch_size: Option<u64>,
    #[pyo3(default)]
    pub(super) zero_copy: bool,
    #[pyo3(default = String::from("balanced"))]
    sampling_method: String,
    /// `storage_options=` as `(name, value)` pairs (see [`crate::storage_options`]).
    #[pyo3(default)]
    storage_options: Vec<(String, String)>,
}

/// What the streamer opens: its settings, and the streams of a mix with the mix's epoch size.
pub(super) struct Opening {
    pub(super) config: StreamingConfig,
    pub(super) streams: Option<Vec<StreamSpec>>,
    pub(super) epoch_size: Option<u64>,
}

impl OpenConfig {
    /// The streamer's settings, with `memory_limit` as its budget (the binding keeps a share of
    /// the caller's limit for itself).
    pub(super) fn into_opening(self, memory_limit: Option<u64>) -> PyResult<Opening> {
        let sampling = match self.sampling_method.as_str() {
            "balanced" => Sampling::Balanced,
            "fixed" => Sampling::Fixed,
            other => {
                return Err(PyValueError::new_err(format!(
                    "sampling_method must be 'balanced' or 'fixed', got {other:?}"
                )))
            }
        };
        let config = StreamingConfig {
            remote: self.remote,
            split: self.split,
            local: self.local,
            cache_root: self.cache_root,
            run_id: self.run_id,
            node_rank: self.node_rank,
            memory_limit,
            cache_limit: self.cache_limit,
            copy_local: self.copy_local,
            validate_hash: self.validate_hash,
            allow_unsafe_types: self.allow_unsafe_types,
            sampling,
            format: None,
            storage_options: self.storage_options.into(),
        };
        let specs = self
            .streams
            .map(|s| s.into_iter().map(stream_spec).collect::<PyResult<Vec<_>>>())
            .transpose()?;
        // Mosaic's `epoch_size` also resizes the epoch of a lone dataset: it is then a mix of
        // one stream, whose sampling (each sample `f` times plus a fresh subset) is the mix's.
        let streams = match (specs, self.epoch_size) {
            (None, Some(_)) => Some(vec![StreamSpec {
                remote: config.remote.clone(),
                split: config.split.clone(),
                weight: Weight::Natural,
                location: None,
                storage_options: Default::default(),
            }]),
            (specs, _) => specs,
        };
        Ok(Opening {
            config,
            streams,
            epoch_size: self.epoch_size,
        })
    }
}

/// One stream of a mix as Python passes it: `(remote, split, weight kind, weight value,
/// storage options)`, the kind one of `natural`, `proportion`, `repeat`, `choose` (Mosaic's
/// `Stream` arguments).
type PyStream = (String, Option<String>, String, f64, Vec<(String, String)>);

fn stream_spec((remote, split, kind, value, storage_options): PyStream) -> PyResult<StreamSpec> {
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
        storage_options: storage_options.into(),
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
