//! pinring-sources: readers of standard training-data formats for pinring's loaders.
//!
//! A [`Source`] is opened from its `[dataset]` config section ([`SourceConfig`], keys in
//! `docs/FORMATS.md`), reports how many samples it has ([`Source::len`]) and their named fields
//! ([`Source::fields`]), and writes sample `id`'s fields into buffers the caller provides
//! ([`Source::read`]): a fixed-size field into a buffer of exactly its per-sample bytes
//! (pinring's loader passes a per-sample buffer, then copies it into the sample's place in the
//! slot), an encoded field (image file bytes, JSON text) into a reused `Vec<u8>`.
//!
//! * [`tokens`] -- flat binary token files (`u16`/`u32`), windows of `seq_len + 1` tokens.
//! * [`npy`] -- one `.npy` array (first axis = samples) or a directory of per-sample `.npy` files.
//! * [`webdataset`] -- WebDataset tar shards, with a per-rank streaming shuffle.
//! * [`imagefolder`] -- `root/class/*.jpg`, in torchvision `ImageFolder`'s order.
//! * [`images`] -- [`Decoded`]: the encoded images of the two above decoded and transformed by
//!   pinring-image into the fixed `images` field (`[dataset.image]`).
//!
//! **Reading.** Every reader uses positioned reads (`pread`, [`std::os::unix::fs::FileExt`])
//! rather than memory maps: a sample is copied into the caller's buffer either way, so a map
//! saves one system call per sample at most, while a file truncated underneath a map raises
//! `SIGBUS`, which pinring's loaders handle for ring mappings only. With `pread` a truncated file
//! is an ordinary, typed error. The crate has no `unsafe` code.
//!
//! **Bad data.** Opening checks what can be checked once (files exist, sizes, headers, shapes);
//! an error there fails the open. Everything found while reading one sample is a per-sample
//! [`SourceError`] naming the file, the member and the byte offset, so that the caller applies
//! its `on_bad_sample` policy ([`OnBadSample`]): stop, or write zeros in its place. No input
//! makes a reader panic.

#![forbid(unsafe_code)]

pub mod imagefolder;
pub mod images;
pub mod npy;
pub mod tokens;
pub mod webdataset;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use pinring_data::{Dtype, Field};
use serde::{Deserialize, Serialize};

pub use imagefolder::{ImageFolder, ImageFolderConfig, ImageFolderError};
pub use images::{Decoded, Planned};
pub use npy::{NpyConfig, NpyDtype, NpyError, NpyHeader, NpySource};
pub use tokens::{TokenDtype, TokenOutDtype, Tokens, TokensConfig, TokensError};
pub use webdataset::{WdsConfig, WdsError, WdsNpy, WebDataset};

/// One named field of every sample of a [`Source`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SourceField {
    /// The same dtype and shape in every sample: [`Source::read`] writes exactly
    /// [`Field::sample_bytes`] little-endian bytes into a [`FieldBuf::Fixed`].
    Fixed(Field),
    /// Bytes of a different length in each sample (an encoded image, JSON text): [`Source::read`]
    /// replaces the contents of a [`FieldBuf::Bytes`]. A later stage decodes them.
    Encoded {
        /// The field's name.
        name: String,
    },
}

impl SourceField {
    /// The field's name.
    pub fn name(&self) -> &str {
        match self {
            SourceField::Fixed(f) => &f.name,
            SourceField::Encoded { name } => name,
        }
    }

    /// The fixed field, or `None` for an encoded one.
    pub fn fixed(&self) -> Option<&Field> {
        match self {
            SourceField::Fixed(f) => Some(f),
            SourceField::Encoded { .. } => None,
        }
    }
}

/// Where [`Source::read`] puts one field of a sample; one per field, in [`Source::fields`] order.
#[derive(Debug)]
pub enum FieldBuf<'a> {
    /// For a [`SourceField::Fixed`] field: exactly its per-sample bytes (pinring's loader passes
    /// a per-sample buffer, then copies it into the sample's place in the slot).
    Fixed(&'a mut [u8]),
    /// For a [`SourceField::Encoded`] field: cleared and filled (its capacity is reused).
    Bytes(&'a mut Vec<u8>),
}

/// What the caller does with a sample whose read failed (`dataset.on_bad_sample`; pinring-data's
/// [`pinring_data::OnBadSample`]). The readers only report ([`SourceError`]); the loader applies
/// the policy.
pub use pinring_data::OnBadSample;

/// A dataset in some format, opened in one loader process.
///
/// `Send`, so a loader may move it to a worker thread; each worker opens its own (opening reads
/// only headers and directory listings).
pub trait Source: Send + std::fmt::Debug {
    /// Number of samples: ids are `0..len()`, the same in every epoch.
    fn len(&self) -> u64;

    /// Whether the source has no samples (openers refuse an empty dataset, so normally false).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fields of every sample, in order.
    fn fields(&self) -> &[SourceField];

    /// Writes the fields of sample `id` as seen in `epoch` (only [`tokens`] with shifted windows
    /// looks at the epoch) into `out`, one buffer per field in [`Source::fields`] order.
    ///
    /// An error concerns this sample only (unless it is [`SourceError::Buffers`], a caller
    /// bug): the source stays usable, and the caller applies its [`OnBadSample`] policy.
    fn read(&mut self, epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError>;

    /// Writes bytes `offset .. offset + out.len()` of field `field` (an index in
    /// [`Source::fields`]) of sample `id` as seen in `epoch` into `out`: a byte part of a sample
    /// too large for one ring slot (pinring-data's `SampleCut`). Only sources of a kind whose
    /// config cuts samples implement it (`npy`, with one `pread` of just those bytes); the
    /// others make whole samples only, and their configs never ask for a byte part, so the
    /// default refuses with [`SourceError::Buffers`] (a caller's mistake).
    fn read_range(
        &mut self,
        epoch: u32,
        id: u64,
        field: usize,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), SourceError> {
        let _ = (epoch, id, offset);
        Err(SourceError::Buffers {
            problem: format!(
                "a byte range ({} bytes) of field {field} was asked of a source that makes whole \
                 samples only; only kind = \"npy\" (and \"synthetic\") samples are cut into \
                 byte parts",
                out.len()
            ),
        })
    }

    /// Where sample `id`'s encoded field lies, for messages ("shard a.tar, member \"k.jpg\" at
    /// byte offset 1536", "image file root/cat/1.png"); `None` where the reader has no such field
    /// or the id is out of range.
    fn locate(&self, id: u64) -> Option<String> {
        let _ = id;
        None
    }

    /// Sample `id`'s file (its index among the source's files: a shard, an image file) and the
    /// byte offset of its member in that file, for an encoded sample's entry (pinring-data's
    /// `EncodedEntry`), whose decoder names them when the bytes do not decode; `None` where
    /// the reader has no such place.
    fn origin(&self, id: u64) -> Option<(u32, u64)> {
        let _ = id;
        None
    }

    /// Samples in each shard, in shard order, for a source whose plan follows its shards
    /// ([`WebDataset`]; the config records them, `dataset.webdataset.shard_samples`); `None`
    /// for the others.
    fn shard_sizes(&self) -> Option<&[u64]> {
        None
    }
}

/// A per-sample error of any [`Source`], or a caller mistake.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// From [`tokens`].
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// From [`npy`].
    #[error(transparent)]
    Npy(#[from] NpyError),
    /// From [`webdataset`].
    #[error(transparent)]
    WebDataset(#[from] WdsError),
    /// From [`imagefolder`].
    #[error(transparent)]
    ImageFolder(#[from] ImageFolderError),
    /// An encoded image could not be made into a sample ([`Decoded`]): corrupt, truncated,
    /// unsupported or too large.
    #[error("{at}: {source}")]
    Image {
        /// The file or shard member ([`Source::locate`]).
        at: String,
        /// What went wrong.
        source: pinring_image::ImageError,
    },
    /// The caller's buffers do not match [`Source::fields`].
    #[error("buffers do not match the source's fields: {problem}; pass one FieldBuf per field in fields() order, Fixed with exactly the field's per-sample bytes, Bytes for an encoded field")]
    Buffers {
        /// What is wrong.
        problem: String,
    },
    /// The files do not have the fields the config declares.
    #[error("{problem}")]
    Declared {
        /// What differs, naming the file and the key.
        problem: String,
    },
    /// Sample id out of range.
    #[error("sample id {id} is out of range: the source has {len} samples; the plan and the source disagree, check dataset.samples against the files")]
    OutOfRange {
        /// Requested id.
        id: u64,
        /// Number of samples.
        len: u64,
    },
}

/// The `[dataset]` section of a source, tagged by `kind` (keys in `docs/FORMATS.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SourceConfig {
    /// `kind = "tokens"`.
    Tokens(TokensConfig),
    /// `kind = "npy"`.
    Npy(NpyConfig),
    /// `kind = "webdataset"`.
    WebDataset(WdsConfig),
    /// `kind = "imagefolder"`.
    ImageFolder(ImageFolderConfig),
}

impl SourceConfig {
    /// Opens the source the section describes.
    pub fn open(&self) -> Result<Box<dyn Source>, SourceError> {
        Ok(match self {
            SourceConfig::Tokens(c) => Box::new(Tokens::open(c)?),
            SourceConfig::Npy(c) => Box::new(NpySource::open(c)?),
            SourceConfig::WebDataset(c) => Box::new(WebDataset::open(c)?),
            SourceConfig::ImageFolder(c) => Box::new(ImageFolder::open(c)?),
        })
    }
}

/// Opens the source of a file kind of `cfg` (`kind = "tokens"`, `"npy"`, `"webdataset"` or
/// `"imagefolder"`; `None` for the other kinds), with relative paths resolved against the config
/// file's directory ([`pinring_data::Config::resolve_path`]) and, for tokens, the shifted windows
/// seeded by `plan.seed`. The image kinds' images are decoded as `[dataset.image]` says
/// ([`Decoded`], the train transform seeded by `plan.seed`; none with `[dataset.webdataset]
/// images = false`), and webdataset's `npy` members are read into the field `npy` declares. The
/// source's fields are checked against the config's ([`pinring_data::Config::fields`]): npy's
/// declared dtype and shape are checked against every file, and so are the labels'.
pub fn open_dataset(cfg: &pinring_data::Config) -> Option<Result<Box<dyn Source>, SourceError>> {
    let d = &cfg.dataset;
    let opened: Result<Box<dyn Source>, SourceError> = if let Some(t) = &d.tokens {
        let token_dtype = match t.token_dtype {
            Dtype::U32 => TokenDtype::U32,
            _ => TokenDtype::U16,
        };
        let dtype = match t.dtype {
            Dtype::I32 => TokenOutDtype::I32,
            _ => TokenOutDtype::I64,
        };
        let c = TokensConfig {
            files: t.files.iter().map(|f| cfg.resolve_path(f)).collect(),
            token_dtype,
            seq_len: t.seq_len,
            stride: t.stride,
            shift: t.shift,
            seed: cfg.plan.seed,
            dtype,
        };
        Tokens::open(&c)
            .map(|s| Box::new(s) as Box<dyn Source>)
            .map_err(Into::into)
    } else if let Some(n) = &d.npy {
        let c = NpyConfig {
            path: cfg.resolve_path(&n.path),
            field: n.field.clone(),
            dtype: NpyDtype::from_dtype(n.dtype),
            shape: Some(n.shape.clone()),
            labels: n.labels.as_ref().map(|l| cfg.resolve_path(l)),
        };
        NpySource::open(&c)
            .map(|s| Box::new(s) as Box<dyn Source>)
            .map_err(Into::into)
    } else if let Some(w) = &d.webdataset {
        // The config's fields: [images], labels, [npy field] (`Config::fields`).
        let mut fields = Vec::with_capacity(3);
        if w.images {
            fields.push(webdataset::WdsField::Image);
        }
        fields.push(webdataset::WdsField::Cls);
        let mut npy = None;
        if let Some(n) = &w.npy {
            let Some(dtype) = NpyDtype::from_dtype(n.dtype) else {
                return Some(Err(SourceError::Declared {
                    problem: format!(
                        "dataset.webdataset.npy.dtype = \"{}\" has no numpy dtype; declare the \
                         members' dtype (u8, i8, ..., f16, f32, f64, bool)",
                        n.dtype
                    ),
                }));
            };
            fields.push(webdataset::WdsField::Npy);
            npy = Some(webdataset::WdsNpy {
                field: n.field.clone(),
                dtype,
                shape: n.shape.clone(),
            });
        }
        let c = WdsConfig {
            shards: w.shards.iter().map(|f| cfg.resolve_path(f)).collect(),
            fields,
            shuffle_buffer: usize::try_from(w.shuffle_buffer).unwrap_or(usize::MAX),
            npy,
        };
        WebDataset::open(&c)
            .map_err(SourceError::from)
            .and_then(|s| match &d.image {
                Some(image) if w.images => decoded(Box::new(s), image, cfg.plan.seed),
                _ => Ok(Box::new(s) as Box<dyn Source>),
            })
    } else if let (Some(f), Some(image)) = (&d.imagefolder, &d.image) {
        let c = ImageFolderConfig {
            root: cfg.resolve_path(&f.root),
            extensions: f.extensions.clone(),
        };
        ImageFolder::open(&c)
            .map_err(SourceError::from)
            .and_then(|s| decoded(Box::new(s), image, cfg.plan.seed))
    } else {
        return None;
    };
    Some(opened.and_then(|src| {
        let want = cfg.fields();
        let got: Vec<Option<&Field>> = src.fields().iter().map(SourceField::fixed).collect();
        for (k, w) in want.iter().enumerate() {
            // An encoded images field (decode = "gpu") is decoded into `w` on copy.
            let encoded = cfg.batch_layout().fields.get(k).is_some_and(|p| p.encoded);
            if encoded && matches!(src.fields().get(k), Some(SourceField::Encoded { name }) if *name == w.name) {
                continue;
            }
            if got.get(k).copied().flatten() != Some(w) {
                let found = match got.get(k).copied().flatten() {
                    Some(f) => format!("{} of shape {:?}", f.dtype, f.shape),
                    None => "nothing".to_string(),
                };
                let what = match (&d.npy, w.name.as_str()) {
                    (Some(n), pinring_data::LABELS) if n.labels.is_some() => format!(
                        "labels file {} holds {found} per sample; dataset.npy.labels_dtype and \
                         labels_shape declare {} of shape {:?}: fix them or the file",
                        cfg.resolve_path(n.labels.as_deref().unwrap_or(Path::new("")))
                            .display(),
                        w.dtype,
                        w.shape
                    ),
                    _ => format!(
                        "the {} files give field {:?} as {found}, the config declares {} of \
                         shape {:?}",
                        d.kind, w.name, w.dtype, w.shape
                    ),
                };
                return Err(SourceError::Declared { problem: what });
            }
        }
        Ok(src)
    }))
}

/// `inner`'s encoded images made as `image` says: decoded here (decode = "cpu",
/// [`Decoded`]) or kept encoded with their crops drawn, for a decode on copy ([`Planned`]).
fn decoded(
    inner: Box<dyn Source>,
    image: &pinring_data::ImageDataset,
    seed: u64,
) -> Result<Box<dyn Source>, SourceError> {
    Ok(match image.decode {
        pinring_data::ImageDecode::Cpu => Box::new(Decoded::new(inner, image, seed)?),
        pinring_data::ImageDecode::Gpu => Box::new(images::Planned::new(inner, image, seed)?),
        // A loader's own config before it joins: opened for its length, and opened again if
        // the ring's daemon resolved it to the GPU (the loader adopts the daemon's choice).
        pinring_data::ImageDecode::Auto => Box::new(Decoded::new(inner, image, seed)?),
    })
}

/// Checks `out` against `fields`: one buffer per field, `Fixed` ones of the exact size.
pub(crate) fn check_bufs(fields: &[SourceField], out: &[FieldBuf<'_>]) -> Result<(), SourceError> {
    if fields.len() != out.len() {
        return Err(SourceError::Buffers {
            problem: format!("{} buffers for {} fields", out.len(), fields.len()),
        });
    }
    for (f, b) in fields.iter().zip(out) {
        match (f, b) {
            (SourceField::Fixed(f), FieldBuf::Fixed(b)) => {
                if b.len() as u64 != f.sample_bytes() {
                    return Err(SourceError::Buffers {
                        problem: format!(
                            "field {:?} takes {} bytes per sample, its buffer has {}",
                            f.name,
                            f.sample_bytes(),
                            b.len()
                        ),
                    });
                }
            }
            (SourceField::Encoded { .. }, FieldBuf::Bytes(_)) => {}
            (f, _) => {
                return Err(SourceError::Buffers {
                    problem: format!("field {:?} got the wrong kind of buffer", f.name()),
                })
            }
        }
    }
    Ok(())
}

/// Opens a data file for reading so that opening cannot block, and refuses what is not a
/// regular file.
///
/// A named pipe (FIFO) blocks a plain `open()` until a writer appears, and no signal ends that
/// wait; a device or a socket is no dataset either. So the file is opened with `O_NONBLOCK`
/// (which changes nothing for a regular file's reads), then `fstat` says what was opened: a
/// directory, FIFO, socket or device is refused with an [`io::ErrorKind::InvalidInput`] error
/// that says what it is, which each reader's open error then names with its file and key.
/// Checking the opened file, not the path, leaves no window for a swap between check and use.
pub fn open_data_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let refuse =
        |what: &'static str| io::Error::new(io::ErrorKind::InvalidInput, NotAFile { what });
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
    {
        Ok(file) => file,
        // A socket cannot be opened at all (ENXIO): say what it is rather than
        // "no such device or address".
        Err(e) => {
            return Err(
                match std::fs::metadata(path).map(|m| not_a_file(m.file_type())) {
                    Ok(Some(what)) => refuse(what),
                    _ => e,
                },
            )
        }
    };
    match not_a_file(file.metadata()?.file_type()) {
        None => Ok(file),
        Some(what) => Err(refuse(what)),
    }
}

/// [`open_data_file`]'s refusal of what is not a regular file: the inner error of its
/// [`io::ErrorKind::InvalidInput`] error ([`NotAFile::of`] finds it), so that a reader can say
/// more where a directory was given for a file (a WebDataset shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("it is {what}, not a regular file")]
pub struct NotAFile {
    /// What it is, in words ("a directory", "a named pipe (FIFO)", ...).
    pub what: &'static str,
}

impl NotAFile {
    /// The refusal inside `e`, if [`open_data_file`] refused a file that is not a regular one.
    pub fn of(e: &io::Error) -> Option<NotAFile> {
        e.get_ref()?.downcast_ref::<NotAFile>().copied()
    }

    /// Whether it is a directory.
    pub fn is_dir(self) -> bool {
        self.what == DIRECTORY
    }
}

/// [`not_a_file`]'s words for a directory.
const DIRECTORY: &str = "a directory";

/// What a file of type `kind` is, in words, when it is not a regular file.
pub(crate) fn not_a_file(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some(DIRECTORY)
    } else if kind.is_fifo() {
        Some("a named pipe (FIFO)")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else {
        Some("a special file")
    }
}

/// Reads exactly `buf.len()` bytes at `offset` of `file`; a short file reads as
/// [`io::ErrorKind::UnexpectedEof`].
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// Reads as many bytes as there are (up to `buf.len()`) at `offset`; returns how many.
pub(crate) fn pread_some(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// `path` for messages.
pub(crate) fn show(path: &Path) -> String {
    path.display().to_string()
}

/// A fixed field of `name`, `dtype` and `shape`.
pub(crate) fn fixed(name: &str, dtype: Dtype, shape: Vec<u32>) -> SourceField {
    SourceField::Fixed(Field::new(name, dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send<T: Send>() {}

    #[test]
    fn sources_are_send() {
        send::<Tokens>();
        send::<NpySource>();
        send::<WebDataset>();
        send::<ImageFolder>();
        send::<Box<dyn Source>>();
        send::<SourceError>();
    }

    #[test]
    fn buffers_are_checked() {
        let fields = vec![
            fixed("a", Dtype::I64, vec![2]),
            SourceField::Encoded { name: "b".into() },
        ];
        let (mut a, mut b) = ([0u8; 16], Vec::new());
        assert!(check_bufs(&fields, &[FieldBuf::Fixed(&mut a), FieldBuf::Bytes(&mut b)]).is_ok());
        let mut short = [0u8; 15];
        let e = check_bufs(
            &fields,
            &[FieldBuf::Fixed(&mut short), FieldBuf::Bytes(&mut b)],
        );
        assert!(matches!(e, Err(SourceError::Buffers { .. })));
        let e = check_bufs(&fields, &[FieldBuf::Fixed(&mut a)]);
        assert!(matches!(e, Err(SourceError::Buffers { .. })));
        let mut c = Vec::new();
        let e = check_bufs(&fields, &[FieldBuf::Bytes(&mut c), FieldBuf::Bytes(&mut b)]);
        assert!(matches!(e, Err(SourceError::Buffers { .. })));
    }

    fn config_in(dir: &Path, text: &str) -> pinring_data::Config {
        let p = dir.join("pinring.toml");
        std::fs::write(&p, text).unwrap();
        pinring_data::Config::load(&p).unwrap()
    }

    #[test]
    fn shard_globs_expand_sorted_relative_as_written_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("wds")).unwrap();
        for n in ["b-10.tar", "b-2.tar", "a.tar", "b-1.tar", "b.txt"] {
            std::fs::write(dir.path().join("wds").join(n), "").unwrap();
        }
        let cfg = config_in(
            dir.path(),
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\n\
             shards = [\"wds/a.tar\", \"wds/b-*.tar\"]\n",
        );
        let got = expand_shard_globs(&cfg).unwrap().unwrap();
        let want: Vec<std::path::PathBuf> =
            ["wds/a.tar", "wds/b-1.tar", "wds/b-10.tar", "wds/b-2.tar"]
                .iter()
                .map(Into::into)
                .collect();
        assert_eq!(got, want);
        let abs = format!("{}/wds/b-?.tar", dir.path().display());
        let cfg = config_in(
            dir.path(),
            &format!(
                "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"{abs}\"\n"
            ),
        );
        let got = expand_shard_globs(&cfg).unwrap().unwrap();
        assert_eq!(
            got,
            [
                dir.path().join("wds/b-1.tar"),
                dir.path().join("wds/b-2.tar")
            ]
        );
        let cfg = config_in(
            dir.path(),
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"wds/c-*.tar\"\n",
        );
        let e = expand_shard_globs(&cfg).unwrap_err().to_string();
        for needle in [
            "\"wds/c-*.tar\"",
            "matches no file",
            &dir.path().display().to_string(),
        ] {
            assert!(e.contains(needle), "{e} lacks {needle:?}");
        }
        // No glob: nothing to expand.
        let cfg = config_in(
            dir.path(),
            "[dataset]\nkind = \"webdataset\"\n[dataset.webdataset]\nshards = \"wds/a.tar\"\n",
        );
        assert!(expand_shard_globs(&cfg).unwrap().is_none());
    }

    #[test]
    fn a_relative_path_in_a_message_is_named_as_written_with_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config_in(
            dir.path(),
            "[dataset]\nkind = \"tokens\"\n[dataset.tokens]\nfiles = [\"t/a.bin\", \"t/a.bin.1\", \"/abs/b.bin\"]\nseq_len = 2\n",
        );
        let d = dir.path().display();
        let m = name_relative_paths(
            &cfg,
            &format!(
                "cannot open token file {d}/t/a.bin.1: gone; and {d}/t/a.bin. Also /abs/b.bin"
            ),
        );
        assert_eq!(
            m,
            format!(
                "cannot open token file t/a.bin.1 (relative to {d}, the folder of the config \
                 file): gone; and t/a.bin (relative to {d}, the folder of the config file). Also \
                 /abs/b.bin"
            )
        );
        let cfg = config_in(
            dir.path(),
            "[dataset]\nkind = \"imagefolder\"\n[dataset.imagefolder]\nroot = \"train\"\n",
        );
        let m = name_relative_paths(
            &cfg,
            &format!("cannot list directory {d}/train/cat: denied"),
        );
        assert_eq!(
            m,
            format!(
                "cannot list directory train/cat: denied (dataset.imagefolder.root train \
                 (relative to {d}, the folder of the config file))"
            )
        );
    }

    #[test]
    fn a_shard_that_is_a_directory_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = WebDataset::open(&WdsConfig {
            shards: vec![dir.path().to_path_buf()],
            fields: vec![webdataset::WdsField::Cls],
            shuffle_buffer: 0,
            npy: None,
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("is a directory, not a tar file") && e.contains("/*.tar\""),
            "{e}"
        );
    }

    #[test]
    fn on_bad_sample_parses() {
        #[derive(Deserialize)]
        struct S {
            on_bad_sample: OnBadSample,
        }
        let s: S = toml::from_str("on_bad_sample = \"skip\"").unwrap();
        assert_eq!(s.on_bad_sample, OnBadSample::Skip);
    }
}

/// [`open_dataset`], its error a config error naming the config, the kind, the file and the
/// problem, and for a file given by a relative path, the folder it was resolved against
/// ([`name_relative_paths`]).
fn open_as_config(
    cfg: &pinring_data::Config,
) -> Result<Option<Box<dyn Source>>, pinring_data::ConfigError> {
    open_dataset(cfg)
        .transpose()
        .map_err(|e| pinring_data::ConfigError::Dataset {
            source_name: cfg.source.clone(),
            kind: cfg.dataset.kind,
            message: name_relative_paths(cfg, &e.to_string()),
        })
}

/// `message` (a reader's error, naming files by the paths they were opened at) with each file
/// that the config gives by a relative path named as written and with the folder it was
/// resolved against: `data/train.bin (relative to /srv/run, the folder of the config file)`. A
/// file inside such a path (an image under `dataset.imagefolder.root`) gets the same said of
/// the path, once, at the end.
pub fn name_relative_paths(cfg: &pinring_data::Config, message: &str) -> String {
    let path_char = |c: char| c.is_alphanumeric() || matches!(c, '/' | '.' | '-' | '_' | '~');
    let mut out = message.to_string();
    let mut notes = Vec::new();
    let mut paths: Vec<(&str, &Path)> = cfg
        .dataset_paths()
        .into_iter()
        .filter(|(_, p)| p.is_relative() && !p.as_os_str().is_empty())
        .collect();
    // The longest first, so that "a/b.bin" is not found inside "a/b.bin.1".
    paths.sort_by_key(|(_, p)| std::cmp::Reverse(p.as_os_str().len()));
    let mut seen = std::collections::HashSet::new();
    paths.retain(|(_, p)| seen.insert(*p));
    for (key, written) in paths {
        let resolved = cfg.resolve_path(written).display().to_string();
        let named = format!(
            "{} (relative to {})",
            written.display(),
            cfg.paths_relative_to()
        );
        let (mut from, mut named_once, mut inside) = (0, false, false);
        while let Some(i) = out[from..].find(&resolved).map(|i| i + from) {
            let end = i + resolved.len();
            let before = out[..i].chars().next_back();
            let after = out[end..].chars().next();
            // A path followed by "." ends a sentence only when nothing of a path follows.
            let ends = match after {
                None => true,
                Some('.') => !out[end + 1..].chars().next().is_some_and(path_char),
                Some(c) => !path_char(c),
            };
            let with = if before.is_some_and(path_char) {
                None
            } else if ends {
                named_once = true;
                Some(named.clone())
            } else if after == Some('/') {
                // A file inside it: named under the path as written.
                inside = true;
                Some(written.display().to_string())
            } else {
                None
            };
            match with {
                Some(w) => {
                    out.replace_range(i..end, &w);
                    from = i + w.len();
                }
                None => from = end,
            }
        }
        if inside && !named_once {
            notes.push(format!("{key} {named}"));
        }
    }
    if !notes.is_empty() {
        out = format!("{out} ({})", notes.join("; "));
    }
    out
}

/// The shards of a WebDataset config with every glob (`"train-*.tar"`) expanded, each into the
/// files it matches in lexicographic order, resolved as relative paths are (against the config
/// file's folder) and written back as the config wrote the pattern (relative stays relative).
/// `None`: no glob (or not a WebDataset). A glob that matches nothing, or that is not a valid
/// pattern, is an error naming it and the folder it was resolved against.
pub fn expand_shard_globs(
    cfg: &pinring_data::Config,
) -> Result<Option<Vec<std::path::PathBuf>>, pinring_data::ConfigError> {
    let Some(w) = cfg
        .dataset
        .webdataset
        .as_ref()
        .filter(|_| cfg.dataset.kind == pinring_data::DatasetKind::WebDataset)
    else {
        return Ok(None);
    };
    if !w.shards.iter().any(|p| pinring_data::dataset::is_glob(p)) {
        return Ok(None);
    }
    let refuse = |message: String| pinring_data::ConfigError::Dataset {
        source_name: cfg.source.clone(),
        kind: cfg.dataset.kind,
        message,
    };
    let mut out = Vec::new();
    for entry in &w.shards {
        if !pinring_data::dataset::is_glob(entry) {
            out.push(entry.clone());
            continue;
        }
        let pattern = cfg.resolve_path(entry);
        let shown = || {
            format!(
                "the glob {:?} of dataset.webdataset.shards (relative to {})",
                entry.display().to_string(),
                cfg.paths_relative_to()
            )
        };
        let text = pattern.to_str().ok_or_else(|| {
            refuse(format!(
                "{} is not UTF-8, which a glob must be: name the shards",
                shown()
            ))
        })?;
        let matches = glob::glob(text).map_err(|e| {
            refuse(format!(
                "{} is not a valid glob: {e}; use * ? and [...] as the shell does, or name the \
                 shards",
                shown()
            ))
        })?;
        let mut found = Vec::new();
        for m in matches {
            let path = m.map_err(|e| {
                refuse(format!(
                    "{}: cannot read {}: {}; check the folder's permissions",
                    shown(),
                    e.path().display(),
                    e.error()
                ))
            })?;
            // As the pattern was written: a relative pattern's matches relative to the same
            // folder.
            let written = match &cfg.base_dir {
                Some(base) if entry.is_relative() => path
                    .strip_prefix(base)
                    .map(Path::to_path_buf)
                    .unwrap_or(path),
                _ => path,
            };
            found.push(written);
        }
        if found.is_empty() {
            return Err(refuse(format!(
                "{} matches no file; fix the pattern or the folder, or name the shards",
                shown()
            )));
        }
        found.sort();
        out.extend(found);
    }
    Ok(Some(out))
}

/// Opens the source of a file kind ([`open_dataset`]; `None` for the other kinds) and records
/// its length as `dataset.samples` ([`pinring_data::Config::set_source_len`]), and for
/// `"webdataset"` its shards' sample counts as `dataset.webdataset.shard_samples`
/// ([`pinring_data::Config::set_shard_samples`], the plan's shard order follows them): each
/// loader process does so once, before it checks its fingerprint against the ring's. An error
/// names the file.
pub fn open_source(
    cfg: &mut pinring_data::Config,
) -> Result<Option<Box<dyn Source>>, pinring_data::ConfigError> {
    if let Some(shards) = expand_shard_globs(cfg)? {
        cfg.set_shards(shards)?;
    }
    let Some(src) = open_as_config(cfg)? else {
        return Ok(None);
    };
    if let Some(sizes) = src.shard_sizes() {
        cfg.set_shard_samples(sizes)?;
    }
    cfg.set_source_len(src.len())?;
    Ok(Some(src))
}

/// The dataset's files, opened to resolve a config ([`pinring_data::Spec::resolve`]): what
/// the daemon, `pinring config check` and Python's `check_config` resolve with, so all three
/// find the same length and shard sizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Files;

impl pinring_data::DatasetOpener for Files {
    fn open(
        &self,
        cfg: &pinring_data::Config,
    ) -> Result<Option<pinring_data::OpenedDataset>, pinring_data::ConfigError> {
        let shards = expand_shard_globs(cfg)?;
        let expanded;
        let cfg = match &shards {
            Some(list) => {
                let mut c = cfg.clone();
                c.set_shards(list.clone())?;
                expanded = c;
                &expanded
            }
            None => cfg,
        };
        let Some(src) = open_as_config(cfg)? else {
            return Ok(None);
        };
        Ok(Some(pinring_data::OpenedDataset {
            len: src.len(),
            shard_sizes: src.shard_sizes().map(<[u64]>::to_vec),
            shards,
        }))
    }
}
