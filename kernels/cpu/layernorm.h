// kernels/cpu/layernorm.h — layer normalisation over the last dimension; twin of
// kernels/cuda/layernorm.cuh. The per-element formulas and eps are kernels/common/layernorm.h.
//
//   forward, per row n of C channels (eps = 1e-5):
//     mean[n] = (1/C) sum_c x[n,c]
//     rstd[n] = 1 / sqrt((1/C) sum_c (x[n,c] - mean[n])^2 + eps)
//     out[n,c] = (x[n,c] - mean[n]) rstd[n] weight[c] + bias[c]
//   backward, with norm = (x - mean) rstd and dnorm = weight * dout:
//     dbias[c]   += sum_n dout[n,c]
//     dweight[c] += sum_n norm[n,c] dout[n,c]
//     dinp[n,c]  += rstd[n] (dnorm[n,c] - mean_c(dnorm[n,:]) - norm[n,c] mean_c(dnorm[n,:] norm[n,:]))
//
// Shapes: inp/out/dout/dinp (N, C) with N = B*T rows; weight, bias, dweight, dbias (C);
// mean, rstd (N), saved by forward for backward. Backward accumulates (+=) into
// dinp, dweight and dbias; the caller zeroes them.
// Design: the variance is taken from the centred values (two passes, no cancellation).
#pragma once

#include <cstddef>

#include "kernels/common/layernorm.h"
#include "kernels/cpu/parallel.h"

namespace knngpt::cpu {

inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C) {
    #pragma omp parallel for if (parallel_pays((size_t)N * C))
    for (int n = 0; n < N; n++) {
        // seek to row n
        const float* x = inp + (size_t)n * C;
        float* y = out + (size_t)n * C;
        // mean
        float sum = 0.0f;
        #pragma omp simd reduction(+:sum)
        for (int c = 0; c < C; c++) sum += x[c];
        const float m = sum / (float)C;
        // variance, from the centred values (two passes: no cancellation)
        float sum_sq = 0.0f;
        #pragma omp simd reduction(+:sum_sq)
        for (int c = 0; c < C; c++) sum_sq += (x[c] - m) * (x[c] - m);
        const float s = layernorm_rstd(sum_sq, C);
        // normalise, then scale and shift
        for (int c = 0; c < C; c++) y[c] = layernorm_output(x[c], m, s, weight[c], bias[c]);
        // cache for backward
        mean[n] = m;
        rstd[n] = s;
    }
}

inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
    // dinp: every row is independent
    #pragma omp parallel for if (parallel_pays((size_t)N * C))
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        float* dx = dinp + (size_t)n * C;
        const float m = mean[n], s = rstd[n];
        // the two row means of the formula
        float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
        #pragma omp simd reduction(+:dnorm_sum, dnorm_norm_sum)
        for (int c = 0; c < C; c++) {
            const float norm = layernorm_normalised(x[c], m, s);
            const float dnorm = weight[c] * dy[c];
            dnorm_sum += dnorm;
            dnorm_norm_sum += dnorm * norm;
        }
        const float dnorm_mean = dnorm_sum / (float)C;
        const float dnorm_norm_mean = dnorm_norm_sum / (float)C;
        for (int c = 0; c < C; c++)
            dx[c] += layernorm_input_gradient(layernorm_normalised(x[c], m, s), weight[c] * dy[c], s, dnorm_mean,
                                              dnorm_norm_mean);
    }
    // dweight, dbias sum over rows: each iteration owns a block of channels
    // and walks every row, so no two threads write the same entry.
    const int channel_block = 64;
    #pragma omp parallel for if (parallel_pays((size_t)N * C))
    for (int c0 = 0; c0 < C; c0 += channel_block) {
        const int c1 = c0 + channel_block < C ? c0 + channel_block : C;
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            const float* dy = dout + (size_t)n * C;
            const float m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                dbias[c] += dy[c];
                dweight[c] += layernorm_normalised(x[c], m, s) * dy[c];
            }
        }
    }
}

}  // namespace knngpt::cpu
