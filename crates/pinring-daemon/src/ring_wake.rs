//! The daemon's doorbell: one futex word in the segment that loaders ring on commit and the
//! daemon's own threads (upload completions, sink) ring when they have something for the main
//! loop, so the main loop sleeps on exactly one word with a deadline.

use pinring_ring::DaemonRing;
use std::sync::{Arc, Weak};

/// A handle that rings the daemon's doorbell. It does not keep the ring mapped: the upload
/// engine's completion hook holds one, and an engine can outlive its daemon (a consumer in the
/// same process holds it while tensors of its buffers live), which must not keep the daemon's
/// ring handle, and with it the daemon's liveness lock, open.
#[derive(Debug, Clone)]
pub struct Doorbell(Weak<DaemonRing>);

impl Doorbell {
    /// For `ring`.
    pub fn new(ring: Arc<DaemonRing>) -> Doorbell {
        Doorbell(Arc::downgrade(&ring))
    }

    /// Wakes the daemon's main loop (nothing once the daemon's ring is gone).
    pub fn ring(&self) {
        if let Some(ring) = self.0.upgrade() {
            ring.ring_doorbell();
        }
    }
}
