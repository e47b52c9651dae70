//! How this program starts itself again: `pinring run` and `pinring bench` start the daemon,
//! the loaders and the bench's writers as children of their own program (`pinring daemon ...`).
//!
//! A native binary is its own executable (`/proc/self/exe`). The Python package runs the same
//! code inside an interpreter (`pinring` on PATH is a console script over the extension), where
//! the executable is Python: it says so once, before the command runs, with [`set`], and the
//! children are then `python -m pinring daemon ...`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// An executable and the arguments that come before a subcommand.
#[derive(Debug, Clone)]
pub struct ThisProgram {
    exe: PathBuf,
    prefix: Vec<OsString>,
}

static SET: OnceLock<ThisProgram> = OnceLock::new();
static NAME: OnceLock<String> = OnceLock::new();

/// Says how this program is started when it is not its own executable (an interpreter and its
/// arguments, e.g. `python -m pinring`), and its name for messages (`pinring-loader`, where
/// the first argument of the process is `python3`). The first call wins; later ones are
/// ignored.
pub fn set(exe: PathBuf, prefix: Vec<OsString>, name: &str) {
    let _ = SET.set(ThisProgram { exe, prefix });
    let _ = NAME.set(name.to_string());
}

/// The name [`set`] gave, if any.
pub fn name() -> Option<&'static str> {
    NAME.get().map(String::as_str)
}

/// This program: what [`set`] said, else the current executable.
pub fn get() -> std::io::Result<ThisProgram> {
    if let Some(p) = SET.get() {
        return Ok(p.clone());
    }
    Ok(ThisProgram::at(std::env::current_exe()?))
}

impl ThisProgram {
    /// The program at `exe`, started with no arguments before the subcommand.
    pub fn at(exe: PathBuf) -> ThisProgram {
        ThisProgram {
            exe,
            prefix: Vec::new(),
        }
    }

    /// A command that starts this program; the subcommand and its arguments follow.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.prefix);
        cmd
    }

    /// For messages: the executable and its prefix, as a shell would show them.
    pub fn display(&self) -> String {
        std::iter::once(self.exe.as_os_str())
            .chain(self.prefix.iter().map(|a| a.as_os_str()))
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_with_a_prefix_starts_with_it() {
        let p = ThisProgram {
            exe: "/usr/bin/python3".into(),
            prefix: vec!["-m".into(), "pinring".into()],
        };
        let mut cmd = p.command();
        cmd.arg("daemon");
        assert_eq!(cmd.get_program(), "/usr/bin/python3");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["-m", "pinring", "daemon"]);
        assert_eq!(p.display(), "/usr/bin/python3 -m pinring");
    }
}
