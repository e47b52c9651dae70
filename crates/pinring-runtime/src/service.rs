//! Running under systemd (`Type=notify`): the service-manager notifications of the daemon and
//! the loaders, the daemon's metrics endpoint, and the service flags. The daemon and loader main
//! loops call the hooks here; the protocol itself is spoken by the `sd-notify` crate, which does
//! nothing when `$NOTIFY_SOCKET` is unset (not under systemd).
//!
//! Daemon: `EXTEND_TIMEOUT_USEC` sized for creating and registering its ring before it starts,
//! `READY=1` once the ring is created, registered and open to loaders, `STATUS=` with the live
//! rate every second, `WATCHDOG=1` from the main loop (at a quarter of `WatchdogSec`), and
//! `STOPPING=1` when it drains. Loaders: `READY=1` once attached, `STATUS=`, `WATCHDOG=1`,
//! `STOPPING=1`.

use crate::metrics::{self, DaemonMetrics};
use crate::status::{Rates, Snapshot};
use pinring_ring::Ring;
use sd_notify::NotifyState;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often STATUS= is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// Start-timeout extension per GiB of ring: reserving, prefaulting and registering a GiB takes
/// well under a second on the hosts measured (0.65 s/GiB if pages were untouched), so this
/// leaves room.
const EXTEND_PER_GIB: Duration = Duration::from_secs(1);
/// Start-timeout extension on top of the per-GiB part (backend start, CUDA context).
const EXTEND_BASE: Duration = Duration::from_secs(30);

fn parse_log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("--log-level {s:?}: {e} (use error, warn, info, debug or trace)"))
}

/// Service flags of the daemon.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DaemonServiceArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464). Off by default.
    #[arg(long, value_name = "ADDR", env = "PINRING_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Log level or filter (overrides RUST_LOG), e.g. info, debug.
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_level)]
    pub log_level: Option<String>,
}

/// Service flags of a loader.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LoaderServiceArgs {
    /// systemd instance RING:N (pinring-loader@RING:N): the loader serves ring RING; N only
    /// tells loaders of one ring apart in logs.
    #[arg(long, value_name = "RING:N", conflicts_with = "ring", value_parser = parse_instance)]
    pub instance: Option<String>,
    /// Log level or filter (overrides RUST_LOG), e.g. info, debug.
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_level)]
    pub log_level: Option<String>,
}

fn parse_instance(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((ring, n)) if !ring.is_empty() && !n.is_empty() => {
            pinring_ring::segment::validate_name(ring)
                .map(|()| s.to_string())
                .map_err(|e| format!("--instance {s:?}: {e}"))
        }
        _ => Err(format!(
            "--instance {s:?}: expected RING:N, e.g. gpu0:1 (unit pinring-loader@gpu0:1)"
        )),
    }
}

impl LoaderServiceArgs {
    /// The ring named by `--instance`.
    pub fn instance_ring(&self) -> Option<String> {
        self.instance
            .as_deref()
            .and_then(|i| i.rsplit_once(':'))
            .map(|(ring, _)| ring.to_string())
    }
}

/// Why the service layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The metrics address cannot be bound.
    #[error("cannot listen for metrics on {addr}: {source}; pick a free port with --metrics-listen (or leave it out)")]
    MetricsBind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The metrics thread could not start.
    #[error("cannot start the metrics thread for {addr}: {source}")]
    MetricsThread {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Sends notifications; logs the first failure only (a broken notify socket must not flood the
/// journal or stop the data path).
#[derive(Debug, Default)]
struct Notifier {
    failed: bool,
}

impl Notifier {
    fn send(&mut self, states: &[NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            if !self.failed {
                self.failed = true;
                tracing::warn!("cannot notify the service manager ($NOTIFY_SOCKET): {e}");
            }
        }
    }
}

/// Watchdog pings at a quarter of the interval systemd asked for (`$WATCHDOG_USEC`).
#[derive(Debug)]
struct Watchdog {
    every: Option<Duration>,
    last: Instant,
}

impl Watchdog {
    fn from_env() -> Watchdog {
        Watchdog {
            every: sd_notify::watchdog_enabled().map(|d| d / 4),
            last: Instant::now(),
        }
    }

    fn due(&mut self) -> bool {
        match self.every {
            Some(every) if self.last.elapsed() >= every => {
                self.last = Instant::now();
                true
            }
            _ => false,
        }
    }
}

/// The daemon's service side.
#[derive(Debug)]
pub struct DaemonService {
    notifier: Notifier,
    watchdog: Watchdog,
    metrics: Arc<DaemonMetrics>,
    listener: Option<(SocketAddr, TcpListener)>,
    last: Option<Snapshot>,
    last_status: Instant,
    stopping: bool,
}

impl DaemonService {
    /// Called before the ring is created: binds the metrics address (so a bad one fails before
    /// any memory is reserved) and asks systemd for time to create and register `ring_bytes`.
    pub fn start(
        args: &DaemonServiceArgs,
        ring: &str,
        ring_bytes: u64,
    ) -> Result<DaemonService, ServiceError> {
        let listener = match args.metrics_listen {
            Some(addr) => Some((
                addr,
                metrics::bind(addr).map_err(|source| ServiceError::MetricsBind { addr, source })?,
            )),
            None => None,
        };
        let mut s = DaemonService {
            notifier: Notifier::default(),
            watchdog: Watchdog::from_env(),
            metrics: Arc::new(DaemonMetrics::default()),
            listener,
            last: None,
            last_status: Instant::now(),
            stopping: false,
        };
        let extend = EXTEND_BASE + EXTEND_PER_GIB.mul_f64(ring_bytes as f64 / (1u64 << 30) as f64);
        let usec = u32::try_from(extend.as_micros()).unwrap_or(u32::MAX);
        let status = format!(
            "creating and registering ring {ring} ({:.2} GiB)",
            ring_bytes as f64 / (1u64 << 30) as f64
        );
        s.notifier.send(&[
            NotifyState::ExtendTimeoutUsec(usec),
            NotifyState::Status(&status),
        ]);
        Ok(s)
    }

    /// Called once the ring is READY: starts the metrics endpoint, tells systemd.
    pub fn ready(
        &mut self,
        ring: &Arc<Ring>,
        registration_seconds: f64,
    ) -> Result<(), ServiceError> {
        self.metrics.set_registration_seconds(registration_seconds);
        if let Some((addr, listener)) = self.listener.take() {
            metrics::serve(listener, Arc::clone(ring), Arc::clone(&self.metrics))
                .map_err(|source| ServiceError::MetricsThread { addr, source })?;
            tracing::info!(ring = %ring.name(), %addr, "serving metrics at http://{addr}/metrics");
        }
        let status = format!(
            "ring {} ready: {} slots, registered in {registration_seconds:.2} s",
            ring.name(),
            ring.geometry().slot_count
        );
        self.notifier
            .send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        self.last = Some(Snapshot::take(ring));
        self.last_status = Instant::now();
        Ok(())
    }

    /// Called from every turn of the main loop (at least every 100 ms), which started at `turn`.
    pub fn tick(&mut self, ring: &Ring, turn: Instant) {
        let mut states = Vec::new();
        if self.watchdog.due() {
            states.push(NotifyState::Watchdog);
        }
        let status;
        if !self.stopping && turn.saturating_duration_since(self.last_status) >= STATUS_EVERY {
            self.last_status = turn;
            let now = Snapshot::take(ring);
            if let Some(prev) = &self.last {
                let r = Rates::between(prev, &now);
                status = format!(
                    "ring {}: {:.2} GB/s out, {:.0} batches/s, {} delivered, {} loaders, bound by {}",
                    now.ring,
                    r.gbps_out,
                    r.batches_per_second,
                    now.delivered,
                    now.loaders.len(),
                    r.bound
                );
                states.push(NotifyState::Status(&status));
            }
            self.last = Some(now);
        }
        if !states.is_empty() {
            self.notifier.send(&states);
        }
    }

    /// Called when an upload of `slot` completed, before the slot is handed out again: records
    /// the stage latencies (commit to on the device, as the daemon computed them for its
    /// summary; claim to commit from the slot's claim timestamp).
    pub fn upload_done(
        &self,
        ring: &Ring,
        slot: u32,
        upload_ns: u64,
        commit_ns: u64,
        on_device_ns: u64,
    ) {
        // The claim time was written by a loader (untrusted): it only feeds statistics, and a
        // value from the future counts as zero. `commit_ns` is the one the daemon validated when
        // it took the slot.
        let claim = ring
            .desc(slot)
            .claim_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        if commit_ns > 0 {
            self.metrics
                .commit_to_upload_done
                .observe_ns(on_device_ns.saturating_sub(commit_ns));
            if claim > 0 {
                self.metrics
                    .fill
                    .observe_ns(commit_ns.saturating_sub(claim));
            }
        }
        self.metrics.upload.observe_ns(upload_ns);
    }

    /// Called when the daemon starts to drain or finishes (idempotent).
    pub fn stopping(&mut self, why: &str) {
        if !self.stopping {
            self.stopping = true;
            self.notifier
                .send(&[NotifyState::Stopping, NotifyState::Status(why)]);
        }
    }
}

/// A loader's service side.
#[derive(Debug)]
pub struct LoaderService {
    notifier: Notifier,
    watchdog: Watchdog,
    ring: String,
    index: u16,
    last_status: Instant,
}

impl LoaderService {
    /// Called before the loader waits for its ring.
    pub fn waiting(ring: &str) -> LoaderService {
        let mut s = LoaderService {
            notifier: Notifier::default(),
            watchdog: Watchdog::from_env(),
            ring: ring.to_string(),
            index: 0,
            last_status: Instant::now(),
        };
        let status = format!("waiting for ring {ring}");
        s.notifier.send(&[NotifyState::Status(&status)]);
        s
    }

    /// Called once attached as loader `index`.
    pub fn attached(&mut self, index: u16) {
        self.index = index;
        let status = format!("attached to ring {} as loader {index}", self.ring);
        self.notifier
            .send(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// Called from every turn of the loader loop (at least every 100 ms).
    pub fn tick(&mut self, batches: u64) {
        let mut states = Vec::new();
        if self.watchdog.due() {
            states.push(NotifyState::Watchdog);
        }
        let status;
        if self.last_status.elapsed() >= STATUS_EVERY {
            self.last_status = Instant::now();
            status = format!(
                "ring {}: loader {}, {batches} batches committed",
                self.ring, self.index
            );
            states.push(NotifyState::Status(&status));
        }
        if !states.is_empty() {
            self.notifier.send(&states);
        }
    }

    /// Called when the loader leaves its ring.
    pub fn stopping(&mut self, batches: u64) {
        let status = format!(
            "ring {}: loader {} leaving after {batches} batches",
            self.ring, self.index
        );
        self.notifier
            .send(&[NotifyState::Stopping, NotifyState::Status(&status)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_name_a_valid_ring_and_a_number() {
        assert_eq!(parse_instance("gpu0:1").unwrap(), "gpu0:1");
        let a = LoaderServiceArgs {
            instance: Some("my-ring_2:13".into()),
            log_level: None,
        };
        assert_eq!(a.instance_ring().as_deref(), Some("my-ring_2"));
        for bad in ["gpu0", ":1", "gpu0:", "bad/name:1"] {
            let e = parse_instance(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn log_levels_are_checked() {
        assert!(parse_log_level("debug").is_ok());
        assert!(parse_log_level("pinring_runtime=trace,warn").is_ok());
        assert!(parse_log_level("loud[").is_err());
    }
}
