// pinring's crop, resize, flip and output kernel for images decoded on the GPU
// (docs/ARCHITECTURE.md, "Decoding on copy"). Compiled at run time by NVRTC (no headers).
//
// One thread per output pixel of one sample (blockIdx.y is the sample). The resampling is the
// CPU path's: a separable triangle (bilinear) filter widened by the shrink factor, as PIL's and
// fast_image_resize's convolution, over the crop box (fractional edges) of the decoded image,
// then rounded to 8 bits; a flipped sample takes its columns mirrored. Output: u8 HWC, or
// (v / 255 - mean) / std in CHW as f16, bf16 (round to nearest even) or f32.

struct Sample {                 // 64 bytes, written by the host (decoder.rs, `KernelSample`)
    unsigned long long src;     // device address of the decoded RGB image (3 bytes a pixel)
    unsigned long long dst;     // device address of the sample's output
    int src_w, src_h, pitch;    // the decoded image: pixels, pixels, bytes a row
    int mode;                   // 0 resample, 1 zeros, 2 leave alone (written by a copy)
    float left, top, box_w, box_h;
    int flip, pad0, pad1, pad2;
};

__device__ __forceinline__ float tri(float x) {
    x = fabsf(x);
    return x < 1.0f ? 1.0f - x : 0.0f;
}

// The taps of output position i on one axis: [lo, hi) of the input, the filter's centre and
// its scale (1 / max(shrink, 1)).
__device__ __forceinline__ void taps(int i, float b0, float bs, int out, int in_size,
                                     int* lo, int* hi, float* center, float* ss) {
    float scale = bs / (float)out;
    float fs = fmaxf(scale, 1.0f);
    *center = b0 + ((float)i + 0.5f) * scale;
    *ss = 1.0f / fs;
    int l = (int)(*center - fs + 0.5f);
    int h = (int)(*center + fs + 0.5f);
    *lo = l < 0 ? 0 : l;
    *hi = h > in_size ? in_size : h;
}

__device__ __forceinline__ unsigned short to_f16(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ unsigned short to_bf16(float x) {
    unsigned int b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (unsigned short)(b >> 16);
}

extern "C" __global__ void pinring_resize_crop(const Sample* samples, int side, int kind,
                                               float m0, float m1, float m2,
                                               float s0, float s1, float s2) {
    const Sample s = samples[blockIdx.y];
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (s.mode == 2 || p >= side * side) return;
    int oy = p / side, ox = p % side;
    float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f;
    if (s.mode == 0) {
        int sx = s.flip ? side - 1 - ox : ox;
        int xlo, xhi, ylo, yhi;
        float xc, xss, yc, yss;
        taps(sx, s.left, s.box_w, side, s.src_w, &xlo, &xhi, &xc, &xss);
        taps(oy, s.top, s.box_h, side, s.src_h, &ylo, &yhi, &yc, &yss);
        float wx_sum = 0.0f;
        for (int x = xlo; x < xhi; ++x) wx_sum += tri(((float)x - xc + 0.5f) * xss);
        float wy_sum = 0.0f;
        const unsigned char* img = (const unsigned char*)s.src;
        for (int y = ylo; y < yhi; ++y) {
            float wy = tri(((float)y - yc + 0.5f) * yss);
            if (wy == 0.0f) continue;
            wy_sum += wy;
            const unsigned char* row = img + (size_t)y * (size_t)s.pitch;
            float r = 0.0f, g = 0.0f, b = 0.0f;
            for (int x = xlo; x < xhi; ++x) {
                float wx = tri(((float)x - xc + 0.5f) * xss);
                const unsigned char* px = row + 3 * x;
                r += wx * (float)px[0];
                g += wx * (float)px[1];
                b += wx * (float)px[2];
            }
            v0 += wy * r;
            v1 += wy * g;
            v2 += wy * b;
        }
        float norm = wx_sum * wy_sum;
        norm = norm > 0.0f ? 1.0f / norm : 0.0f;
        v0 = fminf(fmaxf(floorf(v0 * norm + 0.5f), 0.0f), 255.0f);
        v1 = fminf(fmaxf(floorf(v1 * norm + 0.5f), 0.0f), 255.0f);
        v2 = fminf(fmaxf(floorf(v2 * norm + 0.5f), 0.0f), 255.0f);
    }
    if (kind == 0) {
        unsigned char* out = (unsigned char*)s.dst + 3 * (size_t)p;
        out[0] = (unsigned char)v0;
        out[1] = (unsigned char)v1;
        out[2] = (unsigned char)v2;
        return;
    }
    float v[3] = {v0, v1, v2};
    float m[3] = {m0, m1, m2};
    float sd[3] = {s0, s1, s2};
    size_t plane = (size_t)side * (size_t)side;
    for (int c = 0; c < 3; ++c) {
        // A sample of zeros is zeros in every output, as the CPU path writes it.
        float x = s.mode == 1 ? 0.0f : (v[c] / 255.0f - m[c]) / sd[c];
        size_t at = (size_t)c * plane + (size_t)p;
        if (kind == 3) {
            ((float*)s.dst)[at] = x;
        } else if (kind == 1) {
            ((unsigned short*)s.dst)[at] = s.mode == 1 ? 0 : to_f16(x);
        } else {
            ((unsigned short*)s.dst)[at] = s.mode == 1 ? 0 : to_bf16(x);
        }
    }
}
