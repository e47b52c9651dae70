//! The uploads stage: parts the intake took are placed in their batch's device buffer and
//! their copies submitted (one per field of the part: each field's chunk to its place in the
//! buffer); completions free their slots (the next seq) and, once a batch's last part has
//! landed, pass the whole batch to delivery. Its state is [`Uploads`]: the parts in flight, the
//! batches being assembled and the free device buffers; its rules that need no ring (a batch's
//! books by buffer and by number, coalescing copies, the tags) are tested here.
//!
//! Entry points: [`Uploads::poll`] (once a pass) and [`Uploads::start_upload`] (a part from
//! the intake), given the daemon's [`Core`]; a batch whose last part landed goes to
//! [`Delivery::send_batch`].

use super::delivery::Delivery;
use super::intake::TakenPart;
use super::recovery::Recovery;
use super::{reorder, Core, DaemonError};
use crate::sink::{self, SinkJob};
use pinring_backend::{Completion, Decode, UploadJob};
use pinring_data::Part;
use pinring_ring::Taken;
use std::collections::BTreeMap;
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
            && last.decode.is_none()
            && job.decode.is_none()
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

impl Uploads {
    /// The uploads stage's entry point, once a pass: upload completions free their slots (the
    /// next seq) and pass whole batches to `delivery` (`recovery` forgets a delivered seq's bad
    /// batches).
    pub(super) fn poll(
        &mut self,
        core: &mut Core,
        delivery: &mut Delivery,
        recovery: &mut Recovery,
    ) -> Result<bool, DaemonError> {
        // Loaders are woken once per pass, for all the slots it freed: one system call, not one
        // per batch.
        let mut freed = 0;
        // Every completion that has arrived, taken at once (the engine sends them in runs).
        let mut arrived = std::mem::take(&mut self.completion_buf);
        arrived.clear();
        if core
            .uploader
            .completions()
            .drain_into(&mut arrived)
            .is_err()
        {
            return Err(DaemonError::Internal {
                ring: core.run.cfg.ring.name.clone(),
                what: "the upload thread stopped".into(),
            });
        }
        // A segment truncated under the daemon: the copies that completed may have read the
        // zero pages put in its place (pinring_ring::fault); none of them is booked.
        if core.ring.truncated_here() {
            self.completion_buf = arrived;
            core.ring.check_file()?;
            return Ok(false);
        }
        // Before the completions are booked: their parts' seqs are still in flight, and an
        // engine reports a part's faults before its completion.
        if !arrived.is_empty() && core.run.decodes() {
            self.decode_faults(core)?;
        }
        let result = self.complete_all(core, delivery, recovery, &mut arrived, &mut freed);
        self.completion_buf = arrived;
        if freed > 0 {
            core.ring.wake_loaders(freed);
        }
        result
    }

    /// The samples the engine could not decode (`[dataset.image] decode = "gpu"`): each was
    /// written as zeros; logged naming seq, sample and origin, and with `dataset.on_bad_sample
    /// = "fail"` the first ends the run (exit 3), as a loader's bad sample does.
    fn decode_faults(&self, core: &Core) -> Result<(), DaemonError> {
        core.service.decoded(core.uploader.decode_counts());
        for f in core.uploader.take_decode_faults() {
            let (slot, _) = tag_parts(f.tag);
            let seq = self.inflight.get(slot).map_or(u64::MAX, |p| p.seq);
            let ring = &core.run.cfg.ring.name;
            if core.run.cfg.dataset.on_bad_sample == pinring_data::OnBadSample::Fail {
                return Err(DaemonError::DecodeFailed {
                    ring: ring.clone(),
                    seq,
                    sample: f.sample,
                    origin: core.run.cfg.describe_origin(f.at),
                    problem: f.problem,
                });
            }
            tracing::warn!(ring = %ring, seq, sample = f.sample, "sample {} of seq {seq} did not decode ({}): {}; written as zeros (dataset.on_bad_sample = \"skip\")", f.sample, core.run.cfg.describe_origin(f.at), f.problem);
        }
        Ok(())
    }

    /// Books the completions in `arrived`, in order (taking them out), counting the slots freed.
    fn complete_all(
        &mut self,
        core: &mut Core,
        delivery: &mut Delivery,
        recovery: &mut Recovery,
        arrived: &mut Vec<Completion>,
        freed: &mut i32,
    ) -> Result<bool, DaemonError> {
        let mut progressed = false;
        for c in arrived.drain(..) {
            progressed = true;
            let (slot, field) = tag_parts(c.tag);
            let Some(part) = self.inflight.get_mut(slot) else {
                return Err(DaemonError::Internal {
                    ring: core.run.cfg.ring.name.clone(),
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
            }) = self.inflight.remove(slot)
            else {
                continue;
            };
            self.inflight_bytes = self.inflight_bytes.saturating_sub(len);
            let upload_ns = c
                .completed
                .saturating_duration_since(first_submitted)
                .as_nanos() as u64;
            core.unpublished.upload_ns += upload_ns;
            core.tally.upload_ns += upload_ns;
            // When the batch was on the device, on the clock loaders stamp commits with.
            let on_device_ns = core.now.ns_of(c.completed);
            core.record_latency(commit_ns, on_device_ns);
            core.service
                .upload_done(&core.ring, slot, upload_ns, commit_ns, on_device_ns);
            // (D): every upload of the part has finished reading the slot; hand it out again.
            core.hand_out(slot);
            *freed += 1;
            tracing::trace!(ring = %core.run.cfg.ring.name, seq, batch, len, "part on the device");
            self.part_landed(core, delivery, recovery, seq, batch, buffer)?;
        }
        Ok(progressed)
    }

    /// The uploads stage's entry for a part intake took: places it in its batch's device buffer
    /// and submits its copies (one per field; none where the sink reads the slot in place or
    /// the consumer copies it out itself).
    /// Whole batches go to `delivery`.
    pub(super) fn start_upload(
        &mut self,
        core: &mut Core,
        delivery: &mut Delivery,
        recovery: &mut Recovery,
        p: TakenPart,
    ) -> Result<(), DaemonError> {
        let TakenPart {
            slot,
            seq,
            part,
            taken,
            samples,
        } = p;
        let count = samples.len() as u64;
        let buffer = self.place(core, &part)?;
        let len = taken.payload_len as usize;
        core.tally.bytes += taken.payload_len;
        core.unpublished.bytes_delivered += taken.payload_len;
        core.ring.stamp_upload(slot, core.now.ns);
        if core.run.zero_copy {
            // No upload: the sink reads the slot in place; the slot stays UPLOADING (owned
            // by the daemon) until the sink reports back.
            self.zero_copy_commits.insert(slot, taken.commit_ns);

            let job = SinkJob {
                seq,
                source: sink::Source::Mapped {
                    slot,
                    ptr: sink::SlotPtr(core.ring.upload_source(slot)),
                },
                buffer,
                len,
                samples,
            };
            return delivery.send_to_sink(core, self, recovery, job);
        }
        if core.run.parts == 1 {
            // The part is the whole batch: its sample ids are the batch's.
            self.start_assembly(core, &part, buffer, samples);
        } else {
            core.ids.give_back(samples);
        }
        if core.run.consumer_copies {
            // No copy here: the consumer copies the part out of its slot, which stays
            // UPLOADING (the daemon's) until the consumer gives the batch back. The part
            // table's entry is published by the fill's Release store (H1).
            core.ring
                .set_part_slot(buffer as u32, (seq % core.run.parts) as u32, slot);
            self.lent[buffer].push(slot);
            core.record_latency(taken.commit_ns, core.now.ns);
            return self.part_landed(core, delivery, recovery, seq, part.batch, buffer);
        }
        self.submit_part(core, slot, seq, &part, buffer, &taken, count)
    }

    /// The device buffer of `part`'s batch: the one its batch holds, or a free one (the intake
    /// took the part only if one is), whose books are opened.
    fn place(&mut self, core: &mut Core, part: &Part) -> Result<usize, DaemonError> {
        if let Some(buffer) = self.assemblies.buffer_of(part.batch) {
            return Ok(buffer);
        }
        let buffer = self
            .free_buffers
            .pop_front()
            .expect("checked: a buffer is free");
        self.order.opened(part.batch);
        if core.run.parts > 1 {
            // The whole batch's sample ids, for the sink, from the daemon's plan.
            let mut whole = core.ids.samples();
            core.run
                .plan
                .batch_into(part.batch, &mut whole)
                .map_err(|e| DaemonError::Internal {
                    ring: core.run.cfg.ring.name.clone(),
                    what: format!("plan has no batch {}: {e}", part.batch),
                })?;
            self.start_assembly(core, part, buffer, whole);
        }
        Ok(buffer)
    }

    /// Submits the copies of the part in `slot` (`count` samples, as `taken` says) into
    /// `buffer`, and books it in flight.
    #[allow(clippy::too_many_arguments)]
    fn submit_part(
        &mut self,
        core: &mut Core,
        slot: u32,
        seq: u64,
        part: &Part,
        buffer: usize,
        taken: &Taken,
        count: u64,
    ) -> Result<(), DaemonError> {
        let len = taken.payload_len as usize;
        // One copy per field: the part's chunk of the field (its samples' values of it,
        // contiguous in the slot; for a byte part, its range of the cut field) to where
        // those values go in the field's tensor. Submitted as one group: the backend
        // says how many completions will come (one per part on CUDA, one per copy on host).
        let base = core.ring.upload_source(slot);
        let mut jobs = std::mem::take(&mut self.jobs_buf);
        jobs.clear();
        for copy in core
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
                    decode: Decode::of(&copy, &core.run.layout),
                },
            );
        }
        self.submits += 1;
        let t = (self.submits % SUBMIT_TIMED_EVERY == 0).then(Instant::now);
        // SAFETY: the slot is UPLOADING, owned by this loop: no loader may claim it until
        // `hand_out` runs for it, which happens only after every completion the backend
        // announced for its jobs has arrived. Each job's source lies inside the slot's
        // payload (above). The mapping outlives the uploader (the ring Arc is held by self
        // and the sink's doorbell). Deferred: the backend may signal several parts with one
        // event; the main loop flushes before it sleeps, so every part's completion comes.
        let submitted = unsafe { core.uploader.submit_group_deferred(&jobs) };
        if let Some(t) = t {
            core.tally.submit_ns += t.elapsed().as_nanos() as u64 * SUBMIT_TIMED_EVERY;
        }
        self.jobs_buf = jobs;
        let jobs_left = submitted?;
        // Completions are read on this thread only, so none is looked for before this.
        self.inflight_bytes += len;
        self.inflight.insert(
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
        Ok(())
    }

    /// Opens the books of the batch of `part` in device buffer `buffer`: the whole batch's
    /// sample ids (for the sink), its payload length, epoch and index, no part landed yet.
    fn start_assembly(&mut self, core: &Core, part: &Part, buffer: usize, samples: Vec<u64>) {
        let assembly = Assembly {
            batch: part.batch,
            buffer,
            landed: 0,
            samples,
            len: core.run.layout.payload_bytes(part.batch_samples) as usize,
            epoch: part.epoch,
            index_in_epoch: part.index_in_epoch,
        };
        self.assemblies.open(assembly);
    }
    /// Part `seq` of batch `batch` is in device buffer `buffer` (or, when the consumer copies,
    /// listed in its row of the part table): after the batch's last part, the sink gets the
    /// whole batch.
    pub(super) fn part_landed(
        &mut self,
        core: &mut Core,
        delivery: &mut Delivery,
        recovery: &mut Recovery,
        seq: u64,
        batch: u64,
        buffer: usize,
    ) -> Result<(), DaemonError> {
        let Some(assembly) = self.assemblies.get_mut(buffer).filter(|a| a.batch == batch) else {
            return Err(DaemonError::Internal {
                ring: core.run.cfg.ring.name.clone(),
                what: format!(
                    "part seq {seq} landed for batch {batch}, which is not assembled in device buffer {buffer}"
                ),
            });
        };
        assembly.landed += 1;
        if assembly.landed < core.run.parts {
            return Ok(());
        }
        let Some(done) = self.assemblies.close(buffer) else {
            return Ok(());
        };
        // In its turn: a batch taken ahead waits for every earlier one.
        let Some(done) = self.order.landed(batch, done) else {
            return Ok(());
        };
        delivery.send_batch(core, self, recovery, done)?;
        while let Some(done) = self.order.pop_due() {
            delivery.send_batch(core, self, recovery, done)?;
        }
        Ok(())
    }
}

/// A part whose uploads (one per field of the batch layout) are in flight.
pub(super) struct InFlight {
    /// The part's seq.
    pub(super) seq: u64,
    /// The batch it belongs to.
    pub(super) batch: u64,
    /// The batch's device buffer.
    pub(super) buffer: usize,
    /// Payload bytes of the part (all fields).
    pub(super) len: usize,
    /// When the loader committed it.
    pub(super) commit_ns: u64,
    /// Completions still to come for the part's upload (as many as the backend announced for its
    /// group of copies, `CopyEngine::submit_group`); the slot is handed out again at 0.
    pub(super) jobs_left: usize,
    /// When the part's first job was submitted (taken from its completion).
    pub(super) submitted: Option<Instant>,
}

/// A batch whose parts are being uploaded into one device buffer, each field of each part at
/// its offset.
#[derive(Debug)]
pub(super) struct Assembly {
    /// The batch's number.
    pub(super) batch: u64,
    /// The batch's device buffer.
    pub(super) buffer: usize,
    /// Parts whose upload has completed.
    pub(super) landed: u64,
    /// The whole batch's sample ids, from the daemon's plan.
    pub(super) samples: Vec<u64>,
    /// The whole batch's payload bytes (all fields).
    pub(super) len: usize,
    /// The batch's epoch.
    pub(super) epoch: u32,
    /// The batch's index in its epoch.
    pub(super) index_in_epoch: u64,
}

/// The batches being assembled, each in the device buffer it holds: kept by buffer (a part in
/// flight names its buffer), and, for batches cut into parts, by batch number too (a part taken
/// finds the buffer its batch already holds). A batch of one part is never looked up by number,
/// so at small slots, a batch per part, this ordered map is not touched per part (ordered maps,
/// this one and the sequencer's, were 7.5% of the main loop's samples at 64 KiB slots).
#[derive(Debug)]
pub(super) struct Assemblies {
    pub(super) by_buffer: Vec<Option<Assembly>>,
    /// Batch number to buffer; only for batches of more than one part.
    pub(super) by_batch: BTreeMap<u64, usize>,
    pub(super) parts: u64,
}

impl Assemblies {
    pub(super) fn new(buffers: usize, parts: u64) -> Self {
        Self {
            by_buffer: std::iter::repeat_with(|| None).take(buffers).collect(),
            by_batch: BTreeMap::new(),
            parts,
        }
    }

    /// The buffer batch `batch` holds, if it is being assembled from several parts.
    pub(super) fn buffer_of(&self, batch: u64) -> Option<usize> {
        if self.parts == 1 {
            return None;
        }
        self.by_batch.get(&batch).copied()
    }

    /// Opens the books of a batch in its buffer.
    ///
    /// # Panics
    /// If the buffer is not one of the uploader's (the daemon only opens buffers it took from
    /// its free list).
    pub(super) fn open(&mut self, assembly: Assembly) {
        if self.parts > 1 {
            self.by_batch.insert(assembly.batch, assembly.buffer);
        }
        let buffer = assembly.buffer;
        self.by_buffer[buffer] = Some(assembly);
    }

    /// The batch being assembled in `buffer`.
    pub(super) fn get_mut(&mut self, buffer: usize) -> Option<&mut Assembly> {
        self.by_buffer.get_mut(buffer)?.as_mut()
    }

    /// Closes the books of the batch in `buffer` (all its parts landed).
    pub(super) fn close(&mut self, buffer: usize) -> Option<Assembly> {
        let done = self.by_buffer.get_mut(buffer)?.take()?;
        if self.parts > 1 {
            self.by_batch.remove(&done.batch);
        }
        Some(done)
    }

    /// Whether a batch of several parts is open: a part of it could go up without a free buffer.
    pub(super) fn any_open_for_parts(&self) -> bool {
        !self.by_batch.is_empty()
    }
}

/// A value per ring slot, for the few slots that have one: indexed by slot number, since the
/// main loop looks one up for every part it takes and every upload that completes.
#[derive(Debug)]
pub(super) struct SlotTable<T> {
    pub(super) by_slot: Vec<Option<T>>,
    pub(super) len: usize,
}

impl<T> SlotTable<T> {
    pub(super) fn new(slots: usize) -> Self {
        Self {
            by_slot: std::iter::repeat_with(|| None).take(slots).collect(),
            len: 0,
        }
    }

    pub(super) fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.by_slot.get_mut(slot as usize)?.as_mut()
    }

    pub(super) fn get(&self, slot: u32) -> Option<&T> {
        self.by_slot.get(slot as usize)?.as_ref()
    }

    /// Stores `value` for `slot`, returning the value it replaces.
    ///
    /// # Panics
    /// If `slot` is not a slot of the ring (the daemon only stores slots it took from it).
    pub(super) fn insert(&mut self, slot: u32, value: T) -> Option<T> {
        let old = self.by_slot[slot as usize].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(super) fn remove(&mut self, slot: u32) -> Option<T> {
        let old = self.by_slot.get_mut(slot as usize)?.take();
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One submit call in this many is timed for `submit_ns` (the estimate counts it this many
/// times): two clock reads per part were more than the driver's share of a 64 KiB part.
pub(super) const SUBMIT_TIMED_EVERY: u64 = 8;

/// The upload state: what is on its way out of the ring, and the batch buffers it goes to.
pub(super) struct Uploads {
    /// Parts whose uploads are in flight, by slot (an upload's tag is its slot and field,
    /// [`upload_tag`]).
    pub(super) inflight: SlotTable<InFlight>,
    /// Their payload bytes.
    pub(super) inflight_bytes: usize,
    /// Batches with parts on their way to the device.
    pub(super) assemblies: Assemblies,
    /// Commit time of each zero-copy batch at the sink, by slot.
    pub(super) zero_copy_commits: SlotTable<u64>,
    /// Consumer copies: the slots of the batch in each buffer, by buffer.
    pub(super) lent: Vec<Vec<u32>>,
    /// Device buffers free for a batch, oldest freed first: batches delivered in order free
    /// their buffers in order, so the next batches take consecutive buffers, and parts from
    /// consecutive slots go up as one copy (`Placement::Contiguous`).
    pub(super) free_buffers: std::collections::VecDeque<usize>,
    /// Submit calls made, for timing one in [`SUBMIT_TIMED_EVERY`].
    pub(super) submits: u64,
    /// The upload jobs of the part being submitted (reused: no allocation per part).
    pub(super) jobs_buf: Vec<pinring_backend::UploadJob>,
    /// The completions taken in a pass (reused: no allocation per pass).
    pub(super) completion_buf: Vec<Completion>,
    /// Landed batches held back until every earlier one went to the sink, and which batch
    /// may take a buffer (daemon/reorder.rs).
    pub(super) order: reorder::Reorder<Assembly>,
}

impl Uploads {
    /// Nothing on its way, `buffers` free batch buffers, books for `slots` slots and batches of
    /// `parts` parts from batch `first` on; `ahead`: batches may be taken ahead and are sent in
    /// order.
    pub(super) fn new(
        slots: usize,
        buffers: usize,
        parts: u64,
        first: u64,
        ahead: bool,
    ) -> Uploads {
        Uploads {
            inflight: SlotTable::new(slots),
            inflight_bytes: 0,
            assemblies: Assemblies::new(buffers, parts),
            zero_copy_commits: SlotTable::new(slots),
            lent: vec![Vec::new(); buffers],
            free_buffers: (0..buffers).collect(),
            submits: 0,
            jobs_buf: Vec::new(),
            completion_buf: Vec::new(),
            order: reorder::Reorder::new(buffers, first, ahead),
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
            decode: None,
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

    fn assembly(batch: u64, buffer: usize) -> Assembly {
        Assembly {
            batch,
            buffer,
            landed: 0,
            samples: vec![batch],
            len: 64,
            epoch: 0,
            index_in_epoch: batch,
        }
    }

    #[test]
    fn batches_of_several_parts_are_found_by_number_and_by_buffer() {
        let mut a = Assemblies::new(4, 3);
        assert!(!a.any_open_for_parts());
        a.open(assembly(7, 2));
        a.open(assembly(9, 0));
        // A part taken finds its batch's buffer; a part in flight its batch's books.
        assert_eq!(a.buffer_of(7), Some(2));
        assert_eq!(a.buffer_of(8), None);
        assert!(a.any_open_for_parts());
        a.get_mut(2).unwrap().landed += 1;
        assert_eq!(a.get_mut(2).map(|x| (x.batch, x.landed)), Some((7, 1)));
        assert!(a.get_mut(1).is_none());
        assert!(
            a.get_mut(4).is_none(),
            "a buffer past the uploader's holds nothing"
        );
        // Closing takes the batch out of both.
        assert_eq!(a.close(2).map(|x| x.batch), Some(7));
        assert_eq!(a.buffer_of(7), None);
        assert!(a.close(2).is_none());
        assert_eq!(a.close(0).map(|x| x.batch), Some(9));
        assert!(!a.any_open_for_parts());
    }

    #[test]
    fn batches_of_one_part_are_kept_by_buffer_only() {
        let mut a = Assemblies::new(2, 1);
        a.open(assembly(5, 1));
        // Nothing is ever looked up by number: every part is a batch of its own.
        assert_eq!(a.buffer_of(5), None);
        assert!(!a.any_open_for_parts());
        assert_eq!(a.get_mut(1).map(|x| x.batch), Some(5));
        assert_eq!(a.close(1).map(|x| x.samples.clone()), Some(vec![5]));
        assert!(a.get_mut(1).is_none());
    }

    #[test]
    fn a_slot_table_keeps_one_value_per_slot_and_counts_them() {
        let mut t = SlotTable::new(4);
        assert!(t.is_empty());
        assert_eq!(t.insert(3, "a"), None);
        assert_eq!(t.insert(0, "b"), None);
        assert!(!t.is_empty());
        // A second value for a slot replaces the first and counts once.
        assert_eq!(t.insert(3, "c"), Some("a"));
        assert_eq!(t.get_mut(3).map(|v| *v), Some("c"));
        assert_eq!(t.get_mut(1), None);
        // Slots outside the table hold nothing.
        assert_eq!(t.get_mut(4), None);
        assert_eq!(t.remove(9), None);
        assert_eq!(t.remove(3), Some("c"));
        assert_eq!(t.remove(3), None);
        assert!(!t.is_empty());
        assert_eq!(t.remove(0), Some("b"));
        assert!(t.is_empty());
    }
}
