// tests/test_cuda_loss_and_optimizer.cpp — the fp32 CUDA kernels of the loss
// and the optimizer step (classifier and fused classifier, global_norm, adamw)
// run under the emulator against their CPU twins in kernels/cpu. Shapes are
// deliberately not multiples of any block size (N = 300 elements, 13 rows,
// V = 50 padded to Vp = 64), so every partial block, idle warp and tail guard
// is exercised.
//
// Tolerance: 1e-5, relative to the largest reference entry (max_rel_error).
// Both sides are fp32 (global_norm: double) and differ only in summation order
// (warp butterflies, block trees against sequential loops) and in exp (expf
// against exp_vectorizable, a few ulp apart); over at most 50 O(1) terms
// per row that stays far under 1e-5.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/classifier.cuh"
#include "kernels/cuda/global_norm.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/classifier.h"
#include "kernels/cpu/global_norm.h"
#include "tests/test_util.h"

using knngpt_test::DeviceArray;
using knngpt_test::expect_close;
using knngpt_test::random_ints;
using knngpt_test::uniform;

namespace {

constexpr double kTolerance = 1e-5;

constexpr size_t kN = 300;

// ---- adamw --------------------------------------------------------------------

CUDA_TEST(CudaAdamW, ThreeStepsMatchCpu) {
    std::vector<float> params = uniform(kN, 1), m(kN, 0.0f), v(kN, 0.0f);
    DeviceArray<float> d_params(params), d_m(m), d_v(v);
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
    for (int t = 1; t <= 3; t++) {
        const std::vector<float> grads = uniform(kN, 10 + t);
        DeviceArray<float> d_grads(grads);
        knngpt::cpu::adamw_update(params.data(), grads.data(), m.data(), v.data(), kN, lr, beta1, beta2, eps,
                                  weight_decay, t, grad_scale);
        knngpt::cuda::adamw_update(d_params.ptr, d_grads.ptr, d_m.ptr, d_v.ptr, kN, lr, beta1, beta2, eps,
                                   weight_decay, t, grad_scale);
    }
    expect_close(d_params.to_host(), params, kTolerance, "params");
    expect_close(d_m.to_host(), m, kTolerance, "m");
    expect_close(d_v.to_host(), v, kTolerance, "v");
}

// ---- global_norm --------------------------------------------------------------

CUDA_TEST(CudaGlobalNorm, MatchesCpuAndIsDeterministic) {
    // 300 fits in two blocks; 300000 needs the grid-stride loop (over the block cap)
    for (size_t N : {kN, (size_t)300000}) {
        SCOPED_TRACE("N=" + std::to_string(N));
        const std::vector<float> x = uniform(N, 20, -2.0f, 2.0f);
        const double want = knngpt::cpu::global_norm_squared(x.data(), N);
        DeviceArray<float> d_x(x);
        const double got = knngpt::cuda::global_norm_squared(d_x.ptr, N);
        EXPECT_LE(std::fabs(got - want), kTolerance * want);
        EXPECT_EQ(knngpt::cuda::global_norm_squared(d_x.ptr, N), got);
    }
    float* empty = nullptr;
    EXPECT_EQ(knngpt::cuda::global_norm_squared(empty, 0), 0.0);
}

// ---- classifier ---------------------------------------------------------------

constexpr int kRows = 13, kV = 50, kVp = 64;

std::vector<int> targets(unsigned seed) {
    std::vector<int> v = random_ints(kRows, seed, kV);
    v[0] = kV - 1;  // the last real column
    return v;
}

// Logits with the padding columns set to a huge value: they must never enter the softmax.
std::vector<float> padded_logits(unsigned seed) {
    std::vector<float> logits = uniform((size_t)kRows * kVp, seed, -4.0f, 4.0f);
    for (int n = 0; n < kRows; n++)
        for (int j = kV; j < kVp; j++) logits[(size_t)n * kVp + j] = 1e4f;
    return logits;
}

CUDA_TEST(CudaClassifier, ForwardMatchesCpu) {
    const std::vector<float> logits = padded_logits(30);
    const std::vector<int> tgt = targets(31);
    std::vector<float> want(kRows);
    knngpt::cpu::crossentropy_forward(want.data(), logits.data(), tgt.data(), kRows, kV, kVp);

    DeviceArray<float> d_logits(logits), d_losses(std::vector<float>(kRows, -7.0f));
    DeviceArray<int> d_tgt(tgt);
    knngpt::cuda::crossentropy_forward(d_losses.ptr, d_logits.ptr, d_tgt.ptr, kRows, kV, kVp);
    expect_close(d_losses.to_host(), want, kTolerance, "losses");
}

CUDA_TEST(CudaClassifier, BackwardMatchesCpuInPlaceAndOut) {
    const std::vector<float> logits = padded_logits(32);
    const std::vector<int> tgt = targets(33);
    const float dloss = 1.0f / kRows;
    std::vector<float> want(logits.size());
    knngpt::cpu::crossentropy_softmax_backward(want.data(), logits.data(), tgt.data(), dloss, kRows, kV, kVp);

    DeviceArray<int> d_tgt(tgt);
    DeviceArray<float> d_logits(logits), d_dlogits(std::vector<float>(logits.size(), -7.0f));
    knngpt::cuda::crossentropy_softmax_backward(d_dlogits.ptr, d_logits.ptr, d_tgt.ptr, dloss, kRows, kV, kVp);
    const std::vector<float> out_of_place = d_dlogits.to_host();
    expect_close(out_of_place, want, kTolerance, "dlogits");
    for (int n = 0; n < kRows; n++)
        for (int j = kV; j < kVp; j++) EXPECT_EQ(out_of_place[(size_t)n * kVp + j], 0.0f) << n << "," << j;

    // in place: dlogits is logits
    DeviceArray<float> d_inplace(logits);
    knngpt::cuda::crossentropy_softmax_backward(d_inplace.ptr, d_inplace.ptr, d_tgt.ptr, dloss, kRows, kV, kVp);
    EXPECT_EQ(d_inplace.to_host(), out_of_place);
}

CUDA_TEST(CudaClassifier, FusedMatchesCpuInPlace) {
    // 13 rows: one full block of 8 and a partial one; V = 50 is not a multiple of 32, Vp = 64 pads it
    const std::vector<float> logits = padded_logits(34);
    const std::vector<int> tgt = targets(35);
    const float dloss = 1.0f / (2 * kRows);
    std::vector<float> want_losses(kRows), want_dlogits(logits.size());
    knngpt::cpu::crossentropy_fused(want_losses.data(), want_dlogits.data(), logits.data(), tgt.data(), dloss, kRows,
                                    kV, kVp);

    DeviceArray<int> d_tgt(tgt);
    DeviceArray<float> d_inplace(logits), d_losses(std::vector<float>(kRows, -7.0f));
    knngpt::cuda::crossentropy_fused(d_losses.ptr, d_inplace.ptr, d_inplace.ptr, d_tgt.ptr, dloss, kRows, kV, kVp);
    expect_close(d_losses.to_host(), want_losses, kTolerance, "losses");
    const std::vector<float> dlogits = d_inplace.to_host();
    expect_close(dlogits, want_dlogits, kTolerance, "dlogits");
    for (int n = 0; n < kRows; n++)
        for (int j = kV; j < kVp; j++) EXPECT_EQ(dlogits[(size_t)n * kVp + j], 0.0f) << n << "," << j;

    // the same as the two separate kernels, out of place
    DeviceArray<float> d_logits(logits), d_dlogits(std::vector<float>(logits.size(), -7.0f)),
        d_sep_losses(std::vector<float>(kRows, -7.0f));
    knngpt::cuda::crossentropy_forward(d_sep_losses.ptr, d_logits.ptr, d_tgt.ptr, kRows, kV, kVp);
    knngpt::cuda::crossentropy_softmax_backward(d_dlogits.ptr, d_logits.ptr, d_tgt.ptr, dloss, kRows, kV, kVp);
    expect_close(d_losses.to_host(), d_sep_losses.to_host(), kTolerance, "losses vs forward kernel");
    expect_close(dlogits, d_dlogits.to_host(), kTolerance, "dlogits vs backward kernel");
}

CUDA_TEST(CudaClassifier, OnlineRowStatisticsMatchCpuOnHardRows) {
    // rows that make the online statistics rescale or skip: ascending (every element a new
    // maximum, each lane rescales at every step), descending, a huge spread (most terms
    // underflow), -inf entries (masked logits; never the target), and a row whose only large
    // value sits in one lane; then a NaN and a +inf, which must give a NaN loss as on the CPU
    std::vector<float> logits((size_t)kRows * kVp, 1e4f);  // padding columns: never read
    std::vector<int> tgt = targets(36);
    const std::vector<float> noise = uniform((size_t)kRows * kV, 37, -1.0f, 1.0f);
    for (int n = 0; n < kRows; n++)
        for (int j = 0; j < kV; j++) {
            float x = noise[(size_t)n * kV + j];
            if (n == 0) x = 0.25f * j;
            if (n == 1) x = -0.25f * j;
            if (n == 2) x *= 80.0f;
            if (n == 3 && j % 3 == 1) x = -INFINITY;
            if (n == 4) x = j == 37 ? 30.0f : x;
            logits[(size_t)n * kVp + j] = x;
        }
    if (tgt[3] % 3 == 1) tgt[3] = tgt[3] - 1;  // a finite target
    logits[(size_t)5 * kVp + 33] = NAN;        // lane 1's second element
    logits[(size_t)6 * kVp + 0] = NAN;         // lane 0's first element: no maximum yet
    logits[(size_t)7 * kVp + 40] = INFINITY;
    const float dloss = 1.0f / kRows;
    std::vector<float> want_losses(kRows), want_dlogits(logits.size());
    knngpt::cpu::crossentropy_fused(want_losses.data(), want_dlogits.data(), logits.data(), tgt.data(), dloss, kRows,
                                    kV, kVp);
    DeviceArray<int> d_tgt(tgt);
    DeviceArray<float> d_logits(logits), d_losses(std::vector<float>(kRows, -7.0f));
    knngpt::cuda::crossentropy_fused(d_losses.ptr, d_logits.ptr, d_logits.ptr, d_tgt.ptr, dloss, kRows, kV, kVp);
    const std::vector<float> losses = d_losses.to_host(), dlogits = d_logits.to_host();
    for (int n = 0; n < kRows; n++) {
        SCOPED_TRACE("row " + std::to_string(n));
        if (n >= 5 && n <= 7) {
            EXPECT_TRUE(std::isnan(want_losses[n])) << "the CPU twin's loss: " << want_losses[n];
            EXPECT_TRUE(std::isnan(losses[n])) << "loss " << losses[n] << ": a non-finite logit must give NaN";
            continue;
        }
        EXPECT_LE(std::fabs(losses[n] - want_losses[n]), kTolerance * std::max(1.0f, std::fabs(want_losses[n])));
        for (int j = 0; j < kV; j++)
            EXPECT_LE(std::fabs(dlogits[(size_t)n * kVp + j] - want_dlogits[(size_t)n * kVp + j]), kTolerance * dloss)
                << "column " << j;
    }
}

// bf16 logits (the bf16 build): the kernels read them widened and compute in fp32, so on
// the same values they match the CPU twin as the fp32 kernels do; dlogits are stored rounded
// (relative error <= 2^-8: bf16 keeps 8 significant bits). Against the fp32 logits they were
// rounded from, the loss moves by at most 2^-7 max |logit| (classifier.cuh's bound), checked
// here with logits up to 8.
CUDA_TEST(CudaClassifier, Bf16LogitsMatchCpuOnTheirValuesAndTheBoundOnTheFp32Ones) {
    std::vector<float> logits = padded_logits(40);
    for (float& x : logits) x = x < 100.0f ? 2.0f * x : x;  // |x| <= 8, the padding kept
    const std::vector<int> tgt = targets(41);
    const float dloss = 1.0f / kRows;
    std::vector<__nv_bfloat16> logits16(logits.size());
    std::vector<float> widened(logits.size());
    for (size_t i = 0; i < logits.size(); i++) {
        logits16[i] = __float2bfloat16(logits[i]);
        widened[i] = __bfloat162float(logits16[i]);
    }
    std::vector<float> want_losses(kRows), want_dlogits(logits.size()), fp32_losses(kRows);
    knngpt::cpu::crossentropy_fused(want_losses.data(), want_dlogits.data(), widened.data(), tgt.data(), dloss, kRows,
                                    kV, kVp);
    knngpt::cpu::crossentropy_forward(fp32_losses.data(), logits.data(), tgt.data(), kRows, kV, kVp);

    DeviceArray<int> d_tgt(tgt);
    DeviceArray<__nv_bfloat16> d_logits(logits16), d_forward_logits(logits16);
    DeviceArray<float> d_losses(std::vector<float>(kRows, -7.0f)), d_forward_losses(std::vector<float>(kRows, -7.0f));
    knngpt::cuda::crossentropy_forward(d_forward_losses.ptr, d_forward_logits.ptr, d_tgt.ptr, kRows, kV, kVp);
    knngpt::cuda::crossentropy_fused(d_losses.ptr, d_logits.ptr, d_logits.ptr, d_tgt.ptr, dloss, kRows, kV, kVp);
    const std::vector<float> losses = d_losses.to_host();
    const std::vector<__nv_bfloat16> dlogits = d_logits.to_host();
    expect_close(losses, want_losses, kTolerance, "losses on the bf16 values");
    expect_close(d_forward_losses.to_host(), want_losses, kTolerance, "forward losses on the bf16 values");
    for (int n = 0; n < kRows; n++) {
        float largest = 0.0f;
        for (int j = 0; j < kV; j++) largest = std::max(largest, std::fabs(logits[(size_t)n * kVp + j]));
        EXPECT_LE(std::fabs(losses[n] - fp32_losses[n]), 0x1p-7f * largest + 1e-5f) << "row " << n;
        for (int j = 0; j < kVp; j++) {
            const float got = __bfloat162float(dlogits[(size_t)n * kVp + j]), want = want_dlogits[(size_t)n * kVp + j];
            EXPECT_LE(std::fabs(got - want), 0x1p-8f * std::fabs(want) + kTolerance * dloss) << n << "," << j;
        }
    }
}

}  // namespace
