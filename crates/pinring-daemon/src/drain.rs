//! The drain stage: on SIGTERM/SIGINT (or an embedded daemon's stop) the ring turns DRAINING,
//! FREE slots are taken back and their seqs given up, batches handed over but not taken are
//! withdrawn, and the run ends once what was taken has gone out, or at the deadline. Its rule
//! (when a drain may end, how long the loop may sleep meanwhile) is pure: [`Drain::may_end`],
//! [`Drain::longest_wait`].
//!
//! Entry points: [`Drain::begin`] (a stop requested), [`Drain::may_end_now`] and [`Drain::end`],
//! given the daemon's [`Core`], the delivery (which withdraws and settles the handoff) and the
//! uploads (which get the buffers back).

use super::delivery::Delivery;
use super::recovery::Recovery;
use super::{Core, DaemonError, Uploads};
use pinring_ring::ring_state;
use pinring_ring::DaemonRing;
use std::time::{Duration, Instant};

/// How long a drain may take before the daemon closes the ring anyway.
pub const DRAIN_DEADLINE: Duration = Duration::from_millis(1500);

/// The drain's state: whether one began, and until when it may last.
#[derive(Debug, Default)]
pub(super) struct Drain {
    deadline: Option<Instant>,
}

/// What is left of the run, as the drain weighs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Left {
    /// Uploads in flight (they read slots: always waited for).
    pub(super) uploads_in_flight: bool,
    /// Batches at the sink or handed to a consumer, not back yet.
    pub(super) at_sink: usize,
    /// Of those, the batches a consumer holds.
    pub(super) held_by_consumer: usize,
    /// The consumer keeps the memory of the batches it holds alive itself (embedded).
    pub(super) holds_own_buffers: bool,
    /// Some seq waits for its part.
    pub(super) seqs_waiting: bool,
}

impl Drain {
    /// Whether a drain began (the summary's `interrupted`).
    pub(super) fn started(&self) -> bool {
        self.deadline.is_some()
    }

    /// Begins the drain at `now`, to end by `now` + [`DRAIN_DEADLINE`].
    pub(super) fn start(&mut self, now: Instant) {
        self.deadline = Some(now + DRAIN_DEADLINE);
    }

    /// The longest sleep of the main loop: `max`, or what is left of the drain when less
    /// (`now` is read only while draining).
    pub(super) fn longest_wait(&self, max: Duration, now: impl FnOnce() -> Instant) -> Duration {
        match self.deadline {
            Some(deadline) => max.min(deadline.saturating_duration_since(now())),
            None => max,
        }
    }

    /// Whether the drain may end at `now`, with `left` what is left of the run. Uploads in
    /// flight are always waited for (they read slots); batches a consumer holds until the
    /// deadline only (at once where it keeps their memory alive itself). A seq waiting for its
    /// part is waited for only while a loader lives to commit it (`no_live_loader`, asked only
    /// then): with every loader gone (detached, or dead: a trainer stopping its workers kills
    /// the hung ones) nothing can come, so the drain ends at once instead of at the deadline.
    pub(super) fn may_end(
        &self,
        now: Instant,
        left: &Left,
        no_live_loader: impl FnOnce() -> bool,
    ) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        let past = now >= deadline;
        let nothing_in_flight = !left.uploads_in_flight
            && (left.at_sink == 0
                || ((past || left.holds_own_buffers) && left.at_sink == left.held_by_consumer));
        nothing_in_flight && (!left.seqs_waiting || past || no_live_loader())
    }
}

impl Drain {
    /// Stop requested: the ring turns DRAINING, FREE slots are taken back (no new claim lands)
    /// and their seqs given up, and batches handed over but not taken go back undelivered
    /// (`delivery` withdraws them, their buffers back to `up`).
    pub(super) fn begin(&mut self, core: &mut Core, delivery: &mut Delivery, up: &mut Uploads) {
        tracing::info!(ring = %core.run.cfg.ring.name, "stop requested: draining");
        core.service.stopping("stop requested: draining");
        self.start(Instant::now());
        core.ring.set_state(ring_state::DRAINING);
        let taken_back: Vec<u32> = (0..core.sequencer.slots())
            .filter(|&slot| core.ring.unassign_if_free(slot))
            .collect();
        core.sequencer.drain(&taken_back);
        delivery.withdraw_untaken(core, up);
    }

    /// Whether the drain may end now ([`Drain::may_end`] over the stages' books).
    pub(super) fn may_end_now(&self, core: &Core, delivery: &Delivery, up: &Uploads) -> bool {
        let left = Left {
            uploads_in_flight: !up.inflight.is_empty(),
            at_sink: delivery.sink.pending,
            held_by_consumer: delivery.handoff_books.outstanding(),
            holds_own_buffers: core.run.holds_own_buffers,
            seqs_waiting: core.sequencer.any_waiting(),
        };
        self.may_end(Instant::now(), &left, || no_live_loader(&core.ring))
    }

    /// Ends the drain: books the consumer's last takes, withdraws what nobody took, and warns
    /// about buffers a consumer still holds whose memory goes with the daemon.
    pub(super) fn end(
        &self,
        core: &mut Core,
        delivery: &mut Delivery,
        up: &mut Uploads,
        recovery: &mut Recovery,
    ) -> Result<(), DaemonError> {
        delivery.settle_handoff(core, up, recovery)?;
        let held = delivery.handoff_books.outstanding();
        if held > 0 && !core.run.holds_own_buffers {
            tracing::warn!(ring = %core.run.cfg.ring.name, buffers = held,
                "stopping while the consumer still holds batch buffers: its tensors \
                 of those batches become invalid");
        }
        Ok(())
    }
}

/// Whether no loader is attached that could still commit a part: the loader table is
/// empty once the entries of dead loaders are cleared (their entry locks are free). Asked
/// only while draining with seqs waiting.
fn no_live_loader(ring: &DaemonRing) -> bool {
    ring.reap_dead_loaders();
    ring.attached_loaders() == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTHING_LEFT: Left = Left {
        uploads_in_flight: false,
        at_sink: 0,
        held_by_consumer: 0,
        holds_own_buffers: false,
        seqs_waiting: false,
    };

    fn started(at: Instant) -> Drain {
        let mut d = Drain::default();
        d.start(at);
        d
    }

    #[test]
    fn no_drain_no_end_and_the_full_wait() {
        let d = Drain::default();
        let now = Instant::now();
        assert!(!d.started());
        assert!(!d.may_end(now, &NOTHING_LEFT, || true));
        let max = Duration::from_millis(100);
        assert_eq!(
            d.longest_wait(max, || panic!("the clock is read only while draining")),
            max
        );
    }

    #[test]
    fn a_drain_sleeps_no_longer_than_its_deadline() {
        let t0 = Instant::now();
        let d = started(t0);
        let max = Duration::from_millis(100);
        assert_eq!(d.longest_wait(max, || t0), max);
        assert_eq!(
            d.longest_wait(max, || t0 + DRAIN_DEADLINE - Duration::from_millis(30)),
            Duration::from_millis(30)
        );
        assert_eq!(
            d.longest_wait(max, || t0 + DRAIN_DEADLINE * 2),
            Duration::ZERO
        );
    }

    #[test]
    fn uploads_in_flight_are_waited_for_even_past_the_deadline() {
        let t0 = Instant::now();
        let d = started(t0);
        let left = Left {
            uploads_in_flight: true,
            ..NOTHING_LEFT
        };
        assert!(!d.may_end(t0, &left, || true));
        assert!(!d.may_end(t0 + DRAIN_DEADLINE * 4, &left, || true));
        assert!(d.may_end(t0, &NOTHING_LEFT, || false));
    }

    #[test]
    fn batches_a_consumer_holds_are_waited_for_until_the_deadline_only() {
        let t0 = Instant::now();
        let d = started(t0);
        let held = Left {
            at_sink: 2,
            held_by_consumer: 2,
            ..NOTHING_LEFT
        };
        assert!(!d.may_end(t0, &held, || true));
        assert!(d.may_end(t0 + DRAIN_DEADLINE, &held, || true));
        // An embedded consumer keeps their memory alive itself: not waited for at all.
        let own = Left {
            holds_own_buffers: true,
            ..held
        };
        assert!(d.may_end(t0, &own, || true));
        // A batch at the sink thread (not a consumer's) is always waited for.
        let at_sink = Left { at_sink: 3, ..held };
        assert!(!d.may_end(t0 + DRAIN_DEADLINE, &at_sink, || true));
    }

    #[test]
    fn a_waiting_seq_is_waited_for_only_while_a_loader_lives_or_until_the_deadline() {
        let t0 = Instant::now();
        let d = started(t0);
        let waiting = Left {
            seqs_waiting: true,
            ..NOTHING_LEFT
        };
        assert!(!d.may_end(t0, &waiting, || false));
        assert!(d.may_end(t0, &waiting, || true));
        assert!(d.may_end(t0 + DRAIN_DEADLINE, &waiting, || false));
        // The loader table is looked at only when a seq waits and nothing else holds the end.
        assert!(d.may_end(t0, &NOTHING_LEFT, || panic!("not asked")));
        let busy = Left {
            uploads_in_flight: true,
            ..waiting
        };
        assert!(!d.may_end(t0, &busy, || panic!("not asked")));
    }
}
