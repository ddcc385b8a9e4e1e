// kernels/cpu/adamw.h — AdamW step with decoupled weight decay; twin of
// kernels/cuda/adamw.cuh. Both call the per-element formula of kernels/common/adamw.h:
//
//   for i < N:
//     g       = grads[i] * grad_scale              (grad_scale: e.g. clipping or 1/accumulation)
//     m[i]    = beta1 m[i] + (1 - beta1) g
//     v[i]    = beta2 v[i] + (1 - beta2) g^2
//     mhat    = m[i] / (1 - beta1^t),   vhat = v[i] / (1 - beta2^t)      (t >= 1: the step count)
//     params[i] -= lr (mhat / (sqrt(vhat) + eps) + weight_decay params[i])
//
// Shapes: params, grads, m, v all (N). m and v are the optimizer state, updated in place.
// Design: the formula is written once, in kernels/common, so the two backends differ only
// in where their compilers fuse a multiply and an add (ALGORITHMS.md §11.1).
#pragma once

#include <cstddef>

#include "kernels/common/adamw.h"

namespace knngpt::cpu {

inline void adamw_update(float* params, const float* grads, float* m, float* v, size_t N,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int t, float grad_scale) {
    // bias corrections, computed once for the whole buffer
    const AdamWSettings settings = adamw_settings(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) params[i] = adamw_step(params[i], grads[i], m[i], v[i], settings);
}

}  // namespace knngpt::cpu
