//! Flat binary token files, as LLM pretraining writes them (`kind = "tokens"`).
//!
//! The files (`dataset.tokens.files`, in the given order) hold little-endian `u16` or `u32` tokens
//! (`dataset.tokens.token_dtype`) with no header, and are read as one concatenated stream: a window may
//! start in one file and end in the next.
//!
//! **Samples.** Sample `k` of epoch `e` is the window of `seq_len + 1` tokens starting at token
//! `offset(e) + k × stride`, and has two fields of shape `[seq_len]`:
//!
//! | field | value |
//! | --- | --- |
//! | `input_ids` | `window[..seq_len]` |
//! | `targets` | `window[1..]` |
//!
//! in `dataset.tokens.dtype`: `i64` by default (what `torch.nn.functional.cross_entropy` wants for
//! class indices), or `i32` to halve the bytes moved (a `u32` token above `i32::MAX` is then a
//! per-sample error).
//!
//! **Stride.** `stride` defaults to `seq_len`, as nanoGPT-style loaders do: window `k + 1`
//! starts at the last token of window `k`, so that token is `k`'s last target and `k + 1`'s
//! first input. Every token but the very first is then a target exactly once per epoch and none
//! is skipped, which `stride = seq_len + 1` would do (one token per window is never predicted).
//! Any `stride >= 1` is allowed (smaller strides overlap windows).
//!
//! **Shifted windows.** With `shift = true` each epoch's windows start `offset(e)` tokens into
//! the stream, `offset(e) = mix64(seed ^ mix64(e ^ C)) % stride` (0 without `shift`), so
//! successive epochs cut the stream at different places. The sample count is the same in every
//! epoch: it is the number of windows that fit after the largest offset, `stride - 1`:
//! `len = (total - max_offset - (seq_len + 1)) / stride + 1`, where `max_offset = stride - 1`
//! with `shift`, else 0.
//!
//! **Reading.** `pread` (see the crate docs); the files stay open, one descriptor each.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use pinring_data::plan::mix64;
use pinring_data::Dtype;
use serde::{Deserialize, Serialize};

use crate::{check_bufs, fixed, pread, show, FieldBuf, Source, SourceError, SourceField};

/// Name of the input field.
pub const INPUT_IDS: &str = "input_ids";
/// Name of the target field.
pub const TARGETS: &str = "targets";

/// Element type of the token files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// Little-endian `u16` (vocabularies up to 65536, e.g. GPT-2's).
    #[default]
    U16,
    /// Little-endian `u32`.
    U32,
}

impl TokenDtype {
    /// Bytes per token.
    pub const fn size_of(self) -> u64 {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// The config name.
    pub const fn name(self) -> &'static str {
        match self {
            TokenDtype::U16 => "u16",
            TokenDtype::U32 => "u32",
        }
    }
}

/// Element type of the `input_ids` and `targets` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenOutDtype {
    /// Little-endian `i64` (the default).
    #[default]
    I64,
    /// Little-endian `i32`.
    I32,
}

impl TokenOutDtype {
    /// The pinring dtype.
    pub const fn dtype(self) -> Dtype {
        match self {
            TokenOutDtype::I64 => Dtype::I64,
            TokenOutDtype::I32 => Dtype::I32,
        }
    }
}

/// The `[dataset]` keys of `kind = "tokens"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensConfig {
    /// The token files, read as one stream in this order.
    pub files: Vec<PathBuf>,
    /// Element type of the files.
    #[serde(default)]
    pub token_dtype: TokenDtype,
    /// Tokens of `input_ids` (and of `targets`) per sample (>= 1).
    pub seq_len: u32,
    /// Tokens between the starts of consecutive windows (>= 1); `None`: `seq_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<u32>,
    /// Shift each epoch's windows by a per-epoch offset in `0..stride`.
    #[serde(default)]
    pub shift: bool,
    /// Seed of the per-epoch offsets (the wiring passes `plan.seed`).
    #[serde(default)]
    pub seed: u64,
    /// Element type of the fields.
    #[serde(default)]
    pub dtype: TokenOutDtype,
}

/// Errors of [`Tokens`].
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// A key is out of range.
    #[error("invalid dataset.tokens.{key} = {value}: {allowed}")]
    Param {
        /// Key name.
        key: &'static str,
        /// Offending value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// A file cannot be opened or examined.
    #[error("cannot open token file {file}: {source}; check dataset.tokens.files")]
    Open {
        /// The file.
        file: String,
        /// The cause.
        source: io::Error,
    },
    /// A file's size is not a whole number of tokens.
    #[error("token file {file} is {bytes} bytes, not a multiple of the {token_dtype} token size ({token_bytes} bytes): it is truncated, or dataset.tokens.token_dtype is wrong; rewrite the file or fix dataset.tokens.token_dtype")]
    Size {
        /// The file.
        file: String,
        /// Its size.
        bytes: u64,
        /// `token_dtype`'s name.
        token_dtype: &'static str,
        /// Bytes per token.
        token_bytes: u64,
    },
    /// The files hold fewer tokens than one window plus the largest offset.
    #[error("the token files hold {tokens} tokens, fewer than the {need} one sample needs (seq_len + 1, plus stride - 1 with shift = true); add files or lower dataset.tokens.seq_len")]
    TooShort {
        /// Tokens in all files.
        tokens: u64,
        /// Tokens needed.
        need: u64,
    },
    /// A read failed (the file shrank or the disk failed since open).
    #[error("reading {len} bytes at byte offset {offset} of token file {file} failed: {source}; the file changed or became unreadable since the source was opened: restore it")]
    Read {
        /// The file.
        file: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The cause.
        source: io::Error,
    },
    /// A `u32` token does not fit in `i32`.
    #[error("token {value} at byte offset {offset} of token file {file} does not fit in i32; set dataset.tokens.dtype = \"i64\"")]
    Overflow {
        /// The file.
        file: String,
        /// Byte offset of the token.
        offset: u64,
        /// The token.
        value: u32,
    },
}

#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    file: File,
    /// Index of the file's first token in the stream.
    start: u64,
    /// Tokens in the file.
    tokens: u64,
}

/// An open set of token files ([`Source`] of `kind = "tokens"`).
#[derive(Debug)]
pub struct Tokens {
    files: Vec<TokenFile>,
    token_dtype: TokenDtype,
    out: TokenOutDtype,
    seq_len: u64,
    stride: u64,
    shift: bool,
    seed: u64,
    total: u64,
    len: u64,
    fields: Vec<SourceField>,
    /// Raw bytes of one window.
    scratch: Vec<u8>,
    /// Decoded tokens of one window.
    window: Vec<u32>,
}

impl Tokens {
    /// Opens the files of `config` and checks their sizes.
    pub fn open(config: &TokensConfig) -> Result<Tokens, TokensError> {
        if config.files.is_empty() {
            return Err(TokensError::Param {
                key: "files",
                value: "[]".into(),
                allowed: "list at least one token file",
            });
        }
        if config.seq_len == 0 {
            return Err(TokensError::Param {
                key: "seq_len",
                value: "0".into(),
                allowed: "must be >= 1",
            });
        }
        let stride = config.stride.unwrap_or(config.seq_len);
        if stride == 0 {
            return Err(TokensError::Param {
                key: "stride",
                value: "0".into(),
                allowed: "must be >= 1 (leave it out for seq_len)",
            });
        }
        let tsize = config.token_dtype.size_of();
        let mut files = Vec::with_capacity(config.files.len());
        let mut total = 0u64;
        for path in &config.files {
            let open_err = |source| TokensError::Open {
                file: show(path),
                source,
            };
            let file = crate::open_data_file(path).map_err(open_err)?;
            let bytes = file.metadata().map_err(open_err)?.len();
            if bytes % tsize != 0 {
                return Err(TokensError::Size {
                    file: show(path),
                    bytes,
                    token_dtype: config.token_dtype.name(),
                    token_bytes: tsize,
                });
            }
            let tokens = bytes / tsize;
            files.push(TokenFile {
                path: path.clone(),
                file,
                start: total,
                tokens,
            });
            total = total.saturating_add(tokens);
        }
        let seq_len = u64::from(config.seq_len);
        let stride = u64::from(stride);
        let window = seq_len + 1;
        let max_offset = if config.shift { stride - 1 } else { 0 };
        let need = window + max_offset;
        if total < need {
            return Err(TokensError::TooShort {
                tokens: total,
                need,
            });
        }
        let len = (total - need) / stride + 1;
        let dtype = config.dtype.dtype();
        let fields = vec![
            fixed(INPUT_IDS, dtype, vec![config.seq_len]),
            fixed(TARGETS, dtype, vec![config.seq_len]),
        ];
        Ok(Tokens {
            files,
            token_dtype: config.token_dtype,
            out: config.dtype,
            seq_len,
            stride,
            shift: config.shift,
            seed: config.seed,
            total,
            len,
            fields,
            scratch: Vec::new(),
            window: Vec::new(),
        })
    }

    /// Tokens in all files together.
    pub fn total_tokens(&self) -> u64 {
        self.total
    }

    /// First token of epoch `epoch`'s windows (0 without `shift`).
    pub fn epoch_offset(&self, epoch: u32) -> u64 {
        if self.shift {
            mix64(self.seed ^ mix64(u64::from(epoch) ^ 0x746f_6b65_6e73_6f66)) % self.stride
        } else {
            0
        }
    }

    /// Index in the stream of the first token of sample `id` in `epoch`.
    pub fn window_start(&self, epoch: u32, id: u64) -> u64 {
        self.epoch_offset(epoch) + id * self.stride
    }

    /// Reads `count` tokens from stream position `start` into `self.window`.
    fn read_tokens(&mut self, start: u64, count: u64) -> Result<(), TokensError> {
        let tsize = self.token_dtype.size_of();
        self.window.clear();
        let mut pos = start;
        let end = start + count;
        let mut i = self.files.partition_point(|f| f.start + f.tokens <= pos);
        while pos < end {
            let Some(f) = self.files.get(i) else {
                // Unreachable for ids below len(); report rather than panic.
                return Err(TokensError::TooShort {
                    tokens: self.total,
                    need: end,
                });
            };
            let n = (f.start + f.tokens).min(end) - pos;
            let offset = (pos - f.start) * tsize;
            let bytes = (n * tsize) as usize;
            self.scratch.resize(bytes, 0);
            pread(&f.file, &mut self.scratch, offset).map_err(|source| TokensError::Read {
                file: show(&f.path),
                offset,
                len: bytes as u64,
                source,
            })?;
            match self.token_dtype {
                TokenDtype::U16 => self.window.extend(
                    self.scratch
                        .chunks_exact(2)
                        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
                ),
                TokenDtype::U32 => self.window.extend(
                    self.scratch
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                ),
            }
            pos += n;
            i += 1;
        }
        Ok(())
    }

    /// File and byte offset of stream token `pos` (for messages).
    fn locate(&self, pos: u64) -> (&Path, u64) {
        let i = self.files.partition_point(|f| f.start + f.tokens <= pos);
        match self.files.get(i) {
            Some(f) => (&f.path, (pos - f.start) * self.token_dtype.size_of()),
            None => (Path::new(""), 0),
        }
    }

    fn write(&self, start: u64, tokens: &[u32], out: &mut [u8]) -> Result<(), TokensError> {
        match self.out {
            TokenOutDtype::I64 => {
                for (t, o) in tokens.iter().zip(out.chunks_exact_mut(8)) {
                    o.copy_from_slice(&i64::from(*t).to_le_bytes());
                }
            }
            TokenOutDtype::I32 => {
                for (k, (t, o)) in tokens.iter().zip(out.chunks_exact_mut(4)).enumerate() {
                    let v = i32::try_from(*t).map_err(|_| {
                        let (file, offset) = self.locate(start + k as u64);
                        TokensError::Overflow {
                            file: show(file),
                            offset,
                            value: *t,
                        }
                    })?;
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        Ok(())
    }
}

impl Source for Tokens {
    fn len(&self) -> u64 {
        self.len
    }

    fn fields(&self) -> &[SourceField] {
        &self.fields
    }

    fn read(&mut self, epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError> {
        check_bufs(&self.fields, out)?;
        if id >= self.len {
            return Err(SourceError::OutOfRange { id, len: self.len });
        }
        let start = self.window_start(epoch, id);
        self.read_tokens(start, self.seq_len + 1)?;
        let window = std::mem::take(&mut self.window);
        let n = self.seq_len as usize;
        let result = (|| {
            if let [FieldBuf::Fixed(inputs), FieldBuf::Fixed(targets)] = out {
                self.write(start, &window[..n], inputs)?;
                self.write(start + 1, &window[1..], targets)?;
            }
            Ok::<(), TokensError>(())
        })();
        self.window = window;
        Ok(result?)
    }
}
