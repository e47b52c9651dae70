//! `pinring clean`: removes ring segments whose daemon is gone (a daemon killed with SIGKILL, or
//! a crashed host process, leaves its /dev/shm object behind, holding memory).
//!
//! A segment is removed only when its header names a daemon (pid and process start time) that
//! is not running. A segment with a live daemon, or one that cannot be read (still being created,
//! another layout version, not a pinring segment, no permission), is never touched: it is listed
//! with the reason it was kept. The check is repeated right before each removal; a daemon that
//! replaces the same ring name in the instant between that check and the unlink would lose its
//! name, so run clean when no daemon of a stale ring is being started.

use crate::exit::Exit;
use crate::status::{open_read_only, ring_names, StatusError};
use pinring_ring::Segment;

/// `pinring clean` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CleanArgs {
    /// Only these rings (default: every ring in /dev/shm).
    #[arg(value_name = "RING")]
    pub rings: Vec<String>,
    /// List what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// What clean decided for one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The daemon is dead: remove.
    Stale {
        /// The dead daemon's pid.
        daemon_pid: u32,
    },
    /// The daemon runs: keep.
    Live {
        /// Its pid.
        daemon_pid: u32,
    },
    /// Cannot tell: keep.
    Unreadable(String),
}

/// Decides about the ring `name`.
pub fn judge(name: &str) -> Verdict {
    match open_read_only(name) {
        Ok(ring) => {
            let d = ring.daemon();
            if d.is_alive() {
                Verdict::Live { daemon_pid: d.pid }
            } else {
                Verdict::Stale { daemon_pid: d.pid }
            }
        }
        Err(e) => Verdict::Unreadable(e.to_string()),
    }
}

/// Why clean failed.
#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    /// /dev/shm could not be listed.
    #[error(transparent)]
    List(#[from] StatusError),
    /// Some stale segments could not be removed.
    #[error(
        "{failed} stale segment(s) could not be removed (see above); run as their owner or as root"
    )]
    Remove {
        /// How many.
        failed: usize,
    },
}

impl CleanError {
    /// The exit code for this error.
    pub fn exit(&self) -> Exit {
        match self {
            CleanError::List(e) => e.exit(),
            CleanError::Remove { .. } => Exit::Ring,
        }
    }
}

/// Runs `pinring clean`, printing one line per segment.
pub fn run(args: &CleanArgs) -> Result<(), CleanError> {
    let names = if args.rings.is_empty() {
        ring_names()?
    } else {
        let all = ring_names()?;
        for r in &args.rings {
            if !all.contains(r) {
                println!(
                    "absent  {}: no such ring",
                    pinring_ring::object_path(r).display()
                );
            }
        }
        args.rings
            .iter()
            .filter(|r| all.contains(r))
            .cloned()
            .collect()
    };
    if names.is_empty() && args.rings.is_empty() {
        println!("no pinring rings in /dev/shm");
    }
    let mut failed = 0;
    for name in names {
        let path = pinring_ring::object_path(&name);
        match judge(&name) {
            Verdict::Live { daemon_pid } => {
                println!(
                    "keep    {}: daemon pid {daemon_pid} is running",
                    path.display()
                )
            }
            Verdict::Unreadable(why) => println!("keep    {}: {why}", path.display()),
            Verdict::Stale { daemon_pid } if args.dry_run => println!(
                "stale   {}: daemon pid {daemon_pid} is gone (dry run: not removed)",
                path.display()
            ),
            Verdict::Stale { daemon_pid } => {
                // Check again right before removing: a new daemon may have replaced the
                // segment (same name) since it was judged.
                if !matches!(judge(&name), Verdict::Stale { .. }) {
                    println!("keep    {}: replaced by a new daemon", path.display());
                    continue;
                }
                match Segment::unlink(&name) {
                    Ok(()) => println!(
                        "removed {}: daemon pid {daemon_pid} was gone",
                        path.display()
                    ),
                    Err(e) => {
                        failed += 1;
                        tracing::error!("{e}");
                    }
                }
            }
        }
    }
    if failed > 0 {
        return Err(CleanError::Remove { failed });
    }
    Ok(())
}

/// What [`clean_one`] did with one ring.
#[derive(Debug)]
pub enum Cleaned {
    /// There is no segment of that name.
    Absent,
    /// The segment was kept: its daemon runs, or it cannot be judged.
    Kept(Verdict),
    /// The segment's daemon was gone; the segment was removed.
    Removed {
        /// The dead daemon's pid.
        daemon_pid: u32,
    },
    /// The segment's daemon was gone, but the segment could not be removed.
    Failed {
        /// The dead daemon's pid.
        daemon_pid: u32,
        /// Why.
        error: pinring_ring::RingError,
    },
}

/// `pinring clean NAME` for one ring, printing nothing: removes the segment only when
/// [`judge`] finds its daemon gone, twice (the second time right before the unlink).
pub fn clean_one(name: &str) -> Cleaned {
    if !pinring_ring::object_path(name).exists() {
        return Cleaned::Absent;
    }
    match judge(name) {
        // Check again right before removing, as `run` does.
        Verdict::Stale { daemon_pid } => match judge(name) {
            Verdict::Stale { .. } => match Segment::unlink(name) {
                Ok(()) => Cleaned::Removed { daemon_pid },
                Err(error) => Cleaned::Failed { daemon_pid, error },
            },
            other => Cleaned::Kept(other),
        },
        other => Cleaned::Kept(other),
    }
}
