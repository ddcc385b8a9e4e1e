// kernels/cuda/warp_row.cuh — the one-warp-per-row layout of the kernels that give
// one warp one row (b, h, t) of (B, NH, T): the reference exact attention of
// attention.cuh, sparse_attention, gumbel_attention, sampled_grad. Lane `lane` holds
// channels c = lane + 32 s, s < kWarpRowSlots, of a row vector in registers; slots with
// c >= HS hold 0 and are skipped. The slot count is a compile-time constant so that the
// per-lane arrays stay in registers; 8 slots (8 registers a vector) cover heads up to
// kWarpRowMaxHeadSize = 256.
// Here: the row of a warp (WarpRow), loads and dot products of row vectors, and
// the online softmax of one row (WarpRowSoftmax).
#pragma once

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"

namespace knngpt::cuda {

constexpr int kWarpRowSlots = kWarpRowMaxHeadSize / 32;
static_assert(kWarpRowMaxHeadSize % 32 == 0, "whole slots");

// The flat index over B*NH*T of this thread's warp, one row a warp:
// (b * NH + h) * T + t, so also the row's index in (B, NH, T) arrays.
__device__ __forceinline__ int warp_row_index() { return blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; }

// Which (b, h, row t) a flat warp index over B*NH*T names.
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

// A warp's row t of head h, batch b, and where the head lives: in qkv and dqkv
// (B, T, 3C) at offset `head` (query, key and value of row j at q + j * C3,
// keys + j * C3, values + j * C3), in out and dout (B, T, C) the row's HS
// channels at offset `out`. longest_first hands the last rows (the longest
// causal rows) to the first warps: t = T - 1 - the flat index's t.
struct WarpRow {
    int b, h, t, HS, C3;
    size_t head, out;
    const float *q, *keys, *values;  // the row's query; the head's keys and values
};
// Row t of head h, batch b (for kernels that choose their rows otherwise).
__device__ __forceinline__ WarpRow warp_row_at(const float* qkv, int b, int h, int t, int T, int C, int NH) {
    WarpRow r;
    r.b = b;
    r.h = h;
    r.t = t;
    r.HS = C / NH;
    r.C3 = 3 * C;
    r.head = (size_t)r.b * T * r.C3 + (size_t)r.h * r.HS;
    r.out = ((size_t)r.b * T + r.t) * C + (size_t)r.h * r.HS;
    r.q = qkv + r.head + (size_t)r.t * r.C3;
    r.keys = qkv + r.head + C;
    r.values = qkv + r.head + 2 * C;
    return r;
}
__device__ __forceinline__ WarpRow warp_row(const float* qkv, int warp_index, int T, int C, int NH,
                                            bool longest_first = false) {
    const AttentionRow a = attention_row(warp_index, T, NH);
    return warp_row_at(qkv, a.b, a.h, longest_first ? T - 1 - a.t : a.t, T, C, NH);
}

__device__ __forceinline__ void warp_row_load(float (&reg)[kWarpRowSlots], const float* x, int HS, int lane) {
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane + 32 * s;
        reg[s] = c < HS ? x[c] : 0.0f;
    }
}

// sum_c reg_c y_c over the HS channels, every lane gets it.
__device__ __forceinline__ float warp_row_dot(const float (&reg)[kWarpRowSlots], const float* y, int HS, int lane) {
    float dot = 0.0f;
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane + 32 * s;
        if (c < HS) dot += reg[s] * y[c];
    }
    return warp_reduce_sum(dot);
}

// Online softmax of one row. After scores a_1..a_n with values v_1..v_n, with
// m the running max, l the running sum and o the running (unnormalised) output:
//   m' = max(m, a),  l' = l exp(m - m') + exp(a - m'),  o' = o exp(m - m') + exp(a - m') v
// and at the end out = o / l, lse = m + log l. A row that saw no score (l = 0)
// gives out = 0 and lse = -inf.
struct WarpRowSoftmax {
    float m = -INFINITY, l = 0.0f;
    float o[kWarpRowSlots] = {};

    __device__ __forceinline__ void add(float score, const float* v, int HS, int lane) {
        const float m_new = fmaxf(m, score);
        const float rescale = m == -INFINITY ? 0.0f : expf(m - m_new);
        const float p = expf(score - m_new);
        l = l * rescale + p;
        for (int s = 0; s < kWarpRowSlots; s++) {
            const int c = lane + 32 * s;
            if (c < HS) o[s] = o[s] * rescale + p * v[c];
        }
        m = m_new;
    }

    // out (HS channels) and, from lane 0, *lse
    __device__ __forceinline__ void write(float* out, float* lse, int HS, int lane) const {
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
        for (int s = 0; s < kWarpRowSlots; s++) {
            const int c = lane + 32 * s;
            if (c < HS) out[c] = o[s] * inv_l;
        }
        if (lane == 0) *lse = l > 0.0f ? m + logf(l) : -INFINITY;
    }
};

}  // namespace knngpt::cuda
