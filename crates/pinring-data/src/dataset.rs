//! The keys of the file kinds of `[dataset]`: `[dataset.tokens]` ([`TokensDataset`]),
//! `[dataset.npy]` ([`NpyDataset`]), `[dataset.webdataset]` ([`WebDatasetDataset`]),
//! `[dataset.imagefolder]` ([`ImageFolderDataset`]) and, for those two image kinds,
//! `[dataset.image]` ([`ImageDataset`]), `dataset.on_bad_sample` ([`OnBadSample`]), and how the
//! `[dataset]` table is read so that a key of another kind is refused by name
//! ([`DatasetConfig`]'s serde form).
//!
//! Each file kind has its own table, so a key keeps one meaning (`dtype` of `[dataset.tokens]`
//! is the tokens' field dtype, `dtype` of `[dataset.npy]` the arrays' dtype, `dataset.dtype` the
//! synthetic element type), and every table refuses keys it does not know. A key that belongs to
//! another kind (a synthetic key beside `kind = "tokens"`, `seq_len` in `[dataset.npy]`, a
//! `[dataset.npy]` table beside `kind = "tokens"`) is refused with a message naming the key and
//! the kind it belongs to. Relative paths are kept as written (the fingerprint hashes them so)
//! and resolved against the directory of the config file when a source is opened
//! ([`crate::Config::resolve_path`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::keys::at;
use crate::config::{DatasetConfig, DatasetKind};
use crate::fields::Field;
use crate::meta::Dtype;

/// Name of the tokens kind's input field.
pub const INPUT_IDS: &str = "input_ids";
/// Name of the tokens kind's target field.
pub const TARGETS: &str = "targets";
/// Default name of the npy kind's data field.
pub const NPY_DEFAULT_FIELD: &str = "data";

/// `dataset.on_bad_sample`: what a loader does with a sample of a file kind it cannot read
/// (a truncated or corrupt file, a value that does not fit).
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
pub enum OnBadSample {
    /// Stop: the loader logs the error (file, offset, problem) and exits with the config/data
    /// exit code (3).
    #[default]
    Fail,
    /// Substitute zeros for the sample's bytes (every field), count it and log a warning naming
    /// the sample.
    Skip,
}

impl OnBadSample {
    /// The config spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            OnBadSample::Fail => "fail",
            OnBadSample::Skip => "skip",
        }
    }
}

/// `[dataset.tokens]`: flat binary token files (`kind = "tokens"`, docs/FORMATS.md).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct TokensDataset {
    /// The token files, one stream in this order.
    pub files: Vec<PathBuf>,
    /// Element type of the files: `u16` (default) or `u32`, little-endian, no header.
    #[serde(default = "default_token_dtype")]
    pub token_dtype: Dtype,
    /// Tokens of `input_ids` (and of `targets`) per sample.
    pub seq_len: u32,
    /// Tokens between window starts; `None`: `seq_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<u32>,
    /// Start each epoch's windows at a per-epoch offset in `0..stride` (seeded by `plan.seed`).
    #[serde(default)]
    pub shift: bool,
    /// Dtype of `input_ids` and `targets`: `i64` (default) or `i32`.
    #[serde(default = "default_i64")]
    pub dtype: Dtype,
}

impl TokensDataset {
    /// The stride in effect.
    pub fn stride(&self) -> u32 {
        self.stride.unwrap_or(self.seq_len)
    }
}

/// `[dataset.npy]`: NumPy arrays (`kind = "npy"`, docs/FORMATS.md). The per-sample dtype and
/// shape are declared, so the fields (and slot sizes) follow from the config alone; the files
/// are checked against them when opened.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct NpyDataset {
    /// One `.npy` file (samples on the first axis) or a directory of per-sample `.npy` files.
    pub path: PathBuf,
    /// Name of the data field (default `"data"`).
    #[serde(default = "default_field")]
    pub field: String,
    /// The data's dtype (pinring name: `u8`, `f32`, `bool`, ...; the file's numpy dtype must be
    /// the same type).
    pub dtype: Dtype,
    /// Shape of one sample (`[]`: one value).
    pub shape: Vec<u32>,
    /// A `.npy` file with one label per sample on its first axis: the field `labels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<PathBuf>,
    /// Dtype of the labels (default `i64`).
    #[serde(default = "default_i64")]
    pub labels_dtype: Dtype,
    /// Per-sample shape of the labels (default `[]`: one value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels_shape: Vec<u32>,
}

/// `[dataset.webdataset]`: WebDataset tar shards (`kind = "webdataset"`, docs/FORMATS.md), each
/// sample an image member (`.jpg`, `.jpeg`, `.png`; unless `images = false`), a `.cls` label and,
/// with `npy`, a `.npy` array.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct WebDatasetDataset {
    /// The tar shards, in order (sample ids: shard order, then member order). An entry may be
    /// a glob (`"train-*.tar"`), expanded in sorted order when the shards are opened
    /// ([`crate::Config::set_shards`]); one string is read as a list of one entry.
    #[serde(deserialize_with = "one_or_many")]
    pub shards: Vec<PathBuf>,
    /// Whether each sample has an image member, decoded into the field `images` as
    /// `[dataset.image]` says (default true; false: no image member is read, no `images` field,
    /// no `[dataset.image]`).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub images: bool,
    /// The array of each sample's `.npy` member, a fixed field after `labels` (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npy: Option<WebDatasetNpy>,
    /// Samples in the shuffle buffer of the shard order (default 1000; 0 or 1: none; used
    /// with `plan.shuffle`), docs/FORMATS.md.
    #[serde(default = "default_shuffle_buffer")]
    pub shuffle_buffer: u64,
    /// Samples in each shard, in shard order: like `dataset.samples`, left out (empty) until
    /// the shards are opened ([`crate::Config::set_shard_samples`]); one given must equal the
    /// shards'. The plan's shard order needs it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_samples: Vec<u64>,
}

/// A list of paths, or one path given as a string (`shards = "train-*.tar"`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    #[derive(Deserialize)]
    #[serde(
        untagged,
        expecting = "a list of shard paths (or globs), or one path as a string"
    )]
    enum OneOrMany {
        One(PathBuf),
        Many(Vec<PathBuf>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(p) => vec![p],
        OneOrMany::Many(v) => v,
    })
}

/// Whether a shard entry is a glob: it holds `*`, `?` or `[` (the `glob` crate's syntax).
pub fn is_glob(path: &std::path::Path) -> bool {
    path.to_str().is_some_and(|s| s.contains(['*', '?', '[']))
}

/// `[dataset.webdataset] npy`: every sample's `.npy` member holds one array of this dtype and
/// shape (little-endian, C order), copied into the field `field`. Declared, so that the fields
/// (and slot sizes) follow from the config alone; each member is checked when read.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct WebDatasetNpy {
    /// Name of the field (default `"npy"`, the members' extension).
    #[serde(default = "default_wds_npy_field")]
    pub field: String,
    /// The arrays' dtype (pinring name, as in `[dataset.npy]`: `f32`, `u8`, `bool`, ...).
    pub dtype: Dtype,
    /// The arrays' shape (`[]`: one value).
    pub shape: Vec<u32>,
}

/// Default `[dataset.webdataset] npy.field`.
pub const WDS_NPY_DEFAULT_FIELD: &str = "npy";

fn default_wds_npy_field() -> String {
    WDS_NPY_DEFAULT_FIELD.into()
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Default `[dataset.webdataset] shuffle_buffer`.
pub const DEFAULT_SHUFFLE_BUFFER: u64 = 1000;

fn default_shuffle_buffer() -> u64 {
    DEFAULT_SHUFFLE_BUFFER
}

/// `[dataset.imagefolder]`: torchvision `ImageFolder`'s layout, `root/<class>/**/<file>`
/// (`kind = "imagefolder"`, docs/FORMATS.md).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct ImageFolderDataset {
    /// The directory of class directories.
    pub root: PathBuf,
    /// File extensions that are samples, compared case-insensitively (default jpg, jpeg, png).
    #[serde(default = "default_extensions")]
    pub extensions: Vec<String>,
}

fn default_extensions() -> Vec<String> {
    vec!["jpg".into(), "jpeg".into(), "png".into()]
}

/// `[dataset.image] transform`.
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
pub enum ImageTransform {
    /// torchvision `RandomResizedCrop(crop, scale, ratio)` + `RandomHorizontalFlip()`, drawn per
    /// (plan seed, epoch, sample id).
    #[default]
    Train,
    /// torchvision `Resize(resize)` + `CenterCrop(crop)`.
    Eval,
}

impl ImageTransform {
    /// The config spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            ImageTransform::Train => "train",
            ImageTransform::Eval => "eval",
        }
    }
}

/// `[dataset.image] output`.
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
pub enum ImageOutput {
    /// u8 RGB, HWC `[crop, crop, 3]`, unnormalised.
    #[default]
    U8,
    /// `(x/255 - mean)/std`, CHW `[3, crop, crop]`, f16.
    F16,
    /// The same in bf16.
    Bf16,
    /// The same in f32.
    F32,
}

impl ImageOutput {
    /// The element type of the `images` field.
    pub const fn dtype(self) -> Dtype {
        match self {
            ImageOutput::U8 => Dtype::U8,
            ImageOutput::F16 => Dtype::F16,
            ImageOutput::Bf16 => Dtype::Bf16,
            ImageOutput::F32 => Dtype::F32,
        }
    }
}

/// `[dataset.image] decode`: where the JPEGs are decoded.
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
pub enum ImageDecode {
    /// The loaders decode and transform each image and write the `images` field's pixels into
    /// the ring (the default).
    #[default]
    Cpu,
    /// The loaders write each image's compressed bytes and its crop into the ring
    /// ([`crate::EncodedEntry`]); whoever copies the batch out decodes and transforms
    /// them into the `images` field: on the GPU with the cuda backend, on the CPU with the host
    /// backend (the same pixels as `"cpu"`).
    Gpu,
    /// `"gpu"` where the host that resolves the config (the daemon's) has a CUDA device whose
    /// nvJPEG and NVRTC libraries load, else `"cpu"`: decided once, when the ring is made
    /// ([`crate::Spec::resolve`] with [`crate::HostFacts::gpu_decode`]); a resolved config
    /// and the ring's stored copy never say `"auto"`.
    Auto,
}

impl ImageDecode {
    /// The config spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            ImageDecode::Cpu => "cpu",
            ImageDecode::Gpu => "gpu",
            ImageDecode::Auto => "auto",
        }
    }
}

/// Default share of `[dataset.image] encoded_bytes` per sample of a batch (decode = "gpu"):
/// 256 KiB, over twice the mean ImageNet JPEG (110 KB).
pub const DEFAULT_ENCODED_SHARE: u64 = 256 << 10;
/// Smallest share of `encoded_bytes` per sample: a JPEG's headers alone take hundreds of bytes.
pub const MIN_ENCODED_SHARE: u64 = 1024;

/// Default `crop`.
pub const DEFAULT_CROP: u32 = 224;
/// Default `resize` (eval).
pub const DEFAULT_RESIZE: u32 = 256;
/// Default `scale` (train).
pub const DEFAULT_SCALE: [f64; 2] = [0.08, 1.0];
/// Default `ratio` (train).
pub const DEFAULT_RATIO: [f64; 2] = [3.0 / 4.0, 4.0 / 3.0];
/// Default `mean` (normalised output): ImageNet's, R G B on the 0..1 scale.
pub const DEFAULT_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// Default `std` (normalised output): ImageNet's.
pub const DEFAULT_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// `[dataset.image]`: how `kind = "webdataset"` and `"imagefolder"` turn an encoded JPEG or PNG
/// into the `images` field (pinring-image's `SampleSpec`; docs/IMAGES.md). Every key is
/// optional; a key of the other transform (`resize` with train, `scale`/`ratio`/`flip` with
/// eval) or of the other output (`mean`/`std` with u8) is refused.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
#[serde(deny_unknown_fields)]
pub struct ImageDataset {
    /// `"train"` (default) or `"eval"`.
    #[serde(default)]
    pub transform: ImageTransform,
    /// Side of the square output (default 224).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crop: Option<u32>,
    /// Eval: shorter side after resizing (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<u32>,
    /// Train: range of the crop's area as a fraction of the image's (default [0.08, 1]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<[f64; 2]>,
    /// Train: range of the crop's aspect ratio w/h, drawn log-uniformly (default [3/4, 4/3]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<[f64; 2]>,
    /// Train: flip horizontally with probability 0.5 (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flip: Option<bool>,
    /// `"u8"` (default, HWC) or `"f16"`, `"bf16"`, `"f32"` (normalised, CHW).
    #[serde(default)]
    pub output: ImageOutput,
    /// Normalised output: per-channel mean, R G B on the 0..1 scale (default ImageNet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<[f32; 3]>,
    /// Normalised output: per-channel std (default ImageNet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<[f32; 3]>,
    /// Decode large JPEGs at 1/4 or 1/8 size when the crop would be shrunk that much anyway
    /// (default false; slightly different pixels, docs/IMAGES.md).
    #[serde(default)]
    pub reduced_decode: bool,
    /// Where the JPEGs are decoded: `"cpu"` (default, by the loaders), `"gpu"` (by whoever
    /// copies the batch out, from the compressed bytes the loaders write into the ring) or
    /// `"auto"` (`"gpu"` where the daemon's host can decode on a GPU, else `"cpu"`).
    #[serde(default)]
    pub decode: ImageDecode,
    /// decode = "gpu" (or "auto"): bytes of compressed images a batch may carry (default 256
    /// KiB per sample); each part of a batch gets its samples' share. A part whose images do
    /// not fit is refused, naming the sample and this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoded_bytes: Option<crate::ByteSize>,
}

// Validation refuses NaN (ranges and finite checks), so equality is reflexive.
impl Eq for ImageDataset {}

impl ImageDataset {
    /// Side of the square output.
    pub fn crop(&self) -> u32 {
        self.crop.unwrap_or(DEFAULT_CROP)
    }
    /// Eval's shorter side after resizing.
    pub fn resize(&self) -> u32 {
        self.resize.unwrap_or(DEFAULT_RESIZE)
    }
    /// Train's area range.
    pub fn scale(&self) -> [f64; 2] {
        self.scale.unwrap_or(DEFAULT_SCALE)
    }
    /// Train's aspect-ratio range.
    pub fn ratio(&self) -> [f64; 2] {
        self.ratio.unwrap_or(DEFAULT_RATIO)
    }
    /// Train's flip.
    pub fn flip(&self) -> bool {
        self.flip.unwrap_or(true)
    }
    /// Normalised output's mean.
    pub fn mean(&self) -> [f32; 3] {
        self.mean.unwrap_or(DEFAULT_MEAN)
    }
    /// Normalised output's std.
    pub fn std(&self) -> [f32; 3] {
        self.std.unwrap_or(DEFAULT_STD)
    }
    /// decode = "gpu": bytes of a batch's arena each sample brings (`encoded_bytes` over the
    /// batch's samples, rounded up; default [`DEFAULT_ENCODED_SHARE`]); `None` with decode =
    /// "cpu". "auto" is checked as "gpu" until it is resolved.
    pub fn encoded_share(&self, batch_size: u32) -> Option<u64> {
        if self.decode == ImageDecode::Cpu {
            return None;
        }
        Some(self.encoded_bytes.map_or(DEFAULT_ENCODED_SHARE, |b| {
            b.0.div_ceil(u64::from(batch_size.max(1)))
        }))
    }
    /// Resolves decode = "auto" ([`ImageDecode::Auto`]): `"gpu"` if `gpu` (the resolving
    /// host can decode on a GPU), else `"cpu"`, whose loaders write pixels (so `encoded_bytes`
    /// goes). Returns whether it changed anything.
    pub fn resolve_decode(&mut self, gpu: bool) -> bool {
        if self.decode != ImageDecode::Auto {
            return false;
        }
        if gpu {
            self.decode = ImageDecode::Gpu;
        } else {
            self.decode = ImageDecode::Cpu;
            self.encoded_bytes = None;
        }
        true
    }

    /// pinring-image's `SampleSpec` for this table: the transform, the output and
    /// `reduced_decode`, every value in effect. The loaders (decode = "cpu") and the engines
    /// that decode on copy (decode = "gpu") make their samples from it.
    pub fn sample_spec(&self) -> pinring_image::SampleSpec {
        use pinring_image::{Float, Output, SampleSpec, Transform};
        let transform = match self.transform {
            ImageTransform::Eval => Transform::Eval {
                resize: self.resize(),
                crop: self.crop(),
            },
            ImageTransform::Train => {
                let ([s0, s1], [r0, r1]) = (self.scale(), self.ratio());
                Transform::Train {
                    crop: self.crop(),
                    scale: (s0, s1),
                    ratio: (r0, r1),
                    flip_p: if self.flip() { 0.5 } else { 0.0 },
                }
            }
        };
        let normalized = |dtype| Output::Normalized {
            dtype,
            mean: self.mean(),
            std: self.std(),
        };
        let output = match self.output {
            ImageOutput::U8 => Output::U8Hwc,
            ImageOutput::F16 => normalized(Float::F16),
            ImageOutput::Bf16 => normalized(Float::Bf16),
            ImageOutput::F32 => normalized(Float::F32),
        };
        SampleSpec {
            transform,
            output,
            reduced_decode: self.reduced_decode,
        }
    }

    /// The `images` field's dtype and per-sample shape: u8 `[crop, crop, 3]` or the float
    /// dtype `[3, crop, crop]`.
    pub fn images(&self) -> (Dtype, Vec<u32>) {
        let c = self.crop();
        match self.output {
            ImageOutput::U8 => (Dtype::U8, vec![c, c, 3]),
            o => (o.dtype(), vec![3, c, c]),
        }
    }
}

fn default_token_dtype() -> Dtype {
    Dtype::U16
}

fn default_i64() -> Dtype {
    Dtype::I64
}

fn default_field() -> String {
    NPY_DEFAULT_FIELD.into()
}

/// Keys of `[dataset.tokens]`.
const TOKENS_KEYS: &[&str] = &[
    "files",
    "token_dtype",
    "seq_len",
    "stride",
    "shift",
    "dtype",
];
/// Keys of `[dataset.npy]`.
const NPY_KEYS: &[&str] = &[
    "path",
    "field",
    "dtype",
    "shape",
    "labels",
    "labels_dtype",
    "labels_shape",
];

/// Keys of `[dataset.webdataset]`.
const WDS_KEYS: &[&str] = &["shards", "shuffle_buffer", "shard_samples", "images", "npy"];
/// Keys of `[dataset.imagefolder]`.
const IMAGEFOLDER_KEYS: &[&str] = &["root", "extensions"];
/// Keys of `[dataset.image]`.
const IMAGE_KEYS: &[&str] = &[
    "transform",
    "crop",
    "resize",
    "scale",
    "ratio",
    "flip",
    "output",
    "mean",
    "std",
    "reduced_decode",
    "decode",
    "encoded_bytes",
];

/// The tables of the file kinds: (table name, its keys, the kinds it belongs to).
pub(crate) const TABLES: &[(&str, &[&str], &[DatasetKind])] = &[
    ("tokens", TOKENS_KEYS, &[DatasetKind::Tokens]),
    ("npy", NPY_KEYS, &[DatasetKind::Npy]),
    ("webdataset", WDS_KEYS, &[DatasetKind::WebDataset]),
    ("imagefolder", IMAGEFOLDER_KEYS, &[DatasetKind::ImageFolder]),
    (
        "image",
        IMAGE_KEYS,
        &[DatasetKind::WebDataset, DatasetKind::ImageFolder],
    ),
];

/// The `[dataset]` table as written: every key optional, so that [`DatasetConfig`] can tell a
/// key that was given from a default and refuse one that belongs to another kind.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDataset {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<DatasetKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    samples: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sample_shape: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dtype: Option<Dtype>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    classes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fields: Option<Vec<Field>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_bad_sample: Option<OnBadSample>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<toml::Table>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    npy: Option<toml::Table>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    webdataset: Option<toml::Table>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    imagefolder: Option<toml::Table>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<toml::Table>,
}

/// The kind's config spelling, quoted.
fn q(kind: DatasetKind) -> String {
    format!("kind = \"{}\"", kind.as_str())
}

/// Reads `[dataset.<name>]` into `T`, refusing a key of another file kind's table by name.
fn sub_table<T: serde::de::DeserializeOwned>(
    table: toml::Table,
    name: &str,
    kind: DatasetKind,
) -> Result<T, String> {
    let own = TABLES.iter().find(|t| t.0 == name).map_or(&[][..], |t| t.1);
    for key in table.keys() {
        if own.contains(&key.as_str()) {
            continue;
        }
        if let Some(other) = TABLES
            .iter()
            .find(|t| t.0 != name && t.1.contains(&key.as_str()))
        {
            return Err(at(
                &format!("dataset.{name}.{key}"),
                format!(
                    "{key} belongs in [dataset.{o}]: dataset.{name}.{key} is a key of \
                 [dataset.{o}] ({kinds}), not of {}; [dataset.{name}] takes {}",
                    q(kind),
                    own.join(", "),
                    o = other.0,
                    kinds = other
                        .2
                        .iter()
                        .map(|k| format!("kind = \"{k}\""))
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            ));
        }
        let homes = crate::config::keys::homes(key);
        return Err(at(
            &format!("dataset.{name}.{key}"),
            if homes.is_empty() {
                format!(
                    "unknown key dataset.{name}.{key}; [dataset.{name}] takes {}",
                    own.join(", ")
                )
            } else {
                format!(
                    "{key} belongs in {}, not in [dataset.{name}]: move it there; \
                     [dataset.{name}] takes {}",
                    homes.join(" or "),
                    own.join(", ")
                )
            },
        ));
    }
    T::deserialize(toml::Value::Table(table)).map_err(|e| {
        // toml names the key of a value it refused on a last line, "in `key`".
        let text = e.to_string();
        let text = text.trim_end();
        match text.rsplit_once("\nin `") {
            Some((message, key)) if key.ends_with('`') => at(
                &format!("dataset.{name}.{}", key.trim_end_matches('`')),
                format!("[dataset.{name}]: {message}"),
            ),
            _ => at(
                &format!("dataset.{name}"),
                format!("[dataset.{name}]: {text}"),
            ),
        }
    })
}

/// Refuses a key or table of `[dataset]` that belongs to another kind than `kind`, naming it
/// and the fix.
fn refuse_keys_of_other_kinds(r: &RawDataset, kind: DatasetKind) -> Result<(), String> {
    if kind.reads_files() {
        let synthetic = [
            ("sample_shape", r.sample_shape.is_some()),
            ("dtype", r.dtype.is_some()),
            ("seed", r.seed.is_some()),
            ("classes", r.classes.is_some()),
        ];
        if let Some((key, _)) = synthetic.iter().find(|(_, given)| *given) {
            return Err(at(
                &format!("dataset.{key}"),
                format!(
                    "dataset.{key} is a key of kind = \"synthetic\", and this dataset has \
                     {}: remove it (the fields of its samples come from [dataset.{}]{})",
                    q(kind),
                    kind.as_str(),
                    if *key == "seed" {
                        "; the shifted windows of kind = \"tokens\" use plan.seed"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if r.fields.is_some() {
            return Err(at(
                "dataset.fields",
                format!(
                    "dataset.fields is a key of kind = \"external\", and this dataset has \
                     {}: remove it (the fields of its samples come from [dataset.{}])",
                    q(kind),
                    kind.as_str()
                ),
            ));
        }
    } else if r.on_bad_sample.is_some() {
        return Err(at(
            "dataset.on_bad_sample",
            format!(
                "dataset.on_bad_sample is a key of the file kinds (\"tokens\", \"npy\", \
                 \"webdataset\", \"imagefolder\"), and this dataset has {}: remove it",
                q(kind)
            ),
        ));
    }
    for (name, given) in [
        ("tokens", r.tokens.is_some()),
        ("npy", r.npy.is_some()),
        ("webdataset", r.webdataset.is_some()),
        ("imagefolder", r.imagefolder.is_some()),
        ("image", r.image.is_some()),
    ] {
        let owners = TABLES.iter().find(|t| t.0 == name).map_or(&[][..], |t| t.2);
        if given && !owners.contains(&kind) {
            let names: Vec<String> = owners.iter().map(|k| format!("\"{k}\"")).collect();
            return Err(at(
                &format!("dataset.{name}"),
                format!(
                    "[dataset.{name}] holds keys of kind = {}, and this dataset has {}: \
                     remove the table or set dataset.kind = {}",
                    names.join(" or "),
                    q(kind),
                    names.join(" or ")
                ),
            ));
        }
    }
    Ok(())
}

impl TryFrom<RawDataset> for DatasetConfig {
    type Error = String;

    fn try_from(r: RawDataset) -> Result<DatasetConfig, String> {
        let d = DatasetConfig::default();
        let kind = r.kind.unwrap_or_default();
        let file_kind = kind.reads_files();
        refuse_keys_of_other_kinds(&r, kind)?;
        let tokens = match r.tokens {
            Some(t) => Some(sub_table::<TokensDataset>(t, "tokens", kind)?),
            None if kind == DatasetKind::Tokens => {
                return Err(at(
                    "dataset.kind",
                    "kind = \"tokens\" needs a [dataset.tokens] table with at least files and \
                     seq_len, e.g. files = [\"train.bin\"] and seq_len = 1024",
                ))
            }
            None => None,
        };
        let npy =
            match r.npy {
                Some(t) => Some(sub_table::<NpyDataset>(t, "npy", kind)?),
                None if kind == DatasetKind::Npy => return Err(at(
                    "dataset.kind",
                    "kind = \"npy\" needs a [dataset.npy] table with path, dtype and shape, e.g. \
                     path = \"x_train.npy\", dtype = \"f32\" and shape = [3, 32, 32]",
                )),
                None => None,
            };
        let webdataset = match r.webdataset {
            Some(t) => Some(sub_table::<WebDatasetDataset>(t, "webdataset", kind)?),
            None if kind == DatasetKind::WebDataset => {
                return Err(at(
                    "dataset.kind",
                    "kind = \"webdataset\" needs a [dataset.webdataset] table with at \
                            least shards, e.g. shards = [\"train-000000.tar\"]",
                ))
            }
            None => None,
        };
        let imagefolder = match r.imagefolder {
            Some(t) => Some(sub_table::<ImageFolderDataset>(t, "imagefolder", kind)?),
            None if kind == DatasetKind::ImageFolder => {
                return Err(at(
                    "dataset.kind",
                    "kind = \"imagefolder\" needs a [dataset.imagefolder] table with \
                            root, e.g. root = \"imagenet/train\"",
                ))
            }
            None => None,
        };
        // `[dataset.webdataset] images = false`: no image member, so nothing to decode.
        let no_images = webdataset.as_ref().is_some_and(|w| !w.images);
        let image = match r.image {
            Some(_) if no_images => {
                return Err(at(
                    "dataset.image",
                    "[dataset.image] says how to decode the image members, and \
                     dataset.webdataset.images = false reads none: remove the table or set \
                     images = true",
                ))
            }
            Some(t) => Some(sub_table::<ImageDataset>(t, "image", kind)?),
            // The image kinds' defaults: train, 224, u8.
            None if kind.decodes_images() && !no_images => Some(ImageDataset::default()),
            None => None,
        };
        Ok(DatasetConfig {
            kind,
            // A file kind's sample count is the source's length, resolved when it is opened
            // (0 until then); one given must match it.
            samples: r.samples.unwrap_or(if file_kind { 0 } else { d.samples }),
            sample_shape: r.sample_shape.unwrap_or(d.sample_shape),
            dtype: r.dtype.unwrap_or(d.dtype),
            seed: r.seed.unwrap_or(d.seed),
            classes: r.classes.unwrap_or(d.classes),
            fields: r.fields.unwrap_or_default(),
            on_bad_sample: r.on_bad_sample.unwrap_or_default(),
            tokens,
            npy,
            webdataset,
            imagefolder,
            image,
        })
    }
}

impl From<DatasetConfig> for RawDataset {
    fn from(d: DatasetConfig) -> RawDataset {
        let file_kind = d.kind.reads_files();
        let table = |v: Result<toml::Table, toml::ser::Error>| v.ok();
        RawDataset {
            kind: Some(d.kind),
            samples: (!file_kind || d.samples != 0).then_some(d.samples),
            sample_shape: (!file_kind).then_some(d.sample_shape),
            dtype: (!file_kind).then_some(d.dtype),
            seed: (!file_kind).then_some(d.seed),
            classes: (!file_kind).then_some(d.classes),
            fields: (!d.fields.is_empty()).then_some(d.fields),
            on_bad_sample: file_kind.then_some(d.on_bad_sample),
            tokens: d
                .tokens
                .as_ref()
                .and_then(|t| table(toml::Table::try_from(t))),
            npy: d.npy.as_ref().and_then(|t| table(toml::Table::try_from(t))),
            webdataset: d
                .webdataset
                .as_ref()
                .and_then(|t| table(toml::Table::try_from(t))),
            imagefolder: d
                .imagefolder
                .as_ref()
                .and_then(|t| table(toml::Table::try_from(t))),
            image: d
                .image
                .as_ref()
                .and_then(|t| table(toml::Table::try_from(t))),
        }
    }
}
