//! The completion thread: it waits on the uploads' events in submission order, turns the groups
//! each event covers into [`Completion`]s, hands the events back for reuse and rings the
//! consumer's hook.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use cudarc::driver::CudaContext;

use super::raw;
use crate::error::cuda_error;
use crate::guard::Guards;
use crate::{BackendError, Completion};

/// An entry of the completion thread's queue: a group of copies, and maybe an event.
#[derive(Debug)]
pub(super) struct InFlight {
    /// The group this entry completes.
    pub(super) group: Group,
    /// Recorded on the copy stream after this entry's copies, so after every earlier entry's
    /// too: the entries before it that have none complete with it. `None`: a deferred group
    /// (`Uploader::submit_group_deferred`), signalled by a later entry's event.
    pub(super) event: Option<raw::Event>,
}

/// A group of copies into one device buffer: one completion.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) tag: u64,
    pub(super) buffer: usize,
    pub(super) len: usize,
    pub(super) submitted: Instant,
}

/// How many groups, and bytes, one wait of the completion thread may complete: it sleeps on the
/// newest event whose groups, with those queued before it, are at most this many and this
/// large (or on the oldest event, when it alone signals more), then completes them all (copies
/// on one stream finish in order). Fewer sleeps and driver wake-ups per group, at the cost of
/// completing the first ones a few copies late; bounded so that slots and device buffers come
/// back in time to keep the loaders and the copy engine fed (4 MiB parts come back one by one).
const COMPLETION_GROUPS: usize = 16;
const COMPLETION_BYTES: usize = 4 << 20;

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

/// Which entry to wait on, of a window given as (the group's bytes, has an event) per entry: the newest one with an event whose groups, counted from the window's start, stay
/// within [`COMPLETION_GROUPS`] and [`COMPLETION_BYTES`], else the first one with an event.
/// `None` when no entry has an event.
fn awaited(entries: impl Iterator<Item = (usize, bool)>) -> Option<usize> {
    let (mut groups, mut bytes) = (0, 0usize);
    let mut pick = None;
    for (i, (len, event)) in entries.enumerate() {
        groups += 1;
        bytes = bytes.saturating_add(len);
        if event {
            if pick.is_some() && (groups > COMPLETION_GROUPS || bytes > COMPLETION_BYTES) {
                break;
            }
            pick = Some(i);
        }
    }
    pick
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
    let mut window: VecDeque<InFlight> = VecDeque::new();
    let mut open = true;
    loop {
        // Until an entry with an event is queued, nothing can complete: block for more.
        while open && !window.iter().any(|f| f.event.is_some()) {
            match inflight.recv() {
                Ok(f) => window.push_back(f),
                Err(_) => open = false,
            }
        }
        if window.is_empty() {
            break;
        }
        loop {
            match inflight.try_recv() {
                Ok(f) => window.push_back(f),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let target = awaited(window.iter().map(|f| (f.group.len, f.event.is_some())));
        let waited = match (&bound, target) {
            (Err(e), _) => Err(("cuCtxSetCurrent", e.0)),
            (Ok(()), Some(i)) => window[i]
                .event
                .as_ref()
                .map_or(Ok(()), |e| e.synchronize())
                .map_err(|e| ("cuEventSynchronize", e.0)),
            // The uploader is gone and left groups without an event (it sends a run of groups
            // with the event on the last, so only a send cut short could): wait for everything
            // the context has queued.
            (Ok(()), None) => ctx.synchronize().map_err(|e| ("cuCtxSynchronize", e.0)),
        };
        let end = target.map_or(window.len(), |i| i + 1);
        // The group whose event was waited on (the window is not empty here).
        let newest = &window[end - 1].group;
        let (tag, buffer, len) = (newest.tag, newest.buffer, newest.len);
        for f in window.drain(..end) {
            let g = f.group;
            let result = waited.map_err(|(call, code)| {
                cuda_error(
                    call,
                    format!(
                        "upload of {} bytes into device buffer {} (tag {}) on device {device}, waited for with the upload of {len} bytes into buffer {buffer} (tag {tag})",
                        g.len, g.buffer, g.tag
                    ),
                    code,
                )
            });
            // After the wait: a reader that sees the count drop launches after the copy.
            guards.end_upload(g.buffer);
            let completion = Completion {
                tag: g.tag,
                buffer: g.buffer,
                len: g.len,
                result,
                submitted: g.submitted,
                completed: Instant::now(),
            };
            // The uploader owns the receivers; if it is gone we just keep draining.
            let _ = done.send(completion);
            if let Some(e) = f.event {
                let _ = free.send(e);
            }
        }
        hook.call();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry of `len` bytes, with an event or not.
    fn entry(len: usize, event: bool) -> (usize, bool) {
        (len, event)
    }

    fn pick(entries: &[(usize, bool)]) -> Option<usize> {
        awaited(entries.iter().copied())
    }

    #[test]
    fn the_wait_covers_at_most_the_bounds_but_always_one_event() {
        let small = 64 << 10;
        // No event: nothing to wait on.
        assert_eq!(pick(&[entry(small, false); 3]), None);
        // Events every 4 groups of 64 KiB: the newest within 16 groups is the 16th entry.
        let w: Vec<_> = (0..40).map(|i| entry(small, i % 4 == 3)).collect();
        assert_eq!(pick(&w), Some(15));
        // One event after 20 groups: waited on, though it passes the bound.
        let mut w = vec![entry(small, false); 19];
        w.push(entry(small, true));
        w.push(entry(small, true));
        assert_eq!(pick(&w), Some(19));
        // 4 MiB groups, each with its event: one at a time, so each slot comes back at once.
        let w = vec![entry(4 << 20, true); 8];
        assert_eq!(pick(&w), Some(0));
        // 1 MiB groups: four per wait.
        let w = vec![entry(1 << 20, true); 8];
        assert_eq!(pick(&w), Some(3));
    }
}
