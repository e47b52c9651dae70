//! Image folders in torchvision `ImageFolder`'s layout (`kind = "imagefolder"`).
//!
//! `dataset.root/<class>/**/<file>`: every subdirectory of the root is a class, and every file
//! below it (recursively, following symlinks) whose name ends, case-insensitively, in one of
//! `dataset.extensions` (default `jpg`, `jpeg`, `png`) is a sample of that class. Each sample has
//! two fields: `images` (the file's encoded bytes; decoding is a later stage) and `labels`
//! (`i64`, shape `[]`, the class index).
//!
//! **Order, as torchvision.** Class index = position of the class directory in the sorted list
//! of the root's subdirectory names (`find_classes`). Samples go class by class; within a class
//! torchvision's `make_dataset` walks `sorted(os.walk(class_dir, followlinks=True))`, i.e. the
//! class's directories ordered by their whole path *as a string* (so `a/b-c` comes before
//! `a/b/x`, since `-` sorts before `/`), and in each directory its files sorted by name. Names
//! compare bytewise, which for UTF-8 is Python's code-point order. A class without a single
//! image, or a root without classes, is an error at open, as in torchvision.
//!
//! **Reading.** Each read opens the sample's file and `pread`s it whole; a file that has
//! vanished or changed since open is a per-sample error.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pinring_data::Dtype;
use serde::{Deserialize, Serialize};

use crate::{check_bufs, fixed, pread, show, FieldBuf, Source, SourceError, SourceField};

/// Deepest directory nesting followed below a class directory (stops symlink cycles).
pub const MAX_DEPTH: usize = 64;

fn default_extensions() -> Vec<String> {
    vec!["jpg".into(), "jpeg".into(), "png".into()]
}

/// The `[dataset]` keys of `kind = "imagefolder"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageFolderConfig {
    /// The root directory (one subdirectory per class).
    pub root: PathBuf,
    /// File extensions of images, without the dot (compared case-insensitively).
    #[serde(default = "default_extensions")]
    pub extensions: Vec<String>,
}

/// Errors of [`ImageFolder`].
#[derive(Debug, thiserror::Error)]
pub enum ImageFolderError {
    /// A directory cannot be listed.
    #[error("cannot list directory {dir}: {source}; check dataset.root and its permissions")]
    List {
        /// The directory.
        dir: String,
        /// The cause.
        source: io::Error,
    },
    /// The root has no class directories.
    #[error("{root} has no class directories; dataset.root must hold one subdirectory per class")]
    NoClasses {
        /// The root.
        root: String,
    },
    /// A class has no image.
    #[error("class directory {dir} holds no file ending in {extensions:?}; add images, remove the directory or extend dataset.extensions")]
    EmptyClass {
        /// The class directory.
        dir: String,
        /// The extensions looked for.
        extensions: Vec<String>,
    },
    /// Directories nest too deeply (a symlink cycle?).
    #[error("{dir} is nested more than {MAX_DEPTH} directories below its class directory; is there a symlink cycle?")]
    TooDeep {
        /// The directory.
        dir: String,
    },
    /// An entry named like an image is not a regular file (opening a FIFO would block).
    #[error("{file} is {what}, not a regular file; an image folder holds image files: remove it or rename it to an extension not in dataset.extensions")]
    NotAFile {
        /// The entry.
        file: String,
        /// What it is ("a named pipe (FIFO)", "a socket", ...).
        what: &'static str,
    },
    /// A sample's file cannot be read (per sample).
    #[error("reading image file {file} at byte offset {offset} failed: {source}; the file changed or vanished since the source was opened: restore it")]
    Read {
        /// The file.
        file: String,
        /// Byte offset.
        offset: u64,
        /// The cause.
        source: io::Error,
    },
}

/// An open image folder ([`Source`] of `kind = "imagefolder"`).
#[derive(Debug)]
pub struct ImageFolder {
    classes: Vec<OsString>,
    samples: Vec<(PathBuf, u32)>,
    fields: Vec<SourceField>,
}

/// A directory's entries: its subdirectories, and its other entries with what each is when it
/// is not a regular file (a FIFO, socket or device; see [`crate::not_a_file`]).
/// A listed file: its name, and what it is when it is not a regular file.
type Listed = (OsString, Option<&'static str>);
type Listing = (Vec<OsString>, Vec<Listed>);

fn list(dir: &Path) -> Result<Listing, ImageFolderError> {
    let list_err = |source| ImageFolderError::List {
        dir: show(dir),
        source,
    };
    let (mut dirs, mut files) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir).map_err(list_err)? {
        let entry = entry.map_err(list_err)?;
        // os.walk / DirEntry.is_dir() follow symlinks; a broken link counts as a file.
        match std::fs::metadata(entry.path()) {
            Ok(m) if m.is_dir() => dirs.push(entry.file_name()),
            Ok(m) => files.push((entry.file_name(), crate::not_a_file(m.file_type()))),
            Err(_) => files.push((entry.file_name(), None)),
        }
    }
    Ok((dirs, files))
}

/// Every directory at or below `top` with its file names, as `os.walk(top, followlinks=True)`
/// yields them (in any order).
fn walk(
    top: &Path,
    depth: usize,
    out: &mut Vec<(PathBuf, Vec<Listed>)>,
) -> Result<(), ImageFolderError> {
    if depth > MAX_DEPTH {
        return Err(ImageFolderError::TooDeep { dir: show(top) });
    }
    let (dirs, files) = list(top)?;
    out.push((top.to_path_buf(), files));
    for d in dirs {
        walk(&top.join(d), depth + 1, out)?;
    }
    Ok(())
}

impl ImageFolder {
    /// Lists `config.root` and orders its images as torchvision does.
    pub fn open(config: &ImageFolderConfig) -> Result<ImageFolder, ImageFolderError> {
        let exts: Vec<String> = config
            .extensions
            .iter()
            .map(|e| format!(".{}", e.trim_start_matches('.').to_lowercase()))
            .collect();
        let (mut classes, _) = list(&config.root)?;
        classes.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        if classes.is_empty() {
            return Err(ImageFolderError::NoClasses {
                root: show(&config.root),
            });
        }
        let mut samples = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let class_dir = config.root.join(class);
            let mut dirs = Vec::new();
            walk(&class_dir, 0, &mut dirs)?;
            dirs.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
            let before = samples.len();
            for (dir, mut files) in dirs {
                files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                for (f, special) in files {
                    let lower = f.to_string_lossy().to_lowercase();
                    if !exts.iter().any(|e| lower.ends_with(e.as_str())) {
                        continue;
                    }
                    if let Some(what) = special {
                        return Err(ImageFolderError::NotAFile {
                            file: show(&dir.join(f)),
                            what,
                        });
                    }
                    samples.push((dir.join(f), label as u32));
                }
            }
            if samples.len() == before {
                return Err(ImageFolderError::EmptyClass {
                    dir: show(&class_dir),
                    extensions: config.extensions.clone(),
                });
            }
        }
        Ok(ImageFolder {
            classes,
            samples,
            fields: vec![
                SourceField::Encoded {
                    name: pinring_data::IMAGES.into(),
                },
                fixed(pinring_data::LABELS, Dtype::I64, vec![]),
            ],
        })
    }

    /// The class names, in label order.
    pub fn classes(&self) -> &[OsString] {
        &self.classes
    }

    /// The samples' paths and labels, in id order.
    pub fn samples(&self) -> &[(PathBuf, u32)] {
        &self.samples
    }
}

impl Source for ImageFolder {
    fn len(&self) -> u64 {
        self.samples.len() as u64
    }

    fn fields(&self) -> &[SourceField] {
        &self.fields
    }

    fn locate(&self, id: u64) -> Option<String> {
        let (path, _) = self.samples.get(usize::try_from(id).ok()?)?;
        Some(format!("image file {}", show(path)))
    }

    fn origin(&self, id: u64) -> Option<(u32, u64)> {
        // Each sample is a file of its own: the file is the sample's index.
        (id < self.len()).then(|| (u32::try_from(id).unwrap_or(u32::MAX), 0))
    }

    fn read(&mut self, _epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError> {
        check_bufs(&self.fields, out)?;
        let len = self.len();
        let Some((path, label)) = usize::try_from(id).ok().and_then(|i| self.samples.get(i)) else {
            return Err(SourceError::OutOfRange { id, len });
        };
        let read_err = |source| ImageFolderError::Read {
            file: show(path),
            offset: 0,
            source,
        };
        if let [FieldBuf::Bytes(bytes), FieldBuf::Fixed(l)] = out {
            let file = crate::open_data_file(path).map_err(read_err)?;
            let size = file.metadata().map_err(read_err)?.len();
            bytes.clear();
            bytes.resize(size as usize, 0);
            pread(&file, bytes, 0).map_err(read_err)?;
            l.copy_from_slice(&i64::from(*label).to_le_bytes());
        }
        Ok(())
    }
}
