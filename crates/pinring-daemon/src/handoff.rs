//! The consumer sink (`--sink consumer`): whole batches handed to one training process through
//! the ring's handoff area (pinring_ring::handoff) instead of being consumed here.
//!
//! A batch whose parts have all landed is *filled* into its buffer's descriptor; the daemon then
//! watches the descriptor: a take books the batch as delivered (exactly once, in order: the
//! sequencer checks it), a release (or a reclaim from a dead consumer) gives the buffer back,
//! after the copy stream was made to wait on the consumer's release event. Nothing here blocks:
//! the main loop polls the few descriptors on each pass (the consumer rings the doorbell when it
//! releases).

use super::delivery::{book_delivery, Delivery};
use super::recovery::Recovery;
use super::{Core, DaemonError, Uploads};
use pinring_ring::handoff::{Filled, Returned};
use std::collections::BTreeMap;

/// A buffer handed over, and what the daemon knows of it.
#[derive(Debug)]
pub(super) struct Handed {
    /// Round of the fill.
    round: u32,
    /// Whether the take was booked (delivered).
    booked: bool,
    /// The batch's sample ids (for the order book), handed back for reuse at booking.
    samples: Vec<u64>,
}

/// The daemon's side of the handoff.
#[derive(Debug, Default)]
pub(super) struct HandoffBooks {
    /// Handed buffers by their batch's first seq (booking walks them in seq order).
    handed: BTreeMap<u64, (usize, Handed)>,
}

impl HandoffBooks {
    /// Buffers handed over and not back yet.
    pub(super) fn outstanding(&self) -> usize {
        self.handed.len()
    }
}

/// Which takes one pass books, walking the handed batches in seq order: a batch taken and not
/// booked yet is booked; in order, only while every earlier one was taken (the consumer takes
/// them in order, and a pass may see a later take before an earlier one's word).
#[derive(Debug, Clone, Copy)]
pub(super) struct Booking {
    in_order: bool,
    /// No batch seen so far in this pass is still untaken.
    open: bool,
}

impl Booking {
    pub(super) fn new(in_order: bool) -> Booking {
        Booking {
            in_order,
            open: true,
        }
    }

    /// The next handed batch, `taken` by the consumer (or not), `booked` already (or not):
    /// whether to book its take now.
    pub(super) fn books(&mut self, taken: bool, booked: bool) -> bool {
        let book = taken && !booked && (self.open || !self.in_order);
        if !taken {
            self.open = false;
        }
        book
    }
}

/// A whole batch ready to hand over.
pub(super) struct Ready {
    pub(super) buffer: usize,
    pub(super) seq: u64,
    pub(super) batch: u64,
    pub(super) epoch: u32,
    pub(super) index_in_epoch: u64,
    pub(super) bytes: usize,
    pub(super) samples: Vec<u64>,
}

impl Delivery {
    /// Hands a whole batch (all parts on the device) to the consumer. Draining, it hands
    /// nothing over any more: the batch stays undelivered (below the resume point) and its
    /// buffer is free again (the sequencer is told of a drain as it begins: drain.rs).
    pub(super) fn hand_over(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        r: Ready,
    ) -> Result<(), DaemonError> {
        if core.sequencer.draining() {
            give_back_lent(core, up, r.buffer);
            up.free_buffers.push_back(r.buffer);
            core.ids.give_back(r.samples);
            return Ok(());
        }
        core.uploader.record_ready(r.buffer)?;
        // The batch's bytes in its buffer: its payload, or, with a field carried encoded, the
        // decoded tensors' bytes (the payload holds compressed images).
        let layout = &core.run.layout;
        let bytes = match layout.encoded_field() {
            None => r.bytes as u64,
            Some(_) => layout
                .placements(r.samples.len() as u64)
                .iter()
                .map(|p| p.bytes)
                .sum(),
        };
        let round = core.ring.fill_buffer(
            r.buffer as u32,
            &Filled {
                round: 0,
                seq: r.seq,
                batch: r.batch,
                bytes,
                samples: r.samples.len() as u32,
                epoch: r.epoch,
                index_in_epoch: r.index_in_epoch,
            },
        );
        core.ring.book_filled(r.seq + core.run.parts);
        self.sink.pending += 1;
        self.handoff_books.handed.insert(
            r.seq,
            (
                r.buffer,
                Handed {
                    round,
                    booked: false,
                    samples: r.samples,
                },
            ),
        );
        core.ring.wake_consumer(false);
        Ok(())
    }

    /// Books takes (in seq order) and takes back released buffers. True if anything changed.
    pub(super) fn collect_returns(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
    ) -> Result<bool, DaemonError> {
        if self.handoff_books.handed.is_empty() {
            return Ok(false);
        }
        let mut progressed = false;
        let mut back = Vec::new();
        let mut booking = Booking::new(core.run.cfg.ring.in_order);
        let seqs: Vec<u64> = self.handoff_books.handed.keys().copied().collect();
        for seq in seqs {
            let (buffer, round, booked) = {
                let (b, h) = &self.handoff_books.handed[&seq];
                (*b, h.round, h.booked)
            };
            let state = core.ring.buffer_returned(buffer as u32, round);
            let taken = !matches!(state, Returned::Waiting);
            if booking.books(taken, booked) {
                self.book_take(core, recovery, seq);
                progressed = true;
            }
            match state {
                Returned::Released | Returned::Reclaimed | Returned::Corrupt(_) => {
                    if self.handoff_books.handed[&seq].1.booked {
                        back.push((seq, buffer, state));
                    }
                }
                Returned::Waiting | Returned::Held => {}
            }
        }
        for (seq, buffer, state) in back {
            let consumer_released = match state {
                Returned::Released => true,
                Returned::Reclaimed => false,
                Returned::Corrupt(s) => {
                    tracing::error!(ring = %core.run.cfg.ring.name, buffer, seq,
                        "batch buffer {buffer} holds state {} ({s}), which no consumer leaves it \
                         in; taking it back (find who writes into the ring)",
                        pinring_ring::handoff::buffer_state::name(s));
                    // Published with the other fault counts at the next reap.
                    recovery.counts.corrupt_descriptors += 1;
                    false
                }
                Returned::Waiting | Returned::Held => unreachable!("only returned buffers"),
            };
            let Some((_, h)) = self.handoff_books.handed.remove(&seq) else {
                continue;
            };
            // The next copy into the buffer waits (on the device) for the consumer's last use.
            core.uploader.wait_release(buffer, consumer_released)?;
            // Consumer copies: its copies out of the batch's slots are done (released), or its
            // process is gone (reclaimed); either way nothing reads them any more.
            give_back_lent(core, up, buffer);
            core.ring.reset_buffer(buffer as u32, h.round);
            up.free_buffers.push_back(buffer);
            self.sink.pending -= 1;
            progressed = true;
        }
        Ok(progressed)
    }

    /// A take seen: the batch whose first seq is `seq` counts as delivered.
    fn book_take(&mut self, core: &mut Core, recovery: &mut Recovery, seq: u64) {
        let Some((buffer, h)) = self.handoff_books.handed.get_mut(&seq) else {
            return;
        };
        h.booked = true;
        let buffer = *buffer;
        let samples = std::mem::take(&mut h.samples);
        let parts = core.run.parts;
        book_delivery(core, recovery, seq, parts, None, false, samples);
        tracing::trace!(ring = %core.run.cfg.ring.name, seq, buffer, "batch taken by the consumer");
    }

    /// Drain: takes back every buffer nobody took (its batch stays undelivered, so the resume
    /// point stays below it).
    pub(super) fn withdraw_untaken(&mut self, core: &mut Core, up: &mut Uploads) {
        let untaken: Vec<u64> = self
            .handoff_books
            .handed
            .iter()
            .filter(|(_, (b, h))| !h.booked && core.ring.withdraw_buffer(*b as u32, h.round))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in untaken {
            if let Some((buffer, h)) = self.handoff_books.handed.remove(&seq) {
                give_back_lent(core, up, buffer);
                up.free_buffers.push_back(buffer);
                self.sink.pending -= 1;
                core.ids.give_back(h.samples);
            }
        }
    }

    /// At the end of a drain: withdraws what nobody took and books the takes not seen yet, so
    /// the resume point is exactly the first batch no consumer took.
    pub(super) fn settle_handoff(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
    ) -> Result<(), DaemonError> {
        self.withdraw_untaken(core, up);
        self.collect_returns(core, up, recovery).map(|_| ())
    }
}

/// Consumer copies: hands out again the slots the batch in `buffer` was copied from.
fn give_back_lent(core: &mut Core, up: &mut Uploads, buffer: usize) {
    let mut slots = std::mem::take(&mut up.lent[buffer]);
    if slots.is_empty() {
        return;
    }
    for &slot in &slots {
        core.hand_out(slot);
    }
    core.ring.wake_loaders(slots.len() as i32);
    slots.clear();
    up.lent[buffer] = slots;
}

/// Reap pass: buffers a dead consumer held are taken back.
pub(super) fn reap_consumer(core: &Core) -> Result<(), DaemonError> {
    let n = core.ring.reclaim_from_dead_consumer()?;
    if n > 0 {
        tracing::warn!(ring = %core.run.cfg.ring.name, buffers = n,
            "the consumer died holding batch buffers: taken back (a restarted consumer \
             resumes after the batches it took)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Booking;

    /// The takes a pass books, for batches in seq order given as (taken, booked).
    fn booked(in_order: bool, batches: &[(bool, bool)]) -> Vec<bool> {
        let mut b = Booking::new(in_order);
        batches.iter().map(|&(t, k)| b.books(t, k)).collect()
    }

    #[test]
    fn in_order_a_take_is_booked_only_after_every_earlier_one() {
        // The second batch's take is not seen yet: the third's waits for it.
        assert_eq!(
            booked(true, &[(true, false), (false, false), (true, false)]),
            [true, false, false]
        );
        // A take booked in an earlier pass is not booked again, and does not hold later ones.
        assert_eq!(
            booked(true, &[(true, true), (true, false), (true, false)]),
            [false, true, true]
        );
    }

    #[test]
    fn unordered_every_take_seen_is_booked_at_once() {
        assert_eq!(
            booked(
                false,
                &[(false, false), (true, false), (true, true), (true, false)]
            ),
            [false, true, false, true]
        );
    }
}
