// kernels/cuda/matmul.cuh — fully connected layer, fp32 or bf16 GEMMs. Twin of
// kernels/cpu/matmul.h.
//
//   forward:  out = inp @ weight^T + bias            out[n,o] = sum_c inp[n,c] weight[o,c] + bias[o]
//   forward_gelu: pre_gelu = inp @ weight^T + bias,  out_gelu = gelu(pre_gelu)   (gelu.cuh's tanh form)
//   backward: dinp    += dout @ weight               (N, C)
//             dweight += dout^T @ inp                (OC, C)
//             dbias   += sum_n dout[n, :]            (OC)
//
// Shapes: inp (N, C), weight (OC, C), bias (OC) or nullptr, out/dout (N, OC).
// Backward accumulates (+=); dbias may be nullptr. Device pointers, all fp32.
//
// Precision. matmul_precision() selects, at run time, how the GEMMs run:
//   FP32  fp32 operands, fp32 accumulation;
//   BF16  each GEMM operand is first rounded to bf16 (round to nearest even,
//         as __float2bfloat16 does): inp and weight in forward, dout and
//         weight for dinp, inp and dout for dweight. The products accumulate
//         in fp32 and the outputs stay fp32 (out, and dinp/dweight += ...);
//         the bias add and dbias (a sum of the fp32 dout) are fp32 in both
//         modes. The signatures are the same in both modes: the rounding
//         happens inside, by convert_to_bf16_kernel into a scratch buffer.
//         A weight that is a registered parameter is read from the bf16
//         copy of the parameters (bf16_parameters.cuh, kept by AdamW), any
//         other operand is converted on every call.
// The default is the build's: BF16, or FP32 in a build with -DKNNGPT_FP32.
// Tests set matmul_precision() at run time to test both modes.
//
// Error of BF16 mode. bf16 keeps 8 significant bits, so each rounded operand
// carries a relative error <= 2^-9, each product a_k b_k of two rounded
// operands <= ~2^-8 (2^-9 + 2^-9 + 2^-18), and a sum over k
//   |bf16 result - fp32 result| <= ~2^-8 sum_k |a_k b_k|  + fp32 accumulation error.
// A product of two bf16 values (8 + 8 significant bits) is exact in fp32, so
// the only rounding after the conversion is that of the fp32 accumulation.
//
// The GEMMs go to a library: cuBLASLt under nvcc (one static handle and
// workspace created on first use; FP32: A, B, C fp32; BF16: A, B CUDA_R_16BF,
// C/D CUDA_R_32F; both with CUBLAS_COMPUTE_32F and fp32 alpha/beta),
// cblas_sgemm under KNNGPT_CUDA_EMU (the emulator's device memory is host
// memory; in BF16 mode the bf16 operands are widened back to float on the
// host, which is exact, and sgemm runs on those). The bf16 conversion, the
// bias add and the dbias column sums are our own small kernels in both
// builds.
//
// Scratch. The bf16 operands live in two buffers owned by this file (one per
// GEMM operand slot), cudaMalloc'd on first use and grown (freed and
// allocated again) when a larger operand comes; they are never freed, like
// the cuBLASLt workspace, and live for the process. Under the emulator the
// widened float copies are two static host vectors, freed at exit. The
// scratch is shared: call the matmuls from one host thread, on the default
// stream (as everything here does).
//
// Epilogues. cuBLASLt can add the bias (CUBLASLT_EPILOGUE_BIAS) and apply
// GELU while storing its input (CUBLASLT_EPILOGUE_GELU_AUX_BIAS) as it writes
// the product, saving our separate passes over the (N, OC) output.
// matmul_fusion() chooses how much is handed to it: by default bias and GELU
// on sm_90+ GPUs, the bias alone on older ones and in the fp32 build. Where the library offers no
// algorithm for an epilogue (the GELU input's leading dimension must be a
// multiple of 8), the GEMM runs plain and our bias and GELU kernels follow.
// Under the emulator the library's epilogue is emulated on the host (fp32,
// gelu_tanh of gelu.cuh), so both paths are tested against the CPU twin.
//
// Layout trick. Both libraries are called column-major. A row-major (R, K)
// array with leading dimension K is, read column-major, its transpose: a
// (K, R) matrix with ld = K. So each row-major product Y = P @ Q is computed as
// the column-major product Y^T = Q^T @ P^T, with the operands swapped and no
// data moved:
//   out^T  (OC, N) = weight   (OC, C) . inp^T  (C, N)   A = weight stored (C, OC): op T;  B = inp stored (C, N): op N
//   dinp^T (C, N) += weight^T (C, OC) . dout^T (OC, N)  A = weight stored (C, OC): op N;  B = dout stored (OC, N): op N
//   dweight^T (C, OC) += inp^T (C, N) . dout  (N, OC)   A = inp stored (C, N): op N;      B = dout stored (OC, N): op T
//
// dbias: one block per 32 columns, threadIdx.y stripes the rows, a shared
// memory tree finishes the column; no atomics, so the result is deterministic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/bf16_parameters.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"

#if defined(KNNGPT_CUDA_EMU)
#include <cblas.h>

#include <vector>
#else
#include <cublasLt.h>
#endif

namespace knngpt::cuda {

constexpr int kMatmulBiasThreads = 256;
constexpr int kMatmulDbiasStripes = 16;                      // threadIdx.y of the dbias kernel
constexpr size_t kMatmulWorkspaceBytes = 32u * 1024 * 1024;  // cuBLASLt workspace

// ---- precision ----------------------------------------------------------------

enum class MatmulPrecision { FP32, BF16 };

// The precision of every matmul_forward/matmul_backward call from now on (see
// the file header). Starts as the build's default: BF16, FP32 with
// -DKNNGPT_FP32. Tests assign it, e.g. matmul_precision() = MatmulPrecision::FP32.
inline MatmulPrecision& matmul_precision() {
#if defined(KNNGPT_FP32)
    static MatmulPrecision precision = MatmulPrecision::FP32;
#else
    static MatmulPrecision precision = MatmulPrecision::BF16;
#endif
    return precision;
}

// What the GEMM library's epilogue does for us (see "Epilogues" in the header):
//   None      nothing: the bias add and GELU are our own kernels
//   Bias      the bias add (matmul_forward, and the GEMM of matmul_forward_gelu)
//   BiasGelu  the bias add, and GELU with its input stored (matmul_forward_gelu)
enum class MatmulFusion { None, Bias, BiasGelu };

// Starts as BiasGelu on an sm_90 or newer GPU and under the emulator, Bias on
// older GPUs (where the fused GELU epilogue has not paid in other trainers),
// and Bias in the fp32 build (-DKNNGPT_FP32) everywhere: cuBLASLt's GELU is
// its own tanh evaluation, not gelu.cuh's (test_cuda_matmul bounds the
// difference by 2^-11 |x|), and the fp32 build is the one held to the CPU
// trainer's losses within 1e-5. Tests assign it to cover every path.
inline MatmulFusion& matmul_fusion() {
    static MatmulFusion fusion = [] {
#if defined(KNNGPT_FP32)
        return MatmulFusion::Bias;
#elif defined(KNNGPT_CUDA_EMU)
        return MatmulFusion::BiasGelu;
#else
        int device = 0;
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        return prop.major >= 9 ? MatmulFusion::BiasGelu : MatmulFusion::Bias;
#endif
    }();
    return fusion;
}

// ---- CUDA kernels -------------------------------------------------------------

// out[n, o] += bias[o], one thread per element.
__global__ void matmul_bias_add_kernel(float* out, const float* bias, int N, int OC) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * OC) return;
    out[i] += bias[i % (size_t)OC];
}

// dbias[o] += sum_n dout[n, o]. Block (32, kMatmulDbiasStripes): threadIdx.x
// picks column o of tile blockIdx.x (adjacent threads read adjacent columns),
// threadIdx.y a stripe of all N rows.
__global__ void matmul_dbias_kernel(float* dbias, const float* dout, int N, int OC) {
    __shared__ float partial[kMatmulDbiasStripes][32];
    const int o = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (o < OC) {
        for (int n = threadIdx.y; n < N; n += kMatmulDbiasStripes) sum += dout[(size_t)n * OC + o];
    }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    for (int stride = kMatmulDbiasStripes / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.y < stride) partial[threadIdx.y][threadIdx.x] += partial[threadIdx.y + stride][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && o < OC) dbias[o] += partial[0][threadIdx.x];
}

// ---- column-major GEMM --------------------------------------------------------

namespace detail {

#if !defined(KNNGPT_CUDA_EMU)
inline void check_cublas(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    std::fprintf(stderr, "%s:%d: cuBLAS error: %d\n", file, line, (int)status);
    std::exit(1);
}
#define KNNGPT_CUBLAS_CHECK(call) ::knngpt::cuda::detail::check_cublas((call), __FILE__, __LINE__)

struct CublasLtContext {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    CublasLtContext() {
        KNNGPT_CUBLAS_CHECK(cublasLtCreate(&handle));
        CUDA_CHECK(cudaMalloc(&workspace, kMatmulWorkspaceBytes));
    }
};

// The largest power of two (up to 256) dividing the address: the alignment the
// library may assume for an operand.
inline uint32_t pointer_alignment(const void* p) {
    uint32_t alignment = 256;
    while (alignment > 1 && (uintptr_t)p % alignment != 0) alignment /= 2;
    return alignment;
}

inline CublasLtContext& cublaslt_context() {
    static CublasLtContext context;  // created on first use, lives for the process
    return context;
}
#endif

// A bf16 scratch buffer of this file, one per GEMM operand slot (0 or 1),
// grown on demand and never freed (see the file header).
inline __nv_bfloat16* bf16_scratch(int slot, size_t count) {
    static DeviceScratch scratch[2];
    return static_cast<__nv_bfloat16*>(scratch[slot].get(count * sizeof(__nv_bfloat16)));
}

// The count floats at x rounded to bf16, in scratch slot `slot`.
inline const __nv_bfloat16* to_bf16(int slot, const float* x, size_t count) {
    __nv_bfloat16* out = bf16_scratch(slot, count);
    convert_to_bf16(out, x, count);
    return out;
}

// A weight rounded to bf16: the parameters' bf16 copy when the weight is a
// registered parameter (bf16_parameters.cuh), else converted into slot `slot`.
inline const __nv_bfloat16* weight_to_bf16(int slot, const float* weight, size_t count) {
    const __nv_bfloat16* copy = bf16_copy_of(weight, count);
    return copy ? copy : to_bf16(slot, weight, count);
}

#if defined(KNNGPT_CUDA_EMU)
// The bf16 array x (count values) widened to float, exactly, in a host vector
// of this file (one per slot): the emulated library's view of a bf16 operand.
inline const float* widen_bf16(int slot, const void* x, size_t count) {
    static std::vector<float> widened[2];
    const __nv_bfloat16* h = static_cast<const __nv_bfloat16*>(x);
    widened[slot].resize(count);
    for (size_t i = 0; i < count; i++) widened[slot][i] = __bfloat162float(h[i]);
    return widened[slot].data();
}
#endif

// What the library applies to the product before storing it in C (beta = 0 only):
//   x = (A B)[i, j] + bias[i]              bias: (m) or nullptr
//   gelu_input[i + j ldc] = x, C = gelu(x)  when gelu_input is set (same layout as C)
struct GemmEpilogue {
    const float* bias = nullptr;
    float* gelu_input = nullptr;
    bool empty() const { return bias == nullptr && gelu_input == nullptr; }
};

// C (m, n) = op(A) (m, k) . op(B) (k, n) + beta C, all column-major, alpha = 1,
// then the epilogue. A and B are float arrays (FP32) or __nv_bfloat16 arrays
// (BF16); C is float and the accumulation fp32 in both. Returns false, having
// done nothing, when the library has no algorithm for the epilogue (the caller
// then runs the GEMM without it and our own kernels).
inline bool gemm_col_major(MatmulPrecision precision, bool trans_a, bool trans_b, int m, int n, int k, const void* A,
                           int lda, const void* B, int ldb, float beta, float* C, int ldc,
                           const GemmEpilogue& epilogue = GemmEpilogue{}) {
    if (m == 0 || n == 0) return true;
    if (k == 0 && epilogue.empty()) {  // empty sum: C = beta C
        if (beta == 0.0f) {
            for (int j = 0; j < n; j++) CUDA_CHECK(cudaMemset(C + (size_t)j * ldc, 0, (size_t)m * sizeof(float)));
        }
        return true;
    }
    if (k == 0) return false;  // an empty product with an epilogue: our kernels do it
    if (!epilogue.empty() && beta != 0.0f) {
        std::fprintf(stderr, "%s:%d: matmul: an epilogue needs beta = 0\n", __FILE__, __LINE__);
        std::exit(1);
    }
    const float alpha = 1.0f;
#if defined(KNNGPT_CUDA_EMU)
    const float* a = static_cast<const float*>(A);
    const float* b = static_cast<const float*>(B);
    if (precision == MatmulPrecision::BF16) {
        // stored arrays: ld rows by (trans ? m : k) resp. (trans ? k : n) columns
        a = widen_bf16(0, A, (size_t)lda * (trans_a ? m : k));
        b = widen_bf16(1, B, (size_t)ldb * (trans_b ? k : n));
    }
    cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, a, lda, b, ldb, beta, C, ldc);
    // the emulated library's epilogue, elementwise in fp32 as cuBLASLt's
    for (int j = 0; j < n && !epilogue.empty(); j++) {
        for (int i = 0; i < m; i++) {
            const size_t at = (size_t)j * ldc + i;
            float x = C[at] + (epilogue.bias ? epilogue.bias[i] : 0.0f);
            if (epilogue.gelu_input) {
                epilogue.gelu_input[at] = x;
                x = gelu_tanh(x);
            }
            C[at] = x;
        }
    }
    return true;
#else
    CublasLtContext& context = cublaslt_context();
    const cudaDataType_t ab_type = precision == MatmulPrecision::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (!epilogue.empty()) {
        // bias and GELU input in fp32, the type of D (the library's default)
        cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
        if (epilogue.gelu_input) kind = epilogue.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)));
        if (epilogue.bias) {
            KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias,
                                                               sizeof(epilogue.bias)));
        }
        if (epilogue.gelu_input) {
            const int64_t aux_ld = ldc;  // the library needs a multiple of 8, else it offers no algorithm
            KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                               &epilogue.gelu_input, sizeof(epilogue.gelu_input)));
            KNNGPT_CUBLAS_CHECK(
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        }
    }
    // layouts describe the stored arrays, before op()
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a, ab_type, trans_a ? k : m, trans_a ? m : k, lda));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b, ab_type, trans_b ? n : k, trans_b ? k : n, ldb));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t preference = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace_bytes = kMatmulWorkspaceBytes;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof(workspace_bytes)));
    // the library assumes 256-byte aligned operands unless told otherwise; ours
    // are offsets into larger buffers, so tell it what they really are
    const uint32_t align_a = pointer_alignment(A), align_b = pointer_alignment(B), align_c = pointer_alignment(C);
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                             &align_a, sizeof(align_a)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                             &align_b, sizeof(align_b)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                             &align_c, sizeof(align_c)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                             &align_c, sizeof(align_c)));
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int returned = 0;
    const cublasStatus_t found = cublasLtMatmulAlgoGetHeuristic(context.handle, desc, layout_a, layout_b, layout_c,
                                                                layout_c, preference, 1, &heuristic, &returned);
    // with an epilogue "not supported" (a status or no result) means: run it without
    if (!epilogue.empty() && (found != CUBLAS_STATUS_SUCCESS || returned == 0)) {
        KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
        KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_c));
        KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_b));
        KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_a));
        KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
        return false;
    }
    KNNGPT_CUBLAS_CHECK(found);
    if (returned == 0) {
        std::fprintf(stderr, "%s:%d: cuBLASLt: no %s algorithm for m=%d n=%d k=%d\n", __FILE__, __LINE__,
                     precision == MatmulPrecision::BF16 ? "bf16" : "fp32", m, n, k);
        std::exit(1);
    }
    KNNGPT_CUBLAS_CHECK(cublasLtMatmul(context.handle, desc, &alpha, A, layout_a, B, layout_b, &beta, C, layout_c, C,
                                       layout_c, &heuristic.algo, context.workspace, kMatmulWorkspaceBytes, nullptr));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_c));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_b));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_a));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    return true;
#endif
}

}  // namespace detail

// ---- host launchers -----------------------------------------------------------

// out = inp @ weight^T (+ bias); with gelu_out also gelu_out = gelu(out)
// (out then holds GELU's input). The bias add and GELU run in the GEMM's
// epilogue as far as matmul_fusion() allows and the library offers an
// algorithm, else as our own kernels: the same values either way (up to the
// library's rounding of GELU).
inline void matmul_forward_epilogue(float* out, float* gelu_out, const float* inp, const float* weight,
                                    const float* bias, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    const MatmulPrecision precision = matmul_precision();
    const void* a = weight;  // the GEMM operands: the fp32 arrays, or their bf16 roundings
    const void* b = inp;
    if (precision == MatmulPrecision::BF16) {
        a = detail::weight_to_bf16(0, weight, (size_t)OC * C);
        b = detail::to_bf16(1, inp, (size_t)N * C);
    }
    // out^T (OC, N) = weight (OC, C) . inp^T (C, N); with GELU fused the GEMM
    // writes gelu_out and stores its input in out
    const MatmulFusion fusion = matmul_fusion();
    detail::GemmEpilogue epilogue;
    if (fusion != MatmulFusion::None) epilogue.bias = bias;
    const bool fuse_gelu = gelu_out != nullptr && fusion == MatmulFusion::BiasGelu;
    if (fuse_gelu) epilogue.gelu_input = out;
    bool fused = !epilogue.empty() &&
                 detail::gemm_col_major(precision, true, false, OC, N, C, a, C, b, C, 0.0f, fuse_gelu ? gelu_out : out,
                                        OC, epilogue);
    if (fused && fuse_gelu) return;
    if (!fused) {
        detail::gemm_col_major(precision, true, false, OC, N, C, a, C, b, C, 0.0f, out, OC);
        if (bias != nullptr) {
            const size_t total = (size_t)N * OC;
            launch(matmul_bias_add_kernel, (unsigned)ceil_div(total, (size_t)kMatmulBiasThreads), kMatmulBiasThreads,
                   0, nullptr, out, bias, N, OC);
        }
    }
    if (gelu_out != nullptr) gelu_forward(gelu_out, out, (size_t)N * OC);
}

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                           int OC) {
    matmul_forward_epilogue(out, nullptr, inp, weight, bias, N, C, OC);
}

// out_gelu = gelu(inp @ weight^T + bias), pre_gelu = GELU's input; the MLP's
// first layer (shapes as matmul_forward, both outputs (N, OC)).
inline void matmul_forward_gelu(float* out_gelu, float* pre_gelu, const float* inp, const float* weight,
                                const float* bias, int N, int C, int OC) {
    matmul_forward_epilogue(pre_gelu, out_gelu, inp, weight, bias, N, C, OC);
}

inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    const MatmulPrecision precision = matmul_precision();
    const bool bf16 = precision == MatmulPrecision::BF16;
    // dout is an operand of both GEMMs: rounded once, in slot 0; slot 1 holds
    // weight, then inp (the stream orders the second conversion after the first GEMM)
    const void* dout_operand = bf16 ? (const void*)detail::to_bf16(0, dout, (size_t)N * OC) : dout;
    const void* weight_operand = bf16 ? (const void*)detail::weight_to_bf16(1, weight, (size_t)OC * C) : weight;
    // dinp^T (C, N) += weight^T (C, OC) . dout^T (OC, N)
    detail::gemm_col_major(precision, false, false, C, N, OC, weight_operand, C, dout_operand, OC, 1.0f, dinp, C);
    const void* inp_operand = bf16 ? (const void*)detail::to_bf16(1, inp, (size_t)N * C) : inp;
    // dweight^T (C, OC) += inp^T (C, N) . dout (N, OC)
    detail::gemm_col_major(precision, false, true, C, OC, N, inp_operand, C, dout_operand, OC, 1.0f, dweight, C);
    if (dbias == nullptr) return;
    launch(matmul_dbias_kernel, ceil_div(OC, 32), dim3(32, kMatmulDbiasStripes), 0, nullptr, dbias, dout, N, OC);
}

}  // namespace knngpt::cuda
