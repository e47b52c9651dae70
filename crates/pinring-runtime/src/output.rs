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
//!   [`OutputError`], which the binaries exit with as code 9 (`Exit::Output`).
//!
//! **Standard output.** [`outln!`](crate::outln) and [`out!`](crate::out) print through one
//! writer that ends quietly when the reader has gone (EPIPE, as in `pinring status | head -1`):
//! the rest of the output is dropped, the command finishes and exits with its own code, and
//! loops that print (`status --watch`) stop when [`stdout_closed`] says so.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
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
    let kind = match std::fs::symlink_metadata(path) {
        Ok(m) => Some(m.file_type()),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io("looking at the path")(e)),
    };
    match kind {
        None => replace(what, path, bytes),
        Some(t) if t.is_file() => replace(what, path, bytes),
        Some(t) if t.is_fifo() || t.is_char_device() => {
            let mut f = open_existing(path, t.is_fifo()).map_err(|e| {
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
        Some(t) if t.is_symlink() => Err(refuse(
            "a symbolic link",
            "name the file it points to, or another path (a link in a directory others can \
             write could send the write anywhere)",
        )),
        Some(t) if t.is_dir() => Err(refuse("a directory", "name a file inside it")),
        Some(t) if t.is_block_device() => Err(refuse(
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

/// Opens an existing FIFO or character device for writing: no create, no truncate, no link
/// followed. A FIFO is opened non-blocking, so one with no reader fails with ENXIO at once
/// instead of waiting for a reader for ever; the writes are then blocking again.
fn open_existing(path: &Path, fifo: bool) -> std::io::Result<File> {
    let mut flags = nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NOCTTY;
    if fifo {
        flags |= nix::libc::O_NONBLOCK;
    }
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(path)?;
    if fifo {
        let fl = nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_GETFL)?;
        let mut fl = nix::fcntl::OFlag::from_bits_retain(fl);
        fl.remove(nix::fcntl::OFlag::O_NONBLOCK);
        nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_SETFL(fl))?;
    }
    Ok(f)
}

/// Writes a new temporary file beside `path` (`O_CREAT|O_EXCL`, a random name: no link is
/// followed, no existing file reused) and renames it over `path`. On any failure the temporary
/// file is removed and `path` is untouched.
fn replace(what: &'static str, path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let io = |op| io_error(what, path, op);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(NEW_FILE_MODE))
        .tempfile_in(dir)
        .map_err(io("creating a temporary file beside it"))?;
    tmp.write_all(bytes).map_err(io("writing"))?;
    tmp.persist(path)
        .map_err(|e| io("renaming the temporary file over it")(e.error))?;
    Ok(())
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
    use std::os::unix::fs::symlink;

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
