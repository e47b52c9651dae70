//! Conversions the native classes share: seconds from Python, and the synthetic generator's bytes
//! of a batch's (or a part's) fields.

use std::time::Duration;

use pinring_data::{BatchLayout, Config};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::ToPyErr;

/// A duration argument given in seconds; `ValueError` naming the argument if negative or not
/// finite.
pub(crate) fn seconds(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a non-negative number of seconds, not {s}"
        ))
    })
}

/// What the synthetic generator of `cfg` says each field holds for the samples `ids`: field
/// name -> bytes, laid out as `layout` places a batch of that many samples.
pub(crate) fn synthetic_fields<'py>(
    py: Python<'py>,
    cfg: &Config,
    layout: &BatchLayout,
    ids: &[u64],
) -> PyResult<Bound<'py, PyDict>> {
    let synthetic = cfg.synthetic();
    let out = PyDict::new(py);
    for p in layout.placements(ids.len() as u64) {
        let mut bytes = vec![0u8; p.bytes as usize];
        synthetic
            .fill_field(&p.name, ids, &mut bytes)
            .map_err(|e| e.to_pyerr())?;
        out.set_item(&p.name, PyBytes::new(py, &bytes))?;
    }
    Ok(out)
}
