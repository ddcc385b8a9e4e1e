// kernels/cuda/matmul.cuh — fully connected layer, fp32. Twin of kernels/cpu/matmul.h.
//
//   forward:  out = inp @ weight^T + bias            out[n,o] = sum_c inp[n,c] weight[o,c] + bias[o]
//   backward: dinp    += dout @ weight               (N, C)
//             dweight += dout^T @ inp                (OC, C)
//             dbias   += sum_n dout[n, :]            (OC)
//
// Shapes: inp (N, C), weight (OC, C), bias (OC) or nullptr, out/dout (N, OC).
// Backward accumulates (+=); dbias may be nullptr. Device pointers.
//
// The GEMMs go to a library: cuBLASLt under nvcc (fp32 compute, fp32 data, one
// static handle and workspace created on first use), cblas_sgemm under
// KNNGPT_CUDA_EMU (the emulator's device memory is host memory). The bias add
// and the dbias column sums are our own small kernels in both builds.
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

#include "kernels/cuda/common.cuh"

#if defined(KNNGPT_CUDA_EMU)
#include <cblas.h>
#else
#include <cublasLt.h>
#endif

namespace knngpt::cuda {

constexpr int kMatmulBiasThreads = 256;
constexpr int kMatmulDbiasStripes = 16;                     // threadIdx.y of the dbias kernel
constexpr size_t kMatmulWorkspaceBytes = 32u * 1024 * 1024;  // cuBLASLt workspace

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

inline CublasLtContext& cublaslt_context() {
    static CublasLtContext context;  // created on first use, lives for the process
    return context;
}
#endif

// C (m, n) = op(A) (m, k) . op(B) (k, n) + beta C, all column-major, alpha = 1.
inline void gemm_col_major(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B,
                           int ldb, float beta, float* C, int ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // empty sum: C = beta C
        if (beta == 0.0f) {
            for (int j = 0; j < n; j++) CUDA_CHECK(cudaMemset(C + (size_t)j * ldc, 0, (size_t)m * sizeof(float)));
        }
        return;
    }
    const float alpha = 1.0f;
#if defined(KNNGPT_CUDA_EMU)
    cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, A, lda, B, ldb, beta, C, ldc);
#else
    CublasLtContext& context = cublaslt_context();
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // layouts describe the stored arrays, before op()
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_32F, trans_a ? k : m, trans_a ? m : k, lda));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_32F, trans_b ? n : k, trans_b ? k : n, ldb));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t preference = nullptr;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace_bytes = kMatmulWorkspaceBytes;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int returned = 0;
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(context.handle, desc, layout_a, layout_b, layout_c, layout_c,
                                                       preference, 1, &heuristic, &returned));
    if (returned == 0) {
        std::fprintf(stderr, "%s:%d: cuBLASLt: no algorithm for m=%d n=%d k=%d\n", __FILE__, __LINE__, m, n, k);
        std::exit(1);
    }
    KNNGPT_CUBLAS_CHECK(cublasLtMatmul(context.handle, desc, &alpha, A, layout_a, B, layout_b, &beta, C, layout_c, C,
                                       layout_c, &heuristic.algo, context.workspace, kMatmulWorkspaceBytes, nullptr));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_c));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_b));
    KNNGPT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_a));
    KNNGPT_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
#endif
}

}  // namespace detail

// ---- host launchers -----------------------------------------------------------

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                           int OC) {
    if (N == 0 || OC == 0) return;
    // out^T (OC, N) = weight (OC, C) . inp^T (C, N)
    detail::gemm_col_major(true, false, OC, N, C, weight, C, inp, C, 0.0f, out, OC);
    if (bias == nullptr) return;
    const size_t total = (size_t)N * OC;
    launch(matmul_bias_add_kernel, (unsigned)ceil_div(total, (size_t)kMatmulBiasThreads), kMatmulBiasThreads, 0,
           nullptr, out, bias, N, OC);
}

inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int N, int C, int OC) {
    if (N == 0 || OC == 0) return;
    // dinp^T (C, N) += weight^T (C, OC) . dout^T (OC, N)
    detail::gemm_col_major(false, false, C, N, OC, weight, C, dout, OC, 1.0f, dinp, C);
    // dweight^T (C, OC) += inp^T (C, N) . dout (N, OC)
    detail::gemm_col_major(false, true, C, OC, N, inp, C, dout, OC, 1.0f, dweight, C);
    if (dbias == nullptr) return;
    launch(matmul_dbias_kernel, ceil_div(OC, 32), dim3(32, kMatmulDbiasStripes), 0, nullptr, dbias, dout, N, OC);
}

}  // namespace knngpt::cuda
