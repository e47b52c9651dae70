//! The daemon under systemd (`Type=notify`): `EXTEND_TIMEOUT_USEC` sized for creating and
//! registering its ring before it starts, `READY=1` once the ring is created, registered and
//! open to loaders, `STATUS=` with the live rate every second, `WATCHDOG=1` from the main loop
//! (at a quarter of `WatchdogSec`), and `STOPPING=1` when it drains; and the metrics endpoint.
//! The main loop calls the hooks here.

use crate::metrics::{self, DaemonMetrics};
use pinring_observe::{Rates, Snapshot};
use pinring_ring::DaemonRing;
use pinring_runtime::service::{parse_log_level, Notifier, Watchdog, STATUS_EVERY};
use sd_notify::NotifyState;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Start-timeout extension per GiB of ring: reserving, prefaulting and registering a GiB takes
/// well under a second on the hosts measured (0.65 s/GiB if pages were untouched), so this
/// leaves room.
const EXTEND_PER_GIB: Duration = Duration::from_secs(1);
/// Start-timeout extension on top of the per-GiB part (backend start, CUDA context).
const EXTEND_BASE: Duration = Duration::from_secs(30);

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
        ring: &Arc<DaemonRing>,
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
        self.last = Some(Snapshot::take(&ring.snapshot()));
        self.last_status = Instant::now();
        Ok(())
    }

    /// Called from every turn of the main loop (at least every 100 ms), which started at `turn`.
    pub fn tick(&mut self, ring: &DaemonRing, turn: Instant) {
        let mut states = Vec::new();
        if self.watchdog.due() {
            states.push(NotifyState::Watchdog);
        }
        let status;
        if !self.stopping && turn.saturating_duration_since(self.last_status) >= STATUS_EVERY {
            self.last_status = turn;
            let now = Snapshot::take(&ring.snapshot());
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
        ring: &DaemonRing,
        slot: u32,
        upload_ns: u64,
        commit_ns: u64,
        on_device_ns: u64,
    ) {
        // The claim time was written by a loader (untrusted): it only feeds statistics, and a
        // value from the future counts as zero. `commit_ns` is the one the daemon validated when
        // it took the slot.
        let claim = ring.claim_ns(slot);
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

    /// Called with the engine's decode counts after each round of completions of a ring whose
    /// images this daemon decodes: /metrics serves them.
    pub fn decoded(&self, counts: pinring_backend::DecodeCounts) {
        self.metrics.set_decoded(counts);
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
