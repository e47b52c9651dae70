//! What the edge of a process says over a config file: command-line flags, environment
//! variables and the keyword arguments of the Python classes, gathered once into one
//! [`Overrides`] value where they are read, and applied in one place ([`Overrides::apply`]) by
//! the resolver ([`crate::Spec::resolve`]) and by the loaders' settings.

use crate::config::SegmentMode;
use crate::Config;

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

/// The values the environment gives (`$PINRING_RANK`, `$PINRING_WORLD_SIZE`,
/// `$PINRING_DEVICE`), read and parsed where the process starts (pinring-runtime's `settings`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EnvOverrides {
    /// Each variable set, with the key it overrides and its value, in the order they apply:
    /// `("PINRING_RANK", "plan.rank", 3)`.
    pub values: Vec<(&'static str, &'static str, u32)>,
}

/// Overrides of a config's settings, from the edge of the process: flags, environment, Python
/// keyword arguments.
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
    pub ring_mode: Option<SegmentMode>,
    /// `--unordered`.
    pub unordered: bool,
    /// `plan.rank` and `plan.world_size` as the embedding code found them (under torchrun,
    /// Python's `pinring.Loader`): applied after `$PINRING_RANK` and `$PINRING_WORLD_SIZE`.
    pub shard: Option<(u32, u32)>,
    /// The environment's values, applied before the others.
    pub env: EnvOverrides,
    /// The ring's writers are this many worker processes of a `pinring.torch.DataLoader` (0:
    /// the trainer's own thread): the resolver cuts the slot count to what they can keep filled
    /// ([`crate::resolve::slots_for_workers`]).
    pub workers: Option<u32>,
    /// How the overrides are named in the config's source name (`(with --epochs 5)`).
    pub spelling: Spelling,
}

/// The epochs of a plan that runs until it is stopped (`--epochs 0`, the service's): every
/// epoch the plan's 32-bit epoch number can count from `start_epoch` on, over four billion,
/// which no run reaches.
pub fn until_stopped(start_epoch: u32) -> u32 {
    (u32::MAX - start_epoch).max(1)
}

impl Overrides {
    /// Whether these override nothing (how they would be spelled aside).
    pub fn is_empty(&self) -> bool {
        self.ring.is_none()
            && self.epochs.is_none()
            && self.default_epochs.is_none()
            && self.ring_mode.is_none()
            && !self.unordered
            && self.shard.is_none()
            && self.env.values.is_empty()
            && self.workers.is_none()
    }

    /// Writes the overrides into `cfg` and says each in its source name (`(with --epochs 5)`),
    /// in one order: the default epochs (where the file leaves `plan.epochs` out), the
    /// environment, the shard, the ring's name, the epochs, the ring's mode, the order. Checks
    /// nothing: the caller validates the result once.
    pub fn apply(&self, cfg: &mut Config) {
        if let (None, Some(epochs)) = (self.epochs, self.default_epochs) {
            if !cfg.epochs_given {
                cfg.plan.epochs = epochs;
            }
        }
        for &(var, key, value) in &self.env.values {
            match key {
                "plan.rank" => cfg.plan.rank = value,
                "plan.world_size" => cfg.plan.world_size = value,
                _ => cfg.daemon.device = Some(value),
            }
            cfg.source = format!("{} (with ${var}={value})", cfg.source);
        }
        if let Some((rank, world_size)) = self.shard {
            cfg.plan.rank = rank;
            cfg.plan.world_size = world_size;
            cfg.source = format!("{} (rank {rank} of {world_size})", cfg.source);
        }
        if let Some(name) = &self.ring {
            cfg.ring.name = name.clone();
            let given = self.spelling.set_text("ring", name);
            cfg.source = format!("{} (with {given})", cfg.source);
        }
        if let Some(epochs) = self.epochs {
            cfg.plan.epochs = match epochs {
                0 => until_stopped(cfg.plan.start_epoch),
                n => n,
            };
            let given = self.spelling.set("epochs", epochs);
            cfg.source = format!("{} (with {given})", cfg.source);
        }
        if let Some(mode) = self.ring_mode {
            cfg.ring.mode = mode;
            cfg.source = format!("{} (with --ring-mode {mode})", cfg.source);
        }
        if self.unordered {
            cfg.ring.in_order = false;
        }
    }
}
