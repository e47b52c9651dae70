//! The machine-readable result of a daemon run (`pinring-daemon --summary PATH`), one JSON object,
//! written at exit whether the run finished, drained, failed, or never started.

use pinring_runtime::output::write_file;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a daemon run did. Field names are a stable interface for scripts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Ring name.
    pub ring: String,
    /// Backend used ("host" or "cuda"; empty when the daemon failed at start).
    pub backend: String,
    /// Why that backend was picked.
    pub backend_reason: String,
    /// Sink used.
    pub sink: String,
    /// Whether delivery was in seq order.
    pub in_order: bool,
    /// First seq of the run.
    pub start_seq: u64,
    /// One past the last seq of the plan.
    pub end_seq: u64,
    /// Batches handed to the sink (each once all its parts were on the device).
    pub batches_delivered: u64,
    /// Parts (slots) per batch; 1 when a whole batch fits one slot.
    #[serde(default)]
    pub parts_per_batch: u64,
    /// Parts delivered with their batches (`batches_delivered * parts_per_batch`); seqs count
    /// parts, so `start_seq`, `end_seq`, `missing`, `duplicates` and `resume_seq` do too.
    #[serde(default)]
    pub parts_delivered: u64,
    /// Batches whose every byte was checked and right.
    pub batches_verified: u64,
    /// Batches whose bytes or metadata were wrong.
    pub verify_failures: u64,
    /// Batches delivered more than once.
    pub duplicates: u64,
    /// Batches delivered out of seq order (in-order mode).
    pub out_of_order: u64,
    /// Batches of the plan never delivered (a drained or failed run).
    pub missing: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Wall time from ring ready to the last delivery.
    pub seconds: f64,
    /// Wall time from ring ready to the first batch delivered (all its parts on the device and
    /// handed to the sink): the latency a job sees before its first step. It includes the
    /// loaders' attach after the ring is ready. `None` when no batch was delivered.
    #[serde(default)]
    pub first_batch_seconds: Option<f64>,
    /// Payload GB/s (1e9 bytes per second).
    pub gbps: f64,
    /// Highest seq delivered, if any (in order mode: every seq up to it was delivered).
    pub last_delivered_seq: Option<u64>,
    /// Seq to pass as --start-seq to resume this run: the lowest seq of the plan not delivered
    /// (every seq below it was), from the daemon's own books.
    pub resume_seq: u64,
    /// Distinct seqs at or above `resume_seq` that were delivered (unordered mode; always 0 in
    /// order): a run resumed at `resume_seq` delivers them again.
    #[serde(default)]
    pub delivered_past_resume: u64,
    /// Slots taken back from dead or hung loaders.
    pub reclaimed: u64,
    /// Batches the daemon refused (invalid descriptor or metadata).
    pub rejected: u64,
    /// Slots taken back from live loaders that held them past `daemon.lease_ms` (hung).
    #[serde(default)]
    pub leases_expired: u64,
    /// Bad batches skipped under `on_bad_batch = "skip"` (each made again).
    #[serde(default)]
    pub bad_batches_skipped: u64,
    /// Unreadable samples the loaders replaced with zeros (`dataset.on_bad_sample = "skip"`).
    #[serde(default)]
    pub bad_samples_skipped: u64,
    /// Images this daemon's engine decoded, per way (`[dataset.image] decode = "gpu"` where the
    /// daemon copies: "gpu", "cpu", "cpu_not_jpeg", "cpu_unsupported", "cpu_components",
    /// "cpu_batch_failed", "failed").
    /// Empty where the daemon decodes nothing (a trainer's copier counts its own).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub images_decoded: std::collections::BTreeMap<String, u64>,
    /// Seqs moved to another slot because theirs was quarantined.
    #[serde(default)]
    pub reissued: u64,
    /// Slot descriptors found in a state the daemon never left them in.
    #[serde(default)]
    pub corrupt_descriptors: u64,
    /// Seconds spent registering the ring with the GPU.
    pub registration_seconds: f64,
    /// Seconds the daemon waited for a ready slot while it could have uploaded.
    pub daemon_wait_seconds: f64,
    /// Seconds the daemon's main loop spent inside the backend's upload calls (submitting a
    /// part, signalling the parts submitted before a sleep): a driver that blocks the
    /// caller while its queue is full shows here. Parts' submit calls are timed one in 8 and
    /// counted 8 times, so a short run's figure is an estimate.
    #[serde(default)]
    pub submit_seconds: f64,
    /// In order: parts uploaded while an earlier part was not READY yet, their batches held
    /// back for their turn (`pinring-daemon --look-ahead`).
    #[serde(default)]
    pub parts_taken_ahead: u64,
    /// Seconds the daemon's main loop slept on the doorbell (for any reason: nothing to do, or
    /// waiting for a loader or an upload). The rest of its wall time it was running.
    #[serde(default)]
    pub doorbell_wait_seconds: f64,
    /// Seconds loaders waited for a free slot (summed over loaders).
    pub loader_wait_seconds: f64,
    /// Seconds loaders spent producing batches (summed over loaders).
    pub loader_busy_seconds: f64,
    /// Seconds the sink spent consuming batches.
    pub sink_busy_seconds: f64,
    /// Where the pipeline was bound ([`pinring_observe::bound`], the one verdict `pinring
    /// status`, `/metrics`' readers and the Python progress line give too): "loaders",
    /// "upload", "consumer", "balanced" or "idle" ("none" when the daemon failed at start;
    /// "unknown" when the loaders' figures it weighs are untrusted).
    pub bound: String,
    /// Seconds uploads were in flight, summed over uploads (the daemon's own count): the
    /// verdict tells an upload-bound run from one whose consumer holds the buffers by it.
    #[serde(default)]
    pub upload_seconds: f64,
    /// Figures of this summary that the loaders report through the ring and that failed the
    /// daemon's check against what it saw itself (`loader_wait_seconds`, `loader_busy_seconds`,
    /// `bad_samples_skipped`): impossible for this run, so some process wrote into the ring's
    /// loader table. Each is given bounded to what could be true, not as reported. Empty:
    /// every figure is the daemon's own or passed its check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untrusted: Vec<String>,
    /// Whether the run stopped early on SIGTERM/SIGINT.
    pub interrupted: bool,
    /// Zero-copy mode (the sink read batches in their slots).
    pub zero_copy: bool,
    /// Whether the ring was registered with the backend (false: --no-register).
    pub registered: bool,
    /// Median latency from a loader's commit to the batch being on the device, microseconds.
    pub latency_p50_us: u32,
    /// 99th percentile of the same, microseconds.
    pub latency_p99_us: u32,
    /// CPU seconds the daemon used (user + system, all its threads) from ring ready to the end:
    /// the steady-state cost, without start-up and registration.
    pub daemon_cpu_seconds: f64,
    /// CPU seconds of the daemon's threads from ring ready to the end (a thread started later:
    /// all of it), by thread name (the daemon's own and the GPU driver's).
    #[serde(default)]
    pub thread_cpu_seconds: std::collections::BTreeMap<String, f64>,
    /// Passes of the daemon's main loop from ring ready to the end (each takes every
    /// completion, returned buffer and READY slot it finds).
    #[serde(default)]
    pub main_loop_passes: u64,
    /// Of those passes, the ones that ended in a sleep on the doorbell (a pass that found work
    /// starts the next one at once, as does one that finds the doorbell rung since it began).
    #[serde(default)]
    pub main_loop_sleeps: u64,
    /// Times the main loop's thread was preempted (involuntary context switches): other
    /// threads wanted its CPU.
    #[serde(default)]
    pub main_loop_preempted: u64,
    /// The error that ended the run, if any.
    pub error: Option<String>,
    /// The exit code the daemon exits with.
    pub exit_code: u8,
}

impl Summary {
    /// Writes the summary as JSON to `path` ([`pinring_runtime::output::write_file`]: a regular file is
    /// replaced atomically, no link is followed, `-` is standard output, a FIFO is written into).
    pub fn write(&self, path: &Path) -> Result<(), pinring_runtime::output::OutputError> {
        write_file("the summary", path, self.to_json().as_bytes())
    }

    /// The summary as pretty JSON, with a final newline.
    pub fn to_json(&self) -> String {
        // A struct of plain fields and string-keyed maps always serialises.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Reads a summary written by [`Summary::write`].
    pub fn read(path: &Path) -> std::io::Result<Summary> {
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }
}
