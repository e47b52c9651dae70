// Runs the GPU decoder's kernels (src/cuda/resize.cu, included as they are) on the CPU: a
// block's threads are threads meeting at a barrier for __syncthreads, built with
// -ffp-contract=off as NVRTC compiles them with --fmad=false. Reads the cases kernel_on_cpu.rs
// wrote (an RGB image, a box, a flip, the CPU path's sample) and prints how many differ.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
using std::fabs; using std::floor; using std::ceil; using std::round; using std::fmax; using std::fmin;
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim{256, 1, 1};
static std::barrier<>* bar;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
static void __syncthreads() { bar->arrive_and_wait(); }
#include KERNEL
int main(int argc, char** argv) {
    if (argc != 2) return 2;
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 2;
    const int side = 224;
    int n = 0, bad = 0;
    while (true) {
        uint32_t w, h, flip; double box[4];
        if (fread(&w, 4, 1, f) != 1) break;
        fread(&h, 4, 1, f); fread(box, 8, 4, f); fread(&flip, 4, 1, f);
        std::vector<unsigned char> px(w * h * 3), want(side * side * 3), got(side * side * 3, 7);
        fread(px.data(), 1, px.size(), f); fread(want.data(), 1, want.size(), f);
        Sample s{};
        s.src = (unsigned long long)px.data(); s.dst = (unsigned long long)got.data();
        s.left = box[0]; s.top = box[1]; s.box_w = box[2]; s.box_h = box[3];
        s.src_w = w; s.src_h = h; s.pitch = w * 3; s.mode = 0; s.flip = flip;
        // Host sizes, as decoder.rs computes them (generous here).
        // decoder.rs's Sizes::of, restated.
        int window = 1, temp_w = side;
        double ax[2][3] = {{(double)w, box[0], box[2]}, {(double)h, box[1], box[3]}};
        for (int a = 0; a < 2; ++a) {
            double in_size = ax[a][0], in0 = ax[a][1], len = std::min(ax[a][2], in_size - in0);
            if ((double)side == len && in0 == std::round(in0)) continue;
            double scale = ((in0 + len) - in0) / side;
            int reach = (int)std::ceil(std::max(scale, 1.0));
            window = std::max(window, reach * 2 + 1);
            if (a == 0) temp_w = std::max(temp_w, std::min((int)std::ceil(len) + 2 * reach + 2, (int)in_size));
        }
        size_t per = ((size_t)side * window * 2 + side * 8 + 16 + 15) & ~(size_t)15;
        std::vector<char> work(2 * per);
        std::vector<unsigned char> temp((size_t)side * temp_w * 3);
        for (unsigned a = 0; a < 2; ++a) {
            std::barrier b(256); bar = &b;
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < 256; ++t) ts.emplace_back([&, t, a] {
                threadIdx.x = t; blockIdx.x = 0; blockIdx.y = a;
                pinring_coeffs(&s, side, window, work.data());
            });
            for (auto& t : ts) t.join();
        }
        for (unsigned p = 0; p < (unsigned)(side * temp_w); ++p) {
            blockIdx.x = p / 256; blockIdx.y = 0; threadIdx.x = p % 256;
            pinring_vertical(&s, side, window, temp_w, work.data(), temp.data());
        }
        for (unsigned p = 0; p < (unsigned)(side * side); ++p) {
            blockIdx.x = p / 256; blockIdx.y = 0; threadIdx.x = p % 256;
            pinring_horizontal(&s, side, window, temp_w, work.data(), temp.data(), 0, 1, nullptr);
        }
        int differ = 0, maxd = 0;
        for (size_t i = 0; i < got.size(); ++i) if (got[i] != want[i]) { ++differ; maxd = std::max(maxd, std::abs(got[i] - want[i])); }
        if (differ) { ++bad; if (bad < 10) printf("case %d %ux%u box %.3f %.3f %.3f %.3f flip %u: %d differ (max %d)\n", n, w, h, box[0], box[1], box[2], box[3], flip, differ, maxd); }
        ++n;
    }
    printf("%d cases, %d differ\n", n, bad);
    return bad == 0 && n > 0 ? 0 : 1;
}
