//! `pinring._native.Pipeline`: an embedded daemon started from a [`Spec`](crate::spec::PySpec)
//! and the consumer of its ring, as one object: what `pinring.torch.DataLoader` runs for an
//! embedded ring. It composes the public [`EmbeddedDaemon`] and [`Consumer`] (their code, not a
//! copy of it), and hands out a [`RingTicket`]: what another process needs to join the ring.

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::consumer::{Consumer, EmbeddedDaemon};
use crate::errors::exit_error;
use crate::spec::PySpec;
use pinring_exit::Exit;

/// What a process needs to join a ring as a loader (`Producer(ticket.ring, path=ticket.path)`,
/// `pinring-loader --ring RING [--ring-path PATH]`): its name, and where an anonymous ring is
/// opened. Pickles, so a worker process can be sent one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[pyclass(module = "pinring._native", name = "RingTicket", frozen, eq, hash)]
pub struct RingTicket {
    /// The ring's name.
    #[pyo3(get)]
    ring: String,
    /// Where an anonymous ring is opened (`/proc/<pid>/fd/<fd>` of its daemon's process); None
    /// for a ring named in /dev/shm.
    #[pyo3(get)]
    path: Option<String>,
}

#[pymethods]
impl RingTicket {
    /// The ticket of ring `ring`, opened at `path` (an anonymous ring's) or by its name.
    #[new]
    #[pyo3(signature = (ring, path=None))]
    fn new(ring: String, path: Option<String>) -> PyResult<Self> {
        if ring.is_empty() {
            return Err(exit_error(
                Exit::Usage,
                "RingTicket(ring=\"\"): a ticket names its ring; pass the ring's name",
            ));
        }
        Ok(RingTicket { ring, path })
    }

    fn __getnewargs__(&self) -> (String, Option<String>) {
        (self.ring.clone(), self.path.clone())
    }

    fn __repr__(&self) -> String {
        match &self.path {
            Some(p) => format!("RingTicket({:?}, path={p:?})", self.ring),
            None => format!("RingTicket({:?})", self.ring),
        }
    }
}

/// An embedded daemon running `spec` and the one consumer of its ring, attached when the
/// pipeline starts (`attach=True`) or later by `attach()`, at a seq; detached by
/// `detach()` and attached again, on the same daemon, at another.
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "Pipeline")]
pub struct Pipeline {
    spec: Py<PySpec>,
    daemon: Py<EmbeddedDaemon>,
    /// The attached consumer; None before `attach()`, after `detach()` and `stop()`.
    consumer: Mutex<Option<Py<Consumer>>>,
    /// Seconds an `attach()` waits for the ring (`wait_for_ring=`).
    wait_for_ring: f64,
}

impl Pipeline {
    /// Opens the consumer of the daemon's ring, at the ring's own path: `Consumer(ring,
    /// start_seq=, fingerprint=, wait_for_ring=, path=)`, and its errors.
    fn open_consumer(
        py: Python<'_>,
        daemon: &EmbeddedDaemon,
        start_seq: Option<u64>,
        fingerprint: Option<u64>,
        wait_for_ring: f64,
    ) -> PyResult<Consumer> {
        Consumer::new(
            py,
            daemon.ring().to_string(),
            start_seq,
            fingerprint,
            wait_for_ring,
            daemon.path().map(std::path::PathBuf::from),
        )
    }

    fn attached(&self) -> std::sync::MutexGuard<'_, Option<Py<Consumer>>> {
        self.consumer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The error of an `attach()` while a consumer is attached.
fn attached_already(ring: &str) -> PyErr {
    exit_error(
        Exit::Usage,
        format!(
            "Pipeline(ring={ring:?}).attach(): its consumer is attached already (a ring has one \
             consumer): detach() it first"
        ),
    )
}

#[pymethods]
impl Pipeline {
    /// Starts the daemon of `spec` (`EmbeddedDaemon(spec=spec, backend=, device=, start_seq=,
    /// anonymous=, wait=)`), then, with `attach` (the default), attaches its consumer
    /// (`attach()`); where the consumer cannot attach, the daemon is stopped and the
    /// consumer's error raised. `attach=False` starts the daemon alone: `attach()` opens the
    /// consumer later, at a seq.
    #[new]
    #[pyo3(signature = (spec, *, backend="auto", device=0, start_seq=0, anonymous=false, wait=60.0, wait_for_ring=30.0, attach=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        spec: &Bound<'_, PyAny>,
        backend: &str,
        device: usize,
        start_seq: u64,
        anonymous: bool,
        wait: f64,
        wait_for_ring: f64,
        attach: bool,
    ) -> PyResult<Self> {
        let spec = spec.cast::<PySpec>().map_err(|_| {
            let given = spec
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into());
            exit_error(
                Exit::Usage,
                format!(
                    "Pipeline(spec=<{given}>): pass a pinring.Spec (the settings resolved once: \
                     pinring.Spec(settings) or pinring.Spec(path=\"pinring.toml\"))"
                ),
            )
        })?;
        // Said before the daemon starts, not after.
        crate::convert::seconds("wait_for_ring", wait_for_ring)?;
        let daemon = EmbeddedDaemon::new(
            py,
            None,
            None,
            backend,
            device,
            start_seq,
            None,
            false,
            wait,
            anonymous,
            None,
            None,
            None,
            Some(spec.borrow()),
        )?;
        let consumer = if attach {
            match Self::open_consumer(py, &daemon, None, None, wait_for_ring) {
                Ok(c) => Some(Py::new(py, c)?),
                Err(e) => {
                    // The consumer's error is the one to raise; the daemon's end is no news.
                    let _ = daemon.stop(py);
                    return Err(e);
                }
            }
        } else {
            None
        };
        Ok(Pipeline {
            spec: spec.clone().unbind(),
            daemon: Py::new(py, daemon)?,
            consumer: Mutex::new(consumer),
            wait_for_ring,
        })
    }

    /// Attaches the consumer of the ring (at the ring's own path), as `Consumer(ring,
    /// start_seq=, fingerprint=, wait_for_ring=, path=)` would, and raises as it would;
    /// `start_seq` (with the `fingerprint` it was saved under) resumes at a saved state. One
    /// consumer at a time: attached already, or stopped, is a `UsageError`.
    #[pyo3(signature = (start_seq=None, fingerprint=None))]
    fn attach(
        &self,
        py: Python<'_>,
        start_seq: Option<u64>,
        fingerprint: Option<u64>,
    ) -> PyResult<Py<Consumer>> {
        let daemon = self.daemon.bind(py).borrow();
        if self.attached().is_some() {
            return Err(attached_already(daemon.ring()));
        }
        if daemon.stopped() {
            return Err(exit_error(
                Exit::Usage,
                format!(
                    "Pipeline(ring={:?}).attach(): the pipeline is stopped: start a new one",
                    daemon.ring()
                ),
            ));
        }
        let c = Py::new(
            py,
            Self::open_consumer(py, &daemon, start_seq, fingerprint, self.wait_for_ring)?,
        )?;
        let mut attached = self.attached();
        if attached.is_some() {
            // Another thread attached meanwhile: its consumer stays, this one goes.
            drop(attached);
            c.borrow(py).close(py);
            return Err(attached_already(daemon.ring()));
        }
        *attached = Some(c.clone_ref(py));
        Ok(c)
    }

    /// Closes the attached consumer (batches still alive stay valid, and keep the ring's
    /// consumer lock until the last of them is gone); nothing where none is attached. The
    /// daemon runs on: `attach()` opens a consumer again, at another seq.
    fn detach(&self, py: Python<'_>) {
        let c = self.attached().take();
        if let Some(c) = c {
            c.borrow(py).close(py);
        }
    }

    /// The spec the daemon runs (and stored in its ring).
    #[getter]
    fn spec(&self, py: Python<'_>) -> Py<PySpec> {
        self.spec.clone_ref(py)
    }

    /// The attached consumer: batches, `state()`, `status()`, the ring's shape. A
    /// `UsageError` where none is attached (`attach=False` before `attach()`, after
    /// `detach()` or `stop()`).
    #[getter]
    fn consumer(&self, py: Python<'_>) -> PyResult<Py<Consumer>> {
        match self.attached().as_ref() {
            Some(c) => Ok(c.clone_ref(py)),
            None => Err(exit_error(
                Exit::Usage,
                format!(
                    "Pipeline(ring={:?}): no consumer is attached: attach() one",
                    self.daemon.borrow(py).ring()
                ),
            )),
        }
    }

    /// The embedded daemon.
    #[getter]
    fn daemon(&self, py: Python<'_>) -> Py<EmbeddedDaemon> {
        self.daemon.clone_ref(py)
    }

    /// The ring's name.
    #[getter]
    fn ring(&self, py: Python<'_>) -> String {
        self.daemon.borrow(py).ring().to_string()
    }

    /// Where an anonymous ring is opened; None for a ring named in /dev/shm.
    #[getter]
    fn path(&self, py: Python<'_>) -> Option<String> {
        self.daemon.borrow(py).path().map(str::to_string)
    }

    /// Whether the daemon still runs.
    #[getter]
    fn running(&self, py: Python<'_>) -> bool {
        self.daemon.borrow(py).running()
    }

    /// What a loader process needs to join the ring: its name and path.
    fn ticket(&self, py: Python<'_>) -> RingTicket {
        let d = self.daemon.borrow(py);
        RingTicket {
            ring: d.ring().to_string(),
            path: d.path().map(str::to_string),
        }
    }

    /// Detaches the consumer, then stops (drains) the daemon: its summary as JSON text (None
    /// once stopped already). Raises the daemon's error if it failed, as
    /// `EmbeddedDaemon.stop()` does.
    fn stop(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.detach(py);
        self.daemon.borrow(py).stop(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let d = self.daemon.borrow(py);
        let state = if d.running() { "running" } else { "stopped" };
        format!("Pipeline(ring={:?}, {state})", d.ring())
    }
}
