//! [`Decoded`]: a source of encoded images (`webdataset`, `imagefolder`) whose `images` field
//! comes out decoded and transformed by pinring-image's [`Pipeline`], as the fixed field that
//! `[dataset.image]` declares (docs/IMAGES.md).
//!
//! One [`Decoded`] per loader process: it owns the pipeline (decoder, resizer and their scratch)
//! and one buffer for the encoded bytes, both reused from sample to sample. [`Source::read`]
//! reads sample `id` from the inner source (the encoded image into that buffer, the other fields
//! straight into the caller's buffers) and then writes the image sample, exactly
//! [`SampleSpec::sample_bytes`], into the caller's `images` buffer. The train transform's
//! randomness is `SampleKey { seed, epoch, sample_id }` with `seed` the plan's seed, so every
//! process makes the same bytes for a sample in an epoch.

use pinring_data::{EncodedEntry, Field, ImageDataset};
use pinring_image::{Decoder, Pipeline, SampleKey, SampleSpec, Transform};

use crate::{check_bufs, FieldBuf, Source, SourceError, SourceField};

/// A source whose encoded `images` field is decoded into the fixed field of [`ImageDataset::sample_spec`].
#[derive(Debug)]
pub struct Decoded {
    inner: Box<dyn Source>,
    pipeline: Pipeline,
    seed: u64,
    /// Index of the encoded images field in the inner source's fields.
    image_at: usize,
    encoded: Vec<u8>,
    fields: Vec<SourceField>,
}

impl Decoded {
    /// Wraps `inner`, whose field `images` must be encoded (and the only encoded one), with the
    /// pipeline of `image`; `seed` is the plan's seed (the train transform's randomness).
    pub fn new(
        inner: Box<dyn Source>,
        image: &ImageDataset,
        seed: u64,
    ) -> Result<Decoded, SourceError> {
        let spec = image.sample_spec();
        let pipeline = Pipeline::new(spec).map_err(|e| SourceError::Declared {
            problem: format!("[dataset.image]: {e}"),
        })?;
        let mut image_at = None;
        let mut fields = Vec::with_capacity(inner.fields().len());
        for (k, f) in inner.fields().iter().enumerate() {
            match f {
                SourceField::Encoded { name } if name == pinring_data::IMAGES => {
                    image_at = Some(k);
                    let shape = spec.shape().iter().map(|&d| d as u32).collect();
                    fields.push(SourceField::Fixed(Field::new(
                        pinring_data::IMAGES,
                        image.output.dtype(),
                        shape,
                    )));
                }
                SourceField::Encoded { name } => {
                    return Err(SourceError::Declared {
                        problem: format!(
                            "field {name:?} is encoded and only the images are decoded; leave \
                             it out of the dataset's fields"
                        ),
                    })
                }
                f => fields.push(f.clone()),
            }
        }
        let Some(image_at) = image_at else {
            return Err(SourceError::Declared {
                problem: "the source has no encoded images field to decode".into(),
            });
        };
        Ok(Decoded {
            inner,
            pipeline,
            seed,
            image_at,
            encoded: Vec::new(),
            fields,
        })
    }

    /// The pipeline's spec.
    pub fn spec(&self) -> &SampleSpec {
        self.pipeline.spec()
    }
}

impl Source for Decoded {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn fields(&self) -> &[SourceField] {
        &self.fields
    }

    fn locate(&self, id: u64) -> Option<String> {
        self.inner.locate(id)
    }

    fn shard_sizes(&self) -> Option<&[u64]> {
        self.inner.shard_sizes()
    }

    fn read(&mut self, epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError> {
        check_bufs(&self.fields, out)?;
        {
            let mut encoded = Some(&mut self.encoded);
            let mut inner_out: Vec<FieldBuf<'_>> = Vec::with_capacity(out.len());
            for (k, b) in out.iter_mut().enumerate() {
                match (
                    k == self.image_at,
                    encoded.take_if(|_| k == self.image_at),
                    b,
                ) {
                    (true, Some(e), _) => inner_out.push(FieldBuf::Bytes(e)),
                    (_, _, FieldBuf::Fixed(b)) => inner_out.push(FieldBuf::Fixed(b)),
                    (_, _, FieldBuf::Bytes(v)) => inner_out.push(FieldBuf::Bytes(v)),
                }
            }
            self.inner.read(epoch, id, &mut inner_out)?;
        }
        let FieldBuf::Fixed(dst) = &mut out[self.image_at] else {
            return Err(SourceError::Buffers {
                problem: "the images field takes a Fixed buffer".into(),
            });
        };
        let key = SampleKey {
            seed: self.seed,
            epoch: u64::from(epoch),
            sample_id: id,
        };
        match self.pipeline.process(&self.encoded, key, dst) {
            Ok(_) => Ok(()),
            Err(e) => Err(SourceError::Image {
                at: self
                    .inner
                    .locate(id)
                    .unwrap_or_else(|| format!("sample {id}")),
                source: e,
            }),
        }
    }
}

/// A source whose encoded `images` field stays encoded, for a decode on copy (`[dataset.image]
/// decode = "gpu"`, pinring-data's `encoded` module): [`Source::read`] gives the images field
/// as the file's bytes followed by an [`EncodedEntry`]'s
/// [`ENTRY_BYTES`](pinring_data::ENTRY_BYTES) (the image's size from its headers, the crop box
/// and flip drawn exactly as [`Decoded`] draws them, the sample's file and member): appended,
/// so the file's bytes are not moved. Only the headers are read here: a file whose headers do
/// not decode is a bad sample here, as with [`Decoded`]; one whose compressed data is bad is
/// found by the decoder on copy.
#[derive(Debug)]
pub struct Planned {
    inner: Box<dyn Source>,
    transform: Transform,
    decoder: Decoder,
    seed: u64,
    image_at: usize,
}

impl Planned {
    /// Wraps `inner`, whose field `images` must be encoded, with the transform of `image`;
    /// `seed` is the plan's seed.
    pub fn new(
        inner: Box<dyn Source>,
        image: &ImageDataset,
        seed: u64,
    ) -> Result<Planned, SourceError> {
        let spec = image.sample_spec();
        spec.validate().map_err(|e| SourceError::Declared {
            problem: format!("[dataset.image]: {e}"),
        })?;
        let image_at = inner
            .fields()
            .iter()
            .position(
                |f| matches!(f, SourceField::Encoded { name } if name == pinring_data::IMAGES),
            )
            .ok_or_else(|| SourceError::Declared {
                problem: "the source has no encoded images field to decode".into(),
            })?;
        Ok(Planned {
            inner,
            transform: spec.transform,
            decoder: Decoder::new(),
            seed,
            image_at,
        })
    }
}

impl Source for Planned {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn fields(&self) -> &[SourceField] {
        self.inner.fields()
    }

    fn locate(&self, id: u64) -> Option<String> {
        self.inner.locate(id)
    }

    fn origin(&self, id: u64) -> Option<(u32, u64)> {
        self.inner.origin(id)
    }

    fn shard_sizes(&self) -> Option<&[u64]> {
        self.inner.shard_sizes()
    }

    fn read(&mut self, epoch: u32, id: u64, out: &mut [FieldBuf<'_>]) -> Result<(), SourceError> {
        self.inner.read(epoch, id, out)?;
        let FieldBuf::Bytes(bytes) = &mut out[self.image_at] else {
            return Err(SourceError::Buffers {
                problem: "the images field takes a Bytes buffer".into(),
            });
        };
        let info = self.decoder.info(bytes).map_err(|e| SourceError::Image {
            at: self
                .inner
                .locate(id)
                .unwrap_or_else(|| format!("sample {id}")),
            source: e,
        })?;
        let key = SampleKey {
            seed: self.seed,
            epoch: u64::from(epoch),
            sample_id: id,
        };
        let (crop, flipped) = self.transform.plan(info.width, info.height, key);
        let (file, member) = self.inner.origin(id).unwrap_or((u32::MAX, 0));
        let entry = EncodedEntry {
            flags: if flipped { pinring_data::FLAG_FLIP } else { 0 },
            file,
            member,
            width: info.width,
            height: info.height,
            crop: [crop.left, crop.top, crop.width, crop.height],
            ..EncodedEntry::default()
        };
        bytes.extend_from_slice(&entry.to_bytes());
        Ok(())
    }
}
