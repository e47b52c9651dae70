//! Blocking calls that Ctrl-C can interrupt. Every wait of the module runs with the GIL released
//! (`py.detach`), where Python's signal handlers cannot run: a SIGINT only sets a flag that the
//! interpreter looks at once it has the GIL again. So each wait is given a stop check
//! ([`detach_interruptible`]) that its loop calls at least every 100 ms: it takes the GIL for a
//! moment and runs `PyErr_CheckSignals`; a handler that raises (the default SIGINT handler's
//! `KeyboardInterrupt`) ends the wait, and the exception is raised in the caller.

use pyo3::prelude::*;
use std::sync::Mutex;

/// Runs `wait` with the GIL released, handing it a stop check that runs Python's signal handlers
/// (at most as often as `wait` calls it). If a handler raised, its exception is returned
/// instead of `wait`'s result, which is then whatever the wait made of being stopped.
pub(crate) fn detach_interruptible<T: Send>(
    py: Python<'_>,
    wait: impl FnOnce(&dyn Fn() -> bool) -> T + Send,
) -> PyResult<T> {
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let out = py.detach(|| {
        let stop = || {
            let mut pending = raised.lock().unwrap_or_else(|p| p.into_inner());
            if pending.is_some() {
                return true;
            }
            match Python::attach(|py| py.check_signals()) {
                Ok(()) => false,
                Err(e) => {
                    *pending = Some(e);
                    true
                }
            }
        };
        wait(&stop)
    });
    match raised.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}
