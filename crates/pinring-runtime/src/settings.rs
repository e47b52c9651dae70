//! The edge where a process reads what it runs on: the settings of the file found by the
//! documented lookup ([`crate::config_lookup`]: `--config`, `$PINRING_CONFIG`, ./config, the
//! user's config dir, /etc/pinring, else the built-in synthetic default), and the overrides:
//! the environment's (`$PINRING_RANK`, `$PINRING_WORLD_SIZE`, `$PINRING_DEVICE`) added to the
//! command line's or the keywords' ([`find`]). The daemon resolves them into a
//! [`pinring_data::Spec`]; [`load`] applies them and validates the result, so an override can
//! never smuggle in a value the file could not hold.

use crate::config_lookup::{self, Origin, Places};
use pinring_data::{Config, ConfigError};
use std::path::Path;

/// Environment variable overriding `plan.rank` (set it from the cluster launcher).
pub const ENV_RANK: &str = "PINRING_RANK";
/// Environment variable overriding `plan.world_size`.
pub const ENV_WORLD_SIZE: &str = "PINRING_WORLD_SIZE";
/// Environment variable overriding `daemon.device`.
pub const ENV_DEVICE: &str = "PINRING_DEVICE";

pub use pinring_data::overrides::{until_stopped, EnvOverrides, Overrides, Spelling};

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

/// The settings of the config found by the lookup (or the built-in default), where they were
/// found, and `overrides` with the environment's values added: what the resolver
/// ([`pinring_data::Spec::resolve`]) takes, read at the process's edge.
#[derive(Debug, Clone)]
pub struct Found {
    /// The file's settings, as read.
    pub settings: Config,
    /// The overrides given, with the environment's (`$PINRING_RANK`, ...).
    pub overrides: Overrides,
    /// Where the settings came from.
    pub origin: Origin,
}

impl Found {
    /// The settings with the overrides applied and checked (what a loader runs on, before it
    /// adopts its ring's values).
    pub fn applied(&self) -> Result<Config, ConfigError> {
        let mut cfg = self.settings.clone();
        self.overrides.apply(&mut cfg);
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Finds and reads the settings ([`Found`]) with the environment passed in: `places` for the
/// lookup, `env` for the variables.
pub fn find_with(
    path: Option<&Path>,
    overrides: &Overrides,
    places: &Places,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Found, ConfigError> {
    let origin = config_lookup::locate(path, overrides.ring.as_deref(), places)?;
    let settings = match origin.path() {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let mut overrides = overrides.clone();
    overrides.env = env_overrides(env)?;
    Ok(Found {
        settings,
        overrides,
        origin,
    })
}

/// Settings given as data by the embedding program (no file, no lookup), with `overrides` and
/// this process's environment's added, as [`find`] adds them to a file's.
pub fn given(settings: Config, overrides: &Overrides) -> Result<Found, ConfigError> {
    let mut overrides = overrides.clone();
    overrides.env = env_overrides(&env_lookup)?;
    Ok(Found {
        origin: Origin::Given(settings.source.clone()),
        settings,
        overrides,
    })
}

/// [`find_with`] in this process's environment.
pub fn find(path: Option<&Path>, overrides: &Overrides) -> Result<Found, ConfigError> {
    find_with(path, overrides, &Places::from_env(), &env_lookup)
}

/// The environment's overrides: `$PINRING_RANK`, `$PINRING_WORLD_SIZE` and `$PINRING_DEVICE`,
/// each a non-negative integer.
pub fn env_overrides(env: &dyn Fn(&str) -> Option<String>) -> Result<EnvOverrides, ConfigError> {
    let mut values = Vec::new();
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
        values.push((var, key, value));
    }
    Ok(EnvOverrides { values })
}

/// What the resolver needs to know of this host (its last-level cache).
pub fn host_facts() -> pinring_data::HostFacts {
    crate::host_memory::HostMemory::read().facts()
}

/// [`load`] with its environment passed in: `places` for the lookup, `env` for the rank
/// variables. Returns the config and where it came from.
pub fn resolve(
    path: Option<&Path>,
    overrides: &Overrides,
    places: &Places,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Config, Origin), ConfigError> {
    let found = find_with(path, overrides, places, env)?;
    Ok((found.applied()?, found.origin))
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
