//! Publishing: what the run did, kept by the main loop for its summary ([`Tally`]), and the
//! header's counters the observers read (`pinring status`, the service's status line, the
//! metrics), written once a pass from what the stages added since ([`Unpublished`],
//! [`Core::publish_counters`]).

use super::Core;
use std::time::Instant;

/// What a run did, for its summary: clocks, counts and times the main loop keeps. Only the
/// main loop writes it; nothing in it is read back from the segment.
pub(super) struct Tally {
    pub(super) started: Instant,
    /// CPU seconds used before the ring was ready (start-up, registration).
    pub(super) cpu_at_ready: f64,
    /// Each thread's CPU seconds when the ring became ready (`finish::thread_cpu`).
    pub(super) threads_at_ready: std::collections::BTreeMap<i32, (String, f64)>,
    pub(super) last_delivery: Instant,
    /// When the first batch was delivered (the first batch's latency, from `started`).
    pub(super) first_delivery: Option<Instant>,
    pub(super) verified: u64,
    pub(super) verify_failures: u64,
    pub(super) first_failure: Option<String>,
    pub(super) bytes: u64,
    pub(super) sink_busy_ns: u64,
    /// Uploads in flight, summed over uploads (what the header's `upload_ns` gets).
    pub(super) upload_ns: u64,
    pub(super) daemon_wait_ns: u64,
    /// Time the main loop spent inside the backend's submit calls, and asleep on the doorbell.
    pub(super) submit_ns: u64,
    pub(super) doorbell_ns: u64,
    /// Parts taken while an earlier one was not READY yet (`--look-ahead`).
    pub(super) taken_ahead: u64,
    /// Passes of the main loop, and its waits on the doorbell that slept (a wait that found
    /// the doorbell rung since the pass began returns at once and is not counted).
    pub(super) passes: u64,
    pub(super) sleeps: u64,
    /// The main loop thread's preemptions when the ring became ready (`finish::preemptions`;
    /// the daemon starts, runs and finishes on one thread).
    pub(super) preempted_at_ready: Option<u64>,
    /// Commit-to-on-device latencies (bounded memory, however long the daemon runs).
    pub(super) latencies: crate::histogram::Quantiles,
    /// Loader-seconds the daemon saw itself: the live loaders times the time since they were
    /// last counted, the larger of the two counts taken; counted at every reap (entries whose
    /// lock is held, after the dead ones are cleared: the kernel's word) and every 10 ms
    /// between (the table's ACTIVE entries). What the loaders report of their
    /// own time is checked against it ([`pinring_observe::checked_loader_figures`]).
    pub(super) loader_seconds_seen: f64,
    /// When the live loaders were last counted, and how many there were.
    pub(super) loaders_counted: Option<(Instant, u32)>,
}

impl Tally {
    pub(super) fn new(now: Instant) -> Tally {
        Tally {
            started: now,
            cpu_at_ready: 0.0,
            threads_at_ready: Default::default(),
            last_delivery: now,
            first_delivery: None,
            verified: 0,
            verify_failures: 0,
            first_failure: None,
            bytes: 0,
            sink_busy_ns: 0,
            upload_ns: 0,
            daemon_wait_ns: 0,
            submit_ns: 0,
            doorbell_ns: 0,
            taken_ahead: 0,
            passes: 0,
            sleeps: 0,
            preempted_at_ready: None,
            latencies: crate::histogram::Quantiles::default(),
            loader_seconds_seen: 0.0,
            loaders_counted: None,
        }
    }

    /// Books `live` loaders counted at `now` (see [`Tally::loader_seconds_seen`]).
    pub(super) fn count_loaders(&mut self, now: Instant, live: u32) {
        let (since, before) = self.loaders_counted.unwrap_or((self.started, live));
        let dt = now.saturating_duration_since(since).as_secs_f64();
        self.loader_seconds_seen += dt * f64::from(before.max(live));
        self.loaders_counted = Some((now, live));
    }
}

/// What the main loop added to the header's counters since it last wrote them: it adds once per
/// pass (`Core::publish_counters`), not once per part (each a locked instruction), so a reader
/// (`pinring status`, the service's status line, the metrics) sees them at most one pass late.
/// The seqs a restart reads (`next_deliver`, `next_assign`) are plain stores and stay immediate.
#[derive(Debug, Default)]
pub(super) struct Unpublished {
    pub(super) delivered: u64,
    pub(super) bytes_delivered: u64,
    pub(super) upload_ns: u64,
}

impl Core {
    pub(super) fn record_latency(&mut self, commit_ns: u64, on_device_ns: u64) {
        if commit_ns != 0 && on_device_ns >= commit_ns {
            self.tally
                .latencies
                .record_us((on_device_ns - commit_ns) / 1000);
        }
    }

    /// Writes the header's counters the main loop kept since it last did (`Unpublished`).
    pub(super) fn publish_counters(&mut self) {
        let u = std::mem::take(&mut self.unpublished);
        self.ring
            .add_deliveries(u.delivered, u.bytes_delivered, u.upload_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;
    use std::time::{Duration, Instant};

    #[test]
    fn loader_seconds_are_the_larger_of_two_counts_over_the_time_between() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut t = Tally::new(t0);
        // The first count covers the time since the run began at its own number.
        t.count_loaders(t0 + s(2), 3);
        assert_eq!(t.loader_seconds_seen, 6.0);
        // A loader that left between counts is given the benefit of the doubt: 3 for 1 s.
        t.count_loaders(t0 + s(3), 2);
        assert_eq!(t.loader_seconds_seen, 9.0);
        // One that came: 4 for 2 s.
        t.count_loaders(t0 + s(5), 4);
        assert_eq!(t.loader_seconds_seen, 17.0);
        assert_eq!(t.loaders_counted, Some((t0 + s(5), 4)));
    }
}
