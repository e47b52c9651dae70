//! Opening a ring as its daemon's peer: [`attach`] waits for a ring of that name to exist, be
//! READY and have a live daemon, which every loader, consumer and status view does first.

use crate::error::{seconds, start_daemon};
use crate::{ring_state, Access, Ring, RingError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What a wait for a ring waits for, told once as the wait starts ([`attach_at_unless`]'s
/// `waiting`), so that a person does not watch a silent process for the whole wait: no ring of
/// that name, or one whose daemon is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Ring name.
    pub name: String,
    /// Its segment's path.
    pub path: PathBuf,
    /// The whole wait.
    pub wait: Duration,
    /// A segment is there, but the daemon it names (this pid) is not running.
    pub stale_daemon: Option<u32>,
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, path) = (&self.name, self.path.display());
        match self.stale_daemon {
            None => write!(f, "waiting for ring {name:?} ({path}) to appear: ")?,
            Some(pid) => write!(
                f,
                "waiting for ring {name:?} ({path}): the segment there is stale, its daemon \
                 (pid {pid}) is not running: "
            )?,
        }
        write!(
            f,
            "{}; giving up in {}",
            start_daemon(name),
            seconds(self.wait.as_millis() as u64)
        )
    }
}

/// Longest single wait inside [`attach`] between two looks at the stop request.
const ATTACH_SLICE: Duration = Duration::from_millis(100);

/// Opens the ring, waiting up to `wait` for it to appear and become ready. A segment whose
/// daemon is no longer running (left behind by a crash, about to be replaced by the next daemon)
/// is not attached to: the wait goes on for a live one.
pub fn attach(name: &str, access: Access, wait: Duration) -> Result<Ring, RingError> {
    match attach_unless(name, access, wait, || false)? {
        Some(ring) => Ok(ring),
        // Cannot happen (`|| false` never asks to stop); an error all the same, not a panic.
        None => Err(RingError::NotReady {
            name: name.to_string(),
            waited_ms: 0,
            state: "stop requested",
        }),
    }
}

/// [`attach`], giving up (`Ok(None)`) as soon as `stop` says so: it is asked at least every
/// 100 ms, so a SIGTERM reaches a loader that waits for its ring as quickly as a working one.
pub fn attach_unless(
    name: &str,
    access: Access,
    wait: Duration,
    stop: impl Fn() -> bool,
) -> Result<Option<Ring>, RingError> {
    attach_at_unless(name, None, access, wait, stop, |_| {})
}

/// [`attach_unless`]; with `at`, the anonymous ring there (its daemon's
/// `/proc/<pid>/fd/<fd>`, [`crate::Segment::open_at`]) instead of the one named in /dev/shm.
/// When the wait has to go on because no ring of that name exists, or its daemon is gone,
/// `waiting` is told so, once, before the first pause. A ring that never appeared is
/// [`RingError::NeverAppeared`], naming the wait.
pub fn attach_at_unless(
    name: &str,
    at: Option<&std::path::Path>,
    access: Access,
    wait: Duration,
    stop: impl Fn() -> bool,
    waiting: impl FnOnce(&Waiting),
) -> Result<Option<Ring>, RingError> {
    let start = Instant::now();
    let mut waiting = Some(waiting);
    loop {
        if stop() {
            return Ok(None);
        }
        let slice = wait.saturating_sub(start.elapsed()).min(ATTACH_SLICE);
        let outcome = Ring::open_at(name, at, access, slice).and_then(|ring| {
            ring.wait_ready(slice)?;
            Ok(ring)
        });
        // The daemon may not have created the ring yet, or not replaced a stale one: retry
        // until the deadline. There is no futex to wait on before the segment exists, so this
        // polls the name.
        let daemon_alive = |ring: &Ring| ring.daemon_alive().unwrap_or(false);
        // An anonymous ring (`at`) is handed out only once it exists, and no other daemon can
        // take its place: gone, or with its daemon gone, it never comes back, and waiting for it
        // would keep a loader of a dead training process alive for the whole wait.
        let named = at.is_none();
        let retry = match &outcome {
            Ok(ring) => named && (!daemon_alive(ring) || ring.state() == ring_state::CLOSED),
            Err(RingError::NotFound { .. }) => named,
            // A version word another process scribbled (the daemon restores it), or a ring not
            // READY within this slice (the daemon is registering it): the deadline decides. A
            // file that is too short is never a daemon mid-creation (a segment gets its name
            // only once it is complete), so it is an error at once, like any other.
            Err(RingError::NotInitialised { .. } | RingError::NotReady { .. }) => true,
            Err(_) => false,
        };
        if !retry || start.elapsed() >= wait {
            let waited_ms = start.elapsed().as_millis() as u64;
            return match outcome {
                Ok(ring) if !daemon_alive(&ring) => Err(RingError::NotReady {
                    name: name.to_string(),
                    waited_ms,
                    state: "stale: its daemon is not running",
                }),
                // The last slice's error, with the whole wait.
                Err(RingError::NotInitialised { name, path, .. }) => {
                    Err(RingError::NotInitialised {
                        name,
                        path,
                        waited_ms,
                    })
                }
                Err(RingError::NotReady { name, state, .. }) => Err(RingError::NotReady {
                    name,
                    waited_ms,
                    state,
                }),
                Err(RingError::NotFound { name, path }) if !wait.is_zero() => {
                    Err(RingError::NeverAppeared {
                        name,
                        path,
                        wait_ms: wait.as_millis() as u64,
                    })
                }
                other => other.map(Some),
            };
        }
        let told = match &outcome {
            Err(RingError::NotFound { .. }) => Some(None),
            Ok(ring) if !daemon_alive(ring) => Some(Some(ring.daemon().pid)),
            _ => None,
        };
        if let Some(stale_daemon) = told {
            if let Some(tell) = waiting.take() {
                tell(&Waiting {
                    name: name.to_string(),
                    path: crate::object_path(name),
                    wait,
                    stale_daemon,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment a daemon has created but not yet published (all zeros, as right after
    /// `fallocate`) is waited for until the deadline, not given up on after one slice.
    #[test]
    fn attach_waits_the_whole_deadline_for_a_segment_still_being_created() {
        let name = format!("ut-attach-init-{}", std::process::id());
        let path = crate::object_path(&name);
        std::fs::write(&path, vec![0u8; crate::layout::HEADER_BYTES]).unwrap();
        let wait = Duration::from_millis(600);
        let start = Instant::now();
        let outcome = attach(&name, Access::ReadOnly, wait);
        let took = start.elapsed();
        let _ = std::fs::remove_file(&path);
        match outcome {
            Err(RingError::NotInitialised { waited_ms, .. }) => {
                assert!(waited_ms >= 600, "reports the whole wait: {waited_ms} ms")
            }
            other => panic!("expected NotInitialised, got {other:?}"),
        }
        assert!(took >= wait, "gave up after {took:?}");
    }

    /// A missing ring is said at once, once, and the error at the end names the same wait.
    #[test]
    fn a_missing_ring_is_told_once_as_the_wait_starts_and_named_at_its_end() {
        let name = format!("ut-attach-told-{}", std::process::id());
        let mut told = Vec::new();
        let outcome = attach_at_unless(
            &name,
            None,
            Access::ReadOnly,
            Duration::from_millis(300),
            || false,
            |w| told.push(w.clone()),
        );
        assert_eq!(told.len(), 1, "{told:?}");
        let path = crate::object_path(&name);
        assert_eq!(
            told[0].to_string(),
            format!(
                "waiting for ring \"{name}\" ({}) to appear: start its daemon (pinring-daemon \
                 --ring {name} ..., or systemctl start pinring-daemon@{name}); giving up in 0.3 s",
                path.display()
            )
        );
        let e = outcome.expect_err("no ring").to_string();
        assert!(
            e.contains(&format!(
                "ring \"{name}\" does not exist ({})",
                path.display()
            )) && e.contains("waited 0.3 s for it to appear"),
            "{e}"
        );
    }

    #[test]
    fn attach_unless_gives_up_at_once_when_asked_to_stop() {
        let name = format!("ut-attach-stop-{}", std::process::id());
        let start = Instant::now();
        let outcome = attach_unless(&name, Access::ReadOnly, Duration::from_secs(30), || true);
        assert!(matches!(outcome, Ok(None)), "{outcome:?}");
        // It returns at the first look (the wait was 30 s); 10 s allows a loaded machine.
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}
