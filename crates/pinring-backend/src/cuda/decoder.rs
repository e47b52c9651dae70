//! The cuda engine's decoder (docs/ARCHITECTURE.md, "Decoding on copy"): a part's encoded
//! chunk, read where it lies in the registered ring, decoded by nvJPEG (the JPEG engine where
//! the GPU has one, nvJPEG's GPU backend otherwise) into scratch device memory, then cropped,
//! resized, flipped and written in the output's layout and dtype by one kernel (`resize.cu`),
//! all on the copy stream, so the upload's event covers it. What nvJPEG's backend does not take
//! (not a JPEG, progressive, CMYK, a decode that fails there) is decoded on the CPU by the
//! loaders' pipeline and copied into place, counted per reason ([`DecodeCounts`]).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use pinring_data::{EncodedChunk, EncodedEntry, ENTRY_BYTES};
use pinring_image::{Float, Output, Pipeline, SampleSpec};

use super::nvlibs::{self, NvImage, Nvjpeg, BACKEND_DEFAULT, BACKEND_GPU_HYBRID, BACKEND_HARDWARE};
use super::raw;
use crate::decode::{Decode, DecodeCounts, DecodeFault};
use crate::error::cuda_error;
use crate::BackendError;

/// The kernel's source, compiled by NVRTC when the engine gets its decoder.
const KERNEL_SRC: &str = include_str!("resize.cu");
const KERNEL: &str = "pinring_resize_crop";
const BLOCK: u32 = 256;

/// The kernel's view of one sample (`struct Sample` of `resize.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KernelSample {
    src: u64,
    dst: u64,
    src_w: i32,
    src_h: i32,
    pitch: i32,
    /// 0 resample, 1 zeros, 2 leave alone.
    mode: i32,
    left: f32,
    top: f32,
    box_w: f32,
    box_h: f32,
    flip: i32,
    pad: [i32; 3],
}

const _: () = assert!(std::mem::size_of::<KernelSample>() == 64);

const RESAMPLE: i32 = 0;
const ZEROS: i32 = 1;
const LEAVE: i32 = 2;

/// A sample's way through the decoder.
enum Way {
    /// nvJPEG's batched decode, into scratch at this offset.
    Batched { scratch: usize },
    /// The CPU, then a copy.
    Cpu,
    /// Zeros: the loader's substitute, or a fault.
    Zeros,
}

pub(crate) struct GpuDecoder {
    spec: SampleSpec,
    nvjpeg: Nvjpeg,
    function: CudaFunction,
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    /// The decoded images of a part (grown to fit).
    scratch: Option<raw::DeviceAlloc>,
    /// The kernel's samples (grown to fit).
    params: Option<raw::DeviceAlloc>,
    /// Host copies of a part's entries (checked there, so the slot cannot change them after).
    entries: Vec<u8>,
    /// CPU decodes for what nvJPEG does not take, one sample at a time.
    cpu: Pipeline,
    cpu_out: Vec<u8>,
    counts: DecodeCounts,
    /// The last batched decode's failure, for messages and tests.
    pub(crate) last_batch_error: Option<String>,
}

impl std::fmt::Debug for GpuDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoder")
            .field("nvjpeg", &self.nvjpeg)
            .field("counts", &self.counts)
            .finish()
    }
}

impl GpuDecoder {
    /// nvJPEG (hardware backend where there is one) and the kernel, compiled for this device.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        spec: SampleSpec,
        device: usize,
    ) -> Result<GpuDecoder, BackendError> {
        let fail = |what: String| BackendError::InvalidArgument {
            call: "set_decoder",
            what: format!(
                "the cuda engine cannot decode on device {device}: {what}; install the CUDA \
                 runtime libraries (libnvjpeg, libnvrtc), or set [dataset.image] decode = \"cpu\""
            ),
        };
        raw::make_current(ctx)
            .map_err(|e| cuda_error("cuCtxSetCurrent", "the decoder's context".into(), e.0))?;
        let nvjpeg =
            Nvjpeg::open(&[BACKEND_HARDWARE, BACKEND_GPU_HYBRID, BACKEND_DEFAULT]).map_err(fail)?;
        let ptx = nvlibs::compile_ptx(KERNEL_SRC, "resize.cu", "compute_80").map_err(fail)?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| cuda_error("cuModuleLoadData", "pinring's resize kernel".into(), e.0))?;
        let function = module
            .load_function(KERNEL)
            .map_err(|e| cuda_error("cuModuleGetFunction", KERNEL.into(), e.0))?;
        tracing::info!(
            device,
            backend = nvjpeg.backend,
            "GPU decode ready (nvJPEG backend 3: the JPEG engine)"
        );
        Ok(GpuDecoder {
            spec,
            nvjpeg,
            function,
            _module: module,
            stream: Arc::clone(stream),
            ctx: Arc::clone(ctx),
            scratch: None,
            params: None,
            entries: Vec::new(),
            cpu: Pipeline::new(spec).map_err(|e| fail(e.to_string()))?,
            cpu_out: Vec::new(),
            counts: DecodeCounts::default(),
            last_batch_error: None,
        })
    }

    pub(crate) fn counts(&self) -> DecodeCounts {
        self.counts
    }

    /// Grows `slot` to at least `bytes`. Work queued on `stream` may still use the old
    /// allocation, so a growth waits for the stream before freeing it (rare: the sizes settle
    /// after the first parts).
    fn room(
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        slot: &mut Option<raw::DeviceAlloc>,
        bytes: usize,
    ) -> Result<u64, BackendError> {
        if slot.as_ref().is_none_or(|a| a.bytes() < bytes) {
            stream
                .synchronize()
                .map_err(|e| cuda_error("cuStreamSynchronize", "the copy stream".into(), e.0))?;
            *slot = None;
            let a = raw::DeviceAlloc::new(ctx, bytes.next_power_of_two()).map_err(|e| {
                cuda_error(
                    "cuMemAlloc",
                    format!("{bytes} bytes of decode scratch"),
                    e.0,
                )
            })?;
            *slot = Some(a);
        }
        Ok(slot.as_ref().map_or(0, |a| a.ptr()))
    }

    /// Decodes the chunk at `src` (`len` bytes in the registered ring, `d.samples` samples) into
    /// `dst` (device address of the first sample's output) on the copy stream, reporting each
    /// sample that did not decode in `faults` (written as zeros). Steps: the entries checked and
    /// each sample's way picked (`plan`), the batched decode (`decode_batched`), the kernel's
    /// samples with the CPU's decodes copied into place (`kernel_samples`), the kernel
    /// (`launch`).
    ///
    /// # Safety
    /// `src..src+len` stays valid and unwritten by this process, and `dst..dst+d.dst_len` stays
    /// allocated, until the work queued on the stream now has completed.
    pub(crate) unsafe fn decode(
        &mut self,
        tag: u64,
        src: *const u8,
        len: usize,
        d: Decode,
        dst: u64,
        faults: &mut Vec<DecodeFault>,
    ) -> Result<(), BackendError> {
        let n = d.samples as usize;
        let head = EncodedChunk::entries_len(len, d.samples).map_err(|e| {
            BackendError::InvalidArgument {
                call: "submit",
                what: e.to_string(),
            }
        })?;
        self.entries.resize(head, 0);
        // SAFETY: the caller keeps src..src+len valid; the copy out is into our own memory.
        unsafe { std::ptr::copy_nonoverlapping(src, self.entries.as_mut_ptr(), head) };
        // SAFETY: the arena lies inside src..src+len, which the caller keeps valid and which this
        // process holds (its slot is UPLOADING: no loader may write it). Only nvJPEG reads the
        // bitstreams in place; a rogue writer can change their bytes, which every decoder here
        // takes as data, never as a size or an address (those come from the checked entries).
        let arena = unsafe { std::slice::from_raw_parts(src.wrapping_add(head), len - head) };
        let (mut ways, infos, scratch_bytes) = self.plan(tag, n, arena, faults);
        let scratch = Self::room(
            &self.ctx,
            &self.stream,
            &mut self.scratch,
            scratch_bytes.max(1),
        )?;
        // SAFETY: forwarded: the bitstreams lie in the caller's chunk.
        unsafe { self.decode_batched(arena, &infos, &mut ways, scratch) };
        let params = self.kernel_samples(tag, arena, &infos, &ways, scratch, dst, faults)?;
        self.launch(&params)
    }

    /// Each sample's entry checked against the arena, and its way from its frame header; the
    /// scratch bytes the batched decode needs.
    fn plan(
        &mut self,
        tag: u64,
        n: usize,
        arena: &[u8],
        faults: &mut Vec<DecodeFault>,
    ) -> (Vec<Way>, Vec<EncodedEntry>, usize) {
        let arena_len = arena.len() as u64;
        let mut ways = Vec::with_capacity(n);
        let mut infos = Vec::with_capacity(n);
        let mut scratch_bytes = 0usize;
        for k in 0..n {
            const E: usize = ENTRY_BYTES as usize;
            let raw: &[u8; E] = self.entries[k * E..(k + 1) * E]
                .try_into()
                .unwrap_or(&[0; E]);
            let fault = |problem: String, origin: String| DecodeFault {
                tag,
                sample: k as u32,
                origin,
                problem,
            };
            let e = match EncodedEntry::checked(raw, arena_len) {
                Ok(e) => e,
                Err(p) => {
                    faults.push(fault(p, "unknown".into()));
                    ways.push(Way::Zeros);
                    infos.push(EncodedEntry::default());
                    continue;
                }
            };
            infos.push(e);
            if e.zeros() {
                ways.push(Way::Zeros);
                continue;
            }
            let bytes = &arena[e.range()];
            let way = match crate::decode::jpeg_frame(bytes) {
                Some(f) if (f.width, f.height) != (e.width, e.height) => {
                    faults.push(fault(
                        format!(
                            "the image is {}x{}, its entry says {}x{}",
                            f.width, f.height, e.width, e.height
                        ),
                        e.origin().to_string(),
                    ));
                    Way::Zeros
                }
                Some(f) if f.sequential_8bit() && matches!(f.components, 1 | 3) => {
                    let at = scratch_bytes;
                    scratch_bytes += (e.width as usize) * (e.height as usize) * 3;
                    Way::Batched { scratch: at }
                }
                Some(f) if f.sequential_8bit() => {
                    self.counts.cpu_components += 1;
                    Way::Cpu
                }
                Some(_) => {
                    // Progressive, lossless, arithmetic-coded or 12-bit.
                    self.counts.cpu_unsupported += 1;
                    Way::Cpu
                }
                None => {
                    // Not a JPEG (a PNG), or headers that break: the CPU says which.
                    self.counts.cpu_not_jpeg += 1;
                    Way::Cpu
                }
            };
            ways.push(way);
        }
        (ways, infos, scratch_bytes)
    }

    /// The batched decode of the samples whose way is `Batched`, into `scratch`; if nvJPEG
    /// fails the batch, their way becomes the CPU.
    ///
    /// # Safety
    /// As [`GpuDecoder::decode`]: `arena` stays valid until the stream has run the decode.
    unsafe fn decode_batched(
        &mut self,
        arena: &[u8],
        infos: &[EncodedEntry],
        ways: &mut [Way],
        scratch: u64,
    ) {
        let stream_ptr = self.stream.cu_stream() as *mut std::ffi::c_void;
        let mut batch: Vec<(usize, &[u8], NvImage)> = Vec::new();
        for (k, w) in ways.iter().enumerate() {
            if let Way::Batched { scratch: at } = w {
                let e = &infos[k];
                let bytes = &arena[e.range()];
                let mut img = NvImage {
                    channel: [std::ptr::null_mut(); 4],
                    pitch: [0; 4],
                };
                img.channel[0] = (scratch + *at as u64) as *mut u8;
                img.pitch[0] = e.width as usize * 3;
                batch.push((k, bytes, img));
            }
        }
        if batch.is_empty() {
            return;
        }
        let images: Vec<&[u8]> = batch.iter().map(|b| b.1).collect();
        let mut out: Vec<NvImage> = batch.iter().map(|b| b.2).collect();
        // SAFETY: the bitstreams lie in the caller's chunk, kept valid until the stream has
        // run; each plane is width × 3 × height bytes of the scratch, which stays allocated
        // (it is replaced only after a stream synchronize, `room`).
        match unsafe { self.nvjpeg.decode_batched(&images, &mut out, stream_ptr) } {
            Ok(()) => self.counts.gpu += batch.len() as u64,
            Err(err) => {
                // One image the engine refuses fails the whole batch (the hardware backend
                // has no single-image decode): the CPU decodes the batch's images instead,
                // and names the bad one.
                tracing::warn!("{err}: the part's {} images go to the CPU", batch.len());
                self.last_batch_error = Some(err.to_string());
                for (k, _, _) in &batch {
                    self.counts.cpu_batch_failed += 1;
                    ways[*k] = Way::Cpu;
                }
            }
        }
    }

    /// The kernel's view of each sample; a sample whose way is the CPU is decoded here and
    /// copied into place (the kernel leaves it alone), or zeros with a fault.
    #[allow(clippy::too_many_arguments)]
    fn kernel_samples(
        &mut self,
        tag: u64,
        arena: &[u8],
        infos: &[EncodedEntry],
        ways: &[Way],
        scratch: u64,
        dst: u64,
        faults: &mut Vec<DecodeFault>,
    ) -> Result<Vec<KernelSample>, BackendError> {
        let sb = self.spec.sample_bytes();
        let mut params = Vec::with_capacity(ways.len());
        for (k, w) in ways.iter().enumerate() {
            let e = &infos[k];
            let out = dst + (k * sb) as u64;
            let mut p = KernelSample {
                dst: out,
                flip: i32::from(e.flipped()),
                ..KernelSample::default()
            };
            match w {
                Way::Batched { scratch: at } => {
                    p.mode = RESAMPLE;
                    p.src = scratch + *at as u64;
                    p.src_w = e.width as i32;
                    p.src_h = e.height as i32;
                    p.pitch = e.width as i32 * 3;
                    let [l, t, bw, bh] = e.crop;
                    (p.left, p.top, p.box_w, p.box_h) = (l as f32, t as f32, bw as f32, bh as f32);
                }
                Way::Zeros => p.mode = ZEROS,
                Way::Cpu => {
                    // Our own copy of the bytes for the CPU's decoder.
                    let bytes = arena[e.range()].to_vec();
                    self.cpu_out.resize(sb, 0);
                    match self.cpu.process_planned(
                        &bytes,
                        e.crop_box(),
                        e.flipped(),
                        &mut self.cpu_out,
                    ) {
                        Ok(_) => {
                            p.mode = LEAVE;
                            // SAFETY: `out..out+sb` is this sample's place in the caller's
                            // destination; pageable memory is staged before the call returns.
                            unsafe {
                                raw::memcpy_htod_async(out, self.cpu_out.as_ptr(), sb, &self.stream)
                            }
                            .map_err(|err| {
                                cuda_error(
                                    "cuMemcpyHtoDAsync",
                                    format!("a CPU-decoded sample of {sb} bytes"),
                                    err.0,
                                )
                            })?;
                        }
                        Err(err) => {
                            self.counts.failed += 1;
                            faults.push(DecodeFault {
                                tag,
                                sample: k as u32,
                                origin: e.origin().to_string(),
                                problem: err.to_string(),
                            });
                            p.mode = ZEROS;
                        }
                    }
                }
            }
            params.push(p);
        }
        Ok(params)
    }

    /// The kernel over a part's samples (`params`), after copying them to the device.
    fn launch(&mut self, params: &[KernelSample]) -> Result<(), BackendError> {
        let pbytes = std::mem::size_of_val(params);
        let pdev = Self::room(&self.ctx, &self.stream, &mut self.params, pbytes)?;
        // SAFETY: `pdev` holds at least `pbytes`; the host vector is staged before the call
        // returns (pageable); stream order puts the copy before the kernel that reads it and
        // after the previous kernel that read the same memory.
        unsafe { raw::memcpy_htod_async(pdev, params.as_ptr().cast(), pbytes, &self.stream) }
            .map_err(|e| {
                cuda_error(
                    "cuMemcpyHtoDAsync",
                    "the decode kernel's samples".into(),
                    e.0,
                )
            })?;
        let side = self.spec.transform.crop() as i32;
        let (kind, mean, std) = match self.spec.output {
            Output::U8Hwc => (0i32, [0.0f32; 3], [1.0f32; 3]),
            Output::Normalized { dtype, mean, std } => (
                match dtype {
                    Float::F16 => 1,
                    Float::Bf16 => 2,
                    Float::F32 => 3,
                },
                mean,
                std,
            ),
        };
        let pixels = (side as u32) * (side as u32);
        let cfg = LaunchConfig {
            grid_dim: (pixels.div_ceil(BLOCK), params.len() as u32, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&self.function);
        launch
            .arg(&pdev)
            .arg(&side)
            .arg(&kind)
            .arg(&mean[0])
            .arg(&mean[1])
            .arg(&mean[2])
            .arg(&std[0])
            .arg(&std[1])
            .arg(&std[2]);
        // SAFETY: the arguments match the kernel's signature (u64, int, int, 6 floats); every
        // address it reads (the samples, the scratch) or writes (each sample's `sb` bytes at
        // dst + k × sb, inside the caller's destination) is live until the stream has run it.
        unsafe { launch.launch(cfg) }
            .map_err(|e| cuda_error("cuLaunchKernel", KERNEL.into(), e.0))?;
        Ok(())
    }
}

impl crate::decode::Decoder for GpuDecoder {
    fn spec(&self) -> &SampleSpec {
        &self.spec
    }
}

impl Drop for GpuDecoder {
    fn drop(&mut self) {
        // nvJPEG's objects and the scratch go once nothing queued uses them.
        let _ = self.stream.synchronize();
    }
}
