// kernels/cpu/gelu.h — GELU, tanh approximation (GPT-2's).
//
//   forward:  y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   backward: dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//             dinp += dy/dx * dout
//
// Shapes: any, flattened to N elements (in the model: (B, T, 4C)).
// Backward needs the forward's input (inp), not its output. Backward accumulates (+=).
// tanh is tanh_vectorizable (vector_math.h): libm's tanhf is a scalar call that
// would dominate these loops.
#pragma once

#include <cstddef>

#include "kernels/cpu/vector_math.h"

namespace knngpt::cpu {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

inline void gelu_forward(float* out, const float* inp, size_t N) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < N; i++) {
        const float x = inp[i];
        const float u = kGeluScale * (x + kGeluCubic * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_vectorizable(u));
    }
}

inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    #pragma omp parallel for simd
    for (size_t i = 0; i < N; i++) {
        const float x = inp[i];
        const float u = kGeluScale * (x + kGeluCubic * x * x * x);
        const float tanh_u = tanh_vectorizable(u);
        const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
        const float dy_dx = 0.5f * (1.0f + tanh_u) + 0.5f * x * (1.0f - tanh_u * tanh_u) * du_dx;
        dinp[i] += dy_dx * dout[i];
    }
}

}  // namespace knngpt::cpu
