// kernels/cpu/global_norm.h — squared L2 norm of a flat buffer; twin of
// kernels/cuda/global_norm.cuh.
//
//   global_norm_squared(x) = sum_i x[i]^2, accumulated in double.
//
// Shapes: x (N). No backward. The caller takes the square root (and sums over shards,
// if any) to clip gradients by their global norm.
#pragma once

#include <cstddef>

namespace knngpt::cpu {

inline double global_norm_squared(const float* x, size_t N) {
    double sum = 0.0;
    #pragma omp parallel for simd reduction(+:sum)
    for (size_t i = 0; i < N; i++) sum += (double)x[i] * (double)x[i];
    return sum;
}

}  // namespace knngpt::cpu
