//! The daemon's doorbell: one futex word in the segment that loaders ring on commit and the
//! daemon's own threads (upload completions, sink) ring when they have something for the main
//! loop, so the main loop sleeps on exactly one word with a deadline.

use pinring_ring::Ring;
use std::sync::Arc;

/// A handle that rings the daemon's doorbell.
#[derive(Debug, Clone)]
pub struct Doorbell(Arc<Ring>);

impl Doorbell {
    /// For `ring`.
    pub fn new(ring: Arc<Ring>) -> Doorbell {
        Doorbell(ring)
    }

    /// Wakes the daemon's main loop.
    pub fn ring(&self) {
        self.0.ring_doorbell();
    }
}
