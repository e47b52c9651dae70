//! The daemon's fault handling, run every reap interval: the segment file and header checks,
//! dead loaders (their slots put back at once with the same seq), leases on claimed slots,
//! quarantine of slots taken from live (hung) loaders, re-issuing their seqs in other slots, the
//! bad-batch policy, and auditing descriptors for states the daemon never left them in.
//! docs/RELIABILITY.md has the table of faults.
//!
//! Runs on the daemon's main loop, like every other slot transition the daemon makes.
//!
//! Entry point: [`Recovery::poll`], once a pass, given the daemon's [`Core`]; the intake asks
//! [`Recovery::bad_batch`] and [`Recovery::data_failed`] of a part it refuses.

use super::{Core, DaemonError, HandOut, Run};
use pinring_data::BadBatchPolicy;
use pinring_ring::failure::ERR_SAMPLE;
use pinring_ring::{Expired, SlotState};
use std::time::{Duration, Instant};

/// A seq whose batch was bad this many times stops the daemon even under `skip`: the loaders
/// cannot make it, and retrying for ever would hide that.
pub(super) const MAX_BAD_PER_SEQ: u32 = 8;

/// How often the main loop counts the live loaders between reaps
/// ([`Tally::count_loaders`](super::Tally::count_loaders)).
pub(super) const COUNT_LOADERS_EVERY: Duration = Duration::from_millis(10);

/// What the recovery stage does in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chore {
    /// A reap ([`Recovery::reap`]): the segment, dead loaders and consumers, leases, the audit.
    Reap,
    /// Count the live loaders (the table's ACTIVE entries: loads only).
    CountLoaders,
    /// Neither.
    Nothing,
}

/// When the recovery stage runs: a reap every `daemon.reap_interval_ms` from the first pass,
/// and between reaps the live loaders counted every [`COUNT_LOADERS_EVERY`], so that a short
/// run is counted as finely as a long one.
#[derive(Debug)]
pub(super) struct Reaping {
    every: Duration,
    /// The last reap (the first pass, before any).
    last: Option<Instant>,
}

impl Reaping {
    /// A reap every `every`.
    pub(super) fn new(every: Duration) -> Reaping {
        Reaping { every, last: None }
    }

    /// The chore of the pass at `now`, the live loaders last counted at `counted`.
    pub(super) fn chore(&mut self, now: Instant, counted: Option<(Instant, u32)>) -> Chore {
        let last = *self.last.get_or_insert(now);
        if now.saturating_duration_since(last) >= self.every {
            self.last = Some(now);
            Chore::Reap
        } else if counted
            .is_none_or(|(at, _)| now.saturating_duration_since(at) >= COUNT_LOADERS_EVERY)
        {
            Chore::CountLoaders
        } else {
            Chore::Nothing
        }
    }
}

/// Fault-handling state, owned by the main loop.
#[derive(Debug)]
pub(super) struct Recovery {
    /// When dead/hung loaders and the segment file are checked (`daemon.reap_interval_ms`).
    reaping: Reaping,
    lease: Duration,
    policy: BadBatchPolicy,
    /// Per slot: the CLAIMED word last seen and since when it has been seen unchanged.
    claims: Vec<Option<(u64, Instant)>>,
    /// Per slot: the expired claim it was taken from, while the sequencer keeps it quarantined
    /// (whose lock and abandon word say when it may come back).
    expired: Vec<Option<Expired>>,
    /// Bad batches seen per seq (skip policy), for the seqs in the window of slots only: a seq
    /// is forgotten once delivered ([`Recovery::delivered`]), so the books never outgrow the
    /// ring, however long the plan.
    bad: std::collections::HashMap<u64, u32>,
    /// What the daemon counted of faults, in its own memory (the summary's figures).
    pub(super) counts: FaultCounts,
    /// How long the ring may have work left and no loader before the daemon warns.
    idle_warn: Duration,
    /// Since when the ring has had work left and no live loader (None: it has one, or no work).
    idle_since: Option<Instant>,
    /// When the last stall warning was logged.
    idle_warned: Option<Instant>,
}

/// The fault counts the daemon keeps in its own memory (`pinring_ring::FaultCounts`): its
/// summary reports these, never the ring's copies, which any process that maps the ring can
/// write. The copies in the header and health block are published from these at every reap
/// (`DaemonRing::publish_faults`), for `pinring status` and `/metrics`.
use pinring_ring::FaultCounts;
impl Recovery {
    /// A reap every `reap_every`; claims unchanged for `lease` expire; bad batches as
    /// `policy` says; a ring with work and no loader warned about every `idle_warn`.
    pub(super) fn new(
        slots: usize,
        reap_every: Duration,
        lease: Duration,
        policy: BadBatchPolicy,
        idle_warn: Duration,
    ) -> Recovery {
        Recovery {
            reaping: Reaping::new(reap_every),
            lease,
            policy,
            claims: vec![None; slots],
            expired: vec![None; slots],
            bad: Default::default(),
            counts: FaultCounts::default(),
            idle_warn,
            idle_since: None,
            idle_warned: None,
        }
    }

    /// Seq `seq` was delivered: its bad-batch count, if any, is forgotten.
    pub(super) fn delivered(&mut self, seq: u64) {
        if !self.bad.is_empty() {
            self.bad.remove(&seq);
        }
    }
}

/// What [`Recovery::idle`] says to do about a ring with no loader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Idle {
    /// Nothing: a loader is attached, or no seq waits for one, or not for long enough yet.
    Fine,
    /// Stalled since this long ago and not warned about for `idle_warn`: warn now.
    Warn(Duration),
    /// Stalled, warned about recently.
    Stalled(Duration),
}

impl Recovery {
    /// The ring at `now`: `waiting` says whether some seq waits in a FREE slot for a loader to
    /// make it, `loaders` how many live loaders are attached.
    pub(super) fn idle(&mut self, now: Instant, waiting: bool, loaders: usize) -> Idle {
        if !waiting || loaders > 0 {
            self.idle_since = None;
            self.idle_warned = None;
            return Idle::Fine;
        }
        let since = *self.idle_since.get_or_insert(now);
        let idle = now.saturating_duration_since(since);
        if idle < self.idle_warn {
            return Idle::Fine;
        }
        match self.idle_warned {
            Some(t) if now.saturating_duration_since(t) < self.idle_warn => Idle::Stalled(idle),
            _ => {
                self.idle_warned = Some(now);
                Idle::Warn(idle)
            }
        }
    }
}

impl Run {
    /// Samples a batch may have replaced with zeros: the batch size where loaders substitute
    /// unreadable samples (a file kind with `dataset.on_bad_sample = "skip"`), else 0.
    pub(super) fn skippable_per_batch(&self) -> u64 {
        let d = &self.cfg.dataset;
        if d.kind.reads_files() && d.on_bad_sample == pinring_data::OnBadSample::Skip {
            u64::from(self.cfg.plan.batch_size)
        } else {
            0
        }
    }
}

impl Recovery {
    /// The recovery stage's entry point, once a pass: a reap when [`Reaping::chore`] says, else
    /// the live loaders counted (or nothing).
    pub(super) fn poll(&mut self, core: &mut Core) -> Result<(), DaemonError> {
        match self.reaping.chore(core.now.at, core.tally.loaders_counted) {
            Chore::Reap => self.reap(core)?,
            Chore::CountLoaders => {
                // Between reaps (which clear dead entries first), the table's ACTIVE
                // entries: loads only, so a short run is counted as finely as a long one.
                let live = core.ring.attached_loaders();
                core.tally.count_loaders(core.now.at, live);
            }
            Chore::Nothing => {}
        }
        Ok(())
    }

    /// Every reap interval: the segment file, the header, dead loaders, then
    /// [`Recovery::recover`].
    pub(super) fn reap(&mut self, core: &mut Core) -> Result<(), DaemonError> {
        core.ring.check_file()?;
        let changed = core.ring.repair_header();
        if !changed.is_empty() {
            tracing::error!(ring = %core.run.cfg.ring.name, fields = %changed.join(", "),
                "another process changed this daemon's header fields; restored them (the daemon's \
                 liveness is its lock on the segment, so this fooled nobody, but find who writes \
                 into the ring)");
        }
        for slot in 0..core.sequencer.slots() {
            if let Some(seq) = core.ring.reclaim_if_owner_dead(slot) {
                self.counts.reclaimed += 1;
                tracing::warn!(ring = %core.run.cfg.ring.name, slot, seq, "loader died holding a slot: slot handed out again with the same seq");
                core.ring.wake_loaders(1);
            }
        }
        self.find_data_failures(core)?;
        // Republish the resume point, in case another process wrote over it since the last
        // delivery (status shows it; the daemon never reads it back).
        core.ring.publish_resume_seq(core.sequencer.resume_seq());
        super::handoff::reap_consumer(core)?;
        let reaped = core.ring.reap_dead_loaders();
        if reaped > 0 {
            tracing::warn!(ring = %core.run.cfg.ring.name, loaders = reaped, "removed dead loaders from the table");
        }
        let live = core.ring.attached_loaders();
        core.tally.count_loaders(Instant::now(), live);
        self.recover(core)?;
        self.watch_idle(core);
        core.ring.publish_faults(&self.counts);
        // What views check the loaders' own figures against (pinring_observe::DaemonSaw::published).
        core.ring.publish_seen(
            (core.tally.loader_seconds_seen * 1e9) as u64,
            core.run.skippable_per_batch(),
        );
        Ok(())
    }

    /// A part a loader committed with [`ERR_SAMPLE`] (a sample it cannot read under
    /// `dataset.on_bad_sample = "fail"`; the loader exits 3 after it) ends the run, wherever
    /// the part lies: in order the daemon takes only the lowest seq, and with every loader gone
    /// that seq would never be made. Looked for among READY slots at every reap.
    fn find_data_failures(&mut self, core: &mut Core) -> Result<(), DaemonError> {
        for slot in 0..core.sequencer.slots() {
            let Some(seq) = core.sequencer.carried(slot) else {
                continue;
            };
            if core.sequencer.is_held(slot) {
                continue;
            }
            let view = core.ring.slot_view(slot);
            if view.state != Some(SlotState::Ready) || view.error != ERR_SAMPLE {
                continue;
            }
            match core.ring.take_ready(slot, seq) {
                Err(pinring_ring::SlotFault::LoaderError { code, .. }) if code == ERR_SAMPLE => {
                    return Err(self.data_failed(core, slot, seq));
                }
                // Changed under the daemon (a commit between the look and the take, a
                // scribble): the slot is the daemon's now; the bad-batch policy decides.
                Err(fault) => self.bad_batch(core, slot, seq, fault.to_string())?,
                // Not READY any more: a racing writer; the audit looks at it.
                Ok(None) => {}
                Ok(Some(_)) => {
                    let what = format!(
                        "slot {slot}, seq {seq}: its error code changed while the daemon took it"
                    );
                    self.bad_batch(core, slot, seq, what)?;
                }
            }
        }
        Ok(())
    }

    /// The error that ends the run for the part in `slot` (taken, committed with
    /// [`ERR_SAMPLE`]): the loader's message from the slot, sanitised.
    pub(super) fn data_failed(&mut self, core: &Core, slot: u32, seq: u64) -> DaemonError {
        self.counts.rejected += 1;
        let message = core.ring.read_failure(slot);
        DaemonError::DataFailed {
            ring: core.run.cfg.ring.name.clone(),
            seq,
            message,
        }
    }

    /// Warns, every `daemon.idle_warn_ms`, while seqs wait in FREE slots and no live loader is
    /// attached; publishes the stall for `pinring status` and `/metrics`.
    fn watch_idle(&mut self, core: &mut Core) {
        let waiting = (0..core.sequencer.slots()).any(|slot| {
            core.sequencer.carried(slot).is_some()
                && !core.sequencer.is_held(slot)
                && core.ring.slot_view(slot).state == Some(SlotState::Free)
        });
        let loaders = if waiting {
            core.ring.loaders().iter().filter(|l| l.alive).count()
        } else {
            0
        };
        let now = Instant::now();
        let seq = core.sequencer.resume_seq();
        match self.idle(now, waiting, loaders) {
            Idle::Fine => core.ring.publish_stall(0, 0),
            state @ (Idle::Warn(idle) | Idle::Stalled(idle)) => {
                let since = pinring_ring::clock::monotonic_ns()
                    .saturating_sub(idle.as_nanos() as u64)
                    .max(1);
                core.ring.publish_stall(since, seq);
                if matches!(state, Idle::Warn(_)) {
                    let name = &core.run.cfg.ring.name;
                    tracing::warn!(
                        ring = %name, seq, idle_s = idle.as_secs(),
                        "ring {name:?} has work left and no loader attached for {:.1} s: seq {seq} \
                         (the lowest undelivered) waits; start loaders (`pinring-loader --ring \
                         {name}`), or look at why they exited",
                        idle.as_secs_f64()
                    );
                }
            }
        }
    }

    /// Every reap interval: leases, quarantine, descriptor audit, re-issued seqs, gauges.
    pub(super) fn recover(&mut self, core: &mut Core) -> Result<(), DaemonError> {
        self.expire_leases(core);
        self.release_quarantine(core);
        self.audit_slots(core)?;
        self.place_reissued(core);
        let hung = self
            .expired
            .iter()
            .flatten()
            .filter(|e| core.ring.expired_owner_alive(e))
            .count();
        core.ring
            .publish_quarantine(core.sequencer.quarantined(), hung as u64);
        core.ring.publish_heartbeat();
        Ok(())
    }

    /// Takes back slots whose claim has not changed for longer than the lease.
    fn expire_leases(&mut self, core: &mut Core) {
        let now = Instant::now();
        for slot in 0..core.sequencer.slots() {
            let i = slot as usize;
            if core.sequencer.carried(slot).is_none() {
                self.claims[i] = None;
                continue;
            }
            let w = core.ring.word(slot);
            if w.state != Some(SlotState::Claimed) {
                self.claims[i] = None;
                continue;
            }
            match self.claims[i] {
                Some((raw, since)) if raw == w.raw => {
                    if now.duration_since(since) < self.lease {
                        continue;
                    }
                }
                _ => {
                    self.claims[i] = Some((w.raw, now));
                    continue;
                }
            }
            self.claims[i] = None;
            let Some(expired) = core.ring.reclaim_expired(slot, w.raw) else {
                continue;
            };
            self.counts.leases_expired += 1;
            self.counts.reclaimed += 1;
            let pid = expired.owner_id.map_or(0, |id| id.pid);
            core.ring.publish_hung_pid(pid);
            tracing::warn!(
                ring = %core.run.cfg.ring.name, slot, seq = expired.seq, loader = expired.owner, pid,
                lease_ms = self.lease.as_millis() as u64,
                "loader made no progress on its slot within the lease: declared hung; the slot is \
                 taken back and kept out of use until that loader exits or acknowledges, and its \
                 batch is made in another slot"
            );
            core.sequencer.quarantine(slot);
            self.expired[i] = Some(expired);
        }
    }

    /// Hands quarantined slots out again once their old owner cannot write into them any more.
    fn release_quarantine(&mut self, core: &mut Core) {
        for slot in 0..core.sequencer.slots() {
            let Some(expired) = self.expired[slot as usize] else {
                continue;
            };
            if !core.ring.released_by(&expired) {
                continue;
            }
            self.expired[slot as usize] = None;
            tracing::info!(ring = %core.run.cfg.ring.name, slot, loader = expired.owner,
                "the hung loader exited or acknowledged: slot back in use");
            let next = core.sequencer.release(slot);
            core.apply_hand_out(slot, next);
            core.ring.wake_loaders(1);
        }
    }

    /// Checks that every slot is in a state the daemon left it in (a buggy or hostile writer may
    /// have scribbled over descriptors) and repairs or fails per the policy.
    fn audit_slots(&mut self, core: &mut Core) -> Result<(), DaemonError> {
        for slot in 0..core.sequencer.slots() {
            if core.sequencer.is_held(slot) {
                // UPLOADING (an upload in flight, or a zero-copy batch at the sink): the
                // daemon's own; its word is rewritten on completion.
                continue;
            }
            let view = core.ring.slot_view(slot);
            let problem = match core.sequencer.carried(slot) {
                Some(seq) => match view.state {
                    Some(SlotState::Free) if view.seq != seq => Some(format!(
                        "FREE slot carries seq {} instead of {seq}",
                        view.seq
                    )),
                    Some(SlotState::Free | SlotState::Claimed | SlotState::Ready) => None,
                    other => Some(format!(
                        "slot carrying seq {seq} is in state {}",
                        other.map_or("INVALID", |s| s.name())
                    )),
                },
                None => match view.state {
                    Some(SlotState::Idle) => None,
                    other => Some(format!(
                        "unused slot is in state {}",
                        other.map_or("INVALID", |s| s.name())
                    )),
                },
            };
            let Some(what) = problem else { continue };
            self.counts.corrupt_descriptors += 1;
            let what = format!(
                "slot {slot}: descriptor corrupted by a writer outside the protocol: {what}"
            );
            match core.sequencer.carried(slot) {
                Some(seq) => self.bad_batch(core, slot, seq, what)?,
                None => {
                    if self.policy == BadBatchPolicy::Fail {
                        return Err(Self::bad_batch_error(core, what));
                    }
                    tracing::warn!(ring = %core.run.cfg.ring.name, "{what}; reset");
                    core.ring.reset_to_idle(slot);
                }
            }
        }
        Ok(())
    }

    /// Gives seqs that lost their slot a new one: an unused slot first; in order mode, when no
    /// upload can free a slot, a FREE or READY slot carrying a later seq (whose seq then waits
    /// instead: delivery order means the earliest seq must be made first).
    fn place_reissued(&mut self, core: &mut Core) {
        if core.sequencer.draining() {
            return;
        }
        for slot in 0..core.sequencer.slots() {
            if !core.sequencer.reissue_pending() {
                return;
            }
            if core.sequencer.unused(slot) {
                core.hand_out(slot);
                self.counts.reissued += 1;
                core.ring.wake_loaders(1);
            }
        }
        loop {
            // Later seqs, latest first (none unordered); FREE slots cost nothing, READY ones a
            // remade batch, so those only when the daemon holds no slot (an upload completing
            // would free one).
            let any_held = core.sequencer.any_held();
            let ring = &core.ring;
            let pick = core
                .sequencer
                .swap_candidates()
                .into_iter()
                .find(|&(_, sl)| match ring.slot_view(sl).state {
                    Some(SlotState::Free) => true,
                    Some(SlotState::Ready) => !any_held,
                    _ => false,
                });
            let Some((_later, slot)) = pick else {
                return;
            };
            if core.ring.take_back(slot).is_none() {
                return;
            }
            core.sequencer.swap_out(slot);
            core.hand_out(slot);
            self.counts.reissued += 1;
            core.ring.wake_loaders(1);
        }
    }

    fn bad_batch_error(core: &Core, what: String) -> DaemonError {
        DaemonError::BadBatch {
            ring: core.run.cfg.ring.name.clone(),
            what,
        }
    }

    /// A batch the daemon must not upload: stop (fail), or count it and have the same seq made
    /// again in the same slot (skip). The slot is the daemon's (taken or audited) when called.
    pub(super) fn bad_batch(
        &mut self,
        core: &mut Core,
        slot: u32,
        seq: u64,
        what: String,
    ) -> Result<(), DaemonError> {
        self.counts.rejected += 1;
        if self.policy == BadBatchPolicy::Fail {
            return Err(Self::bad_batch_error(core, what));
        }
        let n = self.bad.entry(seq).or_insert(0);
        *n += 1;
        if *n >= MAX_BAD_PER_SEQ {
            let n = *n;
            return Err(Self::bad_batch_error(
                core,
                format!(
                "{what}; seq {seq} was bad {n} times in a row, giving up (on_bad_batch = \"skip\" \
                 retries a seq at most {MAX_BAD_PER_SEQ} times)"
            ),
            ));
        }
        self.counts.bad_batches_skipped += 1;
        core.ring.reset_to_idle(slot);
        match core.sequencer.remade(slot, seq) {
            HandOut::Assign(seq) => {
                tracing::warn!(ring = %core.run.cfg.ring.name, slot, seq, "bad batch skipped, to be made again: {what}");
                core.ring.assign(slot, seq);
                core.ring.wake_loaders(1);
            }
            HandOut::Park | HandOut::Quarantined => {
                tracing::warn!(ring = %core.run.cfg.ring.name, slot, seq, "bad batch skipped; not made again: the daemon is draining and gave this seq up: {what}");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reap_comes_every_interval_and_the_loaders_are_counted_between() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = Reaping::new(ms(100));
        // The first pass starts the interval; the loaders were never counted.
        assert_eq!(r.chore(t0, None), Chore::CountLoaders);
        assert_eq!(r.chore(t0 + ms(5), Some((t0, 2))), Chore::Nothing);
        assert_eq!(r.chore(t0 + ms(10), Some((t0, 2))), Chore::CountLoaders);
        assert_eq!(r.chore(t0 + ms(99), Some((t0 + ms(95), 2))), Chore::Nothing);
        // The interval is up: a reap, whenever the loaders were counted, and the next interval
        // starts at it.
        assert_eq!(r.chore(t0 + ms(100), Some((t0 + ms(99), 2))), Chore::Reap);
        assert_eq!(
            r.chore(t0 + ms(150), Some((t0 + ms(145), 2))),
            Chore::Nothing
        );
        assert_eq!(r.chore(t0 + ms(200), Some((t0 + ms(195), 2))), Chore::Reap);
    }

    #[test]
    fn a_zero_interval_reaps_every_pass() {
        let t0 = Instant::now();
        let mut r = Reaping::new(Duration::ZERO);
        assert_eq!(r.chore(t0, None), Chore::Reap);
        assert_eq!(r.chore(t0, Some((t0, 1))), Chore::Reap);
    }
}
