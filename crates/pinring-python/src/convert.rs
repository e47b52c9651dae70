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

/// `check_config(toml, source)`: parses and validates a config as the binaries do (errors are
/// `ConfigError` with pinring's message) and returns what a trainer needs before any ring
/// exists: `batches_per_epoch` (this rank's), `samples_per_rank`, `record_bytes` (bytes of
/// one sample over all its fields), `parts_per_batch` (seqs per batch, with `"auto"` resolved
/// as a daemon on this host resolves it) and `fields` (each `(name, dtype, per-sample shape)`).
#[pyfunction]
#[pyo3(signature = (toml, source="<config>"))]
pub fn check_config<'py>(
    py: Python<'py>,
    toml: &str,
    source: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = Config::from_toml_str(toml, source).map_err(|e| e.to_pyerr())?;
    // The daemon's own resolution (`Config::resolve`): a file kind's files are opened (relative
    // paths: the working directory) and their length is dataset.samples, "auto" is resolved as
    // a daemon on this host resolves it (the part layout follows from it), every rule checked.
    let host = pinring_runtime::host_memory::HostMemory::read();
    let resolved = cfg
        .resolve(&pinring_sources::Files, host.cache_bytes())
        .map_err(|e| e.to_pyerr())?;
    let (cfg, plan) = (resolved.config(), resolved.plan());
    let out = PyDict::new(py);
    out.set_item("batches_per_epoch", plan.batches_per_epoch())?;
    out.set_item("samples_per_rank", plan.samples_per_rank())?;
    out.set_item("record_bytes", cfg.record_bytes())?;
    out.set_item("parts_per_batch", cfg.parts_per_batch())?;
    let fields: Vec<(String, &str, Vec<u32>)> = cfg
        .fields()
        .into_iter()
        .map(|f| (f.name, f.dtype.name(), f.shape))
        .collect();
    out.set_item("fields", fields)?;
    Ok(out)
}
