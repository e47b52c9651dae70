//! pinring-data: configuration, deterministic epoch plan, synthetic dataset
//! and per-batch metadata shared by the pinring daemon and loaders.
//!
//! * [`config`] -- the TOML config file's settings ([`Config`]: its shape, with optional and
//!   `"auto"` values).
//! * [`overrides`] -- what flags, environment and Python keywords say over the file
//!   ([`Overrides`]).
//! * [`resolve`] -- the resolved spec a daemon runs ([`Spec`]: nothing optional, no `"auto"`).
//! * [`dataset`] -- the keys of the file kinds (`[dataset.tokens]`, `[dataset.npy]`,
//!   `[dataset.webdataset]`, `[dataset.imagefolder]`, `[dataset.image]`).
//! * [`fields`] -- the named fields of a sample and where each lies in a batch ([`Field`],
//!   [`BatchLayout`]).
//! * [`plan`] -- which samples go into batch `seq` ([`Plan`]).
//! * [`shard_order`] -- the per-rank shard order of `dataset.kind = "webdataset"`
//!   ([`ShardOrder`]).
//! * [`synthetic`] -- the generated dataset ([`Synthetic`]).
//! * [`meta`] -- per-batch metadata stored in a slot ([`BatchMeta`]).
//! * [`fingerprint`] -- [`Config::fingerprint`].
//! * [`size`] -- [`ByteSize`].

#![forbid(unsafe_code)]

pub mod config;
pub mod dataset;
pub mod encoded;
pub mod fields;
pub mod fingerprint;
pub mod meta;
pub mod overrides;
pub mod plan;
pub mod resolve;
pub mod shard_order;
pub mod size;
pub mod synthetic;

pub use config::{
    ring_warnings, AutoRing, BadBatchPolicy, Config, ConfigError, Copies, DaemonConfig,
    DatasetConfig, DatasetKind, PartLayout, PlanConfig, RingConfig, SegmentMode, SlotBytes,
    DEFAULT_CONFIG_TOML,
};
pub use dataset::{
    ImageDataset, ImageDecode, ImageFolderDataset, ImageOutput, ImageTransform, NpyDataset,
    OnBadSample, TokensDataset, WebDatasetDataset, WebDatasetNpy, INPUT_IDS, NPY_DEFAULT_FIELD,
    TARGETS, WDS_NPY_DEFAULT_FIELD,
};
pub use encoded::{
    write_sample, ArenaCursor, ArenaFull, ChunkError, EncodedChunk, EncodedEntry, Placed,
    ENTRY_BYTES, FLAG_FLIP, FLAG_ZEROS,
};
pub use fields::{BatchLayout, ChunkCopy, Field, FieldPlacement, FIELD_ALIGN, IMAGES, LABELS};
pub use fingerprint::FINGERPRINT_VERSION;
pub use meta::{max_encoded_len, BatchMeta, Dtype, MetaError, MAX_META_BYTES};
pub use overrides::{until_stopped, EnvOverrides, Overrides, Spelling};
pub use plan::{BatchIndices, ByteRange, Part, Plan, PlanError, PlanParams, SampleCut};
pub use resolve::{
    slots_for_workers, DatasetOpener, HostFacts, Joined, NoFiles, OpenedDataset, ResolveError,
    RingFacts, Spec, StoredSpecError, MAX_STORED_SPEC_BYTES, STORED_SPEC_MAGIC,
};
pub use shard_order::ShardOrder;
pub use size::{ByteSize, SizeError};
pub use synthetic::{generator_throughput, Synthetic, SyntheticError, LABEL_BYTES};

mod coded {
    use pinring_exit::{Coded, Exit};

    impl Coded for crate::ConfigError {
        fn exit(&self) -> Exit {
            Exit::Config
        }
    }

    impl Coded for crate::PlanError {
        fn exit(&self) -> Exit {
            Exit::Config
        }
    }

    impl Coded for crate::SizeError {
        fn exit(&self) -> Exit {
            Exit::Config
        }
    }

    impl Coded for crate::MetaError {
        /// Metadata that does not decode or does not match the plan: a bad slot.
        fn exit(&self) -> Exit {
            Exit::Ring
        }
    }

    impl Coded for crate::SyntheticError {
        /// Bytes that are not what the generator makes.
        fn exit(&self) -> Exit {
            Exit::Verify
        }
    }
}
