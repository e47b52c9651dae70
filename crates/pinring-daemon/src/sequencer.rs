//! The daemon's sequencer: its own books of which seq each slot carries, which seq comes next,
//! which seqs lost their slot and wait for another, which are taken (uploading or at the sink),
//! and which were delivered; and the answers the daemon acts on: what a freed slot carries next,
//! which slot may be taken next, when the run is complete, and where to resume.
//!
//! It does no I/O: it takes plain values (slot index, seq) and events, never touches the ring,
//! the backend or a clock. The daemon tells it what happened and does what it answers.
//!
//! Each seq of `[start, end)` is in exactly one place at a time: not handed out yet
//! (`>= next_assign`), waiting for a slot (re-issue), carried by a slot for loaders to make,
//! taken (the daemon holds its slot while it uploads, then the sink has it), or delivered. A
//! seq the daemon gave up while draining is in none. A slot reclaimed from a dead loader needs
//! no event: it goes back to loaders carrying the same seq, which still waits to be taken.
//!
//! Delivery order: in order, only the lowest seq not yet taken may be taken, and only once it
//! sits in a slot (a lower seq waiting for a slot blocks every later one); the daemon's pipeline
//! (one upload stream, one sink queue) keeps that order to the consumer. Unordered, any waiting
//! seq may be taken.
//!
//! The resume point is the delivered set's low watermark: the lowest seq of the plan not
//! delivered, every seq below it delivered. In order nothing at or above it was delivered;
//! unordered, [`Sequencer::delivered_past_resume`] counts the seqs at or above it that were,
//! which a run resumed there delivers again.

use std::collections::{BTreeSet, VecDeque};

/// What a slot the daemon gave back gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOut {
    /// Carry this seq (write it, then make the slot FREE).
    Assign(u64),
    /// Nothing to carry (the plan is handed out, or the daemon drains): park it IDLE.
    Park,
    /// The slot is quarantined: leave it alone.
    Quarantined,
}

/// A delivery that broke exactly-once or order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryProblem {
    /// The seq was delivered before.
    #[error("seq {seq} delivered twice")]
    Duplicate {
        /// The seq.
        seq: u64,
    },
    /// The seq is not one of the plan's `[start, end)`.
    #[error("seq {seq} is outside the plan")]
    OutsidePlan {
        /// The seq.
        seq: u64,
    },
    /// In order, a seq other than the one after the highest delivered.
    #[error("seq {seq} delivered where seq {expected} was due")]
    OutOfOrder {
        /// The seq.
        seq: u64,
        /// The seq that was due.
        expected: u64,
    },
}

/// The daemon's books of seqs and slots (see the module documentation).
#[derive(Debug)]
pub struct Sequencer {
    start: u64,
    end: u64,
    in_order: bool,
    /// Stopping: nothing new is handed out.
    draining: bool,
    /// The next seq never handed out.
    next_assign: u64,
    /// Per slot: the seq it carries (None: unused or quarantined). A held slot still carries the
    /// seq taken from it.
    carried: Vec<Option<u64>>,
    /// Per slot: the daemon holds it (UPLOADING: an upload, or a zero-copy batch at the sink).
    held: Vec<bool>,
    /// Per slot: taken from a live (hung) loader and kept out of use.
    quarantined: Vec<bool>,
    /// Carried by a slot, not taken yet: seq -> slot.
    waiting: Waiting,
    /// Seqs that lost their slot and wait for another.
    reissue: BTreeSet<u64>,
    /// Taken, not delivered yet.
    taken: SeqBits,
    /// Delivered seqs of the plan.
    delivered: SeqBits,
    /// Lowest seq of the plan not delivered (`end` when all were).
    low: u64,
    /// Distinct seqs of the plan delivered.
    distinct: u64,
    /// Every delivery, duplicates included.
    deliveries: u64,
    /// Highest seq delivered.
    highest: Option<u64>,
    duplicates: u64,
    out_of_order: u64,
}

/// The seqs carried by slots and not taken yet, with their slots, in seq order: a deque sorted
/// by seq. Seqs are handed out in increasing order and, in order, taken lowest first, so the
/// hot path adds at the back and takes from the front, without the node walks and allocations
/// of an ordered map (whose operations, this one's and others', were 7.5% of the main loop at
/// 64 KiB slots). A seq handed out again after it lost its slot, or one taken out of order
/// (unordered delivery), is found by binary search and moves the deque's tail (at most one
/// entry per slot).
#[derive(Debug, Default)]
struct Waiting(VecDeque<(u64, u32)>);

impl Waiting {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Where `seq` is, or would go.
    fn find(&self, seq: u64) -> Result<usize, usize> {
        self.0.binary_search_by_key(&seq, |&(s, _)| s)
    }

    fn get(&self, seq: u64) -> Option<u32> {
        self.find(seq).ok().map(|i| self.0[i].1)
    }

    /// Adds `seq` in `slot`, or moves it there.
    fn insert(&mut self, seq: u64, slot: u32) {
        if self.0.back().is_none_or(|&(last, _)| last < seq) {
            self.0.push_back((seq, slot));
            return;
        }
        match self.find(seq) {
            Ok(i) => self.0[i].1 = slot,
            Err(i) => self.0.insert(i, (seq, slot)),
        }
    }

    /// Takes `seq` out; returns its slot.
    fn remove(&mut self, seq: u64) -> Option<u32> {
        if self.0.front().is_some_and(|&(first, _)| first == seq) {
            return self.0.pop_front().map(|(_, slot)| slot);
        }
        let i = self.find(seq).ok()?;
        self.0.remove(i).map(|(_, slot)| slot)
    }

    /// (seq, slot), lowest seq first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, u32)> + '_ {
        self.0.iter().copied()
    }

    /// (seq, slot) for the seqs above `seq`, lowest first.
    fn after(&self, seq: u64) -> impl DoubleEndedIterator<Item = (u64, u32)> + '_ {
        let from = self.0.partition_point(|&(s, _)| s <= seq);
        self.0.range(from..).copied()
    }

    /// Keeps the seqs below `seq` only.
    fn retain_below(&mut self, seq: u64) {
        let keep = self.0.partition_point(|&(s, _)| s < seq);
        self.0.truncate(keep);
    }
}

/// A set of the plan's seqs `[start, end)`, one bit each (the delivered ones, the taken ones),
/// kept for a window only: the words from the lowest seq not yet settled to the highest seq put
/// in. Words below the window are dropped once every seq in them has the value `below` (all
/// delivered; none taken any more), and a seq below the window reads as `below`. So the books
/// grow with the seqs in flight, never with the plan: a plan of billions of seqs costs what
/// its window of slots does. A seq outside the plan is never in the set.
#[derive(Debug)]
struct SeqBits {
    start: u64,
    end: u64,
    /// What every seq below `base` is.
    below: bool,
    /// The seq of bit 0 of `words[0]`.
    base: u64,
    words: std::collections::VecDeque<u64>,
}

impl SeqBits {
    fn new(start: u64, end: u64, below: bool) -> SeqBits {
        SeqBits {
            start,
            end,
            below,
            base: start,
            words: Default::default(),
        }
    }

    /// Where `seq` is: `Err(value)` for a seq the set knows without a bit (outside the plan:
    /// false; below the window: `below`), else its word (maybe past the last one) and bit.
    fn at(&self, seq: u64) -> Result<(usize, u64), bool> {
        if seq < self.start || seq >= self.end {
            return Err(false);
        }
        let idx = seq.checked_sub(self.base).ok_or(self.below)?;
        Ok(((idx / 64) as usize, 1u64 << (idx % 64)))
    }

    fn contains(&self, seq: u64) -> bool {
        match self.at(seq) {
            Ok((word, bit)) => self.words.get(word).is_some_and(|w| w & bit != 0),
            Err(value) => value,
        }
    }

    /// Puts `seq` in the set or takes it out (a seq outside the plan: no change); returns
    /// whether it was in. A seq below the window keeps its value `below`.
    fn set(&mut self, seq: u64, on: bool) -> bool {
        let (word, bit) = match self.at(seq) {
            Ok(at) => at,
            Err(value) => return value,
        };
        if word >= self.words.len() {
            if !on {
                return false;
            }
            self.words.resize(word + 1, 0);
        }
        let w = &mut self.words[word];
        let was = *w & bit != 0;
        if on {
            *w |= bit;
        } else {
            *w &= !bit;
        }
        was
    }

    /// Drops the words wholly below `low` whose every seq is `below`: the caller says that
    /// every seq below `low` is settled.
    fn forget_below(&mut self, low: u64) {
        let fill = if self.below { u64::MAX } else { 0 };
        while self.base.saturating_add(64) <= low && self.words.front() == Some(&fill) {
            self.words.pop_front();
            self.base += 64;
        }
        if self.words.is_empty() && !self.below && self.base < low {
            // Nothing kept and nothing below `low` set: the window starts at `low`'s word.
            self.base += (low - self.base) / 64 * 64;
        }
    }

    /// Words kept (memory used is 8 bytes each).
    #[cfg(test)]
    fn words_kept(&self) -> usize {
        self.words.len()
    }
}

impl Sequencer {
    /// Books for `slots` slots and the seqs `[start, end)`, delivered in seq order or not.
    pub fn new(slots: usize, start: u64, end: u64, in_order: bool) -> Sequencer {
        let end = end.max(start);
        Sequencer {
            start,
            end,
            in_order,
            draining: false,
            next_assign: start,
            carried: vec![None; slots],
            held: vec![false; slots],
            quarantined: vec![false; slots],
            waiting: Waiting::default(),
            reissue: BTreeSet::new(),
            taken: SeqBits::new(start, end, false),
            delivered: SeqBits::new(start, end, true),
            low: start,
            distinct: 0,
            deliveries: 0,
            highest: None,
            duplicates: 0,
            out_of_order: 0,
        }
    }

    /// First seq of the run.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the plan's last seq.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The next seq never handed out (the header's `next_assign`).
    pub fn next_assign(&self) -> u64 {
        self.next_assign
    }

    /// Slots in the books.
    pub fn slots(&self) -> u32 {
        self.carried.len() as u32
    }

    /// The seq `slot` carries (also while the daemon holds it), if any.
    pub fn carried(&self, slot: u32) -> Option<u64> {
        self.carried[slot as usize]
    }

    /// Whether the daemon holds `slot` (an upload, or a zero-copy batch at the sink).
    pub fn is_held(&self, slot: u32) -> bool {
        self.held[slot as usize]
    }

    /// Whether the daemon holds any slot.
    pub fn any_held(&self) -> bool {
        self.held.iter().any(|&h| h)
    }

    /// Slots now quarantined.
    pub fn quarantined(&self) -> u64 {
        self.quarantined.iter().filter(|&&q| q).count() as u64
    }

    /// Whether the daemon is draining.
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Whether a seq carried by a slot waits to be taken.
    pub fn any_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Gives `slot` its next seq (a seq that lost its slot first, the lowest), or parks it when
    /// the plan is handed out or the daemon drains. The daemon no longer holds the slot, and the
    /// seq it carried, if any, was taken (or moved elsewhere) before.
    pub fn hand_out(&mut self, slot: u32) -> HandOut {
        let i = slot as usize;
        let was_held = std::mem::replace(&mut self.held[i], false);
        if let Some(old) = self.carried[i].take() {
            // A held slot's seq was taken (`taken` took it out of the waiting seqs), so only a
            // slot that was not held is looked for there: no search on the hot path, where every
            // slot handed out comes back from an upload.
            if !was_held && self.waiting.get(old) == Some(slot) {
                // Never happens in the daemon; if it did, the seq must not be lost.
                debug_assert!(false, "slot {slot} handed out while seq {old} waits in it");
                self.waiting.remove(old);
                self.reissue.insert(old);
            }
        }
        if self.quarantined[i] {
            return HandOut::Quarantined;
        }
        if self.draining {
            return HandOut::Park;
        }
        let seq = match self.reissue.pop_first() {
            Some(seq) => seq,
            None if self.next_assign < self.end => {
                self.next_assign += 1;
                self.next_assign - 1
            }
            None => return HandOut::Park,
        };
        self.carried[i] = Some(seq);
        self.waiting.insert(seq, slot);
        HandOut::Assign(seq)
    }

    /// The (seq, slot) pairs that may be taken now, lowest seq first.
    ///
    /// Unordered: every waiting one (the daemon takes the first whose slot is READY).
    ///
    /// In order, with `ahead` false (the daemon sends each batch on as soon as it lands): at
    /// most one, the lowest seq not taken, once a slot carries it. With `ahead` (the daemon
    /// holds landed batches back for their turn, `daemon/reorder.rs`): every waiting seq, so
    /// that parts READY behind one still being made go up meanwhile; while draining, only those
    /// below the first seq that waits for a slot, which will not get one and so is never
    /// delivered, nor is anything after it.
    pub fn dispatchable(&self, ahead: bool) -> impl Iterator<Item = (u64, u32)> + '_ {
        let gap = self.reissue.first().copied().unwrap_or(u64::MAX);
        let below = if !self.in_order || (ahead && !self.draining) {
            u64::MAX
        } else {
            gap
        };
        let limit = if self.in_order && !ahead {
            1
        } else {
            usize::MAX
        };
        self.waiting
            .iter()
            .take_while(move |&(seq, _)| seq < below)
            .take(limit)
    }

    /// The daemon took `seq` from `slot` (READY → UPLOADING) and holds the slot.
    pub fn taken(&mut self, slot: u32, seq: u64) {
        debug_assert_eq!(self.carried[slot as usize], Some(seq));
        self.waiting.remove(seq);
        self.held[slot as usize] = true;
        self.taken.set(seq, true);
    }

    /// `seq`'s batch in `slot` was bad: the same slot carries it again, to be made again
    /// (`Assign`). While draining, a seq the daemon gave up stays given up (in order, a later
    /// seq must not be delivered past it) and the slot is parked (`Park`).
    pub fn remade(&mut self, slot: u32, seq: u64) -> HandOut {
        let i = slot as usize;
        self.held[i] = false;
        let was_taken = self.taken.set(seq, false);
        let was_waiting = self.waiting.get(seq) == Some(slot);
        if self.draining && !was_taken && !was_waiting {
            self.carried[i] = None;
            return HandOut::Park;
        }
        self.carried[i] = Some(seq);
        self.waiting.insert(seq, slot);
        HandOut::Assign(seq)
    }

    /// The sink is done with `seq`: it counts as delivered. Returns what broke exactly-once or
    /// order, if anything did (the delivery is counted all the same).
    pub fn delivered(&mut self, seq: u64) -> Result<(), DeliveryProblem> {
        self.deliveries += 1;
        self.taken.set(seq, false);
        let mut problem = None;
        if (self.start..self.end).contains(&seq) {
            if self.delivered.set(seq, true) {
                self.duplicates += 1;
                problem = Some(DeliveryProblem::Duplicate { seq });
            } else {
                self.distinct += 1;
                while self.low < self.end && self.delivered.contains(self.low) {
                    self.low += 1;
                }
                self.delivered.forget_below(self.low);
                self.taken.forget_below(self.low);
            }
        } else {
            problem = Some(DeliveryProblem::OutsidePlan { seq });
        }
        if self.in_order {
            let expected = self.highest.map_or(self.start, |h| h + 1);
            if seq != expected && problem.is_none() {
                self.out_of_order += 1;
                problem = Some(DeliveryProblem::OutOfOrder { seq, expected });
            }
        }
        self.highest = Some(self.highest.map_or(seq, |h| h.max(seq)));
        problem.map_or(Ok(()), Err)
    }

    /// The lease on `slot`'s claim expired (a live, hung loader): the slot is quarantined and its
    /// seq, returned, waits for another slot (unless the daemon gave it up while draining).
    pub fn quarantine(&mut self, slot: u32) -> Option<u64> {
        let i = slot as usize;
        self.quarantined[i] = true;
        let seq = self.carried[i].take()?;
        self.waiting.remove(seq)?;
        self.reissue.insert(seq);
        Some(seq)
    }

    /// The hung loader exited or acknowledged: `slot` is back in use with its next seq.
    pub fn release(&mut self, slot: u32) -> HandOut {
        self.quarantined[slot as usize] = false;
        self.hand_out(slot)
    }

    /// Whether seqs wait for a slot and may get one (not while draining).
    pub fn reissue_pending(&self) -> bool {
        !self.draining && !self.reissue.is_empty()
    }

    /// Whether `slot` can take a seq that lost its slot now: it carries none, is not
    /// quarantined and the daemon does not hold it.
    pub fn unused(&self, slot: u32) -> bool {
        let i = slot as usize;
        self.carried[i].is_none() && !self.quarantined[i] && !self.held[i]
    }

    /// In order, when a seq waits for a slot: the (later seq, slot) pairs that could give their
    /// slot up for it, latest first. Empty unordered or when nothing waits.
    pub fn swap_candidates(&self) -> Vec<(u64, u32)> {
        match self.reissue.first() {
            Some(&first) if self.in_order && !self.draining => {
                self.waiting.after(first).rev().collect()
            }
            _ => Vec::new(),
        }
    }

    /// The daemon took `slot` back from loaders for an earlier seq: the later seq it carried
    /// waits for another slot. Follow with [`Sequencer::hand_out`].
    pub fn swap_out(&mut self, slot: u32) {
        if let Some(seq) = self.carried[slot as usize].take() {
            self.waiting.remove(seq);
            self.reissue.insert(seq);
        }
    }

    /// Stop: nothing new is handed out. `taken_back` are the slots the daemon took back from
    /// loaders (FREE → IDLE); their seqs are given up. In order, nothing past the first seq given
    /// up can be delivered any more, so later waiting seqs are given up too (their slots keep
    /// them until the end; they are never taken).
    pub fn drain(&mut self, taken_back: &[u32]) {
        self.draining = true;
        let mut first_gap = u64::MAX;
        for &slot in taken_back {
            if let Some(seq) = self.carried[slot as usize].take() {
                self.waiting.remove(seq);
                first_gap = first_gap.min(seq);
            }
        }
        if self.in_order {
            self.waiting.retain_below(first_gap);
        }
    }

    /// Every seq of the plan delivered at least once.
    pub fn complete(&self) -> bool {
        self.low == self.end
    }

    /// Where a run resumes (`--start-seq`): the lowest seq of the plan not delivered; every seq
    /// below it was delivered.
    pub fn resume_seq(&self) -> u64 {
        self.low
    }

    /// Distinct seqs at or above [`Sequencer::resume_seq`] that were delivered (always 0 in
    /// order): a run resumed there delivers them again.
    pub fn delivered_past_resume(&self) -> u64 {
        self.distinct - (self.low - self.start)
    }

    /// Highest seq delivered, if any.
    pub fn highest_delivered(&self) -> Option<u64> {
        self.highest
    }

    /// Every delivery, duplicates included.
    pub fn deliveries(&self) -> u64 {
        self.deliveries
    }

    /// Deliveries of a seq already delivered.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// In order: deliveries of a seq other than the one due.
    pub fn out_of_order(&self) -> u64 {
        self.out_of_order
    }

    /// Seqs of the plan never delivered.
    pub fn missing(&self) -> u64 {
        (self.end - self.start) - self.distinct
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reorder::Reorder;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn a_seq_set_holds_the_plans_seqs_only_and_says_what_each_one_was() {
        let mut b = SeqBits::new(10, 140, true);
        for seq in [10, 73, 74, 139] {
            assert!(!b.contains(seq));
            assert!(!b.set(seq, true), "seq {seq} was not in");
            assert!(b.contains(seq) && b.set(seq, true), "seq {seq} is in");
        }
        assert!(!b.contains(75) && !b.contains(11));
        assert!(b.set(73, false) && !b.contains(73) && b.contains(74));
        // Outside the plan: never in, no change.
        for seq in [0, 9, 140, u64::MAX] {
            assert!(!b.set(seq, true) && !b.contains(seq));
        }
    }

    #[test]
    fn a_seq_set_keeps_a_window_and_seqs_below_it_read_as_settled() {
        let mut d = SeqBits::new(5, 1 << 40, true);
        let mut t = SeqBits::new(5, 1 << 40, false);
        let mut low = 5;
        // Seqs delivered in order, a few in flight above the lowest: the window never grows
        // past the span in flight, however many seqs go through.
        for seq in 5..200_000u64 {
            t.set(seq, true);
            if seq >= 5 + 8 {
                let done = seq - 8;
                t.set(done, false);
                assert!(!d.set(done, true));
                low = done + 1;
                d.forget_below(low);
                t.forget_below(low);
            }
            assert!(d.words_kept() <= 2 && t.words_kept() <= 2, "seq {seq}");
        }
        assert!(d.contains(5) && d.contains(low - 1) && !d.contains(low));
        assert!(!t.contains(5) && t.contains(low));
        // A seq below the window delivered again is seen as a duplicate.
        assert!(d.set(6, true));
    }

    #[test]
    fn the_sequencers_books_do_not_grow_with_the_plan() {
        let slots = 16;
        let mut q = Sequencer::new(slots, 0, 1 << 40, true);
        for slot in 0..slots as u32 {
            assert!(matches!(q.hand_out(slot), HandOut::Assign(_)));
        }
        for n in 0..100_000u64 {
            let slot = (n % slots as u64) as u32;
            q.taken(slot, n);
            q.delivered(n).unwrap();
            assert!(matches!(q.hand_out(slot), HandOut::Assign(_)));
        }
        assert_eq!(q.resume_seq(), 100_000);
        assert!(
            q.taken.words_kept() <= 2 && q.delivered.words_kept() <= 2,
            "{} and {} words kept after 100000 seqs",
            q.taken.words_kept(),
            q.delivered.words_kept()
        );
    }

    #[test]
    fn waiting_seqs_stay_in_seq_order_however_they_come_and_go() {
        let mut w = Waiting::default();
        assert!(w.is_empty() && w.iter().next().is_none());
        // Handed out in order: added at the back.
        for (seq, slot) in [(10, 0), (11, 1), (12, 2), (14, 3)] {
            w.insert(seq, slot);
        }
        // A seq handed out again (lower), and one moved to another slot.
        w.insert(13, 7);
        w.insert(9, 8);
        w.insert(11, 5);
        let all: Vec<_> = w.iter().collect();
        assert_eq!(all, [(9, 8), (10, 0), (11, 5), (12, 2), (13, 7), (14, 3)]);
        assert_eq!((w.get(11), w.get(15)), (Some(5), None));
        // Taken lowest first, or out of order; an absent seq is no change.
        assert_eq!(w.remove(9), Some(8));
        assert_eq!(w.remove(12), Some(2));
        assert_eq!(w.remove(12), None);
        assert_eq!(w.iter().next().map(|(s, _)| s), Some(10));
        assert_eq!(
            w.after(10).rev().collect::<Vec<_>>(),
            [(14, 3), (13, 7), (11, 5)]
        );
        assert_eq!(w.after(14).count(), 0);
        w.retain_below(13);
        assert_eq!(w.iter().collect::<Vec<_>>(), [(10, 0), (11, 5)]);
        w.retain_below(0);
        assert!(w.is_empty());
    }

    #[test]
    fn in_order_delivery_counts_duplicates_gaps_and_missing() {
        let mut s = Sequencer::new(1, 10, 15, true);
        assert_eq!(s.delivered(10), Ok(()));
        assert_eq!(s.delivered(11), Ok(()));
        assert_eq!(s.delivered(11), Err(DeliveryProblem::Duplicate { seq: 11 }));
        assert_eq!(s.duplicates(), 1);
        assert_eq!(
            s.delivered(13),
            Err(DeliveryProblem::OutOfOrder {
                seq: 13,
                expected: 12
            })
        );
        assert_eq!(s.out_of_order(), 1);
        assert_eq!(
            s.delivered(99),
            Err(DeliveryProblem::OutsidePlan { seq: 99 })
        );
        assert_eq!(s.missing(), 2);
        assert_eq!(s.deliveries(), 5);
        assert_eq!(s.resume_seq(), 12);
        assert!(!s.complete());
    }

    #[test]
    fn unordered_delivery_accepts_any_order_once() {
        let mut s = Sequencer::new(1, 0, 4, false);
        for seq in [3, 0, 2, 1] {
            assert_eq!(s.delivered(seq), Ok(()));
        }
        assert_eq!(s.missing(), 0);
        assert!(s.complete());
        assert_eq!(s.delivered(2), Err(DeliveryProblem::Duplicate { seq: 2 }));
    }

    #[test]
    fn unordered_resume_is_the_lowest_seq_not_delivered() {
        let mut s = Sequencer::new(4, 5, 12, false);
        assert_eq!((s.resume_seq(), s.delivered_past_resume()), (5, 0));
        for seq in [5, 6, 9, 10] {
            s.delivered(seq).unwrap();
        }
        // 7 is missing: a run resumed at 7 delivers 9 and 10 again.
        assert_eq!((s.resume_seq(), s.delivered_past_resume()), (7, 2));
        s.delivered(8).unwrap();
        assert_eq!((s.resume_seq(), s.delivered_past_resume()), (7, 3));
        s.delivered(7).unwrap();
        assert_eq!((s.resume_seq(), s.delivered_past_resume()), (11, 0));
        assert_eq!(s.highest_delivered(), Some(10));
    }

    #[test]
    fn in_order_a_seq_waiting_for_a_slot_blocks_every_later_one() {
        let mut s = Sequencer::new(2, 0, 10, true);
        assert_eq!(s.hand_out(0), HandOut::Assign(0));
        assert_eq!(s.hand_out(1), HandOut::Assign(1));
        assert_eq!(s.dispatchable(false).collect::<Vec<_>>(), [(0, 0)]);
        // Slot 0's loader hangs: seq 0 waits for a slot, seq 1 must not go first.
        assert_eq!(s.quarantine(0), Some(0));
        assert_eq!(s.dispatchable(false).count(), 0);
        // Unless the daemon holds it back for its turn; not while draining (seq 0 never comes).
        assert_eq!(s.dispatchable(true).collect::<Vec<_>>(), [(1, 1)]);
        assert!(s.reissue_pending());
        assert!(!s.unused(0));
        // Slot 1 gives seq 1 up for seq 0.
        assert_eq!(s.swap_candidates(), [(1, 1)]);
        s.swap_out(1);
        assert_eq!(s.hand_out(1), HandOut::Assign(0));
        assert_eq!(s.dispatchable(false).collect::<Vec<_>>(), [(0, 1)]);
        assert_eq!(s.release(0), HandOut::Assign(1));
        assert_eq!(s.dispatchable(true).collect::<Vec<_>>(), [(0, 1), (1, 0)]);
        // Draining with a seq waiting for a slot: nothing past it is offered.
        assert_eq!(s.quarantine(1), Some(0));
        s.drain(&[]);
        assert_eq!(s.dispatchable(true).count(), 0);
    }

    /// A slot's state in the simulated ring.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Ring {
        Idle,
        Free,
        Claimed,
        Ready,
        Uploading,
    }

    /// Something that happens to the ring, its loaders or the daemon's pipeline. Slot numbers
    /// are taken modulo the ring's slots.
    #[derive(Debug, Clone)]
    enum Event {
        Claim(u8),
        Commit(u8),
        /// The claimant died: the slot goes back FREE with the same seq (no sequencer event).
        LoaderDies(u8),
        /// The claimant hung past its lease: quarantine.
        LeaseExpires(u8),
        /// A hung loader exited or acknowledged: the slot comes back.
        HungLoaderGone(u8),
        /// The audit found the descriptor in a state the daemon never left it in.
        Scribble(u8),
        /// The daemon takes the next dispatchable READY slot; its batch may be bad.
        Take {
            bad: bool,
        },
        UploadDone,
        SinkDone,
        PlaceReissued,
    }

    fn event() -> impl Strategy<Value = Event> {
        let slot = any::<u8>();
        prop_oneof![
            4 => slot.prop_map(Event::Claim),
            4 => slot.prop_map(Event::Commit),
            1 => slot.prop_map(Event::LoaderDies),
            1 => slot.prop_map(Event::LeaseExpires),
            1 => slot.prop_map(Event::HungLoaderGone),
            1 => slot.prop_map(Event::Scribble),
            5 => (0..6u8).prop_map(|b| Event::Take { bad: b == 0 }),
            3 => Just(Event::UploadDone),
            3 => Just(Event::SinkDone),
            2 => Just(Event::PlaceReissued),
        ]
    }

    /// The reference: the same books in their plainest form, every answer by a linear scan.
    #[derive(Debug)]
    struct Model {
        start: u64,
        end: u64,
        in_order: bool,
        draining: bool,
        next: u64,
        carried: Vec<Option<u64>>,
        held: Vec<bool>,
        quarantined: Vec<bool>,
        reissue: BTreeSet<u64>,
        taken: BTreeSet<u64>,
        given_up: BTreeSet<u64>,
        delivered: BTreeSet<u64>,
    }

    impl Model {
        fn new(slots: usize, start: u64, end: u64, in_order: bool) -> Model {
            Model {
                start,
                end,
                in_order,
                draining: false,
                next: start,
                carried: vec![None; slots],
                held: vec![false; slots],
                quarantined: vec![false; slots],
                reissue: BTreeSet::new(),
                taken: BTreeSet::new(),
                given_up: BTreeSet::new(),
                delivered: BTreeSet::new(),
            }
        }

        fn hand_out(&mut self, slot: usize) -> HandOut {
            self.held[slot] = false;
            self.carried[slot] = None;
            if self.quarantined[slot] {
                return HandOut::Quarantined;
            }
            if self.draining {
                return HandOut::Park;
            }
            let seq = if let Some(&s) = self.reissue.iter().next() {
                self.reissue.remove(&s);
                s
            } else if self.next < self.end {
                self.next += 1;
                self.next - 1
            } else {
                return HandOut::Park;
            };
            self.carried[slot] = Some(seq);
            HandOut::Assign(seq)
        }

        /// Carried by a slot the daemon does not hold, not given up: (seq, slot), by seq.
        fn waiting(&self) -> Vec<(u64, u32)> {
            let mut w: Vec<(u64, u32)> = (0..self.carried.len())
                .filter_map(|i| {
                    let s = self.carried[i]?;
                    (!self.held[i] && !self.given_up.contains(&s)).then_some((s, i as u32))
                })
                .collect();
            w.sort();
            w
        }

        fn dispatchable(&self, ahead: bool) -> Vec<(u64, u32)> {
            let waiting = self.waiting();
            if !self.in_order {
                return waiting;
            }
            if ahead {
                // Every waiting seq; draining, those before the first waiting for a slot.
                let gap = if self.draining {
                    self.reissue.iter().next().copied()
                } else {
                    None
                };
                return waiting
                    .into_iter()
                    .filter(|&(s, _)| gap.is_none_or(|g| s < g))
                    .collect();
            }
            // The lowest seq neither taken nor delivered, when a slot carries it.
            let lowest = (self.start..self.end)
                .find(|s| !self.taken.contains(s) && !self.delivered.contains(s));
            waiting
                .into_iter()
                .filter(|&(s, _)| Some(s) == lowest)
                .collect()
        }

        fn swap_candidates(&self) -> Vec<(u64, u32)> {
            let Some(&first) = self.reissue.iter().next() else {
                return Vec::new();
            };
            if !self.in_order || self.draining {
                return Vec::new();
            }
            let mut c: Vec<(u64, u32)> = self
                .waiting()
                .into_iter()
                .filter(|&(s, _)| s > first)
                .collect();
            c.reverse();
            c
        }

        fn resume(&self) -> u64 {
            (self.start..self.end)
                .find(|s| !self.delivered.contains(s))
                .unwrap_or(self.end)
        }
    }

    /// The ring, its loaders and the daemon's pipeline around one [`Sequencer`] and the
    /// [`Model`], driven the way the daemon drives them.
    struct World {
        seq: Sequencer,
        model: Model,
        ring: Vec<(Ring, u64)>,
        zero_copy: bool,
        /// Parts are taken ahead and held back for their turn (in order, not zero-copy).
        ahead: bool,
        /// Batch buffers, and those free (a batch per seq here).
        buffers: usize,
        free: usize,
        /// Landed batches held back for their turn.
        order: Reorder<u64>,
        uploads: VecDeque<(u32, u64)>,
        sink: VecDeque<(Option<u32>, u64)>,
        /// Every delivery, in order.
        delivered: Vec<u64>,
        /// Seqs whose batch was lost (claimant dead or hung, bad batch, slot taken back): each
        /// must be made again.
        lost: BTreeSet<u64>,
    }

    impl World {
        fn new(
            slots: usize,
            buffers: usize,
            start: u64,
            count: u64,
            in_order: bool,
            zero_copy: bool,
        ) -> World {
            let ahead = in_order && !zero_copy;
            let mut w = World {
                seq: Sequencer::new(slots, start, start + count, in_order),
                model: Model::new(slots, start, start + count, in_order),
                ring: vec![(Ring::Idle, 0); slots],
                zero_copy,
                ahead,
                buffers,
                free: buffers,
                order: Reorder::new(buffers, start, ahead),
                uploads: VecDeque::new(),
                sink: VecDeque::new(),
                delivered: Vec::new(),
                lost: BTreeSet::new(),
            };
            for slot in 0..slots as u32 {
                w.hand_out(slot);
            }
            w
        }

        fn hand_out(&mut self, slot: u32) {
            let got = self.seq.hand_out(slot);
            assert_eq!(got, self.model.hand_out(slot as usize), "hand_out({slot})");
            self.apply(slot, got);
        }

        fn apply(&mut self, slot: u32, h: HandOut) {
            match h {
                HandOut::Assign(s) => self.ring[slot as usize] = (Ring::Free, s),
                HandOut::Park => self.ring[slot as usize] = (Ring::Idle, 0),
                HandOut::Quarantined => {}
            }
        }

        fn slot(&self, i: u8) -> usize {
            usize::from(i) % self.ring.len()
        }

        fn step(&mut self, e: &Event) {
            match *e {
                Event::Claim(i) => {
                    let i = self.slot(i);
                    if self.ring[i].0 == Ring::Free {
                        self.ring[i].0 = Ring::Claimed;
                    }
                }
                Event::Commit(i) => {
                    let i = self.slot(i);
                    if self.ring[i].0 == Ring::Claimed {
                        self.ring[i].0 = Ring::Ready;
                    }
                }
                Event::LoaderDies(i) => {
                    let i = self.slot(i);
                    if self.ring[i].0 == Ring::Claimed {
                        self.ring[i].0 = Ring::Free;
                        self.lost.insert(self.ring[i].1);
                    }
                }
                Event::LeaseExpires(i) => {
                    let i = self.slot(i);
                    if self.ring[i].0 == Ring::Claimed {
                        self.ring[i].0 = Ring::Idle;
                        let got = self.seq.quarantine(i as u32);
                        let m = &mut self.model;
                        m.quarantined[i] = true;
                        let want = m.carried[i].take().filter(|s| !m.given_up.contains(s));
                        if let Some(s) = want {
                            m.reissue.insert(s);
                            self.lost.insert(s);
                        }
                        assert_eq!(got, want, "quarantine({i})");
                    }
                }
                Event::HungLoaderGone(i) => {
                    let i = self.slot(i);
                    if self.seq.quarantined[i] {
                        let got = self.seq.release(i as u32);
                        self.model.quarantined[i] = false;
                        assert_eq!(got, self.model.hand_out(i), "release({i})");
                        self.apply(i as u32, got);
                    }
                }
                Event::Scribble(i) => {
                    let i = self.slot(i);
                    if self.seq.is_held(i as u32) {
                        return; // the daemon's own (UPLOADING): not audited
                    }
                    match self.seq.carried(i as u32) {
                        Some(s) => {
                            self.remade(i as u32, s);
                        }
                        None => self.ring[i] = (Ring::Idle, 0),
                    }
                }
                Event::Take { bad } => {
                    self.take(bad);
                }
                Event::UploadDone => {
                    if let Some((slot, s)) = self.uploads.pop_front() {
                        self.hand_out(slot);
                        if let Some(s) = self.order.landed(s, s) {
                            self.sink.push_back((None, s));
                            while let Some(s) = self.order.pop_due() {
                                self.sink.push_back((None, s));
                            }
                        }
                    }
                }
                Event::SinkDone => {
                    if let Some((slot, s)) = self.sink.pop_front() {
                        self.free += 1;
                        assert_eq!(self.seq.delivered(s), Ok(()), "delivered({s})");
                        self.model.taken.remove(&s);
                        self.model.delivered.insert(s);
                        self.delivered.push(s);
                        if let Some(slot) = slot {
                            self.hand_out(slot);
                        }
                    }
                }
                Event::PlaceReissued => self.place_reissued(),
            }
        }

        fn remade(&mut self, slot: u32, s: u64) {
            let got = self.seq.remade(slot, s);
            let m = &mut self.model;
            let i = slot as usize;
            m.held[i] = false;
            m.taken.remove(&s);
            let want = if m.given_up.contains(&s) {
                m.carried[i] = None;
                HandOut::Park
            } else {
                m.carried[i] = Some(s);
                self.lost.insert(s);
                HandOut::Assign(s)
            };
            assert_eq!(got, want, "remade({slot}, {s})");
            self.apply(slot, got);
        }

        /// The daemon's dispatch step; whether a slot was taken.
        fn take(&mut self, bad: bool) -> bool {
            let candidates: Vec<(u64, u32)> = self.seq.dispatchable(self.ahead).collect();
            assert_eq!(
                candidates,
                self.model.dispatchable(self.ahead),
                "dispatchable"
            );
            let ready = |&(_, sl): &(u64, u32)| self.ring[sl as usize].0 == Ring::Ready;
            // As the daemon: in order, seqs whose batch may not take a buffer end the look
            // (later ones would need more); unordered, any with a free buffer.
            let pick = if self.ahead {
                candidates
                    .iter()
                    .copied()
                    .take_while(|&(s, _)| self.order.may_open(s, self.free))
                    .find(ready)
            } else if self.seq.in_order {
                candidates
                    .first()
                    .copied()
                    .filter(ready)
                    .filter(|_| self.free > 0)
            } else {
                candidates
                    .iter()
                    .copied()
                    .find(ready)
                    .filter(|_| self.free > 0)
            };
            let Some((s, slot)) = pick else {
                return false;
            };
            assert_eq!(
                self.ring[slot as usize].1, s,
                "the slot holds what the books say"
            );
            self.seq.taken(slot, s);
            self.model.held[slot as usize] = true;
            self.model.taken.insert(s);
            self.ring[slot as usize].0 = Ring::Uploading;
            if bad {
                self.remade(slot, s);
                return true;
            }
            self.free -= 1;
            self.order.opened(s);
            if self.zero_copy {
                self.sink.push_back((Some(slot), s));
            } else {
                self.uploads.push_back((slot, s));
            }
            true
        }

        /// The daemon's `place_reissued`.
        fn place_reissued(&mut self) {
            if self.seq.draining() {
                return;
            }
            for slot in 0..self.seq.slots() {
                if !self.seq.reissue_pending() {
                    return;
                }
                if self.seq.unused(slot) {
                    self.hand_out(slot);
                }
            }
            loop {
                let candidates = self.seq.swap_candidates();
                assert_eq!(candidates, self.model.swap_candidates(), "swap candidates");
                let any_held = self.seq.any_held();
                let pick = candidates
                    .into_iter()
                    .find(|&(_, sl)| match self.ring[sl as usize].0 {
                        Ring::Free => true,
                        Ring::Ready => !any_held,
                        _ => false,
                    });
                let Some((later, slot)) = pick else { return };
                self.ring[slot as usize] = (Ring::Idle, 0);
                self.lost.insert(later);
                self.seq.swap_out(slot);
                let m = &mut self.model;
                if let Some(s) = m.carried[slot as usize].take() {
                    m.reissue.insert(s);
                }
                self.hand_out(slot);
            }
        }

        /// The daemon's drain: FREE slots taken back, their seqs given up.
        fn drain(&mut self) {
            let mut back = Vec::new();
            for (i, r) in self.ring.iter_mut().enumerate() {
                if r.0 == Ring::Free {
                    *r = (Ring::Idle, 0);
                    back.push(i as u32);
                }
            }
            self.seq.drain(&back);
            let m = &mut self.model;
            m.draining = true;
            let mut first_gap = u64::MAX;
            for &i in &back {
                if let Some(s) = m.carried[i as usize].take() {
                    m.given_up.insert(s);
                    first_gap = first_gap.min(s);
                }
            }
            if m.in_order {
                for (s, _) in m.waiting() {
                    if s >= first_gap {
                        m.given_up.insert(s);
                    }
                }
            }
        }

        /// Everything the books answer equals the reference, and the world agrees with both.
        fn check(&self) {
            let (seq, m) = (&self.seq, &self.model);
            let slots = self.ring.len();
            let mut carried = BTreeSet::new();
            for i in 0..slots {
                let slot = i as u32;
                assert_eq!(seq.carried(slot), m.carried[i], "carried({i})");
                assert_eq!(seq.is_held(slot), m.held[i], "held({i})");
                assert_eq!(seq.quarantined[i], m.quarantined[i], "quarantined({i})");
                if let Some(s) = m.carried[i] {
                    assert!(carried.insert(s), "seq {s} carried by two slots");
                }
                if matches!(self.ring[i].0, Ring::Free | Ring::Claimed | Ring::Ready) {
                    assert_eq!(Some(self.ring[i].1), seq.carried(slot), "ring slot {i}");
                }
            }
            assert_eq!(seq.next_assign(), m.next, "next_assign");
            assert_eq!(seq.any_waiting(), !m.waiting().is_empty(), "any_waiting");
            assert_eq!(
                seq.dispatchable(self.ahead).collect::<Vec<_>>(),
                m.dispatchable(self.ahead),
                "dispatchable"
            );
            let all = (m.start..m.end).all(|s| m.delivered.contains(&s));
            assert_eq!(seq.complete(), all, "complete");
            let resume = m.resume();
            assert_eq!(seq.resume_seq(), resume, "resume_seq");
            let past = m.delivered.range(resume..).count() as u64;
            assert_eq!(seq.delivered_past_resume(), past, "delivered_past_resume");
            assert_eq!(
                seq.highest_delivered(),
                m.delivered.iter().next_back().copied(),
                "highest_delivered"
            );
            assert_eq!(
                seq.missing(),
                (m.end - m.start) - m.delivered.len() as u64,
                "missing"
            );
            // Every seq handed out is in exactly one place.
            let held: Vec<u64> = self.order.held().copied().collect();
            let in_pipeline: BTreeSet<u64> = self
                .uploads
                .iter()
                .map(|&(_, s)| s)
                .chain(self.sink.iter().map(|&(_, s)| s))
                .chain(held)
                .collect();
            // Every batch buffer is free or holds a batch somewhere in the pipeline.
            assert_eq!(self.free + in_pipeline.len(), self.buffers, "batch buffers");
            assert_eq!(in_pipeline, m.taken, "taken");
            let waiting: BTreeSet<u64> = m.waiting().into_iter().map(|(s, _)| s).collect();
            for s in m.start..m.next {
                let places = [
                    m.reissue.contains(&s),
                    waiting.contains(&s),
                    m.taken.contains(&s),
                    m.delivered.contains(&s),
                    m.given_up.contains(&s),
                ];
                assert_eq!(
                    places.iter().filter(|&&p| p).count(),
                    1,
                    "seq {s} in {places:?} (reissue, waiting, taken, delivered, given up)"
                );
            }
            // Nothing delivered twice; in order, nothing out of order.
            let mut seen = BTreeSet::new();
            for &s in &self.delivered {
                assert!(seen.insert(s), "seq {s} delivered twice");
            }
            if m.in_order {
                let expect: Vec<u64> = (m.start..m.start + self.delivered.len() as u64).collect();
                assert_eq!(self.delivered, expect, "in-order delivery");
            }
            assert_eq!(seq.duplicates(), 0);
            assert_eq!(seq.out_of_order(), 0);
        }

        /// Loaders make everything, hung ones go away, the pipeline empties; until the run is
        /// complete (or, drained, until nothing moves).
        fn finish(&mut self) {
            let rounds = 4 * (self.seq.end() - self.seq.start()) + 4 * self.ring.len() as u64 + 8;
            for _ in 0..rounds {
                if self.seq.complete() && self.uploads.is_empty() && self.sink.is_empty() {
                    assert_eq!(self.order.waiting(), 0, "held back after the last delivery");
                    return;
                }
                let before = (
                    self.delivered.len(),
                    self.ring.clone(),
                    self.seq.next_assign(),
                );
                for i in 0..self.ring.len() as u8 {
                    self.step(&Event::HungLoaderGone(i));
                }
                self.step(&Event::PlaceReissued);
                for i in 0..self.ring.len() as u8 {
                    self.step(&Event::Claim(i));
                    self.step(&Event::Commit(i));
                }
                while self.take(false) {}
                while !self.uploads.is_empty() {
                    self.step(&Event::UploadDone);
                }
                while !self.sink.is_empty() {
                    self.step(&Event::SinkDone);
                }
                self.check();
                let after = (
                    self.delivered.len(),
                    self.ring.clone(),
                    self.seq.next_assign(),
                );
                if self.seq.draining() && before == after {
                    return;
                }
            }
            panic!("no progress: {:?}", self.seq);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn the_sequencer_agrees_with_the_reference_and_delivers_every_seq_once(
            slots in 1usize..=8,
            buffers in 1usize..=4,
            start in 0u64..50,
            count in 0u64..=200,
            in_order in any::<bool>(),
            zero_copy in any::<bool>(),
            events in prop::collection::vec(event(), 0..400),
            drain_at in prop::option::weighted(0.25, 0usize..400),
        ) {
            let mut w = World::new(slots, buffers, start, count, in_order, zero_copy);
            w.check();
            for (n, e) in events.iter().enumerate() {
                if drain_at == Some(n) {
                    w.drain();
                    w.check();
                }
                w.step(e);
                w.check();
            }
            if drain_at.is_some_and(|n| n >= events.len()) {
                w.drain();
                w.check();
            }
            w.finish();
            w.check();
            let end = start + count;
            let resume = w.seq.resume_seq();
            let delivered: BTreeSet<u64> = w.delivered.iter().copied().collect();
            if w.seq.draining() {
                // Every seq below the resume point delivered once, that one not at all.
                prop_assert!((start..resume).all(|s| delivered.contains(&s)));
                prop_assert!(resume == end || !delivered.contains(&resume));
                prop_assert_eq!(
                    w.seq.delivered_past_resume(),
                    delivered.range(resume..).count() as u64
                );
                if in_order {
                    prop_assert_eq!(delivered, (start..resume).collect::<BTreeSet<u64>>());
                    prop_assert_eq!(w.seq.delivered_past_resume(), 0);
                }
            } else {
                // Every seq delivered exactly once, the lost ones made again; complete.
                prop_assert!(w.seq.complete());
                prop_assert_eq!(w.delivered.len() as u64, count);
                prop_assert_eq!(&delivered, &(start..end).collect::<BTreeSet<u64>>());
                prop_assert!(w.lost.iter().all(|s| delivered.contains(s)));
                prop_assert_eq!((resume, w.seq.delivered_past_resume()), (end, 0));
            }
        }
    }
}
