//! Placeholder: filled in by its issue.

use pyo3::prelude::*;

/// Adds this module's classes and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let _ = m;
    Ok(())
}
