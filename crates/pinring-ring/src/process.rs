//! Process identity for messages and status views: pid plus start time. Liveness is never
//! judged from these (a pid means nothing in another PID namespace, and any writer of the segment
//! can change the recorded values): see [`crate::lock`].
//!
//! The start time is field 22 of `/proc/PID/stat` (clock ticks since boot). It is parsed by hand
//! (ten lines) rather than through the `procfs` crate, which would pull in a large dependency
//! tree for one field. The command name (field 2) may contain spaces and parentheses, so parsing
//! starts after the *last* `)`.

use std::fs;

/// A process as seen by peers: pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessId {
    /// The pid.
    pub pid: u32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
}

impl ProcessId {
    /// The calling process.
    pub fn current() -> ProcessId {
        let pid = std::process::id();
        ProcessId {
            pid,
            // /proc/self always exists for a running process on Linux.
            start_time: stat_of(pid).map(|s| s.start_time).unwrap_or(0),
        }
    }
}

/// The fields of a `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) line that pinring reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Command (thread) name, field 2, without the parentheses.
    pub comm: String,
    /// State letter, field 3 (`Z` and `X` are dead).
    pub state: char,
    /// User-mode CPU time in clock ticks, field 14.
    pub utime: u64,
    /// Kernel-mode CPU time in clock ticks, field 15.
    pub stime: u64,
    /// Start time in clock ticks since boot, field 22.
    pub start_time: u64,
}

fn stat_of(pid: u32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses a stat line; `None` if it is malformed.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // After ')' come fields 3.. : fields[0] is field 3.
    let fields: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        comm,
        state: fields.first()?.chars().next()?,
        utime: field(14)?,
        stime: field(15)?,
        start_time: field(22)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_command_name_with_spaces_and_parens() {
        let line = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.comm, "my (odd) name");
        assert_eq!(s.state, 'S');
        assert_eq!((s.utime, s.stime), (1, 2));
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn the_current_process_has_a_start_time() {
        let me = ProcessId::current();
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time > 0);
    }
}
