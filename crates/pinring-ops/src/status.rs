//! `pinring status [RING]`: a live view of one ring or of every ring on the host, read from the
//! segment header, the loader table and the slot descriptors. It maps the segment read-only
//! ([`RingView`]): it cannot write a byte of the ring, so it never disturbs the run.
//!
//! Rates and the verdict come from the difference between two snapshots one interval apart
//! (pinring-observe, which the daemon's metrics read too).

use pinring_exit::Exit;
pub use pinring_observe::{open_read_only, Rates, Snapshot};
use pinring_ring::{RingError, RingView};
use serde::Serialize;
use std::fmt::Write as _;

use std::time::Duration;

/// `pinring status` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Ring to show (default: every ring in /dev/shm, and every anonymous ring of an embedded
    /// daemon, found through the descriptors of the processes holding it).
    #[arg(value_name = "RING")]
    pub ring: Option<String>,
    /// Print one JSON document (one measurement interval) and exit.
    #[arg(long)]
    pub json: bool,
    /// Print one view (one measurement interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// Seconds between refreshes (and the measurement interval of rates).
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.05..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "--interval {s:?}: give seconds between 0.05 and 3600"
        )),
    }
}

/// Why `pinring status` failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The ring could not be opened.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// /dev/shm could not be listed.
    #[error("cannot list {dir}: {source}; is /dev/shm mounted?")]
    List {
        /// The directory.
        dir: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// stdout is gone.
    #[error("cannot write the status to stdout: {0}")]
    Output(#[source] std::io::Error),
}

impl pinring_exit::Coded for StatusError {
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            StatusError::Ring(e) => e.exit(),
            StatusError::List { .. } => Exit::Ring,
            StatusError::Output(_) => Exit::Output,
        }
    }
}

/// Names of every ring with a segment in /dev/shm, sorted.
pub fn ring_names() -> Result<Vec<String>, StatusError> {
    let dir = pinring_ring::segment::SHM_DIR;
    let entries = std::fs::read_dir(dir).map_err(|source| StatusError::List { dir, source })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(pinring_ring::segment::NAME_PREFIX)
                .map(str::to_string)
        })
        .filter(|n| pinring_ring::segment::validate_name(n).is_ok())
        .collect();
    names.sort();
    Ok(names)
}

/// A ring to show: named in /dev/shm (`at` None), or anonymous (an embedded daemon's memfd,
/// opened at `at`, `/proc/<pid>/fd/<fd>` of a process holding it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The ring's name.
    pub name: String,
    /// Where an anonymous ring is opened.
    pub at: Option<std::path::PathBuf>,
}

impl Target {
    fn open(&self) -> Result<RingView, RingError> {
        open_read_only(&self.name, self.at.as_deref())
    }
}

/// The anonymous rings on this host ([`pinring_ring::find_anonymous`]), one per ring: each is
/// opened through its daemon's descriptor where that process is one of those holding it (its
/// loaders and consumer hold it too).
pub fn anonymous_rings() -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    let found = pinring_ring::find_anonymous();
    for a in &found {
        if out.iter().any(|t| t.name == a.name) {
            continue;
        }
        let holders: Vec<_> = found.iter().filter(|b| b.name == a.name).collect();
        let daemon_pid = RingView::open(&a.name, Some(&a.path), Duration::ZERO)
            .map(|r| r.daemon().pid)
            .ok();
        let best = holders
            .iter()
            .find(|b| Some(b.pid) == daemon_pid)
            .unwrap_or(&holders[0]);
        out.push(Target {
            name: a.name.clone(),
            at: Some(best.path.clone()),
        });
    }
    out
}

/// Every ring to show: those named in /dev/shm, then the anonymous ones.
pub fn targets() -> Result<Vec<Target>, StatusError> {
    let mut all: Vec<Target> = ring_names()?
        .into_iter()
        .map(|name| Target { name, at: None })
        .collect();
    all.extend(anonymous_rings());
    Ok(all)
}

/// Ring `name`: named in /dev/shm if it is there, else an anonymous ring of that name.
fn target(name: &str) -> Target {
    if !pinring_ring::object_path(name).exists() {
        if let Some(t) = anonymous_rings().into_iter().find(|t| t.name == name) {
            return t;
        }
    }
    Target {
        name: name.to_string(),
        at: None,
    }
}

/// One ring in a view: its snapshot and rates, or why it could not be read.
#[derive(Debug, Serialize)]
pub struct RingReport {
    /// Ring name.
    pub ring: String,
    /// Where an anonymous ring was opened (`/proc/<pid>/fd/<fd>`); absent for a ring named in
    /// /dev/shm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anonymous: Option<String>,
    /// The latest snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    /// Rates over the last interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rates: Option<Rates>,
    /// Why the ring could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Renders every ring of the host one line each (`pinring status` with no ring named): its
/// name, state, device, daemon, live loaders, rates, progress and where it is bound.
pub fn render_table(reports: &[RingReport]) -> String {
    let mut s = String::new();
    if reports.is_empty() {
        s.push_str("no pinring rings (none in /dev/shm, no anonymous ones)\n");
        return s;
    }
    let width = reports
        .iter()
        .map(|r| r.ring.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "{:width$}  {:8}  {:7}  {:>8}  {:>7}  {:>8}  {:>8}  {:>9}  {:>17}  BOUND",
        "RING",
        "STATE",
        "DEVICE",
        "DAEMON",
        "LOADERS",
        "IN GB/s",
        "OUT GB/s",
        "BATCHES/S",
        "DELIVERED"
    );
    for r in reports {
        let (Some(snap), Some(rates)) = (&r.snapshot, &r.rates) else {
            let _ = writeln!(
                s,
                "{:width$}  unreadable: {}",
                r.ring,
                r.error.as_deref().unwrap_or("?")
            );
            continue;
        };
        let daemon = if snap.daemon_alive {
            snap.daemon_pid.to_string()
        } else {
            "gone".into()
        };
        let bound = if !snap.daemon_alive {
            "stale (pinring clean)"
        } else if snap.stalled.is_some() {
            "STALLED (no loader)"
        } else {
            rates.bound
        };
        let _ = writeln!(
            s,
            "{:width$}  {:8}  {:7}  {:>8}  {:>7}  {:>8.2}  {:>8.2}  {:>9.0}  {:>17}  {}",
            snap.ring,
            snap.state,
            snap.device.as_deref().unwrap_or("-"),
            daemon,
            snap.loaders.iter().filter(|l| l.alive).count(),
            rates.gbps_in,
            rates.gbps_out,
            rates.batches_per_second,
            format!(
                "{}/{}",
                snap.delivered,
                snap.end_seq.saturating_sub(snap.start_seq)
            ),
            bound
        );
    }
    s
}

/// Renders a report as the text view.
pub fn render(reports: &[RingReport]) -> String {
    let mut s = String::new();
    if reports.is_empty() {
        s.push_str("no pinring rings (none in /dev/shm, no anonymous ones)\n");
    }
    for r in reports {
        let (Some(snap), Some(rates)) = (&r.snapshot, &r.rates) else {
            let _ = writeln!(
                s,
                "ring {}: unreadable: {}\n",
                r.ring,
                r.error.as_deref().unwrap_or("?")
            );
            continue;
        };
        render_ring(&mut s, r, snap, rates);
        s.push('\n');
    }
    s
}

/// Renders one readable ring of the text view into `s`: its header, rates, faults, slots,
/// consumer and loaders.
fn render_ring(s: &mut String, r: &RingReport, snap: &Snapshot, rates: &Rates) {
    let daemon = if snap.daemon_alive {
        format!("daemon pid {}", snap.daemon_pid)
    } else {
        format!(
            "daemon pid {} NOT RUNNING (stale: pinring clean)",
            snap.daemon_pid
        )
    };
    let _ = writeln!(
        s,
        "ring {}  {}  {}{}  {} slots x {} KiB{}",
        snap.ring,
        snap.state,
        daemon,
        snap.device
            .as_deref()
            .map(|d| format!("  device {d}"))
            .unwrap_or_default(),
        snap.slot_count,
        snap.slot_bytes / 1024,
        r.anonymous
            .as_deref()
            .map(|at| format!("  anonymous ({at})"))
            .unwrap_or_default()
    );
    if let Some(st) = snap.stalled {
        let _ = writeln!(
            s,
            "  STALLED: work left and no loader attached for {:.1} s; seq {} waits (start loaders: pinring-loader --ring {})",
            st.seconds, st.seq, snap.ring
        );
    }
    let total = snap.end_seq.saturating_sub(snap.start_seq);
    let _ = writeln!(
        s,
        "  in {:.2} GB/s  out {:.2} GB/s  {:.0} batches/s  delivered {}/{}  resume at seq {}  reclaimed {}  rejected {}",
        rates.gbps_in, rates.gbps_out, rates.batches_per_second, snap.delivered, total,
        snap.resume_seq, snap.reclaimed, snap.rejected
    );
    let faults = snap.leases_expired
        + snap.bad_batches_skipped
        + snap.bad_samples_skipped
        + snap.corrupt_descriptors
        + snap.hung_loaders
        + snap.quarantined;
    if faults > 0 {
        let _ = writeln!(
            s,
            "  faults: {} hung loaders now (last pid {}), {} leases expired, {} slots quarantined now, {} seqs reissued, {} bad batches skipped, {} bad samples replaced with zeros, {} corrupt descriptors",
            snap.hung_loaders,
            snap.last_hung_pid,
            snap.leases_expired,
            snap.quarantined,
            snap.reissued,
            snap.bad_batches_skipped,
            snap.bad_samples_skipped,
            snap.corrupt_descriptors
        );
    }
    let c = snap.slots;
    let _ = writeln!(
        s,
        "  slots: free {}  claimed {}  ready {}  uploading {}  idle {}{}",
        c.free,
        c.claimed,
        c.ready,
        c.uploading,
        c.idle,
        if c.invalid > 0 {
            format!("  INVALID {}", c.invalid)
        } else {
            String::new()
        }
    );
    if let Some(cv) = &snap.consumer {
        let _ = writeln!(
            s,
            "  consumer: {}  copies by the {}  taken {}  buffers {}: {} waiting, {} held  \
             reclaimed {}",
            if cv.attached {
                format!("pid {} attached", cv.pid)
            } else {
                "none attached".to_string()
            },
            cv.copies,
            cv.taken,
            cv.buffers,
            cv.waiting,
            cv.held,
            cv.reclaimed
        );
    }
    let _ = writeln!(s, "  bound by: {}", rates.bound);
    if !snap.untrusted.is_empty() || snap.loaders.iter().any(|l| l.untrusted) {
        let _ = writeln!(
            s,
            "  untrusted: {}: impossible for what the daemon saw (another process wrote into the ring's loader table?); shown bounded to what could be true",
            snap.untrusted
                .iter()
                .map(String::as_str)
                .chain(snap.loaders.iter().any(|l| l.untrusted).then_some("loader entries marked !"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    render_loaders(s, snap);
}

/// Renders a ring's loader table into `s`.
fn render_loaders(s: &mut String, snap: &Snapshot) {
    let _ = writeln!(
        s,
        "  {:>5} {:>8} {:>10} {:>10} {:>9} {:>9}  now",
        "#", "pid", "batches", "GB", "busy s", "wait s"
    );
    for l in &snap.loaders {
        let _ = writeln!(
            s,
            "  {:>5} {:>8} {:>10} {:>10.2} {:>9.1} {:>9.1}{} {}",
            l.index,
            l.pid,
            l.batches,
            l.bytes as f64 / 1e9,
            l.busy_seconds,
            l.wait_seconds,
            if l.untrusted { "!" } else { " " },
            if !l.alive {
                "dead"
            } else if l.busy_now {
                "busy"
            } else {
                "waiting"
            }
        );
    }
    if snap.loaders.is_empty() {
        s.push_str("  (no loaders attached)\n");
    }
}

/// Takes one interval's view of `targets`.
fn measure(targets: &[Target], interval: Duration) -> Vec<RingReport> {
    let opened: Vec<(&Target, Result<RingView, RingError>)> =
        targets.iter().map(|t| (t, t.open())).collect();
    let first: Vec<Option<Snapshot>> = opened
        .iter()
        .map(|(_, r)| r.as_ref().ok().map(|v| Snapshot::take(&v.snapshot())))
        .collect();
    // The measurement window of the rates; nothing is waited for.
    std::thread::sleep(interval);
    opened
        .into_iter()
        .zip(first)
        .map(|((target, opened), first)| {
            let ring = target.name.clone();
            let anonymous = target.at.as_ref().map(|p| p.display().to_string());
            match (opened, first) {
                (Ok(r), Some(a)) => {
                    let b = Snapshot::take(&r.snapshot());
                    RingReport {
                        ring,
                        anonymous,
                        rates: Some(Rates::between(&a, &b)),
                        snapshot: Some(b),
                        error: None,
                    }
                }
                (Err(e), _) => RingReport {
                    ring,
                    anonymous,
                    snapshot: None,
                    rates: None,
                    error: Some(e.to_string()),
                },
                (Ok(_), None) => unreachable!("a snapshot is taken of every opened ring"),
            }
        })
        .collect()
}

/// Runs `pinring status`.
pub fn run(
    args: &StatusArgs,
    shutdown: &pinring_runtime::shutdown::Shutdown,
) -> Result<(), StatusError> {
    let interval = Duration::from_secs_f64(args.interval);
    let live = !(args.json || args.once);
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let targets = match &args.ring {
            Some(n) => {
                let t = target(n);
                // A named ring that does not exist is an error (not an empty view).
                if !live {
                    t.open()?;
                }
                vec![t]
            }
            None => targets()?,
        };
        let reports = measure(&targets, interval);
        if args.json {
            let json = serde_json::to_string_pretty(&reports)
                .map_err(|e| StatusError::Output(std::io::Error::other(e)))?;
            pinring_runtime::outln!("{json}");
            return Ok(());
        }
        let text = if args.ring.is_some() {
            render(&reports)
        } else {
            render_table(&reports)
        };
        if live && terminal {
            // Clear the screen and home the cursor, like top.
            pinring_runtime::out!("\x1b[2J\x1b[H{text}");
        } else if live {
            // Into a pipe or a file: one view after the other, a blank line between, with no
            // terminal codes for the reader to strip.
            pinring_runtime::out!("{text}\n");
        } else {
            pinring_runtime::out!("{text}");
        }
        // A reader that went away (`pinring status | head`) ends the view quietly.
        if !live || shutdown.requested() || pinring_runtime::output::stdout_closed() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private two-slot ring for seqs `seqs`, and its name (the test removes it).
    fn test_ring(
        tag: &str,
        seqs: std::ops::Range<u64>,
        in_order: bool,
    ) -> (String, pinring_ring::DaemonRing) {
        ring_of(tag, seqs, in_order, false)
    }

    /// [`test_ring`], named in /dev/shm or `anonymous`.
    fn ring_of(
        tag: &str,
        seqs: std::ops::Range<u64>,
        in_order: bool,
        anonymous: bool,
    ) -> (String, pinring_ring::DaemonRing) {
        let name = format!("status-{tag}-{}", std::process::id());
        let ring = pinring_ring::DaemonRing::create(&pinring_ring::CreateOptions {
            name: name.clone(),
            slots: 2,
            slot_bytes: 4096,
            mode: 0o600,
            group: None,
            fingerprint: 1,
            settings: [0; pinring_ring::layout::SETTINGS_WORDS],
            start_seq: seqs.start,
            end_seq: seqs.end,
            in_order,
            replace: false,
            handoff: None,
            anonymous,
        })
        .unwrap();
        (name, ring)
    }

    #[test]
    fn an_anonymous_ring_is_found_shown_and_opened_by_name() {
        let (name, ring) = ring_of("anon", 0..8, true, true);
        let all = targets().unwrap();
        let t = all.iter().find(|t| t.name == name).expect("listed");
        assert_eq!(t.at.as_deref(), Some(ring.segment().path().as_path()));
        // `pinring status NAME` finds it without /dev/shm.
        assert_eq!(&target(&name), t);
        let reports = measure(std::slice::from_ref(t), Duration::from_millis(1));
        assert!(reports[0].error.is_none(), "{:?}", reports[0].error);
        let text = render(&reports);
        assert!(text.contains(&format!("ring {name}")), "{text}");
        assert!(text.contains("anonymous (/proc/"), "{text}");
        // Every ring of the host, one line each.
        let table = render_table(&reports);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert!(
            lines[0].starts_with("RING") && lines[0].contains("DEVICE"),
            "{table}"
        );
        assert!(
            lines[1].starts_with(&name) && lines[1].contains(" 0/"),
            "{table}"
        );
        let json = serde_json::to_string(&reports).unwrap();
        assert!(json.contains("\"anonymous\":\"/proc/"), "{json}");
    }

    #[test]
    fn a_hung_loader_shows_in_the_view_and_in_the_json() {
        let (name, ring) = test_ring("health", 0..4, true);
        let report = |snap: Snapshot| RingReport {
            ring: name.clone(),
            anonymous: None,
            rates: Some(Rates::between(&snap, &snap)),
            snapshot: Some(snap),
            error: None,
        };
        let clean = render(&[report(Snapshot::take(&ring.snapshot()))]);
        assert!(!clean.contains("faults"), "{clean}");
        // What a daemon with a hung loader publishes.
        ring.publish_quarantine(1, 1);
        ring.publish_hung_pid(4242);
        ring.publish_faults(&pinring_ring::FaultCounts {
            leases_expired: 1,
            ..Default::default()
        });
        let snap = Snapshot::take(&ring.snapshot());
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(json["hung_loaders"], 1);
        assert_eq!(json["last_hung_pid"], 4242);
        let text = render(&[report(snap)]);
        assert!(
            text.contains("1 hung loaders now (last pid 4242)"),
            "{text}"
        );
        let _ = pinring_ring::Segment::unlink(&name);
    }

    #[test]
    fn the_resume_point_the_daemon_publishes_shows_in_the_view_and_in_the_json() {
        let (name, ring) = test_ring("resume", 5..40, false);
        // A new ring resumes at its first seq; then wherever the daemon says.
        assert_eq!(Snapshot::take(&ring.snapshot()).resume_seq, 5);
        ring.publish_resume_seq(17);
        let snap = Snapshot::take(&ring.snapshot());
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(json["resume_seq"], 17);
        let text = render(&[RingReport {
            ring: name.clone(),
            anonymous: None,
            rates: Some(Rates::between(&snap, &snap)),
            snapshot: Some(snap),
            error: None,
        }]);
        assert!(text.contains("resume at seq 17"), "{text}");
        let _ = pinring_ring::Segment::unlink(&name);
    }
}
