// kernels/cuda/layernorm.cuh — layer normalisation over the last dimension, fp32.
// Twin of kernels/cpu/layernorm.h.
//
//   forward, per row n of C channels (eps = 1e-5):
//     mean[n] = (1/C) sum_c x[n,c]
//     rstd[n] = 1 / sqrt((1/C) sum_c (x[n,c] - mean[n])^2 + eps)
//     out[n,c] = (x[n,c] - mean[n]) rstd[n] weight[c] + bias[c]
//   backward, with norm = (x - mean) rstd and dnorm = weight * dout:
//     dbias[c]   += sum_n dout[n,c]
//     dweight[c] += sum_n norm[n,c] dout[n,c]
//     dinp[n,c]  += rstd[n] (dnorm[n,c] - mean_c(dnorm[n,:]) - norm[n,c] mean_c(dnorm[n,:] norm[n,:]))
//
// Shapes: inp/out/dout/dinp (N, C) with N = B*T rows; weight, bias, dweight, dbias (C);
// mean, rstd (N), saved by forward for backward. Backward accumulates (+=) into
// dinp, dweight and dbias; the caller zeroes them. Device pointers. When out lies
// in a registered activation (bf16_activations.cuh: ln1, ln2, lnf), the forward
// writes its bf16 copy too, in the same pass.
//
// Design: one warp per row for everything that reduces over a row (forward,
// dinp), with warp_reduce_sum. dweight/dbias reduce over rows instead, in two
// passes with no atomics (the same bits on every run): a block owns a tile of 32
// channels x kLayerNormParamRows rows and writes its sums to a partial row of
// its chunk; add_chunk_sums (common.cuh) then adds the chunks in order.
#pragma once

#include <cstddef>

#include "kernels/common/layernorm.h"
#include "kernels/cuda/bf16_activations.cuh"
#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kLayerNormThreads = 256;       // 8 warps, 8 rows per block
constexpr int kLayerNormParamStripes = 8;    // threadIdx.y of the dweight/dbias kernel
constexpr int kLayerNormParamRows = 256;     // rows per block of the dweight/dbias kernel

// ---- CUDA kernels -------------------------------------------------------------

// out_bf16: nullptr, or (N, C) receiving bf16(out)
__global__ void layernorm_forward_kernel(float* out, __nv_bfloat16* out_bf16, float* mean, float* rstd,
                                         const float* inp, const float* weight, const float* bias, int N, int C) {
    // this warp owns row n; a whole warp leaves together, so the shuffles stay full
    const int lane_id = threadIdx.x % 32;
    const int warp_id = threadIdx.x / 32;
    const int n = blockIdx.x * (blockDim.x / 32) + warp_id;
    if (n >= N) return;
    const float* x = inp + (size_t)n * C;
    float* y = out + (size_t)n * C;
    // mean
    float sum = 0.0f;
    for (int c = lane_id; c < C; c += 32) sum += x[c];
    const float m = warp_reduce_sum(sum) / (float)C;
    // variance, from the centred values (two passes: no cancellation)
    float sum_sq = 0.0f;
    for (int c = lane_id; c < C; c += 32) sum_sq += (x[c] - m) * (x[c] - m);
    const float s = layernorm_rstd(warp_reduce_sum(sum_sq), C);
    // normalise, then scale and shift
    __nv_bfloat16* y_bf16 = out_bf16 ? out_bf16 + (size_t)n * C : nullptr;
    for (int c = lane_id; c < C; c += 32) {
        y[c] = layernorm_output(x[c], m, s, weight[c], bias[c]);
        if (y_bf16) y_bf16[c] = __float2bfloat16(y[c]);
    }
    // cache for backward
    if (lane_id == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

// dinp, one warp per row.
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean, const float* rstd, int N,
                                                int C) {
    const int lane_id = threadIdx.x % 32;
    const int warp_id = threadIdx.x / 32;
    const int n = blockIdx.x * (blockDim.x / 32) + warp_id;
    if (n >= N) return;
    const float* x = inp + (size_t)n * C;
    const float* dy = dout + (size_t)n * C;
    float* dx = dinp + (size_t)n * C;
    const float m = mean[n], s = rstd[n];
    // the two row means of the formula
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane_id; c < C; c += 32) {
        const float norm = layernorm_normalised(x[c], m, s);
        const float dnorm = weight[c] * dy[c];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
    }
    const float dnorm_mean = warp_reduce_sum(dnorm_sum) / (float)C;
    const float dnorm_norm_mean = warp_reduce_sum(dnorm_norm_sum) / (float)C;
    for (int c = lane_id; c < C; c += 32)
        dx[c] += layernorm_input_gradient(layernorm_normalised(x[c], m, s), weight[c] * dy[c], s, dnorm_mean,
                                          dnorm_norm_mean);
}

// dweight, dbias, pass 1: dweight_partial[chunk, c] and dbias_partial[chunk, c],
// the sums over the rows of chunk = blockIdx.y. Block (32, kLayerNormParamStripes):
// threadIdx.x picks the channel c of tile blockIdx.x (adjacent threads read
// adjacent channels), threadIdx.y a stripe of the chunk's rows.
__global__ void layernorm_backward_params_kernel(float* dweight_partial_out, float* dbias_partial_out,
                                                 const float* dout, const float* inp, const float* mean,
                                                 const float* rstd, int N, int C) {
    __shared__ float dweight_partial[kLayerNormParamStripes][32];
    __shared__ float dbias_partial[kLayerNormParamStripes][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int row_begin = blockIdx.y * kLayerNormParamRows;
    const int row_end = min(row_begin + kLayerNormParamRows, N);
    float dweight_sum = 0.0f, dbias_sum = 0.0f;
    if (c < C) {
        for (int n = row_begin + (int)threadIdx.y; n < row_end; n += kLayerNormParamStripes) {
            const size_t i = (size_t)n * C + c;
            dbias_sum += dout[i];
            dweight_sum += layernorm_normalised(inp[i], mean[n], rstd[n]) * dout[i];
        }
    }
    dweight_partial[threadIdx.y][threadIdx.x] = dweight_sum;
    dbias_partial[threadIdx.y][threadIdx.x] = dbias_sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int stripe = 1; stripe < kLayerNormParamStripes; stripe++) {
            dweight_sum += dweight_partial[stripe][threadIdx.x];
            dbias_sum += dbias_partial[stripe][threadIdx.x];
        }
        dweight_partial_out[(size_t)blockIdx.y * C + c] = dweight_sum;
        dbias_partial_out[(size_t)blockIdx.y * C + c] = dbias_sum;
    }
}

// ---- host launchers -----------------------------------------------------------

inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int N, int C) {
    if (N == 0) return;
    const int rows_per_block = kLayerNormThreads / 32;
    launch(layernorm_forward_kernel, ceil_div(N, rows_per_block), kLayerNormThreads, 0, nullptr, out,
           activation_copy_to_write(out, (size_t)N * C), mean, rstd, inp, weight, bias, N, C);
}

inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const float* mean, const float* rstd, int N, int C) {
    if (N == 0 || C == 0) return;
    const int rows_per_block = kLayerNormThreads / 32;
    launch(layernorm_backward_input_kernel, ceil_div(N, rows_per_block), kLayerNormThreads, 0, nullptr, dinp, dout,
           inp, weight, mean, rstd, N, C);
    const int chunks = ceil_div(N, kLayerNormParamRows);
    static DeviceScratch partial_scratch;  // dweight's then dbias's (chunks, C) partial sums
    float* dweight_partial = static_cast<float*>(partial_scratch.get(2 * (size_t)chunks * C * sizeof(float)));
    float* dbias_partial = dweight_partial + (size_t)chunks * C;
    const dim3 grid(ceil_div(C, 32), chunks);
    const dim3 block(32, kLayerNormParamStripes);
    launch(layernorm_backward_params_kernel, grid, block, 0, nullptr, dweight_partial, dbias_partial, dout, inp, mean,
           rstd, N, C);
    add_chunk_sums(dweight, dweight_partial, chunks, C);
    add_chunk_sums(dbias, dbias_partial, chunks, C);
}

}  // namespace knngpt::cuda
