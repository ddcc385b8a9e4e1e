// kernels/cuda/residual.cuh — residual connection, fp32. Twin of kernels/cpu/residual.h.
//
//   forward:  out = a + b
//   backward: da += dout;  db += dout
//
// Shapes: any, flattened to N elements (in the model: (B, T, C)).
// Nothing is saved for backward. Backward accumulates (+=). Device pointers.
// One thread per element; every element is owned by one thread, so no races.
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kResidualThreads = 256;

// ---- CUDA kernels -------------------------------------------------------------

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = a[i] + b[i];
}

__global__ void residual_backward_kernel(float* da, float* db, const float* dout, size_t N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float g = dout[i];
    da[i] += g;
    db[i] += g;
}

// ---- host launchers -----------------------------------------------------------

inline void residual_forward(float* out, const float* a, const float* b, size_t N) {
    if (N == 0) return;
    launch(residual_forward_kernel, (unsigned)ceil_div(N, (size_t)kResidualThreads), kResidualThreads, 0, nullptr,
           out, a, b, N);
}

inline void residual_backward(float* da, float* db, const float* dout, size_t N) {
    if (N == 0) return;
    launch(residual_backward_kernel, (unsigned)ceil_div(N, (size_t)kResidualThreads), kResidualThreads, 0, nullptr,
           da, db, dout, N);
}

}  // namespace knngpt::cuda
