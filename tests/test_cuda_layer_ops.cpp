// tests/test_cuda_layer_ops.cpp — the fp32 CUDA kernels of the model's layers
// besides matmul and attention (encoder, residual, gelu, layernorm), run under
// the emulator against their CPU twins in kernels/cpu. Shapes are deliberately not multiples of any block size (T = 7,
// C = 40 / 20, N = 300), so every partial block and tail guard is exercised.
// Backward ops are run twice onto nonzero gradients, which checks that they
// accumulate (+=) like the twins.
//
// Tolerance: 1e-5, relative to the largest reference entry (max_rel_error).
// Both sides are fp32; they differ only in summation order (warp butterflies,
// atomics, striped partial sums against sequential loops) and in tanh (tanhf
// against tanh_vectorizable, ~1e-7 apart), which for these O(1) values over at
// most 40 terms stays within a few ulp, far under 1e-5.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/encoder.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/residual.cuh"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/residual.h"
#include "tests/test_util.h"

using knngpt_test::DeviceArray;
using knngpt_test::expect_close;
using knngpt_test::random_ints;
using knngpt_test::uniform;

namespace {

constexpr double kTolerance = 1e-5;

// ---- encoder ------------------------------------------------------------------

constexpr int kB = 2, kT = 7, kV = 11, kMaxT = 9;

std::vector<int> token_ids(size_t n, unsigned seed) {
    std::vector<int> v = random_ints(n, seed, kV);
    v[1] = v[0];  // a repeated token: two (b, t) add into one dwte row
    return v;
}

CUDA_TEST(CudaEncoder, ForwardMatchesCpu) {
    const int C = 40;
    const std::vector<int> inp = token_ids(kB * kT, 1);
    const std::vector<float> wte = uniform((size_t)kV * C, 2), wpe = uniform((size_t)kMaxT * C, 3);
    std::vector<float> want((size_t)kB * kT * C);
    knngpt::cpu::encoder_forward(want.data(), inp.data(), wte.data(), wpe.data(), kB, kT, C);

    DeviceArray<int> d_inp(inp);
    DeviceArray<float> d_wte(wte), d_wpe(wpe), d_out(std::vector<float>(want.size(), -7.0f));
    knngpt::cuda::encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, kB, kT, C);
    expect_close(d_out.to_host(), want, kTolerance, "out");
}

CUDA_TEST(CudaEncoder, BackwardAccumulatesLikeCpu) {
    const int C = 40;
    const std::vector<int> inp = token_ids(kB * kT, 4);
    const std::vector<float> dout = uniform((size_t)kB * kT * C, 5);
    std::vector<float> dwte = uniform((size_t)kV * C, 6), dwpe = uniform((size_t)kMaxT * C, 7);

    DeviceArray<int> d_inp(inp);
    DeviceArray<float> d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
    for (int pass = 0; pass < 2; pass++) {
        knngpt::cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), kB, kT, C, kV);
        knngpt::cuda::encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, d_inp.ptr, kB, kT, C, kV);
    }
    expect_close(d_dwte.to_host(), dwte, kTolerance, "dwte");
    expect_close(d_dwpe.to_host(), dwpe, kTolerance, "dwpe");
}

// dwte sums each token's rows in position order, deterministically: from a
// zeroed dwte it is the CPU twin's bit for bit, on every call. 2600 positions span three chunks of the counting sort (1024 each), with
// few tokens (every row of dwte gathers ~400 positions from every chunk), one
// token never used, and one token used at a single position.
CUDA_TEST(CudaEncoder, BackwardWteIsTheCpuSumInPositionOrder) {
    const int B = 2, T = 1300, C = 33, V = 9;
    std::vector<int> inp = random_ints((size_t)B * T, 14, V - 2);  // tokens 0..6
    inp[1777] = V - 1;                                              // token 8 once; token 7 never
    const std::vector<float> dout = uniform((size_t)B * T * C, 15);
    std::vector<float> dwte((size_t)V * C, 0.0f), dwpe((size_t)T * C, 0.0f);
    knngpt::cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C, V);

    DeviceArray<int> d_inp(inp);
    DeviceArray<float> d_dout(dout);
    for (int call = 0; call < 2; call++) {
        DeviceArray<float> d_dwte(std::vector<float>(dwte.size(), 0.0f)), d_dwpe(std::vector<float>(dwpe.size(), 0.0f));
        knngpt::cuda::encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, d_inp.ptr, B, T, C, V);
        const std::vector<float> got = d_dwte.to_host();
        EXPECT_EQ(std::memcmp(got.data(), dwte.data(), got.size() * sizeof(float)), 0) << "call " << call;
        for (int c = 0; c < C; c++) EXPECT_EQ(got[(size_t)7 * C + c], 0.0f) << "the unused token's row, channel " << c;
    }
}

// ---- residual -----------------------------------------------------------------

constexpr size_t kN = 300;

CUDA_TEST(CudaResidual, ForwardMatchesCpu) {
    const std::vector<float> a = uniform(kN, 8), b = uniform(kN, 9);
    std::vector<float> want(kN);
    knngpt::cpu::residual_forward(want.data(), a.data(), b.data(), kN);

    DeviceArray<float> d_a(a), d_b(b), d_out(std::vector<float>(kN, -7.0f));
    knngpt::cuda::residual_forward(d_out.ptr, d_a.ptr, d_b.ptr, kN);
    expect_close(d_out.to_host(), want, kTolerance, "out");
}

CUDA_TEST(CudaResidual, BackwardAccumulatesLikeCpu) {
    const std::vector<float> dout = uniform(kN, 10);
    std::vector<float> da = uniform(kN, 11), db = uniform(kN, 12);

    DeviceArray<float> d_dout(dout), d_da(da), d_db(db);
    for (int pass = 0; pass < 2; pass++) {
        knngpt::cpu::residual_backward(da.data(), db.data(), dout.data(), kN);
        knngpt::cuda::residual_backward(d_da.ptr, d_db.ptr, d_dout.ptr, kN);
    }
    expect_close(d_da.to_host(), da, kTolerance, "da");
    expect_close(d_db.to_host(), db, kTolerance, "db");
}

// ---- gelu ---------------------------------------------------------------------

CUDA_TEST(CudaGelu, ForwardMatchesCpu) {
    const std::vector<float> inp = uniform(kN, 13, -4.0f, 4.0f);
    std::vector<float> want(kN);
    knngpt::cpu::gelu_forward(want.data(), inp.data(), kN);

    DeviceArray<float> d_inp(inp), d_out(std::vector<float>(kN, -7.0f));
    knngpt::cuda::gelu_forward(d_out.ptr, d_inp.ptr, kN);
    expect_close(d_out.to_host(), want, kTolerance, "out");
}

CUDA_TEST(CudaGelu, BackwardAccumulatesLikeCpu) {
    const std::vector<float> inp = uniform(kN, 14, -4.0f, 4.0f), dout = uniform(kN, 15);
    std::vector<float> dinp = uniform(kN, 16);

    DeviceArray<float> d_inp(inp), d_dout(dout), d_dinp(dinp);
    for (int pass = 0; pass < 2; pass++) {
        knngpt::cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), kN);
        knngpt::cuda::gelu_backward(d_dinp.ptr, d_inp.ptr, d_dout.ptr, kN);
    }
    expect_close(d_dinp.to_host(), dinp, kTolerance, "dinp");
}

// ---- layernorm ----------------------------------------------------------------

// (rows, channels): C = 40 leaves lanes idle on the second pass over a row,
// C = 20 leaves 12 lanes idle throughout; 14 rows leave 2 warps of the second block idle.
struct LayerNormShape {
    int N, C;
};
const LayerNormShape kLayerNormShapes[] = {{kB * kT, 40}, {kB * kT, 20}, {300, 20}};

CUDA_TEST(CudaLayerNorm, ForwardMatchesCpu) {
    for (const LayerNormShape& shape : kLayerNormShapes) {
        SCOPED_TRACE("N=" + std::to_string(shape.N) + " C=" + std::to_string(shape.C));
        const int N = shape.N, C = shape.C;
        const std::vector<float> inp = uniform((size_t)N * C, 17, -2.0f, 3.0f);
        const std::vector<float> weight = uniform(C, 18), bias = uniform(C, 19);
        std::vector<float> out((size_t)N * C), mean(N), rstd(N);
        knngpt::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                                       N, C);

        DeviceArray<float> d_inp(inp), d_weight(weight), d_bias(bias);
        DeviceArray<float> d_out(std::vector<float>(out.size(), -7.0f)), d_mean(std::vector<float>(N, -7.0f)),
            d_rstd(std::vector<float>(N, -7.0f));
        knngpt::cuda::layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C);
        expect_close(d_out.to_host(), out, kTolerance, "out");
        expect_close(d_mean.to_host(), mean, kTolerance, "mean");
        expect_close(d_rstd.to_host(), rstd, kTolerance, "rstd");
    }
}

CUDA_TEST(CudaLayerNorm, BackwardAccumulatesLikeCpu) {
    for (const LayerNormShape& shape : kLayerNormShapes) {
        SCOPED_TRACE("N=" + std::to_string(shape.N) + " C=" + std::to_string(shape.C));
        const int N = shape.N, C = shape.C;
        const std::vector<float> inp = uniform((size_t)N * C, 20, -2.0f, 3.0f);
        const std::vector<float> weight = uniform(C, 21), bias = uniform(C, 22), dout = uniform((size_t)N * C, 23);
        std::vector<float> out((size_t)N * C), mean(N), rstd(N);
        knngpt::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                                       N, C);
        std::vector<float> dinp = uniform((size_t)N * C, 24), dweight = uniform(C, 25), dbias = uniform(C, 26);

        // both sides start from the CPU's mean and rstd, so only the backward is compared
        DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout), d_mean(mean), d_rstd(rstd);
        DeviceArray<float> d_dinp(dinp), d_dweight(dweight), d_dbias(dbias);
        for (int pass = 0; pass < 2; pass++) {
            knngpt::cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                                            weight.data(), mean.data(), rstd.data(), N, C);
            knngpt::cuda::layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_dout.ptr, d_inp.ptr,
                                             d_weight.ptr, d_mean.ptr, d_rstd.ptr, N, C);
        }
        expect_close(d_dinp.to_host(), dinp, kTolerance, "dinp");
        expect_close(d_dweight.to_host(), dweight, kTolerance, "dweight");
        expect_close(d_dbias.to_host(), dbias, kTolerance, "dbias");
    }
}

// dweight and dbias sum over rows in a fixed order (chunk partials, then the
// chunks in order), so two calls give the same bits; 1000 rows span four chunks.
// (Under the emulator blocks run one after another and any order would repeat;
// on a GPU this is what atomics would break.)
CUDA_TEST(CudaLayerNorm, BackwardParamsAreTheSameBitsOnEveryCall) {
    const int N = 1000, C = 70;
    const std::vector<float> inp = uniform((size_t)N * C, 27, -2.0f, 3.0f), weight = uniform(C, 28),
                             dout = uniform((size_t)N * C, 29), mean = uniform(N, 30), rstd = uniform(N, 31, 0.5f, 2.0f);
    DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout), d_mean(mean), d_rstd(rstd);
    std::vector<float> first_dweight, first_dbias;
    for (int call = 0; call < 3; call++) {
        DeviceArray<float> d_dinp(std::vector<float>((size_t)N * C, 0.0f)), d_dweight(std::vector<float>(C, 0.0f)),
            d_dbias(std::vector<float>(C, 0.0f));
        knngpt::cuda::layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr,
                                         d_mean.ptr, d_rstd.ptr, N, C);
        const std::vector<float> dweight = d_dweight.to_host(), dbias = d_dbias.to_host();
        if (call > 0) {
            EXPECT_EQ(std::memcmp(dweight.data(), first_dweight.data(), C * sizeof(float)), 0) << "call " << call;
            EXPECT_EQ(std::memcmp(dbias.data(), first_dbias.data(), C * sizeof(float)), 0) << "call " << call;
        } else {
            first_dweight = dweight;
            first_dbias = dbias;
        }
    }
}

}  // namespace

// A CUDA error's line starts with the prefix the trainer sets in a run of many ranks
// (train_gpt: error: rank R: ), then names the file, line and CUDA's message.
CUDA_TEST(CudaErrors, ACudaErrorLineCarriesTheRankPrefix) {
    EXPECT_EXIT(
        {
            knngpt::cuda::cuda_error_prefix() = "train_gpt: error: rank 3: ";
            void* p = nullptr;
            CUDA_CHECK(cudaMalloc(&p, (size_t)1 << 60));
        },
        testing::ExitedWithCode(1), "^train_gpt: error: rank 3: .*test_cuda_layer_ops.cpp:[0-9]+: CUDA error: out of memory");
}
