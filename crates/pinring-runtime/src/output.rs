//! Everything pinring writes for its user: files named on the command line (the summary, the
//! bench's CSV, plot and per-run files, the developers' profile) and standard output.
//!
//! **Files.** A path may lie in a directory another user can write, and pinring often runs as
//! root, so a file is never written by following a name blindly ([`write_file`]):
//! - `-` is standard output;
//! - a missing path or a regular file is replaced atomically: the bytes go to a new temporary
//!   file beside it, created with `O_CREAT|O_EXCL` and a random name (so no link planted there
//!   is followed and no existing file is reused), which is then renamed over the path (the
//!   rename replaces the directory entry, never a file some link points to);
//! - a FIFO or a character device (a script reading the summary, `/dev/null`) is written into
//!   as it is, never replaced; a FIFO with no reader is an error, not a hang;
//! - anything else (a symbolic link, a directory, a socket, a block device) is refused with
//!   [`OutputError`], which the binaries exit with as code 9 (`Exit::Output`);
//! - the directory is reached one component at a time (`openat` with `O_NOFOLLOW`) and the
//!   file is looked at, created and renamed relative to that directory's descriptor, so no
//!   component can be swapped for a link between the check and the write. A symbolic link on
//!   the way is followed only when root or this user owns it (the rule the kernel's
//!   `fs.protected_symlinks` applies in sticky directories, here applied in every directory):
//!   one that another user owns could have been planted to send the write anywhere, and is
//!   refused, naming it and its owner.
//!
//! **Standard output.** [`outln!`](crate::outln) and [`out!`](crate::out) print through one
//! writer that ends quietly when the reader has gone (EPIPE, as in `pinring status | head -1`):
//! the rest of the output is dropped, the command finishes and exits with its own code, and
//! loops that print (`status --watch`) stop when [`stdout_closed`] says so.

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use std::ffi::OsString;
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Why an output file was not written. Nothing at its path was changed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The path names something pinring does not write into or replace.
    #[error(
        "{what} {path}: it is {kind}, which pinring neither writes through nor replaces; {fix}"
    )]
    Refused {
        /// What the file is for ("the summary").
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
        /// What to do instead.
        fix: &'static str,
    },
    /// A directory on the way to the path is a symbolic link another user owns.
    #[error(
        "{what} {path}: {link} on the way to it is a symbolic link owned by uid {owner}, which \
         pinring does not follow (another user could point it anywhere); name the directory it \
         points to, or a path without it"
    )]
    ForeignLink {
        /// What the file is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The link, as far as the path names it.
        link: PathBuf,
        /// Its owner.
        owner: u32,
    },
    /// A FIFO that no process is reading.
    #[error(
        "{what} {path}: it is a FIFO that no process has open for reading; start the reader \
         first, or name a regular file"
    )]
    NoReader {
        /// What the file is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// A system call failed.
    #[error(
        "cannot write {what} {path}: {op} failed: {source}; check the path, its permissions and free space"
    )]
    Io {
        /// What the file is for.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl pinring_exit::Coded for OutputError {
    /// The exit code: every output failure is "output" (9); the data path was not affected.
    fn exit(&self) -> pinring_exit::Exit {
        crate::Exit::Output
    }
}

/// Mode of a file [`write_file`] creates, passed to `open(2)`, so the umask applies as to a
/// file a shell redirection makes.
const NEW_FILE_MODE: u32 = 0o644;

/// Writes `bytes` to `path` as described in the module docs; `what` names the file in errors
/// ("the summary", "the bench's CSV").
pub fn write_file(what: &'static str, path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let io = |op| io_error(what, path, op);
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(bytes)
            .and_then(|()| out.flush())
            .map_err(io("writing to standard output"));
    }
    let refuse = |kind: &'static str, fix: &'static str| OutputError::Refused {
        what,
        path: path.to_path_buf(),
        kind,
        fix,
    };
    let Some(name) = path.file_name() else {
        return Err(refuse("a directory", "name a file inside it"));
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = open_dir(what, path, dir)?;
    let kind = match nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Some(SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())),
        Err(nix::Error::ENOENT) => None,
        Err(e) => return Err(io("looking at the path")(e.into())),
    };
    match kind {
        None => replace(what, path, &dir, name, bytes),
        Some(SFlag::S_IFREG) => replace(what, path, &dir, name, bytes),
        Some(t @ (SFlag::S_IFIFO | SFlag::S_IFCHR)) => {
            let fifo = t == SFlag::S_IFIFO;
            let mut f = open_existing(&dir, name, fifo).map_err(|e| {
                if e.raw_os_error() == Some(nix::libc::ENXIO) {
                    OutputError::NoReader {
                        what,
                        path: path.to_path_buf(),
                    }
                } else {
                    io("opening it for writing")(e)
                }
            })?;
            f.write_all(bytes).map_err(io("writing"))
        }
        Some(SFlag::S_IFLNK) => Err(refuse(
            "a symbolic link",
            "name the file it points to, or another path (a link in a directory others can \
             write could send the write anywhere)",
        )),
        Some(SFlag::S_IFDIR) => Err(refuse("a directory", "name a file inside it")),
        Some(SFlag::S_IFBLK) => Err(refuse(
            "a block device",
            "name a regular file, a FIFO, or - for standard output",
        )),
        Some(_) => Err(refuse(
            "a socket or another special file",
            "name a regular file, a FIFO, or - for standard output",
        )),
    }
}

/// The error of a failed `op` on output file `path`, as a `map_err` argument.
fn io_error<'a>(
    what: &'static str,
    path: &'a Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> OutputError + 'a {
    move |source| OutputError::Io {
        what,
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Most symbolic links followed on the way to one output directory (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// Opens directory `dir` (`O_PATH`) one component at a time with `O_NOFOLLOW`, following a
/// symbolic link on the way only when root or this user owns it (see the module docs).
fn open_dir(what: &'static str, path: &Path, dir: &Path) -> Result<OwnedFd, OutputError> {
    use std::collections::VecDeque;
    use std::path::Component;
    let io = |op| io_error(what, path, op);
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let open_at = |at: &OwnedFd, name: &std::ffi::OsStr| {
        nix::fcntl::openat(at, name, flags | OFlag::O_NOFOLLOW, Mode::empty())
    };
    let start = |absolute: bool| {
        nix::fcntl::open(if absolute { "/" } else { "." }, flags, Mode::empty())
            .map_err(|e| io("opening its directory")(e.into()))
    };
    let me = nix::unistd::geteuid().as_raw();
    let mut fd = start(dir.is_absolute())?;
    let mut todo: VecDeque<OsString> = VecDeque::new();
    let push_front = |todo: &mut VecDeque<OsString>, p: &Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push_front(n.to_os_string()),
                Component::ParentDir => todo.push_front("..".into()),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
    };
    push_front(&mut todo, dir);
    // The path walked so far, for messages.
    let mut walked = if dir.is_absolute() {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    };
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let here = walked.join(&name);
        match open_at(&fd, &name) {
            Ok(next) => {
                fd = next;
                walked = here;
                continue;
            }
            // O_NOFOLLOW with O_DIRECTORY: a link fails with ENOTDIR (or ELOOP); anything else
            // is an error of the path itself.
            Err(nix::Error::ENOTDIR | nix::Error::ELOOP) => {}
            Err(e) => return Err(io("opening its directory")(e.into())),
        }
        let st = nix::sys::stat::fstatat(&fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| io("looking at its directory")(e.into()))?;
        if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFLNK.bits() {
            return Err(io("opening its directory")(
                std::io::Error::from_raw_os_error(nix::libc::ENOTDIR),
            ));
        }
        if st.st_uid != 0 && st.st_uid != me {
            return Err(OutputError::ForeignLink {
                what,
                path: path.to_path_buf(),
                link: here,
                owner: st.st_uid,
            });
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(io("opening its directory")(
                std::io::Error::from_raw_os_error(nix::libc::ELOOP),
            ));
        }
        let target = PathBuf::from(
            nix::fcntl::readlinkat(&fd, name.as_os_str())
                .map_err(|e| io("reading a link on the way")(e.into()))?,
        );
        if target.is_absolute() {
            fd = start(true)?;
        }
        push_front(&mut todo, &target);
        walked = here;
    }
    Ok(fd)
}

/// Opens an existing FIFO or character device `name` in `dir` for writing: no create, no
/// truncate, no link followed. A FIFO is opened non-blocking, so one with no reader fails with
/// ENXIO at once instead of waiting for a reader for ever; the writes are then blocking again.
fn open_existing(dir: &OwnedFd, name: &std::ffi::OsStr, fifo: bool) -> std::io::Result<File> {
    let mut flags = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    if fifo {
        flags |= OFlag::O_NONBLOCK;
    }
    let f = File::from(nix::fcntl::openat(dir, name, flags, Mode::empty())?);
    if fifo {
        let fl = nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_GETFL)?;
        let mut fl = OFlag::from_bits_retain(fl);
        fl.remove(OFlag::O_NONBLOCK);
        nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_SETFL(fl))?;
    }
    Ok(f)
}

/// Writes a new temporary file beside `name` in `dir` (`O_CREAT|O_EXCL|O_NOFOLLOW`, a random
/// name: no link is followed, no existing file reused) and renames it over `name`, both relative
/// to `dir`'s descriptor. On any failure the temporary file is removed and `name` is untouched.
fn replace(
    what: &'static str,
    path: &Path,
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    bytes: &[u8],
) -> Result<(), OutputError> {
    use std::hash::BuildHasher;
    let io = |op| io_error(what, path, op);
    let flags = OFlag::O_WRONLY
        | OFlag::O_CREAT
        | OFlag::O_EXCL
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY;
    // A fresh random key per attempt (RandomState is seeded from the OS); O_EXCL makes a name
    // that exists, planted or not, a retry, never a reuse.
    let (tmp, file) = (0..64)
        .find_map(|attempt: u32| {
            let key = std::collections::hash_map::RandomState::new()
                .hash_one((std::process::id(), attempt));
            let mut tmp = OsString::from(".");
            tmp.push(name);
            tmp.push(format!(".{key:016x}.tmp"));
            match nix::fcntl::openat(
                dir,
                tmp.as_os_str(),
                flags,
                Mode::from_bits_truncate(NEW_FILE_MODE),
            ) {
                Ok(fd) => Some(Ok((tmp, File::from(fd)))),
                Err(nix::Error::EEXIST) => None,
                Err(e) => Some(Err(e)),
            }
        })
        .unwrap_or(Err(nix::Error::EEXIST))
        .map_err(|e| io("creating a temporary file beside it")(e.into()))?;
    let written = (&file)
        .write_all(bytes)
        .map_err(io("writing"))
        .and_then(|()| {
            nix::fcntl::renameat(dir, tmp.as_os_str(), dir, name)
                .map_err(|e| io("renaming the temporary file over it")(e.into()))
        });
    if written.is_err() {
        let _ = nix::unistd::unlinkat(
            dir,
            tmp.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    written
}

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether standard output's reader has gone (a write failed with EPIPE): printing loops stop.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Relaxed)
}

/// Writes to standard output through one lock; after the reader has gone (EPIPE) every write
/// is dropped quietly. Any other error is dropped too: what pinring prints on stdout is for a
/// person or a pipe, and losing it must never change a command's exit code or panic.
pub fn print(args: std::fmt::Arguments<'_>) {
    if stdout_closed() {
        return;
    }
    let mut out = std::io::stdout().lock();
    let r = out.write_fmt(args).and_then(|()| out.flush());
    if let Err(e) = r {
        if e.kind() == ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, Relaxed);
        }
    }
}

/// `print!` through [`output::print`](crate::output::print()): quiet on a closed pipe.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::print(format_args!($($arg)*)) };
}

/// `println!` through [`output::print`](crate::output::print()): quiet on a closed pipe.
#[macro_export]
macro_rules! outln {
    () => { $crate::output::print(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinring_exit::Coded;
    use std::os::unix::fs::{symlink, FileTypeExt};

    #[test]
    fn a_directory_reached_through_this_users_own_links_is_written_in() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        // A relative link and an absolute one, one after the other, then `..` through a link.
        symlink("real", dir.path().join("rel")).unwrap();
        symlink(dir.path().join("rel"), dir.path().join("abs")).unwrap();
        write_file("the summary", &dir.path().join("abs/s.json"), b"one\n").unwrap();
        assert_eq!(std::fs::read(real.join("s.json")).unwrap(), b"one\n");
        std::fs::create_dir(real.join("sub")).unwrap();
        write_file(
            "the summary",
            &dir.path().join("rel/sub/../t.json"),
            b"two\n",
        )
        .unwrap();
        assert_eq!(std::fs::read(real.join("t.json")).unwrap(), b"two\n");
        let names: Vec<_> = std::fs::read_dir(&real).unwrap().collect();
        assert_eq!(names.len(), 3, "no temporary file remains: {names:?}");
        // A link loop ends in an error, not a hang.
        symlink("loop", dir.path().join("loop")).unwrap();
        let e = write_file("the summary", &dir.path().join("loop/s.json"), b"x").unwrap_err();
        assert!(matches!(e, OutputError::Io { .. }), "{e}");
        // A regular file on the way is an error naming the path.
        let e = write_file("the summary", &real.join("s.json/x"), b"x").unwrap_err();
        assert!(e.to_string().contains("s.json/x"), "{e}");
    }

    #[test]
    fn a_link_on_the_way_owned_by_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: giving a link to another user needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        let link = dir.path().join("out");
        symlink(&victim, &link).unwrap();
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &link,
            Some(nix::unistd::Uid::from_raw(65534)),
            None,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        let e = write_file("the summary", &link.join("s.json"), b"x").unwrap_err();
        assert!(
            matches!(&e, OutputError::ForeignLink { owner: 65534, link: l, .. } if *l == link),
            "{e}"
        );
        assert_eq!(e.exit(), pinring_exit::Exit::Output);
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_or_regular_file_is_replaced_atomically_and_no_temporary_file_remains() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        write_file("the summary", &p, b"one\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one\n");
        write_file("the summary", &p, b"two\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two\n");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_planted_temporary_link_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let p = dir.path().join("s.json");
        // The name the old writer used, and a few others a guesser might plant.
        for tmp in ["s.json.tmp", ".s.json.tmp", "s.tmp"] {
            symlink(&victim, dir.path().join(tmp)).unwrap();
        }
        write_file("the summary", &p, b"new\n").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&p).unwrap(), b"new\n");
    }

    #[test]
    fn a_link_at_the_path_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let p = dir.path().join("s.json");
        symlink(&victim, &p).unwrap();
        let e = write_file("the summary", &p, b"new\n").unwrap_err();
        assert!(matches!(e, OutputError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(e.exit(), crate::Exit::Output);
        assert!(std::fs::symlink_metadata(&p).unwrap().is_symlink());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_file("the summary", dir.path(), b"x").unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    #[test]
    fn a_character_device_is_written_into_and_never_replaced() {
        let null = Path::new("/dev/null");
        write_file("the summary", null, b"gone\n").unwrap();
        assert!(std::fs::symlink_metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
        // A device that refuses the bytes is an error naming it, and stays a device.
        let full = Path::new("/dev/full");
        if full.exists() {
            let e = write_file("the summary", full, b"x").unwrap_err();
            assert!(e.to_string().contains("/dev/full"), "{e}");
            assert!(std::fs::symlink_metadata(full)
                .unwrap()
                .file_type()
                .is_char_device());
        }
    }

    #[test]
    fn a_fifo_is_written_into_when_read_and_refused_at_once_without_a_reader() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("s.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = write_file("the summary", &fifo, b"x").unwrap_err();
        assert!(matches!(e, OutputError::NoReader { .. }), "{e}");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        // The reader's open blocks until a writer opens; the writer's non-blocking open fails
        // until the reader is there: retry until it is (each try is a system call, no sleep
        // stands in for the reader).
        loop {
            match write_file("the summary", &fifo, b"through the fifo\n") {
                Ok(()) => break,
                Err(OutputError::NoReader { .. }) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(reader.join().unwrap(), b"through the fifo\n");
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
    }
}
