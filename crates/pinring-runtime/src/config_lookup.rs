//! Where a process finds its config file, in a fixed, documented order (README "Config lookup"):
//!
//! 1. `--config FILE` (must exist);
//! 2. the file named by `$PINRING_CONFIG` (must exist);
//! 3. `./config/<ring>.toml`, then `./config/pinring.toml` (relative to the working directory);
//! 4. `$XDG_CONFIG_HOME/pinring/` (default `~/.config/pinring/`): `<ring>.toml`, then
//!    `pinring.toml`;
//! 5. `/etc/pinring/`: `<ring>.toml`, then `pinring.toml`;
//! 6. the built-in default (synthetic data; `config/pinring.toml` prints it with comments).
//!
//! `<ring>` is the name given with `--ring` (one file per ring: `/etc/pinring/gpu0.toml`); without
//! `--ring` only `pinring.toml` is looked for. An explicitly named file that is missing is an
//! error; a searched location that is missing is skipped. The first file found is used whole:
//! files are never merged, so what `pinring config check` prints is what runs.

use pinring_data::ConfigError;
use std::path::{Path, PathBuf};

/// Environment variable naming the config file (second in the lookup order).
pub const ENV_CONFIG: &str = "PINRING_CONFIG";
/// The system-wide config directory.
pub const SYSTEM_DIR: &str = "/etc/pinring";
/// File name used when no ring-specific file exists.
pub const DEFAULT_FILE: &str = "pinring.toml";

/// How the config file was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--config FILE`.
    Flag(PathBuf),
    /// `$PINRING_CONFIG`.
    Env(PathBuf),
    /// Found in a searched directory.
    Searched(PathBuf),
    /// No file: the built-in default.
    BuiltIn,
    /// No file: settings given as data by the embedding program (Python's keywords), described
    /// as it describes them.
    Given(String),
}

impl Origin {
    /// The file, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Origin::Flag(p) | Origin::Env(p) | Origin::Searched(p) => Some(p),
            Origin::BuiltIn | Origin::Given(_) => None,
        }
    }

    /// A human description ("--config /x", "$PINRING_CONFIG /x", ...).
    pub fn describe(&self) -> String {
        match self {
            Origin::Flag(p) => format!("--config {}", p.display()),
            Origin::Env(p) => format!("${ENV_CONFIG} {}", p.display()),
            Origin::Searched(p) => format!("found {}", p.display()),
            Origin::BuiltIn => "built-in default (no config file found)".into(),
            Origin::Given(what) => what.clone(),
        }
    }
}

/// What the lookup reads from its environment; a value so that tests need not touch the
/// process environment.
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// `$PINRING_CONFIG`.
    pub env_config: Option<PathBuf>,
    /// The working directory.
    pub cwd: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME`, or `$HOME/.config`.
    pub user_dir: Option<PathBuf>,
    /// The system directory ([`SYSTEM_DIR`]).
    pub system_dir: PathBuf,
}

impl Places {
    /// The places of this process.
    pub fn from_env() -> Places {
        let non_empty = |v: std::ffi::OsString| (!v.is_empty()).then(|| PathBuf::from(v));
        let user_dir = std::env::var_os("XDG_CONFIG_HOME")
            .and_then(non_empty)
            .or_else(|| {
                std::env::var_os("HOME")
                    .and_then(non_empty)
                    .map(|h| h.join(".config"))
            });
        Places {
            env_config: std::env::var_os(ENV_CONFIG).and_then(non_empty),
            cwd: std::env::current_dir().ok(),
            user_dir,
            system_dir: PathBuf::from(SYSTEM_DIR),
        }
    }

    /// The searched candidates, in order (steps 3-5).
    pub fn candidates(&self, ring: Option<&str>) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let Some(cwd) = &self.cwd {
            dirs.push(cwd.join("config"));
        }
        if let Some(user) = &self.user_dir {
            dirs.push(user.join("pinring"));
        }
        dirs.push(self.system_dir.clone());
        let mut out = Vec::new();
        for dir in dirs {
            if let Some(ring) = ring {
                out.push(dir.join(format!("{ring}.toml")));
            }
            out.push(dir.join(DEFAULT_FILE));
        }
        out
    }
}

/// Finds the config file of a process started with `explicit` (`--config`) and `ring`
/// (`--ring`). Errors only for an explicitly named file that does not exist.
pub fn locate(
    explicit: Option<&Path>,
    ring: Option<&str>,
    places: &Places,
) -> Result<Origin, ConfigError> {
    let must_exist = |path: &Path, how: &str| -> Result<(), ConfigError> {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(ConfigError::Read {
                path: format!("{} (named by {how})", path.display()),
                source: std::io::Error::other("not a regular file"),
            }),
            Err(source) => Err(ConfigError::Read {
                path: format!("{} (named by {how})", path.display()),
                source,
            }),
        }
    };
    if let Some(p) = explicit {
        must_exist(p, "--config")?;
        return Ok(Origin::Flag(p.to_path_buf()));
    }
    if let Some(p) = &places.env_config {
        must_exist(p, ENV_CONFIG)?;
        return Ok(Origin::Env(p.clone()));
    }
    Ok(places
        .candidates(ring)
        .into_iter()
        .find(|p| p.is_file())
        .map_or(Origin::BuiltIn, Origin::Searched))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(root: &Path) -> Places {
        Places {
            env_config: None,
            cwd: Some(root.join("cwd")),
            user_dir: Some(root.join("home/.config")),
            system_dir: root.join("etc/pinring"),
        }
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }

    #[test]
    fn the_order_is_flag_env_cwd_user_system_builtin() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut pl = places(root);
        let ring = Some("gpu0");
        assert_eq!(locate(None, ring, &pl).unwrap(), Origin::BuiltIn);

        let sys_default = root.join("etc/pinring/pinring.toml");
        touch(&sys_default);
        assert_eq!(
            locate(None, ring, &pl).unwrap(),
            Origin::Searched(sys_default)
        );
        let sys_ring = root.join("etc/pinring/gpu0.toml");
        touch(&sys_ring);
        assert_eq!(
            locate(None, ring, &pl).unwrap(),
            Origin::Searched(sys_ring.clone())
        );
        // Without --ring, only pinring.toml files count.
        assert_eq!(
            locate(None, None, &pl).unwrap(),
            Origin::Searched(root.join("etc/pinring/pinring.toml"))
        );
        let user = root.join("home/.config/pinring/pinring.toml");
        touch(&user);
        assert_eq!(
            locate(None, ring, &pl).unwrap(),
            Origin::Searched(user.clone())
        );
        let cwd = root.join("cwd/config/gpu0.toml");
        touch(&cwd);
        assert_eq!(locate(None, ring, &pl).unwrap(), Origin::Searched(cwd));
        let env = root.join("env.toml");
        touch(&env);
        pl.env_config = Some(env.clone());
        assert_eq!(locate(None, ring, &pl).unwrap(), Origin::Env(env));
        let flag = root.join("flag.toml");
        touch(&flag);
        assert_eq!(locate(Some(&flag), ring, &pl).unwrap(), Origin::Flag(flag));
    }

    #[test]
    fn an_explicit_file_that_is_missing_is_an_error_naming_it_and_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let mut pl = places(dir.path());
        let missing = dir.path().join("nope.toml");
        let e = locate(Some(&missing), None, &pl).unwrap_err().to_string();
        assert!(e.contains("nope.toml") && e.contains("--config"), "{e}");
        pl.env_config = Some(missing);
        let e = locate(None, None, &pl).unwrap_err().to_string();
        assert!(e.contains("nope.toml") && e.contains(ENV_CONFIG), "{e}");
        // A directory is not a config file.
        let e = locate(Some(dir.path()), None, &pl).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
