// kernels/cpu/global_norm.h — squared L2 norm of a flat buffer; twin of
// kernels/cuda/global_norm.cuh.
//
//   global_norm_squared(x) = sum_i x[i]^2, accumulated in double.
//
// Shapes: x (N). No backward. The caller takes the square root (and sums over shards,
// if any) to clip gradients by their global norm.
// Design: the sum runs over chunks of kNormChunk elements, fixed by N alone, and the
// chunks' sums are added in order, so the bits do not depend on the thread count.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace knngpt::cpu {

inline constexpr size_t kNormChunk = size_t{1} << 14;

inline double global_norm_squared(const float* x, size_t N) {
    const size_t chunks = (N + kNormChunk - 1) / kNormChunk;
    std::vector<double> chunk_sum(chunks);
    #pragma omp parallel for if (parallel_pays(N))
    for (size_t c = 0; c < chunks; c++) {
        const size_t end = c + 1 < chunks ? (c + 1) * kNormChunk : N;
        double sum = 0.0;
        #pragma omp simd reduction(+:sum)
        for (size_t i = c * kNormChunk; i < end; i++) sum += (double)x[i] * (double)x[i];
        chunk_sum[c] = sum;
    }
    double sum = 0.0;
    for (double s : chunk_sum) sum += s;
    return sum;
}

}  // namespace knngpt::cpu
