//! The embedded mode: the daemon's code running inside the training process, on background
//! threads, in the training process's own CUDA context. Loaders stay separate processes and find
//! the ring by name as always; the consumer attaches to it like to any other ring, but reaches the
//! batch buffers directly (no CUDA IPC, which some container runtimes refuse) because they were
//! allocated in this very process.

use crate::ClientError;
use pinring_daemon::sink::SinkKind;
use pinring_daemon::summary::Summary;
use pinring_daemon::{self as daemon, RunOptions};
use pinring_data::Spec;
use pinring_exit::Coded;
use pinring_exit::Exit;
use pinring_runtime::settings::{Found, Overrides};
use pinring_runtime::shutdown::Shutdown;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How an embedded daemon runs its spec (the settings are the spec's: [`resolve`]).
#[derive(Debug, Clone, Default)]
pub struct EmbeddedOptions {
    /// `auto`, `cuda` or `host`.
    pub backend: pinring_backend::BackendKind,
    /// CUDA device ordinal.
    pub device: usize,
    /// First seq (resume).
    pub start_seq: u64,
    /// Replace a stale ring of the same name.
    pub replace: bool,
    /// Make the ring anonymous: a memfd with no name in /dev/shm, gone with the last process
    /// holding it (so a killed trainer leaves nothing behind, and /dev/shm's size does not
    /// matter). Consumers and loaders open it at [`EmbeddedDaemon::path`], not by name.
    /// Resolve its spec with `anonymous` too ([`resolve`]).
    pub anonymous: bool,
}

/// The spec an embedded daemon runs, resolved once, here: the settings of `config` (`None`:
/// the lookup order of `pinring-daemon`, and the built-in default) with `overrides` (named as
/// `pinring.EmbeddedDaemon`'s keywords name them) and the environment's, resolved for this host
/// as the daemon resolves its own. `anonymous`: the ring will be anonymous, so the spec's paths
/// are stored absolute. An error is the daemon's, with its exit code.
pub fn resolve(
    config: Option<&Path>,
    overrides: &Overrides,
    anonymous: bool,
) -> Result<Spec, ClientError> {
    daemon::resolve(config, overrides, anonymous).map_err(|n| not_resolved(*n, overrides))
}

/// [`resolve`] of settings already found: a file's, or those the embedding program gives as
/// data ([`pinring_runtime::settings::given`]).
pub fn resolve_found(found: Found, anonymous: bool) -> Result<Spec, ClientError> {
    let overrides = found.overrides.clone();
    daemon::resolve_found(found, anonymous).map_err(|n| not_resolved(*n, &overrides))
}

fn not_resolved(n: daemon::NotResolved, overrides: &Overrides) -> ClientError {
    ClientError::Daemon {
        // The ring of the settings as far as they were read; a file not read names none.
        ring: n
            .known
            .map(|c| c.ring.name)
            .or_else(|| overrides.ring.clone())
            .unwrap_or_default(),
        message: n.error.to_string(),
        exit: n.error.exit(),
    }
}

/// A daemon running on a thread of this process. Dropping it stops the daemon (a drain, as at
/// SIGTERM) and waits for the thread.
#[derive(Debug)]
pub struct EmbeddedDaemon {
    ring: String,
    address: Option<Arc<OnceLock<PathBuf>>>,
    shutdown: Shutdown,
    thread: Option<JoinHandle<daemon::Outcome>>,
}

impl EmbeddedDaemon {
    /// Starts the daemon of `spec` with the consumer sink and waits (up to `wait`) until its
    /// ring is READY. A daemon that fails at start is reported with its own message.
    pub fn start(
        spec: Spec,
        opts: &EmbeddedOptions,
        wait: Duration,
    ) -> Result<EmbeddedDaemon, ClientError> {
        EmbeddedDaemon::start_until(spec, opts, wait, &|| false)
    }

    /// [`EmbeddedDaemon::start`], giving up with [`ClientError::Interrupted`] (the daemon
    /// stopped again) as soon as `stop` says so; it is asked at least every 50 ms.
    pub fn start_until(
        spec: Spec,
        opts: &EmbeddedOptions,
        wait: Duration,
        stop: &dyn Fn() -> bool,
    ) -> Result<EmbeddedDaemon, ClientError> {
        let ring = spec.ring().to_string();
        let address = opts.anonymous.then(|| Arc::new(OnceLock::new()));
        let run = RunOptions {
            backend: opts.backend,
            device: Some(opts.device),
            sink: SinkKind::Consumer,
            start_seq: opts.start_seq,
            prefetch: None,
            look_ahead: None,
            replace: opts.replace,
            no_register: false,
            zero_copy: false,
            service: Default::default(),
            embedded: true,
            address: address.clone(),
        };
        let shutdown = Shutdown::never();
        let thread = {
            let shutdown = shutdown.clone();
            std::thread::Builder::new()
                .name("pinring-daemon".into())
                .spawn(move || daemon::serve(spec, &run, &shutdown))
                .map_err(|e| ClientError::Daemon {
                    ring: ring.clone(),
                    message: format!("cannot start the daemon thread: {e}"),
                    exit: Exit::Internal,
                })?
        };
        let mut d = EmbeddedDaemon {
            ring,
            address,
            shutdown,
            thread: Some(thread),
        };
        d.wait_ready(wait, stop)?;
        Ok(d)
    }

    fn wait_ready(&mut self, wait: Duration, stop: &dyn Fn() -> bool) -> Result<(), ClientError> {
        let start = Instant::now();
        let me = std::process::id();
        loop {
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let outcome = self.join();
                let (message, exit) = match outcome.map(|o| o.result) {
                    Some(Err(e)) => (e.to_string(), e.exit()),
                    _ => (
                        "the daemon stopped before its ring was ready".into(),
                        Exit::Internal,
                    ),
                };
                return Err(ClientError::Daemon {
                    ring: self.ring.clone(),
                    message,
                    exit,
                });
            }
            // An anonymous ring can be opened once the daemon has said where it is.
            let at = self.address.as_ref().map(|a| a.get());
            if at != Some(None) {
                if let Ok(ring) = pinring_ring::Ring::open_at(
                    &self.ring,
                    at.flatten().map(PathBuf::as_path),
                    pinring_ring::Access::ReadOnly,
                    Duration::from_millis(50),
                ) {
                    if ring.daemon().pid == me && ring.state() != pinring_ring::ring_state::INIT {
                        return Ok(());
                    }
                }
            }
            if stop() {
                return Err(ClientError::Interrupted {
                    ring: self.ring.clone(),
                });
            }
            if start.elapsed() >= wait {
                return Err(ClientError::Daemon {
                    ring: self.ring.clone(),
                    message: format!(
                        "its ring was not ready within {} ms",
                        start.elapsed().as_millis()
                    ),
                    exit: Exit::PeerDied,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The ring's name (for [`crate::Consumer::attach`] and for the loaders).
    pub fn ring(&self) -> &str {
        &self.ring
    }

    /// Where an anonymous ring is opened (`/proc/<pid>/fd/<fd>` of this process), for
    /// [`crate::AttachOptions::path`] and the loaders; `None` for a ring named in /dev/shm.
    pub fn path(&self) -> Option<&Path> {
        self.address
            .as_ref()
            .and_then(|a| a.get())
            .map(PathBuf::as_path)
    }

    /// Whether the daemon is still running.
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the daemon (a drain) and returns its summary and how it ended: the daemon's own
    /// error, with its exit code (a part that failed on the data is `Exit::Config`, as the
    /// binary's exit 3).
    pub fn stop(mut self) -> Option<(Summary, Result<(), daemon::DaemonError>)> {
        self.shutdown.request();
        self.join().map(|o| (o.summary, o.result))
    }

    fn join(&mut self) -> Option<daemon::Outcome> {
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for EmbeddedDaemon {
    fn drop(&mut self) {
        self.shutdown.request();
        let _ = self.join();
    }
}
