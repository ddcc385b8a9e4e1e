// kernels/cuda/sparse_attention.cuh — softmax attention over per-query key lists
// with log-weights, fp32; twin of kernels/cpu/sparse_attention.h (same formulas,
// shapes and layout). With j_t = idx[b,h,i,t] (-1 slots skipped; logw may be nullptr):
//   a_t = tau q_i . k_{j_t} + logw_t,  lse_i = log sum_t exp(a_t),  P_t = exp(a_t - lse_i),
//   o_i = sum_t P_t v_{j_t};  a list with no valid slot gives o_i = 0, lse_i = -inf, no gradient.
// Shapes: qkv/dqkv (B, T, 3C); out/dout (B, T, C); lse (B, NH, T); idx, logw
// (B, NH, T, K); HS = C / NH <= kWarpRowMaxHeadSize. Device pointers. The forward
// saves lse; the backward recomputes P_t from it and adds (+=) into dqkv.
// Design: one warp per (b, h, i) (warp_row.cuh), the slots walked in order. The
// backward is one kernel: Delta_i = dO_i . o_i by the query's warp, dQ_i collected
// in registers, dK and dV added by float atomicAdd since any query may list any
// key, so dK and dV are not bit-deterministic (they agree to fp32 rounding); dQ is.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

constexpr int kSparseThreads = 256;  // 8 warps, one query row each

// ---- CUDA kernels -------------------------------------------------------------

__global__ void sparse_attention_forward_kernel(float* out, float* lse, const float* qkv, const int* idx,
                                                const float* logw, int B, int T, int C, int NH, int K) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const WarpRow row = warp_row(qkv, warp_index, T, C, NH);
    const int HS = row.HS, C3 = row.C3;
    const float tau = attention_tau(HS);
    const int* idx_row = idx + (size_t)warp_index * K;  // warp_index = (b * NH + h) * T + i
    const float* logw_row = logw ? logw + (size_t)warp_index * K : nullptr;

    float q_reg[kWarpRowSlots];
    warp_row_load(q_reg, row.q, HS, lane_id);
    WarpRowSoftmax softmax;  // over the valid slots; an empty list gives out 0, lse -inf
    for (int t = 0; t < K; t++) {
        const int j = idx_row[t];
        if (j < 0) continue;  // the same j for every lane: the warp stays together
        const float a =
            tau * warp_row_dot(q_reg, row.keys + (size_t)j * C3, HS, lane_id) + (logw_row ? logw_row[t] : 0.0f);
        softmax.add(a, row.values + (size_t)j * C3, HS, lane_id);
    }
    softmax.write(out + row.out, &lse[warp_index], HS, lane_id);
}

__global__ void sparse_attention_backward_kernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                                                 const float* lse, const int* idx, const float* logw, int B, int T,
                                                 int C, int NH, int K) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;
    const float lse_i = lse[warp_index];
    if (lse_i == -INFINITY) return;  // an empty list: no gradient
    const WarpRow row = warp_row(qkv, warp_index, T, C, NH);
    const int HS = row.HS, C3 = row.C3;
    const float tau = attention_tau(HS);
    const size_t head = row.head;
    const size_t row_offset = row.out;
    const int* idx_row = idx + (size_t)warp_index * K;
    const float* logw_row = logw ? logw + (size_t)warp_index * K : nullptr;

    float q_reg[kWarpRowSlots], dy_reg[kWarpRowSlots], dq[kWarpRowSlots] = {};
    warp_row_load(q_reg, row.q, HS, lane_id);
    warp_row_load(dy_reg, dout + row_offset, HS, lane_id);
    const float delta = warp_row_dot(dy_reg, out + row_offset, HS, lane_id);  // Delta_i = dO_i . o_i

    for (int t = 0; t < K; t++) {
        const int j = idx_row[t];
        if (j < 0) continue;
        const float* k = row.keys + (size_t)j * C3;
        const float* v = row.values + (size_t)j * C3;
        const float qk = warp_row_dot(q_reg, k, HS, lane_id);
        const float dp = warp_row_dot(dy_reg, v, HS, lane_id);
        const float p = expf(tau * qk + (logw_row ? logw_row[t] : 0.0f) - lse_i);  // P_t
        const float ds_tau = tau * p * (dp - delta);                              // tau dS_t
        float* dk = dqkv + head + (size_t)j * C3 + C;
        float* dv = dqkv + head + (size_t)j * C3 + 2 * C;
        for (int s = 0; s < kWarpRowSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) {
                dq[s] += ds_tau * k[c];
                atomicAdd(&dk[c], ds_tau * q_reg[s]);
                atomicAdd(&dv[c], p * dy_reg[s]);
            }
        }
    }
    float* dq_out = dqkv + head + (size_t)row.t * C3;
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) dq_out[c] += dq[s];
    }
}

// ---- host launchers -----------------------------------------------------------

inline void sparse_attention_check_shapes(int C, int NH, int K) {
    if (NH < 1 || C % NH != 0 || C / NH > kWarpRowMaxHeadSize || K < 0) {
        std::fprintf(stderr,
                     "sparse_attention: need C %% NH == 0, head size <= %d and K >= 0 (got C=%d NH=%d K=%d)\n",
                     kWarpRowMaxHeadSize, C, NH, K);
        std::exit(1);
    }
}

inline void sparse_attention_forward(float* out, float* lse, const float* qkv, const int* idx, const float* logw,
                                     int B, int T, int C, int NH, int K) {
    sparse_attention_check_shapes(C, NH, K);
    const int rows = B * NH * T;
    if (rows == 0) return;
    const int rows_per_block = kSparseThreads / 32;
    launch(sparse_attention_forward_kernel, ceil_div(rows, rows_per_block), kSparseThreads, 0, nullptr, out, lse,
           qkv, idx, logw, B, T, C, NH, K);
}

inline void sparse_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                      const float* lse, const int* idx, const float* logw, int B, int T, int C,
                                      int NH, int K) {
    sparse_attention_check_shapes(C, NH, K);
    const int rows = B * NH * T;
    if (rows == 0) return;
    const int rows_per_block = kSparseThreads / 32;
    launch(sparse_attention_backward_kernel, ceil_div(rows, rows_per_block), kSparseThreads, 0, nullptr, dqkv, dout,
           qkv, out, lse, idx, logw, B, T, C, NH, K);
}

}  // namespace knngpt::cuda
