//! The keys of the file kinds of `[dataset]`: `[dataset.tokens]` ([`TokensDataset`]) and
//! `[dataset.npy]` ([`NpyDataset`]), `dataset.on_bad_sample` ([`OnBadSample`]), and how the
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
}

/// The kind's config spelling, quoted.
fn q(kind: DatasetKind) -> String {
    format!("kind = \"{}\"", kind.as_str())
}

/// Reads `[dataset.<name>]` into `T`, refusing a key of the other file kind's table by name.
fn sub_table<T: serde::de::DeserializeOwned>(
    table: toml::Table,
    name: &str,
    own: &[&str],
    other: (&str, &[&str]),
) -> Result<T, String> {
    for key in table.keys() {
        if own.contains(&key.as_str()) {
            continue;
        }
        if other.1.contains(&key.as_str()) {
            return Err(format!(
                "dataset.{name}.{key} is a key of kind = \"{o}\" ([dataset.{o}]), not of kind = \
                 \"{name}\"; [dataset.{name}] takes {}",
                own.join(", "),
                o = other.0,
            ));
        }
        return Err(format!(
            "unknown key dataset.{name}.{key}; [dataset.{name}] takes {}",
            own.join(", ")
        ));
    }
    T::deserialize(toml::Value::Table(table)).map_err(|e| format!("[dataset.{name}]: {e}"))
}

impl TryFrom<RawDataset> for DatasetConfig {
    type Error = String;

    fn try_from(r: RawDataset) -> Result<DatasetConfig, String> {
        let d = DatasetConfig::default();
        let kind = r.kind.unwrap_or_default();
        let file_kind = matches!(kind, DatasetKind::Tokens | DatasetKind::Npy);
        if file_kind {
            let synthetic = [
                ("sample_shape", r.sample_shape.is_some()),
                ("dtype", r.dtype.is_some()),
                ("seed", r.seed.is_some()),
                ("classes", r.classes.is_some()),
            ];
            if let Some((key, _)) = synthetic.iter().find(|(_, given)| *given) {
                return Err(format!(
                    "dataset.{key} is a key of kind = \"synthetic\", and this dataset has {}: \
                     remove it (the fields of its samples come from [dataset.{}]{})",
                    q(kind),
                    kind.as_str(),
                    if *key == "seed" {
                        "; the shifted windows of kind = \"tokens\" use plan.seed"
                    } else {
                        ""
                    }
                ));
            }
            if r.fields.is_some() {
                return Err(format!(
                    "dataset.fields is a key of kind = \"external\", and this dataset has {}: \
                     remove it (the fields of its samples come from [dataset.{}])",
                    q(kind),
                    kind.as_str()
                ));
            }
        } else if r.on_bad_sample.is_some() {
            return Err(format!(
                "dataset.on_bad_sample is a key of the file kinds (\"tokens\", \"npy\"), and this \
                 dataset has {}: remove it",
                q(kind)
            ));
        }
        for (name, given, owner) in [
            ("tokens", r.tokens.is_some(), DatasetKind::Tokens),
            ("npy", r.npy.is_some(), DatasetKind::Npy),
        ] {
            if given && kind != owner {
                return Err(format!(
                    "[dataset.{name}] holds the keys of kind = \"{name}\", and this dataset has \
                     {}: remove the table or set dataset.kind = \"{name}\"",
                    q(kind)
                ));
            }
        }
        let tokens = match r.tokens {
            Some(t) => Some(sub_table::<TokensDataset>(
                t,
                "tokens",
                TOKENS_KEYS,
                ("npy", NPY_KEYS),
            )?),
            None if kind == DatasetKind::Tokens => {
                return Err(
                    "kind = \"tokens\" needs a [dataset.tokens] table with at least files and \
                     seq_len, e.g. files = [\"train.bin\"] and seq_len = 1024"
                        .into(),
                )
            }
            None => None,
        };
        let npy =
            match r.npy {
                Some(t) => Some(sub_table::<NpyDataset>(
                    t,
                    "npy",
                    NPY_KEYS,
                    ("tokens", TOKENS_KEYS),
                )?),
                None if kind == DatasetKind::Npy => return Err(
                    "kind = \"npy\" needs a [dataset.npy] table with path, dtype and shape, e.g. \
                     path = \"x_train.npy\", dtype = \"f32\" and shape = [3, 32, 32]"
                        .into(),
                ),
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
        })
    }
}

impl From<DatasetConfig> for RawDataset {
    fn from(d: DatasetConfig) -> RawDataset {
        let file_kind = matches!(d.kind, DatasetKind::Tokens | DatasetKind::Npy);
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
        }
    }
}
