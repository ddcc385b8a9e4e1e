// tests/test_cuda_sampled_grad.cpp — kernels/cuda/sampled_grad.cuh (the sampled
// attention backward) run under the emulator against its CPU twin
// cpu::sampled_attention_backward(..., source, signed_start_dv, ...), for both sample
// sources, row-wise dV:
//   ExactRow: the same dqkv to 1e-5 relative to the largest reference entry, from a
//   nonzero dqkv and after two calls (+=), for head sizes 8, 32, 64 (T = 130: several
//   query and key tiles), 128, 24 (run-time head size) and 64 on an unaligned qkv, s = 1,
//   4, 16 and 37 (more than one chunk of 32 samples), two seeds, nonzero step and layer,
//   batch0 0 and nonzero (the rows of a call that starts at a later global batch row);
//   LazyGumbel (lazy Gumbel sample number 2m + 1 on the row's top-k list): the same, with
//   top-k lists from cpu::causal_topk_brute for k = 1, 4 and k >= T (rows that are all
//   head), s = 1, 5 and 37, batch0 0 (k = 1, k >= T) and 5 (k = 4);
//   signed-start dV (walk starts per column of dO, each row drawing as many samples as
//   its most walks): the same to 1e-5 for both sources, s = 1 and 4, two seeds (the
//   second with batch0 = 3), both
//   shapes, on a dout with an all-zero column (no walks), scattered exact zeros, and a
//   column whose only nonzero entry sits in one row (that row draws all N = T s walks
//   of the column: several chunks of 32 samples);
//   LazyGumbel without top-k lists or past the draw-index capacity, signed-start dV past
//   it (either source), samples < 1 and batch rows past the counter's 2^32 rows exit
//   with a one-line error;
//   the shared score (attention_score.h) run in a kernel equals the host's bit for bit at
//   the usual head sizes (the scores decide the samples; a 1-ulp difference would
//   change a pick only rarely, so the backward comparison alone would not show it).
//
// Natively the promise is narrower (kernels/ALGORITHMS.md §11.2): equal samples for
// every draw whose margin (kernels/common/draws.h) clears kDrawMarginOfAgreement, since
// a GPU's fp64 exp and log may differ from glibc's in the last bit. Every comparison
// first asserts that all of its draws clear it (on the emulator too, where the
// assertion is about the test data), so the equality it then demands holds on both.
//
// Tolerance: both sides use the same samples and fp64 per-term arithmetic; dK and dV
// differ by the float atomic additions against the CPU's fp64 per-head sums (a few ulp
// over at most a few hundred O(1) terms), dQ by fp64 summation order only. One sample
// chosen differently moves an entry by a whole term, coef k_J or dO_i / s, far above
// 1e-5 of the largest entry, so the comparison checks the samples too; likewise one
// walk start counted at another row moves a dV entry by a whole walk weight ||x||_1 / N.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/sampled_grad.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/common/attention_params.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/sampled_grad.h"
#include "kernels/cpu/topk_index.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt::GradSampleSource;
using knngpt_test::attention_qkv;
using knngpt_test::brute_topk;
using knngpt_test::DeviceArray;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;
using Shape = knngpt_test::AttentionShape;
using std::vector;

namespace {

constexpr double kTolerance = 1e-5;

// One backward problem: qkv uniform in [-2, 2] (rows far from uniform), dout, the exact
// out of qkv, and a nonzero starting dqkv.
struct Problem {
    Shape shape;
    vector<float> qkv, dout, out, dqkv0;
};

Problem make_problem(const Shape& s, unsigned seed) {
    Problem p{s, attention_qkv(s, seed), uniform(s.out_size(), seed + 1), vector<float>(s.out_size()),
              uniform(s.qkv_size(), seed + 2)};
    vector<float> lse((size_t)s.B * s.NH * s.T);
    knngpt::cpu::attention_forward(p.out.data(), lse.data(), p.qkv.data(), s.B, s.T, s.C, s.NH);
    return p;
}

// dqkv0 plus two calls of the CPU backward (topk: (B, NH, T, k) lists for LazyGumbel)
vector<float> cpu_backward(const Problem& p, GradSampleSource source, const vector<int>& topk, int k, int samples,
                           uint64_t seed, uint32_t step, int layer, int batch0, bool signed_start_dv = false) {
    const Shape& s = p.shape;
    vector<float> dqkv = p.dqkv0;
    for (int call = 0; call < 2; call++)
        knngpt::cpu::sampled_attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), p.out.data(),
                                                topk.empty() ? nullptr : topk.data(), k, s.B, s.T, s.C, s.NH, samples,
                                                source, signed_start_dv, seed, step, layer, batch0);
    return dqkv;
}

// The smallest margin (kernels/common/draws.h) of every draw the CPU backward of p
// makes, walk starts included (its GumbelStats). The same inputs give the same
// samples on the emulator (the same code and libm) and, natively, wherever a draw
// clears kDrawMarginOfAgreement: the GPU's fp64 exp and log differ from glibc's by an
// ulp or two, which can only move a comparison closer than that. So every comparison
// below first asserts that all of its draws clear it.
double smallest_draw_margin(const Problem& p, GradSampleSource source, const vector<int>& topk, int k, int samples,
                            uint64_t seed, uint32_t step, int layer, int batch0, bool signed_start_dv) {
    const Shape& s = p.shape;
    vector<float> dqkv(p.dqkv0.size(), 0.0f);
    knngpt::cpu::GumbelStats stats;  // the CPU backward measures its draws' margins when asked for stats
    knngpt::cpu::sampled_attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), p.out.data(),
                                            topk.empty() ? nullptr : topk.data(), k, s.B, s.T, s.C, s.NH, samples,
                                            source, signed_start_dv, seed, step, layer, batch0, &stats);
    return stats.margin.smallest;
}

// Every draw of the comparison clears the margin of agreement (see above).
#define ASSERT_DRAWS_CLEAR_MARGIN(...)                                                                         \
    do {                                                                                                     \
        const double smallest = smallest_draw_margin(__VA_ARGS__);                                           \
        ASSERT_GT(smallest, knngpt::kDrawMarginOfAgreement)                                                  \
            << "a draw of these inputs lies " << smallest << " from a boundary: a GPU's exp or log could "   \
            << "decide it otherwise, so equal samples are not promised there; choose other test data";        \
    } while (0)

// the same with the CUDA kernel
// (qkv_shift: qkv placed that many floats past an aligned address)
vector<float> cuda_backward(const Problem& p, GradSampleSource source, const vector<int>& topk, int k, int samples,
                            uint64_t seed, uint32_t step, int layer, int batch0, bool signed_start_dv = false,
                            size_t qkv_shift = 0) {
    const Shape& s = p.shape;
    vector<float> shifted_qkv(qkv_shift, 0.0f);
    shifted_qkv.insert(shifted_qkv.end(), p.qkv.begin(), p.qkv.end());
    DeviceArray<float> d_dqkv(p.dqkv0), d_dout(p.dout), d_qkv(shifted_qkv), d_out(p.out);
    DeviceArray<int> d_topk(topk.empty() ? vector<int>(1, -1) : topk);
    for (int call = 0; call < 2; call++)
        knngpt::cuda::sampled_attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr + qkv_shift, d_out.ptr,
                                                 topk.empty() ? nullptr : d_topk.ptr, k, s.B, s.T, s.C, s.NH, samples,
                                                 source, signed_start_dv, seed, step, layer, batch0);
    CUDA_CHECK(cudaDeviceSynchronize());
    return d_dqkv.to_host();
}

void expect_same_backward(const Shape& s, unsigned data_seed, size_t qkv_shift = 0) {
    const Problem p = make_problem(s, data_seed);
    const uint64_t seeds[] = {1, 0x9E3779B97F4A7C15ull};
    for (int samples : {1, 4, 16, 37}) {
        for (uint64_t seed : seeds) {
            const uint32_t step = 5;
            const int layer = 2;
            const int batch0 = seed == 1 ? 0 : 2 * s.B + 1;
            ASSERT_DRAWS_CLEAR_MARGIN(p, GradSampleSource::ExactRow, {}, 0, samples, seed, step, layer, batch0, false);
            const vector<float> expected =
                cpu_backward(p, GradSampleSource::ExactRow, {}, 0, samples, seed, step, layer, batch0);
            const vector<float> got = cuda_backward(p, GradSampleSource::ExactRow, {}, 0, samples, seed, step, layer,
                                                    batch0, false, qkv_shift);
            ASSERT_EQ(got.size(), expected.size());
            EXPECT_LT(max_rel_error(got.data(), expected.data(), got.size()), kTolerance)
                << "B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH << " samples " << samples
                << " seed " << seed << " batch0 " << batch0 << " qkv shift " << qkv_shift;
        }
    }
}

void expect_same_lazy_gumbel_backward(const Shape& s, unsigned data_seed) {
    const Problem p = make_problem(s, data_seed);
    const uint64_t seed = 0x9E3779B97F4A7C15ull;
    const uint32_t step = 4;
    const int layer = 1;
    for (int k : {1, 4, s.T + 2}) {
        const vector<int> topk = brute_topk(p.qkv, s, k);
        const int batch0 = k == 4 ? 5 : 0;
        for (int samples : {1, 5, 37}) {
            ASSERT_DRAWS_CLEAR_MARGIN(p, GradSampleSource::LazyGumbel, topk, k, samples, seed, step, layer, batch0,
                                      false);
            const vector<float> expected =
                cpu_backward(p, GradSampleSource::LazyGumbel, topk, k, samples, seed, step, layer, batch0);
            const vector<float> got =
                cuda_backward(p, GradSampleSource::LazyGumbel, topk, k, samples, seed, step, layer, batch0);
            ASSERT_EQ(got.size(), expected.size());
            EXPECT_LT(max_rel_error(got.data(), expected.data(), got.size()), kTolerance)
                << "B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH << " k " << k << " samples "
                << samples << " batch0 " << batch0;
        }
    }
}

// Signed-start dV on a dout with the edge cases of the walk starts: column 1 of every
// head all zero (no walks), column 2 zero but for row T/3 (every walk of the column
// starts there: that row draws N = T s samples), and every 7th entry an exact zero.
void expect_same_signed_start_backward(const Shape& s, unsigned data_seed) {
    Problem p = make_problem(s, data_seed);
    const int HS = s.C / s.NH;
    for (size_t n = 0; n < p.dout.size(); n += 7) p.dout[n] = 0.0f;
    for (int b = 0; b < s.B; b++)
        for (int i = 0; i < s.T; i++)
            for (int h = 0; h < s.NH; h++) {
                float* d_o = &p.dout[((size_t)b * s.T + i) * s.C + (size_t)h * HS];
                d_o[1] = 0.0f;
                if (i != s.T / 3) d_o[2] = 0.0f;
                else if (d_o[2] == 0.0f) d_o[2] = 0.5f;
            }
    const int k = 4;
    const vector<int> topk = brute_topk(p.qkv, s, k);
    const uint64_t seeds[] = {3, 0x9E3779B97F4A7C15ull};
    for (GradSampleSource source : {GradSampleSource::ExactRow, GradSampleSource::LazyGumbel}) {
        const bool lazy = source == GradSampleSource::LazyGumbel;
        const vector<int> lists = lazy ? topk : vector<int>();
        for (int samples : {1, 4}) {
            for (uint64_t seed : seeds) {
                const uint32_t step = 6;
                const int layer = 1;
                const int batch0 = seed == 3 ? 0 : 3;  // walk starts and rows at later global batch rows
                ASSERT_DRAWS_CLEAR_MARGIN(p, source, lists, lazy ? k : 0, samples, seed, step, layer, batch0, true);
                const vector<float> expected =
                    cpu_backward(p, source, lists, lazy ? k : 0, samples, seed, step, layer, batch0, true);
                const vector<float> got =
                    cuda_backward(p, source, lists, lazy ? k : 0, samples, seed, step, layer, batch0, true);
                ASSERT_EQ(got.size(), expected.size());
                EXPECT_LT(max_rel_error(got.data(), expected.data(), got.size()), kTolerance)
                    << (lazy ? "lazy-gumbel" : "exact-row") << " B " << s.B << " T " << s.T << " C " << s.C
                    << " NH " << s.NH << " samples " << samples << " seed " << seed << " batch0 " << batch0;
            }
        }
    }
}

CUDA_TEST(CudaSampledGrad, ExactRowMatchesCpuHeadSize8) { expect_same_backward(Shape{2, 23, 24, 3}, 11); }

CUDA_TEST(CudaSampledGrad, ExactRowMatchesCpuHeadSize32) { expect_same_backward(Shape{1, 40, 64, 2}, 21); }

// The exact-row kernel scores tiles of 32 queries against key tiles of 64 (score_tiles.cuh)
// in a persistent grid (3 blocks under the emulator): T = 130 gives 5 query tiles and 3
// key tiles a head, 10 tiles over the 3 blocks; HS 64 and 128 load float4s, HS 24 and a
// qkv one float off alignment take the run-time head size with scalar loads.
CUDA_TEST(CudaSampledGrad, ExactRowMatchesCpuAcrossTilesHeadSize64) { expect_same_backward(Shape{1, 130, 128, 2}, 31); }

CUDA_TEST(CudaSampledGrad, ExactRowMatchesCpuHeadSize128) { expect_same_backward(Shape{1, 70, 256, 2}, 32); }

CUDA_TEST(CudaSampledGrad, ExactRowMatchesCpuRunTimeHeadSize) {
    expect_same_backward(Shape{1, 70, 48, 2}, 33);      // HS 24
    expect_same_backward(Shape{1, 70, 128, 2}, 34, 1);  // HS 64, unaligned
}

CUDA_TEST(CudaSampledGrad, LazyGumbelMatchesCpuHeadSize8) { expect_same_lazy_gumbel_backward(Shape{2, 23, 24, 3}, 12); }

CUDA_TEST(CudaSampledGrad, LazyGumbelMatchesCpuHeadSize32) { expect_same_lazy_gumbel_backward(Shape{1, 40, 64, 2}, 22); }

CUDA_TEST(CudaSampledGrad, SignedStartDvMatchesCpuHeadSize8) { expect_same_signed_start_backward(Shape{2, 23, 24, 3}, 13); }

CUDA_TEST(CudaSampledGrad, SignedStartDvMatchesCpuHeadSize32) { expect_same_signed_start_backward(Shape{1, 40, 64, 2}, 23); }

// One thread per (q, k) pair: the shared score of kernels/common/attention_score.h on
// the device, scaled and unscaled.
__global__ void attention_score_probe_kernel(float* scores, float* dots, const float* q, const float* k, int n,
                                             int HS, float tau) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    scores[p] = knngpt::attention_score(q + (size_t)p * HS, k + (size_t)p * HS, HS, tau);
    dots[p] = knngpt::attention_dot(q + (size_t)p * HS, k + (size_t)p * HS, HS);
}

CUDA_TEST(CudaSampledGrad, ScoreMatchesCpuBitForBit) {
    const int n = 200;
    for (int HS : {8, 16, 24, 32, 64, 128}) {
        const vector<float> q = uniform((size_t)HS * n, 31, -2.0f, 2.0f);
        const vector<float> k = uniform((size_t)HS * n, 32, -2.0f, 2.0f);
        const float tau = knngpt::attention_tau(HS);
        DeviceArray<float> d_q(q), d_k(k), d_scores((size_t)n), d_dots((size_t)n);
        launch(attention_score_probe_kernel, knngpt::cuda::ceil_div(n, 64), 64, 0, nullptr, d_scores.ptr, d_dots.ptr,
               d_q.ptr, d_k.ptr, n, HS, tau);
        CUDA_CHECK(cudaDeviceSynchronize());
        const vector<float> scores = d_scores.to_host(), dots = d_dots.to_host();
        int mismatches = 0;
        for (int p = 0; p < n; p++) {
            const float score = knngpt::attention_score(&q[(size_t)p * HS], &k[(size_t)p * HS], HS, tau);
            const float dot = knngpt::attention_dot(&q[(size_t)p * HS], &k[(size_t)p * HS], HS);
            mismatches += std::memcmp(&scores[p], &score, sizeof(float)) != 0;
            mismatches += std::memcmp(&dots[p], &dot, sizeof(float)) != 0;
        }
        EXPECT_EQ(mismatches, 0) << "HS " << HS;
    }
}

// The unsupported configurations stop with one line before touching any pointer.
CUDA_TEST(CudaSampledGrad, UnsupportedConfigurationsExit) {
    testing::FLAGS_gtest_death_test_style = "threadsafe";
    static const int topk_stub = -1;  // never read: the checks exit first
    auto run = [](GradSampleSource source, bool signed_start_dv, int samples, const int* topk = nullptr,
                  int T = 8, int batch0 = 0) {
        knngpt::cuda::sampled_attention_backward(nullptr, nullptr, nullptr, nullptr, topk, 4, 1, T, 16, 2, samples,
                                                 source, signed_start_dv, 1, 0, 0, batch0);
    };
    EXPECT_EXIT(run(GradSampleSource::LazyGumbel, false, 4), testing::ExitedWithCode(1),
                "the lazy-gumbel source needs top-k lists");
    EXPECT_EXIT(run(GradSampleSource::LazyGumbel, false, 1000, &topk_stub, 1 << 20), testing::ExitedWithCode(1),
                "overflows the 28-bit draw index");
    // signed-start dV: HS T s = 8 * 2^22 * 8 = 2^28 walk starts (row-wise, s = 8 fits)
    EXPECT_EXIT(run(GradSampleSource::ExactRow, true, 8, nullptr, 1 << 22), testing::ExitedWithCode(1),
                "signed-start dV with samples = 8 at T = 4194304 overflows the 28-bit draw index");
    // lazy Gumbel: 2 T s = 2^17 sample numbers, past the 2^28 / 2^12 = 2^16 a row of T = 2^13 keys holds
    EXPECT_EXIT(run(GradSampleSource::LazyGumbel, true, 8, &topk_stub, 1 << 13), testing::ExitedWithCode(1),
                "signed-start dV with samples = 8 at T = 8192 overflows the 28-bit draw index");
    EXPECT_EXIT(run(GradSampleSource::ExactRow, false, 0), testing::ExitedWithCode(1), "need samples >= 1");
    // the rows (batch0 + b) T + i of the counter: batch0 >= 0, (batch0 + 1) 8 <= 2^32
    EXPECT_EXIT(run(GradSampleSource::ExactRow, false, 4, nullptr, 8, -1), testing::ExitedWithCode(1),
                "need batch0 >= 0 and");
    EXPECT_EXIT(run(GradSampleSource::ExactRow, false, 4, nullptr, 8, 1 << 29), testing::ExitedWithCode(1),
                "2\\^32 draw rows");
}

}  // namespace
