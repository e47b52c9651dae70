//! Helpers shared by the ring's integration tests: a test's private ring, removed at the end.

#![allow(dead_code)]

use pinring_ring::CreateOptions;
use std::time::Duration;

/// How long an open waits for a ring that is still initialising.
pub const T: Duration = Duration::from_secs(2);

/// Removes a ring's name when dropped.
pub struct Unlink(pub String);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = pinring_ring::Segment::unlink(&self.0);
    }
}

/// Options for a small private ring (4 slots of 8 KiB, seqs `0..end_seq`) named after `tag` and
/// this process, and the guard that removes it.
pub fn opts(tag: &str, end_seq: u64) -> (CreateOptions, Unlink) {
    let name = format!("t-{tag}-{}", std::process::id());
    let o = CreateOptions {
        name: name.clone(),
        slots: 4,
        slot_bytes: 8192,
        mode: 0o600,
        group: None,
        fingerprint: 0xabc,
        settings: [0; pinring_ring::layout::SETTINGS_WORDS],
        start_seq: 0,
        end_seq,
        in_order: true,
        replace: false,
        handoff: None,
        anonymous: false,
    };
    (o, Unlink(name))
}

/// The ring as any process that maps it sees it, to scribble on: the daemon's handle has no
/// way to the layout.
pub fn forger(daemon: &pinring_ring::DaemonRing) -> pinring_ring::Ring {
    pinring_ring::Ring::open(daemon.name(), pinring_ring::Access::ReadWrite, T).unwrap()
}
