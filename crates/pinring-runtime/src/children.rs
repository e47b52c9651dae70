//! Child processes of a pinring program and their supervision: how a child ended
//! ([`Ended`]), children that die with their parent ([`stop_with_parent`]) and are stopped and
//! reaped on every path ([`Children`]), and the one set of books that says whether a child that
//! ended is started again ([`Supervisor`]), under a [`RestartPolicy`]: which endings restart
//! ([`Restartable`]) and how many restarts are allowed ([`Budget`]).
//!
//! - Loader programs ([`RestartPolicy::LOADERS`], `pinring run`, `pinring bench` and the Python
//!   package's `pinring.Loader(loaders=N)` through `_native.Supervisor`): a loader killed by a
//!   signal is started again, up to [`MAX_RESTARTS`] times within [`RESTART_WINDOW`]; one that
//!   exits 0 or 5 is left to its daemon's end; any other code stops the run.
//! - A `pinring.torch.DataLoader`'s workers ([`RestartPolicy::workers`], `_native.Supervisor`
//!   with `policy="workers"`): every end its pool reports (only unexpected ones) restarts, up to
//!   `max_worker_restarts` restarts in all over the loader's life; an iterable dataset's workers
//!   ([`RestartPolicy::STREAM_WORKERS`]) are never restarted.

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

/// Which endings of a child start it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restartable {
    /// A loader program (`pinring-loader`): killed by a signal (SIGKILL, the OOM killer, a
    /// crash) restarts it, the daemon having put its slot back with the same seq; exit 0 (the
    /// ring closed) or 5 (its daemon is gone) leaves it to the daemon's end; any other code
    /// (3: a sample it cannot read, 8: refused, ...) stops the run with it.
    Signals,
    /// Every ending the caller books restarts: the caller books only the unexpected ones (a
    /// DataLoader worker that died, or left while the ring still needed it).
    Every,
}

/// How many restarts the books allow before the next ending that would restart stops the run
/// instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// At most `max` restarts of each child within any `window`.
    PerChild {
        /// Restarts allowed within the window.
        max: usize,
        /// The window they count in.
        window: Duration,
    },
    /// At most `max` restarts of all the children together, over the books' life.
    Total {
        /// Restarts allowed.
        max: usize,
    },
    /// None: a child that ends is never started again (an iterable dataset's workers, whose
    /// place in their stream would be lost).
    Never,
}

/// What the books restart, and how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Which endings restart.
    pub restart: Restartable,
    /// How many restarts are allowed.
    pub budget: Budget,
}

impl RestartPolicy {
    /// Loader programs' (`pinring run`, `pinring bench`, `pinring.Loader(loaders=N)`): a loader
    /// killed by a signal restarts, each at most [`MAX_RESTARTS`] times within
    /// [`RESTART_WINDOW`].
    pub const LOADERS: RestartPolicy = RestartPolicy {
        restart: Restartable::Signals,
        budget: Budget::PerChild {
            max: MAX_RESTARTS,
            window: RESTART_WINDOW,
        },
    };

    /// An iterable dataset's DataLoader workers': never restarted.
    pub const STREAM_WORKERS: RestartPolicy = RestartPolicy {
        restart: Restartable::Every,
        budget: Budget::Never,
    };

    /// A map-style dataset's DataLoader workers': every booked ending restarts, at most `max`
    /// restarts in all (`max_worker_restarts`).
    pub const fn workers(max: usize) -> RestartPolicy {
        RestartPolicy {
            restart: Restartable::Every,
            budget: Budget::Total { max },
        }
    }
}

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
    /// The budget it ran out of (where `gave_up`).
    pub budget: Budget,
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
        if !self.gave_up {
            return format!("loader {i} (pid {pid}) {ended}");
        }
        match self.budget {
            Budget::PerChild { max, window } => format!(
                "loader {i} (pid {pid}) {ended}, after {max} restarts within {} s: \
                 not restarted again (look for what kills it: the OOM killer, a watchdog)",
                window.as_secs()
            ),
            Budget::Total { max } => format!(
                "loader {i} (pid {pid}) {ended}, after {max} restarts of loaders: not restarted \
                 again"
            ),
            Budget::Never => {
                format!("loader {i} (pid {pid}) {ended}: its loaders are never restarted")
            }
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

/// The books of a program's children under one [`RestartPolicy`]: their restarts, and the
/// failure that stops the run.
#[derive(Debug)]
pub struct Supervisor {
    policy: RestartPolicy,
    /// Each child's restarts within the window ([`Budget::PerChild`]).
    recent: Vec<std::collections::VecDeque<Instant>>,
    /// Every restart over the books' life.
    restarts: usize,
    failure: Option<LoaderFailed>,
}

impl Supervisor {
    /// The books of `loaders` loader programs ([`RestartPolicy::LOADERS`]), none restarted yet.
    pub fn new(loaders: usize) -> Self {
        Self::with_policy(loaders, RestartPolicy::LOADERS)
    }

    /// The books of `children` children under `policy`, none restarted yet.
    pub fn with_policy(children: usize, policy: RestartPolicy) -> Self {
        Self {
            policy,
            recent: vec![Default::default(); children],
            restarts: 0,
            failure: None,
        }
    }

    /// How many children the books keep.
    pub fn loaders(&self) -> usize {
        self.recent.len()
    }

    /// The policy the books follow.
    pub fn policy(&self) -> RestartPolicy {
        self.policy
    }

    /// How many restarts the books have allowed, over their life.
    pub fn restarts(&self) -> usize {
        self.restarts
    }

    /// The failure that stops the run, once one is booked.
    pub fn failure(&self) -> Option<&LoaderFailed> {
        self.failure.as_ref()
    }

    /// Forgets the failure booked, keeping the restarts counted: the books' owner starts its
    /// children again for a new run (a DataLoader's next pass), under the same budget.
    pub fn next_run(&mut self) {
        self.failure = None;
    }

    /// Child `index` (pid `pid`) ended this way at `now`.
    /// - An ending its policy restarts ([`Restartable`]): restarted while the [`Budget`]
    ///   allows; then the run stops, the failure given up on.
    /// - [`Restartable::Signals`]: exited 0 (the ring closed) or 5 (its daemon is gone): left;
    ///   the daemon's end decides. Any other code: the run stops with it.
    /// - Once the run is stopping (a failure is booked), whatever else ends is left: nothing is
    ///   restarted, and the stop is asked for (and logged) once.
    pub fn ended(&mut self, index: usize, pid: u32, ended: Ended, now: Instant) -> Next {
        if self.failure.is_some() {
            return Next::Leave;
        }
        let budget = self.policy.budget;
        let fail = |gave_up| LoaderFailed {
            index,
            pid,
            ended,
            gave_up,
            budget,
        };
        let restarts = match (self.policy.restart, ended) {
            (Restartable::Every, _) | (Restartable::Signals, Ended::Signal { .. }) => true,
            (Restartable::Signals, Ended::Code(0)) => return Next::Leave,
            (Restartable::Signals, Ended::Code(c)) if c == i32::from(Exit::PeerDied.code()) => {
                return Next::Leave;
            }
            (Restartable::Signals, Ended::Code(_)) => false,
        };
        if restarts && self.allows(index, now) {
            self.restarts += 1;
            return Next::Restart;
        }
        self.failure = Some(fail(restarts));
        Next::StopRun
    }

    /// Whether the budget allows child `index` another restart at `now`; books it where it does.
    fn allows(&mut self, index: usize, now: Instant) -> bool {
        match self.policy.budget {
            Budget::PerChild { max, window } => {
                let r = &mut self.recent[index];
                while r.front().is_some_and(|&t| now.duration_since(t) > window) {
                    r.pop_front();
                }
                if r.len() >= max {
                    return false;
                }
                r.push_back(now);
                true
            }
            Budget::Total { max } => self.restarts < max,
            Budget::Never => false,
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
    fn workers_restart_on_every_ending_until_their_total_is_spent() {
        let mut s = Supervisor::with_policy(3, RestartPolicy::workers(3));
        let t0 = Instant::now();
        // Any ending the pool books restarts, exit 0 and bad-data codes included, whichever
        // worker it is: the budget is one total, with no window.
        assert_eq!(s.ended(0, 1, Ended::Code(0), t0), Next::Restart);
        assert_eq!(s.ended(1, 2, Ended::Code(3), t0), Next::Restart);
        let later = t0 + RESTART_WINDOW * 10;
        assert_eq!(s.ended(2, 3, KILLED, later), Next::Restart);
        assert_eq!(s.restarts(), 3);
        assert_eq!(s.ended(0, 4, KILLED, later), Next::StopRun);
        let f = s.failure().cloned().unwrap();
        assert!(f.gave_up && (f.index, f.pid) == (0, 4), "{f:?}");
        assert_eq!(f.exit(), Exit::PeerDied);
        assert_eq!(
            f.to_string(),
            "loader 0 (pid 4) was killed by signal 9 (SIGKILL), after 3 restarts of loaders: \
             not restarted again"
        );
        assert_eq!(
            s.ended(1, 5, KILLED, later),
            Next::Leave,
            "the run is stopping"
        );
        // A new run (the loader's next pass) keeps the count: the next ending stops it again.
        s.next_run();
        assert!(s.failure().is_none());
        assert_eq!(s.ended(1, 6, KILLED, later), Next::StopRun);
        assert_eq!(s.restarts(), 3);
    }

    #[test]
    fn no_budget_restarts_nothing_and_zero_workers_restarts_nothing() {
        for policy in [RestartPolicy::STREAM_WORKERS, RestartPolicy::workers(0)] {
            let mut s = Supervisor::with_policy(1, policy);
            assert_eq!(
                s.ended(0, 7, KILLED, Instant::now()),
                Next::StopRun,
                "{policy:?}"
            );
            assert_eq!(s.restarts(), 0);
            assert!(s.failure().unwrap().gave_up);
        }
        let mut s = Supervisor::with_policy(1, RestartPolicy::STREAM_WORKERS);
        s.ended(0, 7, Ended::Code(0), Instant::now());
        assert_eq!(
            s.failure().unwrap().sentence(),
            "loader 0 (pid 7) exited with code 0 (ok): its loaders are never restarted"
        );
    }

    #[test]
    fn loader_programs_keep_their_policy_and_count_restarts_in_all() {
        let mut s = Supervisor::new(2);
        assert_eq!(s.policy(), RestartPolicy::LOADERS);
        let t0 = Instant::now();
        assert_eq!(s.ended(0, 1, KILLED, t0), Next::Restart);
        assert_eq!(s.ended(1, 2, KILLED, t0), Next::Restart);
        assert_eq!(s.restarts(), 2);
        let f = {
            for n in 1..MAX_RESTARTS {
                assert_eq!(s.ended(0, 1, KILLED, t0), Next::Restart, "kill {n}");
            }
            assert_eq!(s.ended(0, 1, KILLED, t0), Next::StopRun);
            s.failure().cloned().unwrap()
        };
        assert_eq!(
            f.to_string(),
            "loader 0 (pid 1) was killed by signal 9 (SIGKILL), after 5 restarts within 60 s: \
             not restarted again (look for what kills it: the OOM killer, a watchdog)"
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
