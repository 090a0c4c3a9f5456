//! The order settings of an epoch as Python gives them.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shardstream_streamer::order::{OrderConfig, Remainder};

use crate::errors::from_streamer;

fn remainder_of(name: &str) -> PyResult<Remainder> {
    match name {
        "pad" => Ok(Remainder::Pad),
        "drop" => Ok(Remainder::Drop),
        other => Err(PyValueError::new_err(format!(
            "remainder must be 'pad' or 'drop', got {other:?}"
        ))),
    }
}

pub(super) fn remainder_name(r: Remainder) -> &'static str {
    match r {
        Remainder::Pad => "pad",
        Remainder::Drop => "drop",
    }
}

pub(super) fn order_config(
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
