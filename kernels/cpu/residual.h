// kernels/cpu/residual.h — residual connection; twin of kernels/cuda/residual.cuh.
//
//   forward:  out = a + b
//   backward: da += dout;  db += dout
//
// Shapes: any, flattened to N elements (in the model: (B, T, C)).
// Nothing is saved for backward. Backward accumulates (+=).
#pragma once

#include <cstddef>
#include "kernels/cpu/parallel.h"

namespace knngpt::cpu {

inline void residual_forward(float* out, const float* a, const float* b, size_t N) {
    #pragma omp parallel for simd if (parallel_pays(N))
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

inline void residual_backward(float* da, float* db, const float* dout, size_t N) {
    #pragma omp parallel for simd if (parallel_pays(N))
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

}  // namespace knngpt::cpu
