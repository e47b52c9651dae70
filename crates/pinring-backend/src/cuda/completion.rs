//! The completion thread: it waits on the uploads' events in submission order, turns them into
//! [`Completion`]s, hands the events back for reuse and rings the consumer's hook.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::CudaContext;

use super::raw;
use crate::error::cuda_error;
use crate::guard::Guards;
use crate::{BackendError, Completion};

/// A copy in flight, as handed to the completion thread.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) tag: u64,
    pub(super) buffer: usize,
    pub(super) len: usize,
    pub(super) submitted: Instant,
    /// Recorded on the copy stream right after the copy.
    pub(super) event: raw::Event,
}

/// How many uploads the completion thread waits for at once: it sleeps on the event of the newest
/// of up to this many queued uploads and then completes them all (copies on one stream finish in
/// order). Fewer sleeps and driver wake-ups per batch, at the cost of completing the first ones
/// up to three copies late.
const COMPLETION_WINDOW: usize = 4;

/// Starts the completion thread of device `device`'s uploader. It runs until `inflight`'s sender
/// is dropped and every upload queued before that has completed.
pub(super) fn spawn(
    ctx: &Arc<CudaContext>,
    device: usize,
    guards: &Arc<Guards>,
    inflight: Receiver<InFlight>,
    done: Sender<Completion>,
    free: Sender<raw::Event>,
    hook: &Arc<crate::HookCell>,
) -> Result<JoinHandle<()>, BackendError> {
    let ctx = Arc::clone(ctx);
    let guards = Arc::clone(guards);
    std::thread::Builder::new()
        .name(format!("pinring-cuda{device}-complete"))
        .spawn({
            let hook = Arc::clone(hook);
            move || completion_loop(&ctx, device, &guards, &inflight, &done, &free, &hook)
        })
        .map_err(|_| BackendError::WorkerGone {
            backend: "cuda",
            call: "spawning the completion thread",
        })
}

fn completion_loop(
    ctx: &Arc<CudaContext>,
    device: usize,
    guards: &Guards,
    inflight: &Receiver<InFlight>,
    done: &Sender<Completion>,
    free: &Sender<raw::Event>,
    hook: &crate::HookCell,
) {
    let bound = raw::make_current(ctx);
    if let Err(e) = &bound {
        tracing::error!(code = ?e.0, device, "completion thread: cuCtxSetCurrent failed");
    }
    let mut window: std::collections::VecDeque<InFlight> = std::collections::VecDeque::new();
    loop {
        if window.is_empty() {
            match inflight.recv() {
                Ok(f) => window.push_back(f),
                Err(_) => break,
            }
        }
        while window.len() < COMPLETION_WINDOW {
            match inflight.try_recv() {
                Ok(f) => window.push_back(f),
                Err(_) => break,
            }
        }
        let newest = window.back().map(|f| (f.tag, f.buffer, f.len));
        let waited = match (&bound, window.back()) {
            (Err(e), _) => Err(("cuCtxSetCurrent", e.0)),
            (Ok(()), Some(f)) => f
                .event
                .synchronize()
                .map_err(|e| ("cuEventSynchronize", e.0)),
            (Ok(()), None) => Ok(()),
        };
        for f in window.drain(..) {
            let result = waited.map_err(|(call, code)| {
                let (tag, buffer, len) = newest.unwrap_or((f.tag, f.buffer, f.len));
                cuda_error(
                    call,
                    format!(
                        "upload of {} bytes into device buffer {} (tag {}) on device {device}, waited for with the upload of {len} bytes into buffer {buffer} (tag {tag})",
                        f.len, f.buffer, f.tag
                    ),
                    code,
                )
            });
            // After the wait: a reader that sees the count drop launches after the copy.
            guards.end_upload(f.buffer);
            let completion = Completion {
                tag: f.tag,
                buffer: f.buffer,
                len: f.len,
                result,
                submitted: f.submitted,
                completed: Instant::now(),
            };
            // The uploader owns the receivers; if it is gone we just keep draining.
            let _ = done.send(completion);
            let _ = free.send(f.event);
        }
        hook.call();
    }
}
