// tests/test_cuda_knn.cpp — the CUDA kernels of kNN attention run under the
// emulator against their CPU twins:
//   kernels/cuda/topk_index.cuh        vs cpu::causal_topk_brute: identical lists, with
//                                      rows of fewer than k keys, exact score ties
//                                      (duplicated keys, quantised values), k = 1 .. >= T;
//                                      T off the query and key tiles, several tiles a block,
//                                      every fixed head size and the run-time one (odd HS,
//                                      an unaligned qkv), each checked to run the kernel it names;
//   kernels/cuda/tail_sampling.cuh     vs cpu::sample_tail_keys: identical idx and logw
//                                      (bit for bit), with and without replacement, several
//                                      seeds, batch0 0 and 2B + 1 (a call on later global
//                                      batch rows), rows whose whole tail fits, unsorted heads,
//                                      the stratified backward's tail;
//   kernels/cuda/forced_keys.cuh       vs cpu::add_forced_keys: identical lists;
//   kernels/cuda/sparse_attention.cuh  vs cpu sparse attention, forward and backward (run
//                                      twice, to check +=), lists from the CPU top-k and
//                                      tail sampler, with and without logw, an empty list;
//                                      and lists of every key vs exact cpu attention.
//
// Tolerance for the attention values: 1e-5 relative to the largest reference entry:
// both sides are fp32 and differ only in summation order, expf against
// exp_vectorizable and, in the backward, the order of the atomic additions (a few
// ulp over a few dozen O(1) terms). The index and the sampler must match exactly.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/forced_keys.cuh"
#include "kernels/cuda/sparse_attention.cuh"
#include "kernels/cuda/tail_sampling.cuh"
#include "kernels/cuda/topk_index.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/forced_keys.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/tail_sampling.h"
#include "kernels/cpu/topk_index.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt_test::attention_qkv;
using knngpt_test::brute_topk;
using knngpt_test::DeviceArray;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;
using Shape = knngpt_test::AttentionShape;
using std::vector;

namespace {

constexpr double kTolerance = 1e-5;


// every key row j of every head replaced by key row j % period: exact score ties
void duplicate_keys(vector<float>& qkv, const Shape& s, int period) {
    const size_t C3 = 3 * (size_t)s.C;
    for (int b = 0; b < s.B; b++)
        for (int j = period; j < s.T; j++)
            std::memcpy(&qkv[((size_t)b * s.T + j) * C3 + s.C], &qkv[((size_t)b * s.T + j % period) * C3 + s.C],
                        s.C * sizeof(float));
}

// values rounded to multiples of 1/2: scores are exact sums with many ties
void quantise(vector<float>& qkv) {
    for (float& v : qkv) v = std::round(v * 2.0f) / 2.0f;
}

// offset floats before qkv on the device (offset 1: a pointer that is not 16-byte aligned)
vector<int> cuda_topk(const vector<float>& qkv, const Shape& s, int k, int offset = 0) {
    vector<float> shifted(offset, 0.0f);
    shifted.insert(shifted.end(), qkv.begin(), qkv.end());
    DeviceArray<float> d_qkv(shifted);
    DeviceArray<int> d_idx(vector<int>(s.rows() * k, -99));
    knngpt::cuda::causal_topk_brute(d_idx.ptr, d_qkv.ptr + offset, s.B, s.T, s.C, s.NH, k);
    return d_idx.to_host();
}

void expect_same_topk(const vector<float>& qkv, const Shape& s, int k, int offset = 0) {
    const vector<int> expected = brute_topk(qkv, s, k);
    const vector<int> got = cuda_topk(qkv, s, k, offset);
    ASSERT_EQ(got.size(), expected.size());
    size_t mismatches = 0, first = 0;
    for (size_t x = 0; x < got.size(); x++)
        if (got[x] != expected[x] && mismatches++ == 0) first = x;
    EXPECT_EQ(mismatches, 0u) << "k = " << k << ", first mismatch at row " << first / k << " slot " << first % k
                              << ": " << got[first] << " vs " << expected[first];
}

// top-k lists widened to K = k + m slots, the tail slots holding junk the sampler must overwrite
vector<int> widen(const vector<int>& topk, const Shape& s, int k, int m) {
    const int K = k + m;
    vector<int> idx(s.rows() * K, 12345);
    for (size_t r = 0; r < s.rows(); r++)
        for (int t = 0; t < k; t++) idx[r * K + t] = topk[r * k + t];
    return idx;
}

struct Lists {
    vector<int> idx;
    vector<float> logw;
};

Lists cpu_tail(const vector<int>& wide, const Shape& s, int k, int m, bool with_replacement, uint64_t seed,
               uint32_t step, int layer, int batch0, knngpt::DrawPurpose purpose = knngpt::DRAW_TAIL_POSITION) {
    Lists l{wide, vector<float>(wide.size(), 7.0f)};
    knngpt::cpu::sample_tail_keys(l.idx.data(), l.logw.data(), s.B, s.T, s.NH, k, m, with_replacement, seed, step,
                                  layer, batch0, purpose);
    return l;
}

Lists cuda_tail(const vector<int>& wide, const Shape& s, int k, int m, bool with_replacement, uint64_t seed,
                uint32_t step, int layer, int batch0, knngpt::DrawPurpose purpose = knngpt::DRAW_TAIL_POSITION) {
    DeviceArray<int> d_idx(wide);
    DeviceArray<float> d_logw(vector<float>(wide.size(), 7.0f));
    knngpt::cuda::sample_tail_keys(d_idx.ptr, d_logw.ptr, s.B, s.T, s.NH, k, m, with_replacement, seed, step, layer,
                                   batch0, purpose);
    return Lists{d_idx.to_host(), d_logw.to_host()};
}

void expect_same_tail(const vector<int>& wide, const Shape& s, int k, int m, bool with_replacement, uint64_t seed,
                      uint32_t step = 3, int layer = 1, knngpt::DrawPurpose purpose = knngpt::DRAW_TAIL_POSITION) {
    for (int batch0 : {0, 2 * s.B + 1}) {
        const Lists expected = cpu_tail(wide, s, k, m, with_replacement, seed, step, layer, batch0, purpose);
        const Lists got = cuda_tail(wide, s, k, m, with_replacement, seed, step, layer, batch0, purpose);
        size_t idx_mismatches = 0, logw_mismatches = 0;
        for (size_t x = 0; x < got.idx.size(); x++) {
            idx_mismatches += got.idx[x] != expected.idx[x];
            logw_mismatches += std::memcmp(&got.logw[x], &expected.logw[x], sizeof(float)) != 0;
        }
        EXPECT_EQ(idx_mismatches, 0u) << "k " << k << " m " << m << " replacement " << with_replacement << " seed "
                                      << seed << " batch0 " << batch0;
        EXPECT_EQ(logw_mismatches, 0u) << "k " << k << " m " << m << " replacement " << with_replacement << " seed "
                                       << seed << " batch0 " << batch0;
    }
}

// lse may hold -inf (empty lists): the -inf entries must agree, the rest to tolerance
void expect_lse_close(const vector<float>& got, const vector<float>& expected) {
    vector<float> got_finite, expected_finite;
    size_t inf_mismatches = 0;
    for (size_t x = 0; x < got.size(); x++) {
        if (std::isinf(expected[x]) || std::isinf(got[x])) {
            inf_mismatches += got[x] != expected[x];
        } else {
            got_finite.push_back(got[x]);
            expected_finite.push_back(expected[x]);
        }
    }
    EXPECT_EQ(inf_mismatches, 0u);
    EXPECT_LT(max_rel_error(got_finite.data(), expected_finite.data(), got_finite.size()), kTolerance);
}

// Sparse forward and backward (twice) on the CPU and under the emulator.
void check_sparse(const Shape& s, const vector<float>& qkv, const vector<int>& idx, const vector<float>* logw, int K,
                  unsigned seed) {
    const vector<float> dout = uniform(s.out_size(), seed);
    const float* logw_ptr = logw ? logw->data() : nullptr;
    vector<float> out(s.out_size()), lse(s.rows()), dqkv(s.qkv_size(), 0.0f);
    knngpt::cpu::sparse_attention_forward(out.data(), lse.data(), qkv.data(), idx.data(), logw_ptr, s.B, s.T, s.C,
                                          s.NH, K);

    DeviceArray<float> d_qkv(qkv), d_out(vector<float>(s.out_size(), 9.0f)), d_lse(vector<float>(s.rows(), 9.0f));
    DeviceArray<int> d_idx(idx);
    DeviceArray<float> d_logw(logw ? *logw : vector<float>(1, 0.0f));
    const float* d_logw_ptr = logw ? d_logw.ptr : nullptr;
    knngpt::cuda::sparse_attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, d_idx.ptr, d_logw_ptr, s.B, s.T, s.C,
                                           s.NH, K);
    EXPECT_LT(max_rel_error(d_out.to_host().data(), out.data(), out.size()), kTolerance);
    expect_lse_close(d_lse.to_host(), lse);

    DeviceArray<float> d_dout(dout), d_dqkv(dqkv);
    for (int pass = 1; pass <= 2; pass++) {
        knngpt::cpu::sparse_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                               idx.data(), logw_ptr, s.B, s.T, s.C, s.NH, K);
        knngpt::cuda::sparse_attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, d_idx.ptr,
                                                d_logw_ptr, s.B, s.T, s.C, s.NH, K);
        EXPECT_LT(max_rel_error(d_dqkv.to_host().data(), dqkv.data(), dqkv.size()), kTolerance) << "pass " << pass;
    }
}

// ---------------------------------------------------------------------------
// top-k index
// ---------------------------------------------------------------------------

CUDA_TEST(CudaTopk, MatchesCpuOnHeadSize8) {
    const Shape s{2, 29, 24, 3};
    const vector<float> qkv = attention_qkv(s, 1);
    for (int k : {1, 5, 28, 29, 40}) expect_same_topk(qkv, s, k);
}

CUDA_TEST(CudaTopk, MatchesCpuOnHeadSize32) {
    const Shape s{1, 40, 64, 2};
    const vector<float> qkv = attention_qkv(s, 2);
    for (int k : {1, 5, 17, 40}) expect_same_topk(qkv, s, k);
}

CUDA_TEST(CudaTopk, MatchesCpuWithDuplicatedKeys) {
    const Shape s{2, 29, 24, 3};
    vector<float> qkv = attention_qkv(s, 3);
    duplicate_keys(qkv, s, 4);  // every score appears 7 or 8 times in a full row
    for (int k : {1, 5, 9}) expect_same_topk(qkv, s, k);
}

CUDA_TEST(CudaTopk, MatchesCpuWithQuantisedValues) {
    const Shape s{1, 45, 8, 2};
    vector<float> qkv = attention_qkv(s, 4);
    quantise(qkv);  // HS = 4 products of halves: few distinct scores, many ties, zeros
    for (int k : {1, 3, 5, 20}) expect_same_topk(qkv, s, k);
}

CUDA_TEST(CudaTopk, MatchesCpuWithLargeKAndLargeHeadSize) {
    const Shape wide{1, 160, 16, 1};
    expect_same_topk(attention_qkv(wide, 5), wide, 128);  // k = 128 with 32 rows that search
    const Shape deep{1, 21, 256, 1};
    expect_same_topk(attention_qkv(deep, 6), deep, 5);  // HS = 256
}

// Shapes off the tiles (32 queries, 64 keys): the last query tile partly full, the key
// tiles' last one too, and more tiles than the emulator's 3 resident blocks, so a block
// walks several (b, h, tile) items; k from 1 to past T, k = T - 1 and T - 2 among them.
// kernel: the instantiation the shape must run (the fixed head size, or <0>).
template <typename Kernel>
void expect_same_topk_off_tiles(const Shape& s, unsigned seed, Kernel kernel, int offset = 0) {
    const vector<float> qkv = attention_qkv(s, seed);
    for (int k : {1, 7, 33, 64, s.T - 2, s.T - 1, s.T, s.T + 3}) {
        const knngpt_test::Launches launched = knngpt_test::launches_of([&] { expect_same_topk(qkv, s, k, offset); });
        EXPECT_EQ(launched.count(kernel), 1) << "HS " << s.HS() << " offset " << offset << ": " << launched.list();
    }
}

CUDA_TEST(CudaTopk, MatchesCpuOffTheTilesForEveryFixedHeadSize) {
    using knngpt::cuda::causal_topk_brute_kernel;
    expect_same_topk_off_tiles(Shape{2, 100, 16, 2}, 11, causal_topk_brute_kernel<8>);
    expect_same_topk_off_tiles(Shape{1, 97, 64, 2}, 12, causal_topk_brute_kernel<32>);
    expect_same_topk_off_tiles(Shape{1, 130, 128, 2}, 13, causal_topk_brute_kernel<64>);
    expect_same_topk_off_tiles(Shape{1, 67, 128, 1}, 14, causal_topk_brute_kernel<128>);
}

CUDA_TEST(CudaTopk, MatchesCpuOnRunTimeHeadSizes) {
    using knngpt::cuda::causal_topk_brute_kernel;
    expect_same_topk_off_tiles(Shape{1, 75, 21, 3}, 15, causal_topk_brute_kernel<0>);  // HS = 7
    expect_same_topk_off_tiles(Shape{2, 41, 24, 2}, 16, causal_topk_brute_kernel<0>);  // HS = 12
    expect_same_topk_off_tiles(Shape{1, 70, 128, 2}, 17, causal_topk_brute_kernel<0>, 1);  // HS = 64, unaligned qkv
}

CUDA_TEST(CudaTopk, MatchesCpuWithTiesAcrossKeyTiles) {
    const Shape s{1, 150, 128, 2};  // HS = 64, three key tiles
    vector<float> qkv = attention_qkv(s, 18);
    duplicate_keys(qkv, s, 5);  // every score 30 times in a full row, spread over the key tiles
    for (int k : {1, 4, 5, 6, 31, 32, 100, 149}) expect_same_topk(qkv, s, k);
    const Shape q{1, 140, 64, 2};  // HS = 32, values in halves: few distinct scores
    vector<float> quantised = attention_qkv(q, 19);
    quantise(quantised);
    for (int k : {1, 3, 50, 139}) expect_same_topk(quantised, q, k);
}

// Keys of each head all permutations of one vector of widely spread magnitudes, each
// query one power of two in every channel (exact products): every score of a query is
// the same real sum, and the fp32
// chains differ only by their rounding, which the order of the additions decides. So
// the lists pick keys by rounding alone, and a kernel that summed in another order
// than attention_dot's (d = 0..HS-1) would pick others.
vector<float> rounding_decides_qkv(const Shape& s, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    std::uniform_int_distribution<int> exponent(-12, 12), sign(0, 1);
    vector<float> qkv(s.qkv_size(), 0.0f);
    const int HS = s.HS();
    for (int h = 0; h < s.NH; h++) {
        vector<float> v(HS);
        for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng)) * (sign(rng) ? 1.0f : -1.0f);
        for (int b = 0; b < s.B; b++)
            for (int t = 0; t < s.T; t++) {
                std::shuffle(v.begin(), v.end(), rng);
                const float q = std::ldexp(sign(rng) ? 1.0f : -1.0f, exponent(rng) % 3);  // the same in every channel
                for (int c = 0; c < HS; c++) {
                    qkv[s.qkv_at(b, t, 0, h, c)] = q;
                    qkv[s.qkv_at(b, t, 1, h, c)] = v[c];
                }
            }
    }
    return qkv;
}

CUDA_TEST(CudaTopk, MatchesCpuWhereRoundingAloneDecides) {
    for (const Shape& s : {Shape{1, 90, 16, 2}, Shape{1, 90, 64, 2}, Shape{1, 90, 128, 2}, Shape{1, 90, 21, 3}}) {
        const vector<float> qkv = rounding_decides_qkv(s, 20 + s.HS());
        for (int k : {5, 40}) {
            // the lists are not the ties' 0..k-1 of a search that saw equal scores
            const vector<int> expected = brute_topk(qkv, s, k);
            const vector<int> lowest(expected.end() - k, expected.end());
            vector<int> first_k(k);
            for (int t = 0; t < k; t++) first_k[t] = t;
            ASSERT_NE(lowest, first_k) << "HS " << s.HS();
            expect_same_topk(qkv, s, k);
        }
    }
}

// ---------------------------------------------------------------------------
// tail sampling
// ---------------------------------------------------------------------------

CUDA_TEST(CudaTailSampling, MatchesCpuWithAndWithoutReplacement) {
    const Shape s{2, 29, 24, 3};
    const vector<float> qkv = attention_qkv(s, 7);
    for (int k : {1, 5}) {
        const vector<int> topk = brute_topk(qkv, s, k);
        for (int m : {1, 4, 11}) {
            // rows i with i + 1 - min(k, i + 1) <= m keep their whole tail
            const vector<int> wide = widen(topk, s, k, m);
            for (uint64_t seed : {1ull, 42ull, 0x9E3779B97F4A7C15ull})
                for (bool with_replacement : {false, true}) expect_same_tail(wide, s, k, m, with_replacement, seed);
        }
    }
}

CUDA_TEST(CudaTailSampling, MatchesCpuOnUnsortedHeadsWithHoles) {
    const Shape s{1, 40, 64, 2};
    const int k = 6, m = 5;
    vector<int> wide = widen(brute_topk(attention_qkv(s, 8), s, k), s, k, m);
    // reverse each head and knock out one slot: any slot order, -1 anywhere
    std::mt19937 rng(9);
    for (size_t r = 0; r < s.rows(); r++) {
        int* head = &wide[r * (k + m)];
        std::reverse(head, head + k);
        if (rng() % 2) head[rng() % k] = -1;
    }
    for (uint64_t seed : {5ull, 6ull})
        for (bool with_replacement : {false, true}) expect_same_tail(wide, s, k, m, with_replacement, seed, 0, 0);
}

// The stratified backward's tail (DRAW_GRADIENT_TAIL): the CPU's keys, and not the
// forward's (DRAW_TAIL_POSITION) at the same site.
CUDA_TEST(CudaTailSampling, GradientTailMatchesCpuAndIsNotTheForwardTail) {
    const Shape s{2, 33, 24, 3};
    const int k = 4, m = 6;
    const vector<int> wide = widen(brute_topk(attention_qkv(s, 17), s, k), s, k, m);
    expect_same_tail(wide, s, k, m, false, 77, 3, 1, knngpt::DRAW_GRADIENT_TAIL);
    EXPECT_NE(cpu_tail(wide, s, k, m, false, 77, 3, 1, 0, knngpt::DRAW_GRADIENT_TAIL).idx,
              cpu_tail(wide, s, k, m, false, 77, 3, 1, 0).idx);
}

// ---------------------------------------------------------------------------
// forced keys: the local window and the attention sinks
// ---------------------------------------------------------------------------

CUDA_TEST(CudaForcedKeys, MatchesCpu) {
    const Shape s{2, 37, 24, 3};
    const vector<float> qkv = attention_qkv(s, 19);
    for (int k : {1, 6})
        for (const auto& [window, sinks] : std::vector<std::pair<int, int>>{{0, 0}, {5, 0}, {0, 3}, {4, 2}, {40, 40}}) {
            const vector<int> topk = brute_topk(qkv, s, k);
            const int K = k + window + sinks + 1;
            vector<int> want(s.idx_size(K), 12345);
            knngpt::cpu::add_forced_keys(want.data(), K, topk.data(), k, s.B, s.T, s.NH, window, sinks);
            DeviceArray<int> d_topk(topk), d_lists(vector<int>(s.idx_size(K), 12345));
            knngpt::cuda::add_forced_keys(d_lists.ptr, K, d_topk.ptr, k, s.B, s.T, s.NH, window, sinks);
            EXPECT_EQ(d_lists.to_host(), want) << "k " << k << " window " << window << " sinks " << sinks;
        }
}

// ---------------------------------------------------------------------------
// sparse attention
// ---------------------------------------------------------------------------

void check_knn_tail_lists(const Shape& s, int k, int m, unsigned seed) {
    const vector<float> qkv = attention_qkv(s, seed);
    const int K = k + m;
    const vector<int> wide = widen(brute_topk(qkv, s, k), s, k, m);
    Lists lists = cpu_tail(wide, s, k, m, false, seed, 0, 0, 0);
    // one empty list: out 0, lse -inf, no gradient
    for (int t = 0; t < K; t++) lists.idx[(s.rows() - 2) * K + t] = -1;
    check_sparse(s, qkv, lists.idx, &lists.logw, K, seed + 1);  // with logw
    check_sparse(s, qkv, lists.idx, nullptr, K, seed + 2);      // without
}

CUDA_TEST(CudaSparseAttention, HeadSize8MatchesCpu) { check_knn_tail_lists(Shape{2, 29, 24, 3}, 5, 4, 10); }

CUDA_TEST(CudaSparseAttention, HeadSize32MatchesCpu) { check_knn_tail_lists(Shape{1, 40, 64, 2}, 3, 6, 20); }

CUDA_TEST(CudaSparseAttention, WithReplacementRepeatsMatchCpu) {
    const Shape s{1, 33, 16, 2};
    const int k = 2, m = 8, K = k + m;
    const vector<float> qkv = attention_qkv(s, 30);
    const Lists lists = cpu_tail(widen(brute_topk(qkv, s, k), s, k, m), s, k, m, true, 31, 0, 0, 0);
    check_sparse(s, qkv, lists.idx, &lists.logw, K, 32);
}

CUDA_TEST(CudaSparseAttention, ListsOfEveryKeyEqualExactAttention) {
    for (const Shape& s : {Shape{2, 29, 24, 3}, Shape{1, 40, 64, 2}}) {
        const vector<float> qkv = attention_qkv(s, 40);
        const int K = s.T;  // top-k with k >= T: row i holds 0..i, then -1
        DeviceArray<float> d_qkv(qkv);
        DeviceArray<int> d_idx(vector<int>(s.rows() * K, 0));
        knngpt::cuda::causal_topk_brute(d_idx.ptr, d_qkv.ptr, s.B, s.T, s.C, s.NH, K);

        vector<float> out(s.out_size()), lse(s.rows());
        knngpt::cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        DeviceArray<float> d_out(vector<float>(s.out_size(), 0.0f)), d_lse(vector<float>(s.rows(), 0.0f));
        knngpt::cuda::sparse_attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, d_idx.ptr, nullptr, s.B, s.T, s.C,
                                               s.NH, K);
        EXPECT_LT(max_rel_error(d_out.to_host().data(), out.data(), out.size()), kTolerance);
        EXPECT_LT(max_rel_error(d_lse.to_host().data(), lse.data(), lse.size()), kTolerance);

        const vector<float> dout = uniform(s.out_size(), 41);
        vector<float> dqkv(s.qkv_size(), 0.0f);
        knngpt::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C,
                                        s.NH);
        DeviceArray<float> d_dout(dout), d_dqkv(vector<float>(s.qkv_size(), 0.0f));
        knngpt::cuda::sparse_attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, d_idx.ptr,
                                                nullptr, s.B, s.T, s.C, s.NH, K);
        EXPECT_LT(max_rel_error(d_dqkv.to_host().data(), dqkv.data(), dqkv.size()), kTolerance);
    }
}

}  // namespace
