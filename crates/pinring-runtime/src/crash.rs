//! The frame around each binary's `main`: a panic (a bug) is reported and becomes exit 1
//! ("internal", in the README's exit-code table) instead of Rust's unlisted 101, and a closed
//! output pipe can never kill a process.
//!
//! * **Panics.** The hook writes the panic's thread, location and message to stderr (and a
//!   backtrace when `RUST_BACKTRACE` asks for one), ignoring write errors, so reporting a panic
//!   cannot panic again. [`guard`] catches a panic of the main thread, lets it unwind (destructors
//!   run, child processes of `pinring run` are stopped and reaped) and returns [`Exit::Internal`].
//!   A panic in a helper thread is reported by the same hook; the thread's owner notices it gone
//!   (the daemon's sink thread, the upload threads) and stops with exit 1 as well. Panics that
//!   are caught on purpose (the CUDA driver wrapper's, turned into backend errors) are reported
//!   by the hook too, as Rust's default hook did.
//! * **SIGPIPE.** Rust's runtime already sets SIGPIPE to "ignore" before `main`; [`guard`] sets it
//!   again, explicitly, so that a write to a pipe whose reader is gone (`pinring daemon 2>&1 |
//!   head`) is an `EPIPE` error, which the log writer (`logging.rs`) drops, never a signal that
//!   kills the daemon and leaves its segment behind.

use pinring_exit::Exit;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe, PanicHookInfo};
use std::process::ExitCode;

/// Runs a binary's body: ignores SIGPIPE, installs the panic hook, and maps a panic of `body`
/// to [`Exit::Internal`].
pub fn guard(body: impl FnOnce() -> Exit) -> ExitCode {
    guarded(body).into()
}

/// [`guard`], returning the [`Exit`] itself (for a caller that is not `main`: the Python
/// package's console scripts).
pub fn guarded(body: impl FnOnce() -> Exit) -> Exit {
    ignore_sigpipe();
    std::panic::set_hook(Box::new(report_panic));
    caught(body)
}

/// `body`'s exit, or [`Exit::Internal`] (with a line saying so) when it panicked.
fn caught(body: impl FnOnce() -> Exit) -> Exit {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}: internal error: a panic (reported above) stopped this process; this is a bug, \
             please report it with that message (exit {})",
            program(),
            Exit::Internal.code()
        );
        Exit::Internal
    })
}

/// Sets SIGPIPE to "ignore" (see the module documentation); a failure is reported and
/// otherwise ignored: Rust's runtime has set the same disposition already.
fn ignore_sigpipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler function, so no code runs in signal context; the
    // disposition is process-wide and nothing in pinring relies on SIGPIPE being delivered.
    let result = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
    if let Err(e) = result {
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}: cannot ignore SIGPIPE ({e}); relying on the Rust runtime's default",
            program()
        );
    }
}

/// The panic hook: one report on stderr, written without panicking.
fn report_panic(info: &PanicHookInfo<'_>) {
    let mut report = panic_report(
        &program(),
        std::thread::current().name().unwrap_or("<unnamed>"),
        info,
    );
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        report.push_str(&format!("backtrace:\n{backtrace}\n"));
    }
    let _ = std::io::stderr().lock().write_all(report.as_bytes());
}

/// The report's text: program, thread, location and message.
fn panic_report(program: &str, thread: &str, info: &PanicHookInfo<'_>) -> String {
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_else(|| "an unknown location".into());
    format!(
        "{program}: panic in thread '{thread}' at {location}: {}\n",
        panic_message(info.payload())
    )
}

/// A panic payload as text.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(a payload that is not text)"
    }
}

/// This executable's file name, for reports.
fn program() -> String {
    if let Some(name) = crate::this_program::name() {
        return name.to_string();
    }
    std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pinring".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const WORKER: &str = "crash-test-worker";

    /// The report names the thread, the file and line, and the message; captured by a
    /// temporary hook (which records only this test's thread) in a thread of its own.
    #[test]
    fn a_panic_report_names_thread_location_and_message() {
        let seen = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&seen);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(WORKER) {
                *sink.lock().unwrap() = panic_report("pinring-daemon", WORKER, info);
            }
        }));
        let line = line!() + 3;
        let joined = std::thread::Builder::new()
            .name(WORKER.into())
            .spawn(|| panic!("slot {} out of range", 7))
            .unwrap()
            .join();
        std::panic::set_hook(previous);
        assert!(joined.is_err());
        let report = seen.lock().unwrap().clone();
        assert!(
            report.starts_with("pinring-daemon: panic in thread 'crash-test-worker' at "),
            "{report}"
        );
        assert!(report.contains(&format!("crash.rs:{line}:")), "{report}");
        assert!(report.ends_with(": slot 7 out of range\n"), "{report}");
    }

    #[test]
    fn a_panic_in_the_body_is_exit_1_and_a_normal_return_passes_through() {
        assert_eq!(caught(|| Exit::Verify), Exit::Verify);
        assert_eq!(caught(|| panic!("a bug")), Exit::Internal);
        assert_eq!(Exit::Internal.code(), 1);
    }

    #[test]
    fn panic_payloads_of_both_text_kinds_are_shown() {
        let a: Box<dyn std::any::Any + Send> = Box::new("static text");
        let b: Box<dyn std::any::Any + Send> = Box::new(String::from("formatted text"));
        let c: Box<dyn std::any::Any + Send> = Box::new(17_u32);
        assert_eq!(panic_message(&*a), "static text");
        assert_eq!(panic_message(&*b), "formatted text");
        assert_eq!(panic_message(&*c), "(a payload that is not text)");
    }
}
