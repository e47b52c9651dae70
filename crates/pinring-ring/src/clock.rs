//! CLOCK_MONOTONIC in nanoseconds: one clock for every process on the host, so timestamps written
//! into the segment by one process can be compared by another.

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => (ts.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec() as u64),
        // CLOCK_MONOTONIC cannot fail on Linux; 0 keeps callers total.
        Err(_) => 0,
    }
}

/// Nanoseconds since the Unix epoch (wall clock), for display only.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
