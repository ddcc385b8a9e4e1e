// kernels/cpu/adamw.h — AdamW step with decoupled weight decay.
//
//   for i < N:
//     g       = grads[i] * grad_scale              (grad_scale: e.g. clipping or 1/accumulation)
//     m[i]    = beta1 m[i] + (1 - beta1) g
//     v[i]    = beta2 v[i] + (1 - beta2) g^2
//     mhat    = m[i] / (1 - beta1^t),   vhat = v[i] / (1 - beta2^t)      (t >= 1: the step count)
//     params[i] -= lr (mhat / (sqrt(vhat) + eps) + weight_decay params[i])
//
// Shapes: params, grads, m, v all (N). m and v are the optimizer state, updated in place.
#pragma once

#include <cmath>
#include <cstddef>

namespace knngpt::cpu {

inline void adamw_update(float* params, const float* grads, float* m, float* v, size_t N,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int t, float grad_scale) {
    // bias corrections, computed once for the whole buffer
    const float beta1_correction = 1.0f - (float)std::pow((double)beta1, t);
    const float beta2_correction = 1.0f - (float)std::pow((double)beta2, t);
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        const float g = grads[i] * grad_scale;
        const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
        const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = m_i;
        v[i] = v_i;
        const float m_hat = m_i / beta1_correction;
        const float v_hat = v_i / beta2_correction;
        params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * params[i]);
    }
}

}  // namespace knngpt::cpu
