//! One resolved spec, made in one of two ways. [`Spec::resolve`] is the one function that turns
//! the settings of a config as loaded, with the overrides of the process's edge, into the spec a
//! daemon runs, for the daemon itself, `pinring config check` and Python's `pinring._native.Spec`
//! alike: the dataset's files opened (their length is `dataset.samples`, a
//! WebDataset's shard sizes order its plan), `"auto"` resolved for the host's cache, every rule
//! checked (the config's own, and `ring.group` against the host's groups, as the daemon checks
//! when it makes the ring), and the plan and batch layout made. A check that passes here is a
//! daemon that starts. [`Spec::adopt`] takes the spec a daemon stored in its ring back
//! (`resolve/stored.rs`), for the processes that join the ring.

mod stored;
pub use stored::{Joined, RingFacts, StoredSpecError, MAX_STORED_SPEC_BYTES, STORED_SPEC_MAGIC};

use crate::{AutoRing, BatchLayout, Config, ConfigError, Overrides, Plan, PlanError, SlotBytes};
use pinring_exit::{Coded, Exit};

/// A dataset's files, as opened to resolve a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedDataset {
    /// Samples in the files.
    pub len: u64,
    /// For a WebDataset: each shard's sample count, in shard order.
    pub shard_sizes: Option<Vec<u64>>,
    /// For a WebDataset: the shards opened, its globs expanded (`None`: as written).
    pub shards: Option<Vec<std::path::PathBuf>>,
}

/// Opens the dataset a config names (pinring-sources implements it; pinring-data reads no
/// files).
pub trait DatasetOpener {
    /// The dataset of `cfg` opened: `None` for a kind that reads no files (synthetic,
    /// external); an error names the file and the problem.
    fn open(&self, cfg: &Config) -> Result<Option<OpenedDataset>, ConfigError>;
}

/// An opener for configs whose kind reads no files (tests, tools that never open data).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFiles;

impl DatasetOpener for NoFiles {
    fn open(&self, cfg: &Config) -> Result<Option<OpenedDataset>, ConfigError> {
        if cfg.dataset.kind.reads_files() {
            return Err(ConfigError::Dataset {
                source_name: cfg.source.clone(),
                kind: cfg.dataset.kind,
                message: "this tool opens no dataset files".to_string(),
            });
        }
        Ok(None)
    }
}

/// Why a config does not resolve.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// A rule of the config, or its dataset's files.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The plan cannot be made.
    #[error("config {source_name}: {source}")]
    Plan {
        /// Config source.
        source_name: String,
        /// The error.
        #[source]
        source: PlanError,
    },
    /// The ring the daemon would make from it is refused (`ring.group`).
    #[error(transparent)]
    Ring(#[from] pinring_ring::RingError),
}

impl Coded for ResolveError {
    fn exit(&self) -> Exit {
        match self {
            ResolveError::Config(_) | ResolveError::Plan { .. } => Exit::Config,
            ResolveError::Ring(e) => e.exit(),
        }
    }
}

/// What the resolver needs to know of the host it resolves for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The last-level cache's size (`None`: unknown): `"auto"` sizes the ring for it.
    pub cache_bytes: Option<u64>,
    /// That cache's level (3 for L3; 0 where unknown, as for a size set by the environment):
    /// for the warnings only ([`Config::ring_warnings`]).
    pub cache_level: u32,
    /// The memory available for a ring (`MemAvailable`, `None`: unknown): for the warnings
    /// only.
    pub available: Option<u64>,
    /// Whether this host can decode JPEGs on a GPU (a CUDA device whose nvJPEG and NVRTC
    /// load): `[dataset.image] decode = "auto"` resolves to `"gpu"` if so, else `"cpu"`.
    pub gpu_decode: bool,
}

/// A resolved spec: the settings of a config file with their overrides applied, the dataset's
/// files opened, `"auto"` resolved for the host and every rule checked; the plan and the batch
/// layout made from it. Immutable; nothing in it is optional or `"auto"` ([`Spec::slots`],
/// [`Spec::slot_bytes`]). Made by one constructor, [`Spec::resolve`]: the daemon, `pinring
/// config check`, the embedded daemon and Python's `check_config` all resolve through it.
#[derive(Debug, Clone)]
pub struct Spec {
    config: Config,
    plan: Plan,
    layout: BatchLayout,
    source_len: Option<u64>,
    auto: Option<AutoRing>,
    slots: u32,
    slot_bytes: u64,
    workers_slots: Option<u32>,
}

/// The fewest slots a DataLoader's ring gets with workers, and how many per worker.
pub const WORKERS_MIN_SLOTS: u32 = 16;
/// Slots per worker of a DataLoader's ring: torch's own depth (`prefetch_factor=2`).
pub const SLOTS_PER_WORKER: u32 = 2;
/// The fewest slots a DataLoader's ring gets with `num_workers=0` (the trainer's one thread).
pub const THREAD_MIN_SLOTS: u32 = 4;

/// Slots of a DataLoader's embedded ring ([`Overrides::workers`]): what "auto" picked for this
/// host (`auto`, sized for many loaders and the last-level cache), cut to what the workers can
/// keep filled.
///
/// * With workers: 2 per worker (torch's own depth, `prefetch_factor=2` batches per worker),
///   two batches' parts (so in-order delivery never waits on the ring), and at least 16. Each
///   worker writes into its own share of the slots, and the pages it wrote count in its PSS:
///   4 per worker put a forked worker up to 8% above torch's on the H200.
/// * With `num_workers=0`: one batch's parts, at least 4. The one thread fills the parts in
///   order, and the daemon frees each slot as soon as its part is on the device, so a deeper
///   ring only costs start-up: the ring is made, prefaulted and registered before the first
///   batch (docs/BENCHMARKS.md, "The DataLoader on first contact").
pub fn slots_for_workers(auto: u32, workers: u32, parts_per_batch: u32) -> u32 {
    let want = if workers == 0 {
        THREAD_MIN_SLOTS.max(parts_per_batch)
    } else {
        WORKERS_MIN_SLOTS
            .max(SLOTS_PER_WORKER.saturating_mul(workers))
            .max(parts_per_batch.saturating_mul(2))
    };
    auto.min(want)
}

impl Spec {
    /// Resolves `settings` (a config as read, [`Config`]) with `overrides` for a host whose
    /// facts are `host`, its dataset opened by `opener`: the module's one sequence (overrides,
    /// open, auto, validate, group, plan, layout).
    pub fn resolve(
        settings: Config,
        overrides: &Overrides,
        host: &HostFacts,
        opener: &dyn DatasetOpener,
    ) -> Result<Spec, ResolveError> {
        let mut cfg = settings;
        if !overrides.is_empty() {
            // Settings come checked from their reader; what the edge said over them is checked
            // before any file is opened.
            overrides.apply(&mut cfg);
            cfg.validate()?;
        }
        let spec = Spec::resolve_applied(cfg.clone(), host, opener)?;
        let Some(workers) = overrides.workers else {
            return Ok(spec);
        };
        let want = slots_for_workers(spec.slots, workers, spec.config.parts_per_batch());
        if want >= spec.slots {
            return Ok(spec);
        }
        cfg.ring.slots = Some(want);
        let mut spec = Spec::resolve_applied(cfg, host, opener)?;
        spec.workers_slots = Some(want);
        Ok(spec)
    }

    /// [`Spec::resolve`] of settings with their overrides applied.
    fn resolve_applied(
        mut cfg: Config,
        host: &HostFacts,
        opener: &dyn DatasetOpener,
    ) -> Result<Spec, ResolveError> {
        // decode = "auto" first: the source opens as the loaders will.
        let decided = cfg
            .dataset
            .image
            .as_mut()
            .is_some_and(|i| i.resolve_decode(host.gpu_decode));
        if decided {
            cfg.validate()?;
        }
        let opened = opener.open(&cfg)?;
        if let Some(o) = &opened {
            if let Some(shards) = &o.shards {
                cfg.set_shards(shards.clone())?;
            }
            if let Some(sizes) = &o.shard_sizes {
                cfg.set_shard_samples(sizes)?;
            }
            cfg.set_source_len(o.len)?;
        }
        let auto = (cfg.ring.slot_bytes == SlotBytes::Auto || cfg.ring.slots.is_none())
            .then(|| cfg.resolve_auto(host.cache_bytes));
        if auto.is_some() {
            cfg.validate()?;
        }
        if let Some(group) = &cfg.ring.group {
            pinring_ring::resolve_group(&cfg.ring.name, group)?;
        }
        let plan = cfg.plan().map_err(|source| ResolveError::Plan {
            source_name: cfg.source.clone(),
            source,
        })?;
        let layout = cfg.batch_layout();
        let (slots, slot_bytes) = (cfg.slots(), cfg.slot_bytes());
        Ok(Spec {
            config: cfg,
            plan,
            layout,
            source_len: opened.map(|o| o.len),
            auto,
            slots,
            slot_bytes,
            workers_slots: None,
        })
    }

    /// The slot count the resolver cut for a DataLoader's workers ([`Overrides::workers`]):
    /// `ring.slots` of the settings the spec was made from (`None`: not cut).
    pub fn workers_slots(&self) -> Option<u32> {
        self.workers_slots
    }

    /// The settings as resolved: overrides applied, the files' length and the resolved
    /// geometry written into them (`ring.slots` set, `ring.slot_bytes` a size).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ring's name.
    pub fn ring(&self) -> &str {
        &self.config.ring.name
    }

    /// Slots in the ring, as resolved.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes per slot, as resolved.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The batch layout (fields, part sizes).
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// Samples in the dataset's files (`None`: a kind that reads no files).
    pub fn source_len(&self) -> Option<u64> {
        self.source_len
    }

    /// What `"auto"` resolved: the slot size and count, or only the count of a given slot size
    /// (`None`: both were given).
    pub fn auto(&self) -> Option<&AutoRing> {
        self.auto.as_ref()
    }

    /// The settings, the plan and the layout, taken out.
    pub fn into_parts(self) -> (Config, Plan, BatchLayout) {
        (self.config, self.plan, self.layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_CONFIG_TOML;

    fn resolve(
        cfg: &Config,
        opener: &dyn DatasetOpener,
        cache_bytes: Option<u64>,
    ) -> Result<Spec, ResolveError> {
        let host = HostFacts {
            cache_bytes,
            ..Default::default()
        };
        Spec::resolve(cfg.clone(), &Overrides::default(), &host, opener)
    }

    fn default_config() -> Config {
        Config::from_toml_str(DEFAULT_CONFIG_TOML, "default").unwrap()
    }

    #[test]
    fn auto_slots_are_resolved_for_the_cache_and_the_plan_and_layout_follow_from_them() {
        let cfg = default_config();
        assert_eq!(cfg.ring.slot_bytes, SlotBytes::Auto);
        let r = resolve(&cfg, &NoFiles, Some(64 << 20)).unwrap();
        let a = *r.auto().expect("slot_bytes = \"auto\" was resolved");
        assert_eq!(
            r.config().ring.slot_bytes,
            SlotBytes::Fixed(crate::ByteSize(a.slot_bytes))
        );
        assert_eq!(r.config().ring.slots, Some(a.slots));
        assert_eq!(r.layout(), &r.config().batch_layout());
        assert_eq!(
            r.plan().total_seqs(),
            r.config().plan().unwrap().total_seqs()
        );
        assert_eq!(r.source_len(), None, "synthetic samples read no files");
        // The config it came from is left as it was: resolving is not a change in place.
        assert_eq!(cfg.ring.slot_bytes, SlotBytes::Auto);
        // Another host's cache resolves the same config to its own geometry.
        let small = resolve(&cfg, &NoFiles, Some(4 << 20)).unwrap();
        assert!(small.config().ring_bytes() <= r.config().ring_bytes());
    }

    #[test]
    fn a_given_slot_size_is_not_auto() {
        let mut cfg = default_config();
        cfg.ring.slot_bytes = SlotBytes::Fixed(crate::ByteSize(16 << 20));
        cfg.ring.slots = Some(4);
        let r = resolve(&cfg, &NoFiles, Some(64 << 20)).unwrap();
        assert!(r.auto().is_none());
        assert_eq!(r.config().ring.slots, Some(4));
        // Without a count, the count is auto's for the given size, and says so.
        cfg.ring.slot_bytes = SlotBytes::Fixed(crate::ByteSize(256 << 10));
        cfg.ring.slots = None;
        let r = resolve(&cfg, &NoFiles, Some(64 << 20)).unwrap();
        let a = r.auto().expect("the slot count was picked");
        assert_eq!((a.slots, a.slot_bytes_auto), (128, false));
        assert_eq!(r.config().ring.slots, Some(128));
    }

    #[test]
    fn an_unknown_group_is_refused_as_the_daemon_refuses_it() {
        let mut cfg = default_config();
        cfg.ring.mode = crate::SegmentMode::Group;
        cfg.ring.group = Some("pinring-no-such-group".into());
        match resolve(&cfg, &NoFiles, None) {
            Err(e @ ResolveError::Ring(pinring_ring::RingError::UnknownGroup { .. })) => {
                assert_eq!(e.exit(), Exit::Config);
                assert!(e.to_string().contains("pinring-no-such-group"), "{e}");
            }
            other => panic!("expected UnknownGroup, got {other:?}"),
        }
    }

    /// `decode = "auto"` is resolved for the host before anything is opened: the GPU where it
    /// can decode there (`encoded_bytes` kept, the layout encoded), else the loaders' CPU
    /// (`encoded_bytes` dropped, pixels in the slots); `reduced_decode` is refused beside it.
    #[test]
    fn decode_auto_is_resolved_for_the_host() {
        struct Shards;
        impl DatasetOpener for Shards {
            fn open(&self, cfg: &Config) -> Result<Option<OpenedDataset>, ConfigError> {
                let image = cfg.dataset.image.as_ref().unwrap();
                assert_ne!(
                    image.decode,
                    crate::ImageDecode::Auto,
                    "resolved before opening"
                );
                Ok(Some(OpenedDataset {
                    len: 64,
                    shard_sizes: Some(vec![64]),
                    shards: None,
                }))
            }
        }
        let text = "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = [\"s.tar\"]\n\
                    [dataset.image]\ndecode = \"auto\"\nencoded_bytes = \"2MiB\"\n\
                    [plan]\nbatch_size = 8\n";
        let cfg = Config::from_toml_str(text, "t").unwrap();
        for gpu in [true, false] {
            let host = HostFacts {
                gpu_decode: gpu,
                ..Default::default()
            };
            let r = Spec::resolve(cfg.clone(), &Overrides::default(), &host, &Shards).unwrap();
            let image = r.config().dataset.image.as_ref().unwrap();
            let want = if gpu { "gpu" } else { "cpu" };
            assert_eq!(image.decode.as_str(), want);
            assert_eq!(image.encoded_bytes.is_some(), gpu);
            assert_eq!(r.config().decodes_on_copy(), gpu);
            assert_eq!(r.layout().encoded_field().is_some(), gpu);
        }
        let mut reduced = cfg.clone();
        reduced.dataset.image.as_mut().unwrap().reduced_decode = true;
        let e = reduced.validate().unwrap_err().to_string();
        assert!(
            e.contains("reduced_decode") && e.contains("decode = \"cpu\""),
            "{e}"
        );
    }

    #[test]
    fn the_opened_files_length_becomes_dataset_samples_and_a_mismatch_is_refused() {
        struct Opened(u64);
        impl DatasetOpener for Opened {
            fn open(&self, _: &Config) -> Result<Option<OpenedDataset>, ConfigError> {
                Ok(Some(OpenedDataset {
                    len: self.0,
                    shard_sizes: None,
                    shards: None,
                }))
            }
        }
        let mut cfg = default_config();
        cfg.dataset.samples = 0;
        let r = resolve(&cfg, &Opened(4096), None).unwrap();
        assert_eq!(r.config().dataset.samples, 4096);
        assert_eq!(r.source_len(), Some(4096));
        cfg.dataset.samples = 100;
        let e = resolve(&cfg, &Opened(4096), None).unwrap_err();
        assert!(matches!(e, ResolveError::Config(_)), "{e:?}");
        assert_eq!(e.exit(), Exit::Config);
    }

    #[test]
    fn the_resolver_applies_the_edges_overrides_once_and_checks_the_result() {
        let cfg = default_config();
        let overrides = Overrides {
            ring: Some("gpu1".into()),
            epochs: Some(3),
            shard: Some((1, 2)),
            env: crate::EnvOverrides {
                values: vec![("PINRING_DEVICE", "daemon.device", 5)],
            },
            ..Default::default()
        };
        let host = HostFacts {
            cache_bytes: Some(64 << 20),
            ..Default::default()
        };
        let spec = Spec::resolve(cfg.clone(), &overrides, &host, &NoFiles).unwrap();
        assert_eq!(spec.ring(), "gpu1");
        assert_eq!(spec.config().plan.epochs, 3);
        assert_eq!(
            (spec.config().plan.rank, spec.config().plan.world_size),
            (1, 2)
        );
        assert_eq!(spec.config().daemon.device, Some(5));
        assert_eq!(
            spec.config().source,
            "default (with $PINRING_DEVICE=5) (rank 1 of 2) (with --ring gpu1) (with --epochs 3)"
        );
        // Nothing optional: the geometry is the resolved one, as the config now says it.
        assert_eq!(spec.slots(), spec.config().ring.slots.unwrap());
        assert_eq!(
            SlotBytes::Fixed(crate::ByteSize(spec.slot_bytes())),
            spec.config().ring.slot_bytes
        );
        // An override the file could not hold is refused as the file's value would be.
        let bad = Overrides {
            shard: Some((2, 2)),
            ..Default::default()
        };
        let e = Spec::resolve(cfg, &bad, &host, &NoFiles).unwrap_err();
        assert_eq!(e.exit(), Exit::Config);
        assert!(e.to_string().contains("plan.rank"), "{e}");
    }

    #[test]
    fn default_epochs_apply_only_where_the_file_leaves_plan_epochs_out() {
        let unbounded = Overrides {
            default_epochs: Some(100_000),
            ..Default::default()
        };
        let host = HostFacts::default();
        let silent = Config::from_toml_str("[plan]\nbatch_size = 4\n", "silent").unwrap();
        let spec = Spec::resolve(silent, &unbounded, &host, &NoFiles).unwrap();
        assert_eq!(spec.config().plan.epochs, 100_000);
        assert_eq!(spec.config().source, "silent", "nobody gave it");
        let sets = Config::from_toml_str("[plan]\nepochs = 3\n", "sets").unwrap();
        let spec = Spec::resolve(sets, &unbounded, &host, &NoFiles).unwrap();
        assert_eq!(spec.config().plan.epochs, 3, "the file's own value");
    }

    #[test]
    fn a_dataloaders_ring_is_cut_to_what_its_workers_keep_filled() {
        assert_eq!(slots_for_workers(64, 0, 1), 4, "the one thread: at least 4");
        assert_eq!(slots_for_workers(64, 0, 6), 6, "one batch's parts");
        assert_eq!(slots_for_workers(64, 4, 1), 16, "at least 16 with workers");
        assert_eq!(slots_for_workers(64, 12, 1), 24, "2 per worker");
        assert_eq!(slots_for_workers(64, 2, 10), 20, "two batches' parts");
        assert_eq!(slots_for_workers(8, 12, 1), 8, "never more than auto's");
        let cfg = default_config();
        let host = HostFacts {
            cache_bytes: Some(256 << 20),
            ..Default::default()
        };
        let auto = Spec::resolve(cfg.clone(), &Overrides::default(), &host, &NoFiles).unwrap();
        assert!(auto.slots() > 16, "{}", auto.slots());
        assert_eq!(auto.workers_slots(), None);
        let workers = Overrides {
            workers: Some(2),
            ..Default::default()
        };
        let cut = Spec::resolve(cfg, &workers, &host, &NoFiles).unwrap();
        assert_eq!(cut.slots(), 16);
        assert_eq!(cut.workers_slots(), Some(16));
        assert_eq!(
            cut.slot_bytes(),
            auto.slot_bytes(),
            "the same slots, fewer of them"
        );
        assert_eq!(cut.config().fingerprint(), auto.config().fingerprint());
    }
}

#[cfg(test)]
mod settings_tests {
    use crate::{Config, ConfigError};

    #[test]
    fn settings_given_as_data_read_as_the_same_file_would() {
        let toml =
            "[ring]\nname = \"data\"\nslot_bytes = \"auto\"\n[dataset]\nkind = \"external\"\n\
                    samples = 48\nfields = [{ name = \"f0\", dtype = \"i64\", shape = [1] }]\n\
                    [plan]\nbatch_size = 6\nshuffle = false\nseed = 7\n";
        let json = r#"{"ring": {"name": "data", "slot_bytes": "auto"},
            "dataset": {"kind": "external", "samples": 48,
                        "fields": [{"name": "f0", "dtype": "i64", "shape": [1]}]},
            "plan": {"batch_size": 6, "shuffle": false, "seed": 7}}"#;
        let from_file = Config::from_toml_str(toml, "file").unwrap();
        let mut de = serde_json::Deserializer::from_str(json);
        let from_data = Config::from_settings(&mut de, "data").unwrap();
        assert_eq!(from_data.to_toml(), from_file.to_toml());
        assert_eq!(from_data.source, "data");
    }

    #[test]
    fn an_unknown_key_given_as_data_is_refused_as_in_a_file() {
        let mut de = serde_json::Deserializer::from_str(r#"{"plan": {"batch_sise": 6}}"#);
        match Config::from_settings(&mut de, "data") {
            Err(ConfigError::Parse {
                source_name,
                message,
            }) => {
                assert_eq!(source_name, "data");
                assert!(message.contains("batch_sise"), "{message}");
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        // A seed a TOML file cannot hold (given as data, as Python may) names its key.
        let mut de =
            serde_json::Deserializer::from_str(r#"{"plan": {"seed": 9223372036854775808}}"#);
        match Config::from_settings(&mut de, "data") {
            Err(ConfigError::Invalid { key, .. }) => assert_eq!(key, "plan.seed"),
            other => panic!("expected plan.seed refused, got {other:?}"),
        }
        let mut de =
            serde_json::Deserializer::from_str(r#"{"plan": {"seed": 9223372036854775807}}"#);
        let cfg = Config::from_settings(&mut de, "data").unwrap();
        assert!(cfg.try_to_toml().is_ok());
        // And a value out of range is the config's own error, as from a file.
        let mut de = serde_json::Deserializer::from_str(r#"{"plan": {"batch_size": 0}}"#);
        assert!(Config::from_settings(&mut de, "data").is_err());
    }
}
