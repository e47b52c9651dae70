//! A segment truncated under a process: SIGBUS contained as exit code 4.
//!
//! Any process that may write the segment file can `ftruncate` it. Pages past the new end are
//! gone, and the next access to one of them raises SIGBUS, which would kill the daemon or a loader
//! with status 135 and leave the segment behind. Truncation cannot be prevented on a named tmpfs
//! file (seals exist only for memfds, and a named ring is what lets loaders, status views and
//! systemd units find it), so it is contained instead: every mapping registers its address range
//! here, and a SIGBUS whose fault address lies inside one ends the process with a message naming
//! the ring and exit code 4 ("ring"). The mapping's creator (the daemon) also removes the name,
//! if it still refers to the truncated file, so nothing is left behind. A SIGBUS anywhere else is
//! handed to the action that was installed before, or to the default one.
//!
//! Everything the handler touches is preformatted in fixed-size atomics, and it calls only
//! async-signal-safe functions (`write`, `stat`, `unlink`, `sigaction`, `_exit`).

use nix::libc;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Mutex, Once, OnceLock};

/// Mappings watched at once (a process maps one or two rings).
const ENTRIES: usize = 16;
/// Bytes of a preformatted path (with its NUL).
const PATH_BYTES: usize = 128;

struct Entry {
    /// 0: free.
    base: AtomicUsize,
    len: AtomicUsize,
    /// Remove the name on a fault (the creator only).
    owner: AtomicBool,
    dev: AtomicU64,
    ino: AtomicU64,
    path: [AtomicU8; PATH_BYTES],
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    owner: AtomicBool::new(false),
    dev: AtomicU64::new(0),
    ino: AtomicU64::new(0),
    path: [const { AtomicU8::new(0) }; PATH_BYTES],
};

static TABLE: [Entry; ENTRIES] = [EMPTY; ENTRIES];
/// Serialises registration (the handler itself only reads).
static REGISTER: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();
/// The action that was installed before ours, for faults that are not ours. Set once; reading it
/// in the handler is one atomic load (no lock).
static PREVIOUS: OnceLock<SigAction> = OnceLock::new();

/// What the handler needs to know about one mapping.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Start of the mapping.
    pub base: usize,
    /// Length of the mapping.
    pub len: usize,
    /// The file's path.
    pub path: String,
    /// (st_dev, st_ino) of the mapped file.
    pub identity: (u64, u64),
    /// Whether this process created the segment (and removes its name on a fault).
    pub owner: bool,
}

/// Watches a mapping until [`unwatch`]; installs the handler on first use. Returns the table
/// index, or `None` if the table is full (the mapping is then unprotected, as before).
pub fn watch(w: &Watched) -> Option<usize> {
    install();
    let _guard = REGISTER.lock().unwrap_or_else(|p| p.into_inner());
    let i = TABLE.iter().position(|e| e.base.load(Relaxed) == 0)?;
    let e = &TABLE[i];
    let bytes = w.path.as_bytes();
    let n = bytes.len().min(PATH_BYTES - 1);
    for (k, slot) in e.path.iter().enumerate() {
        slot.store(if k < n { bytes[k] } else { 0 }, Relaxed);
    }
    e.len.store(w.len, Relaxed);
    e.owner.store(w.owner, Relaxed);
    e.dev.store(w.identity.0, Relaxed);
    e.ino.store(w.identity.1, Relaxed);
    // Release: the handler's Acquire load of `base` sees every field above.
    e.base.store(w.base, Release);
    Some(i)
}

/// Marks entry `i` as this process's own segment (after the daemon published it).
pub fn set_owner(i: usize, owner: bool) {
    TABLE[i].owner.store(owner, Release);
}

/// Stops watching entry `i` (before the mapping goes away).
pub fn unwatch(i: usize) {
    let _guard = REGISTER.lock().unwrap_or_else(|p| p.into_inner());
    TABLE[i].base.store(0, Release);
}

fn install() {
    INSTALL.call_once(|| {
        let ours = SigAction::new(
            SigHandler::SigAction(on_sigbus),
            SaFlags::SA_SIGINFO | SaFlags::SA_NODEFER,
            SigSet::empty(),
        );
        // SAFETY: the handler is async-signal-safe (see `on_sigbus`); replacing the SIGBUS
        // action affects only faults, and faults that are not ours go to the previous action.
        if let Ok(previous) = unsafe { sigaction(Signal::SIGBUS, &ours) } {
            let _ = PREVIOUS.set(previous);
        }
    });
}

fn write_stderr(bytes: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for its length.
    let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid, aligned siginfo for an SA_SIGINFO handler.
    let info = unsafe { &*info };
    // SAFETY: si_addr is the union member the kernel fills for SIGBUS.
    let addr = unsafe { info.si_addr() } as usize;
    for e in &TABLE {
        let base = e.base.load(Acquire);
        if base == 0 || addr < base || addr - base >= e.len.load(Relaxed) {
            continue;
        }
        let mut path = [0u8; PATH_BYTES];
        for (dst, src) in path.iter_mut().zip(e.path.iter()) {
            *dst = src.load(Relaxed);
        }
        let n = path.iter().position(|&b| b == 0).unwrap_or(PATH_BYTES - 1);
        write_stderr(b"pinring: the ring segment ");
        write_stderr(&path[..n]);
        write_stderr(
            b" was truncated under this process (a fault on a page past its new end): \
              exiting with code 4; restart the daemon, and find who resized the segment\n",
        );
        if e.owner.load(Acquire) {
            // SAFETY: an all-zero stat is a valid out-buffer; `path` is NUL-terminated.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: stat(2) is async-signal-safe; `path` is NUL-terminated, `st` writable.
            let found = unsafe { libc::stat(path.as_ptr().cast(), &mut st) } == 0;
            if found && st.st_dev == e.dev.load(Relaxed) && st.st_ino == e.ino.load(Relaxed) {
                // SAFETY: unlink(2) is async-signal-safe; `path` is NUL-terminated. The name
                // refers to this process's own (truncated) segment: checked just above.
                unsafe { libc::unlink(path.as_ptr().cast()) };
                write_stderr(b"pinring: removed the truncated segment\n");
            }
        }
        // SAFETY: _exit(2) is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(4) };
    }
    // Not a fault on a ring: restore the previous action and return, so the faulting
    // instruction runs again under it (the default action ends the process with a core dump).
    let restore = PREVIOUS
        .get()
        .copied()
        .unwrap_or_else(|| SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty()));
    // SAFETY: sigaction(2) is async-signal-safe; the action is a copy of a valid one.
    let _ = unsafe { sigaction(Signal::SIGBUS, &restore) };
}
