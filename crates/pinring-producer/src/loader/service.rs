//! A loader under systemd (`Type=notify`): `READY=1` once attached, `STATUS=` every second,
//! `WATCHDOG=1` from the loader loop, `STOPPING=1` when it leaves; and the `--instance RING:N`
//! flag of the `pinring-loader@RING:N` unit.

use pinring_runtime::service::{parse_log_level, Notifier, Watchdog, STATUS_EVERY};
use sd_notify::NotifyState;
use std::time::Instant;

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
}
