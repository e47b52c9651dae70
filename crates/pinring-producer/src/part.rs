//! [`PartGuard`]: the work after a claim, written once for every loader (the Rust loader and
//! `pinring.Producer`): the part the slot's seq names, typed views of its fields in the slot,
//! one commit that writes the batch metadata with its labels ([`PartGuard::commit`], the one
//! labels rule below), an explicit [`PartGuard::fail`], and abandon on drop.
//!
//! The labels rule (docs/FORMATS.md, "A part's labels"): a part's metadata records the values
//! of the layout's `labels` field where it is of an integer dtype (any of `i8` ... `u64`) with
//! one value per sample and the part carries it, read back from the slot as written; each must
//! lie in `0..2^32` (the metadata's labels are `u32`), and a part with a label outside is
//! refused ([`PartError::Label`], naming the sample, the label and the range), never committed
//! with its labels silently dropped. Without such a field, synthetic samples record the
//! generator's labels and other kinds none.

use crate::session::Joined;
use pinring_data::{BatchIndices, BatchMeta, DatasetKind, Dtype, Part, Synthetic, LABELS};
use pinring_exit::{Coded, Exit};
use pinring_ring::failure::{write_failure, ERR_META, ERR_SAMPLE};
use pinring_ring::{Claim, CommitError, SlotWriter};
use std::borrow::Borrow;
use std::time::Instant;

/// Why a part could not be viewed or committed.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// A label outside what the metadata records (`u32`): the part is not committed.
    #[error("ring {ring:?}: label {label} of sample {sample} (epoch {epoch}, seq {seq}) is outside 0..=4294967295, the range of a batch's metadata labels (u32): write class indices in that range into the labels field")]
    Label {
        /// Ring name.
        ring: String,
        /// The part's seq.
        seq: u64,
        /// The batch's epoch.
        epoch: u32,
        /// The sample's id.
        sample: u64,
        /// The value found.
        label: i128,
    },
    /// The part was committed or failed already.
    #[error("part {seq} of ring {ring:?} is already committed")]
    Spent {
        /// Ring name.
        ring: String,
        /// The part's seq.
        seq: u64,
    },
    /// Field views of a part that is not whole samples, or that does not fit its slot.
    #[error("ring {ring:?}: part {seq} {what}")]
    NoViews {
        /// Ring name.
        ring: String,
        /// The part's seq.
        seq: u64,
        /// What is wrong, and the fix.
        what: String,
    },
    /// The ring refused the commit.
    #[error(transparent)]
    Commit(#[from] CommitError),
}

impl Coded for PartError {
    fn exit(&self) -> Exit {
        match self {
            PartError::Label { .. } => Exit::Config,
            PartError::Spent { .. } => Exit::Usage,
            PartError::NoViews { .. } => Exit::Internal,
            PartError::Commit(e) => e.exit(),
        }
    }
}

/// Why a part is committed as failed ([`PartGuard::fail`]).
#[derive(Debug, Clone, Copy)]
pub enum Failure<'m> {
    /// The payload or a field could not be made into the slot: committed with no bytes and
    /// `ERR_META`.
    Unfit,
    /// A sample could not be read: committed with `ERR_SAMPLE` and this message in the slot,
    /// which the daemon reports when it ends the run.
    Sample(&'m str),
}

/// Where a ring's part metadata labels come from (the labels rule, made once per session).
#[derive(Debug, Clone)]
pub(crate) enum LabelSource {
    /// The integer `labels` field (index into the layout's fields) of one value per sample.
    Field(usize, Dtype),
    /// No such field; the synthetic generator's labels.
    Generator(Synthetic),
    /// No such field, and no generator: none.
    None,
}

impl LabelSource {
    /// The rule for a session's config and layout.
    pub(crate) fn of(cfg: &pinring_data::Config, layout: &pinring_data::BatchLayout) -> Self {
        let field = layout
            .fields
            .iter()
            .position(|f| f.name == LABELS && f.shape.len() == 1 && is_integer(f.dtype));
        match field {
            Some(k) => LabelSource::Field(k, layout.fields[k].dtype),
            None if cfg.dataset.kind == DatasetKind::Synthetic => {
                LabelSource::Generator(cfg.synthetic())
            }
            None => LabelSource::None,
        }
    }
}

/// Buffers a loader reuses from part to part (sample ids, labels, encoded metadata), so a part
/// allocates nothing once they have grown.
#[derive(Debug, Default)]
pub struct PartBuffers {
    /// The part's sample ids.
    samples: Vec<u64>,
    labels: Vec<u32>,
    meta: Vec<u8>,
}

impl PartBuffers {
    pub(crate) fn samples_mut(&mut self) -> &mut Vec<u64> {
        &mut self.samples
    }
}

/// A seq the plan cannot make ([`crate::Session::part`]): the plan's error, and what became of
/// the part, committed failed (`ERR_PLAN`).
#[derive(Debug)]
pub struct PlanFailed {
    /// Why the plan cannot make the seq.
    pub error: pinring_data::PlanError,
    /// The failed part's commit.
    pub committed: Result<(), CommitError>,
}

/// What a commit or a fail published.
#[derive(Debug)]
pub struct Done {
    /// Payload bytes committed (0 for a failed part).
    pub payload_len: u64,
    /// The buffers, for the next part ([`crate::Session::part`]).
    pub bufs: PartBuffers,
}

/// A claimed part: the slot, the part of the plan its seq names, and its sample ids. Made by
/// [`crate::Session::part`]. Write the part through [`PartGuard::writer`] or
/// [`PartGuard::field_views`], then [`PartGuard::commit`] it, or [`PartGuard::fail`] it. A guard
/// dropped with neither gives the part back: the claim is abandoned (the loader promises never
/// to write the slot again), so the daemon hands the seq out again when the claim's lease
/// runs out, without holding the slot as a hung loader's.
///
/// `J` is how the guard holds the session's ring and config: `&Joined` in the Rust loader,
/// `Arc<Joined>` where the part outlives the call that made it (a Python `Part`).
#[derive(Debug)]
pub struct PartGuard<J: Borrow<Joined>> {
    joined: J,
    claim: Option<Claim>,
    part: Part,
    bufs: PartBuffers,
    started: Instant,
}

/// One field of a part of whole samples, in the claimed slot: `[samples, ...]` elements of
/// `dtype`, field-major (every sample's value of this field, back to back).
#[derive(Debug)]
pub struct FieldView<'a> {
    /// The field's name.
    pub name: &'a str,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape in this part: the part's sample count, then the sample's shape.
    pub shape: Vec<usize>,
    sample_bytes: usize,
    writer: SlotWriter<'a>,
}

impl FieldView<'_> {
    /// Writes sample `n`'s value of the field (its `sample_bytes` bytes) at its place.
    pub fn write_sample(&mut self, n: usize, bytes: &[u8]) -> Result<(), pinring_ring::OutOfSlot> {
        self.writer
            .write(n.saturating_mul(self.sample_bytes), bytes)
    }

    /// Bytes of the field in the part.
    pub fn len(&self) -> usize {
        self.writer.len()
    }

    /// Whether the part holds no bytes of the field (a part of no samples).
    pub fn is_empty(&self) -> bool {
        self.writer.is_empty()
    }

    /// The field's first byte in the slot, for a foreign writer that fills it in place (a
    /// DLPack array handed to Python): [`FieldView::len`] bytes, aligned for the dtype, the
    /// claimant's alone until the part is committed. Writing through it is the caller's
    /// `unsafe` business, and only while the guard holds the claim.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.writer.as_mut_ptr()
    }
}

impl<J: Borrow<Joined>> PartGuard<J> {
    pub(crate) fn new(
        joined: J,
        claim: Claim,
        part: Part,
        bufs: PartBuffers,
        started: Instant,
    ) -> Self {
        PartGuard {
            joined,
            claim: Some(claim),
            part,
            bufs,
            started,
        }
    }

    /// The part of the plan the slot's seq names (its batch, epoch, place in the batch).
    pub fn part(&self) -> &Part {
        &self.part
    }

    /// The part's seq.
    pub fn seq(&self) -> u64 {
        self.part.seq
    }

    /// The dataset sample ids of the part, in payload order.
    pub fn samples(&self) -> &[u64] {
        &self.bufs.samples
    }

    /// The ring, config and layout of the session that made the part.
    pub fn joined(&self) -> &Joined {
        self.joined.borrow()
    }

    /// Whether the guard still holds its claim (neither committed nor failed).
    pub fn live(&self) -> bool {
        self.claim.is_some()
    }

    /// Bytes of payload the part carries: whole samples' records, or a byte part's range (and,
    /// in a sample's first byte part, its other fields).
    pub fn payload_len(&self) -> u64 {
        let n = self.bufs.samples.len() as u64;
        self.joined().layout.part_payload_bytes(n, self.part.bytes)
    }

    /// Write access to the claimed slot's bytes. `None` once committed or failed.
    pub fn writer(&mut self) -> Option<SlotWriter<'_>> {
        let ring = &self.joined.borrow().ring;
        self.claim.as_mut().map(|c| ring.slot_writer(c))
    }

    /// [`PartGuard::writer`], with the part's sample ids beside it (a writer filling sample by
    /// sample).
    pub fn writer_and_samples(&mut self) -> Option<(SlotWriter<'_>, &[u64])> {
        let ring = &self.joined.borrow().ring;
        let samples = &self.bufs.samples;
        self.claim
            .as_mut()
            .map(|c| (ring.slot_writer(c), samples.as_slice()))
    }

    fn spent(&self) -> PartError {
        PartError::Spent {
            ring: self.joined().cfg.ring.name.clone(),
            seq: self.part.seq,
        }
    }

    /// One view per field of a part of whole samples, in the layout's order, each over that
    /// field's chunk of the slot. Refused for a byte part of a sample, a part whose payload does
    /// not fit its slot, a field not aligned for its dtype, and once committed or failed.
    pub fn field_views(&mut self) -> Result<Vec<FieldView<'_>>, PartError> {
        let j = self.joined.borrow();
        let (ring, seq) = (&j.cfg.ring.name, self.part.seq);
        let no = |what: String| PartError::NoViews {
            ring: ring.clone(),
            seq,
            what,
        };
        if self.part.bytes.is_some() {
            return Err(no(
                "is a byte part of a sample: only pinring-loader makes those".into(),
            ));
        }
        let n = self.bufs.samples.len() as u64;
        let payload = j.layout.payload_bytes(n);
        let Some(claim) = self.claim.as_mut() else {
            return Err(PartError::Spent {
                ring: ring.clone(),
                seq,
            });
        };
        let mut slot = j.ring.slot_writer(claim);
        if payload > slot.len() as u64 {
            return Err(no(format!(
                "of {payload} bytes does not fit its {}-byte slot",
                slot.len()
            )));
        }
        for f in &j.layout.fields {
            let (offset, _) = f.chunk_in_part(n);
            let at = (slot.as_mut_ptr() as usize).wrapping_add(offset as usize);
            if at % f.dtype.size_of() != 0 {
                return Err(no(format!(
                    "has field {:?} ({}) at byte {offset} of its slot, not a multiple of its \
                     element size: declare fields with larger elements first (8-byte, then 4, \
                     2, 1)",
                    f.name, f.dtype
                )));
            }
        }
        let ranges: Vec<(usize, usize)> = j
            .layout
            .fields
            .iter()
            .map(|f| {
                let (offset, len) = f.chunk_in_part(n);
                (offset as usize, len as usize)
            })
            .collect();
        let writers = slot
            .carve(&ranges)
            .map_err(|e| no(format!("has a field outside its slot: {e}")))?;
        Ok(j.layout
            .fields
            .iter()
            .zip(writers)
            .map(|(f, writer)| {
                let mut shape = vec![n as usize];
                shape.extend(f.shape[1..].iter().map(|&d| d as usize));
                FieldView {
                    name: &f.name,
                    dtype: f.dtype,
                    shape,
                    sample_bytes: f.sample_bytes as usize,
                    writer,
                }
            })
            .collect())
    }

    /// The part's metadata labels by the labels rule (the module's documentation), into
    /// `bufs.labels`.
    fn read_labels(&mut self) -> Result<(), PartError> {
        let j = self.joined.borrow();
        let labels = &mut self.bufs.labels;
        labels.clear();
        let samples = &self.bufs.samples;
        let Some(claim) = self.claim.as_mut() else {
            return Err(PartError::Spent {
                ring: j.cfg.ring.name.clone(),
                seq: self.part.seq,
            });
        };
        if let LabelSource::Field(k, dtype) = j.labels {
            let width = dtype.size_of();
            let n = samples.len() as u64;
            // Where the part carries the field: whole samples' chunk, or in a byte part of a
            // sample, its copy of the field (the sample's first byte part only).
            let (at, count) = match self.part.bytes {
                None => (j.layout.fields[k].chunk_in_part(n).0, samples.len()),
                Some(r) => j
                    .layout
                    .part_copies(1, 0, Some(r))
                    .find(|c| c.field == k && c.len as usize >= width)
                    .map_or((0, 0), |c| (c.src_offset, samples.len().min(1))),
            };
            if count > 0 {
                let slot = j.ring.slot_writer(claim);
                for (i, &sample) in samples.iter().take(count).enumerate() {
                    let mut b = [0u8; 8];
                    if slot.read(at as usize + i * width, &mut b[..width]).is_err() {
                        // Outside the slot: the payload did not fit, which the commit
                        // publishes as unfit.
                        labels.clear();
                        return Ok(());
                    }
                    let v = label_value(dtype, &b);
                    let Ok(label) = u32::try_from(v) else {
                        return Err(PartError::Label {
                            ring: j.cfg.ring.name.clone(),
                            seq: self.part.seq,
                            epoch: self.part.epoch,
                            sample,
                            label: v,
                        });
                    };
                    labels.push(label);
                }
                return Ok(());
            }
        }
        if let LabelSource::Generator(g) = &j.labels {
            labels.extend(samples.iter().map(|&i| g.label(i)));
        }
        Ok(())
    }

    /// Writes the part's metadata (its seq, batch, sample ids and labels by the labels rule)
    /// after its payload and publishes the slot READY, keeping the seat's books. A label
    /// outside `0..2^32` refuses the part ([`PartError::Label`]): nothing is published and the
    /// guard still holds the claim (fix the label and commit again, or [`PartGuard::fail`]
    /// it). A payload that does not fit its slot, or metadata that does not fit its reserve,
    /// is published as a failed part (`ERR_META`). A commit refused because the daemon took the
    /// slot back abandons the slot and returns `Commit(Reclaimed)`.
    pub fn commit(&mut self) -> Result<Done, PartError> {
        if self.claim.is_none() {
            return Err(self.spent());
        }
        self.read_labels()?;
        let j = self.joined.borrow();
        let Some(mut claim) = self.claim.take() else {
            return Err(self.spent());
        };
        let payload_len = self.payload_len();
        let mut slot = j.ring.slot_writer(&mut claim);
        let fits = payload_len <= slot.len() as u64
            && (self.part.bytes.is_none() || self.bufs.samples.len() == 1);
        let (shape, dtype) = j.cfg.first_field();
        let indices = BatchIndices {
            seq: self.part.seq,
            epoch: self.part.epoch,
            index_in_epoch: self.part.index_in_epoch,
            samples: std::mem::take(&mut self.bufs.samples),
        };
        let mut meta = BatchMeta::new(
            &indices,
            std::mem::take(&mut self.bufs.labels),
            shape,
            dtype,
            j.layout.record_bytes,
        );
        if let Some(r) = self.part.bytes {
            meta = meta.with_byte_range(r, payload_len);
        }
        self.bufs.samples = indices.samples;
        let (payload_len, meta_len, error) = j.write_meta(
            &mut slot,
            &meta,
            payload_len as usize,
            fits,
            &mut self.bufs.meta,
        );
        self.bufs.labels = meta.labels; // its capacity, for the next part
        let count = self.bufs.samples.len() as u32;
        self.publish(claim, payload_len, meta_len, count, error)
    }

    /// Publishes the part as failed: for [`Failure::Sample`] its message in the slot with
    /// `ERR_SAMPLE` (the daemon ends the run with it), for [`Failure::Unfit`] no bytes and
    /// `ERR_META`.
    pub fn fail(&mut self, reason: Failure<'_>) -> Result<Done, PartError> {
        let j = self.joined.borrow();
        let Some(mut claim) = self.claim.take() else {
            return Err(self.spent());
        };
        let (meta_len, error) = match reason {
            Failure::Unfit => (0, ERR_META),
            Failure::Sample(message) => {
                let mut slot = j.ring.slot_writer(&mut claim);
                (write_failure(&mut slot, message), ERR_SAMPLE)
            }
        };
        let count = self.bufs.samples.len() as u32;
        self.publish(claim, 0, meta_len, count, error)
    }

    fn publish(
        &mut self,
        claim: Claim,
        payload_len: u64,
        meta_len: u64,
        count: u32,
        error: u32,
    ) -> Result<Done, PartError> {
        self.joined
            .borrow()
            .commit(claim, payload_len, meta_len, count, error, self.started)?;
        Ok(Done {
            payload_len,
            bufs: std::mem::take(&mut self.bufs),
        })
    }
}

impl<J: Borrow<Joined>> Drop for PartGuard<J> {
    /// A part neither committed nor failed is given back: its claim is abandoned.
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            self.joined
                .borrow()
                .ring
                .abandon(claim.seat(), claim.slot(), claim.ticket());
        }
    }
}

/// Whether `dtype` is an integer type (a one-value field of it gives the metadata's labels).
pub(crate) fn is_integer(dtype: Dtype) -> bool {
    !matches!(
        dtype,
        Dtype::Bool | Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64
    )
}

/// The value of one element of integer `dtype` in its first `size_of` little-endian bytes of
/// `b`; 0 for a non-integer dtype.
fn label_value(dtype: Dtype, b: &[u8; 8]) -> i128 {
    match dtype {
        Dtype::U8 | Dtype::U16 | Dtype::U32 | Dtype::U64 => i128::from(u64::from_le_bytes(*b)),
        Dtype::I8 => i128::from(b[0] as i8),
        Dtype::I16 => i128::from(i16::from_le_bytes([b[0], b[1]])),
        Dtype::I32 => i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::I64 => i128::from(i64::from_le_bytes(*b)),
        Dtype::Bool | Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64 => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(dtype: Dtype, bytes: &[u8]) -> i128 {
        let mut b = [0u8; 8];
        b[..bytes.len()].copy_from_slice(bytes);
        label_value(dtype, &b)
    }

    #[test]
    fn every_integer_dtype_reads_as_its_value() {
        assert_eq!(value(Dtype::I64, &7i64.to_le_bytes()), 7);
        assert_eq!(value(Dtype::I64, &(-1i64).to_le_bytes()), -1);
        assert_eq!(value(Dtype::U64, &(1u64 << 32).to_le_bytes()), 1 << 32);
        assert_eq!(value(Dtype::I8, &[0xff]), -1);
        assert_eq!(value(Dtype::U8, &[0xff]), 255);
        assert_eq!(value(Dtype::U16, &[1, 2]), 0x201);
        assert_eq!(value(Dtype::I16, &(-2i16).to_le_bytes()), -2);
        assert_eq!(value(Dtype::I32, &5i32.to_le_bytes()), 5);
        assert_eq!(
            value(Dtype::U32, &u32::MAX.to_le_bytes()),
            i128::from(u32::MAX)
        );
        assert!(is_integer(Dtype::U8) && !is_integer(Dtype::Bool) && !is_integer(Dtype::F32));
    }
}

#[cfg(test)]
mod ring_tests {
    use super::*;
    use crate::{Next, Session};
    use pinring_data::Config;
    use pinring_ring::{ring_state, CreateOptions, DaemonRing};
    use std::sync::Arc;
    use std::time::Duration;

    /// A daemon's ring of an external dataset whose `labels` field is of `dtype`, with slot 0
    /// handed out for seq 0, and a session joined to it. `test` makes the name this test's own:
    /// the tests of one process run side by side (`cargo test`'s threads).
    fn ring_and_session(test: &str, dtype: &str) -> (DaemonRing, Session) {
        let name = format!("part-{test}-{}-{dtype}", std::process::id());
        let text = format!(
            "[ring]\nname = \"{name}\"\nslots = 2\nslot_bytes = 65536\n\
             [dataset]\nkind = \"external\"\nsamples = 8\nfields = [\
             {{ name = \"x\", dtype = \"f32\", shape = [4] }}, \
             {{ name = \"labels\", dtype = \"{dtype}\", shape = [] }}]\n\
             [plan]\nbatch_size = 4\nshuffle = false\nepochs = 1\n"
        );
        let cfg = Config::from_toml_str(&text, "test").unwrap();
        let daemon = DaemonRing::create(&CreateOptions {
            name,
            slots: cfg.slots(),
            slot_bytes: cfg.slot_bytes(),
            mode: 0o600,
            group: None,
            fingerprint: cfg.fingerprint(),
            settings: cfg.settings_record(),
            start_seq: 0,
            end_seq: cfg.plan().unwrap().total_seqs(),
            in_order: false,
            replace: true,
            handoff: None,
            anonymous: false,
        })
        .unwrap();
        daemon.assign(0, 0);
        daemon.set_state(ring_state::READY);
        let session = Session::join(cfg, Duration::from_secs(5), || false)
            .unwrap()
            .expect("joined");
        (daemon, session)
    }

    /// Claims seq 0 and writes `label(n)`'s little-endian bytes (`width` of them) as sample
    /// `n`'s label.
    fn part_with_labels(
        session: &mut Session,
        width: usize,
        label: impl Fn(usize) -> i128,
    ) -> PartGuard<Arc<Joined>> {
        let deadline = Some(Instant::now() + Duration::from_secs(5));
        let Next::Part(claim) = session.claim(deadline, &mut || false).unwrap() else {
            panic!("no part")
        };
        let joined = Arc::clone(session.joined());
        let mut part = session.part(joined, claim, PartBuffers::default()).unwrap();
        write_labels(&mut part, width, label);
        part
    }

    fn write_labels(
        part: &mut PartGuard<Arc<Joined>>,
        width: usize,
        label: impl Fn(usize) -> i128,
    ) {
        let mut views = part.field_views().unwrap();
        let labels = views.iter_mut().find(|v| v.name == LABELS).unwrap();
        assert_eq!(labels.shape, vec![4]);
        for n in 0..4 {
            let bytes = label(n).to_le_bytes();
            labels.write_sample(n, &bytes[..width]).unwrap();
        }
    }

    /// The labels the daemon finds in the metadata of READY slot 0.
    fn committed_labels(daemon: &DaemonRing) -> Vec<u32> {
        let taken = daemon.take_ready(0, 0).unwrap().expect("slot 0 is READY");
        let mut buf = Vec::new();
        daemon.copy_out(0, taken.meta_offset, taken.meta_len, &mut buf);
        pinring_data::BatchMeta::decode(&buf, buf.len())
            .unwrap()
            .labels
    }

    #[test]
    fn labels_of_every_integer_dtype_are_recorded() {
        for (dtype, width) in [("u8", 1), ("i16", 2), ("u32", 4), ("u64", 8)] {
            let (daemon, mut session) = ring_and_session("every-dtype", dtype);
            let mut part = part_with_labels(&mut session, width, |n| 200 + n as i128);
            let done = part.commit().unwrap();
            assert_eq!(done.payload_len, 4 * (16 + width as u64), "{dtype}");
            assert_eq!(
                committed_labels(&daemon),
                vec![200, 201, 202, 203],
                "{dtype}"
            );
            drop(session);
            daemon.unlink().unwrap();
        }
    }

    #[test]
    fn a_label_out_of_range_is_refused_naming_sample_label_and_range() {
        for (dtype, width, bad) in [("i16", 2, -1i128), ("u64", 8, 1 << 40), ("i64", 8, -7)] {
            let (daemon, mut session) = ring_and_session("out-of-range", dtype);
            let mut part = part_with_labels(&mut session, width, |n| if n == 2 { bad } else { 1 });
            let sample = part.samples()[2];
            let e = part.commit().unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, PartError::Label { .. }), "{dtype}: {e:?}");
            assert!(
                text.contains(&format!("label {bad} of sample {sample}"))
                    && text.contains("outside 0..=4294967295")
                    && text.contains("labels field"),
                "{dtype}: {text}"
            );
            assert_eq!(e.exit(), Exit::Config);
            // Nothing was published, and the part is still the claimant's: fixed, it commits.
            assert!(part.live(), "{dtype}");
            assert!(daemon.take_ready(0, 0).unwrap().is_none(), "{dtype}");
            write_labels(&mut part, width, |_| 3);
            part.commit().unwrap();
            assert_eq!(committed_labels(&daemon), vec![3; 4], "{dtype}");
            drop(session);
            daemon.unlink().unwrap();
        }
    }

    #[test]
    fn a_part_dropped_uncommitted_is_abandoned() {
        let (daemon, mut session) = ring_and_session("dropped", "i64");
        let part = part_with_labels(&mut session, 8, |_| 0);
        let seat = session.seat();
        drop(part);
        assert!(
            daemon.take_ready(0, 0).unwrap().is_none(),
            "nothing published"
        );
        let abandoned = pinring_ring::Ring::open(
            daemon.name(),
            pinring_ring::Access::ReadOnly,
            std::time::Duration::ZERO,
        )
        .unwrap()
        .loader(seat.index as usize)
        .abandoned
        .load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(
            abandoned,
            pinring_ring::layout::abandon_word(0, abandoned as u32),
            "the claim of slot 0 is given back"
        );
        drop(session);
        daemon.unlink().unwrap();
    }
}
