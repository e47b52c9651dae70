//! A part that failed: a loader that cannot make its part commits it with an error code, and
//! for [`ERR_SAMPLE`] with its message in the slot, which the daemon reports when it stops the
//! run (docs/PROTOCOL.md, "A part that failed").

use crate::{Ring, SlotWriter};
use std::sync::atomic::Ordering::Relaxed;

/// Error code a loader commits when it cannot make the batch of a slot.
pub const ERR_PLAN: u32 = 1;
/// Error code for metadata that does not fit the slot.
pub const ERR_META: u32 = 2;
/// Error code a loader commits when a sample of its part cannot be read and
/// `dataset.on_bad_sample = "fail"` (the loader then exits with code 3).
pub const ERR_SAMPLE: u32 = 3;

/// Longest message a loader leaves in a part it commits with [`ERR_SAMPLE`] (the daemon reads
/// no more than this, however long the descriptor says it is).
pub const MAX_FAILURE_MESSAGE: usize = 2048;

/// Writes `message` (cut to [`MAX_FAILURE_MESSAGE`] bytes at a character boundary, and to the
/// slot) at byte 0 of a part that failed; returns the length to commit as its `meta_len`, with
/// a payload of 0 bytes and the error code (docs/PROTOCOL.md, "A part that failed").
pub fn write_failure(slot: &mut SlotWriter<'_>, message: &str) -> u64 {
    let mut n = message.len().min(MAX_FAILURE_MESSAGE).min(slot.len());
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    match slot.write(0, &message.as_bytes()[..n]) {
        Ok(()) => n as u64,
        Err(_) => 0,
    }
}

/// The daemon's reading of a failed part's message (the slot is taken: the daemon's). The
/// length comes from the segment, so it is cut to [`MAX_FAILURE_MESSAGE`] and the slot; the
/// bytes may be anything, so they are decoded lossily and control characters are replaced: a
/// hostile loader can make the message say nothing useful, never forge log lines.
pub fn read_failure(ring: &Ring, slot: u32) -> String {
    let len = u64::from(ring.desc(slot).meta_len.load(Relaxed))
        .min(MAX_FAILURE_MESSAGE as u64)
        .min(ring.geometry().slot_bytes);
    let mut buf = Vec::new();
    ring.copy_out(slot, 0, len, &mut buf);
    let text: String = String::from_utf8_lossy(&buf)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.trim().is_empty() {
        "the loader left no message; its log names the file and the problem".into()
    } else {
        text
    }
}
