//! A loader in Python: [`Producer`] is a pinring-producer `Session`, the one `pinring-loader`
//! runs: it joins a ring's loader table the same way (`Session::join`), claims FREE slots in the
//! same loop (`Session::claim`) and makes each into the session's part guard
//! (`Session::part`, the one `pinring-loader` fills), handed to Python as a [`Part`]: the
//! part's seq, batch and sample ids, and one writable [`Field`] per batch field over the guard's
//! view of that field's chunk in the slot (`PartGuard::field_views`). `Part.commit()` is the
//! guard's commit: the metadata with its labels by the one labels rule, then the slot READY. A
//! part dropped uncommitted is given back (its claim abandoned). Nothing of the protocol lives
//! in Python, and nothing here writes into the slot.
//!
//! Leases: the daemon takes back a slot whose claim has not changed for `daemon.lease_ms`
//! (default 30 s), whatever the loader's heartbeat says; a part must be committed within it.
//! The heartbeat in the loader table (shown by `pinring status`) is refreshed at attach, while
//! waiting for a slot, and at every commit, as the Rust loader does; no thread of its own.
//!
//! A producer that dies (even SIGKILL) mid-part loses nothing: its locks go with the process,
//! and the daemon puts the slot back with the same seq for another loader.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use pinring_exit::Exit;
use pinring_producer::loader;
use pinring_producer::{Joined, Next, PartBuffers, PartError, PartGuard, Session, SessionError};
use pinring_runtime::settings::{self, Overrides, Spelling};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{seconds, synthetic_fields};
use crate::errors::{exit_error, ToPyErr};
use crate::field::{Device, Field, KeepAlive};

/// The session, and the ring, config and layout it joined with: shared by the producer and
/// every part and field made from it, so the mapping outlives all of them. The seat goes when
/// the producer closes.
#[derive(Debug)]
struct State {
    session: Session,
}

/// A loader process's end of a ring, in Python.
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "Producer")]
pub struct Producer {
    state: Mutex<Option<State>>,
    ring: String,
    live: crate::process::Live,
}

fn closed(ring: &str) -> PyErr {
    exit_error(
        Exit::Usage,
        format!("the producer of ring {ring:?} is closed"),
    )
}

#[pymethods]
impl Producer {
    /// Joins ring `ring` as a loader: loads `config` (the same lookup as `pinring-loader
    /// --config`; None: `$PINRING_CONFIG`, ./config, ... else the built-in default), waits up to
    /// `wait` seconds for the ring, checks the config's fingerprint against the daemon's, and
    /// takes a seat in the loader table. `path`: where an anonymous ring is (`EmbeddedDaemon.path`).
    /// `peers`: how many producers are started together with this one (`Session::expect_peers`).
    /// `only_batches`: `(residue, modulus)`: claim only the parts of batches `b` with
    /// `b % modulus == residue` (`Session::keep_to_batches`: one of `modulus` streams).
    #[new]
    #[pyo3(signature = (ring, config=None, wait=30.0, path=None, peers=None, only_batches=None))]
    fn new(
        py: Python<'_>,
        ring: String,
        config: Option<std::path::PathBuf>,
        wait: f64,
        path: Option<std::path::PathBuf>,
        peers: Option<u32>,
        only_batches: Option<(u64, u64)>,
    ) -> PyResult<Self> {
        let wait = seconds("wait", wait)?;
        if let Some((residue, modulus)) = only_batches {
            if residue >= modulus {
                return Err(exit_error(
                    Exit::Usage,
                    format!(
                        "Producer(only_batches=({residue}, {modulus})): the residue must be \
                         below the modulus (0 to {}): pass (worker id, workers)",
                        modulus.saturating_sub(1)
                    ),
                ));
            }
        }
        if let Some(path) = &config {
            crate::convert::readable_config("Producer", path)?;
        }
        let overrides = Overrides {
            ring: Some(ring.clone()),
            spelling: Spelling::Keywords,
            ..Default::default()
        };
        let state = crate::signals::detach_interruptible(
            py,
            |stop| -> Result<State, loader::LoaderError> {
                let joined = if config.is_none() {
                    // The daemon's own spec, as its ring stores it: nothing read or resolved
                    // again (every ring with a consumer stores one).
                    match Session::join_adopting(&ring, path.as_deref(), wait, stop) {
                        Err(SessionError::NoStoredSpec { .. }) => None,
                        other => Some(other?),
                    }
                } else {
                    None
                };
                let joined = match joined {
                    Some(joined) => joined,
                    None => {
                        let mut cfg = settings::load(config.as_deref(), &overrides)?;
                        // A file kind: its length is the files' (as the daemon and
                        // pinring-loader find it).
                        pinring_sources::open_source(&mut cfg)?;
                        Session::join_at(cfg, path.as_deref(), wait, stop)?
                    }
                };
                let Some(session) = joined else {
                    // Stopped by a signal handler: its exception is raised instead of this.
                    return Err(pinring_ring::RingError::NotReady {
                        name: ring.clone(),
                        waited_ms: 0,
                        state: "interrupted",
                    }
                    .into());
                };
                Ok(State { session })
            },
        )?;
        let mut state = state.map_err(|e| e.to_pyerr())?;
        if let Some(n) = peers {
            state.session.expect_peers(n);
        }
        if let Some((residue, modulus)) = only_batches {
            state.session.keep_to_batches(residue, modulus);
        }
        // A producer writes whole samples: a ring whose samples are cut into byte parts is
        // pinring-loader's alone.
        if let Err(e) = state
            .session
            .config()
            .whole_samples_only("pinring.Producer")
        {
            return Err(exit_error(Exit::Config, e.to_string()));
        }
        Ok(Producer {
            state: Mutex::new(Some(state)),
            ring,
            live: crate::process::Live::new(),
        })
    }

    /// Claims the next part to make, waiting up to `timeout` seconds (None: as long as the
    /// daemon lives) with the GIL released. None once the daemon has ended the run (every part
    /// of the plan made). Raises `PeerDied` if the daemon dies or the timeout passes.
    #[pyo3(signature = (timeout=None))]
    fn claim(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<Part>>> {
        let deadline = timeout
            .map(|t| seconds("timeout", t))
            .transpose()?
            .map(|t| Instant::now() + t);
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = g.as_mut() else {
            return Err(closed(&self.ring));
        };
        let session = &mut st.session;
        let got = crate::signals::detach_interruptible(py, |stop| {
            session.claim(deadline, &mut || stop())
        })?;
        let claim = match got.map_err(|e| e.to_pyerr())? {
            Next::Part(c) => c,
            Next::Ended => return Ok(None),
            // detach_interruptible returned the handler's exception above.
            Next::Stopped => {
                return Err(exit_error(
                    Exit::Internal,
                    "interrupted without an exception",
                ))
            }
            Next::TimedOut => {
                return Err(crate::errors::Timeout::new_err(format!(
                    "ring {:?}: no free slot within {:.3} s",
                    self.ring,
                    timeout.unwrap_or_default()
                )))
            }
        };
        // The part the seq names, as the session's guard: a seq the plan cannot make is
        // committed failed by the session (as pinring-loader's), and its error raised.
        let joined = Arc::clone(st.session.joined());
        let mut guard = st
            .session
            .part(Arc::clone(&joined), claim, PartBuffers::default())
            .map_err(|failed| failed.error.to_pyerr())?;
        let part = *guard.part();
        let indices = guard.samples().to_vec();
        let owner: Arc<dyn crate::FieldOwner> = Arc::new(KeepAlive(Arc::clone(&joined)));
        let fields = PyDict::new(py);
        for mut view in guard.field_views().map_err(|e| e.to_pyerr())? {
            // SAFETY: the view is the field's chunk of the claimed slot (`len()` bytes, aligned
            // for its dtype, checked by the guard), which the protocol gives this claimant alone
            // until it commits; `owner` keeps the ring mapped as long as the field or any array
            // made from it lives. Writing after the commit is the caller's mistake (the part's
            // documentation says so); it cannot leave the mapping.
            let field = unsafe {
                Field::new(
                    view.as_mut_ptr().cast(),
                    view.dtype,
                    &view.shape,
                    Device::Cpu,
                    Arc::clone(&owner),
                )
            }?;
            fields.set_item(view.name, Py::new(py, field)?)?;
        }
        let place = crate::place::Place {
            seq: part.seq,
            batch: part.batch,
            epoch: part.epoch,
            index_in_epoch: part.index_in_epoch,
        };
        let part = Part {
            first_in_batch: part.first_in_batch,
            indices,
            fields: fields.unbind(),
            guard: Mutex::new(guard),
            joined,
        };
        Ok(Some(Py::new(
            py,
            PyClassInitializer::from(place).add_subclass(part),
        )?))
    }

    /// What the synthetic generator says each field of `part` holds: field name -> bytes (what
    /// `pinring-loader` would write into the part's chunks).
    fn synthetic<'py>(&self, py: Python<'py>, part: &Part) -> PyResult<Bound<'py, PyDict>> {
        synthetic_fields(py, &part.joined.cfg, &part.joined.layout, &part.indices)
    }

    /// The ring's name.
    #[getter]
    fn ring(&self) -> &str {
        &self.ring
    }

    /// This producer's index in the ring's loader table.
    #[getter]
    fn loader_index(&self) -> PyResult<u16> {
        let g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(|s| s.session.seat().index)
            .ok_or_else(|| closed(&self.ring))
    }

    /// Leaves the loader table. A part still claimed can no longer be committed (the daemon
    /// takes its slot back and has the part made elsewhere).
    fn close(&self, py: Python<'_>) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(st) = st {
            py.detach(|| st.session.leave());
        }
        self.live.end();
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // A forked child's copy: its seat in the loader table is the parent's.
        self.live.forget_if_copy(&mut self.state);
    }
}

/// One claimed part: fill `fields` (views of the slot), then `commit()`.
/// Where it stands in the plan (its seq, its batch's number, epoch and index in the epoch) is
/// its base, `Place`.
#[pyclass(module = "pinring._native", name = "Part", extends = crate::place::Place)]
pub struct Part {
    /// Index in its batch of the part's first sample.
    #[pyo3(get)]
    first_in_batch: u64,
    /// Dataset sample ids of the part, in payload order.
    #[pyo3(get)]
    indices: Vec<u64>,
    /// Field name -> writable Field of shape [samples in part, ...].
    #[pyo3(get)]
    fields: Py<PyDict>,
    /// The claimed part: written through `fields`, committed, or given back when dropped.
    guard: Mutex<PartGuard<Arc<Joined>>>,
    joined: Arc<Joined>,
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Part")
            .field("first_in_batch", &self.first_in_batch)
            .field("samples", &self.indices.len())
            .finish_non_exhaustive()
    }
}

#[pymethods]
impl Part {
    /// Writes the part's metadata after its payload and publishes the slot READY. Raises
    /// `PartReclaimed` (a `RingError`) if the daemon took the slot back first (the lease ran
    /// out, or the producer closed), `RingError` if the part's metadata does not fit its slot,
    /// `UsageError` if already committed. Do not write into the fields (or arrays made from
    /// them) after this: the slot is the daemon's again.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.guard.lock().unwrap_or_else(|p| p.into_inner());
        let guard = &mut *guard;
        match py.detach(|| guard.commit()) {
            Ok(_) => Ok(()),
            // The labels rule: the part is not committed, and may be fixed and committed again.
            Err(e @ PartError::Label { .. }) => Err(PyValueError::new_err(e.to_string())),
            Err(PartError::Commit(e)) => Err(crate::errors::commit_error(&e)),
            Err(e) => Err(e.to_pyerr()),
        }
    }

    /// Whether `commit()` has been called.
    #[getter]
    fn committed(&self) -> bool {
        !self.guard.lock().unwrap_or_else(|p| p.into_inner()).live()
    }

    /// Samples in the part.
    fn __len__(&self) -> usize {
        self.indices.len()
    }

    fn __repr__(slf: PyRef<'_, Self>) -> String {
        let place = slf.as_super();
        format!(
            "Part(seq={}, batch={}, samples={})",
            place.seq,
            place.batch,
            slf.indices.len()
        )
    }
}
