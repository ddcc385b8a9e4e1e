// kernels/cuda/encoder.cuh — token + position embedding, fp32. Twin of kernels/cpu/encoder.h.
//
//   forward:  out[b,t,:] = wte[inp[b,t], :] + wpe[t, :]
//   backward: dwte[inp[b,t], :] += dout[b,t,:];  dwpe[t, :] += dout[b,t,:]
//
// Shapes: inp (B, T) token ids, wte (V, C), wpe (maxT, C), out/dout (B, T, C).
// Nothing is saved for backward beyond inp. Backward accumulates (+=) into
// dwte and dwpe; the caller zeroes them. All pointers are device pointers.
//
// Backward races: a position t is shared by the B rows of the batch, so dwpe
// is written by one thread per (t, c) that sums over b in order (deterministic).
// A token id may repeat anywhere in inp, so dwte uses atomicAdd per element
// (the order of those additions, and so the last bits, may vary between runs).
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kEncoderThreads = 256;

// ---- CUDA kernels -------------------------------------------------------------

// One thread per element (b, t, c) of out.
__global__ void encoder_forward_kernel(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                                       int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    const size_t bt = idx / C;
    const int c = (int)(idx % C);
    const int t = (int)(bt % T);
    out[idx] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
}

// One thread per element (t, c) of dwpe, summing over the batch.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += dout[(size_t)b * T * C + idx];
    dwpe[idx] += sum;
}

// One thread per element (b, t, c) of dout, added atomically into its token's row of dwte.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* inp, int B, int T, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    const size_t bt = idx / C;
    const int c = (int)(idx % C);
    atomicAdd(&dwte[(size_t)inp[bt] * C + c], dout[idx]);
}

// ---- host launchers -----------------------------------------------------------

inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) return;
    launch(encoder_forward_kernel, (unsigned)ceil_div(n, (size_t)kEncoderThreads), kEncoderThreads, 0, nullptr, out,
           inp, wte, wpe, B, T, C);
}

inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    const size_t n_wpe = (size_t)T * C, n_out = (size_t)B * T * C;
    if (n_out == 0) return;
    launch(encoder_backward_wpe_kernel, (unsigned)ceil_div(n_wpe, (size_t)kEncoderThreads), kEncoderThreads, 0,
           nullptr, dwpe, dout, B, T, C);
    launch(encoder_backward_wte_kernel, (unsigned)ceil_div(n_out, (size_t)kEncoderThreads), kEncoderThreads, 0,
           nullptr, dwte, dout, inp, B, T, C);
}

}  // namespace knngpt::cuda
