// kernels/cuda/adamw.cuh — AdamW step with decoupled weight decay, fp32.
// Twin of kernels/cpu/adamw.h; the per-element formula is kernels/common/adamw.h:
//
//   for i < N:
//     g       = grads[i] * grad_scale
//     m[i]    = beta1 m[i] + (1 - beta1) g
//     v[i]    = beta2 v[i] + (1 - beta2) g^2
//     mhat    = m[i] / (1 - beta1^t),   vhat = v[i] / (1 - beta2^t)      (t >= 1)
//     params[i] -= lr (mhat / (sqrt(vhat) + eps) + weight_decay params[i])
//
// Shapes: params, grads, m, v all (N), device pointers; m and v updated in place.
//
// The fp32 params are the master weights. When they lie inside the registered
// parameter buffer (bf16_parameters.cuh), the same pass also writes their bf16
// copy, params_bf16[i] = bf16(params[i]), which the bf16 matmuls read.
//
// Design: one thread per element; the two bias corrections are computed once
// on the host (adamw_settings, as the twin does) and passed in.
#pragma once

#include <cstddef>

#include "kernels/common/adamw.h"
#include "kernels/cuda/bf16_parameters.cuh"
#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kAdamWThreads = 256;

// ---- CUDA kernels -------------------------------------------------------------

// params_bf16: the bf16 copy of params to keep, or nullptr.
__global__ void adamw_update_kernel(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v,
                                    size_t N, AdamWSettings settings) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float m_i = m[i], v_i = v[i];
    const float p = adamw_step(params[i], grads[i], m_i, v_i, settings);
    m[i] = m_i;
    v[i] = v_i;
    params[i] = p;
    if (params_bf16) params_bf16[i] = __float2bfloat16(p);
}

// ---- host launchers -----------------------------------------------------------

inline void adamw_update(float* params, const float* grads, float* m, float* v, size_t N, float lr, float beta1,
                         float beta2, float eps, float weight_decay, int t, float grad_scale) {
    if (N == 0) return;
    const AdamWSettings settings = adamw_settings(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    const unsigned blocks = (unsigned)ceil_div(N, (size_t)kAdamWThreads);
    launch(adamw_update_kernel, blocks, kAdamWThreads, 0, nullptr, params, bf16_copy_of(params, N), grads, m, v, N,
           settings);
}

}  // namespace knngpt::cuda
