//! Cross-process futex wait and wake on 32-bit words inside the segment.
//!
//! The words are waited on as *shared* futexes (no `FUTEX_PRIVATE_FLAG`): private futexes key on
//! the virtual address and silently never wake a waiter in another process. Every wait takes a
//! deadline: `FUTEX_WAIT` is restarted by the kernel after a signal handler installed with
//! `SA_RESTART`, so a wait without one could sleep through SIGTERM.
//!
//! In the model-checking build (`cfg(loom)`) the two system calls are replaced by a stand-in
//! (`model`) with the same contract, built on `loom`'s Mutex and Condvar: FUTEX_WAIT compares the
//! word and goes to sleep as one step with respect to FUTEX_WAKE, and a wake wakes at most `n`
//! sleepers on that word. The stand-in has no deadline, so a wake-up the protocol loses leaves a
//! thread asleep for ever, which the checker reports as a deadlock. Everything above the system
//! calls ([`wait_counted`], [`bump_and_wake_counted`]) is the same code in both builds.

use crate::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
use linux_futex::{AsFutex, Shared, TimedWaitError};
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
    futex_wait(word, expected, timeout.max(Duration::from_micros(1)))
}

/// FUTEX_WAIT on a shared futex.
#[cfg(not(loom))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Wake {
    match AsFutex::<Shared>::as_futex(word).wait_for(expected, timeout) {
        Ok(()) => Wake::Woken,
        Err(TimedWaitError::WrongValue) => Wake::Changed,
        Err(TimedWaitError::TimedOut) => Wake::TimedOut,
        Err(TimedWaitError::Interrupted) => Wake::Interrupted,
    }
}

/// FUTEX_WAKE on a shared futex: wakes up to `n` waiters sleeping on `word`.
#[cfg(not(loom))]
fn wake(word: &AtomicU32, n: i32) {
    AsFutex::<Shared>::as_futex(word).wake(n);
}

#[cfg(loom)]
use model::{wait as futex_wait, wake};

/// Bumps the word (so a waiter that has not yet slept sees the change) and wakes up to `n` waiters.
pub fn bump_and_wake(word: &AtomicU32, n: i32) {
    // Release: pairs with the Acquire load a waiter does before scanning, so whatever the caller
    // wrote before bumping is visible to a waiter that observes the new value.
    word.fetch_add(1, Ordering::Release);
    wake(word, n);
}

/// Wakes every waiter without changing the word (for a word whose value means something, like
/// the layout version: a waiter re-reads it after every return).
pub fn wake_all(word: &AtomicU32) {
    wake(word, i32::MAX);
}

/// Wakes every waiter.
pub fn bump_and_wake_all(word: &AtomicU32) {
    bump_and_wake(word, i32::MAX);
}

/// Like [`wait`], counting the caller in `waiters` while it may sleep, so that
/// [`bump_and_wake_counted`] can skip the wake-up system call when nobody sleeps.
///
/// Why no wake is lost: the waiter increments `waiters`, then the futex compares `word`; the
/// waker increments `word`, then reads `waiters`; all four are SeqCst (the kernel's compare is a
/// full barrier). Either the waker sees the waiter counted and wakes it, or the waiter's compare
/// sees the bumped word and does not sleep.
pub fn wait_counted(
    word: &AtomicU32,
    waiters: &AtomicU32,
    expected: u32,
    timeout: Duration,
) -> Wake {
    waiters.fetch_add(1, Ordering::SeqCst);
    let r = if word.load(Ordering::SeqCst) != expected {
        Wake::Changed
    } else {
        wait(word, expected, timeout)
    };
    waiters.fetch_sub(1, Ordering::SeqCst);
    r
}

/// Bumps `word` (Release and more: SeqCst) and wakes up to `n` of the waiters counted in
/// `waiters`; no system call when none is counted (see [`wait_counted`]).
pub fn bump_and_wake_counted(word: &AtomicU32, waiters: &AtomicU32, n: i32) {
    word.fetch_add(1, Ordering::SeqCst);
    if waiters.load(Ordering::SeqCst) != 0 {
        wake(word, n);
    }
}

/// Like [`bump_and_wake_counted`], waking when either count is non-zero. The daemon's own
/// threads ring its doorbell this way: its main loop may wait counted in a count of the
/// daemon's private memory, which loaders never read, so that their commits do not wake it
/// while it has enough uploads in flight, while the daemon's completion and sink threads still
/// do (`DaemonRing::wait_doorbell_quiet`).
pub fn bump_and_wake_counted_either(word: &AtomicU32, a: &AtomicU32, b: &AtomicU32, n: i32) {
    word.fetch_add(1, Ordering::SeqCst);
    if a.load(Ordering::SeqCst) != 0 || b.load(Ordering::SeqCst) != 0 {
        wake(word, n);
    }
}

/// The model checker's FUTEX_WAIT and FUTEX_WAKE (see the module note).
#[cfg(loom)]
pub mod model {
    use super::Wake;
    use crate::sync::atomic::{AtomicU32, Ordering};
    use loom::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// One sleeper: the word it sleeps on (by address, as the kernel keys shared futexes by
    /// page and offset) and whether a wake picked it.
    #[derive(Debug)]
    struct Sleeper {
        word: usize,
        id: u64,
        woken: bool,
    }

    /// The kernel's hash bucket: its lock serialises a waiter's compare-and-sleep with wakes.
    #[derive(Debug, Default)]
    struct Queue {
        next_id: u64,
        sleepers: Vec<Sleeper>,
    }

    #[derive(Debug)]
    struct Bucket {
        queue: Mutex<Queue>,
        cv: Condvar,
    }

    loom::lazy_static! {
        static ref BUCKET: Bucket = Bucket {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        };
    }

    fn key(word: &AtomicU32) -> usize {
        word as *const AtomicU32 as usize
    }

    /// FUTEX_WAIT without a deadline: `Changed` if the word no longer holds `expected`, else
    /// sleeps until a [`wake`] on the same word picks this sleeper.
    pub fn wait(word: &AtomicU32, expected: u32, _timeout: Duration) -> Wake {
        let mut q = BUCKET.queue.lock().unwrap();
        // The kernel reads the word under the bucket lock, behind a full barrier.
        if word.load(Ordering::SeqCst) != expected {
            return Wake::Changed;
        }
        let id = q.next_id;
        q.next_id += 1;
        q.sleepers.push(Sleeper {
            word: key(word),
            id,
            woken: false,
        });
        loop {
            q = BUCKET.cv.wait(q).unwrap();
            let at = q
                .sleepers
                .iter()
                .position(|s| s.id == id)
                .expect("a sleeper stays queued until it leaves");
            if q.sleepers[at].woken {
                q.sleepers.remove(at);
                return Wake::Woken;
            }
        }
    }

    /// FUTEX_WAKE: picks up to `n` of the sleepers on `word` that no wake picked yet, oldest
    /// first.
    pub fn wake(word: &AtomicU32, n: i32) {
        let mut q = BUCKET.queue.lock().unwrap();
        let key = key(word);
        let mut left = n.max(0);
        for s in q.sleepers.iter_mut() {
            if left == 0 {
                break;
            }
            if s.word == key && !s.woken {
                s.woken = true;
                left -= 1;
            }
        }
        drop(q);
        BUCKET.cv.notify_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
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
    fn a_counted_wake_reaches_a_counted_waiter_and_skips_when_none() {
        let w = Arc::new(AtomicU32::new(0));
        let n = Arc::new(AtomicU32::new(0));
        // Nobody waits: no wake, but the word moves (a later waiter does not sleep).
        bump_and_wake_counted(&w, &n, 1);
        assert_eq!(
            wait_counted(&w, &n, 0, Duration::from_secs(10)),
            Wake::Changed
        );
        let (w2, n2) = (Arc::clone(&w), Arc::clone(&n));
        let waker = std::thread::spawn(move || {
            while n2.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            bump_and_wake_counted(&w2, &n2, 1);
        });
        let seen = w.load(Ordering::SeqCst);
        let r = wait_counted(&w, &n, seen, Duration::from_secs(10));
        assert!(matches!(r, Wake::Woken | Wake::Changed), "{r:?}");
        waker.join().unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 0);
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
