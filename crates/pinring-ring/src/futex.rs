//! Cross-process futex wait and wake on 32-bit words inside the segment.
//!
//! The words are waited on as *shared* futexes (no `FUTEX_PRIVATE_FLAG`): private futexes key on
//! the virtual address and silently never wake a waiter in another process. Every wait takes a
//! deadline: `FUTEX_WAIT` is restarted by the kernel after a signal handler installed with
//! `SA_RESTART`, so a wait without one could sleep through SIGTERM.

use linux_futex::{AsFutex, Shared, TimedWaitError};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Woken by a `wake` call (or spuriously).
    Woken,
    /// The word no longer held the expected value when the wait began.
    Changed,
    /// The deadline passed.
    TimedOut,
    /// A signal handler ran.
    Interrupted,
}

/// Sleeps while `word == expected`, at most `timeout`. Callers re-check their condition after
/// every return, whatever the reason.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Wake {
    let timeout = timeout.max(Duration::from_micros(1));
    match AsFutex::<Shared>::as_futex(word).wait_for(expected, timeout) {
        Ok(()) => Wake::Woken,
        Err(TimedWaitError::WrongValue) => Wake::Changed,
        Err(TimedWaitError::TimedOut) => Wake::TimedOut,
        Err(TimedWaitError::Interrupted) => Wake::Interrupted,
    }
}

/// Bumps the word (so a waiter that has not yet slept sees the change) and wakes up to `n` waiters.
pub fn bump_and_wake(word: &AtomicU32, n: i32) {
    // Release: pairs with the Acquire load a waiter does before scanning, so whatever the caller
    // wrote before bumping is visible to a waiter that observes the new value.
    word.fetch_add(1, std::sync::atomic::Ordering::Release);
    AsFutex::<Shared>::as_futex(word).wake(n);
}

/// Wakes every waiter.
pub fn bump_and_wake_all(word: &AtomicU32) {
    bump_and_wake(word, i32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_times_out_at_its_deadline() {
        let w = AtomicU32::new(0);
        let t = Instant::now();
        assert_eq!(wait(&w, 0, Duration::from_millis(20)), Wake::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn wait_returns_at_once_when_the_value_changed() {
        let w = AtomicU32::new(1);
        assert_eq!(wait(&w, 0, Duration::from_secs(10)), Wake::Changed);
    }

    #[test]
    fn wake_from_another_thread_ends_the_wait() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = Arc::clone(&w);
        let waker = std::thread::spawn(move || loop {
            bump_and_wake_all(&w2);
            if w2.load(Ordering::Relaxed) > 1000 {
                break;
            }
            std::thread::yield_now();
        });
        let seen = 0;
        let r = wait(&w, seen, Duration::from_secs(10));
        assert!(matches!(r, Wake::Woken | Wake::Changed));
        waker.join().unwrap();
    }
}
