//! The completion thread: it waits on the uploads' events in submission order, turns the groups
//! each event covers into [`Completion`]s, hands the events back for reuse and rings the
//! consumer's hook.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use cudarc::driver::CudaContext;

use super::raw;
use crate::error::cuda_error;
use crate::guard::Guards;
use crate::{BackendError, Completion};

/// An entry of the completion thread's queue: a run of groups and the one event after them. A
/// run is one message, not one per group: at 64 KiB parts a send and a receive per group were a
/// fifth of this thread's time.
#[derive(Debug)]
pub(super) struct InFlight {
    /// The groups this entry completes, in submission order (at least one).
    pub(super) groups: Vec<Group>,
    /// Their bytes.
    pub(super) bytes: usize,
    /// When their copies went to the driver (a deferred group's are held until its event is
    /// due, so this may be well after the group was submitted).
    pub(super) issued: Instant,
    /// Recorded on the copy stream after the run's copies, so after every earlier run's too.
    pub(super) event: raw::Event,
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

/// The fastest pace the first look at an event assumes ([`Pace`]), bytes per second: the copies
/// ahead of it take at least their bytes at this rate (PCIe Gen5 x16 moves about 53-55 GB/s).
const LINK_BYTES_PER_S: u64 = 55_000_000_000;
/// Looks after the expected end are this far apart at least, and at most
/// [`LONGEST_NAP`] (a copy stream held behind a consumer's release is looked at 1000 times a
/// second).
const SHORTEST_NAP: Duration = Duration::from_micros(5);
const LATE_NAP: Duration = Duration::from_micros(25);
const LONGEST_NAP: Duration = Duration::from_millis(1);
/// The completion thread's timer slack: its naps end on time (the default is 50 µs).
const TIMER_SLACK_NS: u64 = 1_000;

/// How long to nap before the next look at an event expected `expected` after the wait began,
/// `waited` into the wait. Before the expected end: until it. After it: an eighth of the
/// expected time (within [`SHORTEST_NAP`]..=[`LATE_NAP`]), so that a copy a little slower than
/// expected is seen within a few percent of its time; and once the event is late by more than
/// that, a quarter of its lateness (up to [`LONGEST_NAP`]), so that a stream held up for long
/// costs few looks while each look is at most 25% later than the event.
fn next_nap(waited: Duration, expected: Duration) -> Duration {
    if let Some(left) = expected.checked_sub(waited).filter(|d| !d.is_zero()) {
        return left.max(SHORTEST_NAP);
    }
    let late = waited - expected;
    let step = (expected / 8).clamp(SHORTEST_NAP, LATE_NAP);
    (late / 4).clamp(step, LONGEST_NAP)
}

/// Waits for `event`, expected to complete `expected` after `began`, by looking at it
/// (`cuEventQuery`) after naps ([`next_nap`]). Every upload event is looked at, none waited on
/// with a blocking-sync wait (`cuEventSynchronize`): that costs a wake-up of the driver's event
/// thread and of this one per event (the event thread alone took 0.2-0.3 cores at 64 KiB
/// slots), and its wake-up comes late. Looks gave 64 KiB slots 25% more throughput for a
/// quarter less CPU per byte, and 1 and 4 MiB slots a third less daemon CPU (H200,
/// docs/BENCHMARKS.md, "Every event looked at").
/// Returns what the looks saw: the last moment the event was seen not done, if any look found
/// it so. Fails with the driver's error if the copies failed.
fn wait_polling(
    event: &raw::Event,
    began: Instant,
    expected: Duration,
) -> Result<Looks, cudarc::driver::DriverError> {
    let mut busy = None;
    loop {
        let looked = Instant::now();
        if event.is_done()? {
            return Ok(Looks { busy });
        }
        busy = Some(looked);
        std::thread::sleep(next_nap(looked - began, expected));
    }
}

/// What the looks at one event saw ([`wait_polling`]).
#[derive(Debug, Clone, Copy)]
struct Looks {
    /// The last look that found the event not done (None: the first look found it done).
    busy: Option<Instant>,
}

/// The copy engine's pace as the looks have found it, bytes per second, which times the first
/// look at the next event. It starts at [`LINK_BYTES_PER_S`] and stays within
/// [`SLOWEST_PACE`]..=that. An event still busy at a moment shows the engine slower than its
/// bytes over the time since they started: the pace moves a quarter of the way down to that.
/// An event done at the first look shows nothing but that the look may have come late: the pace
/// rises by a sixteenth. So first looks settle around the moment events complete, where with the
/// link's speed alone they came early for copies the engine runs slower (64 KiB rows: 35-45
/// GB/s), and each early look cost a nap and a look more.
#[derive(Debug, Clone, Copy)]
struct Pace {
    bytes_per_s: f64,
}

/// The slowest pace [`Pace`] assumes: a quarter of the link's (a stream held behind a consumer
/// teaches no slower pace than this, so looks recover within a few events once it moves).
const SLOWEST_PACE: f64 = LINK_BYTES_PER_S as f64 / 4.0;

impl Pace {
    fn new() -> Pace {
        Pace {
            bytes_per_s: LINK_BYTES_PER_S as f64,
        }
    }

    /// How long the engine takes for `bytes` at this pace.
    fn time_for(&self, bytes: usize) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_s)
    }

    /// Learns from the looks at an event after `bytes` of copies that had the engine from
    /// `start`.
    fn learn(&mut self, bytes: usize, start: Instant, looks: Looks) {
        let pace = match looks.busy {
            Some(busy) => {
                let busy_for = busy.saturating_duration_since(start).as_secs_f64();
                let at_most = bytes as f64 / busy_for;
                if busy_for > 0.0 && at_most < self.bytes_per_s {
                    self.bytes_per_s - (self.bytes_per_s - at_most) / 4.0
                } else {
                    self.bytes_per_s
                }
            }
            None => self.bytes_per_s * 17.0 / 16.0,
        };
        self.bytes_per_s = pace.clamp(SLOWEST_PACE, LINK_BYTES_PER_S as f64);
    }
}

/// When the copies of `ahead` bytes, the first of them queued at `first_queued`, are expected to
/// be done, measured from `now`, and when they could start: the copy engine starts them no
/// sooner than they were queued nor before the previous awaited event completed (no sooner than
/// `engine_free`), and moves them at `pace`.
fn expected_done(
    now: Instant,
    first_queued: Instant,
    engine_free: Instant,
    ahead: usize,
    pace: &Pace,
) -> (Duration, Instant) {
    let start = first_queued.max(engine_free);
    (
        (start + pace.time_for(ahead)).saturating_duration_since(now),
        start,
    )
}

/// Starts the completion thread of device `device`'s uploader. It runs until `inflight`'s sender
/// is dropped and every upload queued before that has completed.
pub(super) fn spawn(
    ctx: &Arc<CudaContext>,
    device: usize,
    guards: &Arc<Guards>,
    inflight: Receiver<InFlight>,
    done: crate::CompletionSender,
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

/// Which run to wait on, of a window given as (the run's groups, its bytes) per run: the newest
/// one whose groups, counted from the window's start, stay within [`COMPLETION_GROUPS`] and
/// [`COMPLETION_BYTES`], else the first. `None` for an empty window.
fn awaited(runs: impl Iterator<Item = (usize, usize)>) -> Option<usize> {
    let (mut groups, mut bytes) = (0, 0usize);
    let mut pick = None;
    for (i, (run_groups, run_bytes)) in runs.enumerate() {
        groups += run_groups;
        bytes = bytes.saturating_add(run_bytes);
        if pick.is_some() && (groups > COMPLETION_GROUPS || bytes > COMPLETION_BYTES) {
            break;
        }
        pick = Some(i);
    }
    pick
}

fn completion_loop(
    ctx: &Arc<CudaContext>,
    device: usize,
    guards: &Guards,
    inflight: &Receiver<InFlight>,
    done: &crate::CompletionSender,
    free: &Sender<raw::Event>,
    hook: &crate::HookCell,
) {
    let bound = raw::make_current(ctx);
    if let Err(e) = &bound {
        tracing::error!(code = ?e.0, device, "completion thread: cuCtxSetCurrent failed");
    }
    // The waits below sleep for tens of microseconds: the default slack of 50 µs would make
    // each one that much late.
    if let Err(e) = nix::sys::prctl::set_timerslack(TIMER_SLACK_NS) {
        tracing::debug!(device, "completion thread: PR_SET_TIMERSLACK failed: {e}");
    }
    let mut window: VecDeque<InFlight> = VecDeque::new();
    // No sooner than this the last awaited event completed: the copies after it had the engine
    // no sooner.
    let mut engine_free = Instant::now();
    let mut pace = Pace::new();
    loop {
        // Until a run is queued, nothing can complete: block for one.
        if window.is_empty() {
            match inflight.recv() {
                Ok(f) => window.push_back(f),
                Err(_) => break,
            }
        }
        // And every run queued behind it: one wait may complete several.
        while let Ok(f) = inflight.try_recv() {
            window.push_back(f);
        }
        let end = awaited(window.iter().map(|f| (f.groups.len(), f.bytes)))
            .map_or(window.len(), |i| i + 1);
        let waited = match &bound {
            Err(e) => Err(("cuCtxSetCurrent", e.0)),
            Ok(()) => {
                let now = Instant::now();
                let ahead = window.range(..end).map(|f| f.bytes).sum();
                let (expected, start) =
                    expected_done(now, window[0].issued, engine_free, ahead, &pace);
                wait_polling(&window[end - 1].event, now, expected)
                    .map(|looks| {
                        pace.learn(ahead, start, looks);
                        engine_free = looks.busy.unwrap_or(now);
                    })
                    .map_err(|e| ("cuEventQuery", e.0))
            }
        };
        // The last group of the run whose event was waited on (a run has at least one).
        let newest = window[end - 1].groups.last();
        let (tag, buffer, len) = newest.map_or((0, 0, 0), |g| (g.tag, g.buffer, g.len));
        // Every group of these runs was seen done now: their completions go as one message.
        let completed = Instant::now();
        let mut run = Vec::with_capacity(window.range(..end).map(|f| f.groups.len()).sum());
        for f in window.drain(..end) {
            for g in f.groups {
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
                    completed,
                };
                run.push(completion);
            }
            let e = f.event;
            let _ = free.send(e);
        }
        // The uploader owns the receiver; if it is gone we just keep draining.
        let _ = done.send(run);
        hook.call();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of `groups` groups of `len` bytes each.
    fn run(groups: usize, len: usize) -> (usize, usize) {
        (groups, groups * len)
    }

    fn pick(runs: &[(usize, usize)]) -> Option<usize> {
        awaited(runs.iter().copied())
    }

    #[test]
    fn looks_come_at_the_expected_end_then_close_behind_then_spaced_by_lateness() {
        let us = Duration::from_micros;
        // Before the expected end: a nap until it (never shorter than the shortest nap).
        assert_eq!(next_nap(us(0), us(77)), us(77));
        assert_eq!(next_nap(us(70), us(77)), us(7));
        assert_eq!(next_nap(us(76), us(77)), SHORTEST_NAP);
        // Just past it: an eighth of the expected time, within 5..=25 µs.
        assert_eq!(next_nap(us(81), us(80)), us(10));
        assert_eq!(next_nap(us(85), us(80)), us(10));
        assert_eq!(next_nap(us(20), us(16)), SHORTEST_NAP);
        assert_eq!(next_nap(us(1000), us(800)), us(50));
        // Long past it: a quarter of the lateness, so each look is at most 25% late, up to 1 ms.
        assert_eq!(next_nap(us(477), us(77)), us(100));
        assert_eq!(next_nap(us(60_000), us(77)), LONGEST_NAP);
        // An event expected at once (nothing ahead): looked at every few microseconds at first.
        assert_eq!(next_nap(us(3), us(0)), SHORTEST_NAP);
        // The naps of a wait that is never done grow, but never past the longest.
        let (mut t, mut naps) = (us(0), 0);
        while t < Duration::from_secs(1) {
            let n = next_nap(t, us(77));
            assert!(n >= SHORTEST_NAP && n <= LONGEST_NAP);
            t += n;
            naps += 1;
        }
        assert!(naps < 1100, "{naps} looks in a second");
    }

    #[test]
    fn the_expected_end_counts_from_when_the_engine_could_start() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let four_mib = 4 << 20;
        // 4 MiB at 55 GB/s: 76 µs after the first copy was queued, if the engine was free.
        let link = us(76);
        let e = expected_done(t0, t0, t0 - us(500), four_mib, &Pace::new()).0;
        assert!(e >= link && e <= link + us(1), "{e:?}");
        // Queued 50 µs ago: 26 µs left.
        let e = expected_done(t0 + us(50), t0, t0, four_mib, &Pace::new()).0;
        assert!(e >= us(26) && e <= us(27), "{e:?}");
        // The engine was busy with earlier copies until 30 µs after these were queued.
        let e = expected_done(t0 + us(50), t0, t0 + us(30), four_mib, &Pace::new()).0;
        assert!(e >= us(56) && e <= us(57), "{e:?}");
        // Long overdue: no nap before the first look.
        assert_eq!(
            expected_done(t0 + us(500), t0, t0, four_mib, &Pace::new()).0,
            Duration::ZERO
        );
    }

    #[test]
    fn the_pace_settles_where_first_looks_meet_the_end_of_the_copies() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let two_mib = 2 << 20;
        // The engine moves 2 MiB in 60 µs (35 GB/s). Each event: the first look at the time the
        // pace expects, then looks 5 µs apart until one finds it done.
        let mut pace = Pace::new();
        let mut looks_per_event = Vec::new();
        for _ in 0..200 {
            let mut at = pace.time_for(two_mib);
            let mut busy = None;
            let mut looks = 1;
            while at < us(60) {
                busy = Some(t0 + at);
                at += us(5);
                looks += 1;
            }
            pace.learn(two_mib, t0, Looks { busy });
            looks_per_event.push(looks);
        }
        // From the link's speed (3 looks) down to the engine's: at most 2 looks an event, and
        // a first look at most ~6% late (a sixteenth: the rise after a look that found it done).
        assert!(looks_per_event[0] >= 3, "{looks_per_event:?}");
        assert!(
            looks_per_event[20..].iter().all(|&l| l <= 2),
            "{looks_per_event:?}"
        );
        let first = pace.time_for(two_mib);
        assert!(first >= us(52) && first <= us(64), "{first:?}");
        // A stream held for 10 ms teaches no slower than a quarter of the link, and a few
        // events at the engine's speed bring the first look back.
        for _ in 0..20 {
            let busy = Some(t0 + us(10_000));
            pace.learn(two_mib, t0, Looks { busy });
        }
        assert_eq!(pace.bytes_per_s, SLOWEST_PACE);
        for _ in 0..20 {
            pace.learn(two_mib, t0, Looks { busy: None });
        }
        assert!(
            pace.time_for(two_mib) <= us(60),
            "{:?}",
            pace.time_for(two_mib)
        );
        // Never faster than the link.
        for _ in 0..100 {
            pace.learn(two_mib, t0, Looks { busy: None });
        }
        assert_eq!(pace.bytes_per_s, LINK_BYTES_PER_S as f64);
    }

    #[test]
    fn the_wait_covers_at_most_the_bounds_but_always_one_event() {
        let small = 64 << 10;
        // Nothing queued: nothing to wait on.
        assert_eq!(pick(&[]), None);
        // Runs of 4 groups of 64 KiB: the newest within 16 groups is the 4th run.
        assert_eq!(pick(&[run(4, small); 10]), Some(3));
        // A run of 20 groups: waited on, though it passes the bound; the next one waits.
        assert_eq!(pick(&[run(20, small), run(1, small)]), Some(0));
        // 4 MiB groups, each run one: one at a time, so each slot comes back at once.
        assert_eq!(pick(&[run(1, 4 << 20); 8]), Some(0));
        // 1 MiB groups, each run one: four per wait.
        assert_eq!(pick(&[run(1, 1 << 20); 8]), Some(3));
        // Runs of four 1 MiB groups (one event per 4 MiB): one run per wait.
        assert_eq!(pick(&[run(4, 1 << 20); 3]), Some(0));
    }
}
