//! The POSIX shared-memory object behind a ring, and its mapping. This is one of the few modules
//! with `unsafe` in it: mapping, unmapping, and turning the mapping into references.
//!
//! Why not the `shared_memory` crate: it creates objects with mode 0600 only, exposes no file
//! descriptor (so no `fallocate` to reserve tmpfs pages, no `fstat` to detect truncation, no
//! `fchmod` for group access), leaves a crashed creator's object behind as an error on the next
//! create, and its handle is neither `Send` nor `Sync`. Every one of those is needed here, so the
//! segment goes straight to `shm_open`/`fallocate`/`mmap` through `nix`.

use crate::error::RingError;
use crate::layout::HEADER_BYTES;
use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::{fchmod, fstat, Mode};
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::ptr::NonNull;

/// Directory where Linux exposes POSIX shared memory objects.
pub const SHM_DIR: &str = "/dev/shm";
/// Prefix of every ring's object name.
pub const NAME_PREFIX: &str = "pinring.";

/// Checks a ring name: 1-64 of `[A-Za-z0-9_-]`.
pub fn validate_name(name: &str) -> Result<(), RingError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(RingError::InvalidName {
            name: name.to_string(),
        })
    }
}

/// The shm_open name of a ring (`/pinring.<name>`).
pub fn object_name(name: &str) -> String {
    format!("/{NAME_PREFIX}{name}")
}

/// The file of a ring's segment (`/dev/shm/pinring.<name>`).
pub fn object_path(name: &str) -> PathBuf {
    PathBuf::from(format!("{SHM_DIR}/{NAME_PREFIX}{name}"))
}

/// How to open a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Map read-only (status views: cannot disturb a run).
    ReadOnly,
    /// Map read-write (daemon, loaders).
    ReadWrite,
}

/// An open, mapped segment. Unmapped on drop; the object itself stays until unlinked.
#[derive(Debug)]
pub struct Segment {
    name: String,
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
    /// (st_dev, st_ino) of the object when it was opened: a file at the same path with another
    /// identity is a replacement made behind our back.
    identity: (u64, u64),
}

// SAFETY: the mapping is plain shared memory that any process may access concurrently anyway;
// the `Segment` hands out only atomics (`&Header`, `&SlotDesc`) and raw pointers whose use is
// governed by the slot protocol, so moving or sharing the handle between threads adds nothing
// that another process could not already do.
unsafe impl Send for Segment {}
// SAFETY: see `Send` above; `&Segment` only exposes atomics and raw pointers.
unsafe impl Sync for Segment {}

impl Segment {
    fn sys(&self, call: &'static str, source: nix::Error) -> RingError {
        sys_error(&self.name, call, source)
    }

    /// Creates a new object exclusively (`O_EXCL`), sets its mode, reserves `len` bytes of tmpfs
    /// (so a full /dev/shm fails here with a clear error, not later with SIGBUS) and maps it with
    /// every page populated. `Err(EEXIST)` is reported as `Ok(None)` so the caller can inspect the
    /// existing object.
    pub fn create(
        name: &str,
        len: u64,
        mode: u32,
        group: Option<u32>,
    ) -> Result<Option<Segment>, RingError> {
        validate_name(name)?;
        let oflag = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR;
        let fd = match shm_open(
            object_name(name).as_str(),
            oflag,
            Mode::from_bits_truncate(mode),
        ) {
            Ok(fd) => fd,
            Err(nix::Error::EEXIST) => return Ok(None),
            Err(e) => return Err(sys_error(name, "shm_open(O_CREAT|O_EXCL)", e)),
        };
        // From here on a failure must not leave a half-made object behind.
        let made = (|| {
            // The umask may have stripped bits of `mode`; set exactly what was asked.
            if let Some(gid) = group {
                nix::unistd::fchown(&fd, None, Some(nix::unistd::Gid::from_raw(gid)))
                    .map_err(|e| sys_error(name, "fchown (ring.group)", e))?;
            }
            fchmod(&fd, Mode::from_bits_truncate(mode))
                .map_err(|e| sys_error(name, "fchmod", e))?;
            check_space(name, len)?;
            match nix::fcntl::fallocate(&fd, nix::fcntl::FallocateFlags::empty(), 0, len as i64) {
                Ok(()) => {}
                Err(nix::Error::ENOSPC) => return Err(no_space(name, len)),
                Err(e) => return Err(sys_error(name, "fallocate", e)),
            }
            map(name, fd, len, Access::ReadWrite, true)
        })();
        match made {
            Ok(seg) => Ok(Some(seg)),
            Err(e) => {
                let _ = shm_unlink(object_name(name).as_str());
                Err(e)
            }
        }
    }

    /// Opens an existing object and maps all of it. Checks only that it is at least a header
    /// page long; the caller validates the header against the returned file size.
    pub fn open(name: &str, access: Access) -> Result<Segment, RingError> {
        validate_name(name)?;
        let oflag = match access {
            Access::ReadOnly => OFlag::O_RDONLY,
            Access::ReadWrite => OFlag::O_RDWR,
        };
        let fd = match shm_open(object_name(name).as_str(), oflag, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => {
                return Err(RingError::NotFound {
                    name: name.to_string(),
                    path: object_path(name),
                })
            }
            Err(nix::Error::EACCES) => {
                return Err(RingError::PermissionDenied {
                    name: name.to_string(),
                    path: object_path(name),
                    uid: nix::unistd::geteuid().as_raw(),
                })
            }
            Err(e) => return Err(sys_error(name, "shm_open", e)),
        };
        let st = fstat(&fd).map_err(|e| sys_error(name, "fstat", e))?;
        let size = st.st_size.max(0) as u64;
        if size < HEADER_BYTES as u64 {
            return Err(RingError::SizeMismatch {
                name: name.to_string(),
                path: object_path(name),
                expected: HEADER_BYTES as u64,
                actual: size,
            });
        }
        map(name, fd, size, access, false)
    }

    /// Removes the object's name; mappings stay valid until unmapped. Missing is not an error.
    pub fn unlink(name: &str) -> Result<(), RingError> {
        match shm_unlink(object_name(name).as_str()) {
            Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
            Err(e) => Err(sys_error(name, "shm_unlink", e)),
        }
    }

    /// The ring name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Mapped length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a segment is at least one header page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// How the segment is mapped.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Current size of the object (to detect truncation behind our back).
    pub fn file_size(&self) -> Result<u64, RingError> {
        let st = fstat(&self.fd).map_err(|e| self.sys("fstat", e))?;
        Ok(st.st_size.max(0) as u64)
    }

    /// Whether the segment's path still names the object this mapping came from. `Ok(false)`:
    /// the name is gone or now names another file (replaced behind our back).
    pub fn still_named(&self) -> Result<bool, RingError> {
        match nix::sys::stat::stat(&object_path(&self.name)) {
            Ok(st) => Ok((st.st_dev, st.st_ino) == self.identity),
            Err(nix::Error::ENOENT) => Ok(false),
            Err(e) => Err(self.sys("stat", e)),
        }
    }

    /// Removes the object's name only if it still names this object (never a replacement that
    /// another process put there). Returns whether it unlinked.
    pub fn unlink_if_ours(&self) -> Result<bool, RingError> {
        if self.still_named()? {
            Segment::unlink(&self.name)?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Owner uid of the object.
    pub fn owner_uid(&self) -> Result<u32, RingError> {
        let st = fstat(&self.fd).map_err(|e| self.sys("fstat", e))?;
        Ok(st.st_uid)
    }

    /// Base address of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// A shared reference to a `T` at `offset`.
    ///
    /// # Safety
    /// `T` must be a segment type made only of atomics (every bit pattern valid, interior
    /// mutability for concurrent writers), `offset` must be aligned for `T`, and
    /// `offset + size_of::<T>()` must be within the mapping.
    pub unsafe fn at<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.len);
        debug_assert_eq!(offset % std::mem::align_of::<T>(), 0);
        // SAFETY: the caller guarantees offset + size_of::<T>() is within the mapping.
        let p = unsafe { self.ptr.as_ptr().add(offset) }.cast::<T>();
        // SAFETY: the caller guarantees alignment, bounds and that T is made of atomics; the
        // mapping lives as long as `self`, which bounds the returned reference.
        unsafe { &*p }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned, and no reference derived from the
        // mapping outlives `self` (all accessors borrow `self`).
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

fn map(
    name: &str,
    fd: OwnedFd,
    len: u64,
    access: Access,
    populate: bool,
) -> Result<Segment, RingError> {
    let len_usize = usize::try_from(len).map_err(|_| sys_error(name, "mmap", nix::Error::EFBIG))?;
    let nz =
        NonZeroUsize::new(len_usize).ok_or_else(|| sys_error(name, "mmap", nix::Error::EINVAL))?;
    let prot = match access {
        Access::ReadOnly => ProtFlags::PROT_READ,
        Access::ReadWrite => ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
    };
    let mut flags = MapFlags::MAP_SHARED;
    if populate {
        // Prefault every page now: a registered range of untouched pages costs ~13x more to
        // register, and first-touch faults would otherwise land on the loaders' hot path.
        flags |= MapFlags::MAP_POPULATE;
    }
    let st = fstat(&fd).map_err(|e| sys_error(name, "fstat", e))?;
    let identity = (st.st_dev, st.st_ino);
    // SAFETY: a fresh shared file mapping at an address the kernel picks; it aliases no Rust
    // object. It is unmapped only in `Segment::drop`.
    let ptr =
        unsafe { mmap(None, nz, prot, flags, &fd, 0) }.map_err(|e| sys_error(name, "mmap", e))?;
    Ok(Segment {
        name: name.to_string(),
        fd,
        ptr: ptr.cast(),
        len: len_usize,
        access,
        identity,
    })
}

fn sys_error(name: &str, call: &'static str, source: nix::Error) -> RingError {
    RingError::Sys {
        name: name.to_string(),
        path: object_path(name),
        call,
        source,
    }
}

fn available_bytes() -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(SHM_DIR).ok()?;
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

fn no_space(name: &str, len: u64) -> RingError {
    let available = available_bytes().unwrap_or(0);
    RingError::NoSpace {
        name: name.to_string(),
        dir: SHM_DIR.to_string(),
        asked: len,
        asked_mib: len >> 20,
        available,
        available_mib: available >> 20,
    }
}

fn check_space(name: &str, len: u64) -> Result<(), RingError> {
    match available_bytes() {
        Some(avail) if avail < len => Err(no_space(name, len)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(validate_name("gpu0").is_ok());
        assert!(validate_name("a-b_C9").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("../etc").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn a_segment_larger_than_dev_shm_is_refused_up_front() {
        let name = format!("test-nospace-{}", std::process::id());
        let err = Segment::create(&name, 1 << 50, 0o600, None).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, RingError::NoSpace { .. }), "{msg}");
        assert!(
            msg.contains("/dev/shm") && msg.contains("asked for"),
            "{msg}"
        );
        assert!(
            !object_path(&name).exists(),
            "a failed create must leave nothing behind"
        );
    }
}
