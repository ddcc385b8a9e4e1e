// kernels/common/gelu.h — GELU, tanh approximation (GPT-2's): the formula and its
// constants, once for both backends (kernels/cpu/gelu.h, kernels/cuda/gelu.cuh and
// the CUDA matmul epilogue call these; each supplies its own tanh).
//
//   u      = sqrt(2/pi) (x + 0.044715 x^3)
//   y      = 0.5 x (1 + tanh(u))
//   dy/dx  = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
#pragma once

#include "kernels/common/hd.h"

namespace knngpt {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// u(x), the argument of tanh.
KNNGPT_HD float gelu_tanh_argument(float x) { return kGeluScale * (x + kGeluCubic * x * x * x); }

// y(x), given tanh_u = tanh(u(x)).
KNNGPT_HD float gelu_from_tanh(float x, float tanh_u) { return 0.5f * x * (1.0f + tanh_u); }

// dy/dx at x, given tanh_u = tanh(u(x)).
KNNGPT_HD float gelu_derivative_from_tanh(float x, float tanh_u) {
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    return 0.5f * (1.0f + tanh_u) + 0.5f * x * (1.0f - tanh_u * tanh_u) * du_dx;
}

}  // namespace knngpt
