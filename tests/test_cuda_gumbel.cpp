// tests/test_cuda_gumbel.cpp — kernels/cuda/gumbel_attention.cuh (the `gumbel` forward:
// the median of means of lazy Gumbel samples) run under the emulator against its CPU
// twin cpu::gumbel_attention_forward, and the shared sampler
// (kernels/common/lazy_gumbel.h) run in a kernel against cpu::lazy_gumbel_sample:
//   the forward: the same out to 1e-5 relative to the largest reference entry, for two
//   shapes (head sizes 8 and 32), k = 1, 4 and k >= T (rows that are all head), groups
//   1, 3 and 4 (even: the mean of the two middle values), 1 and 5 samples per group,
//   top-k lists from cpu::causal_topk_brute, nonzero seed, step and layer, batch0 0 and 7
//   (the rows of a forward that starts at global batch row 7);
//   the sampler on the device: the same key, exceeder count and fallback flag as the
//   CPU for every row and sample number tried, with the default exceeder cap and with
//   caps 0 and 1, which force the fallback (the forward always uses the default cap,
//   which test rows of this size never hit, so the fallback is tested here);
//   groups above kGumbelMaxGroups, groups * samples past the draw-index capacity and
//   batch rows past the counter's 2^32 rows exit with a one-line error.
//
// Tolerance: both sides draw the same samples and add the same fp32 values in the same
// order; one sample chosen differently moves an entry by a whole |v_J - v_J'| / t, far
// above 1e-5 of the largest entry, so the comparison checks the samples too.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/gumbel_attention.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/lazy_gumbel.h"
#include "kernels/common/draws.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gumbel_attention.h"
#include "kernels/cpu/topk_index.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt::DrawSite;
using knngpt_test::attention_qkv;
using knngpt_test::brute_topk;
using knngpt_test::DeviceArray;
using knngpt_test::max_rel_error;
using Shape = knngpt_test::AttentionShape;
using std::vector;

namespace {

constexpr double kTolerance = 1e-5;

// The smallest margin (kernels/common/draws.h) of the lazy Gumbel samples the CPU
// gumbel forward draws on qkv (its GumbelStats). Equal samples are promised natively
// only for draws clearing kDrawMarginOfAgreement (a GPU's fp64 exp and log differ
// from glibc's in the last bit), so the comparison first asserts that all of these do.
double smallest_forward_margin(const vector<float>& qkv, const vector<int>& topk, const Shape& s, int k, int groups,
                               int samples, uint64_t seed, uint32_t step, int layer, int batch0) {
    vector<float> out(s.out_size());
    knngpt::cpu::GumbelStats stats;  // the CPU forward measures its draws' margins when asked for stats
    knngpt::cpu::gumbel_attention_forward(out.data(), qkv.data(), topk.data(), s.B, s.T, s.C, s.NH, k, groups, samples,
                                          seed, step, layer, batch0, &stats);
    return stats.margin.smallest;
}

void expect_same_forward(const Shape& s, unsigned data_seed) {
    const vector<float> qkv = attention_qkv(s, data_seed);
    DeviceArray<float> d_qkv(qkv);
    const uint64_t seed = 0x9E3779B97F4A7C15ull;
    const uint32_t step = 3;
    const int layer = 1;
    for (int k : {1, 4, s.T + 2}) {
        const vector<int> topk = brute_topk(qkv, s, k);
        DeviceArray<int> d_topk(topk);
        for (int groups : {1, 3, 4}) {
            for (int samples : {1, 5}) {
                const int batch0 = samples == 1 ? 0 : 7;
                const double smallest =
                    smallest_forward_margin(qkv, topk, s, k, groups, samples, seed, step, layer, batch0);
                ASSERT_GT(smallest, knngpt::kDrawMarginOfAgreement)
                    << "a draw lies " << smallest << " from a boundary: equal samples are not promised there";
                vector<float> expected(s.out_size());
                knngpt::cpu::gumbel_attention_forward(expected.data(), qkv.data(), topk.data(), s.B, s.T, s.C, s.NH, k,
                                                      groups, samples, seed, step, layer, batch0);
                DeviceArray<float> d_out(vector<float>(s.out_size(), 7.0f));
                knngpt::cuda::gumbel_attention_forward(d_out.ptr, d_qkv.ptr, d_topk.ptr, s.B, s.T, s.C, s.NH, k, groups,
                                                       samples, seed, step, layer, batch0);
                CUDA_CHECK(cudaDeviceSynchronize());
                const vector<float> got = d_out.to_host();
                EXPECT_LT(max_rel_error(got.data(), expected.data(), got.size()), kTolerance)
                    << "B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH << " k " << k << " groups "
                    << groups << " samples " << samples << " batch0 " << batch0;
            }
        }
    }
}

CUDA_TEST(CudaGumbel, ForwardMatchesCpuHeadSize8) { expect_same_forward(Shape{2, 23, 24, 3}, 41); }

CUDA_TEST(CudaGumbel, ForwardMatchesCpuHeadSize32) { expect_same_forward(Shape{1, 40, 64, 2}, 51); }

// One thread per (row i, sample number n) of head 0 of batch 0: the shared sampler on
// the device, with the exceeder cap `cap` (< 0: the default cap).
__global__ void lazy_gumbel_probe_kernel(int* J, int* exceeders, int* fell_back, const float* qkv, const int* topk,
                                         int T, int C, int NH, int k, int numbers, int cap, uint64_t seed) {
    const int thread = blockIdx.x * blockDim.x + threadIdx.x;
    if (thread >= T * numbers) return;
    const int i = thread / numbers, n = thread % numbers;
    const int HS = C / NH, C3 = 3 * C;
    const float tau = knngpt::attention_tau(HS);
    const int* row_topk = topk + (size_t)i * k;
    int head = 0;
    while (head < k && row_topk[head] >= 0) head++;
    const int max_exceeders = cap >= 0 ? cap : knngpt::lazy_gumbel_default_max_exceeders(i + 1 - head, head);
    const DrawSite site{seed, 2, 0, (uint32_t)i};
    bool fb = false;
    J[thread] = knngpt::lazy_gumbel_sample_core(qkv + (size_t)i * C3, qkv + C, C3, HS, tau, i + 1, row_topk, k, site,
                                                (uint32_t)n, max_exceeders, &exceeders[thread], &fb);
    fell_back[thread] = fb ? 1 : 0;
}

// Every sample, its exceeder count and its fallback flag equal the CPU's. Natively
// this is promised for the draws whose margin clears kDrawMarginOfAgreement; the
// draws closer than that are counted, and may differ only there (on the emulator,
// where host and "device" share libm, nowhere).
CUDA_TEST(CudaGumbel, DeviceSamplerMatchesCpuIncludingFallback) {
    const Shape s{1, 60, 32, 2};
    // flat rows (small queries): many exceeders, so small caps are hit often
    vector<float> qkv = attention_qkv(s, 61);
    for (size_t n = 0; n < qkv.size(); n++)
        if (n % (3 * s.C) < (size_t)s.C) qkv[n] *= 0.1f;
    DeviceArray<float> d_qkv(qkv);
    const int numbers = 24;
    const int threads = s.T * numbers;
    const int HS = s.C / s.NH, C3 = 3 * s.C;
    const float tau = knngpt::attention_tau(HS);
    const uint64_t seed = 77;
    for (int k : {1, 4}) {
        const vector<int> topk = brute_topk(qkv, s, k);  // head 0's lists come first
        DeviceArray<int> d_topk(topk);
        for (int cap : {-1, 0, 1}) {
            DeviceArray<int> d_J(vector<int>(threads, -7)), d_x(vector<int>(threads, -7)),
                d_fb(vector<int>(threads, -7));
            launch(lazy_gumbel_probe_kernel, knngpt::cuda::ceil_div(threads, 128), 128, 0, nullptr, d_J.ptr, d_x.ptr,
                   d_fb.ptr, d_qkv.ptr, d_topk.ptr, s.T, s.C, s.NH, k, numbers, cap, seed);
            CUDA_CHECK(cudaDeviceSynchronize());
            const vector<int> J = d_J.to_host(), x = d_x.to_host(), fb = d_fb.to_host();
            int mismatches = 0, fallbacks = 0, near_boundary = 0, near_mismatches = 0;
            for (int i = 0; i < s.T; i++) {
                const int* row_topk = topk.data() + (size_t)i * k;
                int head = 0;
                while (head < k && row_topk[head] >= 0) head++;
                const int max_exceeders = cap >= 0 ? cap : knngpt::lazy_gumbel_default_max_exceeders(i + 1 - head, head);
                const DrawSite site{seed, 2, 0, (uint32_t)i};
                for (int n = 0; n < numbers; n++) {
                    int want_x = 0;
                    bool want_fb = false;
                    knngpt::DrawMargin margin;
                    const int want = knngpt::cpu::lazy_gumbel_sample(qkv.data() + (size_t)i * C3, qkv.data() + s.C, C3,
                                                                     HS, tau, i + 1, row_topk, k, site, (uint32_t)n,
                                                                     max_exceeders, &want_x, &want_fb, &margin);
                    const int t = i * numbers + n;
                    const bool differs = J[t] != want || x[t] != want_x || fb[t] != (want_fb ? 1 : 0);
                    const bool near = !(margin.smallest > knngpt::kDrawMarginOfAgreement);
                    near_boundary += near ? 1 : 0;
                    (near ? near_mismatches : mismatches) += differs ? 1 : 0;
                    fallbacks += want_fb ? 1 : 0;
                }
            }
            EXPECT_EQ(mismatches, 0) << "k " << k << " cap " << cap << ": samples clear of every boundary differ";
#if defined(KNNGPT_CUDA_EMU)
            EXPECT_EQ(near_mismatches, 0) << "k " << k << " cap " << cap << ": the emulator shares the host's libm";
#endif
            // draws that close to a boundary are rare (~1e-12 per comparison): a handful at most
            EXPECT_LE(near_boundary, threads / 100) << "k " << k << " cap " << cap;
            if (near_boundary > 0)
                std::printf("k %d cap %d: %d of %d draws within %g of a boundary, %d of them differ\n", k, cap,
                            near_boundary, threads, knngpt::kDrawMarginOfAgreement, near_mismatches);
            if (cap == 0) {
                EXPECT_GT(fallbacks, threads / 4) << "k " << k << ": cap 0 should fall back often";
            }
            if (cap < 0) {
                EXPECT_EQ(fallbacks, 0) << "k " << k << ": the default cap is not expected to be hit here";
            }
        }
    }
}

// The unsupported configurations stop with one line before touching any pointer.
CUDA_TEST(CudaGumbel, UnsupportedConfigurationsExit) {
    testing::FLAGS_gtest_death_test_style = "threadsafe";
    auto run = [](int T, int groups, int samples, int batch0 = 0) {
        knngpt::cuda::gumbel_attention_forward(nullptr, nullptr, nullptr, 1, T, 16, 2, 4, groups, samples, 1, 0, 0,
                                               batch0);
    };
    EXPECT_EXIT(run(8, knngpt::cuda::kGumbelMaxGroups + 1, 2), testing::ExitedWithCode(1), "need 1 <= groups <= 16");
    EXPECT_EXIT(run(8, 3, 0), testing::ExitedWithCode(1), "samples_per_group >= 1");
    EXPECT_EXIT(run(1 << 20, 16, 1 << 10), testing::ExitedWithCode(1), "expected <= ");
    EXPECT_EXIT(run(8, 3, 2, -1), testing::ExitedWithCode(1), "need batch0 >= 0 and");
    EXPECT_EXIT(run(8, 3, 2, 1 << 29), testing::ExitedWithCode(1), "2\\^32 draw rows");
}

}  // namespace
