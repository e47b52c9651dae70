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

/// `check_config(config, source)`: parses and validates a config (TOML text, or a dict of
/// sections: settings as data) as the binaries do (errors are `ConfigError` with pinring's
/// message) and returns what a trainer needs before any ring exists: `batches_per_epoch`
/// (this rank's), `samples_per_rank`, `record_bytes` (bytes of one sample over all its
/// fields), `parts_per_batch` (seqs per batch, with `"auto"` resolved as a daemon on this host
/// resolves it), `fields` (each `(name, dtype, per-sample shape)`), `toml` (the config as
/// pinring writes it, for a daemon or a producer to load) and `settings` (its scalar settings,
/// as [`config_settings`]). With `workers` (a `pinring.torch.DataLoader`'s `num_workers`), the
/// ring's slot count is cut to what they keep filled (`pinring_data::slots_for_workers`), in
/// `slots` and in the TOML.
#[pyfunction]
#[pyo3(signature = (config, source="<config>", workers=None))]
pub fn check_config<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyAny>,
    source: &str,
    workers: Option<u32>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut cfg = config_from(py, config, source)?;
    if config.is_instance_of::<PyDict>() {
        // Settings given as data have no file: their relative paths are this process's
        // working directory's, written out absolute so that a daemon or loader reading the
        // TOML from another directory opens the same files.
        cfg.make_paths_absolute().map_err(|e| e.to_pyerr())?;
    }
    // Every ring Python makes or reads hands its batches to a consumer.
    cfg.check_consumer_prefetch().map_err(|e| e.to_pyerr())?;

    // The daemon's own resolution (`Spec::resolve`): a file kind's files are opened (relative
    // paths: the working directory) and their length is dataset.samples, "auto" is resolved as
    // a daemon on this host resolves it (the part layout follows from it), every rule checked.
    // A DataLoader's ring (`workers`): the resolver cuts "auto"'s slot count to what its
    // workers keep filled, and the TOML says the count it cut to.
    let overrides = pinring_data::Overrides {
        workers,
        ..Default::default()
    };
    let resolved = pinring_data::Spec::resolve(
        cfg.clone(),
        &overrides,
        &pinring_runtime::settings::host_facts(),
        &pinring_sources::Files,
    )
    .map_err(|e| e.to_pyerr())?;
    if let Some(slots) = resolved.workers_slots() {
        cfg.ring.slots = Some(slots);
    }
    let toml = cfg.try_to_toml().map_err(|e| e.to_pyerr())?;
    let settings = settings_of(py, &cfg)?;
    let out = crate::spec::shape_of(py, &resolved)?;
    out.set_item("toml", toml)?;
    out.set_item("settings", settings)?;
    Ok(out)
}

/// A config given as TOML text (a file's, or the one a ring holds) or as data: a dict of
/// sections, each a dict of keys (`{"plan": {"batch_size": 32}, ...}`, the TOML file's shape;
/// `fields` a list of dicts), read by the same rules as a file (unknown keys refused, every
/// value checked), without any TOML written in Python.
pub(crate) fn config_from(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    source: &str,
) -> PyResult<Config> {
    if let Ok(text) = config.extract::<String>() {
        return Config::from_toml_str(&text, source).map_err(|e| e.to_pyerr());
    }
    if !config.is_instance_of::<PyDict>() {
        return Err(PyValueError::new_err(format!(
            "a config is TOML text or a dict of sections, not {}",
            config.get_type().name()?
        )));
    }
    // The dict becomes JSON by Python's own encoder (its numbers exact, its strings escaped),
    // and the config is read from that as from a file's table.
    let json: String = py
        .import("json")?
        .call_method1("dumps", (config,))?
        .extract()?;
    let mut de = serde_json::Deserializer::from_str(&json);
    let mut cfg = Config::from_settings(&mut de, source).map_err(|e| e.to_pyerr())?;
    // As a file that sets plan.epochs: a default_epochs override leaves it as given.
    let plan = config.get_item("plan").ok();
    cfg.epochs_given = plan.is_some_and(|p| p.contains("epochs").unwrap_or(false));
    Ok(cfg)
}

/// The scalar settings of `cfg`: `(section, key) -> value` for every boolean, integer, float
/// and string key (arrays and tables, such as `dataset.fields`, left out).
pub(crate) fn settings_of<'py>(py: Python<'py>, cfg: &Config) -> PyResult<Bound<'py, PyDict>> {
    let value = serde_json::to_value(cfg).map_err(|e| {
        crate::exit_error(
            pinring_exit::Exit::Internal,
            format!("config {}: cannot be written out: {e}", cfg.source),
        )
    })?;
    let out = PyDict::new(py);
    let Some(sections) = value.as_object() else {
        return Ok(out);
    };
    for (section, table) in sections {
        let Some(table) = table.as_object() else {
            continue;
        };
        for (key, v) in table {
            let key = (section.as_str(), key.as_str());
            match v {
                serde_json::Value::Bool(b) => out.set_item(key, *b)?,
                serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                    (Some(u), _, _) => out.set_item(key, u)?,
                    (None, Some(i), _) => out.set_item(key, i)?,
                    (None, None, Some(f)) => out.set_item(key, f)?,
                    _ => {}
                },
                serde_json::Value::String(s) => out.set_item(key, s)?,
                _ => {}
            }
        }
    }
    Ok(out)
}

/// `config_settings(config)`: the scalar settings of a config (TOML text, such as the one a
/// ring holds, or a dict of sections) as `(section, key) -> value`, read by pinring's own
/// parser: Python parses no TOML.
#[pyfunction]
pub fn config_settings<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = config_from(py, config, "ring")?;
    settings_of(py, &cfg)
}

/// The reason an I/O error gives, as Python's `strerror` says it ("No such file or directory"),
/// without Rust's "(os error 2)".
fn reason(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_string(),
        None => e.to_string(),
    }
}

/// Reads the config file a Python caller named (`call`: `EmbeddedDaemon`, `Producer`) once,
/// before the daemon or the loader looks it up, so that a file that is missing, unreadable or
/// not a regular file is said in the caller's terms (`EmbeddedDaemon(config="nope.toml"):
/// cannot read config file nope.toml: No such file or directory`) instead of the binaries'
/// (`--config`). A FIFO is refused without being opened for reading (nothing blocks).
pub(crate) fn readable_config(call: &str, path: &std::path::Path) -> PyResult<()> {
    let shown = path.display().to_string();
    let fail = |why: String| {
        crate::exit_error(
            pinring_exit::Exit::Config,
            format!("{call}(config={shown:?}): cannot read config file {shown}: {why}"),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(reason(&e)))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    std::fs::read(path).map_err(|e| fail(reason(&e)))?;
    Ok(())
}

/// Why CUDA device `device` cannot be used here (no driver, a driver that does not start, no
/// such device), without the binaries' "or use --backend host": the caller names the host
/// backend in its own terms. None where the device is usable.
pub(crate) fn cuda_unusable(device: usize) -> Option<String> {
    match pinring_backend::locate(pinring_backend::BackendKind::Cuda, device) {
        Ok(_) => None,
        Err(e) => Some(e.without_host_flag().unwrap_or_else(|| e.to_string())),
    }
}

/// `_cuda_unusable(device)`: why CUDA device `device` cannot be used in this process, or None
/// where it can: what `pinring.Loader` says before it asks for the CUDA backend.
#[pyfunction]
#[pyo3(name = "_cuda_unusable")]
pub fn cuda_unusable_py(py: Python<'_>, device: usize) -> Option<String> {
    py.detach(|| cuda_unusable(device))
}
