// tools/bench_attention_cuda.cu — GPU timing of the exact causal attention of
// kernels/cuda/attention.cuh: the tiled forward and backward, and the reference
// forward for comparison; the tensor-core (bf16 operands, fp32 accumulation)
// forward and backward of kernels/cuda/attention_bf16.cuh (wmma) and of
// kernels/cuda/attention_mma.cuh (mma.sync, FlashAttention-2: the trainer's);
// and the kNN top-k search and sampled backwards against the trainer's exact
// attention.
// Built with nvcc only (make build/bench_attention_cuda) and run on a GPU:
//   nvcc -std=c++17 -O3 -arch=sm_80 -I. tools/bench_attention_cuda.cu -o build/bench_attention_cuda
//   build/bench_attention_cuda [--quick]
//
// Configurations: HS in {64, 128}, T in {1024, 2048, 4096, 8192, 16384}
// (--quick: T in {1024, 4096}). NH = 16 heads, C = NH * HS, and
// B = max(1, 16384 / T), so B * NH * T = 16 * 16384 rows of (q, k, v) per
// launch at every T. Inputs are uniform in [-1, 1).
//
// Timing: cudaEvent around each call, 2 warm-up calls, then the median of 5.
// The backward time includes its Delta kernel (its scratch is allocated once,
// in the warm-up). FLOPs are the causal counts FlashAttention
// reports: forward 4 B NH T^2 HS / 2 (two T x T x HS products, half masked),
// backward 2.5 times the forward.
//
// Check, first, for each HS at T = 1024 (B = 16, NH = 16, the inputs above):
// every kernel's output against the one-warp-per-row reference kernels
// (attention_forward_reference, attention_backward_reference, fp32), as the
// largest absolute difference of out, lse and dqkv (the backward from
// dqkv = 0), with the largest reference entry for scale:
//   check T=1024 HS=64 max_abs_err tiled_out=... tiled_lse=... tiled_dqkv=...
//     bf16_out=... bf16_lse=... bf16_dqkv=... mma_out=... mma_lse=... mma_dqkv=...
//     max_ref out=... lse=... dqkv=... ok   (same line)
// "ok" where each error is within its bound relative to the largest reference
// entry, else "FAIL"; the bounds are those of the tests, widened for T = 1024:
//   tiled (fp32, other summation order and expf)  1e-4 (tests: 1e-5 at T <= 130)
//   bf16, mma (bf16 q, k, v, P and dO)            2e-2 (tests: 1e-2, seen 2.5e-3 .. 4.5e-3)
// Then the timings, one line per configuration, then the reference forward's
// time as a ratio:
//   attention T=1024 HS=64 B=16 NH=16 fwd_ms=... fwd_TFLOPs=... bwd_ms=... bwd_TFLOPs=...
//     bf16_fwd_ms=... bf16_fwd_TFLOPs=... bf16_bwd_ms=... bf16_bwd_TFLOPs=...
//     mma_fwd_ms=... mma_fwd_TFLOPs=... mma_bwd_ms=... mma_bwd_TFLOPs=...   (same line)
//   ratio tiled/reference fwd=... (reference fwd_ms=...)
// Exit status 1 if a check failed (after all timings), else 0. Without a CUDA
// device it prints "no CUDA device: attention benchmark skipped" and exits 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_bf16.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/sampled_grad.cuh"
#include "kernels/cuda/sparse_attention.cuh"
#include "kernels/cuda/topk_index.cuh"

namespace {

using knngpt::cuda::ceil_div;

// x[i] = uniform in [-1, 1) from a hash of (i, seed).
__global__ void fill_uniform_kernel(float* x, size_t n, uint32_t seed) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 0x9E3779B9u ^ (uint32_t)(i >> 32) ^ seed * 0x85EBCA6Bu;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    x[i] = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

float* device_uniform(size_t n, uint32_t seed) {
    float* x = nullptr;
    CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
    launch(fill_uniform_kernel, (unsigned)ceil_div(n, (size_t)256), 256, 0, nullptr, x, n, seed);
    return x;
}

// Median milliseconds of 5 timed calls after 2 warm-up calls.
float time_ms(const std::function<void()>& call) {
    constexpr int warmup = 2, runs = 5;
    for (int r = 0; r < warmup; r++) call();
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> ms(runs);
    for (int r = 0; r < runs; r++) {
        CUDA_CHECK(cudaEventRecord(start));
        call();
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[runs / 2];
}

// The operands of one timed shape: NH = 16 heads of HS, B = max(1, 16384 / T),
// qkv and dout uniform (seeds seed, seed + 1), out, lse and dqkv (zeroed) allocated;
// freed at the end of the scope.
struct AttentionBuffers {
    static constexpr int NH = 16;
    int B, T, C;
    size_t n_qkv, n_out, n_lse;
    float *qkv, *dout, *out = nullptr, *lse = nullptr, *dqkv = nullptr;
    AttentionBuffers(int T_, int HS, uint32_t seed)
        : B(std::max(1, 16384 / T_)), T(T_), C(NH * HS), n_qkv((size_t)B * T * 3 * C), n_out((size_t)B * T * C),
          n_lse((size_t)B * NH * T), qkv(device_uniform(n_qkv, seed)), dout(device_uniform(n_out, seed + 1)) {
        CUDA_CHECK(cudaMalloc(&out, n_out * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&lse, n_lse * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&dqkv, n_qkv * sizeof(float)));
        CUDA_CHECK(cudaMemset(dqkv, 0, n_qkv * sizeof(float)));
    }
    ~AttentionBuffers() {
        for (float* p : {qkv, dout, out, lse, dqkv}) CUDA_CHECK(cudaFree(p));
    }
};

void bench_config(int T, int HS) {
    AttentionBuffers buffers(T, HS, 1);
    const int B = buffers.B, C = buffers.C, NH = AttentionBuffers::NH;
    float *qkv = buffers.qkv, *dout = buffers.dout, *out = buffers.out, *lse = buffers.lse, *dqkv = buffers.dqkv;

    const float fwd_ms = time_ms([&] { knngpt::cuda::attention_forward_fp32(out, lse, qkv, B, T, C, NH); });
    const float bwd_ms =
        time_ms([&] { knngpt::cuda::attention_backward_fp32(dqkv, dout, qkv, out, lse, B, T, C, NH); });
    // the reference writes out and lse too; nothing reads them afterwards
    const float ref_ms = time_ms([&] { knngpt::cuda::attention_forward_reference(out, lse, qkv, B, T, C, NH); });
    // the bf16 forward last, so its backward reads its own out and lse
    const float bf16_fwd_ms = time_ms([&] { knngpt::cuda::attention_forward_bf16(out, lse, qkv, B, T, C, NH); });
    const float bf16_bwd_ms =
        time_ms([&] { knngpt::cuda::attention_backward_bf16(dqkv, dout, qkv, out, lse, B, T, C, NH); });
    const float mma_fwd_ms = time_ms([&] { knngpt::cuda::attention_forward_mma(out, lse, qkv, B, T, C, NH); });
    const float mma_bwd_ms =
        time_ms([&] { knngpt::cuda::attention_backward_mma(dqkv, dout, qkv, out, lse, B, T, C, NH); });

    const double fwd_flops = 4.0 * B * NH * (double)T * T * HS / 2.0;
    const double bwd_flops = 2.5 * fwd_flops;
    const auto tflops = [](double flops, float ms) { return flops / (ms * 1e-3) / 1e12; };
    std::printf("attention T=%d HS=%d B=%d NH=%d fwd_ms=%.3f fwd_TFLOPs=%.2f bwd_ms=%.3f bwd_TFLOPs=%.2f "
                "bf16_fwd_ms=%.3f bf16_fwd_TFLOPs=%.2f bf16_bwd_ms=%.3f bf16_bwd_TFLOPs=%.2f "
                "mma_fwd_ms=%.3f mma_fwd_TFLOPs=%.2f mma_bwd_ms=%.3f mma_bwd_TFLOPs=%.2f\n",
                T, HS, B, NH, fwd_ms, tflops(fwd_flops, fwd_ms), bwd_ms, tflops(bwd_flops, bwd_ms), bf16_fwd_ms,
                tflops(fwd_flops, bf16_fwd_ms), bf16_bwd_ms, tflops(bwd_flops, bf16_bwd_ms), mma_fwd_ms,
                tflops(fwd_flops, mma_fwd_ms), mma_bwd_ms, tflops(bwd_flops, mma_bwd_ms));
    std::printf("ratio tiled/reference fwd=%.3f (reference fwd_ms=%.3f)\n", fwd_ms / ref_ms, ref_ms);
    std::fflush(stdout);
}

// kNN attention and sampled gradients at one shape (HS 64, NH 16, B * T = 16384 rows
// of a head, k = 32, s = 16), against the trainer's exact forward and backward
// (the mma kernels):
//   knn T=... HS=64 k=32 topk_ms=... sparse_fwd_ms=... knn_fwd_ms=... exact_fwd_ms=...
//     topk_over_exact_fwd=... sampled_bwd_ms=... lazy_bwd_ms=... exact_bwd_ms=...   (same line)
// knn_fwd = top-k search + sparse forward; sampled_bwd = the exact-row source,
// lazy_bwd = the lazy-Gumbel source on the top-k lists (both s = 16, no signed-start dV).
void bench_knn(int T) {
    constexpr int HS = 64, k = 32, samples = 16;
    AttentionBuffers buffers(T, HS, 3);
    const int B = buffers.B, C = buffers.C, NH = AttentionBuffers::NH;
    float *qkv = buffers.qkv, *dout = buffers.dout, *out = buffers.out, *lse = buffers.lse, *dqkv = buffers.dqkv;
    int* idx = nullptr;
    CUDA_CHECK(cudaMalloc(&idx, buffers.n_lse * k * sizeof(int)));
    using knngpt::GradSampleSource;
    const float exact_fwd_ms = time_ms([&] { knngpt::cuda::attention_forward_mma(out, lse, qkv, B, T, C, NH); });
    const float exact_bwd_ms =
        time_ms([&] { knngpt::cuda::attention_backward_mma(dqkv, dout, qkv, out, lse, B, T, C, NH); });
    const float topk_ms = time_ms([&] { knngpt::cuda::causal_topk_brute(idx, qkv, B, T, C, NH, k); });
    const float sparse_ms = time_ms(
        [&] { knngpt::cuda::sparse_attention_forward(out, lse, qkv, idx, nullptr, B, T, C, NH, std::min(k, T)); });
    const float sampled_ms = time_ms([&] {
        knngpt::cuda::sampled_attention_backward(dqkv, dout, qkv, out, idx, k, B, T, C, NH, samples,
                                                 GradSampleSource::ExactRow, false, 1337, 1, 0, 0);
    });
    const float lazy_ms = time_ms([&] {
        knngpt::cuda::sampled_attention_backward(dqkv, dout, qkv, out, idx, k, B, T, C, NH, samples,
                                                 GradSampleSource::LazyGumbel, false, 1337, 1, 0, 0);
    });
    std::printf("knn T=%d HS=%d k=%d topk_ms=%.3f sparse_fwd_ms=%.3f knn_fwd_ms=%.3f exact_fwd_ms=%.3f "
                "topk_over_exact_fwd=%.2f sampled_bwd_ms=%.3f lazy_bwd_ms=%.3f exact_bwd_ms=%.3f\n",
                T, HS, k, topk_ms, sparse_ms, topk_ms + sparse_ms, exact_fwd_ms, topk_ms / exact_fwd_ms, sampled_ms,
                lazy_ms, exact_bwd_ms);
    std::fflush(stdout);
    CUDA_CHECK(cudaFree(idx));
}

// Largest |a - b| over n device floats, and the largest |b|.
struct Difference {
    double max_abs = 0.0, max_ref = 0.0;
};
Difference device_difference(const float* a, const float* b, size_t n) {
    std::vector<float> ha(n), hb(n);
    CUDA_CHECK(cudaMemcpy(ha.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost));
    Difference d;
    for (size_t i = 0; i < n; i++) {
        d.max_abs = std::max(d.max_abs, (double)std::fabs(ha[i] - hb[i]));
        d.max_ref = std::max(d.max_ref, (double)std::fabs(hb[i]));
    }
    return d;
}

constexpr double kTiledBound = 1e-4, kBf16Bound = 2e-2;  // relative to the largest reference entry (header)

// The check of the header at T = 1024 for head size HS; returns whether it passed.
bool check_config(int HS) {
    constexpr int T = 1024, NH = 16, B = 16;
    const int C = NH * HS;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    float* qkv = device_uniform(n_qkv, 1);
    float* dout = device_uniform(n_out, 2);
    // [0] the reference, [1] the kernel under test
    float *out[2], *lse[2], *dqkv[2];
    for (int r = 0; r < 2; r++) {
        CUDA_CHECK(cudaMalloc(&out[r], n_out * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&lse[r], n_lse * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&dqkv[r], n_qkv * sizeof(float)));
    }
    CUDA_CHECK(cudaMemset(dqkv[0], 0, n_qkv * sizeof(float)));
    knngpt::cuda::attention_forward_reference(out[0], lse[0], qkv, B, T, C, NH);
    knngpt::cuda::attention_backward_reference(dqkv[0], dout, qkv, out[0], lse[0], B, T, C, NH);

    // each kernel pair's out, lse and dqkv against the reference's; the
    // backward reads the pair's own forward, as in training
    const auto compare = [&](int kind, Difference diff[3]) {  // 0 tiled fp32, 1 wmma, 2 mma
        CUDA_CHECK(cudaMemset(dqkv[1], 0, n_qkv * sizeof(float)));
        if (kind == 1) {
            knngpt::cuda::attention_forward_bf16(out[1], lse[1], qkv, B, T, C, NH);
            knngpt::cuda::attention_backward_bf16(dqkv[1], dout, qkv, out[1], lse[1], B, T, C, NH);
        } else if (kind == 2) {
            knngpt::cuda::attention_forward_mma(out[1], lse[1], qkv, B, T, C, NH);
            knngpt::cuda::attention_backward_mma(dqkv[1], dout, qkv, out[1], lse[1], B, T, C, NH);
        } else {
            knngpt::cuda::attention_forward_fp32(out[1], lse[1], qkv, B, T, C, NH);
            knngpt::cuda::attention_backward_fp32(dqkv[1], dout, qkv, out[1], lse[1], B, T, C, NH);
        }
        diff[0] = device_difference(out[1], out[0], n_out);
        diff[1] = device_difference(lse[1], lse[0], n_lse);
        diff[2] = device_difference(dqkv[1], dqkv[0], n_qkv);
    };
    Difference tiled[3], bf16[3], mma[3];
    compare(0, tiled);
    compare(1, bf16);
    compare(2, mma);
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        ok = ok && tiled[i].max_abs <= kTiledBound * tiled[i].max_ref;
        ok = ok && bf16[i].max_abs <= kBf16Bound * bf16[i].max_ref;
        ok = ok && mma[i].max_abs <= kBf16Bound * mma[i].max_ref;
    }
    std::printf("check T=%d HS=%d max_abs_err tiled_out=%.3g tiled_lse=%.3g tiled_dqkv=%.3g bf16_out=%.3g "
                "bf16_lse=%.3g bf16_dqkv=%.3g mma_out=%.3g mma_lse=%.3g mma_dqkv=%.3g max_ref out=%.3g lse=%.3g "
                "dqkv=%.3g %s\n",
                T, HS, tiled[0].max_abs, tiled[1].max_abs, tiled[2].max_abs, bf16[0].max_abs, bf16[1].max_abs,
                bf16[2].max_abs, mma[0].max_abs, mma[1].max_abs, mma[2].max_abs, tiled[0].max_ref, tiled[1].max_ref,
                tiled[2].max_ref, ok ? "ok" : "FAIL");
    std::fflush(stdout);

    CUDA_CHECK(cudaFree(qkv));
    CUDA_CHECK(cudaFree(dout));
    for (int r = 0; r < 2; r++) {
        CUDA_CHECK(cudaFree(out[r]));
        CUDA_CHECK(cudaFree(lse[r]));
        CUDA_CHECK(cudaFree(dqkv[r]));
    }
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    bool quick = false;
    for (int a = 1; a < argc; a++) {
        if (std::strcmp(argv[a], "--quick") == 0) {
            quick = true;
        } else {
            std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
            return 2;
        }
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();  // clear the error of a machine without a driver or device
        std::printf("no CUDA device: attention benchmark skipped\n");
        return 0;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s\n", prop.name);

    bool checks_passed = true;
    for (int HS : {64, 128}) checks_passed = check_config(HS) && checks_passed;
    const std::vector<int> full_ts = {1024, 2048, 4096, 8192, 16384}, quick_ts = {1024, 4096};
    for (int HS : {64, 128}) {
        for (int T : quick ? quick_ts : full_ts) bench_config(T, HS);
    }
    for (int T : quick ? quick_ts : std::vector<int>{1024, 4096, 16384}) bench_knn(T);
    if (!checks_passed) std::printf("attention check: FAIL (a kernel differs from the reference beyond its bound)\n");
    return checks_passed ? 0 : 1;
}
