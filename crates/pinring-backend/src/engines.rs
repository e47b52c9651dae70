//! The daemon's upload engines of this process, by ring generation, for a consumer in the same
//! process (embedded mode, pinring-client's `EmbeddedDaemon`): it reaches the device buffers
//! through the engine itself instead of CUDA IPC, which a process cannot use on its own exports
//! (and some container runtimes refuse altogether). Here, beside the `Uploader` trait, so a
//! consumer finds the engine without linking the daemon.

use crate::Uploader;
use std::sync::{Arc, Mutex, Weak};

static ENGINES: Mutex<Vec<(u64, Weak<dyn Uploader>)>> = Mutex::new(Vec::new());

/// Records the upload engine of the ring of `generation` (the daemon, at start).
pub fn register(generation: u64, uploader: &Arc<dyn Uploader>) {
    let mut e = ENGINES.lock().unwrap_or_else(|p| p.into_inner());
    e.retain(|(_, w)| w.strong_count() > 0);
    e.push((generation, Arc::downgrade(uploader)));
}

/// The upload engine of the ring of `generation`, if a daemon of this process runs it.
pub fn engine(generation: u64) -> Option<Arc<dyn Uploader>> {
    let e = ENGINES.lock().unwrap_or_else(|p| p.into_inner());
    e.iter()
        .find(|(g, _)| *g == generation)
        .and_then(|(_, w)| w.upgrade())
}
