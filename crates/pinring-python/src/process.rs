//! What `pinring.torch` needs to start worker processes soundly (docs/PYTHON.md, "Workers"):
//! whether this process holds pinring rings or threads now ([`live_rings`]: a process that does
//! must not be forked into a worker factory, since its threads' locks and its rings' file locks
//! would be copied), and a worker's tie to its parent's life ([`die_with_parent`]).

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// This process's id, once read; 0 until then, and again in a forked child (`os.fork` runs
/// [`after_fork_in_child`] there). `std::process::id()` is a system call each time (glibc keeps
/// no copy), and every DLPack tensor asks twice, made and freed: with two fields a batch, a
/// Python loop taking 64 KiB token batches spent 17% of its time in `getpid`.
static PID: AtomicU32 = AtomicU32::new(0);

/// This process's id (see [`PID`]).
pub(crate) fn pid() -> u32 {
    // Relaxed: the value is this process's own, the same whichever thread reads or writes it.
    match PID.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

/// Registered with `os.register_at_fork(after_in_child=...)` when the module loads: a forked
/// child forgets its parent's id. Python's own `fork` is the one way a child of this process
/// runs Python code (the `multiprocessing` fork start method and torch's workers use it).
#[pyfunction]
#[pyo3(name = "_after_fork_in_child")]
pub(crate) fn after_fork_in_child() {
    PID.store(0, Ordering::Relaxed);
}

/// Ring handles (embedded daemons with their threads, consumers, producers) open in this process.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// One ring handle, counted in [`LIVE`] from its making until [`Live::end`] or its drop, and
/// the process that made it.
#[derive(Debug)]
pub(crate) struct Live(AtomicBool, u32);

impl Live {
    pub(crate) fn new() -> Live {
        // Relaxed: a count read by this process's own Python code, ordered by the GIL.
        LIVE.fetch_add(1, Ordering::Relaxed);
        Live(AtomicBool::new(true), pid())
    }

    /// Whether this is a forked child's copy of the handle (its garbage collector freeing a
    /// copied object): its teardown (joining threads, releasing locks and CUDA memory) is the
    /// parent's, and must not run here.
    pub(crate) fn forked_copy(&self) -> bool {
        self.1 != pid()
    }

    /// In a forked child's copy of a handle, takes what `inner` holds and forgets it, so none of
    /// the parent's teardown runs here; returns whether it did (then the caller's drop has
    /// nothing left to do).
    pub(crate) fn forget_if_copy<T>(&self, inner: &mut std::sync::Mutex<Option<T>>) -> bool {
        if !self.forked_copy() {
            return false;
        }
        std::mem::forget(inner.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        true
    }

    /// The handle was closed: no longer counted (once, however often it is called).
    pub(crate) fn end(&self) {
        if self.0.swap(false, Ordering::Relaxed) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.end();
    }
}

/// How many pinring ring handles (`EmbeddedDaemon`, `Consumer`, `Producer`) are open in this
/// process. 0 means no pinring daemon thread runs and no ring's file is open here, so a `fork`
/// copies none of them.
#[pyfunction]
#[pyo3(name = "_live_rings")]
pub fn live_rings() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Asks the kernel to send `signal` to this process when its parent ends
/// (`prctl(PR_SET_PDEATHSIG)`); returns False if the parent had already ended (the process has
/// been re-parented: `getppid()` is no longer `parent`), in which case the caller should end.
#[pyfunction]
#[pyo3(name = "_die_with_parent")]
pub fn die_with_parent(signal: i32, parent: i32) -> PyResult<bool> {
    let sig = nix::sys::signal::Signal::try_from(signal)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("signal {signal}: {e}")))?;
    nix::sys::prctl::set_pdeathsig(sig).map_err(|e| {
        pyo3::exceptions::PyOSError::new_err(format!("prctl(PR_SET_PDEATHSIG): {e}"))
    })?;
    // The parent may have ended between the fork and the prctl: then no signal comes.
    Ok(nix::unistd::getppid().as_raw() == parent)
}
