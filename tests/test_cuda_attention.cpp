// tests/test_cuda_attention.cpp — the CUDA attention of kernels/cuda/attention.cuh
// runs under the emulator, forward and backward (twice, to check +=):
//   - the reference kernels (one warp per row) against the CPU twin
//     kernels/cpu/attention.h;
//   - the tiled kernels (attention_forward_fp32 / attention_backward_fp32, which the fp32 build trains with)
//     against both the CPU twin and the reference kernels.
// Shapes have T not a multiple of any tile size (the forward tiles are 64 or 16
// rows by 32 keys, the backward tiles 32 x 32 or 16 x 16) and head sizes that
// are not multiples of 32: HS = 8, 24 and 72 beside 32 and 64. HS <= 64 runs
// the MAX_HS = 64 tiles, HS = 72 and 128 the MAX_HS = 128 tiles, HS = 136 the
// reference fallback. The CudaAttentionPath tests record which kernels a call
// launched: the tiles of each width and the reference fallback on either side
// of the head-size and grid-row limits.
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
    knngpt::cuda::attention_forward_fp32(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, C, NH);
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
        knngpt::cuda::attention_backward_fp32(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, c_out.ptr, c_lse.ptr, B, T, C, NH);
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

// ---- which kernels ran ------------------------------------------------------------
//
// attention_forward_fp32 / attention_backward_fp32 choose their kernels from HS and B*NH:
// the MAX_HS = 64 tiles for HS <= 64, the MAX_HS = 128 tiles for HS <= 128, the
// one-warp-per-row reference kernels for larger heads and for B*NH above the
// 65535 rows of the grid's y axis. These tests record the kernels one forward
// and one backward call launch, on each side of each boundary, and check that
// the expected path ran and the other did not (the values of each path are
// checked above; the grid-row fallback's here, against the CPU twin).

using knngpt::cuda::attention_backward_dkv_tiled_kernel;
using knngpt::cuda::attention_backward_dq_tiled_kernel;
using knngpt::cuda::attention_forward_tiled_kernel;
using knngpt_test::Launches;
using knngpt_test::launches_of;

// The kernels of one attention_forward_fp32 and one attention_backward_fp32 call on s.
struct AttentionLaunches {
    Launches forward, backward;
};

AttentionLaunches launches_of_attention(const Shape& s, bool check_against_cpu = false) {
    const Problem p = cpu_problem(s, 90);
    DeviceArray<float> d_qkv(p.qkv), d_out(s.out_size()), d_lse(s.rows()), d_dout(p.dout),
        d_dqkv(std::vector<float>(s.qkv_size(), 0.0f));
    AttentionLaunches launched;
    launched.forward = launches_of([&] {
        knngpt::cuda::attention_forward_fp32(d_out.ptr, d_lse.ptr, d_qkv.ptr, s.B, s.T, s.C, s.NH);
    });
    launched.backward = launches_of([&] {
        knngpt::cuda::attention_backward_fp32(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, s.B, s.T, s.C, s.NH);
    });
    if (check_against_cpu) {
        std::vector<float> dqkv(s.qkv_size(), 0.0f);
        knngpt::cpu::attention_backward(dqkv.data(), p.dout.data(), p.qkv.data(), p.out.data(), p.lse.data(), s.B,
                                        s.T, s.C, s.NH);
        EXPECT_LT(max_rel_error(d_out.to_host().data(), p.out.data(), s.out_size()), kTolerance) << "out vs cpu";
        EXPECT_LT(max_rel_error(d_lse.to_host().data(), p.lse.data(), s.rows()), kTolerance) << "lse vs cpu";
        EXPECT_LT(max_rel_error(d_dqkv.to_host().data(), dqkv.data(), s.qkv_size()), kTolerance) << "dqkv vs cpu";
    }
    return launched;
}

// The tiled kernels of MAX_HS ran (forward; Delta, dK dV and dQ), nothing else.
template <int MAX_HS>
void expect_tiled_kernels(const AttentionLaunches& launched) {
    const Launches& fwd = launched.forward;
    const Launches& bwd = launched.backward;
    EXPECT_EQ(fwd.count(attention_forward_tiled_kernel<knngpt::cuda::AttentionTiles<MAX_HS>>), 1) << fwd.list();
    EXPECT_EQ(fwd.size(), 1u) << fwd.list();
    EXPECT_EQ(bwd.count("attention_backward_delta_kernel"), 1) << bwd.list();
    EXPECT_EQ(bwd.count(attention_backward_dkv_tiled_kernel<knngpt::cuda::AttentionTiles<MAX_HS>>), 1) << bwd.list();
    EXPECT_EQ(bwd.count(attention_backward_dq_tiled_kernel<knngpt::cuda::AttentionTiles<MAX_HS>>), 1) << bwd.list();
    EXPECT_EQ(bwd.size(), 3u) << bwd.list();
    EXPECT_EQ(fwd.count("attention_forward_kernel"), 0) << fwd.list();
    EXPECT_EQ(bwd.count("attention_backward_dq_kernel") + bwd.count("attention_backward_dkv_kernel"), 0)
        << bwd.list();
}

// The reference kernels ran (forward; Delta, dQ and dK dV), no tiled kernel.
void expect_reference_kernels(const AttentionLaunches& launched) {
    const Launches& fwd = launched.forward;
    const Launches& bwd = launched.backward;
    EXPECT_EQ(fwd.count("attention_forward_kernel"), 1) << fwd.list();
    EXPECT_EQ(fwd.size(), 1u) << fwd.list();
    EXPECT_EQ(bwd.count("attention_backward_delta_kernel"), 1) << bwd.list();
    EXPECT_EQ(bwd.count("attention_backward_dq_kernel"), 1) << bwd.list();
    EXPECT_EQ(bwd.count("attention_backward_dkv_kernel"), 1) << bwd.list();
    EXPECT_EQ(bwd.size(), 3u) << bwd.list();
    EXPECT_EQ(fwd.count("attention_forward_tiled_kernel"), 0) << fwd.list();
    EXPECT_EQ(bwd.count("attention_backward_dkv_tiled_kernel") + bwd.count("attention_backward_dq_tiled_kernel"), 0)
        << bwd.list();
}

CUDA_TEST(CudaAttentionPath, HeadSize64RunsThe64WideTiles) {
    expect_tiled_kernels<64>(launches_of_attention({1, 5, 64, 1}));
}

CUDA_TEST(CudaAttentionPath, HeadSize72RunsThe128WideTiles) {
    expect_tiled_kernels<128>(launches_of_attention({1, 5, 72, 1}));
}

CUDA_TEST(CudaAttentionPath, HeadSize128RunsThe128WideTiles) {
    expect_tiled_kernels<128>(launches_of_attention({1, 5, 128, 1}));
}

CUDA_TEST(CudaAttentionPath, HeadSize136FallsBackToTheReferenceKernels) {
    expect_reference_kernels(launches_of_attention({1, 5, 136, 1}));
}

// B*NH = 65536 (4096 x 16, HS 2, T 1): one more (b, h) than the grid holds.
CUDA_TEST(CudaAttentionPath, MoreThan65535HeadsFallBackToTheReferenceKernels) {
    ASSERT_EQ(4096 * 16, knngpt::cuda::kAttentionMaxGridY + 1);
    expect_reference_kernels(launches_of_attention({4096, 1, 32, 16}, true));
}

#if !defined(KNNGPT_CUDA_EMU)
// B*NH = 65535 (4369 x 15, HS 2, T 1), the most the grid holds: tiled. Native
// only: under the emulator 65535 tiled blocks take many minutes (the reference
// kernels put 4 rows in a block).
CUDA_TEST(CudaAttentionPath, At65535HeadsRunsTheTiles) {
    ASSERT_EQ(4369 * 15, knngpt::cuda::kAttentionMaxGridY);
    expect_tiled_kernels<64>(launches_of_attention({4369, 1, 30, 15}, true));
}
#endif

}  // namespace
