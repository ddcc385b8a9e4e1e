// kernels/cuda/classifier.cuh — fused softmax + cross-entropy over a padded vocabulary,
// fp32 arithmetic on fp32 or bf16 logits. Twin of kernels/cpu/classifier.h.
//
//   forward:  losses[n] = logsumexp_{j<V} logits[n,j] - logits[n, targets[n]]
//   backward: dlogits[n,j] = (softmax_{j<V}(logits[n,:])_j - [j == targets[n]]) dloss   for j < V
//             dlogits[n,j] = 0                                                          for V <= j < Vp
//   fused:    crossentropy_fused writes both, losses and dlogits, from one set of row
//             statistics (llm.c's fused_classifier); the training step uses it.
//
// Shapes: logits/dlogits (N, Vp), targets (N), losses (N); device pointers.
// The padding columns V..Vp-1 never enter the softmax. Nothing is saved for the
// backward: it recomputes the row statistics from the logits. Backward and fused
// WRITE dlogits (=, not +=), and dlogits may alias logits.
//
// Design: one warp per row, whose statistics (max, and the sum of exp(x - max)) come
// from one online pass, so the fused kernel reads each row twice (statistics, then
// probabilities): the logits are the largest activations, (B T, Vp) values.
#pragma once

#include <cmath>
#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kClassifierThreads = 256;  // 8 warps, 8 rows per block

// ---- CUDA kernels -------------------------------------------------------------

// Logits in bf16 (Logit = __nv_bfloat16: the bf16 build's, backend.cuh): each is read
// widened (exact), every operation is the fp32 one, and dlogits are stored rounded to bf16
// (relative error <= 2^-8). Against the fp32 logits x they were rounded from, each rounded
// logit is within eps = 2^-8 max_j |x_j| of x_j; logsumexp moves by at most eps (it is
// 1-Lipschitz in the largest coordinate) and the target logit by eps, so the loss by at
// most 2^-7 max_j |x_j| (test_cuda_loss_and_optimizer checks both this and the match with
// the CPU twin on the rounded values).
//
// A logit as float: fp32 as it is, bf16 widened (exact); and a value stored as a logit.
__host__ __device__ __forceinline__ float logit_value(float x) { return x; }
__host__ __device__ __forceinline__ float logit_value(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class Logit>
__device__ __forceinline__ Logit logit_store(float x);
template <>
__device__ __forceinline__ float logit_store<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 logit_store<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// The online pass: each lane keeps its running maximum m and the sum s of exp(x - m)
// over its elements, rescaling s by exp(m_old - m_new) when m grows, and the warp
// combines the lanes' pairs, M = max m (warp_reduce_max) and sum of s e^(m - M)
// (warp_reduce_sum). The same sum as exp(x - M) summed directly up to fp32 rounding
// (each term carries one or two more roundings, and the additions are in another
// order): CudaClassifier's tests hold it to the CPU twin's within their tolerance.
// max_{j<V} row[j] and sum_{j<V} exp(row[j] - max), online in one read of the row (above),
// reduced over the warp; every lane gets both. A lane whose elements are all -inf (or that has
// none, V < 32) adds 0; a NaN or +inf logit makes the sum NaN, as the two-pass form does.
template <class Logit>
__device__ __forceinline__ void warp_softmax_row_stats(const Logit* row, int V, int lane_id, float* row_max,
                                                       float* exp_sum) {
    float m = -INFINITY, sum = 0.0f;  // this lane's running maximum and sum of exp(x - m)
    for (int j = lane_id; j < V; j += 32) {
        const float x = logit_value(row[j]);
        if (x > m) {
            sum = sum * expf(m - x) + 1.0f;  // m = -inf: sum is 0 (or NaN) before the + 1
            m = x;
        } else if (!(x <= m)) {
            sum = x;  // NaN: the sum is NaN from here on
        } else if (m > -INFINITY) {
            sum += expf(x - m);  // x = -inf adds 0
        }
    }
    const float row_m = warp_reduce_max(m);
    *row_max = row_m;
    *exp_sum = warp_reduce_sum(m > -INFINITY ? sum * expf(m - row_m) : sum);  // m = -inf: sum is 0 or NaN
}

template <class Logit>
__global__ void crossentropy_forward_kernel(float* losses, const Logit* logits, const int* targets, int N, int V,
                                            int Vp) {
    const int lane_id = threadIdx.x % 32;
    const int warp_id = threadIdx.x / 32;
    const int n = blockIdx.x * (blockDim.x / 32) + warp_id;
    if (n >= N) return;  // whole warps leave together
    const Logit* row = logits + (size_t)n * Vp;
    float row_max, exp_sum;
    warp_softmax_row_stats(row, V, lane_id, &row_max, &exp_sum);
    if (lane_id == 0) losses[n] = row_max + logf(exp_sum) - logit_value(row[targets[n]]);
}

// losses (N) and dlogits (N, Vp) in one kernel: the row statistics once, then the loss and the writes.
// losses == nullptr: dlogits only (the backward; it is the fused kernel without the losses).
// In-place (dlogits == logits): the whole warp has finished both reductions (the
// shuffles synchronise it) before any lane writes, and each lane then overwrites only
// the elements it reads itself. The loss also needs the target's logit, which another
// lane may overwrite: every lane reads it before the reductions, and a __syncwarp
// (which, unlike the shuffles, orders memory) separates all reads from the first write.
template <class Logit>
__global__ void crossentropy_fused_kernel(float* losses, Logit* dlogits, const Logit* logits, const int* targets,
                                          float dloss, int N, int V, int Vp) {
    const int lane_id = threadIdx.x % 32;
    const int warp_id = threadIdx.x / 32;
    const int n = blockIdx.x * (blockDim.x / 32) + warp_id;
    if (n >= N) return;
    const Logit* row = logits + (size_t)n * Vp;
    Logit* drow = dlogits + (size_t)n * Vp;
    const int target = targets[n];
    const float target_logit = logit_value(row[target]);  // before the shuffles below, so before any lane writes
    float row_max, exp_sum;
    warp_softmax_row_stats(row, V, lane_id, &row_max, &exp_sum);
    __syncwarp();  // every lane's reads of the row (and of the target logit) before any write
    if (losses && lane_id == 0) losses[n] = row_max + logf(exp_sum) - target_logit;
    const float inv_sum = 1.0f / exp_sum;
    for (int j = lane_id; j < V; j += 32) {
        const float prob = expf(logit_value(row[j]) - row_max) * inv_sum;
        const float indicator = j == target ? 1.0f : 0.0f;
        drow[j] = logit_store<Logit>((prob - indicator) * dloss);
    }
    for (int j = V + lane_id; j < Vp; j += 32) drow[j] = logit_store<Logit>(0.0f);
}

// ---- host launchers -----------------------------------------------------------

// Logit: float, or __nv_bfloat16 for the bf16 build's logits (ops::Logit, backend.cuh)
template <class Logit>
inline void crossentropy_forward(float* losses, const Logit* logits, const int* targets, int N, int V, int Vp) {
    if (N == 0) return;
    const int rows_per_block = kClassifierThreads / 32;
    launch(crossentropy_forward_kernel<Logit>, ceil_div(N, rows_per_block), kClassifierThreads, 0, nullptr, losses,
           logits, targets, N, V, Vp);
}

template <class Logit>
inline void crossentropy_fused(float* losses, Logit* dlogits, const Logit* logits, const int* targets, float dloss,
                               int N, int V, int Vp) {
    if (N == 0) return;
    const int rows_per_block = kClassifierThreads / 32;
    launch(crossentropy_fused_kernel<Logit>, ceil_div(N, rows_per_block), kClassifierThreads, 0, nullptr, losses,
           dlogits, logits, targets, dloss, N, V, Vp);
}

template <class Logit>
inline void crossentropy_softmax_backward(Logit* dlogits, const Logit* logits, const int* targets, float dloss,
                                          int N, int V, int Vp) {
    crossentropy_fused<Logit>(nullptr, dlogits, logits, targets, dloss, N, V, Vp);
}

}  // namespace knngpt::cuda
