//! Latency histograms with fixed buckets, written by the daemon's main loop only and read by the
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

/// [`BOUNDS_SECONDS`] in nanoseconds, for the main loop's integer comparisons.
const BOUNDS_NS: [u64; BOUNDS_SECONDS.len()] = {
    let mut ns = [0u64; BOUNDS_SECONDS.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = (BOUNDS_SECONDS[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    ns
};

/// Adds `n` to a counter that only one thread writes (others read it): a load and a store, no
/// locked instruction.
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

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
    /// Records one duration. Each histogram has one writer, the daemon's main loop, so each
    /// counter is read and stored rather than added to with a locked read-modify-write: three
    /// histograms per part were nine locked instructions in the main loop's per-part path.
    pub fn observe_ns(&self, ns: u64) {
        // The first bound at or above `ns`: `ns` falls in that bucket (`le`, "less or equal").
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        bump(&self.buckets[i], 1);
        bump(&self.count, 1);
        bump(&self.sum_ns, ns);
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

/// Latency quantiles in bounded memory: an HDR histogram (`hdrhistogram`) of microsecond values
/// from 1 µs to `u32::MAX` µs (71 minutes; longer is counted there) at two significant digits,
/// so a daemon that runs for weeks keeps a fixed-size table (about 26 KiB) instead of every
/// observation. Quantiles are exact below 256 µs and within 1% above.
#[derive(Debug, Clone)]
pub struct Quantiles {
    hist: hdrhistogram::Histogram<u64>,
}

/// The largest value kept, in microseconds.
const QUANTILE_MAX_US: u64 = u32::MAX as u64;

impl Default for Quantiles {
    fn default() -> Self {
        Quantiles {
            hist: hdrhistogram::Histogram::new_with_bounds(1, QUANTILE_MAX_US, 2)
                .expect("1..=u32::MAX at 2 significant digits are valid histogram bounds"),
        }
    }
}

impl Quantiles {
    /// Records one latency.
    pub fn record_us(&mut self, us: u64) {
        // Within the bounds by construction (clamped), so recording cannot fail; 0 µs counts
        // in the histogram's lowest bucket, which holds 0 and 1.
        self.hist.saturating_record(us.min(QUANTILE_MAX_US));
    }

    /// The `q` quantile (0..=1) in microseconds; 0 when nothing was recorded.
    pub fn quantile_us(&self, q: f64) -> u32 {
        let total = self.hist.len();
        if total == 0 {
            return 0;
        }
        // The observation at 0-based rank round((n - 1) * q), as a sorted list would give (the
        // histogram's own `value_at_quantile` ranks differently), reported as the middle of its
        // bucket.
        let rank = ((total - 1) as f64 * q.clamp(0.0, 1.0)).round() as u64;
        let mut seen = 0;
        for v in self.hist.iter_recorded() {
            seen += v.count_since_last_iteration();
            if seen > rank {
                let value = self.hist.median_equivalent(v.value_iterated_to());
                return value.min(QUANTILE_MAX_US) as u32;
            }
        }
        u32::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_exact_below_64_us_and_within_3_percent_above() {
        let mut q = Quantiles::default();
        assert_eq!(q.quantile_us(0.5), 0);
        for us in 1..=100 {
            q.record_us(us);
        }
        assert_eq!(q.quantile_us(0.0), 1);
        assert_eq!(q.quantile_us(0.5), 51);
        let mut big = Quantiles::default();
        for us in [1_000u64, 1_367, 25_000, 4_000_000, u64::MAX] {
            big.record_us(us);
        }
        for (quantile, exact) in [
            (0.0, 1_000u64),
            (0.25, 1_367),
            (0.5, 25_000),
            (0.75, 4_000_000),
        ] {
            let got = u64::from(big.quantile_us(quantile));
            assert!(
                got.abs_diff(exact) * 32 <= exact,
                "q{quantile}: {got} vs {exact}"
            );
        }
        assert!(big.quantile_us(1.0) >= u32::MAX / 32 * 31);
    }

    #[test]
    fn quantiles_are_exact_below_256_us_and_within_1_percent_above() {
        for us in [200u64, 255, 1_344, 20_480, 2_752_512] {
            let mut q = Quantiles::default();
            q.record_us(us);
            let got = u64::from(q.quantile_us(0.5));
            if us < 256 {
                assert_eq!(got, us);
            } else {
                assert!(got.abs_diff(us) * 100 <= us, "{got} vs {us}");
            }
        }
        // The rank is the one a sorted list gives: round((n - 1) * q), 0-based.
        let mut q = Quantiles::default();
        for us in [10u64, 20, 30, 40] {
            q.record_us(us);
        }
        let got: Vec<u32> = [0.0, 0.33, 0.5, 0.99, 1.0]
            .iter()
            .map(|&p| q.quantile_us(p))
            .collect();
        assert_eq!(got, [10, 20, 30, 40, 40]);
    }

    #[test]
    fn the_bounds_in_nanoseconds_are_the_bounds_in_seconds_exactly() {
        for (ns, secs) in BOUNDS_NS.iter().zip(BOUNDS_SECONDS) {
            assert_eq!(*ns as f64 / 1e9, secs, "{ns} ns against {secs} s");
        }
        assert_eq!(BOUNDS_NS[0], 10_000);
        assert_eq!(BOUNDS_NS[BOUNDS_NS.len() - 1], 10_000_000_000);
        // An observation one nanosecond past a bound falls in the next bucket.
        let h = Histogram::default();
        h.observe_ns(25_001);
        h.observe_ns(25_000);
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "test", "ring=\"r\"");
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"0.000025\"} 1\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{ring=\"r\",le=\"0.00005\"} 2\n"),
            "{s}"
        );
    }

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
