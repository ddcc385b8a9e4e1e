// kernels/cpu/matmul.h — fully connected layer, through OpenBLAS sgemm; twin of
// kernels/cuda/matmul.cuh.
//
//   forward:  out = inp @ weight^T + bias            out[n,o] = sum_c inp[n,c] weight[o,c] + bias[o]
//   forward_gelu: pre_gelu = inp @ weight^T + bias, out_gelu = gelu(pre_gelu)   (gelu.h)
//   backward: dinp     = dout @ weight               (N, C)
//             dweight += dout^T @ inp                (OC, C)
//             dbias   += sum_n dout[n, :]            (OC)
//
// Shapes: inp (N, C) with N = B*T rows, weight (OC, C) (PyTorch's nn.Linear layout),
// bias (OC) or nullptr, out/dout (N, OC). Backward needs the forward's inp.
// Backward overwrites dinp (sgemm's beta = 0: dinp is not read, need not be
// zeroed) and accumulates (+=) into dweight and dbias; dbias may be nullptr.
// Design: the GEMMs are OpenBLAS sgemm calls on blocks fixed by the shape, shared by our
// OpenMP threads (sgemm_blocks.h), so no result depends on the thread count.
// matmul_forward_loops / matmul_backward_loops compute the same products as plain
// OpenMP loops; they are tested against the sgemm path, and a build with
// -DKNNGPT_MATMUL_LOOPS makes the model call them (the baseline of `make bench`).
#pragma once

#include <cstddef>

#include "kernels/cpu/gelu.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/sgemm_blocks.h"

namespace knngpt::cpu {

inline void matmul_forward_loops(float* out, const float* inp, const float* weight, const float* bias,
                                 int N, int C, int OC) {
    #pragma omp parallel for collapse(2)
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            const float* inp_n = inp + (size_t)n * C;
            const float* w_o = weight + (size_t)o * C;
            float sum = bias ? bias[o] : 0.0f;
            #pragma omp simd reduction(+ : sum)
            for (int c = 0; c < C; c++) sum += inp_n[c] * w_o[c];
            out[(size_t)n * OC + o] = sum;
        }
    }
}

inline void matmul_backward_loops(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, int N, int C, int OC) {
    // dinp: each row n owned by one iteration
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* dinp_n = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) dinp_n[c] = 0.0f;
        for (int o = 0; o < OC; o++) {
            const float d = dout[(size_t)n * OC + o];
            const float* w_o = weight + (size_t)o * C;
            #pragma omp simd
            for (int c = 0; c < C; c++) dinp_n[c] += d * w_o[c];
        }
    }
    // dweight and dbias: each output row o owned by one iteration
    #pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float* dw_o = dweight + (size_t)o * C;
        float bias_sum = 0.0f;
        for (int n = 0; n < N; n++) {
            const float d = dout[(size_t)n * OC + o];
            const float* inp_n = inp + (size_t)n * C;
            bias_sum += d;
            #pragma omp simd
            for (int c = 0; c < C; c++) dw_o[c] += d * inp_n[c];
        }
        if (dbias) dbias[o] += bias_sum;
    }
}

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
#ifdef KNNGPT_MATMUL_LOOPS
    return matmul_forward_loops(out, inp, weight, bias, N, C, OC);
#endif
    // out(N, OC) = inp(N, C) @ weight(OC, C)^T
    sgemm_in_blocks(false, true, N, OC, C, inp, C, weight, C, 0.0f, out, OC);
    if (bias == nullptr) return;
    #pragma omp parallel for if (parallel_pays((size_t)N * OC))
    for (int n = 0; n < N; n++) {
        float* out_n = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++) out_n[o] += bias[o];
    }
}

// out_gelu = gelu(inp @ weight^T + bias), pre_gelu = GELU's input: the MLP's
// first layer, one op so that backends can fuse GELU into the GEMM (the CUDA
// one does); here simply the two ops. Both outputs (N, OC).
inline void matmul_forward_gelu(float* out_gelu, float* pre_gelu, const float* inp, const float* weight,
                                const float* bias, int N, int C, int OC) {
    matmul_forward(pre_gelu, inp, weight, bias, N, C, OC);
    gelu_forward(out_gelu, pre_gelu, (size_t)N * OC);
}

inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int N, int C, int OC) {
#ifdef KNNGPT_MATMUL_LOOPS
    return matmul_backward_loops(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
#endif
    // dinp(N, C) = dout(N, OC) @ weight(OC, C)
    sgemm_in_blocks(false, false, N, C, OC, dout, OC, weight, C, 0.0f, dinp, C);
    // dweight(OC, C) += dout(N, OC)^T @ inp(N, C)
    sgemm_in_blocks(true, false, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias == nullptr) return;
    // dbias: column sums of dout; each iteration owns a block of columns
    const int column_block = 64;
    #pragma omp parallel for if (parallel_pays((size_t)N * OC))
    for (int o0 = 0; o0 < OC; o0 += column_block) {
        const int o1 = o0 + column_block < OC ? o0 + column_block : OC;
        for (int n = 0; n < N; n++) {
            const float* dout_n = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++) dbias[o] += dout_n[o];
        }
    }
}

}  // namespace knngpt::cpu
