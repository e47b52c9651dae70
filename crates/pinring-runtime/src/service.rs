//! Running under systemd (`Type=notify`): what the daemon's and the loaders' service sides share.
//! The protocol is spoken by the `sd-notify` crate, which does nothing when `$NOTIFY_SOCKET` is
//! unset (not under systemd). The daemon's side (start-timeout extension, READY, live STATUS,
//! the metrics endpoint) is pinring-daemon's `service`; the loader's is pinring-producer's
//! `loader::service`.

use sd_notify::NotifyState;
use std::time::{Duration, Instant};

/// How often STATUS= is refreshed.
pub const STATUS_EVERY: Duration = Duration::from_secs(1);

/// Checks a `--log-level` value (a level or an `EnvFilter` directive).
pub fn parse_log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("--log-level {s:?}: {e} (use error, warn, info, debug or trace)"))
}

/// Sends notifications; logs the first failure only (a broken notify socket must not flood the
/// journal or stop the data path).
#[derive(Debug, Default)]
pub struct Notifier {
    failed: bool,
}

impl Notifier {
    pub fn send(&mut self, states: &[NotifyState]) {
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
pub struct Watchdog {
    every: Option<Duration>,
    last: Instant,
}

impl Watchdog {
    pub fn from_env() -> Watchdog {
        Watchdog {
            every: sd_notify::watchdog_enabled().map(|d| d / 4),
            last: Instant::now(),
        }
    }

    pub fn due(&mut self) -> bool {
        match self.every {
            Some(every) if self.last.elapsed() >= every => {
                self.last = Instant::now();
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_are_checked() {
        assert!(parse_log_level("debug").is_ok());
        assert!(parse_log_level("pinring_runtime=trace,warn").is_ok());
        assert!(parse_log_level("loud[").is_err());
    }
}
