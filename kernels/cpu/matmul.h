// kernels/cpu/matmul.h — fully connected layer, through OpenBLAS sgemm.
//
//   forward:  out = inp @ weight^T + bias            out[n,o] = sum_c inp[n,c] weight[o,c] + bias[o]
//   backward: dinp    += dout @ weight               (N, C)
//             dweight += dout^T @ inp                (OC, C)
//             dbias   += sum_n dout[n, :]            (OC)
//
// Shapes: inp (N, C) with N = B*T rows, weight (OC, C) (PyTorch's nn.Linear layout),
// bias (OC) or nullptr, out/dout (N, OC). Backward needs the forward's inp.
// Backward accumulates (+=); dbias may be nullptr (no bias).
//
// OpenBLAS is the OpenMP build: it shares our thread pool, and a call made from
// inside an OpenMP parallel region runs single-threaded.
#pragma once

#include <cblas.h>

#include <cstddef>

namespace knngpt::cpu {

inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
    // out(N, OC) = inp(N, C) @ weight(OC, C)^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias == nullptr) return;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* out_n = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++) out_n[o] += bias[o];
    }
}

inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int N, int C, int OC) {
    // dinp(N, C) += dout(N, OC) @ weight(OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    // dweight(OC, C) += dout(N, OC)^T @ inp(N, C)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias == nullptr) return;
    // dbias: column sums of dout; each iteration owns a block of columns
    const int column_block = 64;
    #pragma omp parallel for
    for (int o0 = 0; o0 < OC; o0 += column_block) {
        const int o1 = o0 + column_block < OC ? o0 + column_block : OC;
        for (int n = 0; n < N; n++) {
            const float* dout_n = dout + (size_t)n * OC;
            for (int o = o0; o < o1; o++) dbias[o] += dout_n[o];
        }
    }
}

}  // namespace knngpt::cpu
