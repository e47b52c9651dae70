//! Consumers of uploaded batches, run on their own thread so that consuming batch k overlaps the
//! upload of batch k+1. A sink gets the device buffer only after its upload completed, and hands
//! it back when done; the daemon reuses a buffer only after that. In zero-copy mode the sink gets
//! the slot itself (registered with DEVICEMAP): its kernel reads the batch across the bus through
//! the slot's mapped device address, and the daemon frees the slot only after the sink is done.
//!
//! * `discard`: drops the batch (benchmarks).
//! * `verify`: checks every byte of the *uploaded copy* against what the synthetic generator says
//!   the batch holds (sample ids from the daemon's own plan, never the loader's claim). The order
//!   of delivery (duplicates, gaps, out-of-order seqs) is checked by the daemon's sequencer, for
//!   every sink.
//! * `compute`: runs a small kernel over the batch (sin over f32s), to show upload and compute
//!   overlapping.

use crate::ring_wake::Doorbell;
use crossbeam_channel::{Receiver, Sender};
use pinring_backend::Uploader;
use pinring_data::Synthetic;
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
}

impl SinkKind {
    /// Name for messages.
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Discard => "discard",
            SinkKind::Verify => "verify",
            SinkKind::Compute => "compute",
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
    /// Payload bytes.
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

/// Runs the sink loop until the job channel closes.
pub fn run(
    kind: SinkKind,
    uploader: Arc<dyn Uploader>,
    synthetic: Synthetic,
    jobs: Receiver<SinkJob>,
    done: Sender<SinkDone>,
    doorbell: Doorbell,
) {
    let mut scratch = Vec::new();
    for job in jobs {
        let t = Instant::now();
        let (verified, failure) = match kind {
            SinkKind::Discard => (false, None),
            SinkKind::Compute => match compute(&*uploader, &job) {
                Ok(()) => (false, None),
                Err(e) => (
                    false,
                    Some(format!("compute kernel failed on seq {}: {e}", job.seq)),
                ),
            },
            SinkKind::Verify => match verify(&*uploader, &synthetic, &job, &mut scratch) {
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

fn compute(uploader: &dyn Uploader, job: &SinkJob) -> Result<(), pinring_backend::BackendError> {
    match job.source {
        Source::Buffer(b) => uploader.compute(b, job.len),
        // SAFETY: the slot is registered with DEVICEMAP (zero-copy mode registers it so), it is
        // UPLOADING and owned by this sink until SinkDone is sent, and `len` is the validated
        // payload length inside the slot.
        Source::Mapped { ptr, .. } => unsafe { uploader.compute_mapped(ptr.0, job.len) },
    }
}

fn verify(
    uploader: &dyn Uploader,
    synthetic: &Synthetic,
    job: &SinkJob,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    let expected_len = job.samples.len() * synthetic.sample_bytes();
    if job.len != expected_len {
        return Err(format!(
            "seq {}: uploaded {} bytes, the plan says {} samples of {} bytes = {expected_len}",
            job.seq,
            job.len,
            job.samples.len(),
            synthetic.sample_bytes()
        ));
    }
    let checksum = |scratch: &mut Vec<u8>| -> Result<(), String> {
        // Device memory elsewhere (or zero-copy): a position-sensitive checksum computed where
        // the batch is, against the same checksum of the generator's bytes.
        scratch.resize(expected_len, 0);
        synthetic.fill_batch(&job.samples, scratch);
        let want = pinring_backend::checksum::checksum(scratch);
        let got = match job.source {
            Source::Buffer(b) => uploader.checksum(b, 0, job.len),
            // SAFETY: as in `compute`: a DEVICEMAP-registered slot owned by this sink, `len`
            // validated to lie inside it.
            Source::Mapped { ptr, .. } => unsafe { uploader.checksum_mapped(ptr.0, job.len) },
        }
        .map_err(|e| format!("seq {}: device checksum failed: {e}", job.seq))?;
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "seq {}: device copy checksum {got:#018x} differs from the generator's {want:#018x}",
                job.seq
            ))
        }
    };
    let Source::Buffer(buffer) = job.source else {
        return checksum(scratch);
    };
    // Device memory the host can read: compare every byte directly.
    let mut direct = None;
    let readable = uploader
        .read_host(buffer, 0, job.len, &mut |bytes| {
            direct = Some(synthetic.verify_batch(&job.samples, bytes));
        })
        .map_err(|e| format!("seq {}: cannot read the device copy: {e}", job.seq))?;
    if readable {
        return match direct {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(format!("seq {}: {e}", job.seq)),
            None => Err(format!("seq {}: the device copy was not read", job.seq)),
        };
    }
    checksum(scratch)
}
