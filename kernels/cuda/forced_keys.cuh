// kernels/cuda/forced_keys.cuh — every row's key list joined by its forced keys, the
// attention sinks and the local window (kernels/common/forced_keys.h). Twin of
// kernels/cpu/forced_keys.h, the same lists: both run forced_keys_row.
//
// Shapes: topk (B, NH, T, k); lists rows of stride K >= k + window + sinks, whose first
// k + window + sinks slots are written. Device pointers. One thread a row.
#pragma once

#include <cstddef>

#include "kernels/common/forced_keys.h"
#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kForcedKeysThreads = 256;

__global__ void add_forced_keys_kernel(int* lists, int K, const int* topk, int k, int T, size_t rows, int window,
                                       int sinks) {
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    forced_keys_row(lists + row * K, topk + row * k, k, (int)(row % T), window, sinks);
}

inline void add_forced_keys(int* lists, int K, const int* topk, int k, int B, int T, int NH, int window, int sinks) {
    const size_t rows = (size_t)B * NH * T;
    if (rows == 0) return;
    launch(add_forced_keys_kernel, (unsigned)ceil_div(rows, (size_t)kForcedKeysThreads), kForcedKeysThreads, 0,
           nullptr, lists, K, topk, k, T, rows, window, sinks);
}

}  // namespace knngpt::cuda
