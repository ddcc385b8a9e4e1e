// kernels/cuda/attention.cuh — exact causal multi-head attention, fp32, the
// simple reference version. Twin of kernels/cpu/attention.h (same formulas,
// shapes and layout; see its header comment). A faster tiled kernel is tested
// against this one.
//
// Shapes: qkv/dqkv (B, T, 3C), q = channels [0, C), k = [C, 2C), v = [2C, 3C);
// head h owns channels h*HS .. h*HS+HS-1 of each, HS = C / NH <= kAttentionMaxHeadSize.
// out/dout (B, T, C); lse (B, NH, T). Backward recomputes P from lse and
// accumulates (+=) into dqkv. Device pointers.
//
// Design: one warp per (b, h, row); lanes stride over the head's channels, so a
// lane holds at most kAttentionMaxHeadSize / 32 channels of each vector in
// registers. No (T, T) buffer anywhere.
//   forward   warp per query i, online softmax over keys j <= i.
//   backward  Delta_i = dO_i . O_i per query; dQ per query warp (keys j <= i);
//             dK, dV per key warp (queries i >= j). Every output element is
//             written by one warp, so there are no atomics and the result is
//             deterministic.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kAttentionThreads = 256;      // 8 warps, 8 rows per block
constexpr int kAttentionMaxHeadSize = 256;  // HS limit: 8 register slots per lane
constexpr int kAttentionSlots = kAttentionMaxHeadSize / 32;

// ---- CUDA kernels -------------------------------------------------------------

// Which (b, h, row) this warp owns, from a flat warp index over B*NH*T.
struct AttentionRow {
    int b, h, t;
};
__device__ __forceinline__ AttentionRow attention_row(int warp_index, int T, int NH) {
    AttentionRow r;
    r.t = warp_index % T;
    r.h = (warp_index / T) % NH;
    r.b = warp_index / (T * NH);
    return r;
}

__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const AttentionRow r = attention_row(warp_index, T, NH);
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = rsqrtf((float)HS);
    const float* base = qkv + (size_t)r.b * T * C3 + (size_t)r.h * HS;
    const float* q = base + (size_t)r.t * C3;

    float q_reg[kAttentionSlots], o[kAttentionSlots];
    for (int s = 0; s < kAttentionSlots; s++) {
        const int c = lane_id + 32 * s;
        q_reg[s] = c < HS ? q[c] : 0.0f;
        o[s] = 0.0f;
    }
    // Online softmax. After keys 0..j, with m the running max of s_i., l the
    // running sum and o the running (unnormalised) output:
    //   m' = max(m, s_ij)
    //   l' = l exp(m - m') + exp(s_ij - m')
    //   o' = o exp(m - m') + exp(s_ij - m') v_j
    // and at the end out_i = o / l, lse_i = m + log l.
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= r.t; j++) {
        const float* k = base + (size_t)j * C3 + C;
        const float* v = base + (size_t)j * C3 + 2 * C;
        float dot = 0.0f;
        for (int s = 0; s < kAttentionSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) dot += q_reg[s] * k[c];
        }
        const float score = tau * warp_reduce_sum(dot);
        const float m_new = fmaxf(m, score);
        const float rescale = expf(m - m_new);  // exp(-inf) = 0 on the first key
        const float p = expf(score - m_new);
        l = l * rescale + p;
        for (int s = 0; s < kAttentionSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) o[s] = o[s] * rescale + p * v[c];
        }
        m = m_new;
    }
    float* y = out + ((size_t)r.b * T + r.t) * C + (size_t)r.h * HS;
    const float inv_l = 1.0f / l;
    for (int s = 0; s < kAttentionSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) y[c] = o[s] * inv_l;
    }
    if (lane_id == 0) lse[((size_t)r.b * NH + r.h) * T + r.t] = m + logf(l);
}

// delta (B, NH, T): Delta_i = dO_i . O_i, one warp per query.
__global__ void attention_backward_delta_kernel(float* delta, const float* dout, const float* out, int B, int T,
                                                int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (warp_index >= B * NH * T) return;
    const AttentionRow r = attention_row(warp_index, T, NH);
    const int HS = C / NH;
    const size_t offset = ((size_t)r.b * T + r.t) * C + (size_t)r.h * HS;
    float dot = 0.0f;
    for (int c = lane_id; c < HS; c += 32) dot += dout[offset + c] * out[offset + c];
    dot = warp_reduce_sum(dot);
    if (lane_id == 0) delta[((size_t)r.b * NH + r.h) * T + r.t] = dot;
}

// dQ_i += tau sum_{j<=i} dS_ij k_j, one warp per query i.
__global__ void attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                             const float* delta, int B, int T, int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (warp_index >= B * NH * T) return;
    const AttentionRow r = attention_row(warp_index, T, NH);
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = rsqrtf((float)HS);
    const size_t head = (size_t)r.b * T * C3 + (size_t)r.h * HS;
    const float* q = qkv + head + (size_t)r.t * C3;
    const float* dy = dout + ((size_t)r.b * T + r.t) * C + (size_t)r.h * HS;
    const size_t stat = ((size_t)r.b * NH + r.h) * T + r.t;
    const float lse_i = lse[stat], delta_i = delta[stat];

    float q_reg[kAttentionSlots], dy_reg[kAttentionSlots], dq[kAttentionSlots];
    for (int s = 0; s < kAttentionSlots; s++) {
        const int c = lane_id + 32 * s;
        q_reg[s] = c < HS ? q[c] : 0.0f;
        dy_reg[s] = c < HS ? dy[c] : 0.0f;
        dq[s] = 0.0f;
    }
    for (int j = 0; j <= r.t; j++) {
        const float* k = qkv + head + (size_t)j * C3 + C;
        const float* v = qkv + head + (size_t)j * C3 + 2 * C;
        float qk = 0.0f, dp = 0.0f;
        for (int s = 0; s < kAttentionSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) {
                qk += q_reg[s] * k[c];
                dp += dy_reg[s] * v[c];
            }
        }
        qk = warp_reduce_sum(qk);
        dp = warp_reduce_sum(dp);
        const float p = expf(tau * qk - lse_i);  // P_ij
        const float ds = p * (dp - delta_i);     // dS_ij
        for (int s = 0; s < kAttentionSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) dq[s] += ds * k[c];
        }
    }
    float* dq_out = dqkv + head + (size_t)r.t * C3;
    for (int s = 0; s < kAttentionSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) dq_out[c] += tau * dq[s];
    }
}

// dV_j += sum_{i>=j} P_ij dO_i and dK_j += tau sum_{i>=j} dS_ij q_i, one warp per key j.
__global__ void attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                              const float* delta, int B, int T, int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (warp_index >= B * NH * T) return;
    const AttentionRow r = attention_row(warp_index, T, NH);
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = rsqrtf((float)HS);
    const size_t head = (size_t)r.b * T * C3 + (size_t)r.h * HS;
    const float* k = qkv + head + (size_t)r.t * C3 + C;
    const float* v = qkv + head + (size_t)r.t * C3 + 2 * C;
    const size_t stats = ((size_t)r.b * NH + r.h) * T;

    float k_reg[kAttentionSlots], v_reg[kAttentionSlots], dk[kAttentionSlots], dv[kAttentionSlots];
    for (int s = 0; s < kAttentionSlots; s++) {
        const int c = lane_id + 32 * s;
        k_reg[s] = c < HS ? k[c] : 0.0f;
        v_reg[s] = c < HS ? v[c] : 0.0f;
        dk[s] = 0.0f;
        dv[s] = 0.0f;
    }
    for (int i = r.t; i < T; i++) {
        const float* q = qkv + head + (size_t)i * C3;
        const float* dy = dout + ((size_t)r.b * T + i) * C + (size_t)r.h * HS;
        float qk = 0.0f, dp = 0.0f;
        for (int s = 0; s < kAttentionSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) {
                qk += q[c] * k_reg[s];
                dp += dy[c] * v_reg[s];
            }
        }
        qk = warp_reduce_sum(qk);
        dp = warp_reduce_sum(dp);
        const float p = expf(tau * qk - lse[stats + i]);  // P_ij
        const float ds = p * (dp - delta[stats + i]);     // dS_ij
        for (int s = 0; s < kAttentionSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) {
                dv[s] += p * dy[c];
                dk[s] += ds * q[c];
            }
        }
    }
    float* dk_out = dqkv + head + (size_t)r.t * C3 + C;
    float* dv_out = dqkv + head + (size_t)r.t * C3 + 2 * C;
    for (int s = 0; s < kAttentionSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) {
            dk_out[c] += tau * dk[s];
            dv_out[c] += dv[s];
        }
    }
}

// ---- host launchers -----------------------------------------------------------

// HS beyond kAttentionMaxHeadSize would not fit the lanes' register slots.
inline void attention_check_head_size(int C, int NH) {
    if (C / NH > kAttentionMaxHeadSize) {
        std::fprintf(stderr, "attention: head size %d exceeds %d\n", C / NH, kAttentionMaxHeadSize);
        std::exit(1);
    }
}

inline void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    if (rows == 0) return;
    attention_check_head_size(C, NH);
    const int rows_per_block = kAttentionThreads / 32;
    launch(attention_forward_kernel, ceil_div(rows, rows_per_block), kAttentionThreads, 0, nullptr, out, lse, qkv,
           B, T, C, NH);
}

// Allocates and frees a (B, NH, T) scratch for Delta.
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    if (rows == 0) return;
    attention_check_head_size(C, NH);
    const int rows_per_block = kAttentionThreads / 32;
    const int blocks = ceil_div(rows, rows_per_block);
    float* delta = nullptr;
    CUDA_CHECK(cudaMalloc(&delta, (size_t)rows * sizeof(float)));
    launch(attention_backward_delta_kernel, blocks, kAttentionThreads, 0, nullptr, delta, dout, out, B, T, C, NH);
    launch(attention_backward_dq_kernel, blocks, kAttentionThreads, 0, nullptr, dqkv, dout, qkv, lse, delta, B, T,
           C, NH);
    launch(attention_backward_dkv_kernel, blocks, kAttentionThreads, 0, nullptr, dqkv, dout, qkv, lse, delta, B, T,
           C, NH);
    CUDA_CHECK(cudaFree(delta));
}

}  // namespace knngpt::cuda
