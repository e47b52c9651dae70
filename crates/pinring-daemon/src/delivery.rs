//! The delivery stage: whole batches, in their turn, to the sink thread (verify, compute), done
//! at once for the discard sink, or handed to a consumer (daemon/handoff.rs); what comes back is
//! booked as delivered (exactly once, in order: the sequencer checks it) and its device buffer
//! (or zero-copy slot) is free again. Its state is [`SinkLink`] (and the handoff's books).
//!
//! Entry points: [`Delivery::poll`] (once a pass: the sink's results, then the consumer's
//! returns, `Delivery::collect_returns`) and [`Delivery::send_batch`] (a whole batch from the
//! uploads stage), given the daemon's [`Core`], the uploads (which get the device buffers and
//! slots back) and the recovery (which forgets a delivered seq's bad batches).

use super::handoff::HandoffBooks;
use super::recovery::Recovery;
use super::{Assembly, Core, DaemonError, Uploads};
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

/// The delivery stage's state: the sink, and the books of batches handed to a consumer.
pub(super) struct Delivery {
    /// The sink thread and the channels to it.
    pub(super) sink: SinkLink,
    /// Batches handed to a consumer (`--sink consumer`, daemon/handoff.rs).
    pub(super) handoff_books: HandoffBooks,
}

impl Delivery {
    /// The delivery stage's entry point, once a pass: batches back from the sink thread, then
    /// buffers back from the consumer. True if anything came back.
    pub(super) fn poll(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
    ) -> Result<bool, DaemonError> {
        let mut progressed = self.collect_sink_results(core, up, recovery)?;
        progressed |= self.collect_returns(core, up, recovery)?;
        Ok(progressed)
    }

    /// A whole batch, in its turn, to the consumer or the sink.
    pub(super) fn send_batch(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
        done: Assembly,
    ) -> Result<(), DaemonError> {
        let batch = done.batch;
        if self.sink.kind == SinkKind::Consumer {
            return self.hand_over(
                core,
                up,
                super::handoff::Ready {
                    buffer: done.buffer,
                    seq: batch * core.run.parts,
                    batch,
                    epoch: done.epoch,
                    index_in_epoch: done.index_in_epoch,
                    bytes: done.len,
                    samples: done.samples,
                },
            );
        }
        let job = SinkJob {
            seq: batch * core.run.parts,
            source: sink::Source::Buffer(done.buffer),
            buffer: done.buffer,
            len: done.len,
            samples: done.samples,
        };
        self.send_to_sink(core, up, recovery, job)
    }

    /// Hands a batch to the sink thread; the discard sink is done at once, here, which saves a
    /// thread round trip per batch.
    pub(super) fn send_to_sink(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
        job: SinkJob,
    ) -> Result<(), DaemonError> {
        self.sink.pending += 1;
        if self.sink.kind == SinkKind::Discard {
            // Only a zero-copy batch's latency ends here, and its slot may have been committed
            // after this pass began: read the clock for it.
            let done_ns = match job.source {
                sink::Source::Mapped { .. } => pinring_ring::clock::monotonic_ns(),
                sink::Source::Buffer(_) => core.now.ns,
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
            self.deliver(core, up, recovery, done);
            return Ok(());
        }
        match &self.sink.tx {
            Some(tx) => tx.send(job).map_err(|_| DaemonError::Internal {
                ring: core.run.cfg.ring.name.clone(),
                what: "the sink thread stopped".into(),
            }),
            None => Ok(()),
        }
    }

    fn collect_sink_results(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
    ) -> Result<bool, DaemonError> {
        let mut progressed = false;
        while let Ok(done) = self.sink.rx.try_recv() {
            // As for completions, looked at after the result arrived (the sink thread marks a
            // fault before it sends): a zero-copy sink may have read the zero pages.
            if core.ring.truncated_here() {
                core.ring.check_file()?;
            }
            progressed = true;
            self.deliver(core, up, recovery, done);
        }
        Ok(progressed)
    }

    /// A batch the sink is done with: its buffer (or zero-copy slot) is free again, and it
    /// counts as delivered.
    fn deliver(
        &mut self,
        core: &mut Core,
        up: &mut Uploads,
        recovery: &mut Recovery,
        done: SinkDone,
    ) {
        self.sink.pending -= 1;
        up.free_buffers.push_back(done.buffer);
        if let sink::Source::Mapped { slot, .. } = done.source {
            // Zero-copy: the sink's kernel has finished reading the slot; hand it out again.
            if let Some(commit_ns) = up.zero_copy_commits.remove(slot) {
                core.record_latency(commit_ns, done.done_ns);
            }
            core.hand_out(slot);
            core.ring.wake_loaders(1);
        }
        core.tally.sink_busy_ns += done.busy_ns;
        // Zero-copy batches are one part.
        let parts = if matches!(done.source, sink::Source::Mapped { .. }) {
            1
        } else {
            core.run.parts
        };
        book_delivery(
            core,
            recovery,
            done.seq,
            parts,
            done.failure,
            done.verified,
            done.samples,
        );
    }
}

/// Books a delivered batch: exactly once and in order at part level (a batch delivers each
/// of its parts' seqs, first to last), the counters, the published resume point.
pub(super) fn book_delivery(
    core: &mut Core,
    recovery: &mut Recovery,
    seq: u64,
    parts: u64,
    failure: Option<String>,
    verified: bool,
    samples: Vec<u64>,
) {
    // Every part is booked, even after one reports a problem; the first problem is kept.
    let mut order_problem = None;
    for s in seq..seq + parts {
        recovery.delivered(s);
        if let Err(p) = core.sequencer.delivered(s) {
            order_problem.get_or_insert(p);
        }
    }
    let problem = failure.or(order_problem.map(|p| p.to_string()));
    if let Some(msg) = problem {
        core.tally.verify_failures += 1;
        tracing::error!(ring = %core.run.cfg.ring.name, seq, "{msg}");
        core.tally.first_failure.get_or_insert(msg);
    } else if verified {
        core.tally.verified += 1;
    }
    core.tally.last_delivery = core.now.at;
    // The first batch's latency is a figure of its own: read, not the pass's start.
    core.tally.first_delivery.get_or_insert_with(Instant::now);
    core.unpublished.delivered += 1;
    // The daemon's published resume point, for status; never read back.
    core.ring.publish_resume_seq(core.sequencer.resume_seq());
    tracing::debug!(ring = %core.run.cfg.ring.name, seq, "batch delivered");
    core.ids.give_back(samples);
}
