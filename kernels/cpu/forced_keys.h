// kernels/cpu/forced_keys.h — every row's key list joined by its forced keys, the
// attention sinks and the local window (kernels/common/forced_keys.h):
//   L_i = S_i ∪ {0 .. sinks - 1} ∪ {i - window + 1 .. i}   (causal keys only, each once)
//
// Shapes: topk (B, NH, T, k) top-k rows (ascending keys, then -1); lists (B, NH, T) rows of
// stride K >= k + window + sinks, whose first k + window + sinks slots are written
// (ascending, then -1); the rest of a row is left as it is. Nothing to save for a backward.
// Twin: kernels/cuda/forced_keys.cuh, the same lists (one row function for both).
#pragma once

#include <cstddef>

#include "kernels/common/forced_keys.h"

namespace knngpt::cpu {

inline void add_forced_keys(int* lists, int K, const int* topk, int k, int B, int T, int NH, int window, int sinks) {
    const size_t rows = (size_t)B * NH * T;
    #pragma omp parallel for schedule(static)
    for (size_t row = 0; row < rows; row++)
        forced_keys_row(lists + row * K, topk + row * k, k, (int)(row % T), window, sinks);
}

}  // namespace knngpt::cpu
