//! Logging through `tracing`, journald-friendly: plain text to stderr, no colour unless stderr is
//! a terminal, level from `--log-level` (daemon and loaders), else `RUST_LOG`, else `info`.
//!
//! Two shapes. The daemon and the loaders are services and log for their whole life: each line
//! has its timestamp and level ([`init`], [`init_with`]). A one-shot command run by a person
//! (`pinring run`, `consume`, `status`, `clean`, `config check`, `bench`) speaks in plain lines
//! ([`init_command`]): `error: ...`, `warning: ...`, an informational line as it is, with no
//! timestamp, level column or target; its final error is [`fail`]'s one `error: ...` line,
//! printed whatever the log level, before the command exits with its code.
//!
//! Logging never takes a process down: when stderr cannot be written (a pipe whose reader is
//! gone, `pinring daemon 2>&1 | head`; a full non-blocking pipe; a closed descriptor) the line is
//! dropped and the process carries on. tracing-subscriber's own report of a failed write (an
//! `eprintln!`, which panics when stderr is the broken pipe) is turned off as well, and SIGPIPE is
//! ignored (`crash.rs`), so a closed pipe is an error code, not a signal.

use std::io::{IsTerminal, Write};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops. `tag` names the process kind.
pub fn init(tag: &'static str) {
    init_with(tag, None);
}

/// [`init`] with an explicit level or filter (already checked by the flag's parser) that takes
/// precedence over `RUST_LOG`.
pub fn init_with(tag: &'static str, level: Option<&str>) {
    let filter = level
        .and_then(|l| EnvFilter::try_new(l).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        .log_internal_errors(false)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
    tracing::debug!(process = tag, pid = std::process::id(), "logging started");
}

/// Installs the global subscriber of a one-shot command once (later calls are no-ops): plain
/// lines for a person, `error: `/`warning: ` before an error or warning, nothing before an
/// informational line, no timestamp. The level is `RUST_LOG`'s, else `info`.
pub fn init_command(tag: &'static str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        .log_internal_errors(false)
        .with_ansi(false)
        .event_format(Plain)
        .try_init();
    tracing::debug!(process = tag, pid = std::process::id(), "logging started");
}

/// Prints the final error of a one-shot command: one line, `error: ` and the message, on
/// stderr, whatever the log level (it is the command's answer, not a log line). A stderr that
/// cannot be written loses the line; the exit code still tells.
pub fn fail(error: &dyn std::fmt::Display) {
    say(&format!("error: {error}"));
}

/// Prints `line` as it is on stderr (a one-shot command's notice to the person running it),
/// whatever the log level; dropped when stderr cannot be written.
pub fn say(line: &str) {
    let mut w = DropErrors(std::io::stderr().lock());
    let _ = writeln!(w, "{line}");
    let _ = w.flush();
}

/// The one-shot commands' line format: `error: `, `warning: `, `debug: ` or `trace: ` before
/// the message (nothing before an informational one), then the event's other fields.
#[derive(Debug, Clone, Copy)]
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "{}", level_prefix(*event.metadata().level()))?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// What a plain line starts with at `level`.
fn level_prefix(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error: ",
        Level::WARN => "warning: ",
        Level::INFO => "",
        Level::DEBUG => "debug: ",
        Level::TRACE => "trace: ",
    }
}

/// The log writer: stderr, locked for one event at a time, with write errors dropped.
#[derive(Debug, Clone, Copy)]
struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = DropErrors<std::io::StderrLock<'static>>;

    fn make_writer(&'a self) -> Self::Writer {
        DropErrors(std::io::stderr().lock())
    }
}

/// A writer that reports every write as done: an error of the inner writer (other than an
/// interrupted call, which is retried) drops the rest of the bytes it was given.
#[derive(Debug)]
pub struct DropErrors<W>(pub W);

impl<W: Write> Write for DropErrors<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            match self.0.write(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Ok(buf.len()),
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    /// Fails every write with `kind`, after `interrupts` interrupted calls; counts the calls.
    struct Failing {
        kind: ErrorKind,
        interrupts: usize,
        calls: usize,
    }

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            self.calls += 1;
            if self.interrupts > 0 {
                self.interrupts -= 1;
                return Err(Error::from(ErrorKind::Interrupted));
            }
            Err(Error::from(self.kind))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(Error::from(self.kind))
        }
    }

    #[test]
    fn a_broken_pipe_or_any_other_write_error_drops_the_line_without_an_error() {
        for kind in [
            ErrorKind::BrokenPipe,
            ErrorKind::WouldBlock,
            ErrorKind::Other,
        ] {
            let mut w = DropErrors(Failing {
                kind,
                interrupts: 2,
                calls: 0,
            });
            w.write_all(b"2026-01-01 INFO ring ready\n").unwrap();
            w.flush().unwrap();
            assert_eq!(
                w.0.calls, 3,
                "{kind:?}: two interrupted calls retried, then dropped"
            );
        }
    }

    #[test]
    fn a_working_writer_gets_every_byte() {
        let mut w = DropErrors(Vec::new());
        w.write_all(b"one line\n").unwrap();
        assert_eq!(w.0, b"one line\n");
    }
}
