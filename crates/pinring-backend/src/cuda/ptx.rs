//! Hand-written PTX for the two device kernels, JIT-compiled by the driver at run time
//! (`cuModuleLoadData`, through cudarc's `CudaContext::load_module`), so no NVRTC or nvcc is
//! needed. Target `sm_80`, PTX ISA 7.8 (CUDA 11.8+ drivers); the driver JIT compiles it for the
//! actual GPU (e.g. sm_90 on H100/H200).
//!
//! - `pinring_checksum(src, nwords, out)`: grid-stride over `nwords` u64 words; each thread
//!   accumulates `mix64(w ^ i * 0x9E3779B97F4A7C15)` (see `checksum.rs`), the warp sums its 32
//!   partial sums with butterfly shuffles, and lane 0 does one `atom.global.add.u64` into `*out`.
//!   Wrapping addition is commutative, so the result equals the host reference for whole words;
//!   the (zero-padded) tail word is added on the host.
//! - `pinring_sin_f32(data, n)`: grid-stride `data[i] = sin.approx(data[i])` over `n` f32s.
//!
//! Launch contract (both): 1-D grid, 1-D block whose size is a multiple of 32 (we use 256),
//! so every warp is full (the shuffles use the full member mask).

use std::ffi::CStr;

/// Name of the checksum entry point.
pub const CHECKSUM_KERNEL: &CStr = c"pinring_checksum";
/// Name of the sin entry point.
pub const SIN_KERNEL: &CStr = c"pinring_sin_f32";
/// Threads per block for both kernels (multiple of 32, see module docs).
pub const BLOCK: u32 = 256;

/// The PTX module text (NUL-terminated).
pub const PTX: &CStr = c"
.version 7.8
.target sm_80
.address_size 64

// pinring_checksum(const u64 *src, u64 nwords, u64 *out)
.visible .entry pinring_checksum(
    .param .u64 ck_src,
    .param .u64 ck_nwords,
    .param .u64 ck_out
)
{
    .reg .pred  %p<4>;
    .reg .b32   %r<12>;
    .reg .b64   %rd<20>;

    ld.param.u64        %rd1, [ck_src];         // rd1 = src (generic address)
    ld.param.u64        %rd2, [ck_nwords];      // rd2 = nwords
    ld.param.u64        %rd3, [ck_out];         // rd3 = out (generic address)
    cvta.to.global.u64  %rd1, %rd1;             // rd1 = src (global address)
    cvta.to.global.u64  %rd3, %rd3;             // rd3 = out (global address)

    mov.u32             %r1, %ctaid.x;          // r1 = blockIdx.x
    mov.u32             %r2, %ntid.x;           // r2 = blockDim.x
    mov.u32             %r3, %tid.x;            // r3 = threadIdx.x
    mov.u32             %r4, %nctaid.x;         // r4 = gridDim.x
    mul.wide.u32        %rd4, %r1, %r2;         // rd4 = blockIdx.x * blockDim.x
    cvt.u64.u32         %rd5, %r3;              // rd5 = threadIdx.x
    add.u64             %rd4, %rd4, %rd5;       // rd4 = i (word index, 64-bit)
    mul.wide.u32        %rd6, %r4, %r2;         // rd6 = stride = gridDim.x * blockDim.x
    mov.u64             %rd7, 0;                // rd7 = acc (this thread's wrapping sum)

    setp.ge.u64         %p1, %rd4, %rd2;        // p1 = i >= nwords
    @%p1 bra            CK_REDUCE;

CK_LOOP:
    shl.b64             %rd8, %rd4, 3;          // rd8 = i * 8 (byte offset)
    add.u64             %rd9, %rd1, %rd8;       // rd9 = &src[i]
    ld.global.nc.u64    %rd10, [%rd9];          // rd10 = z = w_i
    mul.lo.u64          %rd11, %rd4, 0x9E3779B97F4A7C15; // rd11 = i * K (mod 2^64)
    xor.b64             %rd10, %rd10, %rd11;    // z = w_i ^ (i * K)
    shr.u64             %rd12, %rd10, 30;       // rd12 = z >> 30
    xor.b64             %rd10, %rd10, %rd12;    // z ^= z >> 30
    mul.lo.u64          %rd10, %rd10, 0xBF58476D1CE4E5B9; // z *= 0xBF58476D1CE4E5B9
    shr.u64             %rd12, %rd10, 27;       // rd12 = z >> 27
    xor.b64             %rd10, %rd10, %rd12;    // z ^= z >> 27
    mul.lo.u64          %rd10, %rd10, 0x94D049BB133111EB; // z *= 0x94D049BB133111EB
    shr.u64             %rd12, %rd10, 31;       // rd12 = z >> 31
    xor.b64             %rd10, %rd10, %rd12;    // z ^= z >> 31  (= mix64(w_i ^ i*K))
    add.u64             %rd7, %rd7, %rd10;      // acc += term
    add.u64             %rd4, %rd4, %rd6;       // i += stride
    setp.lt.u64         %p2, %rd4, %rd2;        // p2 = i < nwords
    @%p2 bra            CK_LOOP;

CK_REDUCE:
    // Warp butterfly sum of acc (64-bit as two 32-bit halves), all 32 lanes participate.
    mov.b64             {%r5, %r6}, %rd7;       // r5 = lo(acc), r6 = hi(acc)
    shfl.sync.bfly.b32  %r7, %r5, 16, 31, -1;   // r7 = lo(acc) of lane ^ 16
    shfl.sync.bfly.b32  %r8, %r6, 16, 31, -1;   // r8 = hi(acc) of lane ^ 16
    mov.b64             %rd13, {%r7, %r8};      // rd13 = acc of lane ^ 16
    add.u64             %rd7, %rd7, %rd13;      // acc += partner's acc
    mov.b64             {%r5, %r6}, %rd7;
    shfl.sync.bfly.b32  %r7, %r5, 8, 31, -1;
    shfl.sync.bfly.b32  %r8, %r6, 8, 31, -1;
    mov.b64             %rd13, {%r7, %r8};
    add.u64             %rd7, %rd7, %rd13;
    mov.b64             {%r5, %r6}, %rd7;
    shfl.sync.bfly.b32  %r7, %r5, 4, 31, -1;
    shfl.sync.bfly.b32  %r8, %r6, 4, 31, -1;
    mov.b64             %rd13, {%r7, %r8};
    add.u64             %rd7, %rd7, %rd13;
    mov.b64             {%r5, %r6}, %rd7;
    shfl.sync.bfly.b32  %r7, %r5, 2, 31, -1;
    shfl.sync.bfly.b32  %r8, %r6, 2, 31, -1;
    mov.b64             %rd13, {%r7, %r8};
    add.u64             %rd7, %rd7, %rd13;
    mov.b64             {%r5, %r6}, %rd7;
    shfl.sync.bfly.b32  %r7, %r5, 1, 31, -1;
    shfl.sync.bfly.b32  %r8, %r6, 1, 31, -1;
    mov.b64             %rd13, {%r7, %r8};
    add.u64             %rd7, %rd7, %rd13;      // acc = sum over the warp (every lane)

    and.b32             %r9, %r3, 31;           // r9 = lane = threadIdx.x % 32
    setp.ne.u32         %p3, %r9, 0;            // p3 = not lane 0
    @%p3 bra            CK_DONE;
    atom.global.add.u64 %rd14, [%rd3], %rd7;    // *out += warp sum (rd14 = old, unused)

CK_DONE:
    ret;
}

// pinring_sin_f32(float *data, u64 n)
.visible .entry pinring_sin_f32(
    .param .u64 sn_data,
    .param .u64 sn_n
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<5>;
    .reg .f32   %f<3>;
    .reg .b64   %rd<8>;

    ld.param.u64        %rd1, [sn_data];        // rd1 = data (generic address)
    ld.param.u64        %rd2, [sn_n];           // rd2 = n
    cvta.to.global.u64  %rd1, %rd1;             // rd1 = data (global address)

    mov.u32             %r1, %ctaid.x;          // r1 = blockIdx.x
    mov.u32             %r2, %ntid.x;           // r2 = blockDim.x
    mov.u32             %r3, %tid.x;            // r3 = threadIdx.x
    mov.u32             %r4, %nctaid.x;         // r4 = gridDim.x
    mul.wide.u32        %rd3, %r1, %r2;         // rd3 = blockIdx.x * blockDim.x
    cvt.u64.u32         %rd4, %r3;              // rd4 = threadIdx.x
    add.u64             %rd3, %rd3, %rd4;       // rd3 = i
    mul.wide.u32        %rd5, %r4, %r2;         // rd5 = stride

    setp.ge.u64         %p1, %rd3, %rd2;        // p1 = i >= n
    @%p1 bra            SN_DONE;

SN_LOOP:
    shl.b64             %rd6, %rd3, 2;          // rd6 = i * 4
    add.u64             %rd7, %rd1, %rd6;       // rd7 = &data[i]
    ld.global.f32       %f1, [%rd7];            // f1 = x
    sin.approx.f32      %f2, %f1;               // f2 = sin(x)
    st.global.f32       [%rd7], %f2;            // data[i] = sin(x)
    add.u64             %rd3, %rd3, %rd5;       // i += stride
    setp.lt.u64         %p2, %rd3, %rd2;        // p2 = i < n
    @%p2 bra            SN_LOOP;

SN_DONE:
    ret;
}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_names_match_entry_points() {
        let text = PTX.to_str().unwrap();
        for name in [CHECKSUM_KERNEL, SIN_KERNEL] {
            let n = name.to_str().unwrap();
            assert!(text.contains(&format!(".visible .entry {n}(")), "{n}");
        }
        assert_eq!(BLOCK % 32, 0);
    }

    #[test]
    fn ptx_constants_match_reference() {
        let text = PTX.to_str().unwrap();
        for k in [
            crate::checksum::INDEX_MUL,
            0xBF58_476D_1CE4_E5B9,
            0x94D0_49BB_1331_11EB,
        ] {
            assert!(
                text.contains(&format!("{k:#X}").replace("0X", "0x")),
                "{k:#x}"
            );
        }
    }
}
