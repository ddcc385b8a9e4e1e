// tests/test_cuda_matmul.cpp — kernels/cuda/matmul.cuh under the emulator
// against the plain-loop twins of kernels/cpu/matmul.h (matmul_forward_loops,
// matmul_backward_loops; not the sgemm path). Shapes N = 19, C = 24, OC = 33
// are not multiples of 16 or 32, so the partial tiles of the bias and dbias
// kernels are exercised. Backward runs twice to check accumulation (+=).
//
// Tolerance: 1e-5 relative to the largest reference entry; both sides are fp32
// sums of at most 33 O(1) products, differing only in summation order.
#define KNNGPT_CUDA_EMU

#include "kernels/cuda/common.cuh"
#include "tests/cuda_test_util.h"

#include "kernels/cuda/matmul.cuh"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "tests/test_util.h"

using knngpt_test::DeviceArray;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;

namespace {

constexpr double kTolerance = 1e-5;
constexpr int kN = 19, kC = 24, kOC = 33;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_LE(max_rel_error(got.data(), want.data(), want.size()), kTolerance) << what;
}

TEST(CudaMatmul, ForwardMatchesCpuLoops) {
    const std::vector<float> inp = uniform((size_t)kN * kC, 1), weight = uniform((size_t)kOC * kC, 2),
                             bias = uniform(kOC, 3);
    DeviceArray<float> d_inp(inp), d_weight(weight), d_bias(bias);
    for (bool with_bias : {true, false}) {
        SCOPED_TRACE(with_bias ? "with bias" : "without bias");
        std::vector<float> want((size_t)kN * kOC, 0.0f);
        DeviceArray<float> d_out(std::vector<float>(want.size(), 7.0f));  // forward overwrites
        knngpt::cpu::matmul_forward_loops(want.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                                          kN, kC, kOC);
        knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, with_bias ? d_bias.ptr : nullptr, kN, kC,
                                     kOC);
        expect_close(d_out.to_host(), want, "out");
    }
}

TEST(CudaMatmul, BackwardAccumulatesAndMatchesCpuLoops) {
    const std::vector<float> inp = uniform((size_t)kN * kC, 4), weight = uniform((size_t)kOC * kC, 5),
                             dout = uniform((size_t)kN * kOC, 6);
    DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout);
    for (bool with_dbias : {true, false}) {
        SCOPED_TRACE(with_dbias ? "with dbias" : "without dbias");
        // nonzero starting gradients, so += is visible
        std::vector<float> dinp = uniform((size_t)kN * kC, 7), dweight = uniform((size_t)kOC * kC, 8),
                           dbias = uniform(kOC, 9);
        const std::vector<float> dbias_start = dbias;
        DeviceArray<float> d_dinp(dinp), d_dweight(dweight), d_dbias(dbias);
        for (int pass = 0; pass < 2; pass++) {
            knngpt::cpu::matmul_backward_loops(dinp.data(), dweight.data(), with_dbias ? dbias.data() : nullptr,
                                               dout.data(), inp.data(), weight.data(), kN, kC, kOC);
            knngpt::cuda::matmul_backward(d_dinp.ptr, d_dweight.ptr, with_dbias ? d_dbias.ptr : nullptr, d_dout.ptr,
                                          d_inp.ptr, d_weight.ptr, kN, kC, kOC);
        }
        expect_close(d_dinp.to_host(), dinp, "dinp");
        expect_close(d_dweight.to_host(), dweight, "dweight");
        expect_close(d_dbias.to_host(), dbias, "dbias");
        if (!with_dbias) {
            EXPECT_EQ(d_dbias.to_host(), dbias_start);
        }
    }
}

}  // namespace
