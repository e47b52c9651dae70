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
use pinring_image::{Output, Pipeline, SampleSpec};

use super::nvlibs::{self, NvImage, Nvjpeg, BACKEND_DEFAULT, BACKEND_GPU_HYBRID, BACKEND_HARDWARE};
use super::raw;
use crate::decode::{Decode, DecodeCounts, DecodeFault};
use crate::error::cuda_error;
use crate::BackendError;

/// The kernels' source, compiled by NVRTC when the engine gets its decoder.
const KERNEL_SRC: &str = include_str!("resize.cu");
const KERNELS: [&str; 3] = ["pinring_coeffs", "pinring_vertical", "pinring_horizontal"];
/// Threads a block (`pinring_coeffs` reduces over exactly this many).
const BLOCK: u32 = 256;

/// The kernels' view of one sample (`struct Sample` of `resize.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KernelSample {
    src: u64,
    dst: u64,
    /// The crop box in the decoded image, as the loader drew it (f64, as the CPU path uses it).
    left: f64,
    top: f64,
    box_w: f64,
    box_h: f64,
    src_w: i32,
    src_h: i32,
    pitch: i32,
    /// 0 resample, 1 zeros, 2 leave alone.
    mode: i32,
    flip: i32,
    pad: i32,
}

const _: () = assert!(std::mem::size_of::<KernelSample>() == 72);
const _: () = assert!(std::mem::align_of::<KernelSample>() == 8);

/// The scratch the resampling kernels need for a part: `window` weights an output and axis,
/// rows of `temp_w` pixels for the vertical pass.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sizes {
    window: usize,
    temp_w: usize,
}

impl Sizes {
    /// The largest filter and row over the part's resampled samples, from the same f64
    /// arithmetic as the kernels (`resize.cu`'s `pinring_coeffs`) and the CPU path.
    fn of(params: &[KernelSample], side: usize) -> Sizes {
        let mut s = Sizes {
            window: 1,
            temp_w: side,
        };
        for p in params.iter().filter(|p| p.mode == RESAMPLE) {
            let axes = [
                (p.src_w, p.left, p.box_w, true),
                (p.src_h, p.top, p.box_h, false),
            ];
            for (in_size, in0, len, horizontal) in axes {
                let len = len.min(f64::from(in_size) - in0);
                if side as f64 == len && in0 == in0.round() {
                    continue;
                }
                let scale = ((in0 + len) - in0) / side as f64;
                let reach = scale.max(1.0).ceil() as usize;
                s.window = s.window.max(reach * 2 + 1);
                if horizontal {
                    let w = (len.ceil() as usize + 2 * reach + 2).min(in_size.max(0) as usize);
                    s.temp_w = s.temp_w.max(w);
                }
            }
        }
        s
    }

    /// Bytes of one sample's axis in the work area (`resize.cu`'s `axis_of`).
    fn axis_bytes(self, side: usize) -> usize {
        (side * self.window * 2 + side * 8 + 16).next_multiple_of(16)
    }
}

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
    /// `KERNELS`, in order.
    functions: Vec<CudaFunction>,
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    /// The decoded images of a part (grown to fit).
    scratch: Option<raw::DeviceAlloc>,
    /// The kernels' samples (grown to fit).
    params: Option<raw::DeviceAlloc>,
    /// The resampling's weights and bounds, and its vertical pass's rows (grown to fit).
    work: Option<raw::DeviceAlloc>,
    temp: Option<raw::DeviceAlloc>,
    /// The output's table of normalised values (`Output::table`), on the device; none for u8.
    table: Option<raw::DeviceAlloc>,
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
        let functions = KERNELS
            .iter()
            .map(|k| {
                module
                    .load_function(k)
                    .map_err(|e| cuda_error("cuModuleGetFunction", (*k).into(), e.0))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let table = Self::upload_table(ctx, stream, &spec)?;
        tracing::info!(
            device,
            backend = nvjpeg.backend,
            "GPU decode ready (nvJPEG backend 3: the JPEG engine)"
        );
        Ok(GpuDecoder {
            spec,
            nvjpeg,
            functions,
            _module: module,
            stream: Arc::clone(stream),
            ctx: Arc::clone(ctx),
            scratch: None,
            params: None,
            work: None,
            temp: None,
            table,
            entries: Vec::new(),
            cpu: Pipeline::new(spec).map_err(|e| fail(e.to_string()))?,
            cpu_out: Vec::new(),
            counts: DecodeCounts::default(),
            last_batch_error: None,
        })
    }

    /// The CPU path's table of output values (`Output::table`) in device memory, for the
    /// kernel to write the same bytes; none for u8 output.
    fn upload_table(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        spec: &SampleSpec,
    ) -> Result<Option<raw::DeviceAlloc>, BackendError> {
        let table: Vec<u8> = spec
            .output
            .table()
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        if table.is_empty() {
            return Ok(None);
        }
        let mut slot = None;
        let at = Self::room(ctx, stream, &mut slot, table.len())?;
        // SAFETY: `at` holds at least table.len() bytes; the synchronize below keeps the host
        // vector alive until the copy has run.
        unsafe { raw::memcpy_htod_async(at, table.as_ptr(), table.len(), stream) }
            .map_err(|e| cuda_error("cuMemcpyHtoDAsync", "the output's table".into(), e.0))?;
        stream
            .synchronize()
            .map_err(|e| cuda_error("cuStreamSynchronize", "the copy stream".into(), e.0))?;
        Ok(slot)
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
            let fault = |problem: String, at: Option<(u32, u64)>| DecodeFault {
                tag,
                sample: k as u32,
                at,
                problem,
            };
            let e = match EncodedEntry::checked(raw, arena_len) {
                Ok(e) => e,
                Err(p) => {
                    faults.push(fault(p, None));
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
                        Some((e.file, e.member)),
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
                    [p.left, p.top, p.box_w, p.box_h] = e.crop;
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
                                at: Some((e.file, e.member)),
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

    /// Test hook: the kernels over one decoded RGB image, uploaded into the scratch, writing
    /// one sample at `dst`; returns the sample's bytes.
    #[cfg(test)]
    pub(crate) fn resample_raster(
        &mut self,
        rgb: &[u8],
        (w, h): (u32, u32),
        crop: [f64; 4],
        flip: bool,
        dst: u64,
    ) -> Result<usize, BackendError> {
        assert_eq!(rgb.len(), (w * h * 3) as usize);
        let at = Self::room(&self.ctx, &self.stream, &mut self.scratch, rgb.len())?;
        // SAFETY: the scratch holds rgb.len() bytes; the synchronize below keeps `rgb` alive
        // until the copy has run.
        unsafe { raw::memcpy_htod_async(at, rgb.as_ptr(), rgb.len(), &self.stream) }
            .map_err(|e| cuda_error("cuMemcpyHtoDAsync", "a test image".into(), e.0))?;
        let [left, top, box_w, box_h] = crop;
        let p = KernelSample {
            src: at,
            dst,
            left,
            top,
            box_w,
            box_h,
            src_w: w as i32,
            src_h: h as i32,
            pitch: (w * 3) as i32,
            mode: RESAMPLE,
            flip: i32::from(flip),
            pad: 0,
        };
        self.launch(&[p])?;
        self.stream
            .synchronize()
            .map_err(|e| cuda_error("cuStreamSynchronize", "the copy stream".into(), e.0))?;
        Ok(self.spec.sample_bytes())
    }

    /// The kernels over a part's samples (`params`), after copying them to the device.
    fn launch(&mut self, params: &[KernelSample]) -> Result<(), BackendError> {
        let pbytes = std::mem::size_of_val(params);
        let pdev = Self::room(&self.ctx, &self.stream, &mut self.params, pbytes)?;
        // SAFETY: `pdev` holds at least `pbytes`; the host vector is staged before the call
        // returns (pageable); stream order puts the copy before the kernels that read it and
        // after the previous part's kernels that read the same memory.
        unsafe { raw::memcpy_htod_async(pdev, params.as_ptr().cast(), pbytes, &self.stream) }
            .map_err(|e| {
                cuda_error(
                    "cuMemcpyHtoDAsync",
                    "the decode kernels' samples".into(),
                    e.0,
                )
            })?;
        let n = params.len();
        let side_u = self.spec.transform.crop() as usize;
        let sizes = Sizes::of(params, side_u);
        let work = Self::room(
            &self.ctx,
            &self.stream,
            &mut self.work,
            n * 2 * sizes.axis_bytes(side_u),
        )?;
        let temp = Self::room(
            &self.ctx,
            &self.stream,
            &mut self.temp,
            n * side_u * sizes.temp_w * 3,
        )?;
        let (kind, esize) = match self.spec.output {
            Output::U8Hwc => (0i32, 1i32),
            Output::Normalized { dtype, .. } => (1, dtype.size_of() as i32),
        };
        let table = self.table.as_ref().map_or(0, |t| t.ptr());
        let (side, window, temp_w) = (side_u as i32, sizes.window as i32, sizes.temp_w as i32);
        let grid = |threads: usize| (threads.div_ceil(BLOCK as usize) as u32, n as u32, 1);
        let [coeffs, vertical, horizontal] = [0, 1, 2].map(|k| &self.functions[k]);
        let mut a = self.stream.launch_builder(coeffs);
        a.arg(&pdev).arg(&side).arg(&window).arg(&work);
        let mut b = self.stream.launch_builder(vertical);
        b.arg(&pdev)
            .arg(&side)
            .arg(&window)
            .arg(&temp_w)
            .arg(&work)
            .arg(&temp);
        let mut c = self.stream.launch_builder(horizontal);
        c.arg(&pdev)
            .arg(&side)
            .arg(&window)
            .arg(&temp_w)
            .arg(&work)
            .arg(&temp)
            .arg(&kind)
            .arg(&esize)
            .arg(&table);
        let block = (BLOCK, 1, 1);
        let configs = [
            ((n as u32, 2, 1), a),
            (grid(side_u * sizes.temp_w), b),
            (grid(side_u * side_u), c),
        ];
        for (k, (grid_dim, mut launch)) in configs.into_iter().enumerate() {
            let cfg = LaunchConfig {
                grid_dim,
                block_dim: block,
                shared_mem_bytes: 0,
            };
            // SAFETY: each builder's arguments match its kernel's signature in `resize.cu`
            // (addresses as u64, ints); every address a kernel reads (the samples, the decoded
            // images, the work area, the rows, the table) or writes (the work area and rows,
            // sized above from the same samples; each sample's `sb` bytes at dst + k × sb,
            // inside the caller's destination) is live until the stream has run it.
            unsafe { launch.launch(cfg) }
                .map_err(|e| cuda_error("cuLaunchKernel", KERNELS[k].into(), e.0))?;
        }
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
