//! The POSIX shared-memory object behind a ring, and its mapping. This is one of the few modules
//! with `unsafe` in it: mapping, unmapping, and turning the mapping into references.
//!
//! Why not the `shared_memory` crate: it creates objects with mode 0600 only, exposes no file
//! descriptor (so no `fallocate` to reserve tmpfs pages, no `fstat` to detect truncation, no
//! `fchmod` for group access), leaves a crashed creator's object behind as an error on the next
//! create, and its handle is neither `Send` nor `Sync`. Every one of those is needed here, so the
//! segment goes straight to `open`/`fallocate`/`mmap` through `nix`.
//!
//! A daemon's segment is made unnamed (`O_TMPFILE` in /dev/shm), built, locked
//! ([`crate::lock`]) and only then linked under its name, so every file at a ring's path either is
//! a complete ring or is not pinring's.
//!
//! An **anonymous** segment ([`Segment::create_anonymous`]) is a `memfd` that is never linked
//! anywhere: it lives exactly as long as a process holds it open or mapped, so a creator that is
//! killed leaves nothing behind, and /dev/shm's size does not bound it. Other processes reach it
//! through its creator's descriptor, `/proc/<pid>/fd/<fd>` ([`Segment::path`],
//! [`Segment::open_at`]); its memfd label is `pinring.<name>`, by which [`find_anonymous`]
//! finds every anonymous ring on the host. Openers use `O_NONBLOCK | O_NOFOLLOW` and refuse anything
//! but a regular file, so a FIFO or a symbolic link planted at a ring's path cannot stall or
//! redirect them.

use crate::error::RingError;
use crate::layout::{DAEMON_PID_OFFSET, HEADER_BYTES, LAYOUT_VERSION, MAGIC};
use crate::{fault, lock};
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::libc;
use nix::sys::mman::{mmap, munmap, shm_unlink, MapFlags, ProtFlags};
use nix::sys::stat::{fchmod, fstat, FileStat, Mode};
use nix::unistd::linkat;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
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

/// An open, mapped segment. Unmapped on drop; the object itself stays until unlinked. Locks
/// taken through it ([`crate::lock`]) are released when it drops (the file is closed).
#[derive(Debug)]
pub struct Segment {
    name: String,
    file: File,
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
    /// (st_dev, st_ino) of the object when it was opened: a file at the same path with another
    /// identity is a replacement made behind our back.
    identity: (u64, u64),
    /// Entry in the SIGBUS watch table (see [`crate::fault`]).
    watch: Option<usize>,
    /// Where other processes open it: `Some` for an anonymous segment (its creator's
    /// `/proc/<pid>/fd/<fd>`), `None` for a named one (its [`object_path`]).
    at: Option<PathBuf>,
}

// SAFETY: the mapping is plain shared memory that any process may access concurrently anyway;
// the `Segment` hands out only atomics (`&Header`, `&SlotDesc`) and raw pointers whose use is
// governed by the slot protocol, so moving or sharing the handle between threads adds nothing
// that another process could not already do.
unsafe impl Send for Segment {}
// SAFETY: see `Send` above; `&Segment` only exposes atomics and raw pointers.
unsafe impl Sync for Segment {}

/// What is at a ring's path when a daemon wants to publish its own segment there.
enum Occupant {
    /// Nothing (the name vanished meanwhile): publish.
    Gone,
    /// A stale segment of this layout, or (with `replace`) anything this user may replace. A
    /// file is held open with a write lock on its daemon byte until it has been replaced, so no
    /// other daemon replaces it too; a symbolic link has no file to hold (`held` is None).
    Replaceable { held: Option<File>, what: String },
}

impl Segment {
    fn sys(&self, call: &'static str, source: nix::Error) -> RingError {
        sys_error(&self.name, call, source)
    }

    /// Creates a new segment for ring `name`, not yet visible under the name: an unnamed tmpfs
    /// file (`O_TMPFILE` in /dev/shm) with its mode and group set, `len` bytes reserved (so a full
    /// /dev/shm fails here with a clear error, not later with SIGBUS), the daemon's lock taken,
    /// and every page mapped and populated. [`Segment::publish`] gives it the name once the
    /// caller has built its contents, so no other process ever sees a half-made segment or one
    /// whose daemon holds no lock yet.
    pub fn create_unnamed(
        name: &str,
        len: u64,
        mode: u32,
        group: Option<u32>,
    ) -> Result<Segment, RingError> {
        validate_name(name)?;
        let oflag = OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(SHM_DIR, oflag, Mode::from_bits_truncate(mode))
            .map_err(|e| sys_error(name, "open(O_TMPFILE) in /dev/shm", e))?;
        // The umask may have stripped bits of `mode`; set exactly what was asked.
        if let Some(gid) = group {
            nix::unistd::fchown(&fd, None, Some(nix::unistd::Gid::from_raw(gid)))
                .map_err(|e| sys_error(name, "fchown (ring.group)", e))?;
        }
        fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(|e| sys_error(name, "fchmod", e))?;
        check_space(name, len)?;
        match nix::fcntl::fallocate(&fd, nix::fcntl::FallocateFlags::empty(), 0, len as i64) {
            Ok(()) => {}
            Err(nix::Error::ENOSPC) => return Err(no_space(name, len)),
            Err(e) => return Err(sys_error(name, "fallocate", e)),
        }
        take_daemon_lock(name, &fd)?;
        map(name, File::from(fd), len, Access::ReadWrite, true)
    }

    /// Creates an anonymous segment for ring `name`: a `memfd` (label `pinring.<name>`) of `len`
    /// bytes, reserved with `fallocate` (so a lack of memory fails here, not later with SIGBUS),
    /// the daemon's lock taken and every page mapped and populated. It is never given a name:
    /// other processes open it at [`Segment::path`] while this process holds it.
    pub fn create_anonymous(name: &str, len: u64) -> Result<Segment, RingError> {
        validate_name(name)?;
        let label = format!("{NAME_PREFIX}{name}");
        let fd =
            nix::sys::memfd::memfd_create(label.as_str(), nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .map_err(|e| sys_error(name, "memfd_create", e))?;
        match nix::fcntl::fallocate(&fd, nix::fcntl::FallocateFlags::empty(), 0, len as i64) {
            Ok(()) => {}
            Err(e @ (nix::Error::ENOSPC | nix::Error::ENOMEM)) => {
                return Err(RingError::NoMemory {
                    name: name.to_string(),
                    asked: len,
                    asked_mib: len >> 20,
                    source: e,
                })
            }
            Err(e) => return Err(sys_error(name, "fallocate", e)),
        }
        take_daemon_lock(name, &fd)?;
        let at = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            fd.as_raw_fd()
        ));
        let mut seg = map(name, File::from(fd), len, Access::ReadWrite, true)?;
        seg.at = Some(at);
        seg.owned();
        Ok(seg)
    }

    /// Gives a segment made by [`Segment::create_unnamed`] its name, atomically. If the name is
    /// taken, the file there is replaced only if no daemon holds it (its lock is free) and it is
    /// a ring of this layout; anything else (another user's file, a FIFO, garbage, a ring of
    /// another layout version) is refused unless `replace` is set, and another user's file is
    /// refused even then. Only the file that was checked is replaced: it stays locked from the
    /// check to the `rename(2)` that replaces it. Returns what was replaced, if anything.
    pub fn publish(&mut self, replace: bool) -> Result<Option<String>, RingError> {
        let path = object_path(&self.name);
        let proc_path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        for _ in 0..PUBLISH_TRIES {
            match linkat(
                AT_FDCWD,
                proc_path.as_str(),
                AT_FDCWD,
                &path,
                AtFlags::AT_SYMLINK_FOLLOW,
            ) {
                Ok(()) => {
                    self.owned();
                    return Ok(None);
                }
                Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(self.sys("linkat (publishing the ring's name)", e)),
            }
            let Occupant::Replaceable { held, what } = self.judge_occupant(replace)? else {
                continue;
            };
            let tmp = PathBuf::from(format!(
                "{SHM_DIR}/.{NAME_PREFIX}new.{}.{}",
                self.name,
                std::process::id()
            ));
            let _ = std::fs::remove_file(&tmp);
            linkat(
                AT_FDCWD,
                proc_path.as_str(),
                AT_FDCWD,
                &tmp,
                AtFlags::AT_SYMLINK_FOLLOW,
            )
            .map_err(|e| self.sys("linkat (a temporary name)", e))?;
            let renamed = nix::fcntl::renameat(AT_FDCWD, &tmp, AT_FDCWD, &path);
            if let Err(e) = renamed {
                let _ = std::fs::remove_file(&tmp);
                return Err(self.sys("rename (replacing the old segment)", e));
            }
            // Only now let the old file (and its lock) go.
            drop(held);
            self.owned();
            return Ok(Some(what));
        }
        Err(RingError::Contended {
            name: self.name.clone(),
            path,
        })
    }

    fn owned(&self) {
        if let Some(i) = self.watch {
            fault::set_owner(i, true);
        }
    }

    /// Whether the file was truncated under this process and the mapping now holds zero pages
    /// (the creator's only: [`crate::fault`]).
    pub fn faulted(&self) -> bool {
        self.watch.is_some_and(fault::faulted)
    }

    /// Looks at the file now at this segment's path, for [`Segment::publish`].
    fn judge_occupant(&self, replace: bool) -> Result<Occupant, RingError> {
        let name = self.name.as_str();
        let path = object_path(name);
        let flags = OFlag::O_RDWR | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::open(&path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => return Ok(Occupant::Gone),
            Err(nix::Error::ELOOP) if replace => return self.replaceable_link(),
            Err(nix::Error::ELOOP) => {
                return Err(not_regular(name, "a symbolic link", true));
            }
            Err(nix::Error::EACCES) | Err(nix::Error::EPERM) => {
                return Err(self.foreign_or_denied());
            }
            Err(e) => return Err(self.sys("open (the file at the ring's path)", e)),
        };
        let file = File::from(fd);
        let st = fstat(&file).map_err(|e| self.sys("fstat", e))?;
        let me = nix::unistd::geteuid().as_raw();
        // Another user's file is never replaced, not even by root: it may be a ring of another
        // service that happens to use the same name.
        if st.st_uid != me {
            return Err(RingError::ForeignOwner {
                name: name.to_string(),
                path,
                owner: st.st_uid,
                me,
            });
        }
        let kind = file_kind(st.st_mode);
        if kind != "a regular file" {
            if replace {
                return self.locked_if_still_named(file, format!("{kind} (--replace)"));
            }
            return Err(not_regular(name, kind, true));
        }
        // Exclusive: two daemons replacing the same stale file cannot both get here.
        let mut tries = 0;
        loop {
            if lock::try_lock_exclusive(&file, lock::DAEMON_LOCK)
                .map_err(|e| self.sys("fcntl(F_OFD_SETLK)", e))?
            {
                break;
            }
            match lock::holder(&file, lock::DAEMON_LOCK)
                .map_err(|e| self.sys("fcntl(F_OFD_GETLK)", e))?
            {
                lock::Holder::Writer => {
                    return Err(RingError::HeldByLiveDaemon {
                        name: name.to_string(),
                        path,
                        pid: read_daemon_pid(&file),
                    })
                }
                // A cleaner looking at it for a moment, or a lock just released.
                lock::Holder::Reader | lock::Holder::Nobody => {
                    tries += 1;
                    if tries > 100 {
                        return Err(RingError::Contended {
                            name: name.to_string(),
                            path,
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
        let (magic, version, size) = read_identity(&file);
        let what = if size < HEADER_BYTES as u64 || magic != MAGIC {
            if !replace {
                return Err(RingError::NotARing {
                    name: name.to_string(),
                    path,
                    found: magic,
                    fix: "remove the file, start the daemon with --replace, or pick another ring name",
                });
            }
            format!("a file of {size} bytes that is not a ring (--replace)")
        } else if version != LAYOUT_VERSION {
            if !replace {
                return Err(RingError::OtherVersionPresent {
                    name: name.to_string(),
                    path,
                    found: version,
                    expected: LAYOUT_VERSION,
                });
            }
            format!("a ring of layout version {version} (--replace)")
        } else {
            // A copy cut short or grown, or a scribbled header, is replaced all the same (no
            // daemon holds it), and said to be what it is.
            let problem = header_problem(&file, size).map_or(String::new(), |p| {
                format!(
                    ", and not whole: {p} (a copy or a scribble, not a ring as a daemon left it)"
                )
            });
            format!(
                "a stale segment left by a daemon that is no longer running (pid {}){problem}",
                read_daemon_pid(&file)
            )
        };
        self.locked_if_still_named(file, what)
    }

    /// The name may have been replaced since it was opened: only the checked file is replaced.
    fn locked_if_still_named(&self, file: File, what: String) -> Result<Occupant, RingError> {
        let st = fstat(&file).map_err(|e| self.sys("fstat", e))?;
        match nix::sys::stat::lstat(&object_path(&self.name)) {
            Ok(now) if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) => {
                Ok(Occupant::Replaceable {
                    held: Some(file),
                    what,
                })
            }
            Ok(_) | Err(nix::Error::ENOENT) => Ok(Occupant::Gone),
            Err(e) => Err(self.sys("lstat", e)),
        }
    }

    fn replaceable_link(&self) -> Result<Occupant, RingError> {
        let path = object_path(&self.name);
        let st = nix::sys::stat::lstat(&path).map_err(|e| self.sys("lstat", e))?;
        let me = nix::unistd::geteuid().as_raw();
        if st.st_uid != me {
            return Err(RingError::ForeignOwner {
                name: self.name.clone(),
                path,
                owner: st.st_uid,
                me,
            });
        }
        // A symbolic link holds no lock to take; rename(2) replaces the link itself.
        Ok(Occupant::Replaceable {
            held: None,
            what: "a symbolic link (--replace)".into(),
        })
    }

    fn foreign_or_denied(&self) -> RingError {
        let path = object_path(&self.name);
        let me = nix::unistd::geteuid().as_raw();
        match nix::sys::stat::lstat(&path) {
            Ok(st) if st.st_uid != me => RingError::ForeignOwner {
                name: self.name.clone(),
                path,
                owner: st.st_uid,
                me,
            },
            _ => RingError::PermissionDenied {
                name: self.name.clone(),
                path,
                uid: me,
            },
        }
    }

    /// Opens an existing segment and maps all of it. The path is opened with `O_NONBLOCK |
    /// O_NOFOLLOW` and must be a regular file (a FIFO, device or symbolic link planted at a
    /// ring's path is refused at once, never waited on). Checks only that it is at least a header
    /// page long; the caller validates the header against the returned file size.
    pub fn open(name: &str, access: Access) -> Result<Segment, RingError> {
        validate_name(name)?;
        Segment::open_path(name, &object_path(name), access, OFlag::O_NOFOLLOW)
    }

    /// Where [`Segment::open_at`] opened this segment (an anonymous ring's path); `None` for one
    /// opened by its name or created here.
    pub(crate) fn opened_at(&self) -> Option<&std::path::Path> {
        self.at.as_deref()
    }

    /// Opens the anonymous segment of ring `name` at `path` (its creator's
    /// `/proc/<pid>/fd/<fd>`, which [`Segment::path`] gave there) and maps all of it. The path is
    /// a link the kernel resolves to the memfd itself, so it is followed; what it leads to must
    /// be a regular file labelled `pinring.<name>`.
    pub fn open_at(
        name: &str,
        path: &std::path::Path,
        access: Access,
    ) -> Result<Segment, RingError> {
        validate_name(name)?;
        let labelled = std::fs::read_link(path)
            .is_ok_and(|target| anonymous_name(&target.to_string_lossy()) == Some(name));
        if !labelled {
            return Err(RingError::NotFound {
                name: name.to_string(),
                path: path.to_path_buf(),
            });
        }
        let mut seg = Segment::open_path(name, path, access, OFlag::empty())?;
        seg.at = Some(path.to_path_buf());
        Ok(seg)
    }

    /// [`Segment::open`] and [`Segment::open_at`]: opens `path` (with `follow` flags:
    /// `O_NOFOLLOW` for a name in /dev/shm), refuses anything but a regular file at least a
    /// header page long, and maps all of it. The caller validates the header against the size.
    fn open_path(
        name: &str,
        path: &std::path::Path,
        access: Access,
        follow: OFlag,
    ) -> Result<Segment, RingError> {
        let oflag = match access {
            Access::ReadOnly => OFlag::O_RDONLY,
            Access::ReadWrite => OFlag::O_RDWR,
        };
        let (file, st) = open_ring_path(name, path, oflag | follow)?
            .map_err(|kind| not_regular(name, kind, false))?;
        let size = st.st_size.max(0) as u64;
        if size < HEADER_BYTES as u64 {
            return Err(RingError::SizeMismatch {
                name: name.to_string(),
                path: path.to_path_buf(),
                expected: HEADER_BYTES as u64,
                actual: size,
            });
        }
        map(name, file, size, access, false)
    }

    /// Where other processes open this segment: its name's file in /dev/shm, or (anonymous)
    /// its creator's `/proc/<pid>/fd/<fd>`.
    pub fn path(&self) -> PathBuf {
        self.at.clone().unwrap_or_else(|| object_path(&self.name))
    }

    /// Whether the segment is anonymous (a memfd with no name in /dev/shm).
    pub fn is_anonymous(&self) -> bool {
        self.at.is_some()
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

    /// The open file (for lock calls and `fstat`).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Current size of the object (to detect truncation behind our back).
    pub fn file_size(&self) -> Result<u64, RingError> {
        let st = fstat(&self.file).map_err(|e| self.sys("fstat", e))?;
        Ok(st.st_size.max(0) as u64)
    }

    /// Whether the segment's path still names the object this mapping came from. `Ok(false)`:
    /// the name is gone or now names another file (replaced behind our back).
    pub fn still_named(&self) -> Result<bool, RingError> {
        if self.at.is_some() {
            // Anonymous: no name that could be taken away or given to another file.
            return Ok(true);
        }
        match nix::sys::stat::lstat(&object_path(&self.name)) {
            Ok(st) => Ok((st.st_dev, st.st_ino) == self.identity),
            Err(nix::Error::ENOENT) => Ok(false),
            Err(e) => Err(self.sys("lstat", e)),
        }
    }

    /// Removes the object's name only if it still names this object (never a replacement that
    /// another process put there). Returns whether it unlinked. Race-free for a caller holding
    /// the daemon lock (or a shared lock on it): nobody replaces a locked file.
    pub fn unlink_if_ours(&self) -> Result<bool, RingError> {
        if self.at.is_none() && self.still_named()? {
            Segment::unlink(&self.name)?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Owner uid of the object.
    pub fn owner_uid(&self) -> Result<u32, RingError> {
        let st = fstat(&self.file).map_err(|e| self.sys("fstat", e))?;
        Ok(st.st_uid)
    }

    /// Owner uid, group and mode bits of the object.
    pub fn owner_group_mode(&self) -> Result<(u32, u32, u32), RingError> {
        let st = fstat(&self.file).map_err(|e| self.sys("fstat", e))?;
        Ok((st.st_uid, st.st_gid, st.st_mode & 0o7777))
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
        if let Some(i) = self.watch {
            fault::unwatch(i);
        }
        // SAFETY: ptr/len are exactly what mmap returned, and no reference derived from the
        // mapping outlives `self` (all accessors borrow `self`).
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// How many times [`Segment::publish`] retries when the name changes under it.
const PUBLISH_TRIES: usize = 8;

fn map(
    name: &str,
    file: File,
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
    let st = fstat(&file).map_err(|e| sys_error(name, "fstat", e))?;
    let identity = (st.st_dev, st.st_ino);
    // SAFETY: a fresh shared file mapping at an address the kernel picks; it aliases no Rust
    // object. It is unmapped only in `Segment::drop`.
    let ptr =
        unsafe { mmap(None, nz, prot, flags, &file, 0) }.map_err(|e| sys_error(name, "mmap", e))?;
    let watch = fault::watch(&fault::Watched {
        base: ptr.as_ptr() as usize,
        len: len_usize,
        path: object_path(name).display().to_string(),
        identity,
        owner: false,
    });
    Ok(Segment {
        name: name.to_string(),
        file,
        ptr: ptr.cast(),
        len: len_usize,
        access,
        identity,
        watch,
        at: None,
    })
}

/// The ring name in a memfd's link text, if it is an anonymous ring's.
fn anonymous_name(link: &str) -> Option<&str> {
    let rest = link.strip_prefix("/memfd:")?.strip_prefix(NAME_PREFIX)?;
    let name = rest.strip_suffix(" (deleted)").unwrap_or(rest);
    validate_name(name).ok().map(|()| name)
}

/// An anonymous ring found in a process's descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonymousRing {
    /// The ring's name.
    pub name: String,
    /// The process holding it (its daemon, a loader or a consumer).
    pub pid: u32,
    /// Where to open it (`/proc/<pid>/fd/<fd>`).
    pub path: PathBuf,
}

/// Every anonymous ring this user can see: each (ring name, process) once, from the
/// descriptors in `/proc/*/fd` whose memfd label is `pinring.<name>`. Processes this user may not
/// look into are skipped.
pub fn find_anonymous() -> Vec<AnonymousRing> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if let Some(name) = anonymous_name(&link.to_string_lossy()) {
                if !found
                    .iter()
                    .any(|r: &AnonymousRing| r.name == name && r.pid == pid)
                {
                    found.push(AnonymousRing {
                        name: name.to_string(),
                        pid,
                        path: fd.path(),
                    });
                }
            }
        }
    }
    found.sort_by(|a, b| (&a.name, a.pid).cmp(&(&b.name, b.pid)));
    found
}

/// What [`clean_if_stale`] found at a ring's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleaning {
    /// A live daemon holds it: kept.
    Live {
        /// The pid its header names (informational).
        daemon_pid: u32,
    },
    /// A ring whose daemon is gone.
    Stale {
        /// The pid its header names (informational).
        daemon_pid: u32,
        /// Whether it was removed (false: a dry run).
        removed: bool,
        /// What is wrong with its header, if anything (a ring's magic and version over
        /// impossible geometry: scribbled, or cut short); removed all the same, no daemon
        /// holds it.
        corrupt: Option<String>,
        /// The segment's owner (uid), so that root's clean can say whose ring it removed.
        owner: u32,
    },
    /// Not something clean removes: kept, with the reason.
    Kept(String),
    /// This user may not open the segment (another user's, mode 0600 or 0660), so whether its
    /// daemon runs cannot be told: kept, neither live nor stale.
    Unreadable {
        /// The segment's owner (uid).
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
}

/// `pinring clean` for one ring: removes the segment at the ring's path if it is a ring of this
/// layout that no daemon holds. The file is held with a shared lock on its daemon byte from the
/// check to the unlink, and the unlink happens only while the name still refers to that file, so
/// a daemon starting at the same moment can neither lose its fresh segment nor be judged dead.
/// `remove = false` only reports.
pub fn clean_if_stale(name: &str, remove: bool) -> Result<Cleaning, RingError> {
    validate_name(name)?;
    let path = object_path(name);
    let opened = match open_ring_path(name, &path, OFlag::O_RDONLY | OFlag::O_NOFOLLOW) {
        Err(denied @ RingError::PermissionDenied { .. }) => {
            // The name's own inode tells whose it is without opening it.
            return match nix::sys::stat::lstat(&path) {
                Ok(st) => Ok(Cleaning::Unreadable {
                    owner: st.st_uid,
                    mode: st.st_mode & 0o7777,
                }),
                Err(_) => Err(denied),
            };
        }
        other => other?,
    };
    let (file, st) = match opened {
        Ok(opened) => opened,
        Err(kind) => return Ok(Cleaning::Kept(format!("{kind}, not a ring"))),
    };
    let owner = st.st_uid;
    let daemon_pid = read_daemon_pid(&file);
    if !lock::try_lock_shared(&file, lock::DAEMON_LOCK)
        .map_err(|e| sys_error(name, "fcntl(F_OFD_SETLK)", e))?
    {
        return Ok(Cleaning::Live { daemon_pid });
    }
    let (magic, version, size) = read_identity(&file);
    if size < HEADER_BYTES as u64 || magic != MAGIC {
        return Ok(Cleaning::Kept(format!(
            "not a ring ({size} bytes, magic {magic:#018x})"
        )));
    }
    if version != LAYOUT_VERSION {
        return Ok(Cleaning::Kept(format!(
            "a ring of layout version {version} (this build speaks {LAYOUT_VERSION}); its daemon \
             cannot be checked from here: remove it by hand once that daemon is stopped"
        )));
    }
    let corrupt = header_problem(&file, size);
    if !remove {
        return Ok(Cleaning::Stale {
            daemon_pid,
            removed: false,
            corrupt,
            owner,
        });
    }
    match nix::sys::stat::lstat(&path) {
        Ok(now) if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) => {}
        Ok(_) | Err(nix::Error::ENOENT) => {
            return Ok(Cleaning::Kept("replaced by a new daemon meanwhile".into()))
        }
        Err(e) => return Err(sys_error(name, "lstat", e)),
    }
    match nix::unistd::unlink(&path) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(Cleaning::Stale {
            daemon_pid,
            removed: true,
            corrupt,
            owner,
        }),
        Err(nix::Error::EACCES) | Err(nix::Error::EPERM) => Err(RingError::PermissionDenied {
            name: name.to_string(),
            path,
            uid: nix::unistd::geteuid().as_raw(),
        }),
        Err(e) => Err(sys_error(name, "unlink", e)),
    }
}

/// Opens a ring's path without blocking (and, with `O_NOFOLLOW` in `flags`, without following
/// links), and `fstat`s it. `Ok(Err(kind))`: the path holds something that is not a regular file
/// (what it is, for messages).
fn open_ring_path(
    name: &str,
    path: &std::path::Path,
    flags: OFlag,
) -> Result<Result<(File, FileStat), &'static str>, RingError> {
    let flags = flags | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => {
            return Err(RingError::NotFound {
                name: name.to_string(),
                path: path.to_path_buf(),
            })
        }
        Err(nix::Error::ELOOP) => return Ok(Err("a symbolic link")),
        Err(nix::Error::EACCES) | Err(nix::Error::EPERM) => {
            return Err(RingError::PermissionDenied {
                name: name.to_string(),
                path: path.to_path_buf(),
                uid: nix::unistd::geteuid().as_raw(),
            })
        }
        Err(e) => return Err(sys_error(name, "open", e)),
    };
    let file = File::from(fd);
    let st = fstat(&file).map_err(|e| sys_error(name, "fstat", e))?;
    match file_kind(st.st_mode) {
        "a regular file" => Ok(Ok((file, st))),
        kind => Ok(Err(kind)),
    }
}

/// Takes the daemon's lock on a segment just made (a fresh inode: nobody else can hold a lock
/// on it).
fn take_daemon_lock(name: &str, fd: &std::os::fd::OwnedFd) -> Result<(), RingError> {
    if !lock::try_lock_exclusive(fd, lock::DAEMON_LOCK)
        .map_err(|e| sys_error(name, "fcntl(F_OFD_SETLK) on the daemon byte", e))?
    {
        return Err(sys_error(name, "fcntl(F_OFD_SETLK)", nix::Error::EAGAIN));
    }
    Ok(())
}

/// What kind of file a `st_mode` describes, for messages.
fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

fn not_regular(name: &str, kind: &'static str, daemon: bool) -> RingError {
    RingError::NotRegular {
        name: name.to_string(),
        path: object_path(name),
        kind,
        fix: if daemon {
            "remove it, or start the daemon with --replace"
        } else {
            "remove it, then restart the ring's daemon"
        },
    }
}

/// (magic, version, file size) of a file, read with `pread` (never through a mapping, which a
/// truncated file would turn into SIGBUS).
fn read_identity(file: &File) -> (u64, u32, u64) {
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut b = [0u8; 12];
    if file.read_exact_at(&mut b, 0).is_err() {
        return (0, 0, size);
    }
    let magic = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    (magic, version, size)
}

/// What is wrong with the geometry a ring's header records, read with `pread` (for `pinring
/// clean`'s report; a daemon opening the ring checks much more).
fn header_problem(file: &File, size: u64) -> Option<String> {
    use crate::layout::Header;
    use std::mem::offset_of;
    let mut b = [0u8; offset_of!(Header, desc_offset)];
    if file.read_exact_at(&mut b, 0).is_err() {
        return Some(format!("the file ({size} bytes) is shorter than a header"));
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let (header_bytes, total, slots, desc_bytes, slot_bytes) = (
        u32_at(offset_of!(Header, header_bytes)),
        u64_at(offset_of!(Header, total_bytes)),
        u32_at(offset_of!(Header, slot_count)),
        u32_at(offset_of!(Header, desc_bytes)),
        u64_at(offset_of!(Header, slot_bytes)),
    );
    if header_bytes as usize != HEADER_BYTES {
        return Some(format!(
            "header_bytes is {header_bytes}, not {HEADER_BYTES}"
        ));
    }
    if desc_bytes as usize != crate::layout::DESC_BYTES {
        return Some(format!(
            "desc_bytes is {desc_bytes}, not {}",
            crate::layout::DESC_BYTES
        ));
    }
    if total != size {
        return Some(format!("total_bytes is {total}, the file has {size}"));
    }
    if crate::layout::Geometry::new(slots, slot_bytes).is_none() {
        return Some(format!(
            "{slots} slots of {slot_bytes} bytes is out of range"
        ));
    }
    None
}

/// The daemon pid recorded in a ring's header (informational only: for messages).
pub fn read_daemon_pid(file: &File) -> u32 {
    let mut b = [0u8; 4];
    match file.read_exact_at(&mut b, DAEMON_PID_OFFSET as u64) {
        Ok(()) => u32::from_le_bytes(b),
        Err(_) => 0,
    }
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
    fn clean_says_when_the_stale_ring_it_removes_had_a_corrupt_header() {
        let name = format!("test-cleancorrupt-{}", std::process::id());
        let path = object_path(&name);
        // A ring's magic and layout version over a header of zeros, in 8 KiB.
        let mut bytes = vec![0u8; 8192];
        bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let c = clean_if_stale(&name, true).unwrap();
        let Cleaning::Stale {
            removed: true,
            corrupt: Some(what),
            ..
        } = c
        else {
            panic!("{c:?}");
        };
        assert!(what.contains("header_bytes"), "{what}");
        assert!(!path.exists());
    }

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
        let err = Segment::create_unnamed(&name, 1 << 50, 0o600, None).unwrap_err();
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
