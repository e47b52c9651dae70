//! Exit codes shared by every pinring binary, so that systemd units and scripts can tell "bad
//! config" from "GPU gone" from "peer died". The README's table is generated from the same list.
//!
//! Every error type of the workspace declares its code once, where it is defined, by
//! implementing [`Coded`]; the binaries and the Python exceptions read it from there. The crate
//! depends on nothing, so the lowest crate (pinring-ring) can use it.

#![forbid(unsafe_code)]

use std::process::ExitCode;

/// The documented exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Success (also: stopped by SIGTERM/SIGINT after a clean drain).
    Ok = 0,
    /// An unexpected internal error (a bug: please report it), including a panic (`crash.rs`).
    Internal = 1,
    /// Bad command line (unknown flag, bad value, `--start-seq` past the end of the plan).
    Usage = 2,
    /// Bad config file (syntax, unknown key, out-of-range value, a ring geometry the segment
    /// cannot hold), or bad dataset files: a file dataset that cannot be opened, or a sample a
    /// loader cannot read with `dataset.on_bad_sample = "fail"`.
    Config = 3,
    /// Ring/segment error: missing, corrupt, other layout version, truncated, held by a live
    /// daemon, or no room in /dev/shm.
    Ring = 4,
    /// A peer died: the loader's daemon is gone, or a child of `pinring run` died.
    PeerDied = 5,
    /// Verification failed: wrong bytes, a duplicate, a batch out of order, or a batch missing.
    Verify = 6,
    /// GPU backend error: no driver or device, a CUDA call failed.
    Backend = 7,
    /// Refused by the ring: the loader's config fingerprint differs, or the loader table is full.
    Refused = 8,
    /// An output file (the summary) could not be written; the data path was not affected.
    Output = 9,
}

impl Exit {
    /// Every code, for documentation and tests.
    pub const ALL: [Exit; 10] = [
        Exit::Ok,
        Exit::Internal,
        Exit::Usage,
        Exit::Config,
        Exit::Ring,
        Exit::PeerDied,
        Exit::Verify,
        Exit::Backend,
        Exit::Refused,
        Exit::Output,
    ];

    /// The numeric code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Short name used in logs and summaries.
    pub fn name(self) -> &'static str {
        match self {
            Exit::Ok => "ok",
            Exit::Internal => "internal",
            Exit::Usage => "usage",
            Exit::Config => "config",
            Exit::Ring => "ring",
            Exit::PeerDied => "peer-died",
            Exit::Verify => "verify",
            Exit::Backend => "backend",
            Exit::Refused => "refused",
            Exit::Output => "output",
        }
    }

    /// From a numeric code.
    pub fn from_code(code: i32) -> Option<Exit> {
        Exit::ALL.into_iter().find(|e| i32::from(e.code()) == code)
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// An error that knows the exit code a binary ends with for it (and so the Python exception it
/// becomes). Implemented once per error type, in the crate that defines it.
pub trait Coded {
    /// The exit code for this error.
    fn exit(&self) -> Exit;
}

impl<T: Coded + ?Sized> Coded for Box<T> {
    fn exit(&self) -> Exit {
        (**self).exit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_names_are_distinct() {
        for e in Exit::ALL {
            assert_eq!(Exit::from_code(i32::from(e.code())), Some(e));
        }
        let mut names: Vec<_> = Exit::ALL.iter().map(|e| e.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Exit::ALL.len());
        assert_eq!(Exit::from_code(10), None);
    }
}
