//! Exit codes shared by every pinring binary, so that systemd units and scripts can tell "bad
//! config" from "GPU gone" from "peer died". The README's table is generated from the same list.

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
