// tests/test_cuda_attention.cpp — the reference CUDA attention of
// kernels/cuda/attention.cuh runs under the emulator against its CPU twin
// kernels/cpu/attention.h, forward and backward (twice, to check +=), on a head
// size that is not a multiple of 32 (HS = 8) and on one that is (HS = 32), with
// T not a multiple of the block's 8 rows.
//
// Tolerance: 1e-5 relative to the largest reference entry: both sides are fp32
// and differ only in summation order and expf against exp_vectorizable (a few ulp),
// over at most T = 37 O(1) terms.
#define KNNGPT_CUDA_EMU

#include "kernels/cuda/common.cuh"
#include "tests/cuda_test_util.h"

#include "kernels/cuda/attention.cuh"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "tests/test_util.h"

using knngpt_test::DeviceArray;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;

namespace {

constexpr double kTolerance = 1e-5;

void check_attention(int B, int T, int C, int NH, unsigned seed) {
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    // scale 2 on qkv: scores of a few units, so the softmax is not near-uniform
    std::vector<float> qkv = uniform(n_qkv, seed);
    for (float& v : qkv) v *= 2.0f;
    const std::vector<float> dout = uniform(n_out, seed + 1);

    std::vector<float> out(n_out), lse(n_lse), dqkv(n_qkv, 0.0f);
    knngpt::cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);

    DeviceArray<float> d_qkv(qkv), d_out(std::vector<float>(n_out, 0.0f)), d_lse(std::vector<float>(n_lse, 0.0f));
    knngpt::cuda::attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, C, NH);
    EXPECT_LT(max_rel_error(d_out.to_host().data(), out.data(), n_out), kTolerance);
    EXPECT_LT(max_rel_error(d_lse.to_host().data(), lse.data(), n_lse), kTolerance);

    DeviceArray<float> d_dout(dout), d_dqkv(dqkv);
    for (int pass = 1; pass <= 2; pass++) {
        knngpt::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
        knngpt::cuda::attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, C, NH);
        EXPECT_LT(max_rel_error(d_dqkv.to_host().data(), dqkv.data(), n_qkv), kTolerance) << "pass " << pass;
    }
}

TEST(CudaAttention, HeadSize8MatchesCpu) { check_attention(2, 13, 24, 3, 1); }

TEST(CudaAttention, HeadSize32MatchesCpu) { check_attention(1, 37, 64, 2, 10); }

}  // namespace
