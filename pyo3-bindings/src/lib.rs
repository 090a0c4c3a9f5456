//! The native half of the `shardstream` Python package (`shardstream._native`).
//!
//! The Python layer (`python/shardstream`) is thin: it adapts these types to torch's interfaces.
//! Each submodule registers its own classes and functions; the GIL is released around every
//! blocking call, and every error becomes one of the exceptions of [`errors`].

use pyo3::prelude::*;

mod allocator;
mod arena;
mod blocking;
mod buffer;
mod checkpoint;
mod dataset;
mod decode;
mod errors;
mod logging;
mod runtime;
mod writer;

/// The `shardstream._native` module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    logging::install(m.py())?;
    m.add_function(wrap_pyfunction!(logging::refresh_logging, m)?)?;
    errors::register(m)?;
    m.add_class::<buffer::Buffer>()?;
    m.add_class::<buffer::ColumnBuffer>()?;
    m.add_function(wrap_pyfunction!(buffer::_attach_buffer, m)?)?;
    dataset::register(m)?;
    checkpoint::register(m)?;
    m.add_class::<writer::NativeShardWriter>()?;
    Ok(())
}
