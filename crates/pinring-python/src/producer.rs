//! A loader in Python: [`Producer`] is a pinring-producer `Session`, the one `pinring-loader`
//! runs: it joins a ring's loader table the same way (`Session::join`), claims FREE slots in the
//! same loop (`Session::claim`) and hands each one to Python as a [`Part`]: the part's seq,
//! batch and sample ids, and one writable [`Field`] per batch field viewing that field's chunk
//! of the part in the slot (field-major, `FieldPlacement::chunk_in_part`). `Part.commit()`
//! writes the part's metadata and commits the slot READY through what the session joined
//! (`Joined::write_meta`, `Joined::commit`). Nothing of the protocol lives in Python.
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

use pinring_data::{BatchIndices, BatchMeta, DatasetKind, Dtype, LABELS};
use pinring_exit::Exit;
use pinring_producer::loader;
use pinring_producer::{Joined, Next, Session};
use pinring_ring::failure::ERR_PLAN;
use pinring_ring::{Claim, CommitError};
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
    #[new]
    #[pyo3(signature = (ring, config=None, wait=30.0, path=None, peers=None))]
    fn new(
        py: Python<'_>,
        ring: String,
        config: Option<std::path::PathBuf>,
        wait: f64,
        path: Option<std::path::PathBuf>,
        peers: Option<u32>,
    ) -> PyResult<Self> {
        let wait = seconds("wait", wait)?;
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
                let mut cfg = settings::load(config.as_deref(), &overrides)?;
                // A file kind: its length is the files' (as the daemon and pinring-loader find it).
                pinring_sources::open_source(&mut cfg)?;
                let name = cfg.ring.name.clone();
                let Some(session) = Session::join_at(cfg, path.as_deref(), wait, stop)? else {
                    // Stopped by a signal handler: its exception is raised instead of this.
                    return Err(pinring_ring::RingError::NotReady {
                        name,
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
    fn claim(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Part>> {
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
        let started = Instant::now();
        let seq = claim.seq();
        let mut samples = Vec::new();
        let part = match st.session.part_into(seq, &mut samples) {
            Ok(p) => p,
            Err(e) => {
                // The Rust loader's answer to a seq it cannot make: commit it as an error.
                let _ = st
                    .session
                    .joined()
                    .commit(claim, 0, 0, 0, ERR_PLAN, started);
                return Err(e.to_pyerr());
            }
        };
        let joined = st.session.joined();
        let base = joined.ring.slot_ptr(claim.slot());
        let slot_bytes = joined.ring.geometry().slot_bytes;
        let n = samples.len() as u64;
        let owner: Arc<dyn crate::FieldOwner> = Arc::new(KeepAlive(Arc::clone(joined)));
        let fields = PyDict::new(py);
        if joined.layout.payload_bytes(n) > slot_bytes {
            return Err(exit_error(
                Exit::Internal,
                format!("ring {:?}: part {seq} does not fit its slot", self.ring),
            ));
        }
        for f in &joined.layout.fields {
            let (offset, _) = f.chunk_in_part(n);
            let mut shape = vec![n as usize];
            shape.extend(f.shape[1..].iter().map(|&d| d as usize));
            // SAFETY: offset < payload_bytes(n) <= slot_bytes (checked above), so the pointer
            // stays inside the slot.
            let ptr = unsafe { base.add(offset as usize) };
            if (ptr as usize) % f.dtype.size_of() != 0 {
                return Err(exit_error(
                    Exit::Internal,
                    format!(
                        "field {:?} ({}) of part {seq} starts at byte {offset} of its slot, not \
                         a multiple of its element size: declare fields with larger elements \
                         first (8-byte, then 4, 2, 1)",
                        f.name, f.dtype
                    ),
                ));
            }
            // SAFETY: the chunk (n × sample_bytes bytes from `offset`) lies inside the claimed
            // slot (payload_bytes(n) <= slot_bytes), which the protocol gives this claimant
            // alone until it commits; `owner` keeps the ring mapped as long as the field or any
            // array made from it lives. Writing after the commit is the caller's mistake (the
            // part's documentation says so); it cannot leave the mapping.
            let field = unsafe {
                Field::new(ptr.cast(), f.dtype, &shape, Device::Cpu, Arc::clone(&owner))
            }?;
            fields.set_item(&f.name, Py::new(py, field)?)?;
        }
        Ok(Some(Part {
            seq,
            batch: part.batch,
            epoch: part.epoch,
            index_in_epoch: part.index_in_epoch,
            first_in_batch: part.first_in_batch,
            indices: samples,
            fields: fields.unbind(),
            claim: Mutex::new(Some(claim)),
            joined: Arc::clone(joined),
            started,
        }))
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
#[pyclass(module = "pinring._native", name = "Part")]
pub struct Part {
    /// The part's seq.
    #[pyo3(get)]
    seq: u64,
    /// Its batch's number.
    #[pyo3(get)]
    batch: u64,
    /// Its batch's epoch.
    #[pyo3(get)]
    epoch: u32,
    /// Its batch's index in the epoch.
    #[pyo3(get)]
    index_in_epoch: u64,
    /// Index in its batch of the part's first sample.
    #[pyo3(get)]
    first_in_batch: u64,
    /// Dataset sample ids of the part, in payload order.
    #[pyo3(get)]
    indices: Vec<u64>,
    /// Field name -> writable Field of shape [samples in part, ...].
    #[pyo3(get)]
    fields: Py<PyDict>,
    claim: Mutex<Option<Claim>>,
    joined: Arc<Joined>,
    started: Instant,
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Part")
            .field("seq", &self.seq)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl Part {
    /// The meta labels: the values of an integer `labels` field in the slot, if there is one
    /// and they fit a u32; otherwise the generator's for synthetic samples (as the Rust loader
    /// computes them), and none for others.
    fn labels(&self, claim: &Claim) -> PyResult<Vec<u32>> {
        let j = &self.joined;
        let n = self.indices.len();
        let fallback = || match j.cfg.dataset.kind {
            DatasetKind::Synthetic => j.cfg.synthetic().labels(&self.indices),
            DatasetKind::External
            | DatasetKind::Tokens
            | DatasetKind::Npy
            | DatasetKind::WebDataset
            | DatasetKind::ImageFolder => Vec::new(),
        };
        let Some(f) = j.layout.field(LABELS) else {
            return Ok(fallback());
        };
        let width = match f.dtype {
            Dtype::I64 | Dtype::I32 if f.shape.len() == 1 => f.dtype.size_of(),
            _ => return Ok(fallback()),
        };
        let (offset, _) = f.chunk_in_part(n as u64);
        let base = j.ring.slot_ptr(claim.slot());
        (0..n)
            .map(|i| {
                let mut b = [0u8; 8];
                // SAFETY: the labels chunk (n × width bytes at `offset`) lies inside the
                // claimed slot (checked when the part was made), so the address stays in it.
                let src = unsafe { base.add(offset as usize + i * width) };
                // SAFETY: `src..src + width` lies inside the claimed slot (above), which this
                // process filled; `b` is a local of 8 >= width bytes.
                unsafe { std::ptr::copy_nonoverlapping(src, b.as_mut_ptr(), width) };
                let v = if width == 8 {
                    i64::from_le_bytes(b)
                } else {
                    i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                };
                u32::try_from(v).map_err(|_| {
                    PyValueError::new_err(format!(
                        "part {}: label {v} of sample {i} is not in 0..2^32 (the metadata's labels \
                         are u32)",
                        self.seq
                    ))
                })
            })
            .collect()
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
        let mut g = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        let Some(claim) = g.as_ref() else {
            return Err(exit_error(
                Exit::Usage,
                format!("part {} is already committed", self.seq),
            ));
        };
        let labels = self.labels(claim)?;
        let (shape, dtype) = self.joined.cfg.first_field();
        let Some(mut claim) = g.take() else {
            return Err(exit_error(
                Exit::Usage,
                format!("part {} is already committed", self.seq),
            ));
        };
        let j = &self.joined;
        let indices = BatchIndices {
            seq: self.seq,
            epoch: self.epoch,
            index_in_epoch: self.index_in_epoch,
            samples: self.indices.clone(),
        };
        let meta = BatchMeta::new(&indices, labels, shape, dtype, j.layout.record_bytes);
        let n = self.indices.len();
        let payload_len = j.layout.payload_bytes(n as u64) as usize;
        let started = self.started;
        py.detach(|| {
            let mut slot = j.ring.slot_writer(&mut claim);
            let fits = payload_len <= slot.len();
            let mut buf = Vec::new();
            let (payload, meta_len, error) =
                j.write_meta(&mut slot, &meta, payload_len, fits, &mut buf);
            j.commit(claim, payload, meta_len, n as u32, error, started)
        })
        .map_err(|e: CommitError| crate::errors::commit_error(&e))
    }

    /// Whether `commit()` has been called.
    #[getter]
    fn committed(&self) -> bool {
        self.claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Samples in the part.
    fn __len__(&self) -> usize {
        self.indices.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "Part(seq={}, batch={}, samples={})",
            self.seq,
            self.batch,
            self.indices.len()
        )
    }
}
