//! `pinring consume`: the trainer's end from the command line. Attaches to a ring whose daemon
//! runs `--sink consumer`, takes its batches in order, optionally checks every byte against the
//! synthetic generator and holds the last few (as a trainer keeping tensors would), and prints
//! where it stopped as one JSON line, the state a restarted consumer resumes from.

use pinring_client::{AttachOptions, ClientError, Consumer};
use pinring_exit::Exit;
use pinring_runtime::shutdown::Shutdown;
use std::collections::VecDeque;
use std::time::Duration;

/// `pinring consume` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumeArgs {
    /// Ring name.
    #[arg(long, default_value = "default")]
    pub ring: String,
    /// Resume at this seq (the `seq` of a state printed before).
    #[arg(long)]
    pub start_seq: Option<u64>,
    /// The plan fingerprint the resume state was saved under (hex, as printed); refused if the
    /// ring runs another plan.
    #[arg(long, requires = "start_seq", value_parser = parse_hex)]
    pub fingerprint: Option<u64>,
    /// Stop after this many batches (default: to the end of the plan).
    #[arg(long)]
    pub batches: Option<u64>,
    /// Keep the last N batches held (not released) while taking the next ones.
    #[arg(long, default_value_t = 0)]
    pub hold: usize,
    /// Check every byte of every batch against the synthetic generator (host memory).
    #[arg(long)]
    pub verify: bool,
    /// Give up waiting for the ring, or for one batch, after this many seconds (default: 30 s
    /// for the ring, as long as the daemon lives for a batch).
    #[arg(long)]
    pub timeout_secs: Option<f64>,
}

fn parse_hex(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|e| format!("{s:?} is not a hex fingerprint: {e}"))
}

/// What a consume run did.
#[derive(Debug, serde::Serialize)]
pub struct Consumed {
    /// The state to resume from.
    pub seq: u64,
    /// The plan's fingerprint, hex.
    pub fingerprint: String,
    /// Batches taken.
    pub batches: u64,
    /// Batches whose bytes were checked.
    pub verified: u64,
    /// Whether the plan's end was reached.
    pub finished: bool,
}

/// Errors of `pinring consume`.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// Attaching or taking failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A batch's bytes were wrong.
    #[error("ring {ring:?}: batch at seq {seq}: {what}")]
    Verify {
        /// Ring.
        ring: String,
        /// Seq.
        seq: u64,
        /// What.
        what: String,
    },
}

impl pinring_exit::Coded for ConsumeError {
    /// The exit code.
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            ConsumeError::Client(e) => e.exit(),
            ConsumeError::Verify { .. } => Exit::Verify,
        }
    }
}

/// Runs `pinring consume`. SIGTERM or SIGINT (`shutdown`) stops it within 100 ms: before the
/// ring is attached with `Ok(None)`, after with the state reached (`finished` false), which a
/// restarted consumer resumes from.
pub fn run(args: &ConsumeArgs, shutdown: &Shutdown) -> Result<Option<Consumed>, ConsumeError> {
    let timeout = args.timeout_secs.map(Duration::from_secs_f64);
    let stop = || shutdown.requested();
    let opts = AttachOptions {
        start_seq: args.start_seq,
        fingerprint: args.fingerprint,
        wait_for_ring: timeout.unwrap_or(AttachOptions::default().wait_for_ring),
        path: None,
    };
    // Said at once, as a plain line: a person waits for this command.
    let mut tell = |w: &pinring_ring::Waiting| pinring_runtime::logging::say(&w.to_string());
    let mut c = match Consumer::attach_telling(&args.ring, &opts, &stop, &mut tell) {
        Ok(c) => c,
        Err(ClientError::Interrupted { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let cfg = c.config().clone();
    if args.verify && cfg.dataset.kind != pinring_data::DatasetKind::Synthetic {
        return Err(ConsumeError::Verify {
            ring: args.ring.clone(),
            seq: c.state().seq,
            what: format!(
                "--verify checks synthetic samples against their generator, and this ring's \
                 dataset.kind is \"{}\": consume without --verify",
                cfg.dataset.kind
            ),
        });
    }
    let synthetic = cfg.synthetic();
    let mut plan = cfg.plan().map_err(|e| ClientError::Corrupt {
        ring: args.ring.clone(),
        what: format!("the stored config has no valid plan: {e}"),
    })?;
    let mut held = VecDeque::new();
    let (mut taken, mut verified, mut finished) = (0, 0, false);
    let mut ids = Vec::new();
    while args.batches.is_none_or(|n| taken < n) {
        // Looked at before every batch, not only in the waits: a stream that always has a batch
        // ready never waits, and would keep a stopped consumer taking them.
        if stop() {
            break;
        }
        let batch = match c.next_batch_until(timeout, &stop) {
            Ok(Some(b)) => b,
            Ok(None) => {
                finished = true;
                break;
            }
            Err(ClientError::Interrupted { .. }) => break,
            Err(e) => return Err(e.into()),
        };
        taken += 1;
        if args.verify {
            if let Some(bytes) = batch.host_bytes("images") {
                plan.batch_into(batch.batch, &mut ids)
                    .map_err(|e| ConsumeError::Verify {
                        ring: args.ring.clone(),
                        seq: batch.seq,
                        what: format!("not in the plan: {e}"),
                    })?;
                synthetic
                    .verify_batch(&ids, bytes)
                    .map_err(|e| ConsumeError::Verify {
                        ring: args.ring.clone(),
                        seq: batch.seq,
                        what: e.to_string(),
                    })?;
                verified += 1;
            }
        }
        held.push_back(batch);
        while held.len() > args.hold {
            held.pop_front();
        }
    }
    let st = c.state();
    Ok(Some(Consumed {
        seq: st.seq,
        fingerprint: format!("{:#018x}", st.fingerprint),
        batches: taken,
        verified,
        finished,
    }))
}
