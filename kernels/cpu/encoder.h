// kernels/cpu/encoder.h — token + position embedding; twin of kernels/cuda/encoder.cuh.
//
//   forward:  out[b,t,:] = wte[inp[b,t], :] + wpe[t, :]
//   backward: dwte[inp[b,t], :] += dout[b,t,:];  dwpe[t, :] += dout[b,t,:]
//
// Shapes: inp (B, T) token ids, wte (V, C), wpe (maxT, C), out/dout (B, T, C).
// Nothing is saved for backward beyond inp.
// Backward accumulates (+=) into dwte and dwpe; the caller zeroes them.
// Design: the backward needs no atomics: a position's dwpe row belongs to one thread, and
// since a token id may repeat, dwte is split by blocks of channels instead of by token.
#pragma once

#include <cstddef>
#include "kernels/cpu/parallel.h"

namespace knngpt::cpu {

inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                            int B, int T, int C) {
    #pragma omp parallel for collapse(2) if (parallel_pays((size_t)B * T * C))
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            // seek to out[b,t,:], the token's row of wte and the position's row of wpe
            float* out_bt = out + ((size_t)b * T + t) * C;
            const float* wte_row = wte + (size_t)inp[b * T + t] * C;
            const float* wpe_row = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) out_bt[c] = wte_row[c] + wpe_row[c];
        }
    }
}

// V: rows of dwte (every token id is below it); the CUDA twin sorts by token with it.
inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                             int B, int T, int C, int V) {
    (void)V;
    // dwpe: each position t is owned by one iteration, summing over the batch.
    #pragma omp parallel for if (parallel_pays((size_t)B * T * C))
    for (int t = 0; t < T; t++) {
        float* dwpe_row = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float* dout_bt = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dwpe_row[c] += dout_bt[c];
        }
    }
    // dwte: a token id may repeat, so rows of dwte are not owned by one (b,t).
    // Split the channels instead: each iteration owns a block of channels of
    // every dwte row and walks all tokens in order.
    const int channel_block = 64;
    #pragma omp parallel for if (parallel_pays((size_t)B * T * C))
    for (int c0 = 0; c0 < C; c0 += channel_block) {
        const int c1 = c0 + channel_block < C ? c0 + channel_block : C;
        for (size_t n = 0; n < (size_t)B * T; n++) {
            float* dwte_row = dwte + (size_t)inp[n] * C;
            const float* dout_n = dout + n * C;
            for (int c = c0; c < c1; c++) dwte_row[c] += dout_n[c];
        }
    }
}

}  // namespace knngpt::cpu
