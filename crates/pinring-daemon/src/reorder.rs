//! Uploads ahead, deliveries in order: which batch may take a batch buffer now, and which
//! landed batches go to the sink next.
//!
//! In order, the daemon once uploaded only the lowest seq not yet taken, so a part that was
//! READY behind one a slow loader still wrote waited, and so did its slot: with few slots every
//! loader then waited for that one. Now the daemon may take parts of later batches while an
//! earlier one is not READY (its look-ahead); their batches land in any order, and this book
//! holds each landed batch until every batch before it has gone to the sink.
//!
//! A batch takes one of the daemon's batch buffers when its first part is taken and gives it
//! back after the sink. Taken ahead carelessly, later batches could hold every buffer while
//! the batch that is due waits for one, and nothing would be delivered again. Two rules keep
//! a buffer for the due batch:
//! - a batch more than `buffers - 1` past the due one takes none, so batches held back for
//!   their turn hold at most `buffers - 1`; every other buffer is free, uploading, or at the
//!   sink, and comes back without waiting for anything;
//! - a batch takes one only if, after it does, the free ones still cover every batch between
//!   the due one and it that holds none yet, so a later batch never takes the buffer an
//!   earlier one is about to need (the earlier one would wait for the sink to give one back).
//!
//! The sequencer's property test drives this book with the daemon's take, land and deliver
//! steps and checks that every run completes, in order, with every buffer accounted for.
//!
//! Unordered, or when batches are taken in seq order only (zero-copy, and a consumer that
//! copies the batches itself), the book passes each batch straight through.

/// The batches between the due one and the last one holding a buffer (see the module
/// documentation). `T` is what the daemon keeps of a landed batch until it is sent.
#[derive(Debug)]
pub struct Reorder<T> {
    /// Batches are held back for order (in order, taken ahead); else passed through.
    holds: bool,
    /// The next batch to go to the sink.
    due: u64,
    /// By `batch % buffers`, for the batches in `[due, due + buffers)`: the batch holds a
    /// buffer and has not gone to the sink.
    buffered: Vec<bool>,
    /// Every batch of `[due, run_end)` holds a buffer (`run_end` does not): batches taken in
    /// order open `run_end` itself, and [`Reorder::may_open`] counts the batches without a
    /// buffer from here only, not from `due` past every batch in flight.
    run_end: u64,
    /// By `batch % buffers`: the batch landed and waits for its turn.
    landed: Vec<Option<T>>,
}

impl<T> Reorder<T> {
    /// Books for `buffers` batch buffers, batches from `first` on; `holds`: batches may be
    /// taken ahead and must be sent in order.
    pub fn new(buffers: usize, first: u64, holds: bool) -> Reorder<T> {
        let size = if holds { buffers.max(1) } else { 0 };
        Reorder {
            holds,
            due: first,
            buffered: vec![false; size],
            run_end: first,
            landed: std::iter::repeat_with(|| None).take(size).collect(),
        }
    }

    fn at(&self, batch: u64) -> usize {
        (batch % self.buffered.len() as u64) as usize
    }

    /// Whether `batch`, holding no buffer yet, may take one of the `free` buffers.
    pub fn may_open(&self, batch: u64, free: usize) -> bool {
        if free == 0 {
            return false;
        }
        if !self.holds {
            return true;
        }
        // A batch below the due one was sent; one a whole window ahead cannot be covered.
        let Some(ahead) = batch.checked_sub(self.due) else {
            return false;
        };
        if ahead >= self.buffered.len() as u64 {
            return false;
        }
        let unbuffered = (self.run_end..batch)
            .filter(|&b| !self.buffered[self.at(b)])
            .count();
        free > unbuffered
    }

    /// `batch` took a buffer (after [`Reorder::may_open`] said it may).
    pub fn opened(&mut self, batch: u64) {
        if self.holds && batch >= self.due && batch - self.due < self.buffered.len() as u64 {
            let i = self.at(batch);
            self.buffered[i] = true;
            while self.run_end - self.due < self.buffered.len() as u64
                && self.buffered[self.at(self.run_end)]
            {
                self.run_end += 1;
            }
        }
    }

    /// Every part of `batch` landed. Returns it when it goes to the sink now: passed through
    /// (`holds` false), or the due batch, after which [`Reorder::pop_due`] gives the batches
    /// held back behind it. A batch landed ahead of its turn is held (None).
    pub fn landed(&mut self, batch: u64, item: T) -> Option<T> {
        if !self.holds {
            return Some(item);
        }
        let i = self.at(batch);
        debug_assert!(
            batch >= self.due && self.buffered[i] && self.landed[i].is_none(),
            "batch {batch} landed outside the window from {}",
            self.due
        );
        if batch == self.due {
            self.advance(i);
            return Some(item);
        }
        self.landed[i] = Some(item);
        None
    }

    /// The next held batch to send, if its turn came and it landed.
    pub fn pop_due(&mut self) -> Option<T> {
        if !self.holds {
            return None;
        }
        let i = self.at(self.due);
        let item = self.landed[i].take()?;
        self.advance(i);
        Some(item)
    }

    /// The due batch, at `i`, goes to the sink: its place is free, the next batch is due. It
    /// held a buffer, so `run_end` was past it.
    fn advance(&mut self, i: usize) {
        self.buffered[i] = false;
        self.due += 1;
    }

    /// Landed batches waiting for an earlier one.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.held().count()
    }

    /// The next batch to go to the sink (in order).
    #[cfg(test)]
    pub fn due(&self) -> u64 {
        self.due
    }

    /// The landed batches held back, not yet sent.
    #[cfg(test)]
    pub fn held(&self) -> impl Iterator<Item = &T> {
        self.landed.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::Reorder;

    #[test]
    fn batches_landed_ahead_wait_for_the_due_one_and_then_go_in_order() {
        let mut r = Reorder::new(4, 10, true);
        // Batch 10 is late; 11 and 12 take buffers ahead of it, leaving one for it.
        let mut free = 4;
        for b in [11, 12, 10] {
            assert!(r.may_open(b, free), "batch {b}");
            r.opened(b);
            free -= 1;
        }
        assert_eq!(r.landed(12, "c"), None);
        assert_eq!(r.landed(11, "b"), None);
        assert_eq!(r.pop_due(), None, "10 has not landed");
        assert_eq!(r.waiting(), 2);
        let first = r.landed(10, "a");
        let sent: Vec<_> = first
            .into_iter()
            .chain(std::iter::from_fn(|| r.pop_due()))
            .collect();
        assert_eq!(sent, ["a", "b", "c"]);
        assert_eq!((r.due(), r.waiting()), (13, 0));
    }

    #[test]
    fn a_buffer_is_kept_for_every_earlier_batch_without_one() {
        let mut r: Reorder<()> = Reorder::new(4, 0, true);
        // Batch 0 is late: batch 3 may take a buffer only if one stays for each of 0, 1, 2.
        assert!(r.may_open(3, 4));
        assert!(!r.may_open(3, 3));
        r.opened(1);
        assert!(r.may_open(3, 3), "1 holds one: 0 and 2 need two");
        assert!(!r.may_open(3, 2));
        // Nothing a whole window ahead, nothing already sent, nothing without a free buffer.
        assert!(!r.may_open(4, 4));
        assert!(!r.may_open(0, 0));
        r.opened(0);
        assert_eq!(r.landed(0, ()), Some(()), "the due batch goes at once");
        assert_eq!(r.pop_due(), None);
        assert!(!r.may_open(0, 4));
        assert!(r.may_open(4, 4));
    }

    #[test]
    fn passed_through_when_batches_are_taken_in_order_only() {
        let mut r = Reorder::new(2, 0, false);
        assert!(r.may_open(100, 1));
        assert!(!r.may_open(0, 0));
        // Each goes as it lands, in the order it lands; nothing is kept.
        assert_eq!((r.landed(7, 7), r.landed(3, 3)), (Some(7), Some(3)));
        assert_eq!((r.waiting(), r.pop_due()), (0, None));
    }
}
