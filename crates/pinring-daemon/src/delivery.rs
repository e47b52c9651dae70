//! The delivery stage: whole batches, in their turn, to the sink thread (verify, compute), done
//! at once for the discard sink, or handed to a consumer (daemon/handoff.rs); what comes back is
//! booked as delivered (exactly once, in order: the sequencer checks it) and its device buffer
//! (or zero-copy slot) is free again. Its state is [`SinkLink`] (and the handoff's books).
//!
//! Entry points: [`Daemon::part_landed`] (from the uploads stage) and
//! [`Daemon::collect_sink_results`] (once a pass; the consumer's returns are
//! `Daemon::collect_returns`).

use super::{Assembly, Daemon, DaemonError};
use crate::sink::{self, SinkDone, SinkJob, SinkKind};
use crossbeam_channel::Receiver;
use std::time::Instant;

/// The daemon's end of its sink: which sink, the thread that runs it and the channels to it.
pub(super) struct SinkLink {
    pub(super) kind: SinkKind,
    /// Jobs to the sink thread (None once closed, at finish).
    pub(super) tx: Option<crossbeam_channel::Sender<SinkJob>>,
    /// Its results.
    pub(super) rx: Receiver<SinkDone>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
    /// Batches at the sink (or handed to a consumer) not yet back.
    pub(super) pending: usize,
}

impl Daemon {
    /// Part `seq` of batch `batch` is in device buffer `buffer` (or, when the consumer copies,
    /// listed in its row of the part table): after the batch's last part, the sink gets the
    /// whole batch.
    pub(super) fn part_landed(
        &mut self,
        seq: u64,
        batch: u64,
        buffer: usize,
    ) -> Result<(), DaemonError> {
        let Some(assembly) = self
            .up
            .assemblies
            .get_mut(buffer)
            .filter(|a| a.batch == batch)
        else {
            return Err(DaemonError::Internal {
                ring: self.core.run.cfg.ring.name.clone(),
                what: format!(
                    "part seq {seq} landed for batch {batch}, which is not assembled in device buffer {buffer}"
                ),
            });
        };
        assembly.landed += 1;
        if assembly.landed < self.core.run.parts {
            return Ok(());
        }
        let Some(done) = self.up.assemblies.close(buffer) else {
            return Ok(());
        };
        // In its turn: a batch taken ahead waits for every earlier one.
        let Some(done) = self.up.order.landed(batch, done) else {
            return Ok(());
        };
        self.send_batch(done)?;
        while let Some(done) = self.up.order.pop_due() {
            self.send_batch(done)?;
        }
        Ok(())
    }

    /// A whole batch, in its turn, to the consumer or the sink.
    fn send_batch(&mut self, done: Assembly) -> Result<(), DaemonError> {
        let batch = done.batch;
        if self.sink.kind == SinkKind::Consumer {
            return self.hand_over(super::handoff::Ready {
                buffer: done.buffer,
                seq: batch * self.core.run.parts,
                batch,
                epoch: done.epoch,
                index_in_epoch: done.index_in_epoch,
                bytes: done.len,
                samples: done.samples,
            });
        }
        let job = SinkJob {
            seq: batch * self.core.run.parts,
            source: sink::Source::Buffer(done.buffer),
            buffer: done.buffer,
            len: done.len,
            samples: done.samples,
        };
        self.send_to_sink(job)
    }

    /// Hands a batch to the sink thread; the discard sink is done at once, here, which saves a
    /// thread round trip per batch.
    pub(super) fn send_to_sink(&mut self, job: SinkJob) -> Result<(), DaemonError> {
        self.sink.pending += 1;
        if self.sink.kind == SinkKind::Discard {
            // Only a zero-copy batch's latency ends here, and its slot may have been committed
            // after this pass began: read the clock for it.
            let done_ns = match job.source {
                sink::Source::Mapped { .. } => pinring_ring::clock::monotonic_ns(),
                sink::Source::Buffer(_) => self.core.now.ns,
            };
            let done = SinkDone {
                seq: job.seq,
                source: job.source,
                done_ns,
                buffer: job.buffer,
                verified: false,
                failure: None,
                busy_ns: 0,
                samples: job.samples,
            };
            self.deliver(done);
            return Ok(());
        }
        match &self.sink.tx {
            Some(tx) => tx.send(job).map_err(|_| DaemonError::Internal {
                ring: self.core.run.cfg.ring.name.clone(),
                what: "the sink thread stopped".into(),
            }),
            None => Ok(()),
        }
    }

    pub(super) fn collect_sink_results(&mut self) -> Result<bool, DaemonError> {
        let mut progressed = false;
        while let Ok(done) = self.sink.rx.try_recv() {
            // As for completions, looked at after the result arrived (the sink thread marks a
            // fault before it sends): a zero-copy sink may have read the zero pages.
            if self.core.ring.truncated_here() {
                self.core.ring.check_file()?;
            }
            progressed = true;
            self.deliver(done);
        }
        Ok(progressed)
    }

    /// A batch the sink is done with: its buffer (or zero-copy slot) is free again, and it
    /// counts as delivered.
    fn deliver(&mut self, done: SinkDone) {
        self.sink.pending -= 1;
        self.up.free_buffers.push_back(done.buffer);
        if let sink::Source::Mapped { slot, .. } = done.source {
            // Zero-copy: the sink's kernel has finished reading the slot; hand it out again.
            if let Some(commit_ns) = self.up.zero_copy_commits.remove(slot) {
                self.core.record_latency(commit_ns, done.done_ns);
            }
            self.core.hand_out(slot);
            self.core.ring.wake_loaders(1);
        }
        self.core.tally.sink_busy_ns += done.busy_ns;
        // Zero-copy batches are one part.
        let parts = if matches!(done.source, sink::Source::Mapped { .. }) {
            1
        } else {
            self.core.run.parts
        };
        self.book_delivery(done.seq, parts, done.failure, done.verified, done.samples);
    }

    /// Books a delivered batch: exactly once and in order at part level (a batch delivers each
    /// of its parts' seqs, first to last), the counters, the published resume point.
    pub(super) fn book_delivery(
        &mut self,
        seq: u64,
        parts: u64,
        failure: Option<String>,
        verified: bool,
        samples: Vec<u64>,
    ) {
        // Every part is booked, even after one reports a problem; the first problem is kept.
        let mut order_problem = None;
        for s in seq..seq + parts {
            self.recovery.delivered(s);
            if let Err(p) = self.core.sequencer.delivered(s) {
                order_problem.get_or_insert(p);
            }
        }
        let problem = failure.or(order_problem.map(|p| p.to_string()));
        if let Some(msg) = problem {
            self.core.tally.verify_failures += 1;
            tracing::error!(ring = %self.core.run.cfg.ring.name, seq, "{msg}");
            self.core.tally.first_failure.get_or_insert(msg);
        } else if verified {
            self.core.tally.verified += 1;
        }
        self.core.tally.last_delivery = self.core.now.at;
        // The first batch's latency is a figure of its own: read, not the pass's start.
        self.core
            .tally
            .first_delivery
            .get_or_insert_with(Instant::now);
        self.core.unpublished.delivered += 1;
        // The daemon's published resume point, for status; never read back.
        self.core
            .ring
            .publish_resume_seq(self.core.sequencer.resume_seq());
        tracing::debug!(ring = %self.core.run.cfg.ring.name, seq, "batch delivered");
        self.intake.give_back(samples);
    }
}
