// pinring's crop, resize, flip and output kernels for images decoded on the GPU
// (docs/ARCHITECTURE.md, "Decoding on copy"). Compiled at run time by NVRTC (no headers), with
// --fmad=false: the coefficients are computed in f64 exactly as the CPU path computes them.
//
// The resampling is the CPU path's (fast_image_resize's u8 convolution, PIL's antialiased
// bilinear), bit for bit on the same decoded pixels: per axis, the triangle filter widened by
// the shrink factor over the fractional crop box, weights normalised in f64 and quantised to
// i16 at the precision the axis's largest weight allows; a vertical pass into u8 rows, then a
// horizontal pass, each rounded and clipped to 8 bits. Three launches per part:
//   pinring_coeffs      one block per sample and axis: bounds, i16 weights and precision;
//   pinring_vertical    one thread per (output row, source column) of the box's columns;
//   pinring_horizontal  one thread per output pixel: the horizontal pass, the flip and the
//                       output (u8 HWC, or the CPU path's table of f16/bf16/f32 values, CHW).

struct Sample {                 // 72 bytes, written by the host (decoder.rs, `KernelSample`)
    unsigned long long src;     // device address of the decoded RGB image (3 bytes a pixel)
    unsigned long long dst;     // device address of the sample's output
    double left, top, box_w, box_h;
    int src_w, src_h, pitch;    // the decoded image: pixels, pixels, bytes a row
    int mode;                   // 0 resample, 1 zeros, 2 leave alone (written by a copy)
    int flip, pad0;
};

// One axis of one sample: where its work lives in the part's scratch.
struct Axis {
    short* coef;    // side × window weights
    int* bounds;    // side × (first input, count)
    int* prec;      // the precision of the weights
};

__device__ __forceinline__ Axis axis_of(char* work, int side, int window, int s, int a) {
    size_t per = ((size_t)side * (size_t)window * 2 + (size_t)side * 8 + 16 + 15) & ~(size_t)15;
    char* base = work + ((size_t)s * 2 + (size_t)a) * per;
    Axis ax;
    ax.bounds = (int*)base;
    ax.prec = (int*)(base + (size_t)side * 8);
    ax.coef = (short*)(base + (size_t)side * 8 + 16);
    return ax;
}

__device__ __forceinline__ double tri(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

// Output i's filter on one axis: its input range [lo, hi) after the zero weights at either end
// are dropped, and the sum of its weights.
__device__ void taps(double in0, double scale, double radius, double recip, int in_size, int i,
                     int* lo, int* hi, double* sum) {
    double in_center = in0 + ((double)i + 0.5) * scale;
    int x_min = (int)fmax(floor(in_center - radius), 0.0);
    int x_max = (int)fmin(ceil(in_center + radius), (double)in_size);
    double center = in_center - 0.5;
    int start = x_min;
    double ww = 0.0;
    for (int x = x_min; x < x_max; ++x) {
        double w = tri(((double)x - center) * recip);
        if (x == start && w == 0.0) {
            start += 1;
        } else {
            ww += w;
        }
    }
    int end = x_max;
    while (end > start && tri(((double)(end - 1) - center) * recip) == 0.0) end -= 1;
    *lo = start;
    *hi = end;
    *sum = ww;
}

extern "C" __global__ void pinring_coeffs(const Sample* samples, int side, int window,
                                          char* work) {
    __shared__ double block_max[256];
    const Sample s = samples[blockIdx.x];
    if (s.mode != 0) return;
    const int a = blockIdx.y;
    Axis ax = axis_of(work, side, window, blockIdx.x, a);
    int in_size = a == 0 ? s.src_w : s.src_h;
    double in0 = a == 0 ? s.left : s.top;
    double len = a == 0 ? s.box_w : s.box_h;
    len = fmin(len, (double)in_size - in0);
    bool need = (double)side != len || in0 != round(in0);
    if (!need) {
        // An integer offset and no change of size: each output takes one input, whole.
        for (int i = threadIdx.x; i < side; i += blockDim.x) {
            ax.bounds[2 * i] = (int)in0 + i;
            ax.bounds[2 * i + 1] = 1;
            ax.coef[(size_t)i * window] = 1 << 14;
        }
        if (threadIdx.x == 0) *ax.prec = 14;
        return;
    }
    double in1 = in0 + len;
    double scale = (in1 - in0) / (double)side;
    double fs = fmax(scale, 1.0);
    double radius = fs;
    double recip = 1.0 / fs;
    double mx = 0.0;
    for (int i = threadIdx.x; i < side; i += blockDim.x) {
        int lo, hi;
        double ww;
        taps(in0, scale, radius, recip, in_size, i, &lo, &hi, &ww);
        double center = in0 + ((double)i + 0.5) * scale - 0.5;
        for (int x = lo; x < hi; ++x) {
            double w = tri(((double)x - center) * recip);
            if (ww != 0.0) w /= ww;
            mx = fmax(mx, w);
        }
    }
    block_max[threadIdx.x] = mx;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            block_max[threadIdx.x] = fmax(block_max[threadIdx.x], block_max[threadIdx.x + half]);
        }
        __syncthreads();
    }
    mx = block_max[0];
    int precision = 0;
    for (int p = 0; p < 22; ++p) {
        precision = p;
        if ((int)round(mx * (double)(1 << (p + 1))) >= (1 << 15)) break;
    }
    double q = (double)(1 << precision);
    for (int i = threadIdx.x; i < side; i += blockDim.x) {
        int lo, hi;
        double ww;
        taps(in0, scale, radius, recip, in_size, i, &lo, &hi, &ww);
        double center = in0 + ((double)i + 0.5) * scale - 0.5;
        if (hi - lo > window) hi = lo + window;  // cannot happen: the host sized the window
        ax.bounds[2 * i] = lo;
        ax.bounds[2 * i + 1] = hi - lo;
        for (int x = lo; x < hi; ++x) {
            double w = tri(((double)x - center) * recip);
            if (ww != 0.0) w /= ww;
            ax.coef[(size_t)i * window + (x - lo)] = (short)round(w * q);
        }
    }
    if (threadIdx.x == 0) *ax.prec = precision;
}

__device__ __forceinline__ unsigned char clip8(int v, int prec) {
    v >>= prec;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// The vertical pass: row oy of the output height over the columns the horizontal filter reads
// (from the first output's first input to the last output's last), into u8 rows of temp_w
// pixels.
extern "C" __global__ void pinring_vertical(const Sample* samples, int side, int window,
                                            int temp_w, char* work, unsigned char* temp) {
    const Sample s = samples[blockIdx.y];
    if (s.mode != 0) return;
    Axis hx = axis_of(work, side, window, blockIdx.y, 0);
    Axis vy = axis_of(work, side, window, blockIdx.y, 1);
    int x_first = hx.bounds[0];
    int width = hx.bounds[2 * (side - 1)] + hx.bounds[2 * (side - 1) + 1] - x_first;
    if (width > temp_w) width = temp_w;  // cannot happen: the host sized temp_w
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= side * width) return;
    int oy = p / width, xx = p % width;
    int start = vy.bounds[2 * oy], count = vy.bounds[2 * oy + 1];
    const short* k = vy.coef + (size_t)oy * window;
    int prec = *vy.prec;
    const unsigned char* col = (const unsigned char*)s.src + 3 * (size_t)(x_first + xx);
    int r = 1 << (prec - 1), g = r, b = r;
    for (int j = 0; j < count; ++j) {
        const unsigned char* px = col + (size_t)(start + j) * (size_t)s.pitch;
        r += (int)px[0] * (int)k[j];
        g += (int)px[1] * (int)k[j];
        b += (int)px[2] * (int)k[j];
    }
    unsigned char* out = temp + ((size_t)blockIdx.y * side + oy) * (size_t)temp_w * 3 + 3 * xx;
    out[0] = clip8(r, prec);
    out[1] = clip8(g, prec);
    out[2] = clip8(b, prec);
}

// The horizontal pass over the vertical pass's rows, the flip (a flipped sample's column ox is
// the resampled column side-1-ox) and the output. kind: 0 u8 HWC; else `esize`-byte elements
// CHW from `table` (per channel, the element's bytes for each u8 value, 4 bytes apart).
extern "C" __global__ void pinring_horizontal(const Sample* samples, int side, int window,
                                              int temp_w, char* work,
                                              const unsigned char* temp, int kind, int esize,
                                              const unsigned char* table) {
    const Sample s = samples[blockIdx.y];
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (s.mode == 2 || p >= side * side) return;
    size_t plane = (size_t)side * (size_t)side;
    if (s.mode == 1) {
        // A sample of zeros is zeros in every output, as the CPU path writes it.
        if (kind == 0) {
            unsigned char* out = (unsigned char*)s.dst + 3 * (size_t)p;
            out[0] = out[1] = out[2] = 0;
        } else {
            for (int c = 0; c < 3; ++c) {
                unsigned char* e = (unsigned char*)s.dst + ((size_t)c * plane + p) * esize;
                for (int i = 0; i < esize; ++i) e[i] = 0;
            }
        }
        return;
    }
    Axis hx = axis_of(work, side, window, blockIdx.y, 0);
    int oy = p / side, ox = p % side;
    int sx = s.flip ? side - 1 - ox : ox;
    int x_first = hx.bounds[0];
    int start = hx.bounds[2 * sx] - x_first, count = hx.bounds[2 * sx + 1];
    if (start + count > temp_w) count = temp_w - start;  // cannot happen, as above
    const short* k = hx.coef + (size_t)sx * window;
    int prec = *hx.prec;
    const unsigned char* row = temp + ((size_t)blockIdx.y * side + oy) * (size_t)temp_w * 3;
    int acc[3] = {1 << (prec - 1), 1 << (prec - 1), 1 << (prec - 1)};
    for (int j = 0; j < count; ++j) {
        const unsigned char* px = row + 3 * (size_t)(start + j);
        acc[0] += (int)px[0] * (int)k[j];
        acc[1] += (int)px[1] * (int)k[j];
        acc[2] += (int)px[2] * (int)k[j];
    }
    if (kind == 0) {
        unsigned char* out = (unsigned char*)s.dst + 3 * (size_t)p;
        for (int c = 0; c < 3; ++c) out[c] = clip8(acc[c], prec);
        return;
    }
    for (int c = 0; c < 3; ++c) {
        const unsigned char* t = table + ((size_t)c * 256 + clip8(acc[c], prec)) * 4;
        unsigned char* e = (unsigned char*)s.dst + ((size_t)c * plane + p) * esize;
        for (int i = 0; i < esize; ++i) e[i] = t[i];
    }
}
