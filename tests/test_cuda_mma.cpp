// tests/test_cuda_mma.cpp — the register-level tensor-core wrappers of
// kernels/cuda/mma.cuh against plain matrix products, each lane's registers
// built and read by the PTX ISA's fragment layouts (kernels/emu/mma.h lists
// them). Under the emulator this checks the emulated instructions; on a GPU, that
// the hardware's layouts are the ones the emulator and the attention kernels use.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/mma.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/test_util.h"

using knngpt_test::DeviceArray;
using knngpt_test::uniform;

namespace {

using knngpt::cuda::pack_bf16x2;

float to_bf16(float x) { return (float)__float2bfloat16(x); }

// One warp: d (16 x 8) = c (16 x 8) + a (16 x 16) b (16 x 8), all row-major fp32
// in global memory (a and b hold bf16 values), through one mma_bf16_16816.
__global__ void mma_probe_kernel(float* d, const float* a, const float* b, const float* c) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const auto A = [&](int r, int k) { return a[r * 16 + k]; };
    const auto B = [&](int k, int n) { return b[k * 8 + n]; };
    const uint32_t af[4] = {pack_bf16x2(A(g, 2 * t), A(g, 2 * t + 1)), pack_bf16x2(A(g + 8, 2 * t), A(g + 8, 2 * t + 1)),
                            pack_bf16x2(A(g, 2 * t + 8), A(g, 2 * t + 9)),
                            pack_bf16x2(A(g + 8, 2 * t + 8), A(g + 8, 2 * t + 9))};
    const uint32_t bf[2] = {pack_bf16x2(B(2 * t, g), B(2 * t + 1, g)), pack_bf16x2(B(2 * t + 8, g), B(2 * t + 9, g))};
    const float cf[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    float df[4];
    knngpt::cuda::mma_bf16_16816(df, af, bf, cf);
    d[g * 8 + 2 * t] = df[0];
    d[g * 8 + 2 * t + 1] = df[1];
    d[(g + 8) * 8 + 2 * t] = df[2];
    d[(g + 8) * 8 + 2 * t + 1] = df[3];
}

CUDA_TEST(CudaMma, M16n8k16MatchesTheMatrixProduct) {
    std::vector<float> a = uniform(16 * 16, 1, -2.0f, 2.0f), b = uniform(16 * 8, 2, -2.0f, 2.0f);
    const std::vector<float> c = uniform(16 * 8, 3, -2.0f, 2.0f);
    for (float& x : a) x = to_bf16(x);
    for (float& x : b) x = to_bf16(x);
    DeviceArray<float> d_a(a), d_b(b), d_c(c), d_d(std::vector<float>(16 * 8, -7.0f));
    launch(mma_probe_kernel, 1, 32, 0, nullptr, d_d.ptr, d_a.ptr, d_b.ptr, d_c.ptr);
    const std::vector<float> d = d_d.to_host();
    double worst = 0.0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double want = c[m * 8 + n];
            for (int k = 0; k < 16; k++) want += (double)a[m * 16 + k] * b[k * 8 + n];
            worst = std::fmax(worst, std::fabs(d[m * 8 + n] - want));
        }
    // 16 exact products summed in fp32: a few ulps of values below 64
    EXPECT_LT(worst, 1e-4) << "an element in the wrong register gives errors of order 1";
}

// One warp: the four 8 x 8 matrices of a 16 x 16 bf16 tile in shared memory
// (m0 rows 0-7 cols 0-7, m1 rows 8-15 cols 0-7, m2 rows 0-7 cols 8-15, m3 rows
// 8-15 cols 8-15) through ldmatrix_x4 and ldmatrix_x4_trans; lane L writes
// out[(L * 4 + m) * 2 + {0, 1}] = the low and high halves of its register m,
// plain then transposed (out_trans).
__global__ void ldmatrix_probe_kernel(float* out, float* out_trans, const float* tile_values) {
    constexpr int kStride = 24;  // bf16 elements a row: 48 bytes, 16-byte aligned rows
    __align__(16) __shared__ __nv_bfloat16 tile[16 * kStride];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) tile[(i / 16) * kStride + i % 16] = __float2bfloat16(tile_values[i]);
    __syncthreads();
    const int m = lane / 8, r = lane % 8;
    const __nv_bfloat16* row = tile + ((m % 2) * 8 + r) * kStride + (m / 2) * 8;
    uint32_t plain[4], trans[4];
    knngpt::cuda::ldmatrix_x4(plain, row);
    knngpt::cuda::ldmatrix_x4_trans(trans, row);
    for (int j = 0; j < 4; j++) {
        out[(lane * 4 + j) * 2] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(plain[j] & 0xFFFFu)));
        out[(lane * 4 + j) * 2 + 1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(plain[j] >> 16)));
        out_trans[(lane * 4 + j) * 2] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(trans[j] & 0xFFFFu)));
        out_trans[(lane * 4 + j) * 2 + 1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(trans[j] >> 16)));
    }
}

CUDA_TEST(CudaMma, LdmatrixGivesEachLaneItsElements) {
    std::vector<float> tile(256);
    for (int i = 0; i < 256; i++) tile[i] = (float)i;  // exact in bf16 (8 significant bits)
    DeviceArray<float> d_tile(tile), d_out(std::vector<float>(256, -1.0f)), d_trans(std::vector<float>(256, -1.0f));
    launch(ldmatrix_probe_kernel, 1, 32, 0, nullptr, d_out.ptr, d_trans.ptr, d_tile.ptr);
    const std::vector<float> out = d_out.to_host(), trans = d_trans.to_host();
    int wrong = 0;
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int m = 0; m < 4; m++) {
            const auto M = [&](int r, int c) { return tile[((m % 2) * 8 + r) * 16 + (m / 2) * 8 + c]; };
            wrong += out[(lane * 4 + m) * 2] != M(g, 2 * t);
            wrong += out[(lane * 4 + m) * 2 + 1] != M(g, 2 * t + 1);
            wrong += trans[(lane * 4 + m) * 2] != M(2 * t, g);
            wrong += trans[(lane * 4 + m) * 2 + 1] != M(2 * t + 1, g);
        }
    }
    EXPECT_EQ(wrong, 0) << "of 512 elements";
}

}  // namespace
