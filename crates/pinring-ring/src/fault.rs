//! A segment truncated under a process: SIGBUS contained, as exit code 4.
//!
//! Any process that may write the segment file can `ftruncate` it. Pages past the new end are
//! gone, and the next access to one of them raises SIGBUS, which would kill the daemon or a loader
//! with status 135 and leave the segment behind. Truncation cannot be prevented on a named tmpfs
//! file (seals exist only for memfds, and a named ring is what lets loaders, status views and
//! systemd units find it), so it is contained instead: every mapping registers its address range
//! here, and a SIGBUS whose fault address lies inside one is the ring's fault:
//! - in the mapping's creator (the daemon), the handler removes the name if it still refers to
//!   the truncated file, puts anonymous zero pages over the whole mapping (`mmap(MAP_FIXED)`),
//!   marks the mapping [`faulted`] and returns: the faulting access runs again on the zero
//!   pages. The daemon looks at the mark before it books any completion and on every pass, and
//!   stops through its normal error path: exit code 4 ("ring") *with* its summary and resume
//!   point, where an exit from the handler could write neither. Nothing read from the zero
//!   pages is delivered: a copy that read them completes after the mark was set, in the thread
//!   that faulted, and the daemon sees the mark before it books that completion;
//! - in any other process (a loader, a consumer), or if the zero pages cannot be mapped, the
//!   handler ends the process with a message naming the ring and exit code 4.
//!
//! A SIGBUS anywhere else is handed to the action that was installed before, or to the default
//! one.
//!
//! Everything the handler touches is preformatted in fixed-size atomics, and it calls only
//! async-signal-safe functions (`write`, `stat`, `unlink`, `sigaction`, `_exit`) and `mmap`, a
//! plain system call (no lock in the C library; Linux does not list it as async-signal-safe,
//! but the C library's wrapper only traps into the kernel).

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
    /// Set by the handler once it has put zero pages over the mapping.
    faulted: AtomicBool,
    dev: AtomicU64,
    ino: AtomicU64,
    path: [AtomicU8; PATH_BYTES],
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    owner: AtomicBool::new(false),
    faulted: AtomicBool::new(false),
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
    e.faulted.store(false, Relaxed);
    // Release: the handler's Acquire load of `base` sees every field above.
    e.base.store(w.base, Release);
    Some(i)
}

/// Marks entry `i` as this process's own segment (after the daemon published it).
pub fn set_owner(i: usize, owner: bool) {
    TABLE[i].owner.store(owner, Release);
}

/// Whether the mapping of entry `i` was truncated under this process and now holds zero pages
/// (the creator's only; every other process exits from the handler).
pub fn faulted(i: usize) -> bool {
    // Acquire: pairs with the handler's Release store, which follows the remap.
    TABLE[i].faulted.load(Acquire)
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
        let owner = e.owner.load(Acquire);
        if owner {
            // SAFETY: an all-zero stat is a valid out-buffer; `path` is NUL-terminated.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: stat(2) is async-signal-safe; `path` is NUL-terminated, `st` writable.
            let found = unsafe { libc::stat(path.as_ptr().cast(), &mut st) } == 0;
            if found && st.st_dev == e.dev.load(Relaxed) && st.st_ino == e.ino.load(Relaxed) {
                // SAFETY: unlink(2) is async-signal-safe; `path` is NUL-terminated. The name
                // refers to this process's own (truncated) segment: checked just above.
                unsafe { libc::unlink(path.as_ptr().cast()) };
            }
            let len = e.len.load(Relaxed);
            // SAFETY: [base, base + len) is exactly this process's mapping of the segment
            // (registered by `watch`, unregistered before it is unmapped). MAP_FIXED replaces
            // it in place with private zero pages, so every pointer into it stays valid and
            // reads zeros; nothing else lives in that range.
            let zeros = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if zeros as usize == base {
                // Release: whoever sees the mark sees the zero pages in place.
                e.faulted.store(true, Release);
                write_stderr(b"pinring: the ring segment ");
                write_stderr(&path[..n]);
                write_stderr(
                    b" was truncated under this process (a fault on a page past its new end): \
                      its name was removed; the daemon stops with code 4 after writing its \
                      summary; find who resized the segment\n",
                );
                return;
            }
        }
        write_stderr(b"pinring: the ring segment ");
        write_stderr(&path[..n]);
        write_stderr(
            b" was truncated under this process (a fault on a page past its new end): \
              exiting with code 4; restart the daemon, and find who resized the segment\n",
        );
        if owner {
            write_stderr(b"pinring: removed the truncated segment\n");
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
