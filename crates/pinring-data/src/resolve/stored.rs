//! The spec as a ring stores it: the daemon writes its resolved [`Spec`] into the ring's
//! handoff area as a binary value ([`Spec::to_stored`]), and whoever joins the ring (a
//! consumer, a Python producer, a loader with no config of its own) takes it back with
//! [`Spec::adopt`]: no text parsed, nothing resolved again, no file opened.
//!
//! The value lies in shared memory that any process of the ring's owner may write, so
//! [`Spec::adopt`] trusts none of it: the bytes must be the format it knows (a magic and a
//! version), decode within a size limit with no bytes left over, pass every rule a config file
//! passes, be resolved (no `"auto"` left), and agree with the ring they were read from (its
//! fingerprint, slot size and slot count).
//!
//! Format (docs/PROTOCOL.md, "The stored spec"): [`STORED_SPEC_MAGIC`] (8 bytes), then one
//! [`Stored`] value in bincode 2's standard configuration (little-endian, varint lengths). The
//! paths of a file kind are stored as the settings give them (they are in the fingerprint), with
//! the directory relative ones are resolved against (the config file's, made absolute), so a
//! process in another working directory opens the same files.

use super::Spec;
use crate::{Config, ConfigError, DaemonConfig, DatasetConfig, PlanConfig, RingConfig, SlotBytes};
use pinring_exit::{Coded, Exit};

/// The first 8 bytes of a stored spec: the format and its version. A ring whose spec starts
/// otherwise was written by another version of pinring (or is not a spec).
pub const STORED_SPEC_MAGIC: [u8; 8] = *b"PRSPEC01";

/// Largest stored spec [`Spec::adopt`] reads: the ring's limit on what its handoff area holds
/// (`pinring_ring::handoff::MAX_SPEC_BYTES`).
pub const MAX_STORED_SPEC_BYTES: usize = pinring_ring::handoff::MAX_SPEC_BYTES as usize;

/// The spec's settings as stored: the four sections as resolved, the directory their relative
/// paths are resolved against, what the file said of its epochs, and what the resolver found
/// (the files' length, the slots cut for workers).
#[derive(Debug, bincode::Encode, bincode::Decode)]
struct Stored {
    ring: RingConfig,
    dataset: DatasetConfig,
    plan: PlanConfig,
    daemon: DaemonConfig,
    base_dir: Option<std::path::PathBuf>,
    epochs_given: bool,
    source_len: Option<u64>,
    workers_slots: Option<u32>,
}

/// What a joining process knows of the ring it read a stored spec from: the stored spec must
/// describe this ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFacts {
    /// The ring header's config fingerprint.
    pub fingerprint: u64,
    /// The ring's slot size.
    pub slot_bytes: u64,
    /// The ring's slot count.
    pub slots: u32,
}

impl RingFacts {
    /// The facts of a ring whose header holds `fingerprint` and whose geometry is `g`.
    pub fn of(fingerprint: u64, g: &pinring_ring::Geometry) -> RingFacts {
        RingFacts {
            fingerprint,
            slot_bytes: g.slot_bytes,
            slots: g.slot_count,
        }
    }
}

/// A handle on a ring that a joining process adopts the stored spec from
/// ([`Spec::adopt_from`]): a loader's and a consumer's.
pub trait Joined {
    /// The ring's name.
    fn ring_name(&self) -> &str;
    /// The stored spec's bytes as the ring holds them (`None`: the ring stores none).
    fn stored_spec(&self) -> Option<Vec<u8>>;
    /// What the stored spec must describe.
    fn facts(&self) -> RingFacts;
}

macro_rules! joined {
    ($($role:ty),*) => {$(
        impl Joined for $role {
            fn ring_name(&self) -> &str {
                self.name()
            }
            fn stored_spec(&self) -> Option<Vec<u8>> {
                self.handoff_spec()
            }
            fn facts(&self) -> RingFacts {
                RingFacts::of(self.fingerprint(), &self.geometry())
            }
        }
    )*};
}
joined!(pinring_ring::LoaderRing, pinring_ring::ConsumerRing);

/// Why a spec cannot be stored or adopted.
#[derive(Debug, thiserror::Error)]
pub enum StoredSpecError {
    /// The spec cannot be written in the stored form (a path that is not UTF-8, a value
    /// larger than the ring carries).
    #[error("ring {ring:?}: the spec cannot be stored in the ring: {why}")]
    Store {
        /// The ring.
        ring: String,
        /// The problem.
        why: String,
    },
    /// The bytes in the ring are not a spec this version reads, or not a valid one.
    #[error(
        "ring {ring:?}: the spec stored in the ring is unusable: {why}; the ring was made by \
         another version of pinring or its memory was overwritten: restart its daemon"
    )]
    Corrupt {
        /// The ring.
        ring: String,
        /// The problem.
        why: String,
    },
}

impl Coded for StoredSpecError {
    fn exit(&self) -> Exit {
        match self {
            StoredSpecError::Store { .. } => Exit::Config,
            StoredSpecError::Corrupt { .. } => Exit::Ring,
        }
    }
}

fn bincode_config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_STORED_SPEC_BYTES>,
> {
    bincode::config::standard().with_limit::<MAX_STORED_SPEC_BYTES>()
}

impl Spec {
    /// The spec in the form a ring stores ([`Spec::adopt`] reads it back): the magic, then
    /// the resolved settings with the directory of their relative paths, made absolute.
    pub fn to_stored(&self) -> Result<Vec<u8>, StoredSpecError> {
        let fail = |why: String| StoredSpecError::Store {
            ring: self.ring().to_string(),
            why,
        };
        let cfg = self.config.clone();
        // Relative paths were resolved against the config file's directory, or the working
        // directory where there is no file: stored absolute for a reader elsewhere.
        let base_dir = match cfg.base_dir {
            Some(dir) if dir.is_absolute() => Some(dir),
            dir if cfg.dataset.kind.reads_files() => Some(
                std::env::current_dir()
                    .map_err(|e| fail(format!("cannot read the working directory: {e}")))?
                    .join(dir.unwrap_or_default()),
            ),
            dir => dir,
        };
        let stored = Stored {
            ring: cfg.ring,
            dataset: cfg.dataset,
            plan: cfg.plan,
            daemon: cfg.daemon,
            base_dir,
            epochs_given: cfg.epochs_given,
            source_len: self.source_len,
            workers_slots: self.workers_slots,
        };
        let mut out = STORED_SPEC_MAGIC.to_vec();
        bincode::encode_into_std_write(&stored, &mut out, bincode_config())
            .map_err(|e| fail(e.to_string()))?;
        if out.len() > MAX_STORED_SPEC_BYTES {
            return Err(fail(format!(
                "it takes {} bytes, over the {MAX_STORED_SPEC_BYTES} a ring holds (fewer or \
                 shorter file paths)",
                out.len()
            )));
        }
        Ok(out)
    }

    /// The spec `ring` stores, adopted ([`Spec::adopt`] against the ring's own facts); `None`
    /// for a ring that stores none (its daemon hands batches to no consumer).
    pub fn adopt_from(ring: &impl Joined) -> Option<Result<Spec, StoredSpecError>> {
        let bytes = ring.stored_spec()?;
        Some(Spec::adopt(&bytes, ring.ring_name(), &ring.facts()))
    }

    /// The spec stored in ring `ring` ([`Spec::to_stored`]), checked as a config file is
    /// checked and against the ring it was read from (`facts`): the one constructor besides
    /// [`Spec::resolve`]. Nothing is resolved again and no file is opened; the plan and the
    /// batch layout are made from the stored settings as the daemon made them.
    pub fn adopt(bytes: &[u8], ring: &str, facts: &RingFacts) -> Result<Spec, StoredSpecError> {
        let bad = |why: String| StoredSpecError::Corrupt {
            ring: ring.to_string(),
            why,
        };
        if bytes.len() > MAX_STORED_SPEC_BYTES {
            return Err(bad(format!(
                "{} bytes, over the {MAX_STORED_SPEC_BYTES} a ring holds",
                bytes.len()
            )));
        }
        let body = bytes
            .strip_prefix(&STORED_SPEC_MAGIC)
            .ok_or_else(|| bad("it does not start with this version's format tag".into()))?;
        let (s, read): (Stored, usize) = bincode::decode_from_slice(body, bincode_config())
            .map_err(|e| bad(format!("it does not decode: {e}")))?;
        if read != body.len() {
            return Err(bad(format!(
                "{} bytes follow the settings",
                body.len() - read
            )));
        }
        let cfg = Config {
            ring: s.ring,
            dataset: s.dataset,
            plan: s.plan,
            daemon: s.daemon,
            source: format!("the spec stored in ring {ring:?}"),
            base_dir: s.base_dir,
            sets_nothing: false,
            epochs_given: s.epochs_given,
        };
        cfg.validate()
            .map_err(|e: ConfigError| bad(format!("its settings break a rule: {e}")))?;
        let (Some(slots), SlotBytes::Fixed(_)) = (cfg.ring.slots, cfg.ring.slot_bytes) else {
            return Err(bad("its ring geometry is not resolved".into()));
        };
        if cfg.ring.name != ring {
            return Err(bad(format!("it names ring {:?}", cfg.ring.name)));
        }
        let mine = RingFacts {
            fingerprint: cfg.fingerprint(),
            slot_bytes: cfg.slot_bytes(),
            slots,
        };
        if mine != *facts {
            return Err(bad(format!(
                "it describes fingerprint {:#018x}, {} slots of {} bytes; the ring's header says \
                 {:#018x}, {} slots of {} bytes",
                mine.fingerprint,
                mine.slots,
                mine.slot_bytes,
                facts.fingerprint,
                facts.slots,
                facts.slot_bytes
            )));
        }
        let plan = cfg
            .plan()
            .map_err(|e| bad(format!("its plan cannot be made: {e}")))?;
        let layout = cfg.batch_layout();
        Ok(Spec {
            slots,
            slot_bytes: mine.slot_bytes,
            plan,
            layout,
            source_len: s.source_len,
            auto: None,
            workers_slots: s.workers_slots,
            config: cfg,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostFacts, NoFiles, Overrides, DEFAULT_CONFIG_TOML};

    fn spec(toml: &str) -> Spec {
        let cfg = Config::from_toml_str(toml, "test").unwrap();
        let host = HostFacts {
            cache_bytes: Some(64 << 20),
            ..Default::default()
        };
        Spec::resolve(cfg, &Overrides::default(), &host, &NoFiles).unwrap()
    }

    fn facts(s: &Spec) -> RingFacts {
        RingFacts {
            fingerprint: s.config().fingerprint(),
            slot_bytes: s.slot_bytes(),
            slots: s.slots(),
        }
    }

    #[test]
    fn a_stored_spec_is_adopted_as_the_daemon_resolved_it() {
        let toml = "[ring]\nname = \"r\"\n[dataset]\nkind = \"external\"\nsamples = 100\n\
                    fields = [{ name = \"x\", dtype = \"f32\", shape = [3, 5] }, \
                    { name = \"y\", dtype = \"i64\" }]\n\
                    [plan]\nbatch_size = 7\nepochs = 3\nseed = 9\n";
        for text in [DEFAULT_CONFIG_TOML, toml] {
            let s = spec(text);
            let bytes = s.to_stored().unwrap();
            assert!(bytes.starts_with(&STORED_SPEC_MAGIC));
            let a = Spec::adopt(&bytes, s.ring(), &facts(&s)).unwrap();
            assert_eq!(a.config(), s.config());
            assert_eq!(a.config().fingerprint(), s.config().fingerprint());
            assert_eq!((a.slots(), a.slot_bytes()), (s.slots(), s.slot_bytes()));
            assert_eq!(a.layout(), s.layout());
            assert_eq!(a.plan().total_seqs(), s.plan().total_seqs());
            assert_eq!(a.config().to_toml(), s.config().to_toml());
            assert_eq!(
                a.config().source,
                format!("the spec stored in ring {:?}", s.ring())
            );
        }
    }

    #[test]
    fn bytes_that_are_not_this_rings_spec_are_refused_with_the_reason() {
        let s = spec(DEFAULT_CONFIG_TOML);
        let good = s.to_stored().unwrap();
        let f = facts(&s);
        let refused = |bytes: &[u8], facts: &RingFacts, want: &str| {
            let e = Spec::adopt(bytes, s.ring(), facts).unwrap_err();
            assert!(matches!(e, StoredSpecError::Corrupt { .. }), "{e:?}");
            assert_eq!(e.exit(), Exit::Ring);
            assert!(e.to_string().contains(want), "{want:?} not in {e}");
            assert!(e.to_string().contains("restart its daemon"), "{e}");
        };
        refused(b"[ring]\nname = \"default\"\n", &f, "format tag");
        refused(&good[..good.len() - 3], &f, "does not decode");
        let mut longer = good.clone();
        longer.push(0);
        refused(&longer, &f, "1 bytes follow");
        refused(&vec![0; MAX_STORED_SPEC_BYTES + 1], &f, "over the");
        let other = RingFacts {
            fingerprint: f.fingerprint ^ 1,
            ..f
        };
        refused(&good, &other, "the ring's header says");
        let fewer = RingFacts {
            slots: f.slots - 1,
            ..f
        };
        refused(&good, &fewer, "the ring's header says");
        let e = Spec::adopt(&good, "another", &f).unwrap_err();
        assert!(e.to_string().contains("it names ring \"default\""), "{e}");
        // Every single-byte change of the body either decodes to something checked or is
        // refused: never a panic.
        for i in STORED_SPEC_MAGIC.len()..good.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] ^= flip;
                let _ = Spec::adopt(&b, s.ring(), &f);
            }
        }
    }

    #[test]
    fn a_value_out_of_range_in_the_ring_is_a_broken_rule_not_a_spec() {
        let s = spec(DEFAULT_CONFIG_TOML);
        let mut cfg = s.config().clone();
        cfg.plan.batch_size = 0;
        let broken = Spec {
            config: cfg,
            ..s.clone()
        };
        let bytes = broken.to_stored().unwrap();
        let e = Spec::adopt(&bytes, s.ring(), &facts(&s)).unwrap_err();
        assert!(e.to_string().contains("break a rule"), "{e}");
        assert!(e.to_string().contains("plan.batch_size"), "{e}");
    }
}
