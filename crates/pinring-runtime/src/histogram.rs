//! Latency histograms with fixed buckets, written by the daemon's main loop and read by the
//! metrics thread. Buckets are plain counters (atomics, Relaxed: each is an independent counter
//! and a scrape may see one observation in `count` a moment before it shows in a bucket, which
//! Prometheus tolerates); rendering makes them cumulative, as the text format wants.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the buckets, in seconds: 10 µs to 10 s in 1-2.5-5 steps. A batch moves in
/// tens of microseconds on a fast host; a starved pipeline holds it for seconds.
pub const BOUNDS_SECONDS: [f64; 19] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// A histogram of durations.
#[derive(Debug)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last entry is the +Inf overflow.
    buckets: [AtomicU64; BOUNDS_SECONDS.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one duration.
    pub fn observe_ns(&self, ns: u64) {
        let secs = ns as f64 / 1e9;
        let i = BOUNDS_SECONDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BOUNDS_SECONDS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Appends the histogram in Prometheus text format (`# HELP`, `# TYPE`, cumulative
    /// `_bucket` lines, `_sum`, `_count`), each sample carrying `labels` (e.g. `ring="gpu0"`).
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Relaxed);
            let le = BOUNDS_SECONDS
                .get(i)
                .map_or("+Inf".to_string(), |v| format!("{v}"));
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_right_cumulative_buckets() {
        let h = Histogram::default();
        h.observe_ns(5_000); // 5 µs -> le 1e-5
        h.observe_ns(10_000); // exactly 10 µs -> le 1e-5 (bounds are inclusive)
        h.observe_ns(3_000_000); // 3 ms -> le 5e-3
        h.observe_ns(60_000_000_000); // 60 s -> +Inf only
        assert_eq!(h.count(), 4);
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "test", "ring=\"r\"");
        assert!(s.contains("# TYPE x_seconds histogram"), "{s}");
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"0.00001\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"0.0025\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"0.005\"} 3\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"10\"} 3\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"+Inf\"} 4\n"),
            "{s}"
        );
        assert!(s.contains("x_seconds_count{ring=\"r\"} 4\n"), "{s}");
        assert!(s.contains("x_seconds_sum{ring=\"r\"} 60.003015\n"), "{s}");
    }
}
