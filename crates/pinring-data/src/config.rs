//! The TOML config file shared by the daemon and the loaders.
//!
//! The settings of a config file ([`Config`]: the file's shape, with its optional and `"auto"`
//! values). Every section and key is optional; missing ones take the built-in
//! defaults ([`DEFAULT_CONFIG_TOML`], equal to [`Config::default`]).
//! Unknown keys are errors. What a process runs is the settings resolved into a
//! [`crate::Spec`] ([`crate::Spec::resolve`]), with the overrides of its flags, environment or
//! keywords ([`crate::Overrides`]) applied there.
//!
//! Validation includes the ring's geometry, with the limits of the segment layout itself
//! (`pinring_ring::layout`: slot alignment, largest slot, most slots), so a config that passes
//! here is one the daemon can make a ring of.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::dataset::{
    ImageDataset, ImageDecode, ImageFolderDataset, ImageOutput, ImageTransform, NpyDataset,
    OnBadSample, RawDataset, TokensDataset, WebDatasetDataset, INPUT_IDS, MIN_ENCODED_SHARE,
    TARGETS,
};
use crate::fields::{BatchLayout, Field, IMAGES, LABELS};
use crate::meta::{max_encoded_len, Dtype};
use crate::plan::{Plan, PlanError, PlanParams, SampleCut, MAX_PLAN_SAMPLES};
use crate::shard_order::ShardOrder;
use crate::size::ByteSize;
use crate::synthetic::Synthetic;

mod geometry;
pub(crate) mod keys;
mod validate;
pub use geometry::{ring_warnings, AutoRing, PartLayout};

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
/// `"auto"` for a ring that carries its images encoded (`[dataset.image] decode = "gpu"`): the
/// most bytes of a part's encoded field (32 MiB). A part is one batched call of the decoder,
/// whose cost per call (nvJPEG's, the kernels' launches, the daemon's turn) wants parts of
/// many images, and the bytes are read once by the decoder, not copied through the cache, so
/// the cache does not size these rings: a batch of 256 at the default 256 KiB an image is 3
/// parts of 86, where the 4 MiB of pixel parts gave 18 parts of 15 (and, on a 32 MiB cache, 86
/// parts of 3 in 21 slots: fewer slots than a batch has parts).
pub const AUTO_ENCODED_PART_PAYLOAD_BYTES: u64 = 32 << 20;
/// `"auto"` for a ring that carries its images encoded: the fewest slots, and at least two
/// batches' parts.
pub const AUTO_ENCODED_MIN_SLOTS: u32 = 8;
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
#                         # (decode = "cpu" only)
#   decode = "cpu"        # "gpu": the loaders write the compressed bytes and
#                         # whoever copies the batch out decodes them (the
#                         # GPU with the cuda backend, the CPU with host);
#                         # "auto": "gpu" where the daemon's host has a CUDA
#                         # device with nvJPEG and NVRTC, else "cpu"
#   encoded_bytes = "64MiB"  # decode = "gpu"/"auto": compressed bytes a batch may
#                         # carry (default 256 KiB a sample)
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, bincode::Encode, bincode::Decode)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, bincode::Encode, bincode::Decode)]
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
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
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
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
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
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
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
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
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
    /// Read from a file that sets `plan.epochs` itself ([`Config::from_toml_str`]): an
    /// [`crate::Overrides::default_epochs`] leaves it as the file says. Not part of the file.
    #[serde(skip)]
    pub epochs_given: bool,
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
            epochs_given: false,
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
        cfg.epochs_given = toml_sets(text, "plan", "epochs");
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
            // The first field's bytes are its pixels (what a part's metadata records); in a
            // slot, an encoded one brings an entry and its share of the arena instead
            // (crate::encoded).
            let pixels = d.image.as_ref().map(|i| {
                let (dtype, shape) = i.images();
                bytes(dtype, &shape)
            });
            let images = d.image.as_ref().map(|i| {
                i.encoded_share(self.plan.batch_size).map_or_else(
                    || pixels.unwrap_or(0),
                    |share| crate::ENTRY_BYTES.saturating_add(share),
                )
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
            return Some((pixels.unwrap_or(labels), all));
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
        let b = self.plan.batch_size;
        let encoded = self.dataset.image.as_ref().and_then(|i| i.encoded_share(b));
        // `images` is the first field of the kinds that decode images.
        BatchLayout::with_encoded(&self.fields(), b, encoded.map(|share| (0, share)))
    }

    /// The samples an engine decodes into when the ring carries its images encoded
    /// (`[dataset.image] decode = "gpu"`): the loaders' own spec
    /// ([`ImageDataset::sample_spec`]), so the pixels are theirs; `None` when the loaders
    /// decode.
    pub fn decoder_spec(&self) -> Option<pinring_image::SampleSpec> {
        let image = self.dataset.image.as_ref()?;
        self.decodes_on_copy().then(|| image.sample_spec())
    }

    /// Where an encoded sample came from, in words, from its entry's place (`EncodedEntry`'s
    /// file and member, `None` where the entry was unreadable): a WebDataset's shard path and
    /// the member's byte offset in it; an image folder's sample index under its root.
    pub fn describe_origin(&self, at: Option<(u32, u64)>) -> String {
        let Some((file, member)) = at else {
            return "an entry that does not read (its place unknown)".into();
        };
        if let Some(w) = &self.dataset.webdataset {
            if let Some(shard) = w.shards.get(file as usize) {
                return format!("shard {}, member at byte {member}", shard.display());
            }
        }
        if let Some(f) = &self.dataset.imagefolder {
            return format!("image #{file} of folder {}", f.root.display());
        }
        format!("file #{file}, member at byte {member}")
    }

    /// Whether the ring carries the images encoded, for whoever copies a batch out to decode
    /// (`[dataset.image] decode = "gpu"`).
    pub fn decodes_on_copy(&self) -> bool {
        self.dataset
            .image
            .as_ref()
            .is_some_and(|i| i.decode == ImageDecode::Gpu)
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
        let layout = self.part_layout();
        PlanParams {
            samples: self.dataset.samples,
            plan: self.plan,
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
mod more_tests;
#[cfg(test)]
mod tests;
