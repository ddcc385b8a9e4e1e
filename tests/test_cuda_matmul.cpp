// tests/test_cuda_matmul.cpp — kernels/cuda/matmul.cuh under the emulator,
// in both precisions (matmul_precision() is set by each test and restored).
//
// FP32: against the plain-loop twins of kernels/cpu/matmul.h
// (matmul_forward_loops, matmul_backward_loops; not the sgemm path). Shapes
// N = 19, C = 24, OC = 33 are not multiples of 16 or 32, so the partial tiles
// of the bias and dbias kernels are exercised. Backward runs twice to check
// accumulation (+=) into dweight and dbias, and that dinp is overwritten. Tolerance: 1e-5 relative to the largest reference entry;
// both sides are fp32 sums of at most 33 O(1) products, differing only in
// summation order.
//
// BF16, on (N, C, OC) = (37, 45, 29) and (5, 130, 67), again not multiples of
// anything, forward and twice-run backward, with and without bias:
//   (a) the mode is exactly "round the operands, then fp32": the result equals
//       the CPU twin (knngpt::cpu::matmul_forward/backward) run on the host
//       inputs rounded to bf16, to 1e-5 relative. A product of two bf16 values
//       is exact in fp32, so only the summation order differs. (The bias and
//       the starting gradients are not rounded: the bias add and += are fp32.)
//   (b) the documented error bound against the unrounded fp32 CPU result:
//       |got - want| <= 2^-7 sum_k |a_k||b_k| + 1e-6 for every element, the
//       sum over every product accumulated into it (backward: dweight's
//       both passes, twice one pass's sum; dinp one pass): the documented
//       bound, the fp32 summation inside the 1e-6. And the error is not tiny (max relative error
//       > 1e-5), so the rounding really happens.
#include "tests/cuda_test_util.h"  // first: it picks the build (emulator, or nvcc for the GPU)

#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/matmul.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gelu.h"
#include "kernels/cpu/matmul.h"
#include "tests/test_util.h"

using knngpt::cuda::matmul_precision;
using knngpt::cuda::MatmulPrecision;
using knngpt_test::DeviceArray;
using knngpt_test::expect_close;
using knngpt_test::max_rel_error;
using knngpt_test::uniform;

namespace {

constexpr double kTolerance = 1e-5;
constexpr int kN = 19, kC = 24, kOC = 33;

// Sets matmul_precision() for the scope of a test and restores the previous value.
class PrecisionScope {
  public:
    explicit PrecisionScope(MatmulPrecision precision) : saved_(matmul_precision()) { matmul_precision() = precision; }
    ~PrecisionScope() { matmul_precision() = saved_; }
    PrecisionScope(const PrecisionScope&) = delete;
    PrecisionScope& operator=(const PrecisionScope&) = delete;

  private:
    MatmulPrecision saved_;
};

CUDA_TEST(CudaMatmul, ForwardMatchesCpuLoops) {
    PrecisionScope fp32(MatmulPrecision::FP32);
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
        expect_close(d_out.to_host(), want, kTolerance, "out");
    }
}

// dinp is overwritten (beta = 0: it starts as NaN here, which any read of it
// would carry into the result), dweight and dbias accumulate (+=).
CUDA_TEST(CudaMatmul, BackwardOverwritesDinpAccumulatesWeightsAndMatchesCpuLoops) {
    PrecisionScope fp32(MatmulPrecision::FP32);
    const std::vector<float> inp = uniform((size_t)kN * kC, 4), weight = uniform((size_t)kOC * kC, 5),
                             dout = uniform((size_t)kN * kOC, 6);
    DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout);
    for (bool with_dbias : {true, false}) {
        SCOPED_TRACE(with_dbias ? "with dbias" : "without dbias");
        // nonzero starting gradients, so += is visible; dinp's start must not matter
        std::vector<float> dinp((size_t)kN * kC, std::nanf("")), dweight = uniform((size_t)kOC * kC, 8),
                           dbias = uniform(kOC, 9);
        const std::vector<float> dbias_start = dbias;
        DeviceArray<float> d_dinp(dinp), d_dweight(dweight), d_dbias(dbias);
        std::fill(dinp.begin(), dinp.end(), 0.0f);  // the CPU loops' start (they overwrite too)
        for (int pass = 0; pass < 2; pass++) {
            knngpt::cpu::matmul_backward_loops(dinp.data(), dweight.data(), with_dbias ? dbias.data() : nullptr,
                                               dout.data(), inp.data(), weight.data(), kN, kC, kOC);
            knngpt::cuda::matmul_backward(d_dinp.ptr, d_dweight.ptr, with_dbias ? d_dbias.ptr : nullptr, d_dout.ptr,
                                          d_inp.ptr, d_weight.ptr, kN, kC, kOC);
        }
        expect_close(d_dinp.to_host(), dinp, kTolerance, "dinp");
        expect_close(d_dweight.to_host(), dweight, kTolerance, "dweight");
        expect_close(d_dbias.to_host(), dbias, kTolerance, "dbias");
        if (!with_dbias) {
            EXPECT_EQ(d_dbias.to_host(), dbias_start);
        }
    }
}

// ---- bf16 mode -------------------------------------------------------------

struct Shape {
    int N, C, OC;
};
constexpr Shape kBf16Shapes[] = {{37, 45, 29}, {5, 130, 67}};
constexpr double kBoundFactor = 1.0 / 128.0;  // 2^-7
constexpr double kBoundFloor = 1e-6;
constexpr double kNotTiny = 1e-5;

// x rounded to bf16 (8 significant bits), nearest with ties to even, as
// __float2bfloat16 rounds, back as floats; finite x only. Written out here
// rather than taken from the emulator, so the emulated conversion is checked.
std::vector<float> round_to_bf16(const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        uint32_t bits;
        std::memcpy(&bits, &x[i], sizeof bits);
        bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;  // drop 16 bits, rounding half to even
        std::memcpy(&r[i], &bits, sizeof bits);
    }
    return r;
}

// sum_k |a[i,k]| |b[j,k]| for row-major a (I, K), b (J, K), in double: the
// scale of the bf16 error of (a @ b^T)[i, j] (callers pass transposes where
// their product needs them).
std::vector<double> abs_products(const std::vector<float>& a, const std::vector<float>& b, int I, int J, int K) {
    std::vector<double> s((size_t)I * J, 0.0);
    for (int i = 0; i < I; i++)
        for (int j = 0; j < J; j++) {
            double sum = 0.0;
            for (int k = 0; k < K; k++) sum += std::fabs((double)a[(size_t)i * K + k]) * std::fabs((double)b[(size_t)j * K + k]);
            s[(size_t)i * J + j] = sum;
        }
    return s;
}

// the transpose of a row-major (R, K) array
std::vector<float> transpose(const std::vector<float>& a, int R, int K) {
    std::vector<float> t(a.size());
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) t[(size_t)k * R + r] = a[(size_t)r * K + k];
    return t;
}

// (b): every element within factor * scale + floor of want, and the largest
// relative error (max_rel_error) above kNotTiny.
void expect_within_bound(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& scale, double factor, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    ASSERT_EQ(scale.size(), want.size()) << what;
    size_t violations = 0, first = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double bound = factor * scale[i] + kBoundFloor;
        if (std::fabs((double)got[i] - (double)want[i]) > bound) {
            if (violations++ == 0) first = i;
        }
    }
    EXPECT_EQ(violations, 0u) << what << ": first at " << first << ": got " << got[first] << ", want " << want[first]
                              << ", bound " << factor * scale[first] + kBoundFloor;
    EXPECT_GT(max_rel_error(got.data(), want.data(), want.size()), kNotTiny)
        << what << ": no visible bf16 rounding error";
}

CUDA_TEST(CudaMatmul, Bf16ForwardIsRoundedOperandsInFp32) {
    PrecisionScope bf16(MatmulPrecision::BF16);
    for (const Shape& s : kBf16Shapes) {
        SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
        const std::vector<float> inp = uniform((size_t)s.N * s.C, 11), weight = uniform((size_t)s.OC * s.C, 12),
                                 bias = uniform(s.OC, 13);
        const std::vector<float> inp_r = round_to_bf16(inp), weight_r = round_to_bf16(weight);
        const std::vector<double> scale = abs_products(inp, weight, s.N, s.OC, s.C);
        DeviceArray<float> d_inp(inp), d_weight(weight), d_bias(bias);
        for (bool with_bias : {true, false}) {
            SCOPED_TRACE(with_bias ? "with bias" : "without bias");
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> rounded((size_t)s.N * s.OC), exact((size_t)s.N * s.OC);
            knngpt::cpu::matmul_forward(rounded.data(), inp_r.data(), weight_r.data(), b, s.N, s.C, s.OC);
            knngpt::cpu::matmul_forward(exact.data(), inp.data(), weight.data(), b, s.N, s.C, s.OC);
            DeviceArray<float> d_out(std::vector<float>(rounded.size(), 7.0f));
            knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, with_bias ? d_bias.ptr : nullptr, s.N,
                                         s.C, s.OC);
            const std::vector<float> got = d_out.to_host();
            expect_close(got, rounded, kTolerance, "out vs rounded inputs");                       // (a)
            expect_within_bound(got, exact, scale, kBoundFactor, "out vs fp32");   // (b)
        }
    }
}

CUDA_TEST(CudaMatmul, Bf16BackwardIsRoundedOperandsInFp32) {
    PrecisionScope bf16(MatmulPrecision::BF16);
    constexpr int kPasses = 2;
    for (const Shape& s : kBf16Shapes) {
        SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
        const int N = s.N, C = s.C, OC = s.OC;
        const std::vector<float> inp = uniform((size_t)N * C, 21), weight = uniform((size_t)OC * C, 22),
                                 dout = uniform((size_t)N * OC, 23);
        const std::vector<float> inp_r = round_to_bf16(inp), weight_r = round_to_bf16(weight),
                                 dout_r = round_to_bf16(dout);
        // error scales of one pass: dinp[n,c] sums over o of dout[n,o] weight[o,c];
        // dweight[o,c] sums over n of dout[n,o] inp[n,c]
        const std::vector<float> dout_t = transpose(dout, N, OC);
        const std::vector<double> dinp_scale = abs_products(dout, transpose(weight, OC, C), N, C, OC);
        const std::vector<double> dweight_scale = abs_products(dout_t, transpose(inp, N, C), OC, C, N);
        DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout);
        for (bool with_dbias : {true, false}) {
            SCOPED_TRACE(with_dbias ? "with dbias" : "without dbias");
            // nonzero starting gradients, so += is visible (dinp is overwritten: one pass's sum)
            const std::vector<float> dinp0 = uniform((size_t)N * C, 24), dweight0 = uniform((size_t)OC * C, 25),
                                     dbias0 = uniform(OC, 26);
            std::vector<float> dinp_r = dinp0, dweight_r = dweight0, dbias_r = dbias0;  // CPU on rounded inputs
            std::vector<float> dinp_x = dinp0, dweight_x = dweight0, dbias_x = dbias0;  // CPU on fp32 inputs
            DeviceArray<float> d_dinp(dinp0), d_dweight(dweight0), d_dbias(dbias0);
            for (int pass = 0; pass < kPasses; pass++) {
                knngpt::cpu::matmul_backward(dinp_r.data(), dweight_r.data(), with_dbias ? dbias_r.data() : nullptr,
                                             dout_r.data(), inp_r.data(), weight_r.data(), N, C, OC);
                knngpt::cpu::matmul_backward(dinp_x.data(), dweight_x.data(), with_dbias ? dbias_x.data() : nullptr,
                                             dout.data(), inp.data(), weight.data(), N, C, OC);
                knngpt::cuda::matmul_backward(d_dinp.ptr, d_dweight.ptr, with_dbias ? d_dbias.ptr : nullptr,
                                              d_dout.ptr, d_inp.ptr, d_weight.ptr, N, C, OC);
            }
            const std::vector<float> dinp = d_dinp.to_host(), dweight = d_dweight.to_host(), dbias = d_dbias.to_host();
            // (a)
            expect_close(dinp, dinp_r, kTolerance, "dinp vs rounded inputs");
            expect_close(dweight, dweight_r, kTolerance, "dweight vs rounded inputs");
            // (b): dinp one pass, dweight kPasses accumulated passes, each within its bound
            expect_within_bound(dinp, dinp_x, dinp_scale, kBoundFactor, "dinp vs fp32");
            expect_within_bound(dweight, dweight_x, dweight_scale, kPasses * kBoundFactor, "dweight vs fp32");
            // dbias sums the fp32 dout in both modes
            expect_close(dbias, dbias_x, kTolerance, "dbias");
            if (!with_dbias) {
                EXPECT_EQ(dbias, dbias0);
            }
        }
    }
}

// ---- the bf16 copy of the parameters ------------------------------------------
//
// A weight inside the registered parameter buffer is read from its bf16 copy
// (bf16_parameters.cuh). The copy must equal bf16(params) bit for bit at
// registration and after AdamW updates the parameters, a matmul reading it
// must equal one converting the same weight, and unregistering forgets it.

// The registered copy of count parameters at p, widened to float on the host.
std::vector<float> registered_copy(const float* p, size_t count) {
    const __nv_bfloat16* copy = knngpt::cuda::bf16_copy_of(p, count);
    EXPECT_NE(copy, nullptr);
    std::vector<__nv_bfloat16> host(count);
    if (copy) CUDA_CHECK(cudaMemcpy(host.data(), copy, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    std::vector<float> widened(count);
    for (size_t i = 0; i < count; i++) widened[i] = __bfloat162float(host[i]);
    return widened;
}

CUDA_TEST(CudaMatmul, RegisteredWeightsReadTheBf16CopyAdamWKeeps) {
    PrecisionScope bf16(MatmulPrecision::BF16);
    const int N = 11, C = 37, OC = 21;
    // The weight sits inside a larger buffer, at an offset of 128 floats, so
    // its bf16 copy starts 256 bytes into the copy's allocation: as aligned as
    // the converted plain weight below (a cudaMalloc'd array, converted into a
    // cudaMalloc'd scratch). cuBLASLt is told each operand's alignment and may
    // pick another algorithm (another summation order) for a less aligned one,
    // so an odd offset would not leave the comparison bit for bit on a GPU.
    const size_t weight_count = (size_t)OC * C, offset = 128;
    std::vector<float> params = uniform(offset + weight_count + 3, 20);
    DeviceArray<float> d_params(params), d_inp(uniform((size_t)N * C, 21));
    float* weight = d_params.ptr + offset;
    knngpt::cuda::register_parameters(d_params.ptr, params.size());

    EXPECT_NE(knngpt::cuda::bf16_copy_of(weight, weight_count), nullptr);
    EXPECT_EQ(knngpt::cuda::bf16_copy_of(d_params.ptr + 4, params.size()), nullptr) << "range past the end";
    EXPECT_EQ((uintptr_t)knngpt::cuda::bf16_copy_of(weight, weight_count) % 256, 0u) << "the copy is 256-byte aligned";
    EXPECT_EQ(knngpt::cuda::bf16_copy_of(d_inp.ptr, (size_t)N * C), nullptr) << "not a parameter";
    EXPECT_EQ(registered_copy(d_params.ptr, params.size()), round_to_bf16(params));

    // the same weight outside the buffer is converted on the call: same result, bit for bit
    auto forward = [&](const float* w) {
        DeviceArray<float> out(std::vector<float>((size_t)N * OC, 0.0f));
        knngpt::cuda::matmul_forward(out.ptr, d_inp.ptr, w, nullptr, N, C, OC);
        return out.to_host();
    };
    auto backward_dinp = [&](const float* w) {
        DeviceArray<float> dinp(std::vector<float>((size_t)N * C, 0.0f)), dweight(std::vector<float>(weight_count, 0.0f));
        DeviceArray<float> dout(uniform((size_t)N * OC, 22));
        knngpt::cuda::matmul_backward(dinp.ptr, dweight.ptr, nullptr, dout.ptr, d_inp.ptr, w, N, C, OC);
        return dinp.to_host();
    };
    auto check_against_plain_weight = [&](const char* when) {
        std::vector<float> current = d_params.to_host();
        DeviceArray<float> plain(std::vector<float>(current.begin() + offset, current.begin() + offset + weight_count));
        EXPECT_EQ(forward(weight), forward(plain.ptr)) << when;
        EXPECT_EQ(backward_dinp(weight), backward_dinp(plain.ptr)) << when;
    };
    check_against_plain_weight("after registering");

    // AdamW moves the parameters (a sub-range, as the model updates tensor by
    // tensor): the copy follows, and the matmul reads the moved weights
    DeviceArray<float> grads(uniform(params.size(), 23)), m(std::vector<float>(params.size(), 0.0f)),
        v(std::vector<float>(params.size(), 0.0f));
    knngpt::cuda::adamw_update(weight, grads.ptr + offset, m.ptr + offset, v.ptr + offset, weight_count, 0.05f, 0.9f,
                               0.95f, 1e-8f, 0.1f, 1, 1.0f);
    const std::vector<float> updated = d_params.to_host();
    EXPECT_NE(updated, params);
    EXPECT_EQ(registered_copy(d_params.ptr, params.size()), round_to_bf16(updated));
    check_against_plain_weight("after an AdamW step");

    // the copy is what the matmul reads: a write that bypasses AdamW (which
    // the invariant rules out) leaves it stale, and the result with it
    CUDA_CHECK(cudaMemset(weight, 0, weight_count * sizeof(float)));
    EXPECT_NE(forward(weight), std::vector<float>((size_t)N * OC, 0.0f));

    knngpt::cuda::unregister_parameters(d_params.ptr);
    EXPECT_EQ(knngpt::cuda::bf16_copy_of(weight, weight_count), nullptr);
    EXPECT_EQ(forward(weight), std::vector<float>((size_t)N * OC, 0.0f)) << "unregistered: converted again";
}

// ---- epilogues -------------------------------------------------------------------
//
// The bias add and GELU in the GEMM's epilogue (emulated library) or as our
// kernels, for every matmul_fusion() setting, give the CPU twin's result
// (fp32 operands, 1e-5): matmul_forward with and without bias, and
// matmul_forward_gelu's two outputs. Two shapes: OC = 29 rows per column of
// the column-major output is not a multiple of 8, which we expected the real
// library to refuse for the GELU input (CUDA 13 on an H200 takes it all the
// same); OC = 32 is, so on a GPU the fused GELU runs there in any case.
//
// On a GPU the fused GELU is cuBLASLt's own, not gelu.cuh's: the same tanh
// form y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), but with
// the library's tanh (it may use the hardware's tanh.approx.f32, whose
// relative error PTX bounds by 2^-11) and its own rounding of u. Its GELU
// output is held to a bound derived from that, element by element:
//   t' = tanh(u) (1 + e), |e| <= 2^-10 (the hardware's 2^-11, doubled for u's
//        rounding and the library's own evaluation)
//   |y' - y| = 0.5 |x| |t' - t| <= 0.5 |x| |tanh(u)| 2^-10 <= 2^-11 |x|
// plus what the GEMM's summation order moves x by (<= 1e-5 max|x|, as the
// GELU input is checked), times GELU's slope (|dy/dx| <= 1.13): so
//   |got - want| <= 2^-11 |x| + 2e-5 max|x|   for every element.
// Where the GELU is ours (emulator, our kernel after the GEMM) the 1e-5 of
// everything else holds.
constexpr double kLibraryTanhRelError = 1.0 / 1024.0;  // 2^-10
constexpr double kGemmOrderSlack = 2e-5;               // 1e-5 max|x| through a slope <= 1.13, rounded up

// Whether the GEMM library takes the epilogue (with GELU's stored input when
// gelu) of the product (N, C) x (C, OC), where a test can know it: the emulated
// library takes every epilogue of a non-empty product, and an empty product
// (C = 0) is always ours. Otherwise cuBLASLt decides at run time, and its offer
// depends on its version and the GPU: CUDA 13 on an H200 fuses GELU at a GELU-
// input leading dimension of 29, which its documentation led us to expect it
// would not (seen on the first GPU run). Then nullopt.
std::optional<bool> library_has_epilogue(int C, int OC, bool gelu) {
#if defined(KNNGPT_CUDA_EMU)
    (void)OC;
    (void)gelu;
    return C > 0;
#else
    (void)OC;
    (void)gelu;
    if (C == 0) return false;
    return std::nullopt;
#endif
}

// Every element of the library's GELU output within the bound above of the
// CPU's gelu(x), x the CPU's GELU input.
void expect_within_library_gelu_bound(const std::vector<float>& got, const std::vector<float>& want,
                                      const std::vector<float>& x) {
    ASSERT_EQ(got.size(), want.size());
    double max_x = 0.0;
    for (float v : x) max_x = std::fmax(max_x, std::fabs((double)v));
    size_t violations = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const double bound = 0.5 * kLibraryTanhRelError * std::fabs((double)x[i]) + kGemmOrderSlack * max_x;
        if (std::fabs((double)got[i] - (double)want[i]) > bound && violations++ == 0) first = i;
    }
    EXPECT_EQ(violations, 0u) << "library GELU output: first at " << first << ": got " << got[first] << ", want "
                              << want[first] << " (x = " << x[first] << ")";
}


CUDA_TEST(CudaMatmul, EpilogueFusionsMatchCpu) {
    PrecisionScope fp32(MatmulPrecision::FP32);
    using knngpt::cuda::matmul_fusion;
    using knngpt::cuda::MatmulFusion;
    const MatmulFusion saved = matmul_fusion();
    for (const Shape s : {Shape{13, 45, 29}, Shape{9, 40, 32}})
    for (MatmulFusion fusion : {MatmulFusion::None, MatmulFusion::Bias, MatmulFusion::BiasGelu}) {
        const int N = s.N, C = s.C, OC = s.OC;
        const std::vector<float> inp = uniform((size_t)N * C, 30), weight = uniform((size_t)OC * C, 31),
                                 bias = uniform(OC, 32);
        DeviceArray<float> d_inp(inp), d_weight(weight), d_bias(bias);
        matmul_fusion() = fusion;
        // the GELU is the GPU library's (not gelu.cuh's) where it may take the GELU
        // epilogue; its bound also holds for our own GELU (1e-5), so it is used
        // wherever the library decides
#if defined(KNNGPT_CUDA_EMU)
        const bool library_gelu = false;
#else
        const bool library_gelu = library_has_epilogue(C, OC, true).value_or(true);
#endif
        for (bool with_bias : {true, false}) {
            SCOPED_TRACE("OC " + std::to_string(OC) + ", fusion " + std::to_string((int)fusion) +
                         (with_bias ? ", bias" : ", no bias"));
            const float* b = with_bias ? bias.data() : nullptr;
            const float* d_b = with_bias ? d_bias.ptr : nullptr;
            std::vector<float> want((size_t)N * OC), want_gelu((size_t)N * OC);
            knngpt::cpu::matmul_forward(want.data(), inp.data(), weight.data(), b, N, C, OC);
            DeviceArray<float> d_out(std::vector<float>(want.size(), 7.0f));
            knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, d_b, N, C, OC);
            expect_close(d_out.to_host(), want, kTolerance, "matmul_forward");

            knngpt::cpu::matmul_forward_gelu(want_gelu.data(), want.data(), inp.data(), weight.data(), b, N, C, OC);
            DeviceArray<float> d_pre(std::vector<float>(want.size(), 7.0f)), d_gelu(std::vector<float>(want.size(), 7.0f));
            knngpt::cuda::matmul_forward_gelu(d_gelu.ptr, d_pre.ptr, d_inp.ptr, d_weight.ptr, d_b, N, C, OC);
            expect_close(d_pre.to_host(), want, kTolerance, "matmul_forward_gelu: GELU input");
            if (fusion == MatmulFusion::BiasGelu && library_gelu) {
                expect_within_library_gelu_bound(d_gelu.to_host(), want_gelu, want);
            } else {
                expect_close(d_gelu.to_host(), want_gelu, kTolerance, "matmul_forward_gelu: GELU output");
            }
        }
    }
    matmul_fusion() = saved;
}

// ---- which kernels ran ----------------------------------------------------------
//
// matmul_forward / matmul_forward_gelu hand the bias add and GELU to the GEMM's
// epilogue as far as matmul_fusion() allows, else, or where the library has no
// algorithm for the epilogue, run our matmul_bias_add_kernel and
// gelu_forward_kernel after a plain GEMM. The library never gets an epilogue
// for an empty product (C = 0: gemm_col_major leaves it to our kernels, in both
// builds); otherwise the emulated library always has an algorithm, and
// cuBLASLt none for GELU's stored input when its leading dimension OC is not a
// multiple of 8. These tests record the kernels of each call on both sides of
// those boundaries, for every fusion setting, with and without bias, and
// check the values of the C = 0 fallback (the others are checked above).

// For every fusion setting, with and without bias, matmul_forward and
// matmul_forward_gelu on shape s: the kernels each call launched are the ones
// its path needs, and for C = 0 the values are bias (or 0) and its GELU.
void expect_epilogue_paths(const Shape& s) {
    using knngpt::cuda::matmul_fusion;
    using knngpt::cuda::MatmulFusion;
    using knngpt_test::Launches;
    using knngpt_test::launches_of;
    PrecisionScope fp32(MatmulPrecision::FP32);
    const MatmulFusion saved = matmul_fusion();
    const int N = s.N, C = s.C, OC = s.OC;
    const std::vector<float> inp = uniform((size_t)N * C + 1, 40), weight = uniform((size_t)OC * C + 1, 41),
                             bias = uniform(OC, 42);
    DeviceArray<float> d_inp(inp), d_weight(weight), d_bias(bias);
    for (MatmulFusion fusion : {MatmulFusion::None, MatmulFusion::Bias, MatmulFusion::BiasGelu})
    for (bool with_bias : {true, false})
    for (bool gelu : {false, true}) {
        SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " OC=" << OC << ", fusion " << (int)fusion
                                        << (with_bias ? ", bias" : ", no bias")
                                        << (gelu ? ", matmul_forward_gelu" : ", matmul_forward"));
        DeviceArray<float> d_out(std::vector<float>((size_t)N * OC, 7.0f)),
            d_gelu(std::vector<float>((size_t)N * OC, 7.0f));
        const float* d_b = with_bias ? d_bias.ptr : nullptr;
        matmul_fusion() = fusion;
        const Launches launched = launches_of([&] {
            if (gelu) {
                knngpt::cuda::matmul_forward_gelu(d_gelu.ptr, d_out.ptr, d_inp.ptr, d_weight.ptr, d_b, N, C, OC);
            } else {
                knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, d_b, N, C, OC);
            }
        });
        // what goes to the epilogue, and whether the library takes it
        const bool epilogue_bias = with_bias && fusion != MatmulFusion::None;
        const bool epilogue_gelu = gelu && fusion == MatmulFusion::BiasGelu;
        const int bias_kernels = launched.count("matmul_bias_add_kernel");
        const int gelu_kernels = launched.count("gelu_forward_kernel");
        // where the library decides, whether it took the epilogue shows in the kernel it
        // spared (our bias kernel, else our GELU kernel); the checks below then hold
        // the other kernel to the same path
        const bool requested = epilogue_bias || epilogue_gelu;
        const bool fused =
            requested && library_has_epilogue(C, OC, epilogue_gelu)
                             .value_or(epilogue_bias ? bias_kernels == 0 : gelu_kernels == 0);
        EXPECT_EQ(bias_kernels, with_bias && !fused ? 1 : 0) << launched.list();
        EXPECT_EQ(gelu_kernels, gelu && !(fused && epilogue_gelu) ? 1 : 0) << launched.list();
        EXPECT_EQ(launched.size(), (size_t)(bias_kernels + gelu_kernels)) << launched.list();
        if (C == 0) {
            std::vector<float> want((size_t)N * OC), want_gelu((size_t)N * OC);
            knngpt::cpu::matmul_forward_loops(want.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                                              N, C, OC);
            knngpt::cpu::gelu_forward(want_gelu.data(), want.data(), want.size());
            expect_close(d_out.to_host(), want, kTolerance, gelu ? "GELU input" : "out");
            if (gelu) expect_close(d_gelu.to_host(), want_gelu, kTolerance, "GELU output");
        }
    }
    matmul_fusion() = saved;
}

// OC = 32: the library has every epilogue, so matmul_fusion() alone decides.
CUDA_TEST(CudaMatmulPath, FusionSettingChoosesEpilogueOrOurKernels) { expect_epilogue_paths(Shape{9, 40, 32}); }

// OC = 29, a GELU-input leading dimension not a multiple of 8: the emulated library
// takes the epilogue; cuBLASLt may or may not (CUDA 13 on an H200 does), and the
// launches must be one consistent path either way.
CUDA_TEST(CudaMatmulPath, GeluInputLeadingDimensionNotAMultipleOf8) { expect_epilogue_paths(Shape{13, 45, 29}); }

// C = 0: never an epilogue, our kernels for whatever the fusion setting.
CUDA_TEST(CudaMatmulPath, EmptyProductFallsBackToOurKernels) {
    expect_epilogue_paths(Shape{7, 0, 29});
    expect_epilogue_paths(Shape{7, 0, 32});
}

// ---- dbias: the two-pass reduction ---------------------------------------------
//
// dbias += the column sums of dout, in partial sums over chunks of 256 rows
// and a fixed-order sum of the chunks. Against a double-precision column sum
// written here (relative 1e-5 of the largest |sum| plus the fp32 rounding of
// summing N terms, N · 2^-24 · sum |dout|), and bit for bit the same on a
// second run. Shapes: N = 1 (one chunk of one row), 256 (exactly one chunk),
// 257 (a second chunk of one row), 600 (three, the last partial), 2000; OC =
// 70 and 33 leave a partial 32-column tile. Each call launches the partial
// and the final kernel once, nothing else beside the GEMMs' bias-free path.
CUDA_TEST(CudaMatmulDbias, TwoPassReductionMatchesColumnSumsAndRepeatsBitForBit) {
    using knngpt_test::launches_of;
    PrecisionScope fp32(MatmulPrecision::FP32);
    const Shape shapes[] = {{1, 8, 70}, {256, 8, 33}, {257, 8, 70}, {600, 8, 33}, {2000, 8, 70}};
    for (const Shape& s : shapes) {
        SCOPED_TRACE(testing::Message() << "N=" << s.N << " OC=" << s.OC);
        const int N = s.N, C = s.C, OC = s.OC;
        const std::vector<float> inp = uniform((size_t)N * C, 60), weight = uniform((size_t)OC * C, 61),
                                 dout = uniform((size_t)N * OC, 62), dbias0 = uniform(OC, 63);
        DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout);
        auto run = [&] {
            DeviceArray<float> d_dinp(std::vector<float>((size_t)N * C)), d_dweight(std::vector<float>((size_t)OC * C)),
                d_dbias(dbias0);
            const knngpt_test::Launches launched = launches_of([&] {
                knngpt::cuda::matmul_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_dout.ptr, d_inp.ptr,
                                              d_weight.ptr, N, C, OC);
            });
            EXPECT_EQ(launched.count("matmul_dbias_partial_kernel"), 1) << launched.list();
            EXPECT_EQ(launched.count("add_chunk_sums_kernel"), 1) << launched.list();
            return d_dbias.to_host();
        };
        const std::vector<float> first = run(), second = run();
        EXPECT_EQ(first, second) << "the same bits on a second run";
        double largest = 0.0;
        std::vector<double> want(OC), abs_sum(OC);
        for (int o = 0; o < OC; o++) {
            want[o] = dbias0[o];
            abs_sum[o] = std::fabs(dbias0[o]);
            for (int n = 0; n < N; n++) {
                want[o] += dout[(size_t)n * OC + o];
                abs_sum[o] += std::fabs(dout[(size_t)n * OC + o]);
            }
            largest = std::max(largest, std::fabs(want[o]));
        }
        for (int o = 0; o < OC; o++) {
            const double bound = kTolerance * largest + (N + 1) * std::ldexp(1.0, -24) * abs_sum[o];
            EXPECT_LE(std::fabs(first[o] - want[o]), bound) << "o=" << o;
        }
        // and the CPU twin's sum, to the same tolerance as the other tests
        std::vector<float> dinp((size_t)N * C), dweight((size_t)OC * C), dbias = dbias0;
        knngpt::cpu::matmul_backward_loops(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                                           weight.data(), N, C, OC);
        expect_close(first, dbias, kTolerance, "dbias vs CPU loops");
    }
}

// ---- GEMM plans -------------------------------------------------------------------
//
// Each GEMM's plan (descriptors and algorithm; under the emulator the
// emulated library's descriptors, which it runs) is built once per key and
// reused. The plan is what runs, so a plan found under another GEMM's key
// would give a wrong result: interleaving shapes that share some of m, n, k
// and checking each against the CPU twin shows that keys do not collide, and
// the counters show that every repeat is a hit.

using knngpt::cuda::matmul_plan_stats;

// Every field of the key makes a key of its own: changing any one of them
// gives a key unequal to the original.
CUDA_TEST(CudaMatmulPlans, EveryKeyFieldDistinguishesKeys) {
    using knngpt::cuda::detail::GemmEpilogueKind;
    using knngpt::cuda::detail::GemmKey;
    using knngpt::cuda::detail::GemmKeyHash;
    GemmKey base;
    base.m = 7, base.n = 9, base.k = 11, base.lda = 11, base.ldb = 11, base.ldc = 7;
    base.align_a = base.align_b = base.align_c = 256;
    base.workspace_bytes = 1 << 20;
    std::vector<GemmKey> changed(17, base);
    changed[0].precision = MatmulPrecision::BF16;
    changed[1].trans_a = true;
    changed[2].trans_b = true;
    changed[3].m = 8;
    changed[4].n = 10;
    changed[5].k = 12;
    changed[6].lda = 12;
    changed[7].ldb = 12;
    changed[8].ldc = 8;
    changed[9].epilogue = GemmEpilogueKind::Bias;
    changed[10].align_a = 4;
    changed[11].align_b = 4;
    changed[12].align_c = 4;
    changed[13].align_bias = 4;
    changed[14].align_gelu_input = 4;
    changed[15].workspace_bytes = 1 << 21;
    changed[16].device = 1;
    EXPECT_TRUE(base == base);
    for (size_t i = 0; i < changed.size(); i++) {
        EXPECT_FALSE(changed[i] == base) << "field " << i;
        EXPECT_NE(GemmKeyHash{}(changed[i]), GemmKeyHash{}(base)) << "field " << i;
    }
}

// The same forward and backward twice: the second run builds no plan, hits
// the cache once per GEMM, and gives the same bits.
CUDA_TEST(CudaMatmulPlans, SameGemmTwiceReusesItsPlanBitForBit) {
    using knngpt::cuda::matmul_fusion;
    using knngpt::cuda::MatmulFusion;
    for (MatmulPrecision precision : {MatmulPrecision::FP32, MatmulPrecision::BF16}) {
        SCOPED_TRACE(precision == MatmulPrecision::BF16 ? "bf16" : "fp32");
        PrecisionScope scope(precision);
        const MatmulFusion saved = matmul_fusion();
        matmul_fusion() = MatmulFusion::BiasGelu;
        const int N = 13, C = 40, OC = 32;
        DeviceArray<float> d_inp(uniform((size_t)N * C, 70)), d_weight(uniform((size_t)OC * C, 71)),
            d_bias(uniform(OC, 72)), d_dout(uniform((size_t)N * OC, 73));
        auto step = [&] {
            DeviceArray<float> out(std::vector<float>((size_t)N * OC)), gelu(std::vector<float>((size_t)N * OC)),
                dinp(std::vector<float>((size_t)N * C)), dweight(std::vector<float>((size_t)OC * C, 0.5f)),
                dbias(std::vector<float>(OC, 0.5f));
            knngpt::cuda::matmul_forward_gelu(gelu.ptr, out.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, OC);
            knngpt::cuda::matmul_forward(out.ptr, d_inp.ptr, d_weight.ptr, d_bias.ptr, N, C, OC);
            knngpt::cuda::matmul_backward(dinp.ptr, dweight.ptr, dbias.ptr, d_dout.ptr, d_inp.ptr, d_weight.ptr, N, C,
                                          OC);
            return std::vector<std::vector<float>>{out.to_host(), gelu.to_host(), dinp.to_host(), dweight.to_host(),
                                                   dbias.to_host()};
        };
        knngpt::cuda::matmul_release();
        const auto first = step();
        const auto after_first = matmul_plan_stats();
        // forward_gelu, forward (another epilogue: bias only), dinp, dweight
        EXPECT_EQ(after_first.misses, 4u);
        EXPECT_EQ(after_first.hits, 0u);
        EXPECT_EQ(after_first.size, 4u);
        const auto second = step();
        const auto after_second = matmul_plan_stats();
        EXPECT_EQ(after_second.misses, 4u) << "no plan built again";
        EXPECT_EQ(after_second.hits, 4u);
        EXPECT_EQ(first, second) << "the same bits from the cached plans";
        knngpt::cuda::matmul_release();
        EXPECT_EQ(matmul_plan_stats().size, 0u);
        EXPECT_EQ(step(), first) << "after matmul_release the plans are built again, the same";
        EXPECT_EQ(matmul_plan_stats().misses, 4u);
        matmul_fusion() = saved;
    }
}

// Shapes that share dimensions, and a weight at a 4-byte-aligned offset,
// interleaved over two rounds: each GEMM matches the CPU twin in both rounds
// (no plan of another shape ran), the first round builds one plan per
// distinct key and the second builds none.
CUDA_TEST(CudaMatmulPlans, DifferentShapesAndAlignmentsDoNotCollide) {
    PrecisionScope fp32(MatmulPrecision::FP32);
    // {20, 40, 32} differs from {9, 40, 32} in N alone, which only k of the
    // dweight GEMM carries (m = C, n = OC, k = N, lda = C, ldb = OC)
    const Shape shapes[] = {{9, 40, 32}, {20, 40, 32}, {9, 32, 40}, {40, 9, 32}, {32, 40, 9}, {9, 40, 33}};
    knngpt::cuda::matmul_release();
    for (int round = 0; round < 2; round++) {
        for (const Shape& s : shapes)
        for (size_t offset : {0, 1}) {
            SCOPED_TRACE(testing::Message() << "round " << round << ", N=" << s.N << " C=" << s.C << " OC=" << s.OC
                                            << ", weight offset " << offset);
            const int N = s.N, C = s.C, OC = s.OC;
            const std::vector<float> inp = uniform((size_t)N * C, 80), weight = uniform((size_t)OC * C + 1, 81),
                                     dout = uniform((size_t)N * OC, 82);
            DeviceArray<float> d_inp(inp), d_weight(weight), d_dout(dout);
            const float* w = d_weight.ptr + offset;
            const std::vector<float> w_host(weight.begin() + offset, weight.begin() + offset + (size_t)OC * C);
            std::vector<float> want((size_t)N * OC), dinp((size_t)N * C), dweight((size_t)OC * C, 0.0f);
            knngpt::cpu::matmul_forward_loops(want.data(), inp.data(), w_host.data(), nullptr, N, C, OC);
            knngpt::cpu::matmul_backward_loops(dinp.data(), dweight.data(), nullptr, dout.data(), inp.data(),
                                               w_host.data(), N, C, OC);
            DeviceArray<float> d_out(std::vector<float>((size_t)N * OC)), d_dinp(std::vector<float>((size_t)N * C)),
                d_dweight(std::vector<float>((size_t)OC * C, 0.0f));
            knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, w, nullptr, N, C, OC);
            knngpt::cuda::matmul_backward(d_dinp.ptr, d_dweight.ptr, nullptr, d_dout.ptr, d_inp.ptr, w, N, C, OC);
            expect_close(d_out.to_host(), want, kTolerance, "out");
            expect_close(d_dinp.to_host(), dinp, kTolerance, "dinp");
            expect_close(d_dweight.to_host(), dweight, kTolerance, "dweight");
        }
        // three GEMMs per (shape, offset); the weight's alignment is in the
        // forward and dinp keys (operand A), not in dweight's
        const size_t distinct = std::size(shapes) * (2 + 2 + 1);
        EXPECT_EQ(matmul_plan_stats().misses, distinct) << "round " << round;
        EXPECT_EQ(matmul_plan_stats().hits, round == 0 ? std::size(shapes) : std::size(shapes) + 3 * 2 * std::size(shapes));
    }
}

// More distinct GEMMs than the cache holds: it is emptied once it is full,
// never holds more than kMatmulPlanCapacity plans, and every result is right.
CUDA_TEST(CudaMatmulPlans, CacheIsBoundedAndEmptiedWhenFull) {
    PrecisionScope fp32(MatmulPrecision::FP32);
    knngpt::cuda::matmul_release();
    const int C = 5, OC = 3;
    const int shapes = (int)knngpt::cuda::kMatmulPlanCapacity + 6;
    const std::vector<float> weight = uniform((size_t)OC * C, 90);
    DeviceArray<float> d_weight(weight);
    for (int N = 1; N <= shapes; N++) {
        const std::vector<float> inp = uniform((size_t)N * C, 91);
        DeviceArray<float> d_inp(inp), d_out(std::vector<float>((size_t)N * OC));
        knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, nullptr, N, C, OC);
        std::vector<float> want((size_t)N * OC);
        knngpt::cpu::matmul_forward_loops(want.data(), inp.data(), weight.data(), nullptr, N, C, OC);
        expect_close(d_out.to_host(), want, kTolerance, "out");
        EXPECT_LE(matmul_plan_stats().size, knngpt::cuda::kMatmulPlanCapacity);
    }
    EXPECT_EQ(matmul_plan_stats().misses, (size_t)shapes);
    EXPECT_EQ(matmul_plan_stats().evictions, 1u);
    EXPECT_EQ(matmul_plan_stats().size, (size_t)shapes - knngpt::cuda::kMatmulPlanCapacity);
}

// The bf16 build's logits: matmul_forward into a bf16 output is the fp32-output GEMM's
// result rounded to bf16, bit for bit (the emulated library rounds its fp32 accumulators as
// cuBLASLt stores a bf16 D); and matmul_backward from a bf16 dout equals the float version
// given the same values widened (in BF16 precision the float version rounds dout to exactly
// those values; in FP32 precision the bf16 one widens them). Both precisions, shapes not
// multiples of anything, dbias included.
CUDA_TEST(CudaMatmul, Bf16OutputAndBf16DoutMatchTheFloatPathsBitForBit) {
    for (MatmulPrecision precision : {MatmulPrecision::BF16, MatmulPrecision::FP32}) {
        SCOPED_TRACE(precision == MatmulPrecision::BF16 ? "bf16 precision" : "fp32 precision");
        PrecisionScope scope(precision);
        const std::vector<float> inp = uniform((size_t)kN * kC, 60), weight = uniform((size_t)kOC * kC, 61);
        DeviceArray<float> d_inp(inp), d_weight(weight), d_out((size_t)kN * kOC);
        DeviceArray<__nv_bfloat16> d_out16((size_t)kN * kOC);
        knngpt::cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, nullptr, kN, kC, kOC);
        knngpt::cuda::matmul_forward(d_out16.ptr, d_inp.ptr, d_weight.ptr, nullptr, kN, kC, kOC);
        const std::vector<float> out = d_out.to_host();
        const std::vector<__nv_bfloat16> out16 = d_out16.to_host();
        int differ = 0;
        for (size_t i = 0; i < out.size(); i++)
            differ += __bfloat162float(out16[i]) != __bfloat162float(__float2bfloat16(out[i]));
        EXPECT_EQ(differ, 0) << "bf16 outputs that are not the fp32 output rounded";

        // dout: bf16 values (every one exactly a float too)
        std::vector<__nv_bfloat16> dout16((size_t)kN * kOC);
        std::vector<float> dout_widened(dout16.size());
        const std::vector<float> dout_source = uniform(dout16.size(), 62);
        for (size_t i = 0; i < dout16.size(); i++) {
            dout16[i] = __float2bfloat16(dout_source[i]);
            dout_widened[i] = __bfloat162float(dout16[i]);
        }
        const std::vector<float> dweight0 = uniform((size_t)kOC * kC, 63), dbias0 = uniform(kOC, 64);
        DeviceArray<__nv_bfloat16> d_dout16(dout16);
        DeviceArray<float> d_dout(dout_widened), d_dinp_a((size_t)kN * kC), d_dinp_b((size_t)kN * kC);
        DeviceArray<float> d_dweight_a(dweight0), d_dweight_b(dweight0), d_dbias_a(dbias0), d_dbias_b(dbias0);
        knngpt::cuda::matmul_backward(d_dinp_a.ptr, d_dweight_a.ptr, d_dbias_a.ptr, d_dout.ptr, d_inp.ptr,
                                      d_weight.ptr, kN, kC, kOC);
        knngpt::cuda::matmul_backward(d_dinp_b.ptr, d_dweight_b.ptr, d_dbias_b.ptr, d_dout16.ptr, d_inp.ptr,
                                      d_weight.ptr, kN, kC, kOC);
        EXPECT_EQ(d_dinp_b.to_host(), d_dinp_a.to_host());
        EXPECT_EQ(d_dweight_b.to_host(), d_dweight_a.to_host());
        EXPECT_EQ(d_dbias_b.to_host(), d_dbias_a.to_host());
        EXPECT_NE(d_dweight_b.to_host(), dweight0) << "the backward did nothing";
    }
}

// Empty sums, for both dout types: OC = 0 gives dinp = 0 (written, though nothing is
// summed) and no GEMM; N = 0 writes nothing (dinp is empty) and leaves dweight, dbias.
CUDA_TEST(CudaMatmul, BackwardOfAnEmptySumZeroesDinpAndLeavesTheRest) {
    const int N = 5, C = 3, OC = 4;
    const std::vector<float> placeholder = {9.0f}, dweight0 = uniform((size_t)OC * C, 65), dbias0 = uniform(OC, 66);
    DeviceArray<float> d_inp(uniform((size_t)N * C, 67)), d_weight(dweight0), d_dout(placeholder);
    DeviceArray<__nv_bfloat16> d_dout16(std::vector<__nv_bfloat16>(1, __float2bfloat16(9.0f)));
    for (bool bf16_dout : {false, true}) {
        SCOPED_TRACE(bf16_dout ? "bf16 dout" : "float dout");
        auto backward = [&](float* dinp, float* dweight, float* dbias, int n, int oc) {
            if (bf16_dout)
                knngpt::cuda::matmul_backward(dinp, dweight, dbias, d_dout16.ptr, d_inp.ptr, d_weight.ptr, n, C, oc);
            else
                knngpt::cuda::matmul_backward(dinp, dweight, dbias, d_dout.ptr, d_inp.ptr, d_weight.ptr, n, C, oc);
        };
        // OC = 0: dinp (N, C) = 0; dweight and dbias have no entries (placeholders stay)
        DeviceArray<float> d_dinp(std::vector<float>((size_t)N * C, 7.0f)), d_dweight(placeholder), d_dbias(placeholder);
        backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, N, 0);
        EXPECT_EQ(d_dinp.to_host(), std::vector<float>((size_t)N * C, 0.0f));
        EXPECT_EQ(d_dweight.to_host(), placeholder);
        EXPECT_EQ(d_dbias.to_host(), placeholder);
        // N = 0: dinp has no entries; dweight (OC, C) and dbias (OC) unchanged
        DeviceArray<float> d_dinp0(placeholder), d_dweight0(dweight0), d_dbias0(dbias0);
        backward(d_dinp0.ptr, d_dweight0.ptr, d_dbias0.ptr, 0, OC);
        EXPECT_EQ(d_dinp0.to_host(), placeholder);
        EXPECT_EQ(d_dweight0.to_host(), dweight0);
        EXPECT_EQ(d_dbias0.to_host(), dbias0);
    }
}

}  // namespace
