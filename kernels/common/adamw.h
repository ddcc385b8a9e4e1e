// kernels/common/adamw.h — one AdamW step of one parameter, with decoupled weight
// decay: the formula both backends apply (kernels/cpu/adamw.h, kernels/cuda/adamw.cuh).
//
//   g     = grad * grad_scale                    (grad_scale: clipping)
//   m     = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//   mhat  = m / (1 - beta1^t),         vhat = v / (1 - beta2^t)      (t >= 1: the step)
//   param = param - lr (mhat / (sqrt(vhat) + eps) + weight_decay param)
//
// The bias corrections 1 - beta^t are computed once per step on the host, in fp64
// then rounded to fp32 (adamw_settings), so every element and every backend
// divides by the same two numbers.
#pragma once
#include <cmath>

#include "kernels/common/hd.h"

namespace knngpt {

struct AdamWSettings {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    float beta1_correction, beta2_correction;  // 1 - beta^t
};

inline AdamWSettings adamw_settings(float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                                    float grad_scale) {
    return AdamWSettings{lr, beta1, beta2, eps, weight_decay, grad_scale,
                         1.0f - (float)std::pow((double)beta1, t), 1.0f - (float)std::pow((double)beta2, t)};
}

// Updates m and v in place; returns the new parameter.
KNNGPT_HD float adamw_step(float param, float grad, float& m, float& v, const AdamWSettings& s) {
    const float g = grad * s.grad_scale;
    m = s.beta1 * m + (1.0f - s.beta1) * g;
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    const float m_hat = m / s.beta1_correction;
    const float v_hat = v / s.beta2_correction;
    return param - s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * param);
}

}  // namespace knngpt
