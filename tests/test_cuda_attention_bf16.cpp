// tests/test_cuda_attention_bf16.cpp — the tensor-core attention kernels, both
// with bf16 operands and fp32 accumulation: the wmma kernels of
// kernels/cuda/attention_bf16.cuh (the reference) and the register-level
// FlashAttention-2 kernels of kernels/cuda/attention_mma.cuh (which the trainer
// runs), each forward and backward (twice, to check +=):
//   - against the fp32 CPU twin kernels/cpu/attention.h, with the bf16
//     tolerance kTolerance (relative to the largest entry) of the header's
//     error model;
//   - sharply, against the fp32 CPU twin run on bf16-rounded inputs: the lse
//     depends on q, k only through S, which the kernel forms exactly from the
//     bf16 q, k with fp32 sums, so it matches to 1e-5; the output's only other
//     rounding is that of P >= 0 in P V, a relative error <= u = 2^-8 in each
//     term of a convex combination of the v_j, so it is within u max|v| (plus
//     fp32 slack) of the CPU output on bf16 q, k, v; likewise dV is within
//     u max|dO| max_j sum_i P_ij of the CPU dV on bf16 q, k, v, dO (same lse);
//   - that the error against fp32 is not tiny, i.e. bf16 is really used.
// Shapes: T not a multiple of 16 or 64 (one or two 64-row tiles; for the mma
// kernels also four, so both stages of their double buffer are reused), HS in
// {16, 32, 64, 128}. Emulated tensor cores are slow, so the shapes are small.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/attention_bf16.cuh"
#include "kernels/cuda/attention_exact.cuh"
#include "kernels/cuda/attention_mma.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention.h"
#include "tests/attention_test_util.h"
#include "tests/test_util.h"

using knngpt_test::attention_qkv;
using knngpt_test::DeviceArray;
using knngpt_test::max_abs_diff;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;
using Shape = knngpt_test::AttentionShape;

namespace {

// Against fp32, relative to the largest entry: the header's error model gives
// a few u = 2^-8 (u ~ 3.9e-3) for O(1) inputs and scores of a few units; seen
// are 2.5e-3 .. 4.5e-3 on these shapes, so 1e-2 leaves a margin of two.
constexpr double kTolerance = 1e-2;
constexpr double kSharpTolerance = 1e-5;  // fp32 summation order and expf
constexpr double kUnitRoundoff = 1.0 / 256.0;  // 2^-8, bf16 (8 significant bits) round to nearest
constexpr double kNotTiny = 1e-4;  // an fp32 kernel is at ~1e-6

float to_bf16(float x) { return (float)__float2bfloat16(x); }

// A copy of qkv with the channels [first, last) of every row rounded to bf16.
std::vector<float> round_channels(const std::vector<float>& qkv, int C, int first, int last) {
    std::vector<float> r = qkv;
    for (size_t row = 0; row < qkv.size() / (3 * (size_t)C); row++)
        for (int c = first; c < last; c++) r[row * 3 * C + c] = to_bf16(r[row * 3 * C + c]);
    return r;
}

// A forward and backward pair of tensor-core kernels (same signatures as the
// trainer's attention_forward / attention_backward).
struct Bf16Kernels {
    void (*forward)(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
    void (*backward)(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B, int T,
                     int C, int NH);
};
const Bf16Kernels kWmma{knngpt::cuda::attention_forward_bf16, knngpt::cuda::attention_backward_bf16};
const Bf16Kernels kMma{knngpt::cuda::attention_forward_mma, knngpt::cuda::attention_backward_mma};

void check_bf16_attention(const Shape& s, unsigned seed, const Bf16Kernels& kernels = kWmma) {
    const int B = s.B, T = s.T, C = s.C, NH = s.NH;
    const size_t n_qkv = s.qkv_size(), n_out = s.out_size(), n_lse = s.rows();
    const std::vector<float> qkv = attention_qkv(s, seed);
    const std::vector<float> dout = uniform(n_out, seed + 1);

    // fp32 CPU twin
    std::vector<float> out(n_out), lse(n_lse), dqkv(n_qkv, 0.0f);
    knngpt::cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);

    DeviceArray<float> d_qkv(qkv), d_out(std::vector<float>(n_out, 0.0f)), d_lse(std::vector<float>(n_lse, 0.0f));
    kernels.forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, C, NH);
    const std::vector<float> g_out = d_out.to_host(), g_lse = d_lse.to_host();
    const double out_err = max_rel_error(g_out.data(), out.data(), n_out);
    const double lse_err = max_rel_error(g_lse.data(), lse.data(), n_lse);
    EXPECT_LT(out_err, kTolerance) << "out vs fp32 cpu";
    EXPECT_LT(lse_err, kTolerance) << "lse vs fp32 cpu";
    EXPECT_GT(out_err, kNotTiny) << "out is as exact as fp32: is bf16 used?";

    // sharp: the lse of bf16 q, k; the output of bf16 q, k, v within u max|v|
    {
        const std::vector<float> qk16 = round_channels(qkv, C, 0, 2 * C);
        const std::vector<float> qkv16 = round_channels(qkv, C, 0, 3 * C);
        std::vector<float> out16(n_out), lse16(n_lse), lse_qk16(n_lse);
        knngpt::cpu::attention_forward(out16.data(), lse_qk16.data(), qk16.data(), B, T, C, NH);
        knngpt::cpu::attention_forward(out16.data(), lse16.data(), qkv16.data(), B, T, C, NH);
        EXPECT_LT(max_rel_error(g_lse.data(), lse_qk16.data(), n_lse), kSharpTolerance) << "lse vs cpu on bf16 q, k";
        double v_max = 0.0;
        for (size_t row = 0; row < n_qkv / (3 * (size_t)C); row++)
            for (int c = 2 * C; c < 3 * C; c++) v_max = std::max(v_max, (double)std::fabs(qkv16[row * 3 * C + c]));
        const double out_diff = max_abs_diff(g_out, out16);
        EXPECT_LE(out_diff, (kUnitRoundoff + kSharpTolerance) * v_max) << "out vs cpu on bf16 q, k, v";
        std::printf("  (B,T,C,NH)=(%d,%d,%d,%d) fwd vs fp32: out %.2e lse %.2e; vs bf16 inputs: out %.2e of max|v| "
                    "(bound %.2e), lse %.2e\n",
                    B, T, C, NH, out_err, lse_err, out_diff / v_max, kUnitRoundoff,
                    max_rel_error(g_lse.data(), lse_qk16.data(), n_lse));
    }

    // sharp, dV: with P from bf16 q, k and the kernel's lse (the kernel's P to
    // fp32 rounding) and bf16 dO, the only other rounding in dV_j = sum_i P_ij dO_i
    // is that of P_ij >= 0, so |dV - dV'| <= u max|dO| max_j sum_i P_ij
    {
        const std::vector<float> qkv16 = round_channels(qkv, C, 0, 3 * C);
        std::vector<float> dout16 = dout;
        for (float& x : dout16) x = to_bf16(x);
        std::vector<float> dqkv16(n_qkv, 0.0f);
        knngpt::cpu::attention_backward(dqkv16.data(), dout16.data(), qkv16.data(), g_out.data(), g_lse.data(), B, T,
                                        C, NH);
        DeviceArray<float> d_dqkv1(std::vector<float>(n_qkv, 0.0f)), d_dout(dout);
        kernels.backward(d_dqkv1.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, C, NH);
        const std::vector<float> g = d_dqkv1.to_host();
        const int HS = C / NH;
        const double tau = 1.0 / std::sqrt((double)HS);
        double col_max = 0.0, dout_max = 0.0, dv_max = 0.0, dv_diff = 0.0;
        for (float x : dout16) dout_max = std::max(dout_max, (double)std::fabs(x));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int j = 0; j < T; j++) {
                    const float* kj = &qkv16[((size_t)b * T + j) * 3 * C + C + h * HS];
                    double col = 0.0;
                    for (int i = j; i < T; i++) {
                        const float* qi = &qkv16[((size_t)b * T + i) * 3 * C + h * HS];
                        double dot = 0.0;
                        for (int c = 0; c < HS; c++) dot += (double)qi[c] * kj[c];
                        col += std::exp(tau * dot - g_lse[((size_t)b * NH + h) * T + i]);
                    }
                    col_max = std::max(col_max, col);
                    for (int c = 0; c < HS; c++) {
                        const size_t at = ((size_t)b * T + j) * 3 * C + 2 * C + h * HS + c;
                        dv_max = std::max(dv_max, (double)std::fabs(dqkv16[at]));
                        dv_diff = std::max(dv_diff, std::fabs((double)g[at] - dqkv16[at]));
                    }
                }
        const double bound = kUnitRoundoff * (1.0 + 1e-3) * dout_max * col_max + kSharpTolerance * dv_max;
        EXPECT_LE(dv_diff, bound) << "dv vs cpu on bf16 q, k, v, dO";
        std::printf("  bwd vs bf16 inputs: dv diff %.2e (bound %.2e)\n", dv_diff, bound);
    }

    // backward, from the kernel's own out and lse, twice (+=)
    DeviceArray<float> d_dout(dout), d_dqkv(dqkv);
    for (int pass = 1; pass <= 2; pass++) {
        knngpt::cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
        kernels.backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, C, NH);
        const std::vector<float> g = d_dqkv.to_host();
        const double err = max_rel_error(g.data(), dqkv.data(), n_qkv);
        EXPECT_LT(err, kTolerance) << "dqkv vs fp32 cpu, pass " << pass;
        EXPECT_GT(err, kNotTiny) << "dqkv is as exact as fp32: is bf16 used?";
        // per part: dq, dk, dv
        for (int part = 0; part < 3; part++) {
            std::vector<float> a, b;
            for (size_t row = 0; row < n_qkv / (3 * (size_t)C); row++)
                for (int c = part * C; c < (part + 1) * C; c++) {
                    a.push_back(g[row * 3 * C + c]);
                    b.push_back(dqkv[row * 3 * C + c]);
                }
            const double part_err = max_rel_error(a.data(), b.data(), a.size());
            EXPECT_LT(part_err, kTolerance) << "d" << "qkv"[part] << " pass " << pass;
            if (pass == 2) std::printf("  bwd vs fp32: d%c %.2e\n", "qkv"[part], part_err);
        }
    }
}

CUDA_TEST(CudaAttentionBf16, HeadSize16) { check_bf16_attention({2, 37, 32, 2}, 1); }

CUDA_TEST(CudaAttentionBf16, HeadSize32) { check_bf16_attention({1, 70, 64, 2}, 10); }

// T = 70: two 64-row tiles on each side
CUDA_TEST(CudaAttentionBf16, HeadSize64) { check_bf16_attention({1, 70, 128, 2}, 20); }

CUDA_TEST(CudaAttentionBf16, HeadSize128) { check_bf16_attention({1, 45, 256, 2}, 30); }

CUDA_TEST(CudaAttentionMma, HeadSize16) { check_bf16_attention({2, 37, 32, 2}, 1, kMma); }

CUDA_TEST(CudaAttentionMma, HeadSize32) { check_bf16_attention({1, 70, 64, 2}, 10, kMma); }

CUDA_TEST(CudaAttentionMma, HeadSize64) { check_bf16_attention({1, 70, 128, 2}, 20, kMma); }

// T = 230: four 64-row tiles, so each stage of the K, V (forward, dQ) and Q, dO
// (dK, dV) double buffers is filled twice
CUDA_TEST(CudaAttentionMma, HeadSize64FourTiles) { check_bf16_attention({1, 230, 64, 1}, 25, kMma); }

CUDA_TEST(CudaAttentionMma, HeadSize128) { check_bf16_attention({1, 45, 256, 2}, 30, kMma); }

// The trainer's exact attention (attention_exact.cuh) in this, the bf16 build: head
// sizes that are multiples of 16 run the register-level tensor-core kernels
// (attention_mma.cuh), with the same bits as calling them directly; others (24
// here), and B * NH past the grid's y, the fp32 tiled kernels. (The fp32 build's choice is checked end to end by test_cuda_trainer:
// train_gpt_emu matches train_gpt_cpu to 1e-5, which bf16 attention would not.)
void expect_training_attention_path(int B, int T, int C, int NH, bool tensor_cores) {
    EXPECT_EQ(knngpt::cuda::attention_on_tensor_cores(B, C, NH), tensor_cores) << "C " << C << " NH " << NH;
    const std::vector<float> qkv = uniform((size_t)B * T * 3 * C, 41, -1.5f, 1.5f);
    const std::vector<float> dout = uniform((size_t)B * T * C, 42);
    DeviceArray<float> d_qkv(qkv), d_dout(dout), d_out(std::vector<float>(dout.size())), d_lse(std::vector<float>((size_t)B * NH * T)),
        d_dqkv(std::vector<float>(qkv.size(), 0.0f));
    const knngpt_test::Launches fwd = knngpt_test::launches_of(
        [&] { knngpt::cuda::attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, C, NH); });
    const knngpt_test::Launches bwd = knngpt_test::launches_of([&] {
        knngpt::cuda::attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_out.ptr, d_lse.ptr, B, T, C, NH);
    });
    EXPECT_EQ(fwd.count("attention_forward_mma_kernel"), tensor_cores ? 1 : 0) << fwd.list();
    EXPECT_EQ(bwd.count("attention_backward_dkv_mma_kernel"), tensor_cores ? 1 : 0) << bwd.list();
    EXPECT_EQ(bwd.count("attention_backward_dq_mma_kernel"), tensor_cores ? 1 : 0) << bwd.list();
    if (!tensor_cores) return;
    DeviceArray<float> d_out2(std::vector<float>(dout.size())), d_lse2(std::vector<float>((size_t)B * NH * T)), d_dqkv2(std::vector<float>(qkv.size(), 0.0f));
    knngpt::cuda::attention_forward_mma(d_out2.ptr, d_lse2.ptr, d_qkv.ptr, B, T, C, NH);
    knngpt::cuda::attention_backward_mma(d_dqkv2.ptr, d_dout.ptr, d_qkv.ptr, d_out2.ptr, d_lse2.ptr, B, T, C, NH);
    EXPECT_EQ(d_out.to_host(), d_out2.to_host());
    EXPECT_EQ(d_lse.to_host(), d_lse2.to_host());
    EXPECT_EQ(d_dqkv.to_host(), d_dqkv2.to_host());
}

CUDA_TEST(CudaAttentionBf16, TrainingRunsTensorCoresWhereTheHeadSizeAllows) {
    expect_training_attention_path(2, 20, 32, 2, true);   // HS 16
    expect_training_attention_path(1, 20, 128, 1, true);  // HS 128
    expect_training_attention_path(2, 20, 48, 2, false);  // HS 24
    expect_training_attention_path(1, 20, 272, 2, false); // HS 136
    EXPECT_FALSE(knngpt::cuda::attention_on_tensor_cores(65536, 64, 1));  // B * NH past the grid's y
    EXPECT_TRUE(knngpt::cuda::attention_on_tensor_cores(65535, 64, 1));
}

// Where the device's shared memory cannot hold a head size's tiles (the backward at
// HS 128 needs 103 KB; an sm_86 or sm_89 GPU opts into 99 KB), training takes the
// fp32 kernels instead of stopping; the direct call stops with one line.
CUDA_TEST(CudaAttentionBf16, ADeviceWithLessSharedMemoryTrainsHeadSize128OnFp32Kernels) {
    size_t& limit = knngpt::cuda::attention_mma_shared_limit_override();
    limit = 99 * 1024;
    EXPECT_TRUE(knngpt::cuda::attention_on_tensor_cores(1, 64, 1));    // HS 64: 55 KB
    EXPECT_FALSE(knngpt::cuda::attention_on_tensor_cores(1, 128, 1));  // HS 128: 103 KB
    expect_training_attention_path(1, 20, 128, 1, false);
    const std::vector<float> qkv = uniform(20 * 3 * 128, 43);
    DeviceArray<float> d_qkv(qkv), d_out(std::vector<float>(20 * 128)), d_lse(std::vector<float>(20));
    EXPECT_EXIT(knngpt::cuda::attention_forward_mma(d_out.ptr, d_lse.ptr, d_qkv.ptr, 1, 20, 128, 1),
                testing::ExitedWithCode(1), "head size 128 must fit the device's 101376 bytes");
    limit = 0;
}

// The tile loaders (wmma kernels) and the bf16 copies (mma kernels) read 16 bytes
// a lane where the operands keep float4 alignment, 4 bytes a lane where not: the
// same bits either way. Here every operand (qkv, out, dout, dqkv) sits one float
// past an aligned address.
void expect_unaligned_operands_give_the_same_bits(const Bf16Kernels& kernels) {
    const int B = 1, T = 70, C = 64, NH = 2;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    const std::vector<float> qkv = uniform(n_qkv, 51, -1.5f, 1.5f), dout = uniform(n_out, 52);
    auto run = [&](size_t shift, std::vector<float>& out, std::vector<float>& lse, std::vector<float>& dqkv) {
        std::vector<float> qkv_s(shift, 0.0f), dout_s(shift, 0.0f);
        qkv_s.insert(qkv_s.end(), qkv.begin(), qkv.end());
        dout_s.insert(dout_s.end(), dout.begin(), dout.end());
        DeviceArray<float> d_qkv(qkv_s), d_dout(dout_s), d_out{std::vector<float>(shift + n_out)},
            d_lse{std::vector<float>(n_lse)}, d_dqkv{std::vector<float>(shift + n_qkv, 0.0f)};
        kernels.forward(d_out.ptr + shift, d_lse.ptr, d_qkv.ptr + shift, B, T, C, NH);
        kernels.backward(d_dqkv.ptr + shift, d_dout.ptr + shift, d_qkv.ptr + shift, d_out.ptr + shift, d_lse.ptr, B, T,
                         C, NH);
        out = d_out.to_host();
        out.erase(out.begin(), out.begin() + shift);
        lse = d_lse.to_host();
        dqkv = d_dqkv.to_host();
        dqkv.erase(dqkv.begin(), dqkv.begin() + shift);
    };
    std::vector<float> out_a, lse_a, dqkv_a, out_u, lse_u, dqkv_u;
    run(0, out_a, lse_a, dqkv_a);
    run(1, out_u, lse_u, dqkv_u);
    EXPECT_EQ(out_a, out_u);
    EXPECT_EQ(lse_a, lse_u);
    EXPECT_EQ(dqkv_a, dqkv_u);
    EXPECT_GT(max_abs_diff(dqkv_a, std::vector<float>(n_qkv, 0.0f)), 0.0) << "no gradient";
}

CUDA_TEST(CudaAttentionBf16, UnalignedOperandsGiveTheSameBits) { expect_unaligned_operands_give_the_same_bits(kWmma); }

CUDA_TEST(CudaAttentionMma, UnalignedOperandsGiveTheSameBits) { expect_unaligned_operands_give_the_same_bits(kMma); }

}  // namespace
