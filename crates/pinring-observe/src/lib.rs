//! A ring's counters read without disturbing it: a [`Snapshot`] of the segment header, the
//! loader table and the slot descriptors, the [`Rates`] between two snapshots, and the
//! [`bound`] verdict. A view maps the segment read-only ([`RingView`]): it cannot write a
//! byte of the ring. The daemon's metrics endpoint and service status, `pinring status` and the
//! Python consumer's `stats()` all read a ring through this crate, which depends on the ring
//! alone: a tool that only reads counters links no daemon, backend or reader.
//!
//! The verdict reads the wait counters (docs/ARCHITECTURE.md, "Where time goes"):
//! * the daemon waited with a free device buffer and nothing READY → **loaders** are too slow;
//! * loaders waited for a FREE slot and the upload engine was busy → **upload** bound;
//! * loaders waited for a FREE slot and the upload engine was mostly idle → the daemon was
//!   waiting for device buffers held by the **consumer**.

#![forbid(unsafe_code)]

use pinring_ring::{ring_state, RingError, RingSnapshot, RingView, SlotState};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Opens ring `name` read-only (a [`RingView`]): named in /dev/shm, or with `at` an anonymous
/// one where a process holds it; without waiting for one that is still being created.
pub fn open_read_only(name: &str, at: Option<&std::path::Path>) -> Result<RingView, RingError> {
    RingView::open(name, at, Duration::from_millis(200))
}

/// Slot counts by state.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SlotCounts {
    /// No work assigned.
    pub idle: u32,
    /// Waiting for a loader.
    pub free: u32,
    /// Being filled by a loader.
    pub claimed: u32,
    /// Filled, waiting for the daemon.
    pub ready: u32,
    /// Being uploaded.
    pub uploading: u32,
    /// Holding a state word no valid writer produces.
    pub invalid: u32,
}

/// One loader-table entry.
#[derive(Debug, Clone, Serialize)]
pub struct LoaderStatus {
    /// Table index.
    pub index: usize,
    /// Pid.
    pub pid: u32,
    /// Whether that exact process (pid and start time) still runs.
    pub alive: bool,
    /// Batches committed.
    pub batches: u64,
    /// Payload bytes committed.
    pub bytes: u64,
    /// Seconds spent producing batches.
    pub busy_seconds: f64,
    /// Seconds spent waiting for a free slot.
    pub wait_seconds: f64,
    /// Whether it holds a slot right now (producing) rather than waiting.
    pub busy_now: bool,
    /// Its busy and wait seconds (written by the loader itself) add up to more than the ring
    /// has existed: another process wrote them; both are shown bounded to the ring's age.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub untrusted: bool,
}

/// A point-in-time reading of a ring.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Ring name.
    pub ring: String,
    /// State name (INIT, READY, DRAINING, CLOSED).
    pub state: &'static str,
    /// Daemon pid.
    pub daemon_pid: u32,
    /// Whether the daemon runs.
    pub daemon_alive: bool,
    /// Where the ring's batches go, for a ring whose daemon hands them to a consumer
    /// (`--sink consumer`): `cuda:N` or `host`. Absent for other sinks, which the ring does not
    /// record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Slots.
    pub slot_count: u32,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Slot counts by state.
    pub slots: SlotCounts,
    /// Attached loaders.
    pub loaders: Vec<LoaderStatus>,
    /// First and one-past-last seq of the run.
    pub start_seq: u64,
    /// One past the last seq.
    pub end_seq: u64,
    /// Batches committed by loaders.
    pub committed: u64,
    /// Batches delivered to the consumer.
    pub delivered: u64,
    /// Where a run resumes (`--start-seq`), as the daemon publishes it (header `next_deliver`):
    /// the lowest seq not delivered, every seq below it delivered. Unordered, some batches above
    /// it may have been delivered too (the daemon's summary counts them).
    pub resume_seq: u64,
    /// Payload bytes committed (into the ring).
    pub bytes_in: u64,
    /// Payload bytes uploaded (out of the ring).
    pub bytes_out: u64,
    /// Slots taken back from dead loaders.
    pub reclaimed: u64,
    /// Batches the daemon refused.
    pub rejected: u64,
    /// Seconds the daemon waited for a READY slot with a free device buffer.
    pub daemon_wait_seconds: f64,
    /// Seconds loaders waited for a FREE slot (summed).
    pub loader_wait_seconds: f64,
    /// Seconds loaders spent producing (summed).
    pub loader_busy_seconds: f64,
    /// Seconds uploads were in flight (summed).
    pub upload_seconds: f64,
    /// Claims that outlived `daemon.lease_ms` (hung loaders' slots taken back).
    pub leases_expired: u64,
    /// Live loaders now holding a slot past the lease, or a quarantined one.
    pub hung_loaders: u64,
    /// Pid of the loader declared hung last (0: none).
    pub last_hung_pid: u64,
    /// Slots now held in quarantine until a hung loader exits or acknowledges.
    pub quarantined: u64,
    /// Seqs handed out again in another slot.
    pub reissued: u64,
    /// Bad batches skipped and made again (`on_bad_batch = "skip"`).
    pub bad_batches_skipped: u64,
    /// Unreadable samples replaced with zeros by loaders (`dataset.on_bad_sample = "skip"`).
    #[serde(default)]
    pub bad_samples_skipped: u64,
    /// Descriptors found in a state the daemon never left them in.
    pub corrupt_descriptors: u64,
    /// The trainer's end, for a ring whose daemon hands batches to a consumer.
    pub consumer: Option<ConsumerView>,
    /// Set while the ring has work left and no loader, once that has lasted
    /// `daemon.idle_warn_ms` (the daemon also logs a warning).
    pub stalled: Option<Stalled>,
    /// Figures only loaders report (`loader_wait_seconds`, `loader_busy_seconds`,
    /// `bad_samples_skipped`) that failed the check against what the daemon saw
    /// ([`checked_loader_figures`]): shown bounded to what could be true, not as the ring holds
    /// them. Empty: every figure passed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub untrusted: Vec<String>,
    #[serde(skip)]
    taken: Option<Instant>,
}

/// A ring with work left and no loader attached.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stalled {
    /// For how long, as of the snapshot.
    pub seconds: f64,
    /// The lowest undelivered seq: the one that waits for a loader.
    pub seq: u64,
}

impl Stalled {
    fn of(ring: &RingSnapshot) -> Option<Stalled> {
        let since = ring.health.stalled_since_ns;
        (since != 0 && ring.daemon_alive).then(|| Stalled {
            seconds: secs(pinring_ring::clock::monotonic_ns().saturating_sub(since)),
            seq: ring.health.stalled_seq,
        })
    }
}

/// The handoff as a status view sees it (`--sink consumer`).
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerView {
    /// Whether a consumer is attached (its lock is held).
    pub attached: bool,
    /// The last consumer's pid, as it recorded it.
    pub pid: u32,
    /// Batch buffers.
    pub buffers: u32,
    /// Buffers holding a batch no consumer took yet.
    pub waiting: u32,
    /// Buffers the consumer holds.
    pub held: u32,
    /// Who copies the batches to the GPU (`daemon.copies`): "consumer" (the training process,
    /// out of the ring's slots, in its own CUDA context) or "daemon" (into buffers it hands over).
    pub copies: &'static str,
    /// Batches taken.
    pub taken: u64,
    /// Buffers taken back from dead consumers.
    pub reclaimed: u64,
}

impl ConsumerView {
    fn of(ring: &RingSnapshot) -> Option<ConsumerView> {
        use pinring_ring::handoff::buffer_state;
        let g = ring.geometry.handoff?;
        let b = ring.handoff.as_ref()?;
        let count = |s: u8| b.buffers.iter().filter(|w| w.state == s).count() as u32;
        let consumer_copies = g.part_slots > 0;
        let attached = b.consumer_alive;
        Some(ConsumerView {
            attached,
            pid: b.consumer_pid,
            buffers: g.buffers,
            waiting: count(buffer_state::FILLED),
            // The consumer's own buffers, as it publishes them (none once it is gone).
            held: if consumer_copies {
                if attached {
                    b.own_held.min(g.buffers)
                } else {
                    0
                }
            } else {
                count(buffer_state::TAKEN)
            },
            copies: if consumer_copies {
                "consumer"
            } else {
                "daemon"
            },
            taken: b.taken,
            reclaimed: b.reclaimed,
        })
    }
}

/// The device a consumer ring delivers to, as its handoff block records it.
fn device_of(ring: &RingSnapshot) -> Option<String> {
    use pinring_ring::handoff::backend_code;
    ring.geometry.handoff?;
    let b = ring.handoff.as_ref()?;
    match b.backend {
        backend_code::HOST => Some("host".into()),
        backend_code::CUDA => Some(format!("cuda:{}", b.device)),
        _ => None,
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl Snapshot {
    /// Reads `ring`, copied out of the ring ([`RingView::snapshot`]: every field a single
    /// atomic load; the snapshot is not one instant but each counter is exact).
    pub fn take(ring: &RingSnapshot) -> Snapshot {
        let h = &ring.header;
        let g = ring.geometry;
        let mut slots = SlotCounts::default();
        let mut busy_owners = std::collections::HashSet::new();
        for v in &ring.slots {
            match v.state {
                Some(SlotState::Idle) => slots.idle += 1,
                Some(SlotState::Free) => slots.free += 1,
                Some(SlotState::Claimed) => {
                    slots.claimed += 1;
                    busy_owners.insert(v.owner as usize);
                }
                Some(SlotState::Ready) => slots.ready += 1,
                Some(SlotState::Uploading) => slots.uploading += 1,
                None => slots.invalid += 1,
            }
        }
        let delivered = h.delivered;
        let saw = DaemonSaw::published(ring, delivered);
        let loaders = ring
            .loaders
            .iter()
            .map(|l| {
                // One loader waits or works, never both: together at most the ring's age.
                let (busy, wait) = (secs(l.busy_ns), secs(l.wait_ns));
                let limit = saw.wall + 0.5;
                let untrusted = busy + wait > limit;
                LoaderStatus {
                    index: l.index,
                    pid: l.pid,
                    alive: l.alive,
                    batches: l.batches,
                    bytes: l.bytes,
                    busy_seconds: busy.min(limit),
                    wait_seconds: wait.min(limit),
                    busy_now: busy_owners.contains(&l.index),
                    untrusted,
                }
            })
            .collect();
        let checked = checked_loader_figures(
            &LoaderReport {
                wait_ns: h.loader_wait_ns,
                busy_ns: h.loader_busy_ns,
                bad_samples: h.bad_samples_skipped,
            },
            &saw,
        );
        Snapshot {
            ring: ring.name.clone(),
            state: ring_state::name(ring.state),
            daemon_pid: ring.daemon.pid,
            daemon_alive: ring.daemon_alive,
            device: device_of(ring),
            slot_count: g.slot_count,
            slot_bytes: g.slot_bytes,
            slots,
            loaders,
            start_seq: h.start_seq,
            end_seq: h.end_seq,
            committed: h.committed,
            delivered,
            resume_seq: h.next_deliver,
            bytes_in: h.bytes_committed,
            bytes_out: h.bytes_delivered,
            reclaimed: h.reclaimed,
            rejected: h.rejected,
            daemon_wait_seconds: secs(h.daemon_wait_ns),
            loader_wait_seconds: checked.wait,
            loader_busy_seconds: checked.busy,
            upload_seconds: secs(h.upload_ns),
            leases_expired: ring.health.leases_expired,
            hung_loaders: ring.health.hung_loaders,
            last_hung_pid: ring.health.last_hung_pid,
            quarantined: ring.health.quarantined,
            reissued: ring.health.reissued,
            bad_batches_skipped: ring.health.bad_batches_skipped,
            bad_samples_skipped: checked.bad_samples,
            corrupt_descriptors: ring.health.corrupt_descriptors,
            consumer: ConsumerView::of(ring),
            stalled: Stalled::of(ring),
            untrusted: checked.untrusted,
            taken: Some(Instant::now()),
        }
    }
}

/// What changed between two snapshots of the same ring.
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    /// Length of the interval.
    pub seconds: f64,
    /// GB/s committed into the ring by loaders (1e9 bytes/s).
    pub gbps_in: f64,
    /// GB/s uploaded out of the ring.
    pub gbps_out: f64,
    /// Batches delivered per second.
    pub batches_per_second: f64,
    /// Where the pipeline is bound in this interval: loaders, upload, consumer, balanced, idle,
    /// or unknown (the loaders' figures it weighs are untrusted).
    pub bound: &'static str,
}

impl Rates {
    /// Rates from `a` (earlier) to `b`.
    pub fn between(a: &Snapshot, b: &Snapshot) -> Rates {
        let seconds = match (a.taken, b.taken) {
            (Some(x), Some(y)) => y.saturating_duration_since(x).as_secs_f64(),
            _ => 0.0,
        };
        let per_s = |x: u64, y: u64| {
            if seconds > 0.0 {
                y.saturating_sub(x) as f64 / seconds
            } else {
                0.0
            }
        };
        let d = |x: f64, y: f64| (y - x).max(0.0);
        Rates {
            seconds,
            gbps_in: per_s(a.bytes_in, b.bytes_in) / 1e9,
            gbps_out: per_s(a.bytes_out, b.bytes_out) / 1e9,
            batches_per_second: per_s(a.delivered, b.delivered),
            bound: if [a, b].iter().any(|s| s.loader_times_untrusted()) {
                // The verdict weighs the loaders' time: with that untrusted, there is none.
                "unknown"
            } else {
                bound(
                    seconds,
                    b.delivered.saturating_sub(a.delivered),
                    d(a.daemon_wait_seconds, b.daemon_wait_seconds),
                    d(a.loader_wait_seconds, b.loader_wait_seconds),
                    d(a.loader_busy_seconds, b.loader_busy_seconds),
                    d(a.upload_seconds, b.upload_seconds),
                )
            },
        }
    }
}

impl Snapshot {
    /// Whether the loaders' wait or busy time, which the verdict weighs, failed its check.
    pub fn loader_times_untrusted(&self) -> bool {
        self.untrusted.iter().any(|f| f.starts_with("loader_"))
    }
}

/// Where a pipeline is bound, over an interval or a whole run: the one verdict every view
/// gives (the summary, `pinring run`'s text, `pinring status`, Python's progress line), from
/// the time `seconds` and the batches `delivered` in it, and what each wait counter grew by:
///
/// * `"idle"`: no time, or nothing delivered and no loader worked;
/// * `"loaders"`: the daemon waited with a free device buffer and nothing READY more than half
///   the time: the loaders are too slow;
/// * loaders waited for a FREE slot more than half their time: slots are stuck behind uploads
///   (`"upload"`, uploads in flight more than half the time) or behind device buffers the
///   consumer has not released (`"consumer"`: the trainer or the sink takes batches slower than
///   they come, or no consumer is attached);
/// * `"balanced"`: neither side waited much.
///
/// [`explain`] says each in a sentence.
pub fn bound(
    seconds: f64,
    delivered: u64,
    daemon_wait: f64,
    loader_wait: f64,
    loader_busy: f64,
    upload: f64,
) -> &'static str {
    if seconds <= 0.0 || (delivered == 0 && loader_busy == 0.0 && loader_wait == 0.0) {
        return "idle";
    }
    let (daemon_starved, loaders_blocked) =
        wait_fractions(seconds, daemon_wait, loader_wait, loader_busy);
    if daemon_starved > 0.5 {
        "loaders"
    } else if loaders_blocked > 0.5 {
        // Loaders wait for FREE slots: slots are stuck behind uploads, or behind device
        // buffers the consumer has not released.
        if upload / seconds > 0.5 {
            "upload"
        } else {
            "consumer"
        }
    } else {
        "balanced"
    }
}

/// The two fractions every verdict starts from: the share of `seconds` the daemon waited for a
/// ready slot while it could have uploaded, and the share of loader time (waiting plus working)
/// spent waiting for a free slot. `seconds` must be positive.
pub fn wait_fractions(
    seconds: f64,
    daemon_wait: f64,
    loader_wait: f64,
    loader_busy: f64,
) -> (f64, f64) {
    let loaders_blocked = if loader_wait + loader_busy > 0.0 {
        loader_wait / (loader_wait + loader_busy)
    } else {
        0.0
    };
    (daemon_wait / seconds, loaders_blocked)
}

/// A verdict of [`bound`] (or `"unknown"`, `"none"`) in one sentence with its remedy.
pub fn explain(bound: &str) -> &'static str {
    match bound {
        "loaders" => {
            "loader-bound: the GPU side waited for batches; add loaders or make them faster"
        }
        "upload" => {
            "upload-bound: loaders waited for free slots while the copies to the device ran; \
             the copy is the limit"
        }
        "consumer" => {
            "consumer-bound: loaders waited for free slots while the copy engine was mostly \
             idle; the consumer (the trainer, or the sink) takes batches slower than they come, \
             or none is attached"
        }
        "balanced" => "balanced: neither side waited much",
        "idle" => "idle: nothing was delivered and no loader worked",
        "unknown" => "unknown: the loaders' figures it weighs are untrusted",
        _ => "none: the run did not start",
    }
}

/// What the loaders reported through the ring's header (any process can write it).
#[derive(Debug, Clone, Copy)]
pub struct LoaderReport {
    /// Their summed wait for free slots.
    pub wait_ns: u64,
    /// Their summed time producing.
    pub busy_ns: u64,
    /// Samples they substituted (`dataset.on_bad_sample = "skip"`).
    pub bad_samples: u64,
}

/// What the daemon saw itself, to check a [`LoaderReport`] against.
#[derive(Debug, Clone, Copy)]
pub struct DaemonSaw {
    /// Seconds since the ring was ready.
    pub wall: f64,
    /// Live loaders integrated over the run (the daemon's own count, or `Health::loader_ns_seen` for a view).
    pub loader_seconds: f64,
    /// Samples of every part the run could have filled: those delivered and a ringful more.
    pub samples_possible: u64,
    /// The ring's slots.
    pub slots: u32,
    /// Whether loaders may substitute samples at all (a file kind with `on_bad_sample = "skip"`).
    pub skipping: bool,
}

impl DaemonSaw {
    /// What the daemon published of what it saw ([`pinring_ring::layout::Health::loader_ns_seen`],
    /// `skippable_per_batch`, its heartbeat), for a view that reads `ring` from outside. The
    /// published count lags by up to one reap: the live loaders times the time since the
    /// daemon's heartbeat are added. Every allowance errs toward believing the loaders (a
    /// scribbled heartbeat or creation time widens it, never narrows it below the truth).
    pub fn published(ring: &RingSnapshot, delivered: u64) -> DaemonSaw {
        let (h, health) = (&ring.header, &ring.health);
        let now_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let wall = secs(now_unix.saturating_sub(h.created_unix_ns));
        // Since the daemon last counted (no longer than the ring has existed: a daemon that
        // has not reaped yet has a heartbeat of 0).
        let lag =
            secs(pinring_ring::clock::monotonic_ns().saturating_sub(health.daemon_heartbeat_ns))
                .min(wall);
        let slots = ring.geometry.slot_count;
        let per_batch = health.skippable_per_batch;
        DaemonSaw {
            wall,
            loader_seconds: secs(health.loader_ns_seen) + lag * f64::from(ring.attached_loaders),
            samples_possible: delivered
                .saturating_add(u64::from(slots))
                .saturating_mul(per_batch),
            slots,
            skipping: per_batch > 0,
        }
    }
}

/// The loaders' figures as the summary gives them, and the names of those that failed their
/// check.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub wait: f64,
    pub busy: f64,
    pub bad_samples: u64,
    pub untrusted: Vec<String>,
}

/// Checks what loaders reported against what the daemon saw. Their wait cannot exceed the
/// loader-seconds the daemon counted, plus one loader for the whole run (a loader that came and
/// went between two counts is not seen) and half a second; their busy time (claim to commit,
/// each claim holding its slot alone) cannot exceed every slot for the whole run; a substituted
/// sample needs a file kind that skips, and at most every sample the run could have filled.
/// A figure that fails is kept as reported, bounded to what could be true (so that no
/// impossible number reaches a sum or a plot), and named in `untrusted`.
pub fn checked_loader_figures(r: &LoaderReport, saw: &DaemonSaw) -> Checked {
    let (wait, busy) = (r.wait_ns as f64 / 1e9, r.busy_ns as f64 / 1e9);
    let mut untrusted = Vec::new();
    let mut bounded = |name: &str, value: f64, limit: f64| {
        if value > limit {
            untrusted.push(name.to_string());
            limit
        } else {
            value
        }
    };
    // A seat waits for one slot at a time, while it is attached.
    let wait = bounded(
        "loader_wait_seconds",
        wait,
        saw.loader_seconds + saw.wall + 0.5,
    );
    // Busy is claim to commit, and a claim holds its slot alone: at most every slot all along.
    let busy = bounded(
        "loader_busy_seconds",
        busy,
        saw.wall * f64::from(saw.slots) + 0.5,
    );
    let bad_limit = if saw.skipping {
        saw.samples_possible
    } else {
        0
    };
    let bad_samples = if r.bad_samples > bad_limit {
        untrusted.push("bad_samples_skipped".to_string());
        bad_limit
    } else {
        r.bad_samples
    };
    Checked {
        wait,
        busy,
        bad_samples,
        untrusted,
    }
}

#[cfg(test)]
mod checks {
    use super::*;

    const SAW: DaemonSaw = DaemonSaw {
        wall: 3.4,
        loader_seconds: 6.8,
        samples_possible: 1000,
        slots: 8,
        skipping: false,
    };

    #[test]
    fn what_loaders_could_have_reported_is_believed() {
        let r = LoaderReport {
            wait_ns: 10_000_000_000,
            busy_ns: 20_000_000_000,
            bad_samples: 0,
        };
        let c = checked_loader_figures(&r, &SAW);
        assert_eq!((c.wait, c.busy, c.bad_samples), (10.0, 20.0, 0));
        assert!(c.untrusted.is_empty(), "{c:?}");
        let skipping = DaemonSaw {
            skipping: true,
            ..SAW
        };
        let r = LoaderReport {
            bad_samples: 1000,
            ..r
        };
        let c = checked_loader_figures(&r, &skipping);
        assert_eq!((c.bad_samples, c.untrusted.len()), (1000, 0), "{c:?}");
    }

    #[test]
    fn a_scribbled_loader_table_is_flagged_not_believed() {
        // The figures a scribble made: 162 s of waiting and of work in a 3.4 s run of two
        // loaders, and every sample "skipped" on a kind that never skips.
        let r = LoaderReport {
            wait_ns: 162_000_000_000,
            busy_ns: 162_000_000_000,
            bad_samples: 163_840,
        };
        let c = checked_loader_figures(&r, &SAW);
        assert_eq!(
            c.untrusted,
            [
                "loader_wait_seconds",
                "loader_busy_seconds",
                "bad_samples_skipped"
            ]
        );
        assert!(
            c.wait <= 6.8 + 3.4 + 0.5 && c.busy <= 8.0 * 3.4 + 0.5,
            "{c:?}"
        );
        assert_eq!(c.bad_samples, 0);
        // Skipping, more than the run could have filled is impossible too.
        let skipping = DaemonSaw {
            skipping: true,
            ..SAW
        };
        let c = checked_loader_figures(
            &LoaderReport {
                bad_samples: 1001,
                ..r
            },
            &skipping,
        );
        assert!(
            c.untrusted.contains(&"bad_samples_skipped".to_string()),
            "{c:?}"
        );
        assert_eq!(c.bad_samples, 1000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_names_the_stage_that_makes_others_wait() {
        // Daemon starved most of the interval: loaders are the bottleneck.
        assert_eq!(bound(1.0, 10, 0.8, 0.0, 4.0, 0.1), "loaders");
        // Loaders blocked, uploads busy: upload bound.
        assert_eq!(bound(1.0, 10, 0.0, 3.0, 1.0, 0.9), "upload");
        // Loaders blocked, uploads idle: the consumer holds the buffers.
        assert_eq!(bound(1.0, 10, 0.0, 3.0, 1.0, 0.1), "consumer");
        assert_eq!(bound(1.0, 10, 0.1, 1.0, 3.0, 0.3), "balanced");
        assert_eq!(bound(1.0, 0, 0.0, 0.0, 0.0, 0.0), "idle");
        assert_eq!(bound(0.0, 5, 0.0, 0.0, 1.0, 0.0), "idle");
        // No consumer attached: nothing delivered, the loaders filled the ring and then waited
        // the whole run for slots, the copy engine idle. The consumer is the limit, not the
        // upload, and nothing is balanced about it.
        assert_eq!(bound(60.0, 0, 0.0, 58.0, 0.5, 0.01), "consumer");
        // Every verdict has its sentence.
        for v in [
            "loaders", "upload", "consumer", "balanced", "idle", "unknown",
        ] {
            assert_ne!(explain(v), explain("none"), "{v}");
            assert!(explain(v).starts_with(&v[..4]), "{v}: {}", explain(v));
        }
    }
}
