//! pinring's exceptions: one class per exit code of the binaries (README, "Exit codes";
//! `pinring_exit::Exit`), all under `pinring.PinringError`, each carrying pinring's own
//! message. The class attributes `exit_code` and `exit_name` say which code it stands for, so a
//! Python program can `sys.exit(e.exit_code)` as the binaries would.
//!
//! Rust code turns the workspace's errors into them with [`ToPyErr::to_pyerr`] (or
//! [`OrRaise::or_raise`] on a `Result`), and an exit code with a message of its own with
//! [`exit_error`].

use pinring_exit::{Coded, Exit};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyType;

pyo3::create_exception!(
    pinring,
    PinringError,
    PyException,
    "Base class of pinring's errors; `exit_code` and `exit_name` say which exit code of the \
     pinring binaries it corresponds to."
);
pyo3::create_exception!(
    pinring,
    InternalError,
    PinringError,
    "An unexpected internal error: a bug (exit code 1)."
);
pyo3::create_exception!(
    pinring,
    UsageError,
    PinringError,
    "A bad argument (exit code 2)."
);
pyo3::create_exception!(
    pinring,
    ConfigError,
    PinringError,
    "A bad config: syntax, unknown key, value out of range (exit code 3)."
);
pyo3::create_exception!(
    pinring,
    RingError,
    PinringError,
    "A ring or segment error: missing, corrupt, other layout version, truncated, permission \
     denied, or a slot holding something that must not be used (exit code 4)."
);
pyo3::create_exception!(
    pinring,
    PartReclaimed,
    RingError,
    "A commit refused because the daemon took the part back first: its lease ran out (or its \
     producer was presumed dead), and the part is made again by another loader. A `RingError` \
     (exit code 4); a producer may go on claiming."
);
pyo3::create_exception!(
    pinring,
    PeerDied,
    PinringError,
    "A peer died: the ring's daemon is gone (exit code 5)."
);
pyo3::create_exception!(
    pinring,
    Timeout,
    PeerDied,
    "A wait ran out of time: no batch (or no slot) came within the timeout given (exit code \
     5, as a peer that stopped making progress)."
);
pyo3::create_exception!(
    pinring,
    VerifyError,
    PinringError,
    "Verification failed: wrong bytes, a duplicate, a batch out of order or missing (exit code \
     6)."
);
pyo3::create_exception!(
    pinring,
    BackendError,
    PinringError,
    "A GPU backend error: no driver or device, a CUDA call failed (exit code 7)."
);
pyo3::create_exception!(
    pinring,
    RefusedError,
    PinringError,
    "Refused by the ring: the config differs from the daemon's, or the loader table is full \
     (exit code 8)."
);
pyo3::create_exception!(
    pinring,
    OutputError,
    PinringError,
    "An output file could not be written (exit code 9)."
);

/// The exception class for an exit code (`Exit::Ok`, which is no error, gets `InternalError`).
pub fn exception_type(py: Python<'_>, exit: Exit) -> Bound<'_, PyType> {
    match exit {
        Exit::Ok | Exit::Internal => py.get_type::<InternalError>(),
        Exit::Usage => py.get_type::<UsageError>(),
        Exit::Config => py.get_type::<ConfigError>(),
        Exit::Ring => py.get_type::<RingError>(),
        Exit::PeerDied => py.get_type::<PeerDied>(),
        Exit::Verify => py.get_type::<VerifyError>(),
        Exit::Backend => py.get_type::<BackendError>(),
        Exit::Refused => py.get_type::<RefusedError>(),
        Exit::Output => py.get_type::<OutputError>(),
    }
}

/// The exception for `exit`, with `message`.
pub fn exit_error(exit: Exit, message: impl Into<String>) -> PyErr {
    let message = message.into();
    match exit {
        Exit::Ok | Exit::Internal => InternalError::new_err(message),
        Exit::Usage => UsageError::new_err(message),
        Exit::Config => ConfigError::new_err(message),
        Exit::Ring => RingError::new_err(message),
        Exit::PeerDied => PeerDied::new_err(message),
        Exit::Verify => VerifyError::new_err(message),
        Exit::Backend => BackendError::new_err(message),
        Exit::Refused => RefusedError::new_err(message),
        Exit::Output => OutputError::new_err(message),
    }
}

/// An error of the workspace that has an exit code ([`Coded`], declared once by each error
/// type where it is defined), and so a pinring exception.
pub trait ToPyErr {
    /// The exception: the class for the error's exit code, the error's own message.
    fn to_pyerr(&self) -> PyErr;
}

impl<E: Coded + std::fmt::Display + ?Sized> ToPyErr for E {
    fn to_pyerr(&self) -> PyErr {
        exit_error(self.exit(), self.to_string())
    }
}

/// `result.or_raise()?` in a `#[pyfunction]`: a workspace error becomes its pinring exception.
pub trait OrRaise<T> {
    /// `Err(e)` becomes `Err(e.to_pyerr())`.
    fn or_raise(self) -> PyResult<T>;
}

impl<T, E: ToPyErr> OrRaise<T> for Result<T, E> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(|e| e.to_pyerr())
    }
}

/// A refused commit: `PartReclaimed` (a `RingError`) for a part the daemon took back, which the
/// producer may shrug off; `RingError` for the others (a part that does not fit its slot).
pub fn commit_error(e: &pinring_ring::CommitError) -> PyErr {
    match e {
        pinring_ring::CommitError::Reclaimed { .. } => PartReclaimed::new_err(e.to_string()),
        _ => e.to_pyerr(),
    }
}

/// Adds the exception classes to the module, each with its `exit_code` and `exit_name`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let base = py.get_type::<PinringError>();
    base.setattr("exit_code", Exit::Internal.code())?;
    base.setattr("exit_name", Exit::Internal.name())?;
    m.add("PinringError", base)?;
    for exit in Exit::ALL.into_iter().filter(|e| *e != Exit::Ok) {
        let ty = exception_type(py, exit);
        ty.setattr("exit_code", exit.code())?;
        ty.setattr("exit_name", exit.name())?;
        m.add(ty.name()?, ty)?;
    }
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("PartReclaimed", py.get_type::<PartReclaimed>())?;
    builtin_bases(py)
}

/// The builtin exception types each class also derives from, so that a script written against
/// `torch.utils.data.DataLoader` catches pinring's errors where torch's would be raised:
/// `UsageError` is a `ValueError` and a `TypeError` (torch raises one or the other for a bad
/// argument), `PeerDied` (and so `Timeout`) a `RuntimeError` (torch's for a dead worker and a
/// batch that timed out). Each keeps its own name and `PinringError` as its first base.
///
/// pyo3's `create_exception!` takes one base, so the others are added after the classes are
/// made, by assigning `__bases__`, which CPython allows for heap types whose instance layouts
/// agree: these builtins add no fields to `BaseException`'s.
fn builtin_bases(py: Python<'_>) -> PyResult<()> {
    use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
    let with = |ty: Bound<'_, PyType>, extra: Vec<Bound<'_, PyType>>| -> PyResult<()> {
        let mut bases: Vec<Bound<'_, PyType>> = vec![ty.getattr("__base__")?.cast_into()?];
        bases.extend(extra);
        ty.setattr("__bases__", pyo3::types::PyTuple::new(py, bases)?)
    };
    with(
        py.get_type::<UsageError>(),
        vec![py.get_type::<PyValueError>(), py.get_type::<PyTypeError>()],
    )?;
    with(
        py.get_type::<PeerDied>(),
        vec![py.get_type::<PyRuntimeError>()],
    )
}

/// `_error_for_exit(code, message)`: the exception for a pinring program's exit code, carrying
/// `message` (a loader that `pinring.Loader` started ended with that code).
#[pyfunction]
#[pyo3(name = "_error_for_exit")]
pub fn error_for_exit(
    py: Python<'_>,
    code: i32,
    message: String,
) -> PyResult<Py<pyo3::exceptions::PyBaseException>> {
    let exit = Exit::from_code(code).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!("{code} is no pinring exit code"))
    })?;
    Ok(exit_error(exit, message).into_value(py))
}
