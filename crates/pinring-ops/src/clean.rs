//! `pinring clean`: removes ring segments whose daemon is gone (a daemon killed with SIGKILL, or
//! a crashed host process, leaves its /dev/shm object behind, holding memory).
//!
//! A segment is removed only when it is a ring of this layout and no daemon holds its lock (the
//! kernel's word, never a pid in the header: see `pinring_ring::lock`). Anything else (a live
//! daemon's ring, a ring of another layout version, a file that is not a ring, a FIFO) is kept and
//! listed with the reason. The file is held with a shared lock from the check to the unlink, and
//! only the file that was checked is unlinked, so a daemon starting on the same name at that
//! moment never loses its segment.

use crate::status::{ring_names, StatusError};
use pinring_exit::Exit;
use pinring_ring::segment::{clean_if_stale, validate_name, Cleaning};
use pinring_ring::RingError;

/// The tail of a clean line for a ring whose header is corrupt.
fn corrupt_note(corrupt: Option<&str>) -> String {
    corrupt.map_or(String::new(), |what| {
        format!("; its header was corrupt ({what}): some process wrote into it")
    })
}

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

/// Why clean failed.
#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    /// /dev/shm could not be listed.
    #[error(transparent)]
    List(#[from] StatusError),
    /// A ring name on the command line is not a valid name.
    #[error(transparent)]
    Name(RingError),
    /// Some stale segments could not be removed.
    #[error(
        "{failed} stale segment(s) could not be removed (see above); run as their owner or as root"
    )]
    Remove {
        /// How many.
        failed: usize,
    },
    /// A ring named on the command line could not be opened, so whether it is live or stale
    /// could not be told.
    #[error(
        "{unchecked} ring(s) named could not be checked: this user cannot open them (see above); \
         run as their owner or as root"
    )]
    Unchecked {
        /// How many.
        unchecked: usize,
    },
}

impl pinring_exit::Coded for CleanError {
    fn exit(&self) -> pinring_exit::Exit {
        match self {
            CleanError::List(e) => e.exit(),
            CleanError::Name(_) | CleanError::Remove { .. } | CleanError::Unchecked { .. } => {
                Exit::Ring
            }
        }
    }
}

/// Runs `pinring clean`, printing one line per segment.
pub fn run(args: &CleanArgs) -> Result<(), CleanError> {
    for r in &args.rings {
        validate_name(r).map_err(CleanError::Name)?;
    }
    // Every ring in /dev/shm is looked at when none is named: another user's there is theirs to
    // clean, and is listed, not counted as a failure. One named that cannot be checked is.
    let named = !args.rings.is_empty();
    let names = if args.rings.is_empty() {
        let all = ring_names()?;
        if all.is_empty() {
            pinring_runtime::outln!("no pinring rings in /dev/shm");
        }
        all
    } else {
        args.rings.clone()
    };
    let (mut failed, mut unchecked) = (0, 0);
    for name in names {
        let path = pinring_ring::object_path(&name);
        match clean_if_stale(&name, !args.dry_run) {
            Ok(Cleaning::Live { daemon_pid }) => pinring_runtime::outln!(
                "keep    {}: its daemon (pid {daemon_pid}) is running",
                path.display()
            ),
            Ok(Cleaning::Kept(why)) => pinring_runtime::outln!("keep    {}: {why}", path.display()),
            Ok(Cleaning::Stale {
                daemon_pid,
                removed: false,
                corrupt,
                owner,
            }) => pinring_runtime::outln!(
                "stale   {}: its daemon (pid {daemon_pid}) is gone{}{} (dry run: not removed)",
                path.display(),
                owner_note(owner),
                corrupt_note(corrupt.as_deref())
            ),
            Ok(Cleaning::Stale {
                daemon_pid,
                corrupt,
                owner,
                ..
            }) => pinring_runtime::outln!(
                "removed {}: its daemon (pid {daemon_pid}) was gone{}{}",
                path.display(),
                owner_note(owner),
                corrupt_note(corrupt.as_deref())
            ),
            Ok(Cleaning::Unreadable { owner, mode }) => {
                if named {
                    unchecked += 1;
                }
                pinring_runtime::outln!(
                    "unknown {}: owned by {} with mode {mode:04o}, which this user (uid {}) \
                     cannot open, so whether its daemon runs cannot be told; kept (run as its \
                     owner or as root to check it)",
                    path.display(),
                    user(owner),
                    nix::unistd::geteuid().as_raw()
                )
            }
            Err(RingError::NotFound { .. }) => {
                pinring_runtime::outln!("absent  {}: no such ring", path.display())
            }
            Err(e @ RingError::PermissionDenied { .. }) => {
                failed += 1;
                tracing::error!("{e}");
            }
            Err(e) => pinring_runtime::outln!("keep    {}: {e}", path.display()),
        }
    }
    if failed > 0 {
        return Err(CleanError::Remove { failed });
    }
    if unchecked > 0 {
        return Err(CleanError::Unchecked { unchecked });
    }
    Ok(())
}

/// `uid N (name)`, or `uid N` where the user database has no name for it.
fn user(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("uid {uid} ({})", u.name),
        _ => format!("uid {uid}"),
    }
}

/// The tail of a stale ring's line when it belongs to another user (root cleaning): whose it was.
fn owner_note(owner: u32) -> String {
    if owner == nix::unistd::geteuid().as_raw() {
        String::new()
    } else {
        format!(" (it belonged to {})", user(owner))
    }
}

/// What [`clean_one`] did with one ring.
#[derive(Debug)]
pub enum Cleaned {
    /// There is no segment of that name.
    Absent,
    /// A live daemon holds it: kept.
    Live {
        /// The pid its header names.
        daemon_pid: u32,
    },
    /// Kept: not a ring of this layout (the reason).
    Kept(String),
    /// The segment's daemon was gone; the segment was removed.
    Removed {
        /// The dead daemon's pid.
        daemon_pid: u32,
    },
    /// It could not be judged or removed.
    Failed {
        /// Why.
        error: RingError,
    },
}

/// `pinring clean NAME` for one ring, printing nothing: removes the segment only if it is a ring
/// of this layout whose daemon is gone (see the module docs for why the check and the removal
/// cannot be raced).
pub fn clean_one(name: &str) -> Cleaned {
    match clean_if_stale(name, true) {
        Ok(Cleaning::Live { daemon_pid }) => Cleaned::Live { daemon_pid },
        Ok(Cleaning::Stale { daemon_pid, .. }) => Cleaned::Removed { daemon_pid },
        Ok(Cleaning::Kept(why)) => Cleaned::Kept(why),
        Ok(Cleaning::Unreadable { owner, mode }) => Cleaned::Kept(format!(
            "owned by {} with mode {mode:04o}, which this user cannot open",
            user(owner)
        )),
        Err(RingError::NotFound { .. }) => Cleaned::Absent,
        Err(error) => Cleaned::Failed { error },
    }
}
