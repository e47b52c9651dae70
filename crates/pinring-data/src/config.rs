//! The TOML config file shared by the daemon and the loaders.
//!
//! Every section and key is optional; missing ones take the built-in
//! defaults ([`DEFAULT_CONFIG_TOML`], equal to [`Config::default`]).
//! Unknown keys are errors. Binaries may override fields (they are all
//! `pub`) and must then call [`Config::validate`] again.
//!
//! Validation includes the ring's geometry, with the limits of the segment layout itself
//! (`pinring_ring::layout`: slot alignment, largest slot, most slots), so a config that passes
//! here is one the daemon can make a ring of.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::dataset::{
    ImageDataset, ImageFolderDataset, ImageOutput, ImageTransform, NpyDataset, OnBadSample,
    RawDataset, TokensDataset, WebDatasetDataset, INPUT_IDS, TARGETS,
};
use crate::fields::{BatchLayout, Field, IMAGES, LABELS};
use crate::meta::{max_encoded_len, Dtype};
use crate::plan::{Plan, PlanError, PlanParams, SampleCut, MAX_PLAN_SAMPLES};
use crate::shard_order::ShardOrder;
use crate::size::ByteSize;
use crate::synthetic::Synthetic;

mod geometry;
pub(crate) mod keys;
pub use geometry::{AutoRing, PartLayout};

/// Alignment of every slot (a page), the segment layout's
/// [`pinring_ring::layout::SLOT_ALIGN`]: an explicit `ring.slot_bytes` must be a multiple of
/// it, and `"auto"` rounds up to it.
pub const SLOT_ALIGN: u64 = pinring_ring::layout::SLOT_ALIGN as u64;
/// Largest slot, the segment layout's [`pinring_ring::layout::MAX_SLOT_BYTES`] (1 GiB).
pub const MAX_SLOT_BYTES: u64 = pinring_ring::layout::MAX_SLOT_BYTES;
/// Fewest slots a ring may have (one filled while another is uploaded).
pub const MIN_SLOTS: u32 = 2;
/// Most slots a ring may have, the segment layout's [`pinring_ring::layout::MAX_SLOTS`].
pub const MAX_SLOTS: u32 = pinring_ring::layout::MAX_SLOTS;
/// Largest allowed sample (1 GiB).
pub const MAX_SAMPLE_BYTES: u64 = 1 << 30;
/// Most dimensions a sample shape may have.
pub const MAX_SAMPLE_DIMS: usize = 16;
/// Largest `[dataset.image] crop` (pinring-image's limit).
pub const MAX_IMAGE_SIDE: u32 = 16384;
/// Granularity of [`Config::meta_reserve_bytes`].
pub const META_RESERVE_ALIGN: u64 = 64;
/// Slots counted for a ring whose `ring.slots` is unset until the daemon resolves it
/// ([`Config::resolve_auto`]): validation before that, and loaders, which take the count from
/// the ring.
pub const DEFAULT_SLOTS: u32 = 16;
/// `"auto"`: the most bytes of a part's largest field (4 MiB). A batch whose largest field is at
/// most this much goes whole into one slot; a larger one is cut into parts of the most whole
/// samples whose largest field fits it (at least one sample). Small fields (labels: 8 bytes a
/// sample) ride along in the same slot, so 4 samples of 1 MiB stay one 4 MiB part, not 3. Copies
/// of 1-4 MiB are where the copy engine is fastest.
pub const AUTO_PART_PAYLOAD_BYTES: u64 = 4 << 20;
/// `"auto"`: the largest ring (data area) it aims for, 128 MiB.
pub const AUTO_RING_MAX_BYTES: u64 = 128 << 20;
/// `"auto"`: the ring it aims for when the last-level cache size is unknown, 32 MiB.
pub const AUTO_RING_FALLBACK_BYTES: u64 = 32 << 20;
/// `"auto"`: the fewest slots it picks, enough for 8 loaders with two slots each.
pub const AUTO_MIN_SLOTS: u32 = 16;
/// `"auto"`: the smallest slot it cuts a batch's parts down to so that [`AUTO_MIN_SLOTS`] of
/// them fit the ring it aims for. From 256 KiB up the copy engine moves batches at the link's
/// speed (docs/BENCHMARKS.md); below it, every part costs the daemon's loop more than its copy.
pub const AUTO_MIN_SLOT_BYTES: u64 = 256 << 10;

/// The defaults, as a commented TOML file (parses to [`Config::default`]).
pub const DEFAULT_CONFIG_TOML: &str = r#"# pinring configuration, shared by the GPU daemon and all loader processes.
# Every key is optional; the values below are the built-in defaults.
# Unknown keys are rejected.

[ring]
# Ring name: the shared-memory segment is /dev/shm/pinring.<name>.
# 1 to 64 characters from A-Z a-z 0-9 _ -
name = "default"
# Number of slots in the ring (2..=4096). Unset: the daemon picks it to
# keep the ring inside the CPU's last-level cache (ring of
# min(cache / 2, 128 MiB), or 32 MiB when the cache size is unknown; at
# least 16 slots), for "auto" and explicit slot sizes alike.
# slots = 16
# Bytes per slot: "auto" or a size such as "16MiB" / 16777216. "auto": a
# batch whose largest field (images) is at most 4 MiB goes whole into one
# slot (payload + metadata reserve, rounded up to 4096); a larger batch is
# cut into parts of the most whole samples whose largest field fits 4 MiB
# (labels ride along); where 16 such slots would not fit half the
# last-level cache, into smaller parts (down to 256 KiB). The daemon resolves
# "auto" at start and publishes the slot size in the ring; loaders with
# "auto" adopt it. An explicit size must be a multiple of 4096 and at
# most 1 GiB. A batch that does not fit one slot is cut into parts of whole
# samples, one slot each, uploaded into one device buffer and delivered
# whole. A sample that does not fit one part (with "auto": its largest
# field is over 4 MiB) is cut into byte parts of that field, one slot
# each, its other fields riding with its first part (kinds "synthetic"
# and "npy"; the other kinds keep whole samples, "auto" then sizes the
# slot for one, and an explicit size must hold one with its metadata).
slot_bytes = "auto"
# Deliver batches in seq order (false: deliver any ready slot first).
in_order = true
# Permission of the segment: "0600" (owner only) or "0660" (owner + group).
mode = "0600"
# Group that owns the segment (only with mode = "0660"); unset: the
# daemon's own group.
# group = "pinring"

[dataset]
# Dataset kind. "synthetic": generated samples with two fields, images
# (sample_shape of dtype) and labels (one i64 each); a slot's payload holds
# its samples' images, then their labels. "external": samples made by
# Python producers (pinring.Producer, pinring.torch.DataLoader), with the
# fields declared in dataset.fields, e.g.
#   fields = [{ name = "images", dtype = "u8", shape = [224, 224, 3] },
#             { name = "labels", dtype = "i64" }]
# (shape [] or omitted: one value per sample; sample_shape, dtype, seed and
# classes are the synthetic kind's and are ignored).
# "tokens": flat binary token files, read by pinring-loader; keys in a
# [dataset.tokens] table. Sample k is the window of seq_len + 1 tokens at
# k x stride; fields input_ids and targets (shape [seq_len] each), e.g.
#   [dataset.tokens]
#   files = ["train-000.bin", "train-001.bin"]  # one stream, in this order
#   token_dtype = "u16"   # or "u32", little-endian, no header
#   seq_len = 1024
#   stride = 1024         # default: seq_len
#   shift = false         # true: each epoch starts offset(plan.seed, epoch)
#                         # tokens in (0..stride)
#   dtype = "i64"         # of input_ids and targets; or "i32"
# "npy": NumPy .npy arrays, read by pinring-loader; keys in a [dataset.npy]
# table, e.g.
#   [dataset.npy]
#   path = "x_train.npy"  # samples on axis 0, or a directory of per-sample
#                         # .npy files (in name order)
#   field = "data"        # the field's name
#   dtype = "f32"         # one sample's dtype and shape, checked against
#   shape = [3, 32, 32]   # the files (the file's exact type: f32 = float32)
#   labels = "y_train.npy"  # optional: field "labels", one entry a sample,
#   labels_dtype = "i64"    # of this dtype
#   labels_shape = []       # and shape
# "webdataset": tar shards of JPEG/PNG images (.jpg, .jpeg, .png) with .cls
# labels, decoded by pinring-loader; fields images and labels (i64), e.g.
#   [dataset.webdataset]
#   shards = ["train-000000.tar", "train-000001.tar"]  # ids in this order
#                          # (or a glob, "train-*.tar": its files, sorted)
#   shuffle_buffer = 1000  # samples; with plan.shuffle, each rank's shards
#                          # (shard i is rank i % world_size's) are shuffled
#                          # and streamed through a buffer of this many
#   npy = { field = "features", dtype = "f32", shape = [16, 8] }
#                          # optional: each sample's .npy member, one array
#                          # of this dtype and shape -> field "features"
#   images = true          # false: no image member, no images field
# "imagefolder": torchvision's ImageFolder layout, root/<class>/<file>;
# labels are the class indices (sorted class directory names), e.g.
#   [dataset.imagefolder]
#   root = "imagenet/train"
#   extensions = ["jpg", "jpeg", "png"]  # case-insensitive
# Both decode and transform each image as [dataset.image] says (all keys
# optional; a key of the other transform or output is refused):
#   [dataset.image]
#   transform = "train"   # RandomResizedCrop + flip, drawn from (plan.seed,
#                         # epoch, sample id); "eval": Resize + CenterCrop
#   crop = 224            # side of the square output
#   resize = 256          # eval: shorter side before the centre crop
#   scale = [0.08, 1.0]   # train: crop area, fraction of the image's
#   ratio = [0.75, 1.3333333333333333]  # train: crop aspect ratio w/h
#   flip = true           # train: horizontal flip half of the time
#   output = "u8"         # images u8 [crop, crop, 3] (HWC); "f16", "bf16",
#                         # "f32": (x/255 - mean)/std, [3, crop, crop] (CHW)
#   mean = [0.485, 0.456, 0.406]  # float outputs, R G B (ImageNet's)
#   std = [0.229, 0.224, 0.225]
#   reduced_decode = false  # true: large JPEGs decoded at 1/4 or 1/8 size
# With the file kinds: relative paths are relative to the directory of
# this file; samples is the files' length (leave it out); the synthetic
# keys (sample_shape, dtype, seed, classes) and the other kinds' keys are
# refused; on_bad_sample says what a sample that cannot be read (or
# decoded) does: "fail" (default) stops the loader (exit 3), "skip" writes
# zeros in its place, counts it and logs a warning.
kind = "synthetic"
# Number of samples in the dataset (>= 1).
samples = 16384
# Shape of one sample; each dimension >= 1; product x dtype size <= 1 GiB.
sample_shape = [128, 128]
# Element type: u8, i8, i16, u16, i32, u32, i64, u64, f16, bf16, f32,
# f64, bool.
dtype = "f32"
# Seed of the synthetic sample bytes.
seed = 42
# Number of classes; synthetic label(i) = f(seed, i) % classes (>= 1).
classes = 1000

[plan]
# Samples per batch (>= 1).
batch_size = 32
# Shuffle the sample order each epoch.
shuffle = true
# Shuffle seed.
seed = 0
# Number of epochs to run (>= 1).
epochs = 2
# Number of the first epoch (for resuming).
start_epoch = 0
# Drop the incomplete tail (of the rank shards and of the last batch).
drop_last = false
# This process's rank and the number of ranks (rank < world_size).
rank = 0
world_size = 1

[daemon]
# A loader may hold a claimed slot this long (ms) before the daemon
# declares it hung, takes the slot back and re-issues its batch (>= 10).
lease_ms = 30000
# How often (ms) the daemon looks for dead or hung loaders and checks the
# segment file (10..=1000).
reap_interval_ms = 200
# With work left and no loader attached for this long (ms), the daemon
# logs a warning naming the seq that waits, again at this interval, and
# `pinring status` shows the ring as stalled (100..=3600000).
idle_warn_ms = 10000
# What a batch the daemon must not upload (bad lengths, wrong seq,
# undecodable or wrong metadata) does: "fail" stops the daemon (exit 4);
# "skip" counts it and has the same seq made again.
on_bad_batch = "fail"
# The daemon's batch buffers (pinring-daemon --prefetch overrides it): whole
# batches uploaded ahead of the sink (1..=256), or with --sink consumer, ahead
# of or held by the training process (2..=64). Unset: enough to keep 64 MiB
# in flight (4 to 128; at most 64 with --sink consumer).
# prefetch = 4
# With --sink consumer, who copies each batch to the GPU: "consumer" (the
# training process, in its own CUDA context, straight from the ring's
# slots: no second context works on the GPU) or "daemon" (into device
# buffers it hands over through CUDA IPC). A daemon inside the training
# process always copies itself.
# copies = "consumer"
# The CUDA device the daemon uploads to (its ordinal), one ring per GPU:
# /etc/pinring/gpu3.toml holds device = 3. Overridden by $PINRING_DEVICE
# and by pinring-daemon --device. Unset: 0.
# device = 0
# CPUs for the daemon's threads and for the ring's loaders. Unset: on a
# host of several NUMA nodes the daemon runs on its GPU's node's CPUs and
# prefers that node for the ring's memory, and loaders follow their
# daemon's CPUs; on one node nothing is pinned.
# cpus = [0, 1]
# loader_cpus = [2, 3, 4, 5]
"#;

/// Errors from loading or validating a config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}; check the path and its permissions")]
    Read {
        /// Path of the file.
        path: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys / wrong types.
    #[error("invalid config {source_name}: {message}")]
    Parse {
        /// File name (or other source description).
        source_name: String,
        /// toml's message (names the key and the line).
        message: String,
    },
    /// The files of a file kind (`dataset.kind = "tokens"`, `"npy"`, `"webdataset"`,
    /// `"imagefolder"`) cannot be opened, or do not hold what the config declares.
    #[error("dataset of config {source_name} (kind = \"{kind}\"): {message}")]
    Dataset {
        /// File name (or other source description).
        source_name: String,
        /// The dataset kind.
        kind: DatasetKind,
        /// The reader's error: the file and the problem.
        message: String,
    },
    /// A value is out of range.
    #[error("invalid config {source_name}: {key} = {value} is not allowed: {allowed}; fix it in the config, or where it is overridden")]
    Invalid {
        /// File name (or other source description).
        source_name: String,
        /// Key path, e.g. `plan.rank`.
        key: &'static str,
        /// The offending value.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

/// `ring.slot_bytes`: automatic or explicit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SlotBytes {
    /// Payload + metadata reserve rounded up to [`SLOT_ALIGN`].
    #[default]
    Auto,
    /// An explicit size.
    Fixed(ByteSize),
}

impl fmt::Display for SlotBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotBytes::Auto => f.write_str("auto"),
            SlotBytes::Fixed(b) => write!(f, "{} ({} bytes)", b, b.0),
        }
    }
}

impl Serialize for SlotBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SlotBytes::Auto => s.serialize_str("auto"),
            SlotBytes::Fixed(b) => b.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for SlotBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SlotBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"auto\", a byte count or a size string like \"16MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SlotBytes, E> {
                Ok(SlotBytes::Fixed(ByteSize(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SlotBytes, E> {
                u64::try_from(v)
                    .map(|v| SlotBytes::Fixed(ByteSize(v)))
                    .map_err(|_| E::custom(format!("slot_bytes {v} is negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SlotBytes, E> {
                if v.trim().eq_ignore_ascii_case("auto") {
                    Ok(SlotBytes::Auto)
                } else {
                    v.parse().map(SlotBytes::Fixed).map_err(E::custom)
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `ring.mode`: permission of the shared-memory segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SegmentMode {
    /// `"0600"`: owner read/write.
    #[default]
    Owner,
    /// `"0660"`: owner and group read/write.
    Group,
}

impl SegmentMode {
    /// Permission bits (`0o600` or `0o660`).
    pub const fn bits(self) -> u32 {
        match self {
            SegmentMode::Owner => 0o600,
            SegmentMode::Group => 0o660,
        }
    }

    /// The config spelling (`"0600"` / `"0660"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            SegmentMode::Owner => "0600",
            SegmentMode::Group => "0660",
        }
    }
}

impl fmt::Display for SegmentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SegmentMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "0600" | "600" | "0o600" => Ok(SegmentMode::Owner),
            "0660" | "660" | "0o660" => Ok(SegmentMode::Group),
            other => Err(format!(
                "segment mode {other:?} is not allowed; use \"0600\" (owner only) or \"0660\" (owner and group)"
            )),
        }
    }
}

impl Serialize for SegmentMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SegmentMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// `dataset.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    /// Generated bytes, see [`crate::synthetic`].
    #[default]
    Synthetic,
    /// Samples made by producers outside pinring's own loaders (`pinring.Producer`, the
    /// workers of `pinring.torch.DataLoader`), with the fields that `dataset.fields` declares.
    /// `pinring-loader` cannot make them, and the verify sinks cannot check them.
    External,
    /// Flat binary token files, windows of `seq_len + 1` tokens ([`TokensDataset`],
    /// `[dataset.tokens]`): fields `input_ids` and `targets`.
    Tokens,
    /// NumPy `.npy` arrays ([`NpyDataset`], `[dataset.npy]`): the data field, and `labels` from
    /// a second array.
    Npy,
    /// WebDataset tar shards of JPEG/PNG images and `.cls` labels ([`WebDatasetDataset`],
    /// `[dataset.webdataset]`, images made as `[dataset.image]` says): fields `images` (unless
    /// `images = false`), `labels` and, with `npy`, the `.npy` members' field.
    #[serde(rename = "webdataset")]
    WebDataset,
    /// torchvision `ImageFolder`'s layout ([`ImageFolderDataset`], `[dataset.imagefolder]`,
    /// images made as `[dataset.image]` says): fields `images` and `labels` (the class index).
    #[serde(rename = "imagefolder")]
    ImageFolder,
}

impl DatasetKind {
    /// The config spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            DatasetKind::Synthetic => "synthetic",
            DatasetKind::External => "external",
            DatasetKind::Tokens => "tokens",
            DatasetKind::Npy => "npy",
            DatasetKind::WebDataset => "webdataset",
            DatasetKind::ImageFolder => "imagefolder",
        }
    }

    /// Whether the samples are read from files by pinring's loaders (`tokens`, `npy`,
    /// `webdataset`, `imagefolder`).
    pub const fn reads_files(self) -> bool {
        matches!(
            self,
            DatasetKind::Tokens
                | DatasetKind::Npy
                | DatasetKind::WebDataset
                | DatasetKind::ImageFolder
        )
    }

    /// Whether the samples are encoded images decoded by the loaders (`webdataset`,
    /// `imagefolder`; `[dataset.image]`), unless the config says otherwise
    /// ([`DatasetConfig::decodes_images`]: `[dataset.webdataset] images = false`).
    pub const fn decodes_images(self) -> bool {
        matches!(self, DatasetKind::WebDataset | DatasetKind::ImageFolder)
    }

    /// Whether a loader can make a byte range of a sample, so that a sample too large for one
    /// part is cut into byte parts ([`crate::plan::SampleCut`]): `synthetic` (its bytes are
    /// generated per word) and `npy` (read with `pread`). The others make whole samples only
    /// (decoders, token windows, Python producers).
    pub const fn cuts_samples(self) -> bool {
        matches!(self, DatasetKind::Synthetic | DatasetKind::Npy)
    }
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Most fields a sample of `kind = "external"` may declare.
pub const MAX_FIELDS: usize = 64;

/// `[ring]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RingConfig {
    /// Segment name suffix (`/dev/shm/pinring.<name>`).
    pub name: String,
    /// Number of slots (2..=4096); `None`: picked by [`Config::resolve_auto`] for the host
    /// ([`Config::auto_ring`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Bytes per slot.
    pub slot_bytes: SlotBytes,
    /// Deliver in seq order.
    pub in_order: bool,
    /// Segment permission.
    pub mode: SegmentMode,
    /// Group owning the segment (mode 0660 only); `None`: the daemon's group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            name: "default".to_string(),
            slots: None,
            slot_bytes: SlotBytes::Auto,
            in_order: true,
            mode: SegmentMode::Owner,
            group: None,
        }
    }
}

/// `[dataset]` section.
///
/// Read through [`crate::dataset`]'s raw form: unknown keys are refused, and so are keys of
/// another kind (by name, with the kind they belong to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawDataset", into = "RawDataset")]
pub struct DatasetConfig {
    /// Dataset kind.
    pub kind: DatasetKind,
    /// Number of samples (>= 1). For a file kind, the source's length: 0 (unset) until it is
    /// opened ([`Config::set_source_len`]); one given in the file must match it.
    pub samples: u64,
    /// Shape of one sample.
    pub sample_shape: Vec<u32>,
    /// Element type.
    pub dtype: Dtype,
    /// Seed of the synthetic bytes.
    pub seed: u64,
    /// Number of label classes (>= 1).
    pub classes: u32,
    /// The fields of every sample, for `kind = "external"` only (synthetic samples have
    /// `images` and `labels`).
    pub fields: Vec<Field>,
    /// What a loader does with a sample it cannot read (file kinds only).
    pub on_bad_sample: OnBadSample,
    /// `[dataset.tokens]`, for `kind = "tokens"` only.
    pub tokens: Option<TokensDataset>,
    /// `[dataset.npy]`, for `kind = "npy"` only.
    pub npy: Option<NpyDataset>,
    /// `[dataset.webdataset]`, for `kind = "webdataset"` only.
    pub webdataset: Option<WebDatasetDataset>,
    /// `[dataset.imagefolder]`, for `kind = "imagefolder"` only.
    pub imagefolder: Option<ImageFolderDataset>,
    /// `[dataset.image]`, for `kind = "webdataset"` and `"imagefolder"` (their defaults when the
    /// table is left out).
    pub image: Option<ImageDataset>,
}

impl DatasetConfig {
    /// Whether the loaders decode images into an `images` field as `[dataset.image]` says:
    /// `kind = "imagefolder"`, and `"webdataset"` unless `[dataset.webdataset] images = false`.
    pub fn decodes_images(&self) -> bool {
        self.kind.decodes_images() && self.webdataset.as_ref().is_none_or(|w| w.images)
    }
}

impl Default for DatasetConfig {
    fn default() -> Self {
        DatasetConfig {
            kind: DatasetKind::Synthetic,
            samples: 16384,
            sample_shape: vec![128, 128],
            dtype: Dtype::F32,
            seed: 42,
            classes: 1000,
            fields: Vec::new(),
            on_bad_sample: OnBadSample::Fail,
            tokens: None,
            npy: None,
            webdataset: None,
            imagefolder: None,
            image: None,
        }
    }
}

/// `[plan]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanConfig {
    /// Samples per batch (>= 1).
    pub batch_size: u32,
    /// Shuffle each epoch.
    pub shuffle: bool,
    /// Shuffle seed.
    pub seed: u64,
    /// Number of epochs (>= 1).
    pub epochs: u32,
    /// First epoch number.
    pub start_epoch: u32,
    /// Drop incomplete shard tail / last batch.
    pub drop_last: bool,
    /// Rank of this process (< world_size).
    pub rank: u32,
    /// Number of ranks (>= 1).
    pub world_size: u32,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            batch_size: 32,
            shuffle: true,
            seed: 0,
            epochs: 2,
            start_epoch: 0,
            drop_last: false,
            rank: 0,
            world_size: 1,
        }
    }
}

/// `[daemon].on_bad_batch`: what a batch the daemon must not upload does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadBatchPolicy {
    /// Stop the daemon with a clear error (exit 4).
    #[default]
    Fail,
    /// Count it, put the slot back for the same seq, and go on.
    Skip,
}

impl BadBatchPolicy {
    /// The config spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            BadBatchPolicy::Fail => "fail",
            BadBatchPolicy::Skip => "skip",
        }
    }
}

/// `[daemon].copies`: who copies a batch handed to a training process onto its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Copies {
    /// The training process, from the ring's slots, in its own CUDA context (the daemon lists
    /// each batch's slots and holds them until the copies are done).
    #[default]
    Consumer,
    /// The daemon, into device buffers the training process opens through CUDA IPC.
    Daemon,
}

impl Copies {
    /// The config spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Copies::Consumer => "consumer",
            Copies::Daemon => "daemon",
        }
    }
}

/// Shortest allowed `daemon.lease_ms`.
pub const MIN_LEASE_MS: u64 = 10;
/// Allowed range of `daemon.reap_interval_ms`.
pub const REAP_INTERVAL_MS: std::ops::RangeInclusive<u64> = 10..=1000;
/// Allowed range of `daemon.idle_warn_ms`.
pub const IDLE_WARN_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// `[daemon]` section: crash and fault handling. Not part of the fingerprint (it does not change
/// batch contents), and read by the daemon only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// How long a loader may hold a claimed slot before it is declared hung (ms).
    pub lease_ms: u64,
    /// How often dead/hung loaders and the segment file are checked (ms).
    pub reap_interval_ms: u64,
    /// With work left and no loader attached for this long (ms), the daemon warns (and again
    /// at this interval) and shows the ring as stalled.
    pub idle_warn_ms: u64,
    /// What a bad batch does.
    pub on_bad_batch: BadBatchPolicy,
    /// The daemon's batch buffers (`pinring-daemon --prefetch` overrides it): how many whole
    /// batches may be uploaded ahead of the sink, or, handed to a consumer (`--sink consumer`,
    /// [`PREFETCH`]), ahead of or held by the training process. `None`: enough to keep 64 MiB in
    /// flight (4 to 128 buffers; at most 64 handed to a consumer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u32>,
    /// Who copies a batch handed to a training process onto the GPU (`--sink consumer` only).
    pub copies: Copies,
    /// The CUDA device ordinal the daemon uploads to (one ring per GPU); `$PINRING_DEVICE` and
    /// `pinring-daemon --device` override it. `None`: 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// CPUs for the daemon's threads. `None`: its GPU's NUMA node's, on a host of several
    /// nodes (pinring-runtime's `numa`), else not pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<u32>>,
    /// CPUs for the ring's loaders. `None`: their daemon's, where those are fewer than theirs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loader_cpus: Option<Vec<u32>>,
}

/// Allowed range of the daemon's batch buffers (`daemon.prefetch`, `pinring-daemon
/// --prefetch`): uploads in flight to a discard, verify or compute sink.
pub const BATCH_BUFFERS: std::ops::RangeInclusive<u32> = 1..=256;

/// Allowed range of the batch buffers handed to a consumer (`--sink consumer`): one held by the
/// training process and at least one uploaded ahead, at most what the ring's handoff area holds
/// ([`pinring_ring::handoff::MAX_BUFFERS`]).
pub const PREFETCH: std::ops::RangeInclusive<u32> = 2..=pinring_ring::handoff::MAX_BUFFERS;

/// What a consumer's prefetch may be, and why (one wording for the config key and the daemon's
/// `--prefetch`). Said of the ring, not of the daemon's sink flag: it is read by callers who
/// never give one (every ring of the Python loaders hands its batches to a training process).
pub fn consumer_prefetch_rule() -> String {
    format!(
        "a ring that hands its batches to a training process needs {} to {} batch buffers (one \
         is the trainer's current batch, the rest are uploaded ahead; the ring's handoff area \
         holds at most {})",
        PREFETCH.start(),
        PREFETCH.end(),
        PREFETCH.end()
    )
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            lease_ms: 30_000,
            reap_interval_ms: 200,
            idle_warn_ms: 10_000,
            on_bad_batch: BadBatchPolicy::Fail,
            prefetch: None,
            copies: Copies::Consumer,
            device: None,
            cpus: None,
            loader_cpus: None,
        }
    }
}

/// The whole config file.
///
/// Equality compares the settings only, not [`Config::source`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[ring]`.
    pub ring: RingConfig,
    /// `[dataset]`.
    pub dataset: DatasetConfig,
    /// `[plan]`.
    pub plan: PlanConfig,
    /// `[daemon]`.
    pub daemon: DaemonConfig,
    /// Where the config came from (file path or description); used in
    /// error messages. Not part of the file.
    #[serde(skip)]
    pub source: String,
    /// The directory of the config file ([`Config::load`]): relative paths of the file kinds
    /// are resolved against it ([`Config::resolve_path`]). `None`: the working directory.
    #[serde(skip)]
    pub base_dir: Option<PathBuf>,
    /// Read from a file that sets nothing (only comments, blank lines or empty tables): every
    /// setting is its built-in default. `pinring config check` and the daemon say so
    /// ([`Config::sets_nothing_warning`]), since a file meant to say something that says
    /// nothing is a likelier mistake than a wish for the synthetic default. Not part of the
    /// file.
    #[serde(skip)]
    pub sets_nothing: bool,
}

impl PartialEq for Config {
    fn eq(&self, other: &Self) -> bool {
        self.ring == other.ring
            && self.dataset == other.dataset
            && self.plan == other.plan
            && self.daemon == other.daemon
    }
}

impl Eq for Config {}

impl Default for Config {
    fn default() -> Self {
        Config {
            ring: RingConfig::default(),
            dataset: DatasetConfig::default(),
            plan: PlanConfig::default(),
            daemon: DaemonConfig::default(),
            source: "<built-in defaults>".to_string(),
            base_dir: None,
            sets_nothing: false,
        }
    }
}

/// A field name: 1 to 64 characters from A-Z a-z 0-9 _ - .
fn valid_field_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether the config file text `text` sets `[section] key` itself, rather than leaving it to
/// pinring's default (`toml_sets(text, "plan", "epochs")`). False for text that is not TOML:
/// loading it reports that.
pub fn toml_sets(text: &str, section: &str, key: &str) -> bool {
    text.parse::<toml::Table>().is_ok_and(|t| {
        t.get(section)
            .and_then(toml::Value::as_table)
            .is_some_and(|s| s.contains_key(key))
    })
}

/// Rounds up to a multiple of `align` (a power of two), saturating: the segment layout's
/// [`pinring_ring::layout::align_up`], with overflow pinned at the top (the caller compares the
/// result with a limit, which a saturated value fails).
fn round_up(v: u64, align: u64) -> u64 {
    pinring_ring::layout::align_up(v, align).unwrap_or(u64::MAX)
}

impl Config {
    /// Parses and validates `text`; `source_name` (usually the file path)
    /// appears in error messages.
    ///
    /// A key refused by the `[dataset]` table's checks is pointed at by its line and column, as
    /// toml points at its own errors, and a key unknown to its table is told where it belongs
    /// (`seq_len belongs in [dataset.tokens]`).
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<Config, ConfigError> {
        let mut cfg =
            Config::from_settings_with(toml::Deserializer::new(text), source_name, |e| {
                let (path, message) = keys::split(e.message());
                let message = message.trim_end();
                let span = path
                    .as_deref()
                    .and_then(|p| keys::locate(text, p))
                    .or_else(|| e.span());
                let message =
                    keys::unknown_key_hint(message).unwrap_or_else(|| message.to_string());
                match span {
                    Some(span) => keys::render(text, span, &message),
                    None => message,
                }
            })?;
        cfg.sets_nothing = keys::sets_nothing(text).unwrap_or(false);
        Ok(cfg)
    }

    /// A config from settings given as data in any serde format (the TOML file's shape:
    /// sections of keys), read by the same rules as a file: unknown keys refused, every value
    /// validated. Python hands its DataLoader's settings over this way, as a dict, so no TOML is
    /// written outside pinring-data.
    pub fn from_settings<'de, D>(settings: D, source_name: &str) -> Result<Config, ConfigError>
    where
        D: Deserializer<'de>,
    {
        Config::from_settings_with(settings, source_name, |e| {
            let (_, message) = keys::split(&e.to_string());
            let message = message.trim_end();
            keys::unknown_key_hint(message).unwrap_or_else(|| message.to_string())
        })
    }

    /// [`Config::from_settings`], its deserializer's error written by `message`.
    fn from_settings_with<'de, D>(
        settings: D,
        source_name: &str,
        message: impl FnOnce(&D::Error) -> String,
    ) -> Result<Config, ConfigError>
    where
        D: Deserializer<'de>,
    {
        let mut cfg = Config::deserialize(settings).map_err(|e| ConfigError::Parse {
            source_name: source_name.to_string(),
            message: message(&e).trim_end().to_string(),
        })?;
        cfg.source = source_name.to_string();
        cfg.validate()?;
        Ok(cfg)
    }

    /// The warning to give for a config read from a file that sets nothing
    /// ([`Config::sets_nothing`]); `None` for any other.
    pub fn sets_nothing_warning(&self) -> Option<String> {
        self.sets_nothing.then(|| {
            format!(
                "{} sets nothing (only comments, blank lines or empty tables): every setting is \
                 its built-in default, the synthetic dataset; if that is not what you meant, \
                 check that this is the file you edited",
                self.source
            )
        })
    }

    /// Reads, parses and validates the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: name.clone(),
            source,
        })?;
        let mut cfg = Self::from_toml_str(&text, &name)?;
        // Absolute, so that a message naming a file of the dataset names the folder it is in,
        // not "./" (the config's own path may be relative to the working directory).
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        cfg.base_dir = Some(std::path::absolute(&dir).unwrap_or(dir));
        Ok(cfg)
    }

    /// Rewrites every path of a file kind as the absolute path it resolves to
    /// ([`Config::resolve_path`], a relative base taken from the working directory), so the
    /// config reads the same files wherever it is written next. For configs that travel
    /// without their file: an anonymous ring's (its loaders read it from the ring, not from the
    /// file) and settings given as data (relative to the working directory of the process that
    /// gave them). The fingerprint then covers the absolute paths.
    pub fn make_paths_absolute(&mut self) -> Result<(), ConfigError> {
        let base = self.base_dir.take();
        let absolute = |p: &mut PathBuf| -> Result<(), ConfigError> {
            let joined = match &base {
                Some(dir) if p.is_relative() => dir.join(&*p),
                _ => p.clone(),
            };
            *p = std::path::absolute(&joined).map_err(|source| ConfigError::Read {
                path: joined.display().to_string(),
                source,
            })?;
            Ok(())
        };
        let d = &mut self.dataset;
        if let Some(t) = &mut d.tokens {
            t.files.iter_mut().try_for_each(absolute)?;
        }
        if let Some(n) = &mut d.npy {
            absolute(&mut n.path)?;
            n.labels.iter_mut().try_for_each(absolute)?;
        }
        if let Some(w) = &mut d.webdataset {
            w.shards.iter_mut().try_for_each(absolute)?;
        }
        if let Some(f) = &mut d.imagefolder {
            absolute(&mut f.root)?;
        }
        Ok(())
    }

    /// `path` of a file kind (as written in the config) resolved: an absolute path as it is, a
    /// relative one against the directory of the config file ([`Config::base_dir`]), or the
    /// working directory for a config that is not from a file.
    pub fn resolve_path(&self, path: &Path) -> PathBuf {
        match &self.base_dir {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// Replaces `dataset.webdataset.shards` with `shards`: its globs expanded (each in sorted
    /// order, pinring-sources' opener expands them), before the length, the shard sizes and
    /// the fingerprint are taken from them, so the fingerprint covers the shards read, not the
    /// pattern. Does nothing for the other kinds.
    pub fn set_shards(&mut self, shards: Vec<PathBuf>) -> Result<(), ConfigError> {
        if let Some(w) = self
            .dataset
            .webdataset
            .as_mut()
            .filter(|_| self.dataset.kind == DatasetKind::WebDataset)
        {
            w.shards = shards;
        }
        self.validate()
    }

    /// The paths of the dataset's files as written, each with its key (`dataset.tokens.files`,
    /// `dataset.npy.path`, `dataset.npy.labels`, `dataset.webdataset.shards`,
    /// `dataset.imagefolder.root`).
    pub fn dataset_paths(&self) -> Vec<(&'static str, &Path)> {
        let d = &self.dataset;
        let mut out = Vec::new();
        if let Some(t) = &d.tokens {
            out.extend(
                t.files
                    .iter()
                    .map(|f| ("dataset.tokens.files", f.as_path())),
            );
        }
        if let Some(n) = &d.npy {
            out.push(("dataset.npy.path", n.path.as_path()));
            out.extend(n.labels.iter().map(|l| ("dataset.npy.labels", l.as_path())));
        }
        if let Some(w) = &d.webdataset {
            out.extend(
                w.shards
                    .iter()
                    .map(|s| ("dataset.webdataset.shards", s.as_path())),
            );
        }
        if let Some(f) = &d.imagefolder {
            out.push(("dataset.imagefolder.root", f.root.as_path()));
        }
        out
    }

    /// The folder relative paths of the dataset are resolved against ([`Config::resolve_path`]),
    /// in words: the config file's folder, or the working directory for a config not read from
    /// a file.
    pub fn paths_relative_to(&self) -> String {
        match &self.base_dir {
            Some(dir) => format!("{}, the folder of the config file", dir.display()),
            None => match std::env::current_dir() {
                Ok(cwd) => format!("{}, the working directory", cwd.display()),
                Err(_) => "the working directory".to_string(),
            },
        }
    }

    /// Whether `dataset.samples` is known: always, except for a file kind whose source has not
    /// been opened yet (and whose config does not give it).
    pub fn samples_resolved(&self) -> bool {
        self.dataset.samples != 0
    }

    /// Records the sample counts of the opened shards of `dataset.kind = "webdataset"` as
    /// `dataset.webdataset.shard_samples` (the plan's shard order needs them; call it before
    /// [`Config::set_source_len`], which validates). Counts given in the file (or recorded before,
    /// by the daemon) must equal them. Does nothing for the other kinds.
    pub fn set_shard_samples(&mut self, sizes: &[u64]) -> Result<(), ConfigError> {
        let source = self.source.clone();
        let Some(w) = self
            .dataset
            .webdataset
            .as_mut()
            .filter(|_| self.dataset.kind == DatasetKind::WebDataset)
        else {
            return Ok(());
        };
        if !w.shard_samples.is_empty() && w.shard_samples != sizes {
            return Err(ConfigError::Invalid {
                source_name: source,
                key: "dataset.webdataset.shard_samples",
                value: format!("{:?}", w.shard_samples),
                allowed: format!(
                    "the shards hold {sizes:?} samples: leave \
                     dataset.webdataset.shard_samples out (it is the shards' counts) or make the \
                     shards match"
                ),
            });
        }
        w.shard_samples = sizes.to_vec();
        Ok(())
    }

    /// Records the length of the opened source of a file kind as `dataset.samples` and validates
    /// the whole config again (the plan needs it). A `dataset.samples` given in the file (or
    /// resolved before, by the daemon) must equal it.
    pub fn set_source_len(&mut self, len: u64) -> Result<(), ConfigError> {
        if self.dataset.samples != 0 && self.dataset.samples != len {
            return Err(self.invalid(
                "dataset.samples",
                self.dataset.samples,
                format!(
                    "the {} files hold {len} samples: leave dataset.samples out (it is the                      files' length) or make the files match",
                    self.dataset.kind
                ),
            ));
        }
        self.dataset.samples = len;
        self.validate()
    }

    /// Serializes to TOML (e.g. to print the effective config, or to hand it to a process).
    pub fn try_to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string_pretty(self).map_err(|e| ConfigError::Parse {
            source_name: self.source.clone(),
            message: format!("cannot be written as TOML: {e}"),
        })
    }

    /// [`Config::try_to_toml`], or a comment saying why not (for reports).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot serialize config: {e}\n"))
    }

    fn invalid(
        &self,
        key: &'static str,
        value: impl fmt::Display,
        allowed: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            source_name: self.source.clone(),
            key,
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }

    /// Checks `daemon.prefetch` for a ring that hands its batches to a consumer (`--sink
    /// consumer`, every ring Python makes): [`PREFETCH`], where [`Config::validate`] allows any
    /// sink's [`BATCH_BUFFERS`].
    pub fn check_consumer_prefetch(&self) -> Result<(), ConfigError> {
        match self.daemon.prefetch {
            Some(p) if !PREFETCH.contains(&p) => {
                Err(self.invalid("daemon.prefetch", p, consumer_prefetch_rule()))
            }
            _ => Ok(()),
        }
    }

    /// Checks every value range; call again after applying overrides.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // A config is written as TOML (for loaders, consumers, the ring), whose integers are
        // signed 64-bit: a seed given as data (Python) above that could not be written out.
        for (key, seed) in [
            ("plan.seed", self.plan.seed),
            ("dataset.seed", self.dataset.seed),
        ] {
            if seed > i64::MAX as u64 {
                return Err(self.invalid(
                    key,
                    seed,
                    "0 to 9223372036854775807 (2^63 - 1): a config is written as TOML, whose \
                     integers are signed 64-bit; pass a smaller seed",
                ));
            }
        }
        let r = &self.ring;
        // The one rule for ring names, shared with the segment code.
        if pinring_ring::segment::validate_name(&r.name).is_err() {
            return Err(self.invalid(
                "ring.name",
                format!("{:?}", r.name),
                "1 to 64 characters from A-Z a-z 0-9 _ -",
            ));
        }
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&self.slots()) {
            return Err(self.invalid(
                "ring.slots",
                self.slots(),
                format!("must be between {MIN_SLOTS} and {MAX_SLOTS}"),
            ));
        }
        if let Some(group) = &r.group {
            let ok = (1..=32).contains(&group.len())
                && group
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !ok {
                return Err(self.invalid(
                    "ring.group",
                    format!("{group:?}"),
                    "a group name of 1 to 32 characters from A-Z a-z 0-9 _ - .",
                ));
            }
            if r.mode != SegmentMode::Group {
                return Err(self.invalid(
                    "ring.group",
                    format!("{group:?}"),
                    "a group only makes sense with ring.mode = \"0660\"; set the mode or remove the group",
                ));
            }
        }
        let dm = &self.daemon;
        if dm.lease_ms < MIN_LEASE_MS {
            return Err(self.invalid(
                "daemon.lease_ms",
                dm.lease_ms,
                format!("must be at least {MIN_LEASE_MS}"),
            ));
        }
        if !REAP_INTERVAL_MS.contains(&dm.reap_interval_ms) {
            return Err(self.invalid(
                "daemon.reap_interval_ms",
                dm.reap_interval_ms,
                format!(
                    "must be between {} and {} (dead loaders are noticed within this time)",
                    REAP_INTERVAL_MS.start(),
                    REAP_INTERVAL_MS.end()
                ),
            ));
        }
        if !IDLE_WARN_MS.contains(&dm.idle_warn_ms) {
            return Err(self.invalid(
                "daemon.idle_warn_ms",
                dm.idle_warn_ms,
                format!(
                    "must be between {} and {} (how long a ring with work left may have no \
                     loader before the daemon warns)",
                    IDLE_WARN_MS.start(),
                    IDLE_WARN_MS.end()
                ),
            ));
        }
        for (key, cpus) in [
            ("daemon.cpus", &dm.cpus),
            ("daemon.loader_cpus", &dm.loader_cpus),
        ] {
            if let Some(list) = cpus {
                if list.is_empty() || list.iter().any(|&c| c >= 1024) {
                    return Err(self.invalid(
                        key,
                        format!("{list:?}"),
                        "a list of one or more CPU numbers below 1024 (leave it out to place \
                         by the GPU's NUMA node)",
                    ));
                }
            }
        }
        if let Some(p) = dm.prefetch {
            if !BATCH_BUFFERS.contains(&p) {
                return Err(self.invalid(
                    "daemon.prefetch",
                    p,
                    format!(
                        "must be between {} and {} batch buffers ({} to {} for a ring that \
                         hands its batches to a training process: one is the trainer's current \
                         batch, the rest are uploaded ahead)",
                        BATCH_BUFFERS.start(),
                        BATCH_BUFFERS.end(),
                        PREFETCH.start(),
                        PREFETCH.end()
                    ),
                ));
            }
        }
        let d = &self.dataset;
        self.validate_fields()?;
        self.validate_files()?;
        // A file kind learns its length when its source is opened.
        let unresolved = d.kind.reads_files() && d.samples == 0;
        if !unresolved && (d.samples == 0 || d.samples > MAX_PLAN_SAMPLES) {
            return Err(self.invalid(
                "dataset.samples",
                d.samples,
                format!("must be between 1 and {MAX_PLAN_SAMPLES}"),
            ));
        }
        if !d.kind.reads_files() && d.sample_shape.len() > MAX_SAMPLE_DIMS {
            return Err(self.invalid(
                "dataset.sample_shape",
                format!("{:?}", d.sample_shape),
                format!("at most {MAX_SAMPLE_DIMS} dimensions"),
            ));
        }
        if !d.kind.reads_files() && d.sample_shape.contains(&0) {
            return Err(self.invalid(
                "dataset.sample_shape",
                format!("{:?}", d.sample_shape),
                "every dimension must be >= 1",
            ));
        }
        let sb = self.sample_bytes_checked();
        if !matches!(sb, Some(1..=MAX_SAMPLE_BYTES)) {
            let (key, value) = self.first_field_setting();
            return Err(self.invalid(
                key,
                value,
                "one sample's first field (product of dims x dtype size) must be at most 1 GiB",
            ));
        }
        if d.classes == 0 {
            return Err(self.invalid("dataset.classes", 0, "must be >= 1"));
        }
        let p = &self.plan;
        if p.batch_size == 0 {
            return Err(self.invalid("plan.batch_size", 0, "must be >= 1"));
        }
        if p.epochs == 0 {
            return Err(self.invalid("plan.epochs", 0, "must be >= 1"));
        }
        if p.world_size == 0 {
            return Err(self.invalid("plan.world_size", 0, "must be >= 1"));
        }
        if p.rank >= p.world_size {
            return Err(self.invalid(
                "plan.rank",
                p.rank,
                format!("must be less than plan.world_size ({})", p.world_size),
            ));
        }
        if let Some(w) = d
            .webdataset
            .as_ref()
            .filter(|_| d.kind == DatasetKind::WebDataset)
            // A glob's shards are counted when it is expanded ([`Config::set_shards`]).
            .filter(|w| !w.shards.iter().any(|p| crate::dataset::is_glob(p)))
        {
            // Known from the config alone: refused before the shards are opened.
            if (w.shards.len() as u64) < u64::from(p.world_size) {
                let e = PlanError::TooFewShards {
                    shards: w.shards.len() as u64,
                    world_size: p.world_size,
                };
                return Err(self.invalid("plan.world_size", p.world_size, e.to_string()));
            }
            if !w.shard_samples.is_empty() && w.shard_samples.len() != w.shards.len() {
                return Err(self.invalid(
                    "dataset.webdataset.shard_samples",
                    format!("{:?}", w.shard_samples),
                    format!(
                        "one count per shard ({} shards): leave it out, it is recorded from the \
                         shards when they are opened",
                        w.shards.len()
                    ),
                ));
            }
        }
        // The shard order needs the shards' sizes too.
        let unresolved = unresolved
            || d.kind == DatasetKind::WebDataset
                && d.webdataset
                    .as_ref()
                    .is_none_or(|w| w.shard_samples.is_empty());
        if !unresolved {
            self.validate_cut()?;
        }
        match self.plan() {
            _ if unresolved => {}
            Ok(_) => {}
            Err(
                e @ (PlanError::TooFewShards { world_size, .. }
                | PlanError::EmptyRank { world_size, .. }),
            ) => {
                return Err(self.invalid("plan.world_size", world_size, e.to_string()));
            }
            Err(PlanError::InvalidParam {
                key,
                value,
                allowed,
            }) => {
                return Err(self.invalid(key, value, allowed));
            }
            Err(e @ PlanError::Empty { .. }) => {
                return Err(self.invalid("plan.batch_size", p.batch_size, format!("{e}")));
            }
            Err(e @ PlanError::SeqOutOfRange { .. }) => {
                return Err(self.invalid("plan", "?", e.to_string()));
            }
        }
        self.validate_geometry()
    }

    /// Byte parts ([`Config::part_layout`]): a slot must hold a byte part of at least 8 bytes
    /// with the sample's other fields and its metadata.
    fn validate_cut(&self) -> Result<(), ConfigError> {
        let Some(cut) = self.part_layout().cut else {
            return Ok(());
        };
        if cut.chunk_bytes == 0 {
            let (_, others) = self.cut_sizes();
            let least = round_up(self.cut_need(8, others), SLOT_ALIGN);
            return Err(self.invalid(
                "ring.slot_bytes",
                self.ring.slot_bytes,
                format!(
                    "too small: one sample ({} bytes, all its fields) does not fit, so it is cut \
                     into byte parts, and a slot must hold a byte part of its largest field with \
                     its other fields ({others} bytes) and its metadata; use \"auto\" or at least \
                     {least}",
                    self.record_bytes()
                ),
            ));
        }
        Ok(())
    }

    /// `dataset.fields`: declared for `kind = "external"` (1 to [`MAX_FIELDS`] fields with
    /// distinct names, shapes of at most [`MAX_SAMPLE_DIMS`] dimensions >= 1, at most 1 GiB per
    /// sample over all fields), and absent for the other kinds.
    fn validate_fields(&self) -> Result<(), ConfigError> {
        let d = &self.dataset;
        if d.kind != DatasetKind::External {
            if !d.fields.is_empty() {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("{} fields", d.fields.len()),
                    "only kind = \"external\" declares its fields (synthetic samples have images \
                     and labels); remove dataset.fields",
                ));
            }
            return Ok(());
        }
        if d.fields.is_empty() || d.fields.len() > MAX_FIELDS {
            return Err(self.invalid(
                "dataset.fields",
                format!("{} fields", d.fields.len()),
                format!(
                    "kind = \"external\" needs 1 to {MAX_FIELDS} fields, each {{ name = \"images\", \
                     dtype = \"u8\", shape = [224, 224, 3] }}"
                ),
            ));
        }
        let mut total = 0u64;
        for (i, f) in d.fields.iter().enumerate() {
            if !valid_field_name(&f.name) {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("[{i}] name {:?}", f.name),
                    "a field name is 1 to 64 characters from A-Z a-z 0-9 _ - .",
                ));
            }
            if d.fields[..i].iter().any(|g| g.name == f.name) {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("[{i}] name {:?}", f.name),
                    "field names must differ; rename one of the two",
                ));
            }
            if f.shape.len() > MAX_SAMPLE_DIMS || f.shape.contains(&0) {
                return Err(self.invalid(
                    "dataset.fields",
                    format!("[{i}] {:?} shape {:?}", f.name, f.shape),
                    format!(
                        "at most {MAX_SAMPLE_DIMS} dimensions, each >= 1 ([] is one value per sample)"
                    ),
                ));
            }
            total = total.saturating_add(f.sample_bytes());
        }
        if total > MAX_SAMPLE_BYTES {
            return Err(self.invalid(
                "dataset.fields",
                format!("{total} bytes per sample"),
                "one sample (all its fields) must be at most 1 GiB",
            ));
        }
        Ok(())
    }

    /// `[dataset.tokens]` / `[dataset.npy]`: present for their kind only, with values in range
    /// (the files themselves are checked when the source is opened).
    fn validate_files(&self) -> Result<(), ConfigError> {
        let d = &self.dataset;
        for (given, owner, key) in [
            (d.tokens.is_some(), DatasetKind::Tokens, "dataset.tokens"),
            (d.npy.is_some(), DatasetKind::Npy, "dataset.npy"),
            (
                d.webdataset.is_some(),
                DatasetKind::WebDataset,
                "dataset.webdataset",
            ),
            (
                d.imagefolder.is_some(),
                DatasetKind::ImageFolder,
                "dataset.imagefolder",
            ),
        ] {
            if given != (d.kind == owner) {
                return Err(self.invalid(
                    key,
                    if given { "a table" } else { "no table" },
                    format!(
                        "[{key}] is given exactly when dataset.kind = \"{owner}\" (this dataset \
                         has kind = \"{}\")",
                        d.kind
                    ),
                ));
            }
        }
        let dims_ok = |shape: &[u32]| shape.len() <= MAX_SAMPLE_DIMS && !shape.contains(&0);
        if let Some(t) = &d.tokens {
            if t.files.is_empty() || t.files.iter().any(|f| f.as_os_str().is_empty()) {
                return Err(self.invalid(
                    "dataset.tokens.files",
                    format!("{:?}", t.files),
                    "one or more token files (paths relative to the config file's directory, or \
                     absolute), read as one stream in this order",
                ));
            }
            if !matches!(t.token_dtype, Dtype::U16 | Dtype::U32) {
                return Err(self.invalid(
                    "dataset.tokens.token_dtype",
                    t.token_dtype,
                    "\"u16\" or \"u32\" (the files' little-endian token type)",
                ));
            }
            if !matches!(t.dtype, Dtype::I64 | Dtype::I32) {
                return Err(self.invalid(
                    "dataset.tokens.dtype",
                    t.dtype,
                    "\"i64\" or \"i32\" (the dtype of input_ids and targets)",
                ));
            }
            if t.seq_len == 0 {
                return Err(self.invalid("dataset.tokens.seq_len", 0, "must be >= 1"));
            }
            if t.stride == Some(0) {
                return Err(self.invalid(
                    "dataset.tokens.stride",
                    0,
                    "must be >= 1 (leave it out for seq_len)",
                ));
            }
        }
        if let Some(n) = &d.npy {
            if n.path.as_os_str().is_empty() {
                return Err(self.invalid(
                    "dataset.npy.path",
                    "\"\"",
                    "a .npy file (samples on the first axis) or a directory of per-sample .npy files",
                ));
            }
            if !valid_field_name(&n.field) || (n.labels.is_some() && n.field == LABELS) {
                return Err(self.invalid(
                    "dataset.npy.field",
                    format!("{:?}", n.field),
                    "1 to 64 characters from A-Z a-z 0-9 _ - ., and not \"labels\" when \
                     dataset.npy.labels is given",
                ));
            }
            for (key, dtype) in [
                ("dataset.npy.dtype", n.dtype),
                ("dataset.npy.labels_dtype", n.labels_dtype),
            ] {
                if dtype == Dtype::Bf16 {
                    return Err(self.invalid(
                        key,
                        dtype,
                        "a dtype numpy has: u8, i8, i16, u16, i32, u32, i64, u64, f16, f32, f64, \
                         bool",
                    ));
                }
            }
            for (key, shape) in [
                ("dataset.npy.shape", &n.shape),
                ("dataset.npy.labels_shape", &n.labels_shape),
            ] {
                if !dims_ok(shape) {
                    return Err(self.invalid(
                        key,
                        format!("{shape:?}"),
                        format!(
                            "the shape of one sample: at most {MAX_SAMPLE_DIMS} dimensions, each \
                             >= 1 ([] is one value per sample)"
                        ),
                    ));
                }
            }
        }
        if d.image.is_some() != d.decodes_images() {
            return Err(self.invalid(
                "dataset.image",
                if d.image.is_some() {
                    "a table"
                } else {
                    "no table"
                },
                format!(
                    "[dataset.image] belongs to dataset.kind = \"webdataset\" and \
                     \"imagefolder\", and not beside dataset.webdataset.images = false (this \
                     dataset has kind = \"{}\")",
                    d.kind
                ),
            ));
        }
        if let Some(w) = &d.webdataset {
            if w.shards.is_empty() || w.shards.iter().any(|f| f.as_os_str().is_empty()) {
                return Err(self.invalid(
                    "dataset.webdataset.shards",
                    format!("{:?}", w.shards),
                    "one or more tar shards (paths relative to the config file's directory, or \
                     absolute), in order",
                ));
            }
            if let Some(n) = &w.npy {
                let taken = if w.images {
                    "\"labels\" or \"images\" (the kind's other fields)"
                } else {
                    "\"labels\" (the kind's other field)"
                };
                if !valid_field_name(&n.field)
                    || n.field == LABELS
                    || (w.images && n.field == IMAGES)
                {
                    return Err(self.invalid(
                        "dataset.webdataset.npy.field",
                        format!("{:?}", n.field),
                        format!(
                            "1 to 64 characters from A-Z a-z 0-9 _ - ., and not {taken}: field \
                             names must differ"
                        ),
                    ));
                }
                if n.dtype == Dtype::Bf16 {
                    return Err(self.invalid(
                        "dataset.webdataset.npy.dtype",
                        n.dtype,
                        "a dtype numpy has: u8, i8, i16, u16, i32, u32, i64, u64, f16, f32, f64, \
                         bool",
                    ));
                }
                if !dims_ok(&n.shape) {
                    return Err(self.invalid(
                        "dataset.webdataset.npy.shape",
                        format!("{:?}", n.shape),
                        format!(
                            "the shape of each .npy member: at most {MAX_SAMPLE_DIMS} dimensions, \
                             each >= 1 ([] is one value per sample)"
                        ),
                    ));
                }
            }
        }
        if let Some(f) = &d.imagefolder {
            if f.root.as_os_str().is_empty() {
                return Err(self.invalid(
                    "dataset.imagefolder.root",
                    "\"\"",
                    "the directory that holds one subdirectory per class",
                ));
            }
            if f.extensions.is_empty()
                || f.extensions
                    .iter()
                    .any(|e| e.trim_start_matches('.').is_empty())
            {
                return Err(self.invalid(
                    "dataset.imagefolder.extensions",
                    format!("{:?}", f.extensions),
                    "one or more file extensions such as \"jpg\" (default jpg, jpeg, png)",
                ));
            }
        }
        if let Some(i) = &d.image {
            self.validate_image(i)?;
        }
        Ok(())
    }

    /// `[dataset.image]`: values in range, and no key of the other transform or output.
    fn validate_image(&self, i: &ImageDataset) -> Result<(), ConfigError> {
        let t = i.transform.as_str();
        let other = match i.transform {
            ImageTransform::Train => [("dataset.image.resize", i.resize.is_some())].to_vec(),
            ImageTransform::Eval => [
                ("dataset.image.scale", i.scale.is_some()),
                ("dataset.image.ratio", i.ratio.is_some()),
                ("dataset.image.flip", i.flip.is_some()),
            ]
            .to_vec(),
        };
        if let Some((key, _)) = other.iter().find(|(_, given)| *given) {
            return Err(self.invalid(
                key,
                "given",
                format!(
                    "a key of transform = \"{}\", and this table has transform = \"{t}\": \
                     remove it",
                    if t == "train" { "eval" } else { "train" }
                ),
            ));
        }
        if i.output == ImageOutput::U8 {
            for (key, given) in [
                ("dataset.image.mean", i.mean.is_some()),
                ("dataset.image.std", i.std.is_some()),
            ] {
                if given {
                    return Err(self.invalid(
                        key,
                        "given",
                        "a key of the normalised outputs (output = \"f16\", \"bf16\" or \
                         \"f32\"); output = \"u8\" is unnormalised: remove it",
                    ));
                }
            }
        }
        let crop = i.crop();
        if crop == 0 || crop > MAX_IMAGE_SIDE {
            return Err(self.invalid(
                "dataset.image.crop",
                crop,
                format!("the output's side in pixels: 1 to {MAX_IMAGE_SIDE}"),
            ));
        }
        if i.transform == ImageTransform::Eval && i.resize() < crop {
            return Err(self.invalid(
                "dataset.image.resize",
                i.resize(),
                format!("the shorter side after resizing, at least crop ({crop})"),
            ));
        }
        let [lo, hi] = i.scale();
        if !(lo > 0.0 && lo <= hi && hi <= 1.0) {
            return Err(self.invalid(
                "dataset.image.scale",
                format!("[{lo}, {hi}]"),
                "[min, max] with 0 < min <= max <= 1 (fractions of the image's area)",
            ));
        }
        let [lo, hi] = i.ratio();
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(self.invalid(
                "dataset.image.ratio",
                format!("[{lo}, {hi}]"),
                "[min, max] with 0 < min <= max (aspect ratios w/h)",
            ));
        }
        if i.std().iter().any(|s| !(s.is_finite() && *s != 0.0)) {
            return Err(self.invalid(
                "dataset.image.std",
                format!("{:?}", i.std()),
                "three finite, non-zero values (R, G, B on the 0..1 scale)",
            ));
        }
        if i.mean().iter().any(|m| !m.is_finite()) {
            return Err(self.invalid(
                "dataset.image.mean",
                format!("{:?}", i.mean()),
                "three finite values (R, G, B on the 0..1 scale)",
            ));
        }
        Ok(())
    }

    /// The key that sets the size of a sample's first field for this kind, and its value as the
    /// size check words it (`dataset.tokens.seq_len = 4000000000 x u16`), so that a sample too
    /// large is reported at the key the user wrote.
    fn first_field_setting(&self) -> (&'static str, String) {
        let d = &self.dataset;
        match d.kind {
            DatasetKind::Synthetic => (
                "dataset.sample_shape",
                format!("{:?} x {}", d.sample_shape, d.dtype),
            ),
            DatasetKind::External => (
                "dataset.fields",
                d.fields.first().map_or_else(String::new, |f| {
                    format!(
                        "[{{ name = {:?}, shape = {:?} x {} }}, ...]",
                        f.name, f.shape, f.dtype
                    )
                }),
            ),
            DatasetKind::Tokens => match &d.tokens {
                Some(t) => (
                    "dataset.tokens.seq_len",
                    format!("{} x {}", t.seq_len, t.dtype),
                ),
                None => ("dataset.tokens", String::new()),
            },
            DatasetKind::Npy => match &d.npy {
                Some(n) => ("dataset.npy.shape", format!("{:?} x {}", n.shape, n.dtype)),
                None => ("dataset.npy", String::new()),
            },
            DatasetKind::WebDataset | DatasetKind::ImageFolder => match &d.image {
                Some(i) => {
                    let (dtype, shape) = i.images();
                    (
                        "dataset.image.crop",
                        format!("{} ({shape:?} x {dtype})", i.crop()),
                    )
                }
                None => ("dataset.image", String::new()),
            },
        }
    }

    fn sample_bytes_checked(&self) -> Option<u64> {
        let d = &self.dataset;
        match d.kind {
            DatasetKind::Synthetic => {}
            DatasetKind::External => return d.fields.first().map(Field::sample_bytes),
            DatasetKind::Tokens
            | DatasetKind::Npy
            | DatasetKind::WebDataset
            | DatasetKind::ImageFolder => return self.file_field_bytes().map(|(first, _)| first),
        }
        d.sample_shape
            .iter()
            .try_fold(d.dtype.size_of() as u64, |acc, &x| {
                acc.checked_mul(u64::from(x))
            })
    }

    /// Bytes of one sample's first field (`images`: product of dims x dtype size; saturating).
    pub fn sample_bytes(&self) -> u64 {
        self.sample_bytes_checked().unwrap_or(u64::MAX)
    }

    /// The named fields of every sample, in order ([`crate::fields`]): for `kind = "synthetic"`,
    /// `images` (`dataset.dtype`, `dataset.sample_shape`) and `labels` (`i64`, one per sample);
    /// for `"external"`, `dataset.fields`; for `"tokens"`, `input_ids` and `targets`
    /// (`[dataset.tokens] dtype`, `[seq_len]`); for `"npy"`, `[dataset.npy] field` (its `dtype`
    /// and `shape`) and, with `labels`, `labels` (`labels_dtype`, `labels_shape`); for
    /// `"webdataset"`, `images` (unless `images = false`), `labels` and, with `npy`, its field;
    /// for `"imagefolder"`, `images` and `labels`.
    pub fn fields(&self) -> Vec<Field> {
        let d = &self.dataset;
        match d.kind {
            DatasetKind::Synthetic => vec![
                Field::new(IMAGES, d.dtype, d.sample_shape.clone()),
                Field::new(LABELS, Dtype::I64, Vec::new()),
            ],
            DatasetKind::External => d.fields.clone(),
            DatasetKind::Tokens => match &d.tokens {
                Some(t) => vec![
                    Field::new(INPUT_IDS, t.dtype, vec![t.seq_len]),
                    Field::new(TARGETS, t.dtype, vec![t.seq_len]),
                ],
                None => Vec::new(),
            },
            DatasetKind::Npy => match &d.npy {
                Some(n) => {
                    let mut f = vec![Field::new(n.field.clone(), n.dtype, n.shape.clone())];
                    if n.labels.is_some() {
                        f.push(Field::new(LABELS, n.labels_dtype, n.labels_shape.clone()));
                    }
                    f
                }
                None => Vec::new(),
            },
            DatasetKind::WebDataset | DatasetKind::ImageFolder => {
                // [dataset.image] is there exactly when images are decoded (validated).
                let mut f = Vec::with_capacity(3);
                if let Some(i) = &d.image {
                    let (dtype, shape) = i.images();
                    f.push(Field::new(IMAGES, dtype, shape));
                }
                f.push(Field::new(LABELS, Dtype::I64, Vec::new()));
                if let Some(n) = d.webdataset.as_ref().and_then(|w| w.npy.as_ref()) {
                    f.push(Field::new(n.field.clone(), n.dtype, n.shape.clone()));
                }
                f
            }
        }
    }

    /// A file kind's per-sample bytes of its first field and of all its fields (saturating),
    /// without building the field list (slot sizing and the daemon's per-part checks ask often).
    fn file_field_bytes(&self) -> Option<(u64, u64)> {
        let d = &self.dataset;
        let bytes = |dtype: Dtype, shape: &[u32]| {
            shape.iter().fold(dtype.size_of() as u64, |acc, &x| {
                acc.saturating_mul(u64::from(x))
            })
        };
        if let Some(t) = &d.tokens {
            let one = bytes(t.dtype, &[t.seq_len]);
            return Some((one, one.saturating_mul(2)));
        }
        if d.kind.decodes_images() {
            // [images], labels, [npy field], as `fields` lists them.
            let images = d.image.as_ref().map(|i| {
                let (dtype, shape) = i.images();
                bytes(dtype, &shape)
            });
            let labels = Dtype::I64.size_of() as u64;
            let npy = d
                .webdataset
                .as_ref()
                .and_then(|w| w.npy.as_ref())
                .map_or(0, |n| bytes(n.dtype, &n.shape));
            let all = images
                .unwrap_or(0)
                .saturating_add(labels)
                .saturating_add(npy);
            return Some((images.unwrap_or(labels), all));
        }
        let n = d.npy.as_ref()?;
        let data = bytes(n.dtype, &n.shape);
        let labels = if n.labels.is_some() {
            bytes(n.labels_dtype, &n.labels_shape)
        } else {
            0
        };
        Some((data, data.saturating_add(labels)))
    }

    /// Dimensions of a sample's first field (what a part's metadata records), without building
    /// the field list.
    fn first_field_ndims(&self) -> usize {
        let d = &self.dataset;
        match d.kind {
            DatasetKind::Synthetic => d.sample_shape.len(),
            DatasetKind::External => d.fields.first().map_or(0, |f| f.shape.len()),
            DatasetKind::Tokens => 1,
            DatasetKind::Npy => d.npy.as_ref().map_or(0, |n| n.shape.len()),
            // `images` (3 dimensions), or `labels` (none) with `images = false`.
            DatasetKind::WebDataset | DatasetKind::ImageFolder => {
                if d.image.is_some() {
                    3
                } else {
                    0
                }
            }
        }
    }

    /// Shape and dtype of a sample's first field (`images` for synthetic samples): what a
    /// part's metadata records ([`crate::BatchMeta`]).
    pub fn first_field(&self) -> (Vec<u32>, Dtype) {
        let d = &self.dataset;
        if d.kind == DatasetKind::Synthetic {
            return (d.sample_shape.clone(), d.dtype);
        }
        match self.fields().into_iter().next() {
            Some(f) => (f.shape, f.dtype),
            None => (d.sample_shape.clone(), d.dtype),
        }
    }

    /// Bytes of one sample over all its fields ([`Config::fields`]; saturating): the payload of
    /// a part of `n` samples, field-major, is `n × record_bytes`, and slots are sized with it.
    pub fn record_bytes(&self) -> u64 {
        // The sum of the fields' per-sample bytes, without building the list (this is on the
        // slot-sizing path); a test checks it against `fields()`.
        match self.dataset.kind {
            DatasetKind::Synthetic => self
                .sample_bytes()
                .saturating_add(Dtype::I64.size_of() as u64),
            DatasetKind::External => self
                .dataset
                .fields
                .iter()
                .fold(0u64, |acc, f| acc.saturating_add(f.sample_bytes())),
            DatasetKind::Tokens
            | DatasetKind::Npy
            | DatasetKind::WebDataset
            | DatasetKind::ImageFolder => self.file_field_bytes().map_or(0, |(_, all)| all),
        }
    }

    /// Where each field of a full batch lies in the batch's device buffer, and the buffer's size
    /// ([`BatchLayout`]; a tail batch: [`BatchLayout::placements`]).
    pub fn batch_layout(&self) -> BatchLayout {
        BatchLayout::new(&self.fields(), self.plan.batch_size)
    }

    /// Payload bytes of a full batch (`batch_size * record_bytes`, all fields).
    pub fn batch_payload_bytes_max(&self) -> u64 {
        u64::from(self.plan.batch_size).saturating_mul(self.record_bytes())
    }

    /// Shared-memory segment path, `/dev/shm/pinring.<name>`.
    pub fn segment_path(&self) -> String {
        format!("/dev/shm/pinring.{}", self.ring.name)
    }

    /// Plan parameters for [`Plan::new`].
    pub fn plan_params(&self) -> PlanParams {
        let p = &self.plan;
        let layout = self.part_layout();
        PlanParams {
            samples: self.dataset.samples,
            batch_size: p.batch_size,
            shuffle: p.shuffle,
            seed: p.seed,
            epochs: p.epochs,
            start_epoch: p.start_epoch,
            drop_last: p.drop_last,
            rank: p.rank,
            world_size: p.world_size,
            samples_per_part: layout.samples_per_part,
            cut: layout.cut,
        }
    }

    /// The shard order of `dataset.kind = "webdataset"` (`None` for the other kinds): the
    /// shards' sample counts (`dataset.webdataset.shard_samples`, empty until the shards are
    /// opened) and `shuffle_buffer`.
    pub fn shard_order(&self) -> Option<ShardOrder> {
        let w = self
            .dataset
            .webdataset
            .as_ref()
            .filter(|_| self.dataset.kind == DatasetKind::WebDataset)?;
        Some(ShardOrder::new(
            w.shard_samples.as_slice(),
            w.shuffle_buffer,
        ))
    }

    /// The plan of this config: for `dataset.kind = "webdataset"` the shard order
    /// ([`Plan::with_shards`]), which needs the shards' sample counts; for the other kinds the
    /// global order ([`Plan::new`]).
    pub fn plan(&self) -> Result<Plan, PlanError> {
        match self.shard_order() {
            Some(order) => Plan::with_shards(&self.plan_params(), order),
            None => Plan::new(&self.plan_params()),
        }
    }

    /// The synthetic dataset of this config.
    pub fn synthetic(&self) -> Synthetic {
        let d = &self.dataset;
        Synthetic::new(
            d.seed,
            usize::try_from(self.sample_bytes()).unwrap_or(usize::MAX),
            d.classes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "test.toml")
    }

    #[test]
    fn default_toml_equals_default() {
        let c = parse(DEFAULT_CONFIG_TOML).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.source, "test.toml");
        Config::default().validate().unwrap();
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn to_toml_roundtrips() {
        let mut c = Config::default();
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 20));
        c.ring.mode = SegmentMode::Group;
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        assert_eq!(
            parse(&Config::default().to_toml()).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn derived_sizes() {
        let c = Config::default();
        assert_eq!(c.sample_bytes(), 128 * 128 * 4);
        assert_eq!(
            c.record_bytes(),
            128 * 128 * 4 + 8,
            "images and an i64 label"
        );
        assert_eq!(c.batch_payload_bytes_max(), 32 * (128 * 128 * 4 + 8));
        assert_eq!(c.meta_reserve_bytes() % META_RESERVE_ALIGN, 0);
        assert!(c.meta_reserve_bytes() >= max_encoded_len(32, 2));
        assert_eq!(c.slot_bytes() % SLOT_ALIGN, 0);
        assert!(c.slot_bytes() >= c.batch_payload_bytes_max() + c.meta_reserve_bytes());
        assert_eq!(c.slot_bytes(), (2 << 20) + 4096);
        assert_eq!(c.ring_bytes(), 16 * c.slot_bytes());
        assert_eq!(c.segment_path(), "/dev/shm/pinring.default");
    }

    #[test]
    fn fields_record_and_batch_layout() {
        let c = Config::default();
        let fields = c.fields();
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [IMAGES, LABELS]);
        assert_eq!(fields[0], Field::new(IMAGES, Dtype::F32, vec![128, 128]));
        assert_eq!(fields[1], Field::new(LABELS, Dtype::I64, vec![]));
        for shape in [vec![3, 5], vec![7], vec![128, 128], vec![]] {
            for dtype in Dtype::ALL {
                let mut c = Config::default();
                c.dataset.sample_shape = shape.clone();
                c.dataset.dtype = dtype;
                let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
                assert_eq!(c.record_bytes(), sum, "{shape:?} {dtype}");
                assert_eq!(c.batch_layout().record_bytes, sum);
            }
        }
        // 32 x 128 x 128 f32 images (2 MiB), then 32 i64 labels.
        let l = c.batch_layout();
        assert_eq!(l.batch_size, 32);
        assert_eq!(l.fields[0].shape, vec![32, 128, 128]);
        assert_eq!((l.fields[0].offset, l.fields[0].bytes), (0, 2 << 20));
        assert_eq!(l.fields[1].shape, vec![32]);
        assert_eq!((l.fields[1].offset, l.fields[1].bytes), (2 << 20, 256));
        assert_eq!(l.total_bytes, (2 << 20) + 256);
    }

    #[test]
    fn unknown_keys_are_errors_with_file_and_key() {
        let e = parse("[ring]\nnmae = \"x\"\n").unwrap_err().to_string();
        assert!(
            e.contains("test.toml") && e.contains("nmae") && e.contains("line 2"),
            "{e}"
        );
        let e = parse("[rnig]\n").unwrap_err().to_string();
        assert!(e.contains("rnig"), "{e}");
        let e = parse("[plan]\nbatch_size = \"big\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_size"), "{e}");
    }

    #[test]
    fn parses_values() {
        let c = parse(
            "[ring]\nslot_bytes = \"16MiB\"\nmode = \"0660\"\nname = \"a_b-1\"\n\
             [dataset]\ndtype = \"bf16\"\nsample_shape = [3, 224, 224]\n",
        )
        .unwrap();
        assert_eq!(c.ring.slot_bytes, SlotBytes::Fixed(ByteSize(16 << 20)));
        assert_eq!(c.ring.mode.bits(), 0o660);
        assert_eq!(c.dataset.dtype, Dtype::Bf16);
        assert_eq!(c.sample_bytes(), 3 * 224 * 224 * 2);
        let c = parse("[ring]\nslot_bytes = 16777216\n").unwrap();
        assert_eq!(c.slot_bytes(), 16 << 20);
        let e = parse("[ring]\nmode = \"0777\"\n").unwrap_err().to_string();
        assert!(e.contains("0600") && e.contains("0660"), "{e}");
        let e = parse("[dataset]\ndtype = \"f8\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("f8"), "{e}");
        let e = parse("[dataset]\nkind = \"imagenet\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("synthetic"), "{e}");
    }

    fn invalid_key(c: &Config) -> &'static str {
        match c.validate() {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn validation_names_keys() {
        let base = Config::default();
        let mut c = base.clone();
        c.ring.name = "bad/name".into();
        assert_eq!(invalid_key(&c), "ring.name");
        c.ring.name = "x".repeat(65);
        assert_eq!(invalid_key(&c), "ring.name");
        c.ring.name = String::new();
        assert_eq!(invalid_key(&c), "ring.name");
        let mut c = base.clone();
        c.ring.slots = Some(1);
        assert_eq!(invalid_key(&c), "ring.slots");
        c.ring.slots = Some(4097);
        assert_eq!(invalid_key(&c), "ring.slots");
        let mut c = base.clone();
        c.dataset.samples = 0;
        assert_eq!(invalid_key(&c), "dataset.samples");
        let mut c = base.clone();
        c.dataset.sample_shape = vec![0, 3];
        assert_eq!(invalid_key(&c), "dataset.sample_shape");
        c.dataset.sample_shape = vec![1 << 20, 1 << 10];
        assert_eq!(invalid_key(&c), "dataset.sample_shape");
        let mut c = base.clone();
        c.dataset.classes = 0;
        assert_eq!(invalid_key(&c), "dataset.classes");
        let mut c = base.clone();
        c.plan.batch_size = 0;
        assert_eq!(invalid_key(&c), "plan.batch_size");
        let mut c = base.clone();
        c.plan.epochs = 0;
        assert_eq!(invalid_key(&c), "plan.epochs");
        let mut c = base.clone();
        c.plan.world_size = 0;
        assert_eq!(invalid_key(&c), "plan.world_size");
        let mut c = base.clone();
        c.plan.rank = 1;
        assert_eq!(invalid_key(&c), "plan.rank");
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains("<built-in defaults>") && msg.contains("world_size"),
            "{msg}"
        );
        let mut c = base.clone();
        c.plan.drop_last = true;
        c.plan.batch_size = 20_000;
        assert_eq!(invalid_key(&c), "plan.batch_size");
    }

    #[test]
    fn daemon_section_and_group() {
        let c = parse(
            "[ring]\nmode = \"0660\"\ngroup = \"video\"\n\
             [daemon]\nlease_ms = 500\nreap_interval_ms = 50\non_bad_batch = \"skip\"\n",
        )
        .unwrap();
        assert_eq!(c.ring.group.as_deref(), Some("video"));
        assert_eq!(c.daemon.lease_ms, 500);
        assert_eq!(c.daemon.reap_interval_ms, 50);
        assert_eq!(c.daemon.on_bad_batch, BadBatchPolicy::Skip);
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        // Not part of the fingerprint: they do not change batch contents.
        assert_eq!(c.fingerprint(), Config::default().fingerprint());
        let e = parse("[ring]\ngroup = \"video\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ring.group") && e.contains("0660"), "{e}");
        let e = parse("[ring]\nmode = \"0660\"\ngroup = \"a b\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ring.group"), "{e}");
        let e = parse("[daemon]\nlease_ms = 1\n").unwrap_err().to_string();
        assert!(e.contains("daemon.lease_ms"), "{e}");
        let e = parse("[daemon]\nreap_interval_ms = 5000\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("daemon.reap_interval_ms") && e.contains("1000"),
            "{e}"
        );
        let e = parse("[daemon]\non_bad_batch = \"ignore\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("on_bad_batch"), "{e}");
    }

    #[test]
    fn explicit_slot_smaller_than_a_batch_cuts_parts_and_smaller_than_a_sample_cuts_bytes() {
        let mut c = Config::default();
        // Smaller than a batch: parts.
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(1 << 20));
        c.validate().unwrap();
        assert_eq!(c.parts_per_batch(), 3);
        assert_eq!(c.part_layout().cut, None);
        // Smaller than one sample (64 KiB of images) with its metadata: byte parts of the most
        // whole pages of images that fit with the label and the metadata, 2 per sample.
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 10));
        c.validate().unwrap();
        let l = c.part_layout();
        let cut = l.cut.unwrap();
        assert_eq!((cut.field_bytes, cut.chunk_bytes), (64 << 10, 60 << 10));
        assert_eq!((l.samples_per_part, l.parts_per_batch), (1, 64));
        assert!(c.cut_need(cut.chunk_bytes, 8) <= 64 << 10);
        assert!(c.cut_need(cut.chunk_bytes + SLOT_ALIGN, 8) > 64 << 10);
        assert_eq!(c.part_payload_bytes_max(), (60 << 10) + 8);
        let smallest = round_up(c.part_need(1), SLOT_ALIGN);
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(smallest));
        c.validate().unwrap();
        assert_eq!(c.slot_bytes(), smallest);
        assert_eq!(c.parts_per_batch(), 32);
        assert_eq!(c.part_layout().cut, None);
        // A slot too small for a byte part beside the other fields and the metadata (an npy
        // sample whose labels field is 64 KiB beside 100 KiB of data): refused, with the fix.
        let dir = tempfile::tempdir().unwrap();
        let mut c = npy_config(&dir, &[25600], &[16384]);
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(64 << 10));
        let e = c.validate().unwrap_err().to_string();
        let least = round_up(c.cut_need(8, 64 << 10), SLOT_ALIGN);
        assert!(
            e.contains("ring.slot_bytes")
                && e.contains("too small")
                && e.contains("byte parts")
                && e.contains(&format!("at least {least}")),
            "{e}"
        );
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(least));
        c.validate().unwrap();
        assert!(c.part_layout().cut.unwrap().chunk_bytes >= 8);
    }

    /// An npy config (not opened: 10 samples declared) whose data field is `shape` of f32 and
    /// whose labels are `labels_shape` of f32.
    fn npy_config(dir: &tempfile::TempDir, shape: &[u32], labels_shape: &[u32]) -> Config {
        let text = format!(
            "[dataset]\nkind = \"npy\"\nsamples = 10\n[dataset.npy]\npath = \"{}\"\n\
             field = \"data\"\ndtype = \"f32\"\nshape = {shape:?}\nlabels = \"{}\"\n\
             labels_dtype = \"f32\"\nlabels_shape = {labels_shape:?}\n[plan]\nbatch_size = 2\n",
            dir.path().join("x.npy").display(),
            dir.path().join("y.npy").display(),
        );
        Config::from_toml_str(&text, "t").unwrap()
    }

    #[test]
    fn the_parts_are_described_in_words() {
        assert_eq!(
            sized(32, MIB as u32).parts_described(),
            "8 part(s) of up to 4 samples per batch"
        );
        assert_eq!(
            sized(2, 24 * MIB as u32).parts_described(),
            "12 byte parts per batch (6 per sample, 4194304 bytes of its largest field each)"
        );
    }

    #[test]
    fn a_producer_of_whole_samples_is_refused_with_the_sizes_and_the_fix() {
        let c = sized(1, 24 * MIB as u32);
        let e = c
            .whole_samples_only("pinring.Producer")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pinring.Producer writes whole samples")
                && e.contains(&format!("one sample of {} bytes", 24 * MIB + 8))
                && e.contains(&format!("{} bytes of its largest field", 4 * MIB))
                && e.contains("6 byte parts")
                && e.contains("smaller samples")
                && e.contains(&format!(
                    "at least {}",
                    round_up(c.part_need(1), SLOT_ALIGN)
                )),
            "{e}"
        );
        sized(32, MIB as u32)
            .whole_samples_only("pinring.Producer")
            .unwrap();
    }

    #[test]
    fn a_kind_that_cannot_cut_a_sample_keeps_whole_samples_and_refuses_a_smaller_slot() {
        // kind = "external" (Python producers write whole samples): a 24 MiB sample with
        // "auto" is one sample per part in a slot of its own size, as before byte parts.
        let text =
            "[dataset]\nkind = \"external\"\nfields = [{ name = \"images\", dtype = \"u8\", \
                    shape = [25165824] }, { name = \"labels\", dtype = \"i64\" }]\n\
                    [plan]\nbatch_size = 2\n";
        let c = Config::from_toml_str(text, "t").unwrap();
        let l = c.part_layout();
        assert_eq!((l.samples_per_part, l.parts_per_batch, l.cut), (1, 2, None));
        assert!(l.slot_bytes > 24 * MIB);
        // An explicit slot smaller than one sample: refused, naming the sample's size, what the
        // slot must hold, and the fixes.
        let text = format!("{text}[ring]\nslot_bytes = \"4MiB\"\n");
        let e = Config::from_toml_str(&text, "t").unwrap_err().to_string();
        let one = c.part_need(1);
        assert!(
            e.contains("ring.slot_bytes")
                && e.contains("too small")
                && e.contains(&format!("one sample of {} bytes", 24 * MIB + 8))
                && e.contains(&one.to_string())
                && e.contains("kind = \"external\" cannot make part of a sample")
                && e.contains(&format!("at least {}", round_up(one, SLOT_ALIGN)))
                && e.contains("smaller samples"),
            "{e}"
        );
        // A sample no slot holds: only smaller samples help.
        let text =
            "[dataset]\nkind = \"external\"\nfields = [{ name = \"images\", dtype = \"u8\", \
                    shape = [1073741824] }]\n";
        let e = Config::from_toml_str(text, "t").unwrap_err().to_string();
        assert!(
            e.contains("dataset.fields = 1073741824 bytes a sample")
                && e.contains("more than the largest slot")
                && e.contains("cannot make part of a sample")
                && e.contains("use smaller samples"),
            "{e}"
        );
    }

    #[test]
    fn an_unaligned_slot_size_names_the_aligned_sizes_around_it() {
        let e = parse("[ring]\nslot_bytes = 3000000\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ring.slot_bytes = 3000000")
                && e.contains("not a multiple of 4096")
                && e.contains("use 2998272 or 3002368"),
            "{e}"
        );
        // Rounding down would be too small for one sample: only the size above is offered.
        let one = Config::default().part_need(1);
        let e = parse(&format!("[ring]\nslot_bytes = {}\n", one + 1))
            .unwrap_err()
            .to_string();
        let up = round_up(one + 1, SLOT_ALIGN);
        assert!(e.contains(&format!("use {up}, or")), "{e}");
        parse(&format!("[ring]\nslot_bytes = {up}\n")).unwrap();
    }

    #[test]
    fn a_slot_over_the_largest_is_refused_with_the_limit() {
        let e = parse("[ring]\nslot_bytes = \"2GiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ring.slot_bytes = 2147483648")
                && e.contains("more than the largest slot")
                && e.contains(&MAX_SLOT_BYTES.to_string()),
            "{e}"
        );
        parse("[ring]\nslot_bytes = \"1GiB\"\n").unwrap();
    }

    #[test]
    fn a_batch_larger_than_the_largest_slot_is_cut_into_parts() {
        // 100000 samples of 64 KiB: a 6.5 GB batch, in parts no larger than the largest slot.
        let c = parse("[plan]\nbatch_size = 100000\n").unwrap();
        assert!(c.parts_per_batch() > 1);
        assert!(c.slot_bytes() <= MAX_SLOT_BYTES);
        // Also with an explicit slot size.
        let c = parse("[ring]\nslot_bytes = \"1GiB\"\n[plan]\nbatch_size = 100000\n").unwrap();
        assert_eq!(c.slot_bytes(), MAX_SLOT_BYTES);
        assert!(c.parts_per_batch() > 1);
        // One sample that no slot holds (1 GiB): cut into 256 byte parts of 4 MiB, in slots of
        // 4 MiB + 4 KiB.
        let c = parse(
            "[dataset]\nsample_shape = [1073741824]\ndtype = \"u8\"\nsamples = 4\n\
             [plan]\nbatch_size = 1\n",
        )
        .unwrap();
        let l = c.part_layout();
        let cut = l.cut.unwrap();
        assert_eq!((cut.field_bytes, cut.chunk_bytes), (1 << 30, 4 * MIB));
        assert_eq!((l.samples_per_part, l.parts_per_batch), (1, 256));
        assert_eq!(l.slot_bytes, 4 * MIB + 4096);
        assert_eq!(c.plan().unwrap().total_seqs(), 256 * 4 * 2);
    }

    #[test]
    fn the_slot_limits_are_the_segment_layouts() {
        assert_eq!(SLOT_ALIGN, pinring_ring::layout::SLOT_ALIGN as u64);
        assert_eq!(MAX_SLOT_BYTES, pinring_ring::layout::MAX_SLOT_BYTES);
        assert_eq!(MAX_SLOTS, pinring_ring::layout::MAX_SLOTS);
        let mut c = Config::default();
        c.ring.slots = Some(MAX_SLOTS);
        c.validate().unwrap();
        c.ring.slots = Some(MAX_SLOTS + 1);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("ring.slots") && e.contains(&MAX_SLOTS.to_string()),
            "{e}"
        );
    }

    fn layout(c: &Config) -> (u32, u32, u64) {
        let l = c.part_layout();
        (l.samples_per_part, l.parts_per_batch, l.slot_bytes)
    }

    #[test]
    fn a_batch_that_fits_a_slot_is_one_part() {
        let c = Config::default();
        assert_eq!(layout(&c), (32, 1, (2 << 20) + 4096));
        assert_eq!(c.plan_params().samples_per_part, 32);
        assert_eq!(c.meta_reserve_bytes(), round_up(max_encoded_len(32, 2), 64));
        let mut c = Config::default();
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(16 << 20));
        assert_eq!(layout(&c), (32, 1, 16 << 20));
    }

    #[test]
    fn a_small_explicit_slot_cuts_the_batch_into_even_parts() {
        // 32 samples of 64 KiB (+ 8 bytes of label); a 1 MiB slot holds 15 with their metadata:
        // 3 parts of 11.
        let mut c = Config::default();
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(1 << 20));
        assert_eq!(c.max_samples_in(1 << 20), 15);
        assert_eq!(layout(&c), (11, 3, 1 << 20));
        assert_eq!(c.part_payload_bytes_max(), 11 * (65536 + 8));
        assert_eq!(c.meta_reserve_bytes(), round_up(max_encoded_len(11, 2), 64));
        assert!(c.part_need(11) <= 1 << 20);
        // Exactly one sample per slot.
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(65536 + 4096));
        assert_eq!(layout(&c), (1, 32, 65536 + 4096));
    }

    #[test]
    fn auto_cuts_a_batch_over_4_mib_into_parts_of_at_most_4_mib_of_images() {
        // 100000 samples of 64 KiB images and an 8-byte label: 64 samples at most per part (their
        // images are 4 MiB; the labels ride along).
        let mut c = Config::default();
        c.plan.batch_size = 100_000;
        let (spp, parts, slot) = layout(&c);
        assert_eq!(parts, 100_000u32.div_ceil(64));
        assert_eq!(spp, 100_000u32.div_ceil(parts));
        assert!(u64::from(spp) * c.sample_bytes() <= AUTO_PART_PAYLOAD_BYTES);
        assert!(slot % SLOT_ALIGN == 0);
        assert_eq!(slot, round_up(c.part_need(spp), SLOT_ALIGN));
        assert!(u64::from(spp) * u64::from(parts) >= 100_000);
    }

    /// A config of `batch` samples of `sample` bytes (u8).
    fn sized(batch: u32, sample: u32) -> Config {
        let mut c = Config::default();
        c.dataset.sample_shape = vec![sample];
        c.dataset.dtype = Dtype::U8;
        c.plan.batch_size = batch;
        c.validate().unwrap();
        c
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn auto_puts_a_small_batch_whole_in_one_slot() {
        // The default: 32 x 64 KiB = 2 MiB; a 300 MiB cache aims at a 128 MiB ring.
        let c = Config::default();
        let a = c.auto_ring(Some(300 * MIB));
        assert_eq!(a.slot_bytes, 2 * MIB + 4096);
        assert_eq!(c.parts_per_batch(), 1);
        assert_eq!(a.target_bytes, 128 * MIB);
        assert_eq!(a.slots, 64, "128 MiB / (2 MiB + 4 KiB), rounded");
        // 4 MiB of images (and 32 bytes of labels) is still one part.
        let c = sized(4, MIB as u32);
        assert_eq!(c.batch_payload_bytes_max(), 4 * MIB + 32);
        assert_eq!(layout(&c), (4, 1, 4 * MIB + 4096));
        // One byte more a sample is two parts.
        let c2 = sized(4, MIB as u32 + 1);
        assert_eq!(layout(&c2), (2, 2, 2 * MIB + 4096));
        // A small cache: target cache / 2, and never fewer than 16 slots.
        let a = c.auto_ring(Some(32 * MIB));
        assert_eq!((a.target_bytes, a.slots), (16 * MIB, AUTO_MIN_SLOTS));
    }

    #[test]
    fn auto_cuts_the_seed_workload_into_8_parts_of_4_samples() {
        // 32 MiB batches of 32 x 1 MiB samples on a host with a 300 MiB L3: four samples' images
        // are 4 MiB, and their labels ride along in the same slot.
        let mut c = sized(32, MIB as u32);
        let a = c.auto_ring(Some(300 * MIB));
        assert_eq!(layout(&c), (4, 8, 4 * MIB + 4096));
        assert_eq!(a.slot_bytes, 4 * MIB + 4096);
        assert_eq!(a.slots, 32, "128 MiB / (4 MiB + 4 KiB), rounded");
        assert_eq!(a.target_bytes, 128 * MIB);
        let fp = c.fingerprint();
        let r = c.resolve_auto(Some(300 * MIB));
        assert_eq!(r, a);
        assert_eq!(
            c.ring.slot_bytes,
            SlotBytes::Fixed(ByteSize(4 * MIB + 4096))
        );
        assert_eq!(c.ring.slots, Some(32));
        assert_eq!(layout(&c), (4, 8, 4 * MIB + 4096));
        assert_eq!(c.fingerprint(), fp, "resolving keeps the fingerprint");
        c.validate().unwrap();
        assert!(c.ring_bytes() <= 150 * MIB);
    }

    #[test]
    fn auto_with_an_unknown_cache_aims_at_32_mib() {
        let c = sized(32, MIB as u32 - 8);
        let a = c.auto_ring(None);
        assert_eq!(a.target_bytes, AUTO_RING_FALLBACK_BYTES);
        assert_eq!(a.slot_bytes, 4 * MIB + 4096);
        assert_eq!(a.slots, AUTO_MIN_SLOTS, "32 MiB / 4 MiB is 8, at least 16");
        let c = sized(4, 64 << 10);
        let a = c.auto_ring(None);
        assert_eq!(a.slot_bytes, 256 * 1024 + 4096);
        assert_eq!(a.slots, 126, "32 MiB / 260 KiB, rounded");
        // A huge cache stops at 128 MiB; tiny slots stop at the most slots.
        let c = sized(1, 1);
        assert_eq!(c.auto_ring(Some(1 << 40)).slots, MAX_SLOTS);
    }

    #[test]
    fn auto_keeps_explicit_values() {
        // An explicit slot count is kept.
        let mut c = sized(32, MIB as u32 - 8);
        c.ring.slots = Some(6);
        let a = c.resolve_auto(Some(300 * MIB));
        assert_eq!((a.slots, a.slot_bytes), (6, 4 * MIB + 4096));
        // An explicit slot size keeps its own layout; its unset count is auto's for its size.
        let mut c = sized(32, MIB as u32);
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(16 * MIB));
        let before = (layout(&c), c.fingerprint());
        let a = c.resolve_auto(Some(300 * MIB));
        assert_eq!((a.slots, a.slot_bytes), (DEFAULT_SLOTS, 16 * MIB));
        assert_eq!((layout(&c), c.fingerprint()), before);
        assert_eq!(layout(&c), (11, 3, 16 * MIB));
        // A small explicit slot gets the ring "auto" would give for the cache, not 16 slots.
        for (cache, slots) in [(300 * MIB, 512), (16 * MIB, 32), (MIB, AUTO_MIN_SLOTS)] {
            let mut c = sized(4, 60_000);
            c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(256 << 10));
            let a = c.resolve_auto(Some(cache));
            assert_eq!(
                (a.slots, a.slot_bytes, a.slot_bytes_auto),
                (slots, 256 << 10, false)
            );
            assert_eq!(c.ring.slots, Some(slots));
        }
        // A sample over 4 MiB: byte parts of 4 MiB, 2 per sample, the second 1 MiB.
        let c = sized(4, 5 * MIB as u32);
        assert_eq!(layout(&c), (1, 8, 4 * MIB + 4096));
        let cut = c.part_layout().cut.unwrap();
        assert_eq!((cut.chunk_bytes, cut.range(1).len), (4 * MIB, MIB));
        // Just over 4 MiB, a whole sample still fits the slot of a 4 MiB byte part: whole.
        let c = sized(4, 4 * MIB as u32 + 64);
        assert_eq!(layout(&c), (1, 4, 4 * MIB + 4096));
        assert_eq!(c.part_layout().cut, None);
    }

    #[test]
    fn the_default_ring_fits_half_a_small_cache_in_smaller_parts() {
        let default = Config::default();
        // 64 KiB samples, 32 a batch: the most whole samples that fit the cap, evened out.
        for (cache, samples, parts) in [
            (300 * MIB, 32, 1),
            (32 * MIB, 11, 3),
            (16 * MIB, 7, 5),
            // 256 KiB parts at the least: a 4 MiB ring is over half a 4 MiB cache.
            (4 * MIB, 3, 11),
        ] {
            let mut c = default.clone();
            let a = c.resolve_auto(Some(cache));
            assert_eq!(
                (layout(&c).0, layout(&c).1),
                (samples, parts),
                "cache {cache}"
            );
            assert!(a.slots >= AUTO_MIN_SLOTS);
            if cache >= 16 * MIB {
                assert!(c.ring_bytes() <= cache / 2, "cache {cache}");
            }
            c.validate().unwrap();
        }
        // An unknown cache keeps the usual slot (the fallback's 32 MiB holds 16 of them).
        let a = default.auto_ring(None);
        assert_eq!((a.slot_bytes, a.slots), (2 * MIB + 4096, 16));
    }

    #[test]
    fn a_loader_adopting_the_resolved_slot_size_gets_the_same_layout_and_fingerprint() {
        // The daemon resolves; a loader with "auto" adopts the ring's slot size and count.
        for (batch, sample) in [
            (32, 1 << 20),
            (32, 65536),
            (1000, 100_000),
            (100_000, 100),
            (7, 3 << 20),
            (100, (1 << 20) - 100),
            (300, 12_345),
            (4096, 4097),
            (4, 5 << 20),
            (1, 24 << 20),
            (3, (4 << 20) + 64),
            (2, (4 << 20) + 4000),
            (1, 1 << 30),
        ] {
            // A large cache keeps the usual parts; small ones may cut smaller parts.
            for cache in [300 * MIB, 16 * MIB, 4 * MIB] {
                let mut daemon = sized(batch, sample);
                let loader = daemon.clone();
                daemon.resolve_auto(Some(cache));
                let mut adopted = loader.clone();
                assert!(adopted.adopt_slot_bytes(daemon.slot_bytes(), daemon.slots()));
                assert_eq!(layout(&adopted), layout(&daemon), "{batch} x {sample}");
                if cache == 300 * MIB {
                    assert_eq!(layout(&adopted), layout(&loader), "{batch} x {sample}");
                }
                assert_eq!(adopted.fingerprint(), daemon.fingerprint());
                assert_eq!(adopted.slots(), daemon.slots());
                adopted.validate().unwrap();
            }
        }
        // An explicit slot size is not replaced: a different one is a fingerprint mismatch.
        let mut c = sized(32, MIB as u32);
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(8 * MIB));
        assert!(!c.adopt_slot_bytes(4 * MIB + 4096, 32));
        assert_ne!(c.fingerprint(), sized(32, MIB as u32).fingerprint());
    }

    #[test]
    fn the_fingerprint_covers_the_part_layout() {
        let a = Config::default();
        let mut b = Config::default();
        b.ring.slot_bytes = SlotBytes::Fixed(ByteSize(1 << 20));
        assert_ne!(a.fingerprint(), b.fingerprint());
        // Samples per part, the byte part size (none), then the (empty) list of declared fields.
        let bytes = b.fingerprint_bytes();
        let n = bytes.len();
        assert_eq!(bytes[n - 16..n - 12], 11u32.to_le_bytes());
        assert_eq!(bytes[n - 12..n - 4], 0u64.to_le_bytes());
        assert_eq!(bytes[n - 4..], 0u32.to_le_bytes());
        // Byte parts of another size are another layout.
        let mut c = sized(1, 24 * MIB as u32);
        let auto = c.fingerprint();
        let bytes = c.fingerprint_bytes();
        let n = bytes.len();
        assert_eq!(bytes[n - 12..n - 4], (4 * MIB).to_le_bytes());
        c.ring.slot_bytes = SlotBytes::Fixed(ByteSize(2 * MIB));
        assert_ne!(c.fingerprint(), auto);
    }

    #[test]
    fn load_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pinring.toml");
        std::fs::write(&p, "[plan]\nepochs = 5\n").unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.plan.epochs, 5);
        assert_eq!(c.source, p.display().to_string());
        std::fs::write(&p, "[plan]\nrank = 3\n").unwrap();
        let e = Config::load(&p).unwrap_err().to_string();
        assert!(e.contains("pinring.toml") && e.contains("plan.rank"), "{e}");
        let missing = dir.path().join("nope.toml");
        let e = Config::load(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.toml"), "{e}");
    }

    const EXTERNAL: &str = r#"
[dataset]
kind = "external"
samples = 100
fields = [
  { name = "x", dtype = "u8", shape = [3, 4] },
  { name = "y", dtype = "bool" },
  { name = "z", dtype = "f64", shape = [2] },
]
"#;

    #[test]
    fn external_samples_have_the_fields_they_declare() {
        let c = Config::from_toml_str(EXTERNAL, "t").unwrap();
        assert_eq!(c.dataset.kind, DatasetKind::External);
        let names: Vec<String> = c.fields().into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["x", "y", "z"]);
        assert_eq!(c.fields()[1], Field::new("y", Dtype::Bool, vec![]));
        assert_eq!(c.record_bytes(), 12 + 1 + 16);
        assert_eq!(c.sample_bytes(), 12);
        assert_eq!(c.first_field(), (vec![3, 4], Dtype::U8));
        // The fields survive the round trip through TOML (the ring stores its config so).
        let again = Config::from_toml_str(&c.to_toml(), "t2").unwrap();
        assert_eq!(again.fields(), c.fields());
        assert_eq!(again.fingerprint(), c.fingerprint());
        // Another field shape, dtype, name or order is another dataset.
        let mut other = c.clone();
        other.dataset.fields[2].shape = vec![3];
        assert_ne!(other.fingerprint(), c.fingerprint());
        let mut other = c.clone();
        other.dataset.fields[0].name = "w".into();
        assert_ne!(other.fingerprint(), c.fingerprint());
        let mut other = c.clone();
        other.dataset.fields.swap(0, 1);
        assert_ne!(other.fingerprint(), c.fingerprint());
    }

    #[test]
    fn external_fields_are_checked() {
        let with = |edit: &dyn Fn(&mut Config)| {
            let mut c = Config::from_toml_str(EXTERNAL, "t").unwrap();
            edit(&mut c);
            c.validate().unwrap_err().to_string()
        };
        let e = with(&|c| c.dataset.fields.clear());
        assert!(
            e.contains("dataset.fields") && e.contains("needs 1 to"),
            "{e}"
        );
        let e = with(&|c| c.dataset.fields[1].name = "x".into());
        assert!(
            e.contains("[1] name \"x\"") && e.contains("must differ"),
            "{e}"
        );
        let e = with(&|c| c.dataset.fields[0].name = "a b".into());
        assert!(e.contains("1 to 64 characters"), "{e}");
        let e = with(&|c| c.dataset.fields[2].shape = vec![2, 0]);
        assert!(
            e.contains("\"z\" shape [2, 0]") && e.contains(">= 1"),
            "{e}"
        );
        let e = with(&|c| c.dataset.fields[0].shape = vec![1 << 15, 1 << 15, 2]);
        assert!(e.contains("at most 1 GiB"), "{e}");
        // Synthetic samples have their own fields.
        let e = with(&|c| c.dataset.kind = DatasetKind::Synthetic);
        assert!(e.contains("only kind = \"external\""), "{e}");
        // An unknown key inside a field is refused by name.
        let bad = EXTERNAL.replace("dtype = \"bool\"", "dtype = \"bool\", shap = [2]");
        let e = Config::from_toml_str(&bad, "t").unwrap_err().to_string();
        assert!(e.contains("shap"), "{e}");
    }
}

#[cfg(test)]
mod file_kinds {
    use super::*;
    use crate::dataset::{OnBadSample, WebDatasetNpy, WDS_NPY_DEFAULT_FIELD};

    const TOKENS: &str = r#"
[dataset]
kind = "tokens"
on_bad_sample = "skip"
[dataset.tokens]
files = ["a.bin", "/data/b.bin"]
token_dtype = "u32"
seq_len = 8
shift = true
dtype = "i32"
"#;

    const NPY: &str = r#"
[dataset]
kind = "npy"
[dataset.npy]
path = "x.npy"
dtype = "u8"
shape = [3, 4]
labels = "y.npy"
labels_dtype = "i16"
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "t.toml")
    }

    #[test]
    fn file_kinds_have_fields_from_the_config_alone() {
        let c = parse(TOKENS).unwrap();
        assert_eq!(c.dataset.kind, DatasetKind::Tokens);
        assert_eq!(c.dataset.on_bad_sample, OnBadSample::Skip);
        assert!(!c.samples_resolved(), "the length comes from the files");
        assert_eq!(
            c.fields(),
            [
                Field::new(INPUT_IDS, Dtype::I32, vec![8]),
                Field::new(TARGETS, Dtype::I32, vec![8]),
            ]
        );
        assert_eq!(c.record_bytes(), 64);
        assert_eq!(c.first_field(), (vec![8], Dtype::I32));
        assert_eq!(c.dataset.tokens.as_ref().unwrap().stride(), 8);
        let c = parse(NPY).unwrap();
        assert_eq!(
            c.fields(),
            [
                Field::new("data", Dtype::U8, vec![3, 4]),
                Field::new(LABELS, Dtype::I16, vec![]),
            ]
        );
        assert_eq!(c.record_bytes(), 14);
        assert_eq!(c.sample_bytes(), 12);
        assert!(c.plan().is_err(), "no plan before the length is known");
        for text in [TOKENS, NPY, &NPY.replace("labels = \"y.npy\"\n", "")] {
            let c = parse(text).unwrap();
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum);
            assert_eq!(c.sample_bytes(), c.fields()[0].sample_bytes());
        }
    }

    #[test]
    fn a_sample_too_large_is_reported_at_the_key_that_sets_its_size() {
        let cases = [
            (
                TOKENS.replace("seq_len = 8", "seq_len = 4000000000"),
                "dataset.tokens.seq_len = 4000000000 x i32",
            ),
            (
                NPY.replace("shape = [3, 4]", "shape = [100000, 100000]"),
                "dataset.npy.shape = [100000, 100000] x u8",
            ),
            (
                "[dataset]\nkind = \"external\"\nsamples = 4\n\
                 fields = [{ name = \"x\", dtype = \"f64\", shape = [65536, 65536] }]\n"
                    .to_string(),
                "dataset.fields = ",
            ),
            (
                "[dataset]\nsample_shape = [65536, 65536]\n".to_string(),
                "dataset.sample_shape = [65536, 65536] x f32",
            ),
        ];
        for (text, said) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.contains(said) && e.contains("at most 1 GiB"),
                "{said}: {e}"
            );
        }
    }

    #[test]
    fn the_source_length_becomes_samples_and_is_checked() {
        let mut c = parse(TOKENS).unwrap();
        let unresolved = c.fingerprint();
        c.set_source_len(1000).unwrap();
        assert_eq!(c.dataset.samples, 1000);
        assert_ne!(c.fingerprint(), unresolved);
        assert_eq!(c.plan().unwrap().batches_per_epoch(), 1000u64.div_ceil(32));
        // Stored in the ring and read back: the same config, the same fingerprint.
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again, c);
        assert_eq!(again.fingerprint(), c.fingerprint());
        let e = again.clone().set_source_len(999).unwrap_err().to_string();
        assert!(
            e.contains("dataset.samples = 1000") && e.contains("hold 999 samples"),
            "{e}"
        );
        let mut given =
            parse(&NPY.replace("kind = \"npy\"", "kind = \"npy\"\nsamples = 5")).unwrap();
        assert!(given.set_source_len(6).is_err());
        given.set_source_len(5).unwrap();
        let npy = parse(NPY).unwrap();
        assert_eq!(parse(&npy.to_toml()).unwrap(), npy);
    }

    #[test]
    fn keys_of_another_kind_are_refused_by_name_and_kind() {
        let cases: &[(&str, &[&str])] = &[
            (
                &TOKENS.replace("on_bad_sample", "sample_shape = [2]\non_bad_sample"),
                &[
                    "dataset.sample_shape",
                    "kind = \"synthetic\"",
                    "kind = \"tokens\"",
                ],
            ),
            (
                &NPY.replace("kind = \"npy\"", "kind = \"npy\"\nseed = 3"),
                &["dataset.seed", "kind = \"synthetic\"", "kind = \"npy\""],
            ),
            (
                &NPY.replace("kind = \"npy\"", "kind = \"npy\"\nfields = []"),
                &["dataset.fields", "kind = \"external\""],
            ),
            (
                &TOKENS.replace("shift = true", "shift = true\npath = \"x.npy\""),
                &[
                    "dataset.tokens.path",
                    "kind = \"npy\"",
                    "not of kind = \"tokens\"",
                ],
            ),
            (
                &NPY.replace("shape = [3, 4]", "shape = [3, 4]\nseq_len = 4"),
                &["dataset.npy.seq_len", "kind = \"tokens\""],
            ),
            (
                &NPY.replace("kind = \"npy\"", "kind = \"tokens\""),
                &["[dataset.npy]", "kind = \"tokens\""],
            ),
            (
                "[dataset]\nkind = \"synthetic\"\non_bad_sample = \"skip\"\n",
                &["dataset.on_bad_sample", "kind = \"synthetic\""],
            ),
            (
                "[dataset]\nkind = \"tokens\"\n",
                &["[dataset.tokens]", "files"],
            ),
            (
                &NPY.replace("shape = [3, 4]", "shape = [3, 4]\nshap = 1"),
                &["unknown key dataset.npy.shap"],
            ),
            (
                &NPY.replace("dtype = \"u8\"", "dtype = \"bf16\""),
                &["dataset.npy.dtype", "numpy"],
            ),
            (
                &TOKENS.replace("token_dtype = \"u32\"", "token_dtype = \"i64\""),
                &["dataset.tokens.token_dtype", "u16"],
            ),
            (
                &TOKENS.replace("seq_len = 8", "seq_len = 0"),
                &["dataset.tokens.seq_len"],
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err().to_string();
            for w in *want {
                assert!(e.contains(w), "{w:?} not in: {e}");
            }
        }
    }

    #[test]
    fn the_fingerprint_covers_what_decides_the_bytes() {
        let mut base = parse(TOKENS).unwrap();
        base.set_source_len(100).unwrap();
        type Edit = Box<dyn Fn(&mut Config)>;
        let tokens = |f: fn(&mut TokensDataset)| -> Edit {
            Box::new(move |c: &mut Config| f(c.dataset.tokens.as_mut().unwrap()))
        };
        let edits: Vec<Edit> = vec![
            tokens(|t| t.files.reverse()),
            tokens(|t| t.files[0] = "./a.bin".into()),
            tokens(|t| t.token_dtype = Dtype::U16),
            tokens(|t| t.seq_len = 9),
            tokens(|t| t.stride = Some(4)),
            tokens(|t| t.shift = false),
            tokens(|t| t.dtype = Dtype::I64),
            Box::new(|c| c.plan.seed = 7),
            Box::new(|c| c.dataset.samples = 101),
            Box::new(|c| c.dataset.on_bad_sample = OnBadSample::Fail),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "edit {k}");
        }
        // The stride in effect: an explicit stride equal to seq_len is the same dataset.
        let mut same = base.clone();
        same.dataset.tokens.as_mut().unwrap().stride = Some(8);
        assert_eq!(same.fingerprint(), base.fingerprint());
        let mut base = parse(NPY).unwrap();
        base.set_source_len(10).unwrap();
        let npy = |f: fn(&mut NpyDataset)| -> Edit {
            Box::new(move |c: &mut Config| f(c.dataset.npy.as_mut().unwrap()))
        };
        let edits: Vec<Edit> = vec![
            npy(|n| n.path = "x2.npy".into()),
            npy(|n| n.field = "x".into()),
            npy(|n| n.dtype = Dtype::I8),
            npy(|n| n.shape = vec![4, 3]),
            npy(|n| n.labels = None),
            npy(|n| n.labels = Some("z.npy".into())),
            npy(|n| n.labels_dtype = Dtype::I64),
            npy(|n| n.labels_shape = vec![1]),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "npy edit {k}");
        }
    }

    const WDS: &str = r#"
[dataset]
kind = "webdataset"
[dataset.webdataset]
shards = ["a.tar", "b.tar"]
"#;

    const FOLDER: &str = r#"
[dataset]
kind = "imagefolder"
[dataset.imagefolder]
root = "train"
[dataset.image]
transform = "eval"
crop = 32
resize = 40
output = "f32"
mean = [0.5, 0.5, 0.5]
"#;

    #[test]
    fn image_kinds_have_images_and_labels_from_the_image_table() {
        let w = parse(WDS).unwrap();
        assert_eq!(w.dataset.kind, DatasetKind::WebDataset);
        assert_eq!(w.dataset.webdataset.as_ref().unwrap().shuffle_buffer, 1000);
        assert_eq!(
            w.fields(),
            vec![
                Field::new(IMAGES, Dtype::U8, vec![224, 224, 3]),
                Field::new(LABELS, Dtype::I64, vec![]),
            ]
        );
        let f = parse(FOLDER).unwrap();
        assert_eq!(
            f.fields(),
            vec![
                Field::new(IMAGES, Dtype::F32, vec![3, 32, 32]),
                Field::new(LABELS, Dtype::I64, vec![]),
            ]
        );
        for c in [&w, &f] {
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum);
            assert_eq!(c.sample_bytes(), c.fields()[0].sample_bytes());
            assert_eq!(parse(&c.to_toml()).unwrap(), *c);
        }
        assert_eq!(
            f.dataset.imagefolder.as_ref().unwrap().extensions,
            ["jpg", "jpeg", "png"]
        );
    }

    const WDS_NPY: &str = r#"
[dataset]
kind = "webdataset"
[dataset.webdataset]
shards = ["a.tar", "b.tar"]
npy = { field = "features", dtype = "f32", shape = [16, 8] }
[dataset.image]
crop = 32
"#;

    #[test]
    fn webdataset_npy_members_are_a_declared_field_and_images_optional() {
        let c = parse(WDS_NPY).unwrap();
        let w = c.dataset.webdataset.as_ref().unwrap();
        assert!(w.images);
        assert_eq!(
            c.fields(),
            vec![
                Field::new(IMAGES, Dtype::U8, vec![32, 32, 3]),
                Field::new(LABELS, Dtype::I64, vec![]),
                Field::new("features", Dtype::F32, vec![16, 8]),
            ]
        );
        // The same as a sub-table; the field's name defaults to the extension's.
        let t = parse(&WDS_NPY.replace(
            "npy = { field = \"features\", dtype = \"f32\", shape = [16, 8] }",
            "[dataset.webdataset.npy]\ndtype = \"u8\"\nshape = []",
        ))
        .unwrap();
        assert_eq!(
            t.fields()[2],
            Field::new(WDS_NPY_DEFAULT_FIELD, Dtype::U8, vec![])
        );
        // Features-only shards: no image member, no images field, no [dataset.image].
        let n = parse(
            &WDS_NPY
                .replace("[dataset.image]\ncrop = 32\n", "")
                .replace("shards =", "images = false\nshards ="),
        )
        .unwrap();
        assert!(n.dataset.image.is_none() && !n.dataset.decodes_images());
        assert_eq!(
            n.fields(),
            vec![
                Field::new(LABELS, Dtype::I64, vec![]),
                Field::new("features", Dtype::F32, vec![16, 8]),
            ]
        );
        assert_eq!(n.first_field(), (vec![], Dtype::I64));
        for c in [&c, &t, &n] {
            let sum: u64 = c.fields().iter().map(Field::sample_bytes).sum();
            assert_eq!(c.record_bytes(), sum);
            assert_eq!(c.batch_layout().record_bytes, sum);
            assert_eq!(c.sample_bytes(), c.fields()[0].sample_bytes());
            assert_eq!(parse(&c.to_toml()).unwrap(), *c, "{}", c.to_toml());
        }
        // Without images the npy field may be called images (pre-decoded arrays).
        let i = parse(
            &WDS_NPY
                .replace("[dataset.image]\ncrop = 32\n", "")
                .replace("shards =", "images = false\nshards =")
                .replace("\"features\"", "\"images\""),
        )
        .unwrap();
        assert_eq!(i.fields()[1].name, IMAGES);
    }

    #[test]
    fn bad_webdataset_npy_keys_and_clashing_names_are_refused() {
        let npy_line = "npy = { field = \"features\", dtype = \"f32\", shape = [16, 8] }";
        let no_images = |t: &str| {
            t.replace("[dataset.image]\ncrop = 32\n", "")
                .replace("shards =", "images = false\nshards =")
        };
        for (text, needles) in [
            (
                WDS_NPY.replace("\"features\"", "\"labels\""),
                &["dataset.webdataset.npy.field", "\"labels\"", "must differ"][..],
            ),
            (
                WDS_NPY.replace("\"features\"", "\"images\""),
                &["dataset.webdataset.npy.field", "\"images\"", "must differ"],
            ),
            (
                no_images(WDS_NPY).replace("\"features\"", "\"labels\""),
                &["dataset.webdataset.npy.field", "\"labels\""],
            ),
            (
                WDS_NPY.replace("\"features\"", "\"a b\""),
                &["dataset.webdataset.npy.field", "A-Z"],
            ),
            (
                WDS_NPY.replace("\"f32\"", "\"bf16\""),
                &["dataset.webdataset.npy.dtype", "numpy"],
            ),
            (
                WDS_NPY.replace("[16, 8]", "[16, 0]"),
                &["dataset.webdataset.npy.shape", ">= 1"],
            ),
            (
                WDS_NPY.replace("[16, 8]", &format!("{:?}", [1; MAX_SAMPLE_DIMS + 1])),
                &["dataset.webdataset.npy.shape", "dimensions"],
            ),
            (
                WDS_NPY.replace(npy_line, "npy = { dtype = \"f32\" }"),
                &["[dataset.webdataset]", "shape"],
            ),
            (
                WDS_NPY.replace(
                    npy_line,
                    "npy = { path = \"x.npy\", dtype = \"f32\", shape = [2] }",
                ),
                &["[dataset.webdataset]", "path"],
            ),
            (
                WDS_NPY.replace(npy_line, "npy = \"features\""),
                &["[dataset.webdataset]"],
            ),
            (
                WDS_NPY.replace("shards =", "images = false\nshards ="),
                &["[dataset.image]", "images = false"],
            ),
            (
                WDS_NPY.replace("shards =", "images = 0\nshards ="),
                &["[dataset.webdataset]", "bool"],
            ),
            (
                TOKENS.replace("[dataset.tokens]", "[dataset.tokens]\nimages = false"),
                &["dataset.tokens.images", "[dataset.webdataset]"],
            ),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{e:?} lacks {n:?}\n{text}");
            }
        }
    }

    #[test]
    fn image_keys_of_another_transform_output_or_kind_are_refused() {
        for (text, needles) in [
            (
                FOLDER.replace("crop = 32", "crop = 32\nflip = true"),
                &["dataset.image.flip", "transform = \"train\""][..],
            ),
            (
                WDS.to_string() + "[dataset.image]\nresize = 300\n",
                &["dataset.image.resize", "transform = \"eval\""],
            ),
            (
                WDS.to_string() + "[dataset.image]\nmean = [0.5, 0.5, 0.5]\n",
                &["dataset.image.mean", "u8"],
            ),
            (
                FOLDER.replace("resize = 40", "resize = 20"),
                &["dataset.image.resize", "crop"],
            ),
            (
                FOLDER.replace("kind = \"imagefolder\"", "kind = \"npy\""),
                &["[dataset.imagefolder]", "kind = \"npy\""],
            ),
            (
                WDS.replace("shards = [", "root = \"x\"\nshards = ["),
                &["dataset.webdataset.root", "[dataset.imagefolder]"],
            ),
            (
                "[dataset]\nkind = \"imagefolder\"\n".to_string(),
                &["[dataset.imagefolder]", "root"],
            ),
            (
                WDS.replace("shards = [\"a.tar\", \"b.tar\"]", "shards = []"),
                &["dataset.webdataset.shards"],
            ),
            (
                WDS.to_string() + "[dataset.image]\nscale = [0.5, 0.2]\n",
                &["dataset.image.scale"],
            ),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{e:?} lacks {n:?}");
            }
        }
        let e = parse(&TOKENS.replace("[dataset.tokens]", "[dataset.image]\n[dataset.tokens]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[dataset.image]"), "{e}");
    }

    #[test]
    fn the_fingerprint_covers_the_image_keys() {
        type Edit = Box<dyn Fn(&mut Config)>;
        let mut base = parse(FOLDER).unwrap();
        base.set_source_len(10).unwrap();
        let image = |f: fn(&mut ImageDataset)| -> Edit {
            Box::new(move |c: &mut Config| f(c.dataset.image.as_mut().unwrap()))
        };
        let edits: Vec<Edit> = vec![
            Box::new(|c| c.dataset.imagefolder.as_mut().unwrap().root = "./train".into()),
            Box::new(|c| {
                c.dataset
                    .imagefolder
                    .as_mut()
                    .unwrap()
                    .extensions
                    .pop()
                    .map(drop)
                    .unwrap_or(())
            }),
            image(|i| i.crop = Some(31)),
            image(|i| i.resize = Some(41)),
            image(|i| i.output = ImageOutput::Bf16),
            image(|i| i.mean = Some([0.5, 0.5, 0.4])),
            image(|i| i.std = Some([0.5, 0.5, 0.4])),
            image(|i| i.reduced_decode = true),
            image(|i| i.transform = ImageTransform::Train),
            image(|i| {
                i.transform = ImageTransform::Train;
                i.flip = Some(false)
            }),
            image(|i| {
                i.transform = ImageTransform::Train;
                i.scale = Some([0.5, 1.0])
            }),
            image(|i| {
                i.transform = ImageTransform::Train;
                i.ratio = Some([0.5, 1.0])
            }),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "image edit {k}");
        }
        let mut base = parse(WDS).unwrap();
        base.set_shard_samples(&[4, 6]).unwrap();
        base.set_source_len(10).unwrap();
        let edits: Vec<Edit> = vec![
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shards.reverse()),
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shuffle_buffer = 7),
            // Same length, other shard sizes: another order.
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shard_samples = vec![6, 4]),
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().shard_samples.clear()),
            // The npy members' field, each of its keys, and images = false.
            Box::new(|c| c.dataset.webdataset.as_mut().unwrap().npy = Some(wds_npy())),
            Box::new(|c| {
                c.dataset.webdataset.as_mut().unwrap().images = false;
                c.dataset.image = None;
            }),
            Box::new(|c| {
                c.dataset.kind = DatasetKind::ImageFolder;
                c.dataset.webdataset = None;
                c.dataset.imagefolder = Some(ImageFolderDataset {
                    root: "a.tar".into(),
                    extensions: vec!["b.tar".into()],
                });
            }),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            assert_ne!(c.fingerprint(), base.fingerprint(), "webdataset edit {k}");
        }
        let mut base = base.clone();
        base.dataset.webdataset.as_mut().unwrap().npy = Some(wds_npy());
        let npy = |f: fn(&mut WebDatasetNpy)| -> Edit {
            Box::new(move |c: &mut Config| {
                f(c.dataset.webdataset.as_mut().unwrap().npy.as_mut().unwrap())
            })
        };
        let edits: Vec<Edit> = vec![
            npy(|n| n.field = "other".into()),
            npy(|n| n.dtype = Dtype::F16),
            npy(|n| n.shape = vec![8, 16]),
            npy(|n| n.shape = vec![128]),
            Box::new(|c| {
                c.dataset.webdataset.as_mut().unwrap().images = false;
                c.dataset.image = None;
            }),
        ];
        for (k, e) in edits.iter().enumerate() {
            let mut c = base.clone();
            e(&mut c);
            c.validate().unwrap();
            assert_ne!(
                c.fingerprint(),
                base.fingerprint(),
                "webdataset npy edit {k}"
            );
        }
        let mut same = base.clone();
        same.dataset.webdataset.as_mut().unwrap().npy = Some(wds_npy());
        assert_eq!(same.fingerprint(), base.fingerprint());
    }

    fn wds_npy() -> WebDatasetNpy {
        WebDatasetNpy {
            field: "features".into(),
            dtype: Dtype::F32,
            shape: vec![16, 8],
        }
    }

    #[test]
    fn webdataset_plans_follow_the_recorded_shard_sizes() {
        let with = |extra: &str| parse(&format!("{WDS}[plan]\nbatch_size = 2\n{extra}"));
        let mut c = with("world_size = 2\nrank = 1\n").unwrap();
        assert!(c.plan().is_err(), "no plan before the shards are opened");
        assert!(c.shard_order().unwrap().shard_sizes().is_empty());
        c.set_shard_samples(&[4, 7]).unwrap();
        c.set_source_len(11).unwrap();
        let plan = c.plan().unwrap();
        assert_eq!(plan.shard_order().unwrap().shard_sizes(), [4, 7]);
        // Rank 1 has shard 1 (7 samples); rank 0 has 4: padded to the largest.
        assert_eq!((plan.samples_per_rank(), plan.batches_per_epoch()), (7, 4));
        c.plan.drop_last = true;
        let plan = c.plan().unwrap();
        assert_eq!((plan.samples_per_rank(), plan.batches_per_epoch()), (4, 2));
        // The config stored for consumers carries the sizes, so theirs is the same plan.
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again, c);
        assert_eq!(again.fingerprint(), c.fingerprint());
        assert_eq!(again.plan().unwrap().shard_order(), plan.shard_order());
        // Recorded (or given) sizes must be the shards'.
        let e = again
            .clone()
            .set_shard_samples(&[5, 6])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dataset.webdataset.shard_samples") && e.contains("[5, 6]"),
            "{e}"
        );
        let e = parse(&WDS.replace("shards = [", "shard_samples = [3, 3, 3]\nshards = ["))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one count per shard (2 shards)"), "{e}");
        let e = c.clone().set_source_len(12).unwrap_err().to_string();
        assert!(e.contains("dataset.samples"), "{e}");
        // Other kinds ignore shard sizes.
        let mut t = parse(TOKENS).unwrap();
        t.set_shard_samples(&[1, 2]).unwrap();
        assert!(t.shard_order().is_none());
    }

    #[test]
    fn webdataset_ranks_without_shards_or_samples_are_refused() {
        // Three ranks, two shards: refused from the config alone, before the shards are opened.
        let e = parse(&format!("{WDS}[plan]\nworld_size = 3\n"))
            .unwrap_err()
            .to_string();
        for needle in [
            "plan.world_size = 3",
            "2 shards",
            "at most 2 ranks",
            "at least 3 shards",
        ] {
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        }
        // Rank 1's only shard is empty.
        let mut c = parse(&format!("{WDS}[plan]\nworld_size = 2\nbatch_size = 2\n")).unwrap();
        c.set_shard_samples(&[5, 0]).unwrap();
        let e = c.set_source_len(5).unwrap_err().to_string();
        for needle in [
            "plan.world_size",
            "rank 1 of 2",
            "no sample",
            "drop the empty shards",
        ] {
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        }
        // drop_last with the smallest rank below one batch: no batches.
        let mut c = parse(&format!(
            "{WDS}[plan]\nworld_size = 2\nbatch_size = 4\ndrop_last = true\n"
        ))
        .unwrap();
        c.set_shard_samples(&[9, 3]).unwrap();
        let e = c.set_source_len(12).unwrap_err().to_string();
        assert!(e.contains("no batches"), "{e}");
    }

    #[test]
    fn relative_paths_are_resolved_against_the_config_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pinring.toml");
        std::fs::write(&p, TOKENS).unwrap();
        let c = Config::load(&p).unwrap();
        assert_eq!(c.resolve_path(Path::new("a.bin")), dir.path().join("a.bin"));
        assert_eq!(
            c.resolve_path(Path::new("/data/b.bin")),
            Path::new("/data/b.bin")
        );
        let c = parse(TOKENS).unwrap();
        assert_eq!(c.resolve_path(Path::new("a.bin")), Path::new("a.bin"));
    }

    #[test]
    fn paths_made_absolute_read_the_same_files_from_anywhere() {
        // From a file: against its directory, and the TOML written out keeps them so.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pinring.toml");
        std::fs::write(&p, TOKENS).unwrap();
        let mut c = Config::load(&p).unwrap();
        c.make_paths_absolute().unwrap();
        let files = [dir.path().join("a.bin"), PathBuf::from("/data/b.bin")];
        assert_eq!(c.dataset.tokens.as_ref().unwrap().files, files);
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again.dataset.tokens.as_ref().unwrap().files, files);
        assert_ne!(
            again.fingerprint(),
            Config::load(&p).unwrap().fingerprint(),
            "the fingerprint covers the paths as written"
        );
        // Not from a file (settings given as data): against the working directory.
        let mut c = parse(NPY).unwrap();
        c.make_paths_absolute().unwrap();
        let npy = c.dataset.npy.unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert!(
            npy.path.is_absolute() && npy.path.starts_with(&cwd),
            "{npy:?}"
        );
    }
}

#[cfg(test)]
mod example_file {
    /// config/pinring.toml is the documented example: it must stay the built-in default.
    #[test]
    fn the_example_config_is_the_built_in_default() {
        let file = include_str!("../../../config/pinring.toml");
        assert_eq!(file, super::DEFAULT_CONFIG_TOML);
    }
}

#[cfg(test)]
mod hints {
    use super::*;

    fn err(text: &str) -> String {
        Config::from_toml_str(text, "t.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_numpy_or_torch_dtype_name_is_told_pinrings_name() {
        for (given, ours) in [
            ("float32", "f32"),
            ("float16", "f16"),
            ("bfloat16", "bf16"),
            ("torch.bfloat16", "bf16"),
            ("np.float64", "f64"),
            ("int64", "i64"),
            ("long", "i64"),
            ("uint8", "u8"),
            ("int32", "i32"),
            ("half", "f16"),
            ("<f4", "f32"),
        ] {
            let e = err(&format!("[dataset]\ndtype = \"{given}\"\n"));
            assert!(
                e.contains(&format!("pinring calls it \"{ours}\"")),
                "{given}: {e}"
            );
            assert!(e.contains("line 2, column 9"), "{e}");
        }
        // In every table that takes a dtype.
        let e = err(
            "[dataset]\nkind = \"npy\"\n[dataset.npy]\npath = \"x.npy\"\n\
                     dtype = \"float32\"\nshape = [2]\n",
        );
        assert!(e.contains("pinring calls it \"f32\""), "{e}");
        assert!(e.contains("line 5, column"), "{e}");
        // No guess where the libraries disagree, or for what pinring has not.
        for given in ["float", "complex64"] {
            let e = err(&format!("[dataset]\ndtype = \"{given}\"\n"));
            assert!(!e.contains("pinring calls it"), "{e}");
            assert!(e.contains("the dtypes are u8, i32"), "{e}");
        }
    }

    #[test]
    fn a_key_in_the_wrong_table_names_its_table_and_points_at_its_line() {
        let e = err(
            "# data\n[dataset]\nkind = \"tokens\"\nseq_len = 8\n[dataset.tokens]\n\
                     files = [\"a.bin\"]\nseq_len = 8\n",
        );
        assert!(e.contains("seq_len belongs in [dataset.tokens]"), "{e}");
        assert!(e.contains("line 4, column 1"), "{e}");
        let e = err("[dataset]\nbatch_size = 8\n");
        assert!(e.contains("batch_size belongs in [plan]"), "{e}");
        let e = err("batch_size = 8\n");
        assert!(e.contains("batch_size belongs in [plan]"), "{e}");
        let e = err("[plan]\n\nlease_ms = 5\n");
        assert!(
            e.contains("lease_ms belongs in [daemon]") && e.contains("line 3, column 1"),
            "{e}"
        );
        // Keys the dataset's own check refuses: at their line, not at [dataset]'s.
        let e = err(
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"a.bin\"]\n\
                     seq_len = 8\n  crop = 3\n",
        );
        assert!(
            e.contains("crop belongs in [dataset.image]") && e.contains("line 6, column 3"),
            "{e}"
        );
        let e = err(
            "[dataset]\nkind = \"tokens\"\n\nclasses = 3\n[dataset.tokens]\n\
                     files = [\"a.bin\"]\nseq_len = 8\n",
        );
        assert!(
            e.contains("dataset.classes") && e.contains("line 4, column 1"),
            "{e}"
        );
        let e = err(
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = \"a.bin\"\n\
                     seq_len = 8\n",
        );
        assert!(e.contains("line 4, column 1"), "{e}");
        let e = err(
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"a\"]\n\
                     seq_len = 8\nbatch = 3\n",
        );
        assert!(
            e.contains("unknown key dataset.tokens.batch") && e.contains("line 6, column 1"),
            "{e}"
        );
        // Given as data (Python): the same words, no marks left in them.
        let mut de = serde_json::Deserializer::from_str(
            r#"{"dataset": {"kind": "tokens", "tokens": {"files": ["a"], "seq_len": 8, "crop": 3}}}"#,
        );
        let e = Config::from_settings(&mut de, "data")
            .unwrap_err()
            .to_string();
        assert!(e.contains("crop belongs in [dataset.image]"), "{e}");
        assert!(!e.contains('\u{1}'), "{e:?}");
    }

    #[test]
    fn one_shard_string_is_a_list_of_one_and_globs_are_counted_when_expanded() {
        let c = Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"a.tar\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.dataset.webdataset.as_ref().unwrap().shards,
            [PathBuf::from("a.tar")]
        );
        assert!(
            c.to_toml().contains("shards = [\"a.tar\"]"),
            "{}",
            c.to_toml()
        );
        // Two ranks, one glob: the count is the expansion's, refused only after it.
        let text = "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
                    shards = \"train-*.tar\"\n[plan]\nworld_size = 2\n";
        let mut c = Config::from_toml_str(text, "t").unwrap();
        assert!(c.set_shards(vec!["train-0.tar".into()]).is_err());
        c.set_shards(vec!["train-0.tar".into(), "train-1.tar".into()])
            .unwrap();
        let e = err("[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = 3\n");
        assert!(e.contains("a list of shard paths"), "{e}");
    }

    #[test]
    fn the_expanded_shards_are_what_the_fingerprint_covers() {
        struct Expanded(Vec<PathBuf>);
        impl crate::DatasetOpener for Expanded {
            fn open(&self, _: &Config) -> Result<Option<crate::OpenedDataset>, ConfigError> {
                Ok(Some(crate::OpenedDataset {
                    len: self.0.len() as u64,
                    shard_sizes: Some(vec![1; self.0.len()]),
                    shards: Some(self.0.clone()),
                }))
            }
        }
        let c = Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"s-*.tar\"\n\
             [plan]\nbatch_size = 1\n",
            "t",
        )
        .unwrap();
        let two = vec![PathBuf::from("s-0.tar"), PathBuf::from("s-1.tar")];
        let a = c.resolve(&Expanded(two.clone()), None).unwrap();
        assert_eq!(a.config().dataset.webdataset.as_ref().unwrap().shards, two);
        let other = vec![PathBuf::from("s-0.tar"), PathBuf::from("s-2.tar")];
        let b = c.resolve(&Expanded(other), None).unwrap();
        assert_ne!(a.config().fingerprint(), b.config().fingerprint());
        // The same shards named one by one: the same fingerprint as the glob's.
        let named = Config::from_toml_str(
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
             shards = [\"s-0.tar\", \"s-1.tar\"]\n[plan]\nbatch_size = 1\n",
            "t",
        )
        .unwrap()
        .resolve(&Expanded(two), None)
        .unwrap();
        assert_eq!(named.config().fingerprint(), a.config().fingerprint());
    }

    #[test]
    fn a_file_that_sets_nothing_says_so() {
        for text in ["", "# nothing\n\n", "[plan]\n# batch_size = 4\n[dataset]\n"] {
            let c = Config::from_toml_str(text, "empty.toml").unwrap();
            assert!(c.sets_nothing, "{text:?}");
            let w = c.sets_nothing_warning().unwrap();
            assert!(w.contains("empty.toml") && w.contains("default"), "{w}");
        }
        for text in ["[plan]\nbatch_size = 4\n", DEFAULT_CONFIG_TOML] {
            let c = Config::from_toml_str(text, "t").unwrap();
            assert!(!c.sets_nothing && c.sets_nothing_warning().is_none());
        }
        assert!(!Config::default().sets_nothing);
    }

    #[test]
    fn a_config_loaded_by_a_relative_name_resolves_against_an_absolute_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.toml"), "").unwrap();
        let c = Config::load(dir.path().join("p.toml")).unwrap();
        assert_eq!(c.base_dir.as_deref(), Some(dir.path()));
        assert!(c
            .paths_relative_to()
            .contains(&dir.path().display().to_string()));
        let cwd = std::env::current_dir().unwrap();
        let rel = dir.path().join("p.toml");
        if let Ok(rel) = rel.strip_prefix(&cwd) {
            let c = Config::load(rel).unwrap();
            assert!(c.base_dir.unwrap().is_absolute());
        }
    }
}
