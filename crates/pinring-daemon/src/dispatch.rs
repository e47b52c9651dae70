//! The data path: take READY slots (in seq order, or any when unordered), check them against the
//! daemon's own plan, submit their uploads (one per field of the part: each field's chunk to its
//! place in the batch's device buffer), collect completions, feed the sink, and count what the
//! sink delivered.

use super::{Assembly, Daemon, DaemonError, InFlight};
use crate::sink::{self, SinkDone, SinkJob, SinkKind};
use pinring_backend::{Completion, UploadJob};
use pinring_data::BatchMeta;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// The tag of the upload of field `field` of the part in `slot`: the slot in the low 32 bits,
/// the field above, so the jobs of one slot are told apart.
pub(super) fn upload_tag(slot: u32, field: usize) -> u64 {
    u64::from(slot) | (field as u64) << 32
}

/// Appends `job` to a part's jobs, or grows the last job when `job` continues it in both the
/// slot and the device buffer (a whole batch whose fields' tensors need no alignment padding:
/// its payload is laid out as the device buffer is, so its fields go up in one copy). Only
/// the source address and destination offset decide; the grown job keeps its own tag.
fn push_coalesced(jobs: &mut Vec<UploadJob>, job: UploadJob) {
    if let Some(last) = jobs.last_mut() {
        if last.buffer == job.buffer
            && last.src.wrapping_add(last.len) == job.src
            && last.dst_offset.checked_add(last.len) == Some(job.dst_offset)
        {
            last.len += job.len;
            return;
        }
    }
    jobs.push(job);
}

/// The slot and field of an upload tag ([`upload_tag`]).
fn tag_parts(tag: u64) -> (u32, u64) {
    (tag as u32, tag >> 32)
}

impl Daemon {
    /// Upload completions: free the slot (next seq), pass the buffer to the sink.
    pub(super) fn collect_completions(&mut self) -> Result<bool, DaemonError> {
        // Loaders are woken once per pass, for all the slots it freed: one system call, not one
        // per batch.
        let mut freed = 0;
        // Every completion that has arrived, taken at once (the engine sends them in runs).
        let mut arrived = std::mem::take(&mut self.up.completion_buf);
        arrived.clear();
        if self
            .uploader
            .completions()
            .drain_into(&mut arrived)
            .is_err()
        {
            return Err(DaemonError::Internal {
                ring: self.run.cfg.ring.name.clone(),
                what: "the upload thread stopped".into(),
            });
        }
        // A segment truncated under the daemon: the copies that completed may have read the
        // zero pages put in its place (pinring_ring::fault); none of them is booked.
        if self.ring.truncated_here() {
            self.up.completion_buf = arrived;
            self.ring.check_file()?;
            return Ok(false);
        }
        let result = self.complete_all(&mut arrived, &mut freed);
        self.up.completion_buf = arrived;
        if freed > 0 {
            self.ring.wake_loaders(freed);
        }
        result
    }

    /// Books the completions in `arrived`, in order (taking them out), counting the slots freed.
    fn complete_all(
        &mut self,
        arrived: &mut Vec<Completion>,
        freed: &mut i32,
    ) -> Result<bool, DaemonError> {
        let mut progressed = false;
        for c in arrived.drain(..) {
            progressed = true;
            let (slot, field) = tag_parts(c.tag);
            let Some(part) = self.up.inflight.get_mut(slot) else {
                return Err(DaemonError::Internal {
                    ring: self.run.cfg.ring.name.clone(),
                    what: format!(
                        "completion for field {field} of slot {slot}, which had no upload in flight"
                    ),
                });
            };
            c.result?;
            // Completions arrive in submission order: the first one of a part is its first job's.
            let first_submitted = *part.submitted.get_or_insert(c.submitted);
            part.jobs_left = part.jobs_left.saturating_sub(1);
            if part.jobs_left > 0 {
                // Another completion of the part is still to come: the slot stays UPLOADING.
                continue;
            }
            let Some(InFlight {
                seq,
                batch,
                buffer,
                len,
                commit_ns,
                ..
            }) = self.up.inflight.remove(slot)
            else {
                continue;
            };
            self.up.inflight_bytes = self.up.inflight_bytes.saturating_sub(len);
            let upload_ns = c
                .completed
                .saturating_duration_since(first_submitted)
                .as_nanos() as u64;
            self.unpublished.upload_ns += upload_ns;
            self.tally.upload_ns += upload_ns;
            // When the batch was on the device, on the clock loaders stamp commits with.
            let on_device_ns = self.now.ns_of(c.completed);
            self.record_latency(commit_ns, on_device_ns);
            self.service
                .upload_done(&self.ring, slot, upload_ns, commit_ns, on_device_ns);
            // (D): every upload of the part has finished reading the slot; hand it out again.
            self.hand_out(slot);
            *freed += 1;
            tracing::trace!(ring = %self.run.cfg.ring.name, seq, batch, len, "part on the device");
            self.part_landed(seq, batch, buffer)?;
        }
        Ok(progressed)
    }

    /// Part `seq` of batch `batch` is in device buffer `buffer` (or, when the consumer copies,
    /// listed in its row of the part table): after the batch's last part, the sink gets the
    /// whole batch.
    fn part_landed(&mut self, seq: u64, batch: u64, buffer: usize) -> Result<(), DaemonError> {
        let Some(assembly) = self
            .up
            .assemblies
            .get_mut(buffer)
            .filter(|a| a.batch == batch)
        else {
            return Err(DaemonError::Internal {
                ring: self.run.cfg.ring.name.clone(),
                what: format!(
                    "part seq {seq} landed for batch {batch}, which is not assembled in device buffer {buffer}"
                ),
            });
        };
        assembly.landed += 1;
        if assembly.landed < self.run.parts {
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
                seq: batch * self.run.parts,
                batch,
                epoch: done.epoch,
                index_in_epoch: done.index_in_epoch,
                bytes: done.len,
                samples: done.samples,
            });
        }
        let job = SinkJob {
            seq: batch * self.run.parts,
            source: sink::Source::Buffer(done.buffer),
            buffer: done.buffer,
            len: done.len,
            samples: done.samples,
        };
        self.send_to_sink(job)
    }

    /// Hands a batch to the sink thread; the discard sink is done at once, here, which saves a
    /// thread round trip per batch.
    fn send_to_sink(&mut self, job: SinkJob) -> Result<(), DaemonError> {
        self.sink.pending += 1;
        if self.sink.kind == SinkKind::Discard {
            // Only a zero-copy batch's latency ends here, and its slot may have been committed
            // after this pass began: read the clock for it.
            let done_ns = match job.source {
                sink::Source::Mapped { .. } => pinring_ring::clock::monotonic_ns(),
                sink::Source::Buffer(_) => self.now.ns,
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
                ring: self.run.cfg.ring.name.clone(),
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
            if self.ring.truncated_here() {
                self.ring.check_file()?;
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
                self.record_latency(commit_ns, done.done_ns);
            }
            self.hand_out(slot);
            self.ring.wake_loaders(1);
        }
        self.tally.sink_busy_ns += done.busy_ns;
        // Zero-copy batches are one part.
        let parts = if matches!(done.source, sink::Source::Mapped { .. }) {
            1
        } else {
            self.run.parts
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
        mut samples: Vec<u64>,
    ) {
        // Every part is booked, even after one reports a problem; the first problem is kept.
        let mut order_problem = None;
        for s in seq..seq + parts {
            self.recovery.delivered(s);
            if let Err(p) = self.sequencer.delivered(s) {
                order_problem.get_or_insert(p);
            }
        }
        let problem = failure.or(order_problem.map(|p| p.to_string()));
        if let Some(msg) = problem {
            self.tally.verify_failures += 1;
            tracing::error!(ring = %self.run.cfg.ring.name, seq, "{msg}");
            self.tally.first_failure.get_or_insert(msg);
        } else if verified {
            self.tally.verified += 1;
        }
        self.tally.last_delivery = self.now.at;
        // The first batch's latency is a figure of its own: read, not the pass's start.
        self.tally.first_delivery.get_or_insert_with(Instant::now);
        self.unpublished.delivered += 1;
        // The daemon's published resume point, for status; never read back.
        self.ring
            .header()
            .next_deliver
            .store(self.sequencer.resume_seq(), Relaxed);
        tracing::debug!(ring = %self.run.cfg.ring.name, seq, "batch delivered");
        samples.clear();
        self.spare_samples.push(samples);
    }

    /// Takes READY slots (in seq order, or any when unordered) and starts their uploads.
    ///
    /// In order, the lowest seq not taken first; when its part is not READY yet, up to
    /// `look_ahead` later ones are looked at and the first READY one whose batch may take a
    /// buffer goes up ahead (daemon/reorder.rs holds its batch back for its turn).
    pub(super) fn dispatch(&mut self) -> Result<bool, DaemonError> {
        let mut progressed = false;
        let ahead = self.run.look_ahead > 0;
        // Waiting parts passed over in this pass because they were not READY.
        let mut passed = 0usize;
        loop {
            // A part can go up if its batch already has a device buffer, or may take a free one.
            let parts = self.run.parts;
            let has_buffer = |seq: u64| {
                self.up.assemblies.buffer_of(seq / parts).is_some()
                    || self
                        .up
                        .order
                        .may_open(seq / parts, self.up.free_buffers.len())
            };
            // In order the sequencer offers the lowest seq not taken (none while an earlier seq
            // waits for a slot), and with a look-ahead the later ones too; unordered, every
            // waiting seq: take one that is READY.
            let candidate = if self.run.cfg.ring.in_order {
                if passed > self.run.look_ahead {
                    break;
                }
                // A later seq's batch needs at least as many buffers: the first that may not
                // take one ends the look.
                self.sequencer
                    .dispatchable(ahead)
                    .nth(passed)
                    .filter(|&(seq, _)| has_buffer(seq))
            } else {
                let ring = &self.ring;
                self.sequencer.dispatchable(false).find(|&(seq, sl)| {
                    has_buffer(seq)
                        && ring.slot_view(sl).state == Some(pinring_ring::SlotState::Ready)
                })
            };
            let Some((seq, slot)) = candidate else { break };
            let taken = match self.ring.take_ready(slot, seq) {
                Ok(Some(t)) => t,
                Ok(None) if ahead => {
                    passed += 1;
                    continue;
                }
                Ok(None) => break,
                Err(pinring_ring::SlotFault::LoaderError { code, .. })
                    if code == pinring_ring::failure::ERR_SAMPLE =>
                {
                    return Err(self.data_failed(slot, seq));
                }
                Err(fault) => {
                    self.bad_batch(slot, seq, fault.to_string())?;
                    progressed = true;
                    continue;
                }
            };
            self.sequencer.taken(slot, seq);
            if passed > 0 {
                self.tally.taken_ahead += 1;
            }
            let mut samples = self.spare_samples.pop().unwrap_or_default();
            let part =
                self.run
                    .plan
                    .part_into(seq, &mut samples)
                    .map_err(|e| DaemonError::Internal {
                        ring: self.run.cfg.ring.name.clone(),
                        what: format!("plan has no part {seq}: {e}"),
                    })?;
            let (epoch, index_in_epoch) = (part.epoch, part.index_in_epoch);
            // The metadata is untrusted: decode with a bound, then compare with our own plan.
            // Copied out of shared memory first: decoded in private memory only.
            self.ring
                .copy_out(slot, taken.meta_offset, taken.meta_len, &mut self.meta_buf);
            let expected = pinring_data::BatchIndices {
                seq,
                epoch,
                index_in_epoch,
                samples,
            };
            // Every field of every sample, field-major; for a byte part its range of the cut
            // field (and the sample's other fields in its first part). The daemon's own plan
            // decides it: the metadata's range is only compared with it, never used.
            let expected_len = self
                .run
                .layout
                .part_payload_bytes(expected.samples.len() as u64, part.bytes);
            let meta_ok = BatchMeta::check_encoded(
                &self.meta_buf,
                self.run.meta_reserve,
                &expected,
                part.bytes,
                self.run.sample_bytes,
                expected_len,
            );
            if let Err(e) = meta_ok {
                self.spare_samples.push(expected.samples);
                self.bad_batch(
                    slot,
                    seq,
                    format!("slot {slot}, seq {seq}: bad batch metadata: {e}"),
                )?;
                progressed = true;
                continue;
            }
            let samples = expected.samples;
            let count = samples.len() as u64;
            if taken.payload_len != expected_len {
                let what = format!(
                    "slot {slot}, seq {seq}: payload is {} bytes, the plan says {expected_len}",
                    taken.payload_len
                );
                self.spare_samples.push(samples);
                self.bad_batch(slot, seq, what)?;
                progressed = true;
                continue;
            }
            let buffer = match self.up.assemblies.buffer_of(part.batch) {
                Some(buffer) => buffer,
                None => {
                    let buffer = self
                        .up
                        .free_buffers
                        .pop_front()
                        .expect("checked: a buffer is free");
                    self.up.order.opened(part.batch);
                    if self.run.parts > 1 {
                        // The whole batch's sample ids, for the sink, from the daemon's plan.
                        let mut whole = self.spare_samples.pop().unwrap_or_default();
                        self.run
                            .plan
                            .batch_into(part.batch, &mut whole)
                            .map_err(|e| DaemonError::Internal {
                                ring: self.run.cfg.ring.name.clone(),
                                what: format!("plan has no batch {}: {e}", part.batch),
                            })?;
                        self.start_assembly(&part, buffer, whole);
                    }
                    buffer
                }
            };
            let len = taken.payload_len as usize;
            self.tally.bytes += taken.payload_len;
            self.unpublished.bytes_delivered += taken.payload_len;
            self.ring.desc(slot).upload_ns.store(self.now.ns, Relaxed);
            progressed = true;
            if self.run.zero_copy {
                // No upload: the sink reads the slot in place; the slot stays UPLOADING (owned
                // by the daemon) until the sink reports back.
                self.up.zero_copy_commits.insert(slot, taken.commit_ns);

                let job = SinkJob {
                    seq,
                    source: sink::Source::Mapped {
                        slot,
                        ptr: sink::SlotPtr(self.ring.upload_source(slot)),
                    },
                    buffer,
                    len,
                    samples,
                };
                self.send_to_sink(job)?;
                continue;
            }
            if self.run.parts == 1 {
                // The part is the whole batch: its sample ids are the batch's.
                self.start_assembly(&part, buffer, samples);
            } else {
                self.spare_samples.push(samples);
            }
            if self.run.consumer_copies {
                // No copy here: the consumer copies the part out of its slot, which stays
                // UPLOADING (the daemon's) until the consumer gives the batch back. The part
                // table's entry is published by the fill's Release store (H1).
                if let Some(entry) = self.ring.part_slot(buffer as u32, (seq % parts) as u32) {
                    entry.store(slot, Relaxed);
                }
                self.up.lent[buffer].push(slot);
                self.record_latency(taken.commit_ns, self.now.ns);
                self.part_landed(seq, part.batch, buffer)?;
                continue;
            }
            // One copy per field: the part's chunk of the field (its samples' values of it,
            // contiguous in the slot; for a byte part, its range of the cut field) to where
            // those values go in the field's tensor. Submitted as one group: the backend
            // says how many completions will come (one per part on CUDA, one per copy on host).
            let base = self.ring.upload_source(slot);
            let mut jobs = std::mem::take(&mut self.up.jobs_buf);
            jobs.clear();
            for copy in self
                .run
                .layout
                .part_copies(count, part.first_in_batch, part.bytes)
            {
                push_coalesced(
                    &mut jobs,
                    UploadJob {
                        tag: upload_tag(slot, copy.field),
                        // Inside the slot: the chunks together are the payload, whose length was
                        // checked against the slot when it was taken and against the plan above.
                        src: base.wrapping_add(copy.src_offset as usize),
                        len: copy.len as usize,
                        buffer,
                        dst_offset: copy.dst_offset as usize,
                    },
                );
            }
            self.up.submits += 1;
            let t = (self.up.submits % super::SUBMIT_TIMED_EVERY == 0).then(Instant::now);
            // SAFETY: the slot is UPLOADING, owned by this loop: no loader may claim it until
            // `hand_out` runs for it, which happens only after every completion the backend
            // announced for its jobs has arrived. Each job's source lies inside the slot's
            // payload (above). The mapping outlives the uploader (the ring Arc is held by self
            // and the sink's doorbell). Deferred: the backend may signal several parts with one
            // event; the main loop flushes before it sleeps, so every part's completion comes.
            let submitted = unsafe { self.uploader.submit_group_deferred(&jobs) };
            if let Some(t) = t {
                self.tally.submit_ns += t.elapsed().as_nanos() as u64 * super::SUBMIT_TIMED_EVERY;
            }
            self.up.jobs_buf = jobs;
            let jobs_left = submitted?;
            // Completions are read on this thread only, so none is looked for before this.
            self.up.inflight_bytes += len;
            self.up.inflight.insert(
                slot,
                InFlight {
                    seq,
                    batch: part.batch,
                    buffer,
                    len,
                    commit_ns: taken.commit_ns,
                    jobs_left,
                    submitted: None,
                },
            );
        }
        Ok(progressed)
    }

    /// Opens the books of the batch of `part` in device buffer `buffer`: the whole batch's
    /// sample ids (for the sink), its payload length, epoch and index, no part landed yet.
    fn start_assembly(&mut self, part: &pinring_data::Part, buffer: usize, samples: Vec<u64>) {
        let assembly = Assembly {
            batch: part.batch,
            buffer,
            landed: 0,
            samples,
            len: self.run.layout.payload_bytes(part.batch_samples) as usize,
            epoch: part.epoch,
            index_in_epoch: part.index_in_epoch,
        };
        self.up.assemblies.open(assembly);
    }

    fn record_latency(&mut self, commit_ns: u64, on_device_ns: u64) {
        if commit_ns != 0 && on_device_ns >= commit_ns {
            self.tally
                .latencies
                .record_us((on_device_ns - commit_ns) / 1000);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_that_continue_each_other_in_slot_and_buffer_become_one() {
        let slot = [0u8; 64];
        let base = slot.as_ptr();
        let job = |field: usize, src: usize, len: usize, dst_offset: usize| UploadJob {
            tag: upload_tag(7, field),
            src: base.wrapping_add(src),
            len,
            buffer: 2,
            dst_offset,
        };
        // Aligned fields: the second continues the first in both places.
        let mut jobs = Vec::new();
        push_coalesced(&mut jobs, job(0, 0, 32, 0));
        push_coalesced(&mut jobs, job(1, 32, 8, 32));
        assert_eq!(jobs.len(), 1);
        assert_eq!((jobs[0].tag, jobs[0].len, jobs[0].dst_offset), (7, 40, 0));
        // Padding before the next tensor (dst 48, src 40): a copy of its own.
        push_coalesced(&mut jobs, job(2, 40, 8, 48));
        assert_eq!(jobs.len(), 2);
        // A gap in the slot, or another buffer: never merged.
        push_coalesced(&mut jobs, job(3, 50, 4, 56));
        assert_eq!(jobs.len(), 3);
        push_coalesced(
            &mut jobs,
            UploadJob {
                buffer: 3,
                ..job(4, 54, 4, 60)
            },
        );
        assert_eq!(jobs.len(), 4);
        // An empty copy that continues the last one adds nothing; a part of empty copies (the
        // empty parts of a short last batch) still has one job, so one completion frees it.
        let mut empty = Vec::new();
        push_coalesced(&mut empty, job(0, 0, 0, 0));
        push_coalesced(&mut empty, job(1, 0, 0, 0));
        assert_eq!((empty.len(), empty[0].len), (1, 0));
    }

    #[test]
    fn upload_tags_tell_the_fields_of_one_slot_apart() {
        for slot in [0, 1, 4095, u32::MAX] {
            for field in [0, 1, 7] {
                assert_eq!(tag_parts(upload_tag(slot, field)), (slot, field as u64));
            }
        }
        assert_ne!(upload_tag(3, 0), upload_tag(3, 1));
        // Field 0's tag is the slot alone, as before fields.
        assert_eq!(upload_tag(3, 0), 3);
    }
}
