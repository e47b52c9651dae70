//! Child processes of a pinring program and their supervision: how a child ended
//! ([`Ended`]), children that die with their parent ([`stop_with_parent`]) and are stopped and
//! reaped on every path ([`Children`]), and the restart policy of loader children
//! ([`Supervisor`]): a loader killed by a signal is started again, up to [`MAX_RESTARTS`] times
//! within [`RESTART_WINDOW`]; one that exits 0 or 5 is left to its daemon's end; any other code
//! stops the run. `pinring run`, `pinring bench` and the Python package's `pinring.Loader(loaders=N)`
//! (`_native.Supervisor`) follow the same books.

use pinring_exit::Exit;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal {
        /// The signal number.
        signal: i32,
        /// Whether it dumped core.
        core: bool,
    },
}

impl Ended {
    /// From a reaped status.
    pub fn of(status: ExitStatus) -> Ended {
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(signal)) => Ended::Signal {
                signal,
                core: status.core_dumped(),
            },
            // Neither: not a status of a reaped process; report it as the bug it would be.
            (None, None) => Ended::Code(i32::from(Exit::Internal.code())),
        }
    }

    /// `run`'s exit code for a daemon that ended this way without a summary: its own code
    /// where it is a documented one, else "peer died".
    pub fn exit(self) -> Exit {
        match self {
            Ended::Code(code) => Exit::from_code(code).unwrap_or(Exit::PeerDied),
            Ended::Signal { .. } => Exit::PeerDied,
        }
    }

    /// Where to look for the reason.
    pub fn hint(self) -> &'static str {
        match self {
            Ended::Code(_) => " (its error is printed above)",
            Ended::Signal { .. } => "",
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Ended::Code(code) => match Exit::from_code(code) {
                Some(e) => write!(f, "exited with code {code} ({})", e.name()),
                None => write!(f, "exited with code {code}"),
            },
            Ended::Signal { signal, core } => {
                let name = nix::sys::signal::Signal::try_from(signal)
                    .map(|s| s.as_str())
                    .unwrap_or("an unknown signal");
                write!(f, "was killed by signal {signal} ({name})")?;
                if core {
                    write!(f, " and dumped core")?;
                }
                Ok(())
            }
        }
    }
}

/// Makes the child that `cmd` starts receive SIGTERM when its parent, this process, dies,
/// however it dies (SIGKILL included): the daemon then drains and removes its segment, a
/// loader detaches and exits.
///
/// The kernel sends the parent-death signal when the *thread* that forked the child exits, not
/// the process: spawn such commands only from a thread that lives as long as this process
/// (`run` and `bench` spawn every child from the thread that called them, the main thread of
/// `pinring`).
pub fn stop_with_parent(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    let in_child = move || -> std::io::Result<()> {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
        // The parent may have died between the fork and the prctl; then no signal will come,
        // and the child (reparented) must not start at all.
        if nix::unistd::getppid() != parent {
            return Err(nix::errno::Errno::ESRCH.into());
        }
        Ok(())
    };
    // SAFETY: `pre_exec` runs the closure in the forked child before exec, where only
    // async-signal-safe work is allowed. The closure makes two system calls that are
    // async-signal-safe (prctl(PR_SET_PDEATHSIG), getppid), compares two integers and builds
    // an io::Error from an errno value (no allocation); it takes no lock and touches no heap
    // memory. It captures only a pid (Copy).
    unsafe { cmd.pre_exec(in_child) };
}

/// Child processes that are stopped (SIGTERM, which every pinring process handles within
/// 100 ms, and a loader blocked in a system call within its 0.9 s stop deadline) and reaped
/// when this goes out of scope, on every path. One still there [`CHILD_STOP_GRACE`] after the
/// SIGTERM is SIGKILLed, so that dropping this never waits forever.
#[derive(Debug)]
pub struct Children(pub Vec<Child>);

/// How long [`Children`]' drop waits for its children after SIGTERM before it SIGKILLs them.
pub const CHILD_STOP_GRACE: Duration = Duration::from_secs(3);

impl Drop for Children {
    fn drop(&mut self) {
        let signal = |c: &Child, sig| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        };
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                signal(c, nix::sys::signal::Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + CHILD_STOP_GRACE;
        for c in &mut self.0 {
            // Reaped as soon as it exits; looked at every 10 ms until the deadline.
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(c.try_wait(), Ok(None)) {
                tracing::warn!(pid = c.id(), "a child did not stop on SIGTERM: killing it");
                signal(c, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

/// A loader killed more often than this within [`RESTART_WINDOW`] is not restarted again: the
/// run stops, naming it (something kills it as fast as it starts).
pub const MAX_RESTARTS: usize = 5;
/// The window [`MAX_RESTARTS`] counts in.
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// A loader child that ended in a way that stops the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderFailed {
    /// Its index among `run`'s loaders.
    pub index: usize,
    /// Its pid.
    pub pid: u32,
    /// How it ended.
    pub ended: Ended,
    /// Whether it was killed too often to be restarted again.
    pub gave_up: bool,
}

impl pinring_exit::Coded for LoaderFailed {
    /// The run's exit code: the loader's own (3 for bad data, 8 refused, ...), or "peer died"
    /// for a loader killed too often.
    fn exit(&self) -> pinring_exit::Exit {
        if self.gave_up {
            Exit::PeerDied
        } else {
            self.ended.exit()
        }
    }
}

impl LoaderFailed {
    /// What happened, in one sentence, without where to look for the loader's own error.
    pub fn sentence(&self) -> String {
        let (i, pid, ended) = (self.index, self.pid, self.ended);
        if self.gave_up {
            format!(
                "loader {i} (pid {pid}) {ended}, after {MAX_RESTARTS} restarts within {} s: \
                 not restarted again (look for what kills it: the OOM killer, a watchdog)",
                RESTART_WINDOW.as_secs()
            )
        } else {
            format!("loader {i} (pid {pid}) {ended}")
        }
    }
}

impl std::fmt::Display for LoaderFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hint = if self.gave_up { "" } else { self.ended.hint() };
        write!(f, "{}{hint}", self.sentence())
    }
}

/// What the supervisor of a loader child that ended does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Start it again.
    Restart,
    /// Nothing: it finished (the ring closed) or its daemon is gone (the daemon's end decides).
    Leave,
    /// Stop the run (SIGTERM to the daemon, which drains and writes its summary).
    StopRun,
}

/// The books of a program's loader children: restarts per loader, and the failure that stops
/// the run.
#[derive(Debug)]
pub struct Supervisor {
    restarts: Vec<std::collections::VecDeque<Instant>>,
    failure: Option<LoaderFailed>,
}

impl Supervisor {
    /// The books of `loaders` loader children, none restarted yet.
    pub fn new(loaders: usize) -> Self {
        Self {
            restarts: vec![Default::default(); loaders],
            failure: None,
        }
    }

    /// How many loaders the books keep.
    pub fn loaders(&self) -> usize {
        self.restarts.len()
    }

    /// The failure that stops the run, once one is booked.
    pub fn failure(&self) -> Option<&LoaderFailed> {
        self.failure.as_ref()
    }

    /// Loader `index` (pid `pid`) ended this way at `now`.
    /// - Killed by a signal (SIGKILL, the OOM killer, a crash): restarted; the daemon has put
    ///   its slot back with the same seq, so nothing is lost.
    /// - Exited 0 (the ring closed) or 5 (its daemon is gone): left; the daemon's end decides.
    /// - Any other code (3: a sample it cannot read, 8: refused, ...): the run stops with it.
    /// - Once the run is stopping (a failure is booked), whatever else ends is left: nothing is
    ///   restarted, and the stop is asked for (and logged) once.
    pub fn ended(&mut self, index: usize, pid: u32, ended: Ended, now: Instant) -> Next {
        if self.failure.is_some() {
            return Next::Leave;
        }
        let fail = |gave_up| LoaderFailed {
            index,
            pid,
            ended,
            gave_up,
        };
        match ended {
            Ended::Signal { .. } => {
                let r = &mut self.restarts[index];
                while r
                    .front()
                    .is_some_and(|&t| now.duration_since(t) > RESTART_WINDOW)
                {
                    r.pop_front();
                }
                if r.len() >= MAX_RESTARTS {
                    self.failure = Some(fail(true));
                    return Next::StopRun;
                }
                r.push_back(now);
                Next::Restart
            }
            Ended::Code(0) => Next::Leave,
            Ended::Code(c) if c == i32::from(Exit::PeerDied.code()) => Next::Leave,
            Ended::Code(_) => {
                self.failure = Some(fail(false));
                Next::StopRun
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinring_exit::Coded;

    const KILLED: Ended = Ended::Signal {
        signal: 9,
        core: false,
    };

    #[test]
    fn a_killed_loader_is_restarted_until_it_is_killed_too_often() {
        let mut s = Supervisor::new(2);
        let t0 = Instant::now();
        for n in 0..MAX_RESTARTS {
            let at = t0 + Duration::from_secs(n as u64);
            assert_eq!(s.ended(1, 100, KILLED, at), Next::Restart);
        }
        // The other loader has its own count.
        assert_eq!(s.ended(0, 200, KILLED, t0), Next::Restart);
        assert!(s.failure.is_none());
        assert_eq!(
            s.ended(1, 101, KILLED, t0 + Duration::from_secs(10)),
            Next::StopRun
        );
        let f = s.failure.clone().unwrap();
        assert!(f.gave_up && f.index == 1, "{f:?}");
        assert_eq!(f.exit(), Exit::PeerDied);
        assert!(f.to_string().contains("not restarted again"), "{f}");
    }

    #[test]
    fn restarts_older_than_the_window_are_forgotten() {
        let mut s = Supervisor::new(1);
        let t0 = Instant::now();
        for n in 0..(3 * MAX_RESTARTS) as u64 {
            let at = t0 + RESTART_WINDOW / 2 * (n as u32);
            assert_eq!(s.ended(0, 1, KILLED, at), Next::Restart, "kill {n}");
        }
    }

    #[test]
    fn a_loader_that_fails_on_the_data_stops_the_run_with_its_code() {
        let mut s = Supervisor::new(2);
        let t0 = Instant::now();
        assert_eq!(s.ended(0, 7, Ended::Code(0), t0), Next::Leave);
        assert_eq!(s.ended(1, 8, Ended::Code(5), t0), Next::Leave);
        assert!(s.failure.is_none());
        assert_eq!(s.ended(1, 9, Ended::Code(3), t0), Next::StopRun);
        // The first failure is the one reported; once stopping, nothing more is asked for.
        assert_eq!(s.ended(0, 10, Ended::Code(8), t0), Next::Leave);
        assert_eq!(s.ended(0, 11, KILLED, t0), Next::Leave);
        let f = s.failure.unwrap();
        assert_eq!((f.index, f.pid, f.exit()), (1, 9, Exit::Config));
        assert_eq!(
            f.to_string(),
            "loader 1 (pid 9) exited with code 3 (config) (its error is printed above)"
        );
    }

    #[test]
    fn a_daemon_killed_by_a_signal_is_named_with_it_and_is_peer_died() {
        let killed = Ended::of(ExitStatus::from_raw(9));
        assert_eq!(
            killed,
            Ended::Signal {
                signal: 9,
                core: false
            }
        );
        assert_eq!(killed.to_string(), "was killed by signal 9 (SIGKILL)");
        assert_eq!(killed.exit(), Exit::PeerDied);
        // SIGSEGV with a core dump (0x80).
        let crashed = Ended::of(ExitStatus::from_raw(11 | 0x80));
        assert_eq!(
            crashed.to_string(),
            "was killed by signal 11 (SIGSEGV) and dumped core"
        );
    }

    #[test]
    fn a_daemon_exit_code_is_named_and_kept_when_documented() {
        let ring = Ended::of(ExitStatus::from_raw(4 << 8));
        assert_eq!(ring, Ended::Code(4));
        assert_eq!(ring.to_string(), "exited with code 4 (ring)");
        assert_eq!(ring.exit(), Exit::Ring);
        let odd = Ended::of(ExitStatus::from_raw(42 << 8));
        assert_eq!(odd.to_string(), "exited with code 42");
        assert_eq!(odd.exit(), Exit::PeerDied);
    }
}
