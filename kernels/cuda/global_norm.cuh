// kernels/cuda/global_norm.cuh — squared L2 norm of a flat buffer.
// Twin of kernels/cpu/global_norm.h.
//
//   global_norm_squared(x) = sum_i x[i]^2, accumulated in double.
//
// Shapes: x (N), a device pointer; the result comes back to the host.
//
// Design: a fixed grid (depending only on N) of kGlobalNormThreads threads;
// each thread sums a grid-stride slice in double, the block reduces its
// threads in shared memory by a fixed tree, and writes one partial to a
// device scratch kept across calls. The host copies the partials back and
// adds them in block order. No atomics anywhere, so the result is
// deterministic run to run.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kGlobalNormThreads = 256;  // a power of two: the tree reduction halves it
constexpr int kGlobalNormMaxBlocks = 1024;

// ---- CUDA kernels -------------------------------------------------------------

__global__ void global_norm_squared_kernel(double* partials, const float* x, size_t N) {
    __shared__ double block_sums[kGlobalNormThreads];
    double sum = 0.0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += stride) {
        const double value = (double)x[i];
        sum += value * value;
    }
    block_sums[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kGlobalNormThreads / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) block_sums[threadIdx.x] += block_sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = block_sums[0];
}

// ---- host launchers -----------------------------------------------------------

inline double global_norm_squared(const float* x, size_t N) {
    if (N == 0) return 0.0;
    const size_t wanted = ceil_div(N, (size_t)kGlobalNormThreads);
    const int blocks = (int)(wanted < (size_t)kGlobalNormMaxBlocks ? wanted : (size_t)kGlobalNormMaxBlocks);
    static DeviceScratch scratch;
    double* partials = static_cast<double*>(scratch.get((size_t)blocks * sizeof(double)));
    launch(global_norm_squared_kernel, blocks, kGlobalNormThreads, 0, nullptr, partials, x, N);
    std::vector<double> host(blocks);
    CUDA_CHECK(cudaMemcpy(host.data(), partials, (size_t)blocks * sizeof(double), cudaMemcpyDeviceToHost));
    double sum = 0.0;
    for (int b = 0; b < blocks; b++) sum += host[b];
    return sum;
}

}  // namespace knngpt::cuda
