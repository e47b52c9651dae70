//! The end of a run: close and unlink the ring, build the [`Summary`] (also for a daemon that
//! failed at start), and judge it.

use super::{Daemon, DaemonError, Outcome, RunOptions};
use crate::sink::SinkKind;
use crate::summary::Summary;
use pinring_data::Config;
use pinring_exit::Coded;
use pinring_observe::{bound, checked_loader_figures, Checked, DaemonSaw, LoaderReport};
use pinring_ring::ring_state;

/// What is known of a daemon that stopped before its ring was ready: its settings (with their
/// overrides), or only what its flags said.
#[derive(Debug, Clone, Copy)]
pub enum Known<'a> {
    /// The settings, read and overridden.
    Config(&'a Config),
    /// The flags' overrides (the settings could not be read).
    Flags(&'a pinring_runtime::settings::Overrides),
}

/// The outcome of a daemon that stopped before its ring was ready: a summary with what is known
/// (the config when it loaded, else the flags), nothing delivered, and the error.
pub fn failed_at_start(opts: &RunOptions, known: Known<'_>, error: DaemonError) -> Outcome {
    let (cfg, flags) = match known {
        Known::Config(c) => (Some(c), None),
        Known::Flags(o) => (None, Some(o)),
    };
    let ring = match (cfg, flags.and_then(|o| o.ring.as_ref())) {
        (Some(c), _) => c.ring.name.clone(),
        (None, Some(name)) => name.clone(),
        (None, None) => String::new(),
    };
    let end_seq = cfg
        .and_then(|c| c.plan().ok())
        .map_or(0, |p| p.total_seqs());
    let summary = Summary {
        ring,
        backend: String::new(),
        backend_reason: format!("not started (--backend {})", opts.backend),
        sink: opts.sink.name().into(),
        in_order: cfg.map_or(!flags.is_some_and(|o| o.unordered), |c| c.ring.in_order),
        start_seq: opts.start_seq,
        end_seq,
        missing: end_seq.saturating_sub(opts.start_seq),
        resume_seq: opts.start_seq,
        bound: "none".into(),
        zero_copy: opts.zero_copy,
        ..Default::default()
    };
    Outcome {
        summary,
        started: false,
        result: Err(error),
    }
}

impl Daemon {
    /// The engine's decode counts by way, where this daemon decodes (`Summary::images_decoded`).
    fn decoded_counts(&self) -> std::collections::BTreeMap<String, u64> {
        if !self.core.run.decodes() {
            return Default::default();
        }
        let counts = self.core.uploader.decode_counts();
        counts
            .named()
            .iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect()
    }

    pub(super) fn finish(&mut self, result: &Result<(), DaemonError>) -> Summary {
        self.close_ring();
        let seconds = self
            .core
            .tally
            .last_delivery
            .saturating_duration_since(self.core.tally.started)
            .as_secs_f64();
        // Where to resume comes from the daemon's own books, never from the header (any process
        // that maps the ring can write `next_deliver`).
        let counts = self.recovery.counts;
        let wall = self.core.tally.started.elapsed().as_secs_f64();
        let checked = self.check_loader_figures(wall);
        let s = &self.core.sequencer;
        let (loader_wait, loader_busy) = (checked.wait, checked.busy);
        let daemon_wait = self.core.tally.daemon_wait_ns as f64 / 1e9;
        let sink_busy = self.core.tally.sink_busy_ns as f64 / 1e9;
        let mut summary = Summary {
            ring: self.core.run.cfg.ring.name.clone(),
            backend: self.core.run.backend_name.clone(),
            backend_reason: self.core.run.backend_reason.clone(),
            sink: self.delivery.sink.kind.name().into(),
            in_order: self.core.run.cfg.ring.in_order,
            start_seq: s.start(),
            end_seq: s.end(),
            batches_delivered: s.deliveries() / self.core.run.parts,
            parts_per_batch: self.core.run.parts,
            parts_delivered: s.deliveries(),
            batches_verified: self.core.tally.verified,
            verify_failures: self.core.tally.verify_failures,
            duplicates: s.duplicates(),
            out_of_order: s.out_of_order(),
            missing: s.missing(),
            bytes: self.core.tally.bytes,
            seconds,
            first_batch_seconds: self.core.tally.first_delivery.map(|t| {
                t.saturating_duration_since(self.core.tally.started)
                    .as_secs_f64()
            }),
            gbps: if seconds > 0.0 {
                self.core.tally.bytes as f64 / seconds / 1e9
            } else {
                0.0
            },
            last_delivered_seq: s.highest_delivered(),
            resume_seq: s.resume_seq(),
            delivered_past_resume: s.delivered_past_resume(),
            // The daemon's own counts, never the ring's copies (any process can write those).
            reclaimed: counts.reclaimed,
            rejected: counts.rejected,
            leases_expired: counts.leases_expired,
            bad_batches_skipped: counts.bad_batches_skipped,
            // Loaders count what they substituted; only they know it (checked above).
            bad_samples_skipped: checked.bad_samples,
            reissued: counts.reissued,
            images_decoded: self.decoded_counts(),
            corrupt_descriptors: counts.corrupt_descriptors,
            registration_seconds: self.core.registration.as_ref().map_or(0.0, |r| r.seconds()),
            daemon_wait_seconds: daemon_wait,
            submit_seconds: self.core.tally.submit_ns as f64 / 1e9,
            parts_taken_ahead: self.core.tally.taken_ahead,
            doorbell_wait_seconds: self.core.tally.doorbell_ns as f64 / 1e9,
            loader_wait_seconds: loader_wait,
            loader_busy_seconds: loader_busy,
            sink_busy_seconds: sink_busy,
            bound: if checked.untrusted.iter().any(|f| f.starts_with("loader_")) {
                // The verdict weighs the loaders' time: with that untrusted, there is none.
                "unknown".into()
            } else {
                // Over the whole run, as the wait counters are: a run that delivered nothing
                // still waited (its `seconds`, first to last delivery, are 0).
                bound(
                    wall,
                    s.deliveries(),
                    daemon_wait,
                    loader_wait,
                    loader_busy,
                    self.core.tally.upload_ns as f64 / 1e9,
                )
                .into()
            },
            upload_seconds: self.core.tally.upload_ns as f64 / 1e9,
            untrusted: checked.untrusted.clone(),
            interrupted: self.drain.started(),
            zero_copy: self.core.run.zero_copy,
            registered: self.core.registration.is_some(),
            latency_p50_us: self.core.tally.latencies.quantile_us(0.50),
            latency_p99_us: self.core.tally.latencies.quantile_us(0.99),
            daemon_cpu_seconds: (cpu_seconds() - self.core.tally.cpu_at_ready).max(0.0),
            thread_cpu_seconds: thread_cpu_since(&self.core.tally.threads_at_ready),
            main_loop_passes: self.core.tally.passes,
            main_loop_sleeps: self.core.tally.sleeps,
            main_loop_preempted: match (self.core.tally.preempted_at_ready, preemptions()) {
                (Some(before), Some(now)) => now.saturating_sub(before),
                _ => 0,
            },
            error: result.as_ref().err().map(|e| e.to_string()),
            exit_code: 0,
        };
        if let Some(t) = self.delivery.sink.thread.take() {
            let _ = t.join();
        }
        summary.exit_code = match result {
            Err(e) => e.exit().code(),
            Ok(()) => 0,
        };
        summary
    }

    /// Publishes the last resume point (what a status of the closed ring shows), closes and
    /// unlinks the ring, and stops the sink (joined at the end of [`Daemon::finish`]; the
    /// uploader's own thread stops when the last Arc is dropped with the Daemon).
    fn close_ring(&mut self) {
        self.core.service.stopping("run finished: closing the ring");
        self.core
            .ring
            .publish_resume_seq(self.core.sequencer.resume_seq());
        self.core.ring.set_state(ring_state::CLOSED);
        if let Err(e) = self.core.ring.unlink() {
            tracing::warn!("{e}");
        }
        self.delivery.sink.tx = None;
    }

    /// What loaders report through the ring (their wait and busy time, the samples they
    /// substituted) only they know, and any process can write it: each figure is checked
    /// against what the daemon saw itself in `wall` seconds, and one that fails is listed as
    /// untrusted (and logged).
    fn check_loader_figures(&mut self, wall: f64) -> Checked {
        // Read once, at the end: the same copy of the header views read.
        let h = self.core.ring.snapshot().header;
        self.core
            .tally
            .count_loaders(std::time::Instant::now(), self.core.ring.attached_loaders());
        let s = &self.core.sequencer;
        let checked = checked_loader_figures(
            &LoaderReport {
                wait_ns: h.loader_wait_ns,
                busy_ns: h.loader_busy_ns,
                bad_samples: h.bad_samples_skipped,
            },
            &DaemonSaw {
                wall,
                loader_seconds: self.core.tally.loader_seconds_seen,
                samples_possible: s
                    .deliveries()
                    .saturating_add(u64::from(s.slots()))
                    .saturating_mul(self.core.run.skippable_per_batch()),
                slots: s.slots(),
                skipping: self.core.run.skippable_per_batch() > 0,
            },
        );
        if !checked.untrusted.is_empty() {
            tracing::error!(ring = %self.core.run.cfg.ring.name, figures = %checked.untrusted.join(", "),
                "figures the loaders report through the ring are impossible for what this daemon \
                 saw (another process wrote into the loader table?): the summary lists them as \
                 untrusted");
        }
        checked
    }
}

/// CPU seconds (user + system) this process has used so far, every thread's (the GPU driver's
/// included; child processes' not).
pub fn cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// CPU seconds (user + system) of each thread of this process, by thread id, with its name,
/// from /proc/self/task: where the daemon's CPU goes (its own threads and the GPU driver's).
pub(super) fn thread_cpu() -> std::collections::BTreeMap<i32, (String, f64)> {
    let mut out = std::collections::BTreeMap::new();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Some(stat) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|text| pinring_ring::process::parse_stat(&text))
        else {
            continue;
        };
        out.insert(tid, (stat.comm, (stat.utime + stat.stime) as f64 / ticks));
    }
    out
}

/// Times the calling thread has been preempted so far (its involuntary context switches, from
/// /proc/thread-self/status); None where that cannot be read.
pub(super) fn preemptions() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// CPU seconds of each thread since `at_ready` ([`thread_cpu`] when the ring became ready; a
/// thread started later counts whole), summed by thread name.
fn thread_cpu_since(
    at_ready: &std::collections::BTreeMap<i32, (String, f64)>,
) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (tid, (name, now)) in thread_cpu() {
        let before = at_ready.get(&tid).map_or(0.0, |(_, s)| *s);
        *out.entry(name).or_insert(0.0) += (now - before).max(0.0);
    }
    out
}

/// Turns a finished run into the final result: a verification problem found in the summary is an
/// error even if the loop itself ended cleanly.
pub fn judge(summary: &Summary, sink: SinkKind) -> Result<(), DaemonError> {
    let failed = summary.verify_failures > 0
        || summary.duplicates > 0
        || summary.out_of_order > 0
        || (sink == SinkKind::Verify && !summary.interrupted && summary.missing > 0);
    if failed {
        return Err(DaemonError::Verify {
            ring: summary.ring.clone(),
            first: summary
                .error
                .clone()
                .unwrap_or_else(|| "see the log for each failed batch".into()),
            failures: summary.verify_failures,
            duplicates: summary.duplicates,
            out_of_order: summary.out_of_order,
            missing: summary.missing,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{preemptions, thread_cpu, thread_cpu_since};
    use std::time::{Duration, Instant};

    /// CPU seconds of the calling thread, as `thread_cpu` reads it.
    fn own(name: &str) -> f64 {
        thread_cpu()
            .into_values()
            .filter(|(n, _)| n == name)
            .map(|(_, s)| s)
            .sum()
    }

    #[test]
    fn a_threads_preemptions_are_read_and_never_go_back() {
        // The summary's main_loop_preempted is the difference of two reads on one thread.
        let before = preemptions().expect("/proc/thread-self/status has the count");
        let after = preemptions().expect("read again");
        assert!(after >= before, "{before} then {after}");
    }

    #[test]
    fn thread_cpu_counts_from_the_snapshot_not_from_thread_start() {
        let name = "pinring-cputest";
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Burn CPU until the kernel has counted some (a few clock ticks), take the
                // snapshot, then burn until it has counted more.
                let burn_until = |above: f64| {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let mut x = 0u64;
                    while own(name) <= above {
                        assert!(Instant::now() < deadline, "no CPU time counted in 60 s");
                        for i in 0..100_000u64 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                        }
                    }
                };
                burn_until(0.02);
                // Read in an order that brackets the snapshot: `before` no later than the
                // snapshot, `total` no earlier than `since` (a clock tick may fall between
                // any two reads).
                let before = own(name);
                let snapshot = thread_cpu();
                burn_until(before + 0.02);
                let since = thread_cpu_since(&snapshot)[name];
                let total = own(name);
                // What was burned before the snapshot is left out.
                assert!(
                    since > 0.0 && since <= total - before + 1e-9,
                    "since {since}, total {total}, before {before}"
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
