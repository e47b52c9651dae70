//! Consumers of uploaded batches, run on their own thread so that consuming batch k overlaps the
//! upload of batch k+1. A sink gets the device buffer only after its upload completed, and hands
//! it back when done; the daemon reuses a buffer only after that. In zero-copy mode the sink gets
//! the slot itself (registered with DEVICEMAP): its kernel reads the batch across the bus through
//! the slot's mapped device address, and the daemon frees the slot only after the sink is done.
//!
//! * `discard`: drops the batch (benchmarks).
//! * `verify`: checks every field of the *uploaded copy* (each field's tensor at its offset in the
//!   device buffer, [`pinring_data::BatchLayout`]) against what the synthetic generator says the
//!   batch holds (sample ids from the daemon's own plan, never the loader's claim): every byte on
//!   the host backend, a checksum per field on cuda. In zero-copy mode the batch is read in its
//!   slot, and only its images chunk (the start of the payload) is checked. The order of delivery
//!   (duplicates, gaps, out-of-order seqs) is checked by the daemon's sequencer, for every sink.
//! * `compute`: runs a small kernel over the batch's images (sin over f32s), to show upload and
//!   compute overlapping.

use crate::ring_wake::Doorbell;
use crossbeam_channel::{Receiver, Sender};
use pinring_backend::Uploader;
use pinring_data::{BatchLayout, FieldPlacement, Synthetic};
use std::sync::Arc;
use std::time::Instant;

/// Which sink consumes batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// Drop every batch.
    Discard,
    /// Check every byte and the delivery order.
    Verify,
    /// Run a kernel over each batch.
    Compute,
    /// Hand each batch to a training process (`pinring.Loader`, pinring-client).
    Consumer,
}

impl SinkKind {
    /// Name for messages.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Discard => "discard",
            SinkKind::Verify => "verify",
            SinkKind::Compute => "compute",
            SinkKind::Consumer => "consumer",
        }
    }
}

/// Where a batch is for the sink.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// In a device buffer (uploaded).
    Buffer(usize),
    /// Still in its slot, read in place (zero-copy).
    Mapped {
        /// Slot index (freed after the sink is done).
        slot: u32,
        /// Start of the slot's payload.
        ptr: SlotPtr,
    },
}

/// The address of a slot's payload, moved to the sink thread.
#[derive(Debug, Clone, Copy)]
pub struct SlotPtr(pub *mut u8);

// SAFETY: the pointer is into the ring's shared mapping, which outlives the sink thread (the
// daemon joins the sink before dropping the ring); the slot is UPLOADING, owned by the daemon, and
// only the sink touches it until it reports back, so moving the address to the sink thread hands
// over that exclusive use.
unsafe impl Send for SlotPtr {}

/// One uploaded batch for the sink.
#[derive(Debug)]
pub struct SinkJob {
    /// Seq of the batch.
    pub seq: u64,
    /// Where the batch is.
    pub source: Source,
    /// Token to hand back (the device buffer, or the in-flight token of a zero-copy batch).
    pub buffer: usize,
    /// Payload bytes (all fields).
    pub len: usize,
    /// Sample ids the plan assigns to this seq.
    pub samples: Vec<u64>,
}

/// What the sink made of a batch.
#[derive(Debug)]
pub struct SinkDone {
    /// Seq of the batch.
    pub seq: u64,
    /// Where it was (a zero-copy slot is freed now).
    pub source: Source,
    /// CLOCK_MONOTONIC ns when the sink finished.
    pub done_ns: u64,
    /// Buffer to reuse.
    pub buffer: usize,
    /// Whether every byte was checked and right.
    pub verified: bool,
    /// A verification failure, if any.
    pub failure: Option<String>,
    /// Nanoseconds spent.
    pub busy_ns: u64,
    /// The sample-id vector, handed back for reuse.
    pub samples: Vec<u64>,
}

/// Runs the sink loop until the job channel closes; `layout` says where each field of a batch
/// lies in its device buffer.
pub fn run(
    kind: SinkKind,
    uploader: Arc<dyn Uploader>,
    synthetic: Synthetic,
    layout: BatchLayout,
    jobs: Receiver<SinkJob>,
    done: Sender<SinkDone>,
    doorbell: Doorbell,
) {
    let mut scratch = Vec::new();
    for job in jobs {
        let t = Instant::now();
        let (verified, failure) = match kind {
            // The consumer sink never reaches the sink thread (daemon/handoff.rs).
            SinkKind::Discard | SinkKind::Consumer => (false, None),
            SinkKind::Compute => match compute(&*uploader, &layout, &job) {
                Ok(()) => (false, None),
                Err(e) => (
                    false,
                    Some(format!("compute kernel failed on seq {}: {e}", job.seq)),
                ),
            },
            SinkKind::Verify => match verify(&*uploader, &synthetic, &layout, &job, &mut scratch) {
                Ok(()) => (true, None),
                Err(msg) => (false, Some(msg)),
            },
        };
        let busy_ns = t.elapsed().as_nanos() as u64;
        let out = SinkDone {
            seq: job.seq,
            source: job.source,
            done_ns: pinring_ring::clock::monotonic_ns(),
            buffer: job.buffer,
            verified,
            failure,
            busy_ns,
            samples: job.samples,
        };
        if done.send(out).is_err() {
            break;
        }
        doorbell.ring();
    }
}

/// The first field of the batch (the images), in the device buffer and in the slot: it starts
/// at offset 0 of both.
fn first_field(layout: &BatchLayout, samples: usize) -> Option<FieldPlacement> {
    layout.placements(samples as u64).into_iter().next()
}

fn compute(
    uploader: &dyn Uploader,
    layout: &BatchLayout,
    job: &SinkJob,
) -> Result<(), pinring_backend::BackendError> {
    // Over the images: the first field, at offset 0 of the buffer and of the slot's payload.
    let len = first_field(layout, job.samples.len()).map_or(0, |f| f.bytes as usize);
    match job.source {
        Source::Buffer(b) => uploader.compute(b, len),
        // SAFETY: the slot is registered with DEVICEMAP (zero-copy mode registers it so), it is
        // UPLOADING and owned by this sink until SinkDone is sent, and `len` (the images chunk at
        // the payload's start) is within the validated payload length inside the slot.
        Source::Mapped { ptr, .. } => unsafe { uploader.compute_mapped(ptr.0, len) },
    }
}

fn verify(
    uploader: &dyn Uploader,
    synthetic: &Synthetic,
    layout: &BatchLayout,
    job: &SinkJob,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    let count = job.samples.len() as u64;
    let expected_len = layout.payload_bytes(count) as usize;
    if job.len != expected_len {
        return Err(format!(
            "seq {}: uploaded {} bytes, the plan says {count} samples of {} bytes (all fields) = \
             {expected_len}",
            job.seq, job.len, layout.record_bytes
        ));
    }
    match job.source {
        Source::Buffer(buffer) => {
            for field in layout.placements(count) {
                verify_field(uploader, synthetic, buffer, &field, job, scratch)?;
            }
            Ok(())
        }
        Source::Mapped { ptr, .. } => {
            // Zero-copy: the batch is read in its slot, field-major, through the mapped address.
            // Its images chunk starts the payload (page aligned, as the checksum kernel needs);
            // the labels chunk after it is not checked in this mode.
            let Some(images) = first_field(layout, job.samples.len()) else {
                return Ok(());
            };
            let len = images.bytes as usize;
            scratch.resize(len, 0);
            synthetic
                .fill_field(&images.name, &job.samples, scratch)
                .map_err(|e| format!("seq {}: {e}", job.seq))?;
            let want = pinring_backend::checksum::checksum(scratch);
            // SAFETY: as in `compute`: a DEVICEMAP-registered slot owned by this sink, and the
            // images chunk lies at the start of the payload, whose validated length covers it.
            let got = unsafe { uploader.checksum_mapped(ptr.0, len) }
                .map_err(|e| format!("seq {}: device checksum failed: {e}", job.seq))?;
            compare(job.seq, &images.name, got, want)
        }
    }
}

/// Checks one field's tensor in the device buffer: every byte where the host can read it, else
/// a checksum computed on the device against the same checksum of the generator's bytes.
fn verify_field(
    uploader: &dyn Uploader,
    synthetic: &Synthetic,
    buffer: usize,
    field: &FieldPlacement,
    job: &SinkJob,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    let (seq, name) = (job.seq, &field.name);
    let (offset, len) = (field.offset as usize, field.bytes as usize);
    let mut direct = None;
    let readable = uploader
        .read_host(buffer, offset, len, &mut |bytes| {
            direct = Some(synthetic.verify_field(name, &job.samples, bytes));
        })
        .map_err(|e| format!("seq {seq}: cannot read the {name} field of the device copy: {e}"))?;
    if readable {
        return match direct {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(format!("seq {seq}: {name} field: {e}")),
            None => Err(format!(
                "seq {seq}: the {name} field of the device copy was not read"
            )),
        };
    }
    scratch.resize(len, 0);
    synthetic
        .fill_field(name, &job.samples, scratch)
        .map_err(|e| format!("seq {seq}: {e}"))?;
    let want = pinring_backend::checksum::checksum(scratch);
    let got = uploader
        .checksum(buffer, offset, len)
        .map_err(|e| format!("seq {seq}: device checksum of the {name} field failed: {e}"))?;
    compare(seq, name, got, want)
}

fn compare(seq: u64, field: &str, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "seq {seq}: device copy checksum of the {field} field {got:#018x} differs from the \
             generator's {want:#018x}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinring_backend::{CopyEngine, HostUploader, UploadJob};
    use pinring_data::{Config, Dtype};
    use std::time::Duration;

    /// 5 samples of 13 u8 per batch: images 65 bytes at 0, labels 40 bytes at 256.
    fn config() -> Config {
        let mut c = Config::default();
        c.dataset.sample_shape = vec![13];
        c.dataset.dtype = Dtype::U8;
        c.plan.batch_size = 5;
        c.validate().unwrap();
        c
    }

    /// Uploads `samples` into buffer 0 as the daemon does, in parts of `spp` samples: each
    /// part's field-major payload (made by `make`), one copy per field to its place.
    fn upload(
        up: &HostUploader,
        layout: &BatchLayout,
        samples: &[u64],
        spp: usize,
        make: &dyn Fn(&[u64], &mut [u8]),
    ) {
        for (j, part) in samples.chunks(spp).enumerate() {
            let mut payload = vec![0u8; layout.payload_bytes(part.len() as u64) as usize];
            make(part, &mut payload);
            let copies: Vec<_> = layout
                .part_copies(part.len() as u64, (j * spp) as u64, None)
                .collect();
            for c in &copies {
                let job = UploadJob {
                    tag: c.field as u64,
                    src: payload[c.src_offset as usize..].as_ptr(),
                    len: c.len as usize,
                    buffer: 0,
                    dst_offset: c.dst_offset as usize,
                    decode: None,
                };
                // SAFETY: `payload` lives until the completions below have arrived and is not
                // written meanwhile; src_offset + len lies inside it (part_copies).
                unsafe { up.submit(job) }.unwrap();
            }
            for _ in &copies {
                let c = up
                    .completions()
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap();
                c.result.unwrap();
            }
        }
    }

    fn job(layout: &BatchLayout, samples: &[u64]) -> SinkJob {
        SinkJob {
            seq: 3,
            source: Source::Buffer(0),
            buffer: 0,
            len: layout.payload_bytes(samples.len() as u64) as usize,
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn verify_checks_every_field_of_the_device_copy() {
        let c = config();
        let (layout, synthetic) = (c.batch_layout(), c.synthetic());
        assert_eq!(
            layout.fields[1].offset, 80,
            "65 bytes of images, padded to 16"
        );
        let up = HostUploader::new(1, layout.total_bytes as usize).unwrap();
        let good = |s: &[u64], out: &mut [u8]| synthetic.fill_part(s, out);
        let mut scratch = Vec::new();
        // A full batch in parts of 2, 2 and 1.
        let samples = [40, 7, 1999, 3, 12];
        upload(&up, &layout, &samples, 2, &good);
        verify(
            &up,
            &synthetic,
            &layout,
            &job(&layout, &samples),
            &mut scratch,
        )
        .unwrap();
        // A tail batch of 3 in the same buffer: the same offsets, shorter tensors.
        upload(&up, &layout, &samples[..3], 2, &good);
        verify(
            &up,
            &synthetic,
            &layout,
            &job(&layout, &samples[..3]),
            &mut scratch,
        )
        .unwrap();
        // The wrong length for the plan's samples.
        let mut short = job(&layout, &samples);
        short.len -= 8;
        let e = verify(&up, &synthetic, &layout, &short, &mut scratch).unwrap_err();
        assert!(e.contains("all fields"), "{e}");
        // One wrong label: caught, and named.
        let bad_label = |s: &[u64], out: &mut [u8]| {
            synthetic.fill_part(s, out);
            let last = out.len() - 1;
            out[last] ^= 0x40;
        };
        upload(&up, &layout, &samples, 2, &bad_label);
        let e = verify(
            &up,
            &synthetic,
            &layout,
            &job(&layout, &samples),
            &mut scratch,
        )
        .unwrap_err();
        assert!(e.contains("seq 3") && e.contains("labels field"), "{e}");
        // A payload whose bytes sit 8 bytes out of place: caught in the images.
        let swapped = |s: &[u64], out: &mut [u8]| {
            synthetic.fill_part(s, out);
            out.rotate_left(8);
        };
        upload(&up, &layout, &samples, 5, &swapped);
        let e = verify(
            &up,
            &synthetic,
            &layout,
            &job(&layout, &samples),
            &mut scratch,
        )
        .unwrap_err();
        assert!(e.contains("images field"), "{e}");
    }
}
