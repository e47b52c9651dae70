//! Loading the config a process runs on: the file found by the documented lookup
//! ([`crate::config_lookup`]: `--config`, `$PINRING_CONFIG`, ./config, the user's config dir,
//! /etc/pinring, else the built-in synthetic default), then the overrides from the
//! environment (`$PINRING_RANK`, `$PINRING_WORLD_SIZE`, `$PINRING_DEVICE`), then command-line
//! overrides, then validation (again) so an override can never smuggle in a value the file
//! could not hold.

use crate::config_lookup::{self, Origin, Places};
use pinring_data::{Config, ConfigError};
use std::path::Path;

/// Environment variable overriding `plan.rank` (set it from the cluster launcher).
pub const ENV_RANK: &str = "PINRING_RANK";
/// Environment variable overriding `plan.world_size`.
pub const ENV_WORLD_SIZE: &str = "PINRING_WORLD_SIZE";
/// Environment variable overriding `daemon.device`.
pub const ENV_DEVICE: &str = "PINRING_DEVICE";

/// How the options of a run are named in its messages: the binaries' command-line flags
/// (`--epochs 5`), or the keyword arguments of the Python classes that run the same code in the
/// training process (`epochs=5`: `pinring.EmbeddedDaemon`, `pinring.Producer` and the loaders
/// built on them), whose callers never typed a flag.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `--start-seq 8`.
    #[default]
    Flags,
    /// `start_seq=8`.
    Keywords,
}

impl Spelling {
    /// The option whose flag is `flag` (`start-seq`), as this spelling names it: `--start-seq`
    /// or `start_seq`.
    pub fn option(self, flag: &str) -> String {
        match self {
            Spelling::Flags => format!("--{flag}"),
            Spelling::Keywords => flag.replace('-', "_"),
        }
    }

    /// The option `flag` given the number (or other unquoted) `value`: `--start-seq 8` or
    /// `start_seq=8`.
    pub fn set(self, flag: &str, value: impl std::fmt::Display) -> String {
        match self {
            Spelling::Flags => format!("--{flag} {value}"),
            Spelling::Keywords => format!("{}={value}", self.option(flag)),
        }
    }

    /// The option `flag` given the text `value`: `--ring gpu0` or `ring="gpu0"`.
    pub fn set_text(self, flag: &str, value: &str) -> String {
        match self {
            Spelling::Flags => self.set(flag, value),
            Spelling::Keywords => self.set(flag, format_args!("{value:?}")),
        }
    }
}

/// Overrides shared by the binaries' flags.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--ring NAME`.
    pub ring: Option<String>,
    /// `--epochs N`; 0: every epoch until stopped ([`until_stopped`]).
    pub epochs: Option<u32>,
    /// `plan.epochs` where neither `epochs` nor the config file sets it (the config's own
    /// default, 2, otherwise). The Python loaders' embedded daemons run without end unless told
    /// (docs/PYTHON.md, "Epochs"); not said in the config's source name, since nobody gave it.
    pub default_epochs: Option<u32>,
    /// `--ring-mode MODE` (the daemon's): overrides `ring.mode`.
    pub ring_mode: Option<pinring_data::config::SegmentMode>,
    /// `--unordered`.
    pub unordered: bool,
    /// `plan.rank` and `plan.world_size` as the embedding code found them (under torchrun,
    /// Python's `pinring.Loader`): applied after `$PINRING_RANK` and `$PINRING_WORLD_SIZE`.
    pub shard: Option<(u32, u32)>,
    /// How the overrides are named in the config's source name (`(with --epochs 5)`).
    pub spelling: Spelling,
}

/// The epochs of a plan that runs until it is stopped (`--epochs 0`, the service's): every
/// epoch the plan's 32-bit epoch number can count from `start_epoch` on, over four billion,
/// which no run reaches.
pub fn until_stopped(start_epoch: u32) -> u32 {
    (u32::MAX - start_epoch).max(1)
}

/// The config found by the lookup (or the built-in default) with the environment's and
/// `overrides` applied and validated.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    resolve(path, overrides, &Places::from_env(), &env_lookup).map(|(cfg, _)| cfg)
}

/// Where [`load`] would read the config from.
pub fn locate(path: Option<&Path>, ring: Option<&str>) -> Result<Origin, ConfigError> {
    config_lookup::locate(path, ring, &Places::from_env())
}

fn env_lookup(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// [`load`] with its environment passed in: `places` for the lookup, `env` for the rank
/// variables. Returns the config and where it came from.
pub fn resolve(
    path: Option<&Path>,
    overrides: &Overrides,
    places: &Places,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Config, Origin), ConfigError> {
    let origin = config_lookup::locate(path, overrides.ring.as_deref(), places)?;
    let mut cfg = match origin.path() {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let (None, Some(epochs)) = (overrides.epochs, overrides.default_epochs) {
        // The file was read whole a moment ago; one it no longer yields sets nothing here
        // (the daemon that loads it next reports that).
        let set_by_file = origin.path().is_some_and(|p| {
            std::fs::read_to_string(p)
                .is_ok_and(|text| pinring_data::config::toml_sets(&text, "plan", "epochs"))
        });
        if !set_by_file {
            cfg.plan.epochs = epochs;
        }
    }
    for (var, key) in [
        (ENV_RANK, "plan.rank"),
        (ENV_WORLD_SIZE, "plan.world_size"),
        (ENV_DEVICE, "daemon.device"),
    ] {
        let Some(text) = env(var) else { continue };
        let value: u32 = text.trim().parse().map_err(|_| ConfigError::Invalid {
            source_name: format!("${var}"),
            key,
            value: format!("{text:?}"),
            allowed: "a non-negative integer (unset the variable to use the file's value)".into(),
        })?;
        match var {
            ENV_RANK => cfg.plan.rank = value,
            ENV_WORLD_SIZE => cfg.plan.world_size = value,
            _ => cfg.daemon.device = Some(value),
        }
        cfg.source = format!("{} (with ${var}={value})", cfg.source);
    }
    if let Some((rank, world_size)) = overrides.shard {
        cfg.plan.rank = rank;
        cfg.plan.world_size = world_size;
        cfg.source = format!("{} (rank {rank} of {world_size})", cfg.source);
    }
    if let Some(name) = &overrides.ring {
        cfg.ring.name = name.clone();
        let given = overrides.spelling.set_text("ring", name);
        cfg.source = format!("{} (with {given})", cfg.source);
    }
    if let Some(epochs) = overrides.epochs {
        cfg.plan.epochs = match epochs {
            0 => until_stopped(cfg.plan.start_epoch),
            n => n,
        };
        let given = overrides.spelling.set("epochs", epochs);
        cfg.source = format!("{} (with {given})", cfg.source);
    }
    if let Some(mode) = overrides.ring_mode {
        cfg.ring.mode = mode;
        cfg.source = format!("{} (with --ring-mode {mode})", cfg.source);
    }
    if overrides.unordered {
        cfg.ring.in_order = false;
    }
    cfg.validate()?;
    Ok((cfg, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn rank_variables_override_the_file_and_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let places = Places {
            system_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let env = |k: &str| match k {
            ENV_RANK => Some("3".to_string()),
            ENV_WORLD_SIZE => Some("8".to_string()),
            _ => None,
        };
        let (cfg, origin) = resolve(None, &Overrides::default(), &places, &env).unwrap();
        assert_eq!(origin, Origin::BuiltIn);
        assert_eq!((cfg.plan.rank, cfg.plan.world_size), (3, 8));
        assert!(cfg.source.contains("PINRING_RANK=3"), "{}", cfg.source);

        let bad_rank = |k: &str| (k == ENV_RANK).then(|| "8".to_string());
        let e = resolve(None, &Overrides::default(), &places, &bad_rank)
            .unwrap_err()
            .to_string();
        assert!(e.contains("plan.rank"), "{e}");
        let garbage = |k: &str| (k == ENV_WORLD_SIZE).then(|| "four".to_string());
        let e = resolve(None, &Overrides::default(), &places, &garbage)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PINRING_WORLD_SIZE") && e.contains("four"),
            "{e}"
        );
    }

    #[test]
    fn epochs_0_runs_every_epoch_until_stopped_and_ring_mode_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("gpu0.toml");
        std::fs::write(&file, "[plan]\nepochs = 2\nstart_epoch = 7\n").unwrap();
        let service = Overrides {
            epochs: Some(0),
            ring_mode: Some(pinring_data::config::SegmentMode::Group),
            ..Default::default()
        };
        let (cfg, _) = resolve(Some(&file), &service, &Places::default(), &no_env).unwrap();
        assert_eq!(
            cfg.plan.epochs,
            u32::MAX - 7,
            "the last epoch is u32::MAX - 1"
        );
        assert_eq!(cfg.ring.mode, pinring_data::config::SegmentMode::Group);
        assert!(cfg.source.contains("--ring-mode 0660"), "{}", cfg.source);
        let plan = cfg.plan().unwrap();
        assert_eq!(
            plan.total_batches(),
            u64::from(u32::MAX - 7) * plan.batches_per_epoch()
        );
        let (cfg, _) = resolve(
            Some(&file),
            &Overrides::default(),
            &Places::default(),
            &no_env,
        )
        .unwrap();
        assert_eq!(cfg.plan.epochs, 2, "without the flag, the file's");
    }

    #[test]
    fn a_ring_file_found_by_the_lookup_is_used_and_ring_overrides_its_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gpu3.toml"),
            "[ring]\nname = \"other\"\nslots = 5\n",
        )
        .unwrap();
        let places = Places {
            system_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let overrides = Overrides {
            ring: Some("gpu3".into()),
            ..Default::default()
        };
        let (cfg, origin) = resolve(None, &overrides, &places, &no_env).unwrap();
        assert_eq!(origin, Origin::Searched(dir.path().join("gpu3.toml")));
        assert_eq!(cfg.ring.slots, Some(5));
        assert_eq!(cfg.ring.name, "gpu3");
    }

    #[test]
    fn a_rings_device_and_shard_come_from_its_file_then_the_environment_then_the_embedder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("gpu3.toml"),
            "[daemon]\ndevice = 3\n[plan]\nrank = 3\nworld_size = 8\n",
        )
        .unwrap();
        let places = Places {
            system_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let gpu3 = Overrides {
            ring: Some("gpu3".into()),
            ..Default::default()
        };
        let (cfg, _) = resolve(None, &gpu3, &places, &no_env).unwrap();
        assert_eq!(cfg.daemon.device, Some(3));
        assert_eq!((cfg.plan.rank, cfg.plan.world_size), (3, 8));
        let device5 = |k: &str| (k == ENV_DEVICE).then(|| "5".to_string());
        let (cfg, _) = resolve(None, &gpu3, &places, &device5).unwrap();
        assert_eq!(cfg.daemon.device, Some(5));
        let job = Overrides {
            shard: Some((1, 2)),
            ..gpu3
        };
        let (cfg, _) = resolve(None, &job, &places, &no_env).unwrap();
        assert_eq!((cfg.plan.rank, cfg.plan.world_size), (1, 2));
        assert!(cfg.source.contains("rank 1 of 2"), "{}", cfg.source);
        // The default config has no device: 0, unwritten.
        let (cfg, _) = resolve(None, &Overrides::default(), &Places::default(), &no_env).unwrap();
        assert_eq!(cfg.daemon.device, None);
        assert!(!cfg.to_toml().contains("device"));
    }
    #[test]
    fn default_epochs_apply_only_where_neither_the_file_nor_an_override_sets_plan_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let silent = dir.path().join("silent.toml");
        std::fs::write(&silent, "[plan]\nbatch_size = 4\n").unwrap();
        let sets = dir.path().join("sets.toml");
        std::fs::write(&sets, "[plan]\nepochs = 3\n").unwrap();
        let unbounded = Overrides {
            default_epochs: Some(100_000),
            ..Default::default()
        };
        let places = Places::default();
        let epochs = |path: Option<&Path>, o: &Overrides| {
            let (cfg, _) = resolve(path, o, &places, &no_env).unwrap();
            (cfg.plan.epochs, cfg.source)
        };
        let (n, source) = epochs(Some(&silent), &unbounded);
        assert_eq!(n, 100_000);
        assert!(!source.contains("epochs"), "nobody gave it: {source}");
        assert_eq!(epochs(Some(&sets), &unbounded).0, 3, "the file's own value");
        assert_eq!(
            epochs(None, &unbounded).0,
            100_000,
            "the built-in default sets none"
        );
        let given = Overrides {
            epochs: Some(5),
            ..unbounded.clone()
        };
        assert_eq!(epochs(Some(&sets), &given).0, 5, "an override beats both");
        assert_eq!(
            epochs(Some(&silent), &Overrides::default()).0,
            2,
            "pinring's default"
        );
    }

    #[test]
    fn overrides_are_named_as_their_caller_spells_them() {
        let o = Overrides {
            ring: Some("gpu0".into()),
            epochs: Some(5),
            ..Default::default()
        };
        let (cfg, _) = resolve(None, &o, &Places::default(), &no_env).unwrap();
        assert!(
            cfg.source.contains("(with --ring gpu0) (with --epochs 5)"),
            "{}",
            cfg.source
        );
        let python = Overrides {
            spelling: Spelling::Keywords,
            ..o
        };
        let (cfg, _) = resolve(None, &python, &Places::default(), &no_env).unwrap();
        assert!(
            cfg.source.contains("(with ring=\"gpu0\") (with epochs=5)"),
            "{}",
            cfg.source
        );
        assert!(!cfg.source.contains("--"), "{}", cfg.source);
        assert_eq!(Spelling::Keywords.set("start-seq", 8), "start_seq=8");
        assert_eq!(Spelling::Flags.set("start-seq", 8), "--start-seq 8");
    }
}
