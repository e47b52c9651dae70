//! `pinring._native.Spec`: a config resolved once, in Python's terms. The settings (a dict of
//! sections, TOML text, or a file found by the lookup) and the keywords that override them are
//! read at this edge and resolved by the daemon's own resolver (`pinring_data::Spec::resolve`):
//! files opened, `"auto"` sized for this host, every rule checked. The value then goes whole to
//! an `EmbeddedDaemon(spec=...)`, which stores it in its ring; the workers that join the ring
//! adopt it from there (`pinring_data::Spec::adopt`). Nothing is written out as TOML on the way.

use std::path::PathBuf;

use pinring_exit::Exit;
use pinring_runtime::settings::{self, Overrides, Spelling};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{config_from, readable_config, settings_of};
use crate::errors::{exit_error, ToPyErr};

/// A resolved spec (the daemon's `pinring_data::Spec`), immutable.
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "Spec", frozen)]
pub struct PySpec {
    pub(crate) inner: pinring_data::Spec,
}

/// The keywords' overrides of the settings, named as the keywords name them.
#[derive(Debug, Default)]
pub(crate) struct Keywords {
    pub ring: Option<String>,
    pub epochs: Option<u32>,
    pub default_epochs: Option<u32>,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub workers: Option<u32>,
}

impl Keywords {
    /// The overrides they make; `rank` and `world_size` go together or not at all.
    pub(crate) fn overrides(self) -> PyResult<Overrides> {
        let shard = match (self.rank, self.world_size) {
            (Some(r), Some(w)) => Some((r, w)),
            (None, None) => None,
            (rank, world_size) => {
                return Err(exit_error(
                    Exit::Usage,
                    format!(
                        "rank={rank:?}, world_size={world_size:?}: give both, or neither (the \
                         config's plan then decides)"
                    ),
                ))
            }
        };
        Ok(Overrides {
            ring: self.ring,
            epochs: self.epochs,
            default_epochs: self.default_epochs,
            shard,
            workers: self.workers,
            spelling: Spelling::Keywords,
            ..Default::default()
        })
    }
}

/// Resolves the settings of `config` (a dict of sections or TOML text; `None`: the file at
/// `path`, else the lookup) with the keywords' overrides and the environment's, as the daemon
/// resolves its own (`caller` names the Python call in errors). Relative paths of settings given
/// as data are made absolute against the working directory (no file says where they are); a
/// file's stay as it gives them, resolved against its folder, so a `pinring-loader --config`
/// of the same file matches the ring's fingerprint. The ring stores the folder either way.
pub(crate) fn resolve(
    py: Python<'_>,
    config: Option<&Bound<'_, PyAny>>,
    path: Option<PathBuf>,
    caller: &str,
    keywords: Keywords,
) -> PyResult<pinring_data::Spec> {
    let overrides = keywords.overrides()?;
    let given = config.is_some();
    let found = match (config, path) {
        (Some(_), Some(_)) => {
            return Err(exit_error(
                Exit::Usage,
                format!("{caller}: give the settings (config=) or a file (path=), not both"),
            ))
        }
        (Some(config), None) => {
            let cfg = config_from(py, config, caller)?;
            settings::given(cfg, &overrides).map_err(|e| e.to_pyerr())?
        }
        (None, path) => {
            if let Some(p) = &path {
                readable_config(caller, p)?;
            }
            settings::find(path.as_deref(), &overrides).map_err(|e| e.to_pyerr())?
        }
    };
    found
        .settings
        .check_consumer_prefetch()
        .map_err(|e| e.to_pyerr())?;
    py.detach(|| pinring_client::resolve_embedded_found(found, given))
        .map_err(|e| e.to_pyerr())
}

#[pymethods]
impl PySpec {
    /// Resolves `config` (a dict of sections, the TOML file's shape, or TOML text; None: the
    /// config file at `path`, else the lookup of `pinring-daemon --config`) with the keywords
    /// (`ring`, `epochs`, `default_epochs`: `plan.epochs` where the settings leave it out,
    /// `rank` and `world_size` together, `workers`: a DataLoader's `num_workers`, which cuts
    /// `"auto"`'s slot count to what they keep filled) and the environment's `$PINRING_RANK`,
    /// `$PINRING_WORLD_SIZE` and `$PINRING_DEVICE`, as a daemon on this host resolves them.
    /// Errors are `ConfigError` (exit 3) and `UsageError` with pinring's messages; `source`
    /// names the settings in them.
    #[new]
    #[pyo3(signature = (config=None, *, path=None, source="<config>", ring=None, epochs=None, default_epochs=None, rank=None, world_size=None, workers=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: Option<&Bound<'_, PyAny>>,
        path: Option<PathBuf>,
        source: &str,
        ring: Option<String>,
        epochs: Option<u32>,
        default_epochs: Option<u32>,
        rank: Option<u32>,
        world_size: Option<u32>,
        workers: Option<u32>,
    ) -> PyResult<Self> {
        let keywords = Keywords {
            ring,
            epochs,
            default_epochs,
            rank,
            world_size,
            workers,
        };
        let inner = resolve(py, config, path, source, keywords)?;
        Ok(PySpec { inner })
    }

    /// The ring's name.
    #[getter]
    fn ring(&self) -> &str {
        self.inner.ring()
    }

    /// Slots in the ring, as resolved.
    #[getter]
    fn slots(&self) -> u32 {
        self.inner.slots()
    }

    /// Bytes per slot, as resolved.
    #[getter]
    fn slot_bytes(&self) -> u64 {
        self.inner.slot_bytes()
    }

    /// Batches per epoch of this rank's plan.
    #[getter]
    fn batches_per_epoch(&self) -> u64 {
        self.inner.plan().batches_per_epoch()
    }

    /// Seqs per batch (parts a batch is cut into).
    #[getter]
    fn parts_per_batch(&self) -> u64 {
        self.inner.plan().parts_per_batch()
    }

    /// The config as resolved, as TOML (for reading; nothing is loaded from it).
    #[getter]
    fn toml(&self) -> PyResult<String> {
        self.inner.config().try_to_toml().map_err(|e| e.to_pyerr())
    }

    /// The scalar settings as resolved, `(section, key) -> value` (as `config_settings`).
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        settings_of(py, self.inner.config())
    }

    /// What a trainer needs before any ring exists, as a dict: `batches_per_epoch` (this
    /// rank's), `samples_per_rank`, `record_bytes` (bytes of one sample over all its fields),
    /// `parts_per_batch`, `slots`, `slot_bytes`, `fields` (each `(name, dtype, per-sample
    /// shape)`), `toml` and `settings` (the scalar settings as `(section, key) -> value`).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = shape_of(py, &self.inner)?;
        out.set_item("toml", self.toml()?)?;
        out.set_item("settings", settings_of(py, self.inner.config())?)?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "Spec(ring={:?}, slots={}, slot_bytes={}, batches_per_epoch={})",
            self.inner.ring(),
            self.inner.slots(),
            self.inner.slot_bytes(),
            self.inner.plan().batches_per_epoch()
        )
    }
}

/// The plan's shape and the ring's geometry of `spec`, as `check_config` and `Spec.info()` give
/// them: `batches_per_epoch`, `samples_per_rank`, `record_bytes`, `parts_per_batch`, `slots`,
/// `slot_bytes` and `fields`.
pub(crate) fn shape_of<'py>(
    py: Python<'py>,
    spec: &pinring_data::Spec,
) -> PyResult<Bound<'py, PyDict>> {
    let (cfg, plan) = (spec.config(), spec.plan());
    let out = PyDict::new(py);
    out.set_item("batches_per_epoch", plan.batches_per_epoch())?;
    out.set_item("samples_per_rank", plan.samples_per_rank())?;
    out.set_item("record_bytes", cfg.record_bytes())?;
    out.set_item("parts_per_batch", plan.parts_per_batch())?;
    out.set_item("slots", spec.slots())?;
    out.set_item("slot_bytes", spec.slot_bytes())?;
    let fields: Vec<(String, &str, Vec<u32>)> = cfg
        .fields()
        .into_iter()
        .map(|f| (f.name, f.dtype.name(), f.shape))
        .collect();
    out.set_item("fields", fields)?;
    Ok(out)
}
