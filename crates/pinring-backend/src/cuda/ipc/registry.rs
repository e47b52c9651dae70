//! The CUDA IPC memory handles this process has exported and opened, so that the two mistakes
//! the driver answers only with a bare code are caught first with a clear error: opening a
//! handle this process exported itself, and opening a handle a second time in one process on one
//! device (legacy IPC handles can be opened once per process and device).

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use crate::BackendError;

/// A set of (device, memory handle) keys; each entry is held by a [`Held`] and leaves the set
/// when it drops.
#[derive(Debug, Default)]
pub(crate) struct HandleSet {
    keys: Mutex<BTreeSet<(Option<usize>, [u8; 64])>>,
}

/// Handles exported by this process (device `None`: a handle names its device).
pub(crate) static EXPORTED: HandleSet = HandleSet::new();
/// Handles opened by this process, per device ordinal.
pub(crate) static OPENED: HandleSet = HandleSet::new();

impl HandleSet {
    pub(crate) const fn new() -> Self {
        Self {
            keys: Mutex::new(BTreeSet::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<(Option<usize>, [u8; 64])>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `handle` is in the set for `device`.
    pub(crate) fn contains(&self, device: Option<usize>, handle: &[u8; 64]) -> bool {
        self.lock().contains(&(device, *handle))
    }

    /// Adds `handle` for `device`, or `None` if it is there already.
    pub(crate) fn hold(&'static self, device: Option<usize>, handle: [u8; 64]) -> Option<Held> {
        // The lock is released at the end of this statement, before a `Held` can exist (its
        // drop takes the lock again).
        let inserted = self.lock().insert((device, handle));
        inserted.then(|| Held {
            set: self,
            key: (device, handle),
        })
    }

    /// [`HandleSet::hold`] for opening buffer `buffer` of an import: `IpcAlreadyOpen` if this
    /// process holds it open on `device` already.
    pub(crate) fn hold_open(
        &'static self,
        device: usize,
        buffer: usize,
        handle: [u8; 64],
    ) -> Result<Held, BackendError> {
        self.hold(Some(device), handle)
            .ok_or(BackendError::IpcAlreadyOpen { buffer, device })
    }
}

/// One entry of a [`HandleSet`]; dropping it removes the entry.
#[derive(Debug)]
pub(crate) struct Held {
    set: &'static HandleSet,
    key: (Option<usize>, [u8; 64]),
}

impl Drop for Held {
    fn drop(&mut self) {
        self.set.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static SET: HandleSet = HandleSet::new();

    #[test]
    fn a_handle_is_held_once_per_device_until_dropped() {
        let h = [7u8; 64];
        let first = SET.hold_open(0, 3, h).unwrap();
        let e = SET.hold_open(0, 5, h).unwrap_err();
        assert!(
            matches!(
                e,
                BackendError::IpcAlreadyOpen {
                    buffer: 5,
                    device: 0
                }
            ),
            "{e}"
        );
        let msg = e.to_string();
        assert!(msg.contains("device buffer 5 on device 0"), "{msg}");
        assert!(msg.contains("once per process and device"), "{msg}");
        // Another device is another key.
        let other = SET.hold_open(1, 3, h).unwrap();
        assert!(SET.contains(Some(0), &h));
        drop(first);
        assert!(!SET.contains(Some(0), &h));
        let again = SET.hold_open(0, 3, h).unwrap();
        drop((again, other));
        assert!(!SET.contains(Some(1), &h));
    }
}
