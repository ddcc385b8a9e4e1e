// kernels/cpu/gelu.h — GELU, tanh approximation (GPT-2's); twin of kernels/cuda/gelu.cuh.
// Both use the formula of kernels/common/gelu.h:
//
//   forward:  y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   backward: dinp += dy/dx * dout
//
// Shapes: any, flattened to N elements (in the model: (B, T, 4C)).
// Backward needs the forward's input (inp), not its output. Backward accumulates (+=).
// Design: tanh is tanh_vectorizable (vector_math.h), so that these loops vectorise;
// libm's tanhf is a scalar call.
#pragma once

#include <cstddef>

#include "kernels/common/gelu.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"

namespace knngpt::cpu {

inline void gelu_forward(float* out, const float* inp, size_t N) {
    #pragma omp parallel for simd if (parallel_pays(N))
    for (size_t i = 0; i < N; i++) {
        const float x = inp[i];
        out[i] = gelu_from_tanh(x, tanh_vectorizable(gelu_tanh_argument(x)));
    }
}

inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    #pragma omp parallel for simd if (parallel_pays(N))
    for (size_t i = 0; i < N; i++) {
        const float x = inp[i];
        dinp[i] += gelu_derivative_from_tanh(x, tanh_vectorizable(gelu_tanh_argument(x))) * dout[i];
    }
}

}  // namespace knngpt::cpu
