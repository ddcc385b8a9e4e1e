// kernels/cpu/sgemm_blocks.h — OpenBLAS sgemm whose bits do not depend on the thread count.
//
//   C(M, N) = op(A)(M, K) @ op(B)(K, N) + beta * C          row-major, as cblas_sgemm
//
// OpenBLAS's own threads split a product by their number, and the bits it gives an element
// depend on the part of the product a call covers: the same run gave other weights with 1
// and 2 threads. Here the larger of C's two dimensions is cut into blocks whose size
// depends on the shape alone (a sixteenth of it, 64 to 256 rows), each block is one
// single-threaded sgemm, and our OpenMP threads share the blocks. So a run gives the same
// bits whatever the thread count, and the trainer can follow the machine's load
// (train/omp_threads.h). Idle, the trainer runs within 1.5 % of OpenBLAS's own split
// (kernels/README.md).
// Used by the CPU matmul (matmul.h) and the CUDA emulator's GEMM (kernels/cuda/matmul.cuh).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/parallel.h"

extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace knngpt::cpu {

// OpenBLAS keeps to the calling thread from the first call on. Its OpenMP build sets our
// team size too when told its count, so ours is put back. Call outside a parallel region.
inline void keep_blas_on_calling_thread() {
    static const bool done = [] {
        if (openblas_set_num_threads == nullptr) return false;  // another BLAS: its own affair
        const int threads = omp_get_max_threads();
        openblas_set_num_threads(1);
        omp_set_num_threads(threads);
        return true;
    }();
    (void)done;
}

// rows of a block along a dimension of `extent`: a multiple of 16, from 64 to 256
inline int sgemm_block_size(int extent) {
    const int sixteenth = (extent / 16 + 15) / 16 * 16;
    return std::clamp(sixteenth, 64, 256);
}

inline void sgemm_in_blocks(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                            const float* B, int ldb, float beta, float* C, int ldc) {
    keep_blas_on_calling_thread();
    const CBLAS_TRANSPOSE op_a = trans_a ? CblasTrans : CblasNoTrans, op_b = trans_b ? CblasTrans : CblasNoTrans;
    const bool split_rows = M >= N;
    const int extent = split_rows ? M : N, block = sgemm_block_size(extent);
    const int blocks = (extent + block - 1) / block;
    // below this OpenBLAS itself ran on one thread (2^18 multiply-adds)
    #pragma omp parallel for schedule(static) if (parallel_pays((size_t)M * N * K / 16))
    for (int b = 0; b < blocks; b++) {
        const int s = b * block, n = std::min(block, extent - s);
        if (split_rows) {
            const float* A_rows = trans_a ? A + s : A + (size_t)s * lda;
            cblas_sgemm(CblasRowMajor, op_a, op_b, n, N, K, 1.0f, A_rows, lda, B, ldb, beta, C + (size_t)s * ldc, ldc);
        } else {
            const float* B_columns = trans_b ? B + (size_t)s * ldb : B + s;
            cblas_sgemm(CblasRowMajor, op_a, op_b, M, n, K, 1.0f, A, lda, B_columns, ldb, beta, C + s, ldc);
        }
    }
}

}  // namespace knngpt::cpu
