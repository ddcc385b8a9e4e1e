// kernels/cuda/gelu.cuh — GELU, tanh approximation (GPT-2's), fp32. Twin of kernels/cpu/gelu.h;
// the formula is kernels/common/gelu.h, with CUDA's tanhf:
//
//   forward:  y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   backward: dinp += dy/dx * dout
//
// Shapes: any, flattened to N elements (in the model: (B, T, 4C)).
// Backward needs the forward's input (inp), not its output. Backward accumulates (+=).
// Device pointers; one thread per element. When out lies in a registered activation
// (bf16_activations.cuh: fch_gelu), the forward writes its bf16 copy too.
#pragma once

#include <cstddef>

#include "kernels/common/gelu.h"
#include "kernels/cuda/bf16_activations.cuh"
#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kGeluThreads = 256;

// y(x) above; also the GELU of the emulated matmul epilogue (matmul.cuh).
__host__ __device__ __forceinline__ float gelu_tanh(float x) {
    return gelu_from_tanh(x, tanhf(gelu_tanh_argument(x)));
}

// ---- CUDA kernels -------------------------------------------------------------

// out_bf16: nullptr, or (N) receiving bf16(out)
__global__ void gelu_forward_kernel(float* out, __nv_bfloat16* out_bf16, const float* inp, size_t N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    out[i] = gelu_tanh(inp[i]);
    if (out_bf16) out_bf16[i] = __float2bfloat16(out[i]);
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float x = inp[i];
    dinp[i] += gelu_derivative_from_tanh(x, tanhf(gelu_tanh_argument(x))) * dout[i];
}

// ---- host launchers -----------------------------------------------------------

inline void gelu_forward(float* out, const float* inp, size_t N) {
    if (N == 0) return;
    launch(gelu_forward_kernel, (unsigned)ceil_div(N, (size_t)kGeluThreads), kGeluThreads, 0, nullptr, out,
           activation_copy_to_write(out, N), inp, N);
}

inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    if (N == 0) return;
    launch(gelu_backward_kernel, (unsigned)ceil_div(N, (size_t)kGeluThreads), kGeluThreads, 0, nullptr, dinp, inp,
           dout, N);
}

}  // namespace knngpt::cuda
