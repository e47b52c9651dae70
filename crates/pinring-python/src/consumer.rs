//! The trainer's end in Python: [`Consumer`] (attach to a ring by name, take its batches in
//! order), [`Batch`] (named [`Field`]s over the batch's buffer, each holding the batch's lease)
//! and [`EmbeddedDaemon`] (the daemon on a thread of this process). The protocol is
//! pinring-client's; this module only moves its values into Python objects, with the GIL
//! released around every wait.

use std::sync::{Arc, Mutex};

use pinring_client::{AttachOptions, ClientError, EmbeddedOptions, Lease, Location};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{seconds, synthetic_fields};
use crate::errors::{exit_error, ToPyErr};
use crate::field::{Device, Field, FieldOwner};

/// A batch's lease as the owner of its fields: the buffer goes back to the daemon when the
/// batch object and every array or tensor made from its fields are gone.
struct LeaseOwner(Arc<Lease>);

impl FieldOwner for LeaseOwner {
    fn prepare_for_stream(&self, stream: Option<usize>) -> Result<(), String> {
        // DLPack: no stream means the legacy default stream (CU_STREAM_LEGACY, 1).
        let stream = stream.unwrap_or(1) as u64;
        self.0.use_on_stream(stream).map_err(|e| e.to_string())
    }
}

fn device_of(location: Location) -> Device {
    match location {
        Location::Host => Device::Cpu,
        Location::Cuda(n) => Device::Cuda(n),
    }
}

/// The one consumer of a ring (see pinring-client's `Consumer`).
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "Consumer")]
pub struct Consumer {
    inner: Mutex<Option<pinring_client::Consumer>>,
    ring: String,
    live: crate::process::Live,
    /// A read-only view of the ring for `status()`, opened at its first call.
    view: std::sync::OnceLock<pinring_ring::RingView>,
}

impl Consumer {
    fn with<T>(&self, f: impl FnOnce(&mut pinring_client::Consumer) -> T) -> PyResult<T> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_mut() {
            Some(c) => Ok(f(c)),
            None => Err(exit_error(
                pinring_exit::Exit::Usage,
                format!("the consumer of ring {:?} is closed", self.ring),
            )),
        }
    }
}

#[pymethods]
impl Consumer {
    /// Attaches to ring `ring` as its one consumer; `start_seq` (with the `fingerprint` it was
    /// saved under) resumes at a saved state. Waits up to `wait_for_ring` seconds for the ring.
    #[new]
    #[pyo3(signature = (ring, start_seq=None, fingerprint=None, wait_for_ring=30.0, path=None))]
    pub(crate) fn new(
        py: Python<'_>,
        ring: String,
        start_seq: Option<u64>,
        fingerprint: Option<u64>,
        wait_for_ring: f64,
        path: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let opts = AttachOptions {
            start_seq,
            fingerprint,
            wait_for_ring: seconds("wait_for_ring", wait_for_ring)?,
            path,
        };
        let c = crate::signals::detach_interruptible(py, |stop| {
            // A ring that is not there yet is said at once, through Python's logging (logger
            // "pinring", a warning: shown on stderr where logging is not configured).
            let mut tell = |w: &pinring_ring::Waiting| {
                Python::attach(|py| {
                    let said = py.import("logging").and_then(|logging| {
                        logging
                            .call_method1("getLogger", ("pinring",))?
                            .call_method1("warning", ("%s", w.to_string()))
                    });
                    if let Err(e) = said {
                        e.print(py);
                    }
                })
            };
            pinring_client::Consumer::attach_telling(&ring, &opts, stop, &mut tell)
        })?
        .map_err(|e| e.to_pyerr())?;
        Ok(Consumer {
            inner: Mutex::new(Some(c)),
            ring,
            live: crate::process::Live::new(),
            view: std::sync::OnceLock::new(),
        })
    }

    /// The next batch in seq order, or None at the end of the plan. Waits up to `timeout`
    /// seconds (None: as long as the daemon lives), with the GIL released.
    #[pyo3(signature = (timeout=None))]
    fn next_batch(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<Batch>>> {
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = g.as_mut() else {
            return Err(exit_error(
                pinring_exit::Exit::Usage,
                format!("the consumer of ring {:?} is closed", self.ring),
            ));
        };
        let got =
            crate::signals::detach_interruptible(py, |stop| c.next_batch_until(timeout, stop))?
                .map_err(|e| match e {
                    ClientError::Timeout { .. } => crate::errors::Timeout::new_err(e.to_string()),
                    e => e.to_pyerr(),
                })?;
        let Some(b) = got else {
            return Ok(None);
        };
        let owner: Arc<dyn FieldOwner> = Arc::new(LeaseOwner(Arc::clone(&b.lease)));
        let fields = PyDict::new(py);
        for f in &b.fields {
            let shape: Vec<usize> = f.shape.iter().map(|&d| d as usize).collect();
            // SAFETY: the view lies inside the batch's buffer (pinring-client checked it against
            // the buffer size), which is this consumer's until the lease, held by `owner`, is
            // dropped; the field's dtype and shape describe exactly `f.bytes` C-contiguous bytes
            // at an offset aligned to 256 (buffers are page aligned).
            let field = unsafe {
                Field::new(
                    f.ptr as *mut std::ffi::c_void,
                    f.dtype,
                    &shape,
                    device_of(f.location),
                    Arc::clone(&owner),
                )
            }?;
            fields.set_item(&f.name, Py::new(py, field)?)?;
        }
        let place = crate::place::Place {
            seq: b.seq,
            batch: b.batch,
            epoch: b.epoch,
            index_in_epoch: b.index_in_epoch,
        };
        let batch = Batch {
            samples: b.samples,
            fields: fields.unbind(),
            lease: Mutex::new(Some(b.lease)),
        };
        Ok(Some(Py::new(
            py,
            PyClassInitializer::from(place).add_subclass(batch),
        )?))
    }

    /// `(seq, fingerprint)`: where this consumer stands; resume with
    /// `Consumer(ring, start_seq=seq, fingerprint=fingerprint)`.
    fn state(&self) -> PyResult<(u64, u64)> {
        self.with(|c| {
            let s = c.state();
            (s.seq, s.fingerprint)
        })
    }

    /// How many batch parts the ring's daemon has taken back because their loader held them past
    /// the lease (`daemon.lease_ms`), over the ring's life (its health block's count).
    #[getter]
    fn leases_expired(&self) -> PyResult<u64> {
        self.with(|c| c.ring().leases_expired())
    }

    /// How this process decoded the images its ring carries encoded (`[dataset.image] decode =
    /// "gpu"`): a dict of counts per way ("gpu", "cpu", "cpu_not_jpeg", "cpu_unsupported",
    /// "cpu_components", "cpu_batch_failed", "failed"); None where this process decodes none
    /// (a ring of pixels, or one whose daemon copies: its summary counts them).
    fn decode_counts<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(counts) = self.with(|c| c.decode_counts())? else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (way, n) in counts.named() {
            d.set_item(way, n)?;
        }
        Ok(Some(d))
    }

    /// The ring as `pinring status --json` reads it, as JSON text: slot counts, loaders, batches
    /// committed and delivered, bytes in and out, and the wait counters the verdict reads.
    fn status(&self) -> PyResult<String> {
        let view = match self.view.get() {
            Some(v) => v,
            None => {
                let v = self.with(|c| c.ring().view())?.map_err(|e| e.to_pyerr())?;
                self.view.get_or_init(|| v)
            }
        };
        // A closed consumer has no status, however it was read before.
        self.with(|_| ())?;
        let snap = pinring_observe::Snapshot::take(&view.snapshot());
        serde_json::to_string(&snap).map_err(|e| {
            exit_error(
                pinring_exit::Exit::Internal,
                format!("ring {:?}: its status as JSON: {e}", self.ring),
            )
        })
    }

    /// What the synthetic generator says each field of batch number `batch` holds: field name
    /// -> bytes, computed from the ring's own config and plan (for checking every byte a
    /// consumer got).
    fn expected<'py>(&self, py: Python<'py>, batch: u64) -> PyResult<Bound<'py, PyDict>> {
        let (cfg, layout) = self.with(|c| (c.config().clone(), c.config().batch_layout()))?;
        let mut plan = cfg.plan().map_err(|e| e.to_pyerr())?;
        let mut ids = Vec::new();
        plan.batch_into(batch, &mut ids).map_err(|e| e.to_pyerr())?;
        synthetic_fields(py, &cfg, &layout, &ids)
    }

    /// Batches per epoch of the ring's plan.
    #[getter]
    fn batches_per_epoch(&self) -> PyResult<u64> {
        self.with(|c| c.batches_per_epoch())
    }

    /// The daemon's resolved config, as TOML: what its producers must run with.
    #[getter]
    fn config(&self) -> PyResult<String> {
        self.with(|c| c.config().to_toml())
    }

    /// The daemon's spec, adopted from the ring (its settings as resolved, its plan's shape).
    #[getter]
    fn spec(&self) -> PyResult<crate::spec::PySpec> {
        self.with(|c| crate::spec::PySpec {
            inner: c.spec().clone(),
        })
    }

    /// Seqs per batch (a batch's seq is its first part's).
    #[getter]
    fn parts_per_batch(&self) -> PyResult<u64> {
        self.with(|c| c.parts_per_batch())
    }

    /// One past the plan's last seq.
    #[getter]
    fn end_seq(&self) -> PyResult<u64> {
        self.with(|c| c.end_seq())
    }

    /// `(held, buffers)`: the batch buffers this consumer holds now (batches, or tensors made
    /// from them, still alive) and how many the ring has; `next_batch` while all are held raises
    /// `UsageError`.
    #[getter]
    fn buffers_held(&self) -> PyResult<(u32, u32)> {
        self.with(|c| c.buffers_held())
    }

    /// Where the batches are: "cpu" or "cuda:N".
    #[getter]
    fn device(&self) -> PyResult<String> {
        self.with(|c| device_of(c.location()).to_string())
    }

    /// The ring's name.
    #[getter]
    fn ring(&self) -> &str {
        &self.ring
    }

    /// Detaches. Batches (and tensors) still alive stay valid, and keep the ring's consumer
    /// lock until the last of them is gone.
    pub(crate) fn close(&self, py: Python<'_>) {
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(c));
        self.live.end();
    }
}

/// One whole batch: `fields` maps each field's name to a [`Field`] (DLPack-exportable).
#[derive(Debug)]
/// Where it stands in the plan (seq, batch, epoch, index in the epoch) is its base, `Place`.
#[pyclass(module = "pinring._native", name = "Batch", extends = crate::place::Place)]
pub struct Batch {
    /// Samples in the batch.
    #[pyo3(get)]
    samples: u32,
    /// Field name -> Field.
    #[pyo3(get)]
    fields: Py<PyDict>,
    lease: Mutex<Option<Arc<Lease>>>,
}

#[pymethods]
impl Batch {
    /// Drops this object's own hold on the buffer (arrays and tensors made from its fields keep
    /// theirs): once they are gone too, the buffer goes back to the daemon.
    fn release(&self, py: Python<'_>) {
        let l = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(l));
    }
}

/// The daemon's code on a thread of this process (embedded mode): no service, no CUDA IPC.
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "EmbeddedDaemon")]
pub struct EmbeddedDaemon {
    inner: Mutex<Option<pinring_client::EmbeddedDaemon>>,
    ring: String,
    path: Option<String>,
    live: crate::process::Live,
}

#[pymethods]
impl EmbeddedDaemon {
    /// Starts the daemon (sink: this process's consumer) and waits up to `wait` seconds for its
    /// ring to be ready. Its settings are `spec` (a `Spec`, resolved once, taken as it is), or
    /// the config file `config` (None: the lookup) with the keywords: `rank` and `world_size`
    /// (both or neither) replace the config's `plan.rank` and `plan.world_size`;
    /// `default_epochs`: `plan.epochs` where neither `epochs` nor the config file sets it (None:
    /// the config's default, 2).
    #[new]
    #[pyo3(signature = (config=None, ring=None, backend="auto", device=0, start_seq=0, epochs=None, replace=false, wait=60.0, anonymous=false, rank=None, world_size=None, default_epochs=None, spec=None))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        py: Python<'_>,
        config: Option<std::path::PathBuf>,
        ring: Option<String>,
        backend: &str,
        device: usize,
        start_seq: u64,
        epochs: Option<u32>,
        replace: bool,
        wait: f64,
        anonymous: bool,
        rank: Option<u32>,
        world_size: Option<u32>,
        default_epochs: Option<u32>,
        spec: Option<PyRef<'_, crate::spec::PySpec>>,
    ) -> PyResult<Self> {
        let keywords = crate::spec::Keywords {
            ring,
            epochs,
            default_epochs,
            rank,
            world_size,
            workers: None,
        };
        let spec = match spec {
            Some(s) => {
                if config.is_some()
                    || keywords.ring.is_some()
                    || keywords.epochs.is_some()
                    || keywords.default_epochs.is_some()
                    || keywords.rank.is_some()
                    || keywords.world_size.is_some()
                {
                    return Err(exit_error(
                        pinring_exit::Exit::Usage,
                        "EmbeddedDaemon(spec=...): the spec holds every setting; leave config=, \
                         ring=, epochs=, default_epochs=, rank= and world_size= out (give them \
                         to Spec)",
                    ));
                }
                Some(s.inner.clone())
            }
            None => {
                if let Some(path) = &config {
                    crate::convert::readable_config("EmbeddedDaemon", path)?;
                }
                None
            }
        };
        // The keywords are this edge's overrides, named as the keywords name them.
        let overrides = keywords.overrides()?;
        let backend = backend
            .parse::<pinring_backend::BackendKind>()
            .map_err(|e| exit_error(pinring_exit::Exit::Usage, e.to_string()))?;
        if backend == pinring_backend::BackendKind::Cuda {
            // Said here in this class's terms; the daemon's own message names its flag.
            if let Some(why) = py.detach(|| crate::convert::cuda_unusable(device)) {
                return Err(exit_error(
                    pinring_exit::Exit::Backend,
                    format!(
                        "EmbeddedDaemon(backend=\"cuda\", device={device}): {why}, or pass \
                         backend=\"host\""
                    ),
                ));
            }
        }
        let opts = EmbeddedOptions {
            backend,
            device,
            start_seq,
            replace,
            anonymous,
        };
        let wait = seconds("wait", wait)?;
        let d = crate::signals::detach_interruptible(py, |stop| {
            let spec = match spec {
                Some(spec) => spec,
                None => pinring_client::resolve_embedded(config.as_deref(), &overrides, anonymous)?,
            };
            pinring_client::EmbeddedDaemon::start_until(spec, &opts, wait, stop)
        })?
        .map_err(|e| e.to_pyerr())?;
        let ring = d.ring().to_string();
        let path = d.path().map(|p| p.to_string_lossy().into_owned());
        Ok(EmbeddedDaemon {
            inner: Mutex::new(Some(d)),
            ring,
            path,
            live: crate::process::Live::new(),
        })
    }

    /// The ring's name (loaders join it with `pinring-loader --ring NAME`).
    #[getter]
    pub(crate) fn ring(&self) -> &str {
        &self.ring
    }

    /// Where an anonymous ring is opened (this process's `/proc/<pid>/fd/<fd>`): pass it as
    /// `path=` to `Consumer` and `Producer`. None for a ring named in /dev/shm.
    #[getter]
    pub(crate) fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// Whether the daemon still runs.
    #[getter]
    pub(crate) fn running(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|d| d.running())
    }

    /// Stops the daemon (a drain) and returns its summary as JSON text (None if already
    /// stopped). Raises the daemon's error if it failed.
    pub(crate) fn stop(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let d = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(d) = d else {
            return Ok(None);
        };
        let stopped = py.detach(|| d.stop());
        self.live.end();
        let Some((summary, result)) = stopped else {
            return Err(exit_error(
                pinring_exit::Exit::Internal,
                format!(
                    "ring {:?}: the embedded daemon's thread panicked",
                    self.ring
                ),
            ));
        };
        if let Err(e) = result {
            // The daemon's own error, of its exit code's class: a part that failed on the data
            // is a ConfigError (exit 3), as `pinring-daemon` exits with.
            return Err(e.to_pyerr());
        }
        serde_json::to_string(&summary)
            .map(Some)
            .map_err(|e| exit_error(pinring_exit::Exit::Output, e.to_string()))
    }
}

impl EmbeddedDaemon {
    /// Whether `stop()` was called (the daemon is gone, not only ended).
    pub(crate) fn stopped(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

impl Drop for EmbeddedDaemon {
    fn drop(&mut self) {
        // A forked child's copy: the daemon's thread is the parent's.
        if self.live.forget_if_copy(&mut self.inner) {
            return;
        }
        if let Some(d) = self
            .inner
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = d.stop();
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // A forked child's copy: its ring lock and batch buffers are the parent's.
        self.live.forget_if_copy(&mut self.inner);
    }
}

/// Where a pipeline was bound over an interval of `seconds` in which `delivered` batches went
/// out, from the growth of the ring's wait counters (`Consumer.status()`'s): `"loaders"`,
/// `"upload"`, `"consumer"`, `"balanced"` or `"idle"`, as `pinring status` says it.
#[pyfunction]
#[pyo3(signature = (seconds, delivered, daemon_wait, loader_wait, loader_busy, upload))]
pub fn bound(
    seconds: f64,
    delivered: u64,
    daemon_wait: f64,
    loader_wait: f64,
    loader_busy: f64,
    upload: f64,
) -> &'static str {
    pinring_observe::bound(
        seconds,
        delivered,
        daemon_wait,
        loader_wait,
        loader_busy,
        upload,
    )
}
