// tests/test_cuda_attention.cpp — the CUDA attention of kernels/cuda/attention.cuh
// runs under the emulator, forward and backward (twice, to check +=):
//   - the reference kernels (one warp per row) against the CPU twin
//     kernels/cpu/attention.h;
//   - the tiled kernels (the default attention_forward / attention_backward)
//     against both the CPU twin and the reference kernels.
// Shapes have T not a multiple of any tile size (the forward tiles are 64 or 16
// rows by 32 keys, the backward tiles 32 x 32 or 16 x 16) and head sizes that
// are not multiples of 32: HS = 8, 24 and 72 beside 32 and 64. HS <= 64 runs
// the MAX_HS = 64 tiles, HS = 72 and 128 the MAX_HS = 128 tiles, HS = 136 the
// reference fallback.
//
// Tolerance: 1e-5 relative to the largest reference entry: all sides are fp32
// and differ only in summation order and expf against exp_vectorizable (a few ulp),
// over at most T = 70 O(1) terms.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/attention.cuh"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/attention.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt_test::attention_qkv;
using knngpt_test::DeviceArray;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;
using Shape = knngpt_test::AttentionShape;

namespace {

constexpr double kTolerance = 1e-5;

// One problem and the CPU twin's forward of it: qkv uniform in [-2, 2]
// (scores of a few units, so the softmax is not near-uniform), dout, and the
// CPU's out and lse.
struct Problem {
    Shape s;
    std::vector<float> qkv, dout, out, lse;
};

Problem cpu_problem(const Shape& s, unsigned seed) {
    Problem p{s, attention_qkv(s, seed), uniform(s.out_size(), seed + 1), std::vector<float>(s.out_size()),
              std::vector<float>(s.rows())};
    knngpt::cpu::attention_forward(p.out.data(), p.lse.data(), p.qkv.data(), s.B, s.T, s.C, s.NH);
    return p;
}

// The reference CUDA kernels against the CPU twin.
void check_reference_attention(const Shape& s, unsigned seed) {
    const Problem p = cpu_problem(s, seed);
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;

    DeviceArray<float> d_qkv(p.qkv), d_out(std::vector<float>(s.out_size(), 0.0f)),
        d_lse(std::vector<float>(s.rows(), 0.0f));
    knngpt::cuda::attention_forward_reference(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, C, NH);
    EXPECT_LT(max_rel_error(d_out.to_host().data(), p.out.data(), s.out_size()), kTolerance);
    EXPECT_LT(max_rel_error(d_lse.to_host().data(), p.lse.data(), s.rows()), kTolerance);

    std::vector<float> dqkv(s.qkv_size(), 0.0f);
    DeviceArray<float> d_dout(p.dout), d_dqkv(dqkv);
    for (int pass = 1; pass <= 2; pass++) {
        knngpt::cpu::attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), p.out.data(), p.lse.data(), B, T,
                                        C, NH);
        knngpt::cuda::attention_backward_reference(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, C,
                                                   NH);
        EXPECT_LT(max_rel_error(d_dqkv.to_host().data(), dqkv.data(), s.qkv_size()), kTolerance) << "pass " << pass;
    }
}

// The tiled CUDA kernels against the CPU twin and against the reference kernels.
void check_tiled_attention(const Shape& s, unsigned seed) {
    const Problem p = cpu_problem(s, seed);
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const size_t n_qkv = s.qkv_size(), n_out = s.out_size(), n_lse = s.rows();

    DeviceArray<float> d_qkv(p.qkv), d_out(std::vector<float>(n_out, 0.0f)), d_lse(std::vector<float>(n_lse, 0.0f));
    DeviceArray<float> r_out(std::vector<float>(n_out, 0.0f)), r_lse(std::vector<float>(n_lse, 0.0f));
    knngpt::cuda::attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, C, NH);
    knngpt::cuda::attention_forward_reference(r_out.ptr, r_lse.ptr, d_qkv.ptr, B, T, C, NH);
    const std::vector<float> tiled_out = d_out.to_host(), tiled_lse = d_lse.to_host();
    EXPECT_LT(max_rel_error(tiled_out.data(), p.out.data(), n_out), kTolerance) << "out vs cpu";
    EXPECT_LT(max_rel_error(tiled_lse.data(), p.lse.data(), n_lse), kTolerance) << "lse vs cpu";
    EXPECT_LT(max_rel_error(tiled_out.data(), r_out.to_host().data(), n_out), kTolerance) << "out vs reference";
    EXPECT_LT(max_rel_error(tiled_lse.data(), r_lse.to_host().data(), n_lse), kTolerance) << "lse vs reference";

    // every kernel reads the same (CPU) out and lse, so the three backward
    // passes differ only in their own arithmetic
    std::vector<float> dqkv(n_qkv, 0.0f);
    DeviceArray<float> c_out(p.out), c_lse(p.lse);
    DeviceArray<float> d_dout(p.dout), d_dqkv(dqkv), r_dqkv(dqkv);
    for (int pass = 1; pass <= 2; pass++) {
        knngpt::cpu::attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), p.out.data(), p.lse.data(), B, T,
                                        C, NH);
        knngpt::cuda::attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, c_out.ptr, c_lse.ptr, B, T, C, NH);
        knngpt::cuda::attention_backward_reference(r_dqkv.ptr, d_dout.ptr, d_qkv.ptr, c_out.ptr, c_lse.ptr, B, T, C,
                                                   NH);
        const std::vector<float> tiled = d_dqkv.to_host();
        EXPECT_LT(max_rel_error(tiled.data(), dqkv.data(), n_qkv), kTolerance) << "dqkv vs cpu, pass " << pass;
        EXPECT_LT(max_rel_error(tiled.data(), r_dqkv.to_host().data(), n_qkv), kTolerance)
            << "dqkv vs reference, pass " << pass;
    }
}

CUDA_TEST(CudaAttention, ReferenceHeadSize8MatchesCpu) { check_reference_attention({2, 13, 24, 3}, 1); }

CUDA_TEST(CudaAttention, ReferenceHeadSize32MatchesCpu) { check_reference_attention({1, 37, 64, 2}, 10); }

CUDA_TEST(CudaAttention, TiledHeadSize8) { check_tiled_attention({2, 13, 24, 3}, 20); }

CUDA_TEST(CudaAttention, TiledHeadSize32) { check_tiled_attention({1, 37, 64, 2}, 30); }

// T = 70: two forward query tiles, three backward query/key tiles
CUDA_TEST(CudaAttention, TiledHeadSize24) { check_tiled_attention({1, 70, 48, 2}, 40); }

CUDA_TEST(CudaAttention, TiledHeadSize64) { check_tiled_attention({1, 45, 128, 2}, 50); }

// MAX_HS = 128 tiles (16 rows): T = 37 spans three tiles
CUDA_TEST(CudaAttention, TiledHeadSize72) { check_tiled_attention({1, 37, 144, 2}, 60); }

CUDA_TEST(CudaAttention, TiledHeadSize128) { check_tiled_attention({1, 21, 256, 2}, 70); }

// HS > 128 falls back to the reference kernels
CUDA_TEST(CudaAttention, HeadSize136FallsBackToReference) { check_tiled_attention({1, 9, 272, 2}, 80); }

}  // namespace
