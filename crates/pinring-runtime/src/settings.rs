//! Loading the config a process runs on: an explicit `--config FILE` or the built-in synthetic
//! default, then command-line overrides, then validation (again) so an override can never smuggle
//! in a value the file could not hold.

use pinring_data::{Config, ConfigError};
use std::path::Path;

/// Overrides shared by the binaries' flags.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--ring NAME`.
    pub ring: Option<String>,
    /// `--epochs N`.
    pub epochs: Option<u32>,
    /// `--unordered`.
    pub unordered: bool,
}

/// The config file (or the built-in default) with `overrides` applied and validated.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut cfg = match path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(name) = &overrides.ring {
        cfg.ring.name = name.clone();
        cfg.source = format!("{} (with --ring {name})", cfg.source);
    }
    if let Some(epochs) = overrides.epochs {
        cfg.plan.epochs = epochs;
        cfg.source = format!("{} (with --epochs {epochs})", cfg.source);
    }
    if overrides.unordered {
        cfg.ring.in_order = false;
    }
    cfg.validate()?;
    Ok(cfg)
}
