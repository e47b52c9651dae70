//! Liveness the kernel vouches for: open-file-description (OFD) record locks on the segment file.
//!
//! Every value in the segment can be written by any process that maps it, so no header field can
//! say whether a daemon or a loader is alive. A lock can: the kernel drops it when the last file
//! descriptor of the open file description that took it is closed, which happens when the holder
//! exits for any reason (SIGKILL included), and no other process can release it. Locks are
//! advisory byte ranges of the file; they do not restrict access to the mapping, and ranges may
//! lie past the end of the file, so each role gets its own range without using any segment bytes:
//!
//! | range (one byte)                        | held (write lock) by                              |
//! |-----------------------------------------|---------------------------------------------------|
//! | [`DAEMON_LOCK`]                         | the daemon, from before the name exists to exit    |
//! | [`entry_lock`]`(i)`                     | the loader in loader-table entry `i`               |
//! | [`tenure_lock`]`(i, t)`                 | the same loader, for its tenure `t` of entry `i`   |
//! | [`CONSUMER_LOCK`]                       | the consumer the ring hands its batches to         |
//!
//! A lock *test* (`F_OFD_GETLK`) needs only read access, so status views see liveness through
//! a read-only descriptor; they are not fooled by PID namespaces or `hidepid`, since no pid is
//! looked up anywhere. OFD locks (Linux 3.15+) rather than classic POSIX locks: POSIX locks belong
//! to the process, so a second descriptor of the same file closed anywhere in the process would
//! silently drop them, and one process could not hold a daemon's and a loader's lock at once.

use crate::layout::{LOADER_ENTRY_BYTES, LOADER_TABLE_OFFSET};
use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;
use std::os::fd::AsFd;

/// The daemon's lock: the first byte of the file.
pub const DAEMON_LOCK: u64 = 0;
/// Start of the tenure locks: far past any segment's end, so they never overlap other ranges.
pub const TENURE_LOCK_BASE: u64 = 1 << 40;
/// The consumer's lock (a ring hands its batches to one consumer at a time): past every tenure
/// lock (those end below 2^40 + 2^32).
pub const CONSUMER_LOCK: u64 = 1 << 41;

/// The lock of loader-table entry `index`: the entry's first byte. Held by whoever occupies the
/// entry, so two live loaders can never share an index.
pub const fn entry_lock(index: u16) -> u64 {
    (LOADER_TABLE_OFFSET + index as usize * LOADER_ENTRY_BYTES) as u64
}

/// The lock of tenure `tenure` of entry `index`. A slot claimed by (index, tenure) has a live
/// claimant exactly while this byte is locked, whoever occupies the entry now.
pub const fn tenure_lock(index: u16, tenure: u16) -> u64 {
    TENURE_LOCK_BASE + ((index as u64) << 16) + tenure as u64
}

/// Who holds a byte, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// Nobody (other than the asking open file description).
    Nobody,
    /// A shared (read) lock: a cleaner or a replacing daemon looking at the file.
    Reader,
    /// An exclusive (write) lock: a live daemon or loader.
    Writer,
}

fn flock(kind: libc::c_short, offset: u64) -> libc::flock {
    libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: offset as libc::off_t,
        l_len: 1,
        l_pid: 0,
    }
}

/// Takes an exclusive lock on byte `offset` without waiting. `Ok(false)`: another open file
/// description holds a lock on it. The descriptor must be open for writing.
pub fn try_lock_exclusive(fd: impl AsFd, offset: u64) -> nix::Result<bool> {
    try_lock(fd, libc::F_WRLCK as libc::c_short, offset)
}

/// Takes a shared lock on byte `offset` without waiting (read access suffices). `Ok(false)`:
/// someone holds an exclusive lock on it.
pub fn try_lock_shared(fd: impl AsFd, offset: u64) -> nix::Result<bool> {
    try_lock(fd, libc::F_RDLCK as libc::c_short, offset)
}

fn try_lock(fd: impl AsFd, kind: libc::c_short, offset: u64) -> nix::Result<bool> {
    match fcntl(fd, FcntlArg::F_OFD_SETLK(&flock(kind, offset))) {
        Ok(_) => Ok(true),
        Err(nix::Error::EAGAIN) | Err(nix::Error::EACCES) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Releases whatever lock this open file description holds on byte `offset`.
pub fn unlock(fd: impl AsFd, offset: u64) -> nix::Result<()> {
    fcntl(
        fd,
        FcntlArg::F_OFD_SETLK(&flock(libc::F_UNLCK as libc::c_short, offset)),
    )
    .map(|_| ())
}

/// Who, other than this open file description, holds a lock on byte `offset`.
pub fn holder(fd: impl AsFd, offset: u64) -> nix::Result<Holder> {
    let mut probe = flock(libc::F_WRLCK as libc::c_short, offset);
    fcntl(fd, FcntlArg::F_OFD_GETLK(&mut probe))?;
    Ok(match i32::from(probe.l_type) {
        libc::F_UNLCK => Holder::Nobody,
        libc::F_RDLCK => Holder::Reader,
        _ => Holder::Writer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn two_descriptions() -> (tempfile_like::Tmp, std::fs::File, std::fs::File) {
        let tmp = tempfile_like::Tmp::new();
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&tmp.0)
                .unwrap()
        };
        let (a, b) = (open(), open());
        (tmp, a, b)
    }

    mod tempfile_like {
        /// A file in /dev/shm removed on drop.
        pub struct Tmp(pub std::path::PathBuf);
        impl Tmp {
            pub fn new() -> Tmp {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::path::PathBuf::from(format!(
                    "/dev/shm/.pinring-locktest.{}.{n}",
                    std::process::id()
                ));
                std::fs::write(&p, b"x").unwrap();
                Tmp(p)
            }
        }
        impl Drop for Tmp {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn an_exclusive_lock_excludes_other_descriptions_until_closed() {
        let (_tmp, a, b) = two_descriptions();
        assert_eq!(holder(&b, DAEMON_LOCK).unwrap(), Holder::Nobody);
        assert!(try_lock_exclusive(&a, DAEMON_LOCK).unwrap());
        assert_eq!(holder(&b, DAEMON_LOCK).unwrap(), Holder::Writer);
        assert!(!try_lock_exclusive(&b, DAEMON_LOCK).unwrap());
        assert!(!try_lock_shared(&b, DAEMON_LOCK).unwrap());
        // Its own lock does not conflict with itself.
        assert_eq!(holder(&a, DAEMON_LOCK).unwrap(), Holder::Nobody);
        drop(a);
        assert_eq!(holder(&b, DAEMON_LOCK).unwrap(), Holder::Nobody);
        assert!(try_lock_exclusive(&b, DAEMON_LOCK).unwrap());
    }

    #[test]
    fn shared_locks_show_as_readers_and_unlock_releases() {
        let (_tmp, a, b) = two_descriptions();
        assert!(try_lock_shared(&a, DAEMON_LOCK).unwrap());
        assert_eq!(holder(&b, DAEMON_LOCK).unwrap(), Holder::Reader);
        assert!(!try_lock_exclusive(&b, DAEMON_LOCK).unwrap());
        unlock(&a, DAEMON_LOCK).unwrap();
        assert!(try_lock_exclusive(&b, DAEMON_LOCK).unwrap());
    }

    #[test]
    fn ranges_of_different_roles_are_independent_and_lie_past_any_segment() {
        let (_tmp, a, b) = two_descriptions();
        assert!(try_lock_exclusive(&a, entry_lock(3)).unwrap());
        assert!(try_lock_exclusive(&a, tenure_lock(3, 7)).unwrap());
        assert_eq!(holder(&b, tenure_lock(3, 7)).unwrap(), Holder::Writer);
        assert_eq!(holder(&b, tenure_lock(3, 8)).unwrap(), Holder::Nobody);
        assert_eq!(holder(&b, entry_lock(4)).unwrap(), Holder::Nobody);
        assert_eq!(holder(&b, DAEMON_LOCK).unwrap(), Holder::Nobody);
        assert!(tenure_lock(0, 0) > (1 << 39));
        assert_ne!(entry_lock(0), DAEMON_LOCK);
    }
}
