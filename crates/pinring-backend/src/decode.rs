//! Decoding on copy (`[dataset.image] decode = "gpu"`): an upload whose source is a part's
//! encoded images chunk (pinring-data's `encoded` module: entries, then the packed compressed
//! bytes) writes the decoded, cropped, resized and encoded samples into the batch's buffer, as
//! the loaders' CPU path would have written them.
//!
//! The caller marks such an upload with [`Decode`] and tells the engine the samples' spec once
//! ([`crate::CopyEngine::set_decoder`]). A sample whose entry or bytes do not decode is written
//! as zeros and reported as a [`DecodeFault`] ([`crate::CopyEngine::take_decode_faults`]); the
//! caller applies `dataset.on_bad_sample` to it. Nothing a loader wrote can make the engine
//! hang, read outside the chunk, or write outside the sample's place.
//!
//! The host backend decodes on its upload thread with pinring-image's [`Pipeline`], the
//! loaders' own code, from the crop the loader drew: its pixels are the CPU path's, byte for
//! byte.

use pinring_data::{EncodedChunk, EncodedEntry};
use pinring_image::Pipeline;
/// The samples a decoding engine makes (pinring-image's).
pub use pinring_image::SampleSpec;

use crate::BackendError;

/// An upload that decodes ([`crate::UploadJob::decode`]): its source is an encoded chunk of
/// `samples` samples, decoded into `dst_len` bytes (`samples` × the spec's sample bytes) at
/// the job's `dst_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decode {
    /// Samples in the chunk.
    pub samples: u32,
    /// Bytes the samples take in the buffer.
    pub dst_len: usize,
}

impl Decode {
    /// The decode of a part's `copy` of `layout` (`None` for a plain copy).
    pub fn of(
        copy: &pinring_data::ChunkCopy,
        layout: &pinring_data::BatchLayout,
    ) -> Option<Decode> {
        let samples = copy.decode?;
        let sample_bytes = layout.fields.get(copy.field)?.sample_bytes;
        Some(Decode {
            samples,
            dst_len: usize::try_from(u64::from(samples).saturating_mul(sample_bytes))
                .unwrap_or(usize::MAX),
        })
    }
}

/// A sample that did not decode: written as zeros in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeFault {
    /// The upload's tag.
    pub tag: u64,
    /// The sample's index in its part.
    pub sample: u32,
    /// Where the sample came from, as its entry says: the file's index and the byte offset of
    /// its member (`Config::describe_origin` names them); `None` where the entry itself was
    /// unreadable.
    pub at: Option<(u32, u64)>,
    /// What failed.
    pub problem: String,
}

/// An engine's decoder, made for one spec.
pub(crate) trait Decoder: Sized {
    /// The samples it makes.
    fn spec(&self) -> &SampleSpec;

    /// Makes `slot` hold a decoder of `spec` (`make` makes one): once; again with the same
    /// spec is nothing, with another an error.
    fn install(
        slot: &mut Option<Self>,
        spec: SampleSpec,
        make: impl FnOnce() -> Result<Self, BackendError>,
    ) -> Result<(), BackendError> {
        match slot {
            Some(d) if *d.spec() == spec => Ok(()),
            Some(_) => Err(BackendError::InvalidArgument {
                call: "set_decoder",
                what: "the engine decodes into another spec already".into(),
            }),
            None => {
                *slot = Some(make()?);
                Ok(())
            }
        }
    }

    /// A job that decodes needs a decoder, and its bytes must be its samples' ([`check`]):
    /// copying encoded bytes would be a garbage image.
    fn check_job(slot: &Option<Self>, job: &crate::UploadJob) -> Result<(), BackendError> {
        let Some(d) = &job.decode else {
            return Ok(());
        };
        match slot {
            Some(dec) => check(dec.spec(), d),
            None => Err(BackendError::InvalidArgument {
                call: "submit",
                what: format!("a decoding upload (tag {}) before set_decoder", job.tag),
            }),
        }
    }
}

impl Decoder for CpuDecoder {
    fn spec(&self) -> &SampleSpec {
        self.pipeline.spec()
    }
}

/// Checks a job's [`Decode`] against the engine's `spec`: `dst_len` is `samples` samples.
pub(crate) fn check(spec: &SampleSpec, d: &Decode) -> Result<(), BackendError> {
    let want = (d.samples as usize).checked_mul(spec.sample_bytes());
    if want != Some(d.dst_len) {
        return Err(BackendError::InvalidArgument {
            call: "submit",
            what: format!(
                "a decode of {} samples of {} bytes writes {want:?} bytes, the job says {}",
                d.samples,
                spec.sample_bytes(),
                d.dst_len
            ),
        });
    }
    Ok(())
}

/// How an engine decoded its samples, per way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeCounts {
    /// Decoded by nvJPEG.
    pub gpu: u64,
    /// Decoded on the CPU by the host engine (no GPU: every sample, by design).
    pub cpu: u64,
    /// On the CPU: not a JPEG nvJPEG reads (a PNG, or headers it refuses).
    pub cpu_not_jpeg: u64,
    /// On the CPU: a JPEG the backend's batched decode does not take (progressive, an unusual
    /// subsampling).
    pub cpu_unsupported: u64,
    /// On the CPU: a JPEG of other than 1 or 3 components (CMYK).
    pub cpu_components: u64,
    /// On the CPU: the batched decode of its part failed (one image it could not decode fails
    /// them all; the CPU then finds which).
    pub cpu_batch_failed: u64,
    /// Not decoded at all: written as zeros and reported as a [`DecodeFault`].
    pub failed: u64,
}

impl DecodeCounts {
    /// Each way with its count, by the names the summary, /metrics and Python give them.
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("gpu", self.gpu),
            ("cpu", self.cpu),
            ("cpu_not_jpeg", self.cpu_not_jpeg),
            ("cpu_unsupported", self.cpu_unsupported),
            ("cpu_components", self.cpu_components),
            ("cpu_batch_failed", self.cpu_batch_failed),
            ("failed", self.failed),
        ]
    }
}

/// A JPEG's frame header (its SOF segment), read by walking the marker segments from the
/// start: what the GPU decoder needs to pick a sample's way without a call into nvJPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JpegFrame {
    /// The SOF marker's low byte: 0xC0 baseline, 0xC1 extended sequential, 0xC2 progressive, ...
    pub(crate) sof: u8,
    /// Bits per sample.
    pub(crate) precision: u8,
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) components: u8,
}

impl JpegFrame {
    /// Whether a sequential Huffman decoder of 8-bit samples (nvJPEG's batched decode) takes it.
    pub(crate) fn sequential_8bit(&self) -> bool {
        matches!(self.sof, 0xC0 | 0xC1) && self.precision == 8
    }
}

/// The frame header of the JPEG `data`, or `None` when `data` is not a JPEG or its headers end
/// (or break) before a frame header: reads only the segments before it.
pub(crate) fn jpeg_frame(data: &[u8]) -> Option<JpegFrame> {
    if !data.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2usize;
    loop {
        // Fill bytes (0xFF) may precede a marker.
        while data.get(at) == Some(&0xFF) && data.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        if data.get(at) != Some(&0xFF) {
            return None;
        }
        let marker = *data.get(at + 1)?;
        let len = usize::from(u16::from_be_bytes([*data.get(at + 2)?, *data.get(at + 3)?]));
        if len < 2 {
            return None;
        }
        let body = data.get(at + 4..at + 2 + len)?;
        match marker {
            // SOF0..SOF15 but DHT (C4), JPG (C8) and DAC (CC).
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let b = body.get(..6)?;
                return Some(JpegFrame {
                    sof: marker,
                    precision: b[0],
                    height: u32::from(u16::from_be_bytes([b[1], b[2]])),
                    width: u32::from(u16::from_be_bytes([b[3], b[4]])),
                    components: b[5],
                });
            }
            // Start of scan before any frame: not a JPEG a decoder takes.
            0xDA => return None,
            _ => at += 2 + len,
        }
    }
}

/// A decoder of encoded chunks on the CPU, with its scratch reused from job to job.
#[derive(Debug)]
pub(crate) struct CpuDecoder {
    pipeline: Pipeline,
    /// The chunk, copied out of shared memory before its entries are checked and used, so no
    /// writer can change a value between its check and its use.
    chunk: Vec<u8>,
    /// The part's samples, decoded.
    out: Vec<u8>,
    counts: DecodeCounts,
}

impl CpuDecoder {
    pub(crate) fn new(spec: SampleSpec) -> Result<CpuDecoder, BackendError> {
        let pipeline = Pipeline::new(spec).map_err(|e| BackendError::InvalidArgument {
            call: "set_decoder",
            what: e.to_string(),
        })?;
        Ok(CpuDecoder {
            pipeline,
            chunk: Vec::new(),
            out: Vec::new(),
            counts: DecodeCounts::default(),
        })
    }

    /// What this decoder did, per way (`cpu` and `failed`).
    pub(crate) fn counts(&self) -> DecodeCounts {
        self.counts
    }

    /// Bytes of one decoded sample.
    pub(crate) fn sample_bytes(&self) -> usize {
        self.pipeline.spec().sample_bytes()
    }

    /// The copied chunk's buffer, `len` bytes, for the caller to fill.
    pub(crate) fn chunk_mut(&mut self, len: usize) -> &mut [u8] {
        self.chunk.resize(len, 0);
        &mut self.chunk
    }

    /// Decodes the chunk last filled through [`CpuDecoder::chunk_mut`] (`samples` samples) and
    /// returns the samples' bytes (zeros for each fault) and the faults.
    pub(crate) fn decode(&mut self, tag: u64, samples: u32) -> (&[u8], Vec<DecodeFault>) {
        let sb = self.sample_bytes();
        self.out.clear();
        self.out.resize(samples as usize * sb, 0);
        let mut faults = Vec::new();
        let chunk = match EncodedChunk::new(&self.chunk, samples) {
            Ok(c) => c,
            Err(e) => {
                self.counts.failed += u64::from(samples);
                faults.extend((0..samples).map(|n| DecodeFault {
                    tag,
                    sample: n,
                    at: None,
                    problem: e.to_string(),
                }));
                return (&self.out, faults);
            }
        };
        for n in 0..samples as usize {
            let dst = &mut self.out[n * sb..(n + 1) * sb];
            let (entry, bytes) = match chunk.entry(n) {
                Ok(e) => e,
                Err(e) => {
                    self.counts.failed += 1;
                    faults.push(DecodeFault {
                        tag,
                        sample: n as u32,
                        at: None,
                        problem: e.to_string(),
                    });
                    continue;
                }
            };
            if entry.zeros() {
                continue;
            }
            if let Err(problem) = decode_one(&mut self.pipeline, &entry, bytes, dst) {
                self.counts.failed += 1;
                dst.fill(0);
                faults.push(DecodeFault {
                    tag,
                    sample: n as u32,
                    at: Some((entry.file, entry.member)),
                    problem,
                });
            } else {
                self.counts.cpu += 1;
            }
        }
        (&self.out, faults)
    }
}

/// One sample: the image's headers must give the size its entry records (the box was drawn
/// for it), then the loaders' pipeline decodes and transforms it with the entry's box.
fn decode_one(
    pipeline: &mut Pipeline,
    entry: &EncodedEntry,
    bytes: &[u8],
    dst: &mut [u8],
) -> Result<(), String> {
    let applied = pipeline
        .process_planned(bytes, entry.crop_box(), entry.flipped(), dst)
        .map_err(|e| e.to_string())?;
    if (applied.width, applied.height) != (entry.width, entry.height) {
        return Err(format!(
            "the image is {}x{}, its entry says {}x{}",
            applied.width, applied.height, entry.width, entry.height
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CopyEngine, DeviceKernels, HostUploader, UploadJob};
    use pinring_data::{write_sample, ArenaCursor, FLAG_FLIP, FLAG_ZEROS};
    use pinring_image::{synth, Output, SampleKey, Transform};
    use std::time::Duration;

    fn jpeg(w: u32, h: u32, seed: u64) -> Vec<u8> {
        let pixels = synth::photo(w, h, seed, 8);
        let mut buf = Vec::new();
        jpeg_encoder::Encoder::new(&mut buf, 90)
            .encode(&pixels, w as u16, h as u16, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        buf
    }

    fn spec() -> SampleSpec {
        SampleSpec {
            transform: Transform::Train {
                crop: 16,
                scale: (0.08, 1.0),
                ratio: (0.75, 4.0 / 3.0),
                flip_p: 0.5,
            },
            output: Output::U8Hwc,
            reduced_decode: false,
        }
    }

    /// A part of four samples: two good JPEGs, bytes that are no image, and a sample the loader
    /// substituted with zeros; one more part whose second entry names bytes past its arena.
    /// The engine writes each good sample as `Pipeline::process` makes it for the same key,
    /// zeros for the others, and reports the two it could not decode, naming sample and origin.
    #[test]
    fn the_host_engine_decodes_good_samples_and_reports_each_bad_one() {
        let spec = spec();
        let sb = spec.sample_bytes();
        let up = HostUploader::new(1, 8 * sb).unwrap();
        let images = [
            jpeg(40, 30, 1),
            jpeg(33, 47, 2),
            b"not an image at all".to_vec(),
        ];
        let mut chunk = vec![0u8; 4 * (64 + 4096)];
        let mut cursor = ArenaCursor::new(4, 4096);
        let mut want = vec![0u8; 4 * sb];
        let mut pipeline = Pipeline::new(spec).unwrap();
        for (n, bytes) in images.iter().enumerate() {
            let key = SampleKey {
                seed: 7,
                epoch: 0,
                sample_id: n as u64,
            };
            let (w, h) = if n < 2 {
                let a = pipeline
                    .process(bytes, key, &mut want[n * sb..(n + 1) * sb])
                    .unwrap();
                (a.width, a.height)
            } else {
                (40, 30)
            };
            let (crop, flip) = spec.transform.plan(w, h, key);
            let entry = EncodedEntry {
                flags: if flip { FLAG_FLIP } else { 0 },
                file: 9,
                member: 512 * n as u64,
                width: w,
                height: h,
                crop: [crop.left, crop.top, crop.width, crop.height],
                ..EncodedEntry::default()
            };
            write_sample(&mut chunk, &mut cursor, n, entry, bytes).unwrap();
        }
        let zeros = EncodedEntry {
            flags: FLAG_ZEROS,
            ..EncodedEntry::default()
        };
        write_sample(&mut chunk, &mut cursor, 3, zeros, &[]).unwrap();
        up.set_decoder(spec).unwrap();
        let job = UploadJob {
            tag: 5,
            src: chunk.as_ptr(),
            len: chunk.len(),
            buffer: 0,
            dst_offset: 0,
            decode: Some(Decode {
                samples: 4,
                dst_len: 4 * sb,
            }),
        };
        // SAFETY: `chunk` outlives the completion received below and is not written meanwhile.
        unsafe { up.submit(job) }.unwrap();
        let c = up
            .completions()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        c.result.unwrap();
        let read = |got: &mut Vec<u8>| {
            up.read_host(0, 0, 4 * sb, &mut |b| got.copy_from_slice(b))
                .unwrap();
        };
        let mut got = vec![0u8; 4 * sb];
        read(&mut got);
        assert!(
            got == want,
            "decoded samples differ from the loaders' pipeline"
        );
        let faults = up.take_decode_faults();
        assert_eq!(faults.len(), 1, "{faults:?}");
        assert_eq!((faults[0].tag, faults[0].sample), (5, 2));
        assert_eq!(faults[0].at, Some((9, 1024)));
        // A scribbled entry: its bytes past the arena. Refused before any byte is read.
        let e = EncodedEntry::from_bytes(chunk[64..128].try_into().unwrap());
        chunk[64..128].copy_from_slice(&EncodedEntry { offset: 20000, ..e }.to_bytes());
        // SAFETY: as above.
        unsafe { up.submit(UploadJob { tag: 6, ..job }) }.unwrap();
        up.completions()
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .result
            .unwrap();
        let faults = up.take_decode_faults();
        assert_eq!(faults.iter().map(|f| f.sample).collect::<Vec<_>>(), [1, 2]);
        assert!(
            faults[0].problem.contains("not inside the part's arena"),
            "{faults:?}"
        );
        read(&mut got);
        assert!(
            got[sb..2 * sb].iter().all(|&b| b == 0),
            "a refused sample is zeros"
        );
        assert!(got[..sb] == want[..sb]);
    }

    #[test]
    fn the_frame_header_is_found_past_the_other_segments_and_nothing_else_is_taken_for_one() {
        let f = jpeg_frame(&jpeg(40, 30, 1)).unwrap();
        assert_eq!(
            (f.sof, f.precision, f.width, f.height, f.components),
            (0xC0, 8, 40, 30, 3)
        );
        assert!(f.sequential_8bit());
        let progressive = JpegFrame { sof: 0xC2, ..f };
        assert!(!progressive.sequential_8bit());
        let j = jpeg(40, 30, 1);
        for cut in [0, 1, 2, 3, 10, 20] {
            assert_eq!(jpeg_frame(&j[..cut]), None, "cut at {cut}");
        }
        assert_eq!(jpeg_frame(b"\x89PNG\r\n\x1a\n"), None);
        // A zero segment length, or a scan before any frame.
        assert_eq!(jpeg_frame(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 0]), None);
        assert_eq!(jpeg_frame(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]), None);
    }

    #[test]
    fn a_decoding_upload_needs_a_decoder_and_its_samples_exact_bytes() {
        let spec = spec();
        let sb = spec.sample_bytes();
        let up = HostUploader::new(1, 4 * sb).unwrap();
        let chunk = vec![0u8; 2 * (64 + 1024)];
        let job = UploadJob {
            tag: 1,
            src: chunk.as_ptr(),
            len: chunk.len(),
            buffer: 0,
            dst_offset: 0,
            decode: Some(Decode {
                samples: 2,
                dst_len: 2 * sb,
            }),
        };
        // SAFETY: refused before anything is queued, so nothing reads `chunk` later.
        let e = unsafe { up.submit(job) }.unwrap_err();
        assert!(e.to_string().contains("before set_decoder"), "{e}");
        up.set_decoder(spec).unwrap();
        let wrong = UploadJob {
            decode: Some(Decode {
                samples: 2,
                dst_len: 2 * sb - 1,
            }),
            ..job
        };
        // SAFETY: as above.
        let e = unsafe { up.submit(wrong) }.unwrap_err();
        assert!(e.to_string().contains("writes"), "{e}");
        let past = UploadJob {
            dst_offset: 3 * sb,
            ..job
        };
        assert!(
            // SAFETY: as above.
            unsafe { up.submit(past) }.is_err(),
            "the decoded samples end past the buffer"
        );
    }
}
