// kernels/cuda/attention.cuh — exact causal multi-head attention, fp32; twin of
// kernels/cpu/attention.h. For query i, key j <= i and tau = 1/sqrt(HS):
//   s_ij = tau q_i . k_j,  lse_i = log sum_{j<=i} exp(s_ij),  P_ij = exp(s_ij - lse_i),  o_i = sum_j P_ij v_j
//   backward: Delta_i = dO_i . o_i,  dS_ij = P_ij (dO_i . v_j - Delta_i),
//             dQ_i += tau sum_j dS_ij k_j,  dK_j += tau sum_i dS_ij q_i,  dV_j += sum_i P_ij dO_i
// Shapes: qkv/dqkv (B, T, 3C), q, k, v the channels [0, C), [C, 2C), [2C, 3C), head h
// at h*HS .. h*HS+HS-1 of each; out/dout (B, T, C); lse (B, NH, T), natural log.
// The forward saves lse; the backward recomputes P from it (nothing T x T is
// stored), keeps Delta in a scratch kept across calls and adds (+=) into dqkv.
// Design: attention_forward_fp32 / attention_backward_fp32 are tiled, FlashAttention-2 style
// (no atomics: deterministic) for HS <= kAttentionTiledMaxHeadSize; beyond that
// (or for B * NH past the grid's y) they run the one-warp-per-row reference
// kernels, which also serve as the tiled ones' test oracle.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

constexpr int kAttentionThreads = 256;  // reference kernels: 8 warps, 8 rows per block

// The backward's Delta (B, NH, T), in a scratch kept across calls.
inline float* attention_delta_scratch(size_t count) {
    static DeviceScratch scratch;
    return static_cast<float*>(scratch.get(count * sizeof(float)));
}

// ---- reference kernels: one warp per row ---------------------------------------
// One warp per (b, h, row) (warp_row.cuh): the forward a warp per query i, online
// softmax over keys j <= i; the backward Delta_i per query, dQ a warp per query
// (keys j <= i), dK and dV a warp per key (queries i >= j).

__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const WarpRow r = warp_row(qkv, warp_index, T, C, NH);
    const int HS = r.HS, C3 = r.C3;
    const float tau = attention_tau(HS);

    float q_reg[kWarpRowSlots];
    warp_row_load(q_reg, r.q, HS, lane_id);
    WarpRowSoftmax softmax;  // over keys j <= i
    for (int j = 0; j <= r.t; j++)
        softmax.add(tau * warp_row_dot(q_reg, r.keys + (size_t)j * C3, HS, lane_id), r.values + (size_t)j * C3, HS,
                    lane_id);
    softmax.write(out + r.out, &lse[warp_index], HS, lane_id);
}

// delta (B, NH, T): Delta_i = dO_i . O_i, one warp per query.
__global__ void attention_backward_delta_kernel(float* delta, const float* dout, const float* out, int B, int T,
                                                int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;
    const AttentionRow r = attention_row(warp_index, T, NH);
    const int HS = C / NH;
    const size_t offset = ((size_t)r.b * T + r.t) * C + (size_t)r.h * HS;
    float dot = 0.0f;
    for (int c = lane_id; c < HS; c += 32) dot += dout[offset + c] * out[offset + c];
    dot = warp_reduce_sum(dot);
    if (lane_id == 0) delta[warp_index] = dot;
}

// dQ_i += tau sum_{j<=i} dS_ij k_j, one warp per query i.
__global__ void attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                             const float* delta, int B, int T, int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;
    const WarpRow r = warp_row(qkv, warp_index, T, C, NH);
    const int HS = r.HS, C3 = r.C3;
    const float tau = attention_tau(HS);
    const float lse_i = lse[warp_index], delta_i = delta[warp_index];

    float q_reg[kWarpRowSlots], dy_reg[kWarpRowSlots], dq[kWarpRowSlots] = {};
    warp_row_load(q_reg, r.q, HS, lane_id);
    warp_row_load(dy_reg, dout + r.out, HS, lane_id);
    for (int j = 0; j <= r.t; j++) {
        const float* k = r.keys + (size_t)j * C3;
        const float* v = r.values + (size_t)j * C3;
        const float qk = warp_row_dot(q_reg, k, HS, lane_id);
        const float dp = warp_row_dot(dy_reg, v, HS, lane_id);
        const float p = expf(tau * qk - lse_i);  // P_ij
        const float ds = p * (dp - delta_i);     // dS_ij
        for (int s = 0; s < kWarpRowSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) dq[s] += ds * k[c];
        }
    }
    float* dq_out = dqkv + r.head + (size_t)r.t * C3;
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) dq_out[c] += tau * dq[s];
    }
}

// dV_j += sum_{i>=j} P_ij dO_i and dK_j += tau sum_{i>=j} dS_ij q_i, one warp per key j.
__global__ void attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                              const float* delta, int B, int T, int C, int NH) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;
    const WarpRow r = warp_row(qkv, warp_index, T, C, NH);
    const int HS = r.HS, C3 = r.C3;
    const float tau = attention_tau(HS);
    const size_t head = r.head;
    const float* k = r.keys + (size_t)r.t * C3;
    const float* v = r.values + (size_t)r.t * C3;
    const size_t stats = ((size_t)r.b * NH + r.h) * T;

    float k_reg[kWarpRowSlots], v_reg[kWarpRowSlots], dk[kWarpRowSlots] = {}, dv[kWarpRowSlots] = {};
    warp_row_load(k_reg, k, HS, lane_id);
    warp_row_load(v_reg, v, HS, lane_id);
    for (int i = r.t; i < T; i++) {
        const float* q = qkv + head + (size_t)i * C3;
        const float* dy = dout + ((size_t)r.b * T + i) * C + (size_t)r.h * HS;
        const float qk = warp_row_dot(k_reg, q, HS, lane_id);
        const float dp = warp_row_dot(v_reg, dy, HS, lane_id);
        const float p = expf(tau * qk - lse[stats + i]);  // P_ij
        const float ds = p * (dp - delta[stats + i]);     // dS_ij
        for (int s = 0; s < kWarpRowSlots; s++) {
            const int c = lane_id + 32 * s;
            if (c < HS) {
                dv[s] += p * dy[c];
                dk[s] += ds * q[c];
            }
        }
    }
    float* dk_out = dqkv + head + (size_t)r.t * C3 + C;
    float* dv_out = dqkv + head + (size_t)r.t * C3 + 2 * C;
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) {
            dk_out[c] += tau * dk[s];
            dv_out[c] += dv[s];
        }
    }
}

// ---- reference host launchers -------------------------------------------------

// HS beyond kWarpRowMaxHeadSize would not fit the lanes' register slots.
inline void attention_check_head_size(int C, int NH) {
    if (C / NH > kWarpRowMaxHeadSize) {
        std::fprintf(stderr, "attention: head size %d exceeds %d\n", C / NH, kWarpRowMaxHeadSize);
        std::exit(1);
    }
}

inline void attention_forward_reference(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    if (rows == 0) return;
    attention_check_head_size(C, NH);
    const int rows_per_block = kAttentionThreads / 32;
    launch(attention_forward_kernel, ceil_div(rows, rows_per_block), kAttentionThreads, 0, nullptr, out, lse, qkv,
           B, T, C, NH);
}

// Delta (B, NH, T) from dout and the forward's out, into the scratch of
// attention_delta_scratch; every backward starts with it.
inline const float* attention_backward_delta(const float* dout, const float* out, int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    float* delta = attention_delta_scratch((size_t)rows);
    launch(attention_backward_delta_kernel, ceil_div(rows, kAttentionThreads / 32), kAttentionThreads, 0, nullptr,
           delta, dout, out, B, T, C, NH);
    return delta;
}

inline void attention_backward_reference(float* dqkv, const float* dout, const float* qkv, const float* out,
                                         const float* lse, int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    if (rows == 0) return;
    attention_check_head_size(C, NH);
    const int blocks = ceil_div(rows, kAttentionThreads / 32);
    const float* delta = attention_backward_delta(dout, out, B, T, C, NH);
    launch(attention_backward_dq_kernel, blocks, kAttentionThreads, 0, nullptr, dqkv, dout, qkv, lse, delta, B, T,
           C, NH);
    launch(attention_backward_dkv_kernel, blocks, kAttentionThreads, 0, nullptr, dqkv, dout, qkv, lse, delta, B, T,
           C, NH);
}

// ---- tiled kernels --------------------------------------------------------------
// 4 warps per block, one block per (tile, b*NH + h) = (blockIdx.x, blockIdx.y).
// Kernels take the tile shapes of a head-size bound (AttentionTiles<64> or <128>,
// picked at run time from HS) as their template parameter. Tiles live in static
// shared memory, rows padded to ld = MAX_HS + 4 floats (16-byte aligned rows for
// float4 reads; a stride of 4 mod 32 words keeps lanes that read different rows on
// different banks). Channels [HS, HS rounded up to 4) are zero-filled, as are rows
// past T; T and HS need not be multiples of anything.
//   tile sizes         forward Br x Bc       backward Br x Bc    shared memory (fwd / bwd)
//   MAX_HS = 64        64 x 32               32 x 32             42 KB / 42 KB
//   MAX_HS = 128       16 x 32               16 x 16             43 KB / 35 KB
//   forward   a block owns Br queries of one (b, h); Q tile (Br, HS) in shared
//             memory for the whole block. It walks the key tiles 0, Bc, ... up
//             to its last query (the causal limit), loading K and V tiles
//             (Bc, HS). Warp w owns Br/4 query rows: for scores lane = key of
//             the tile, and the row's max and sum come from warp reductions;
//             for P V lane = channel (lane + 32 s), P passed through a (Br, Bc)
//             shared tile. Online softmax per row: with running max m, sum l
//             and unnormalised output o in registers, a tile with scores s_j
//             gives m' = max(m, max_j s_j), l' = l e^(m - m') + sum_j e^(s_j - m'),
//             o' = o e^(m - m') + sum_j e^(s_j - m') v_j. The output o / l and
//             lse = m + log l are written once at the end. Query tiles are
//             handed out last first, the longest ones starting earliest.
//   backward  three kernels, no atomics, so the result is deterministic:
//             1. Delta_i = dO_i . O_i, one warp per query (shared with the
//                reference).
//             2. dK, dV: a block owns Bc keys of one (b, h); K, V tiles stay in
//                shared memory; it walks the query tiles that reach its keys
//                (i >= first key), loading Q, dO tiles plus lse and Delta. Each
//                thread computes P and dS for one query and Bc / (128 / Br) keys
//                and stores them transposed, (Bc, Br); then warp w accumulates
//                dK, dV for Bc/4 keys (lane = channel) in registers. Written
//                once, += into dqkv, at the end.
//             3. dQ: a block owns Br queries (Q, dO, lse, Delta stay in shared
//                memory) and walks the key tiles up to the causal limit,
//                recomputing P and dS into a (Br, Bc) tile; warp w accumulates
//                dQ for Br/4 queries in registers and writes it once.
//             The only (B, NH, T)-sized buffer is Delta; P and dS exist one
//             tile at a time in shared memory.

constexpr int kAttentionTiledWarps = 4;
constexpr int kAttentionTiledThreads = 32 * kAttentionTiledWarps;

// Every tile dimension of the tiled kernels for heads of at most MAX_HS
// channels, from the three tile sizes; the kernels take one of these as their
// template parameter.
template <int MAX_HS, int FORWARD_ROWS, int BACKWARD_ROWS, int BACKWARD_KEYS>
struct AttentionTiledShape {
    static constexpr int max_hs = MAX_HS;
    static constexpr int warps = kAttentionTiledWarps;
    static constexpr int threads = kAttentionTiledThreads;
    static constexpr int slots = MAX_HS / 32;  // channels per lane: lane + 32 s
    static constexpr int ld = MAX_HS + 4;      // row stride (floats) of a (rows, HS) tile

    // forward, Br x Bc: Br queries per block, Bc = 32 keys per tile, one per lane
    static constexpr int forward_rows = FORWARD_ROWS;
    static constexpr int forward_keys = 32;
    static constexpr int forward_rows_per_warp = forward_rows / warps;

    // backward, Br x Bc (the dK/dV kernel owns Bc keys, the dQ kernel Br queries)
    static constexpr int backward_rows = BACKWARD_ROWS;
    static constexpr int backward_keys = BACKWARD_KEYS;
    // dK, dV score step: thread -> (query, one of dkv_groups key groups); accumulation: keys per warp
    static constexpr int dkv_groups = threads / backward_rows;
    static constexpr int dkv_keys_per_thread = backward_keys / dkv_groups;
    static constexpr int dkv_keys_per_warp = backward_keys / warps;
    // dQ score step: thread -> (key, one of dq_groups query groups); accumulation: queries per warp
    static constexpr int dq_groups = threads / backward_keys;
    static constexpr int dq_rows_per_thread = backward_rows / dq_groups;
    static constexpr int dq_rows_per_warp = backward_rows / warps;

    // static shared memory per block, bytes: (rows, HS) tiles, (rows, keys) P / dS tiles, lse and Delta
    static constexpr size_t forward_shared_bytes =
        sizeof(float) * ((size_t)(forward_rows + 2 * forward_keys) * ld + forward_rows * forward_keys);
    static constexpr size_t dkv_shared_bytes =
        sizeof(float) * ((size_t)2 * (backward_keys + backward_rows) * ld + 2 * backward_keys * backward_rows +
                         2 * backward_rows);
    static constexpr size_t dq_shared_bytes =
        sizeof(float) * ((size_t)2 * (backward_rows + backward_keys) * ld + backward_rows * backward_keys +
                         2 * backward_rows);

    static_assert(MAX_HS % 32 == 0, "whole slots");
    static_assert(forward_rows % warps == 0, "forward: whole rows per warp");
    static_assert(threads % backward_rows == 0 && backward_keys % dkv_groups == 0 && backward_keys % warps == 0 &&
                      backward_rows % 4 == 0,
                  "dK, dV tile shape");
    static_assert(threads % backward_keys == 0 && backward_rows % dq_groups == 0 && backward_rows % warps == 0 &&
                      backward_keys % 4 == 0,
                  "dQ tile shape");
    static_assert(forward_shared_bytes <= kDefaultSharedBytes && dkv_shared_bytes <= kDefaultSharedBytes &&
                      dq_shared_bytes <= kDefaultSharedBytes,
                  "static shared memory");
};

// The tile sizes per head-size bound (see the table in the header comment).
template <int MAX_HS>
struct AttentionTiles;
template <>
struct AttentionTiles<64> : AttentionTiledShape<64, 64, 32, 32> {};
template <>
struct AttentionTiles<128> : AttentionTiledShape<128, 16, 16, 16> {};
static_assert(AttentionTiles<kAttentionTiledMaxHeadSize>::max_hs == kAttentionTiledMaxHeadSize,
              "the largest bound is the tiled limit");

__device__ __forceinline__ float4 attention_load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ float attention_dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Copies rows row0 .. row0+ROWS-1 of one head's (T, HS) slice of src (row
// stride src_stride) into tile (ROWS, LD), channels 0 .. width-1, with zeros
// for rows >= T and channels >= HS. All threads of the block take part; the
// caller synchronises.
template <int ROWS, int LD>
__device__ void attention_load_tile(float (*tile)[LD], const float* src, int src_stride, int row0, int T, int HS,
                                    int width) {
    for (int idx = threadIdx.x; idx < ROWS * width; idx += blockDim.x) {
        const int r = idx / width, c = idx % width;
        const int t = row0 + r;
        tile[r][c] = (t < T && c < HS) ? src[(size_t)t * src_stride + c] : 0.0f;
    }
}

// Copies lse and Delta of rows row0 .. row0+ROWS-1 (zeros past T).
template <int ROWS>
__device__ void attention_load_row_stats(float* lse_tile, float* delta_tile, const float* lse_bh,
                                         const float* delta_bh, int row0, int T) {
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) {
        const int t = row0 + r;
        lse_tile[r] = t < T ? lse_bh[t] : 0.0f;
        delta_tile[r] = t < T ? delta_bh[t] : 0.0f;
    }
}

// Forward. grid (ceil(T / Br), B * NH), block kAttentionTiledThreads.
template <class Tiles>
__global__ void __launch_bounds__(Tiles::threads)
    attention_forward_tiled_kernel(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    constexpr int BR = Tiles::forward_rows, BC = Tiles::forward_keys, LD = Tiles::ld;
    constexpr int RPW = Tiles::forward_rows_per_warp;  // query rows per warp
    constexpr int SLOTS = Tiles::slots;                // channels per lane: lane + 32 s
    __align__(16) __shared__ float q_tile[BR][LD];  // (Br, HS) queries of this block
    __align__(16) __shared__ float k_tile[BC][LD];  // (Bc, HS) keys of the current tile
    __align__(16) __shared__ float v_tile[BC][LD];  // (Bc, HS) values of the current tile
    __align__(16) __shared__ float p_tile[BR][BC];  // (Br, Bc) e^(s - m'), each warp its own rows
    static_assert(sizeof(q_tile) + sizeof(k_tile) + sizeof(v_tile) + sizeof(p_tile) == Tiles::forward_shared_bytes);

    (void)B;  // the grid's y covers B * NH
    const int HS = C / NH, C3 = 3 * C, HS4 = (HS + 3) / 4 * 4;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BR;  // last query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = warp * RPW;  // this warp's rows of the tile
    const float tau = attention_tau(HS);
    const float* q = qkv + (size_t)b * T * C3 + (size_t)h * HS;  // (T, HS), row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;

    attention_load_tile<BR, LD>(q_tile, q, C3, i0, T, HS, HS4);

    float m[RPW], l[RPW], o[RPW][SLOTS];
    for (int r = 0; r < RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int s = 0; s < SLOTS; s++) o[r][s] = 0.0f;
    }

    const int i_last = min(i0 + BR, T) - 1;  // keys 0 .. i_last are all the tile's queries see
    for (int j0 = 0; j0 <= i_last; j0 += BC) {
        __syncthreads();  // everyone is done with the previous K, V tiles (and q_tile is written)
        attention_load_tile<BC, LD>(k_tile, k, C3, j0, T, HS, HS4);
        attention_load_tile<BC, LD>(v_tile, v, C3, j0, T, HS, HS4);
        __syncthreads();

        // scores of this warp's rows against key j0 + lane
        float dot[RPW];
        for (int r = 0; r < RPW; r++) dot[r] = 0.0f;
        for (int c = 0; c < HS4; c += 4) {
            const float4 k4 = attention_load4(&k_tile[lane][c]);
            for (int r = 0; r < RPW; r++) dot[r] += attention_dot4(attention_load4(&q_tile[row0 + r][c]), k4);
        }

        // online softmax update, one row at a time; the first key tile always
        // holds key 0 <= i, so m is finite from then on and e^(m - m') is safe
        const int j = j0 + lane;
        for (int r = 0; r < RPW; r++) {
            const int i = i0 + row0 + r;
            const float score = (j <= i && j < T) ? tau * dot[r] : -INFINITY;
            const float m_new = fmaxf(m[r], warp_reduce_max(score));
            const float p = expf(score - m_new);  // 0 for masked keys
            const float rescale = expf(m[r] - m_new);
            l[r] = l[r] * rescale + warp_reduce_sum(p);
            m[r] = m_new;
            for (int s = 0; s < SLOTS; s++) o[r][s] *= rescale;
            p_tile[row0 + r][lane] = p;
        }
        __syncwarp();  // the warp's p_tile rows are complete

        // o += P V, lane = channel
        for (int jj = 0; jj < BC; jj += 4) {
            float4 p4[RPW];
            for (int r = 0; r < RPW; r++) p4[r] = attention_load4(&p_tile[row0 + r][jj]);
            for (int s = 0; s < SLOTS; s++) {
                const int c = lane + 32 * s;
                if (c >= HS) continue;
                const float v0 = v_tile[jj][c], v1 = v_tile[jj + 1][c], v2 = v_tile[jj + 2][c],
                            v3 = v_tile[jj + 3][c];
                for (int r = 0; r < RPW; r++) o[r][s] += p4[r].x * v0 + p4[r].y * v1 + p4[r].z * v2 + p4[r].w * v3;
            }
        }
    }

    for (int r = 0; r < RPW; r++) {
        const int i = i0 + row0 + r;
        if (i >= T) break;  // rows past T (of the last tile) are never written
        float* y = out + ((size_t)b * T + i) * C + (size_t)h * HS;
        const float inv_l = 1.0f / l[r];
        for (int s = 0; s < SLOTS; s++) {
            const int c = lane + 32 * s;
            if (c < HS) y[c] = o[r][s] * inv_l;
        }
        if (lane == 0) lse[((size_t)b * NH + h) * T + i] = m[r] + logf(l[r]);
    }
}

// Backward, dK and dV. grid (ceil(T / Bc), B * NH), block kAttentionTiledThreads.
template <class Tiles>
__global__ void __launch_bounds__(Tiles::threads)
    attention_backward_dkv_tiled_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                        const float* delta, int B, int T, int C, int NH) {
    constexpr int BR = Tiles::backward_rows, BC = Tiles::backward_keys, LD = Tiles::ld, SLOTS = Tiles::slots;
    constexpr int GROUPS = Tiles::dkv_groups;                    // score step: thread -> (query, key group)
    constexpr int KEYS_PER_THREAD = Tiles::dkv_keys_per_thread;  // score step: keys of a thread
    constexpr int KPW = Tiles::dkv_keys_per_warp;                // accumulation: keys per warp
    __align__(16) __shared__ float k_tile[BC][LD];   // (Bc, HS) this block's keys
    __align__(16) __shared__ float v_tile[BC][LD];   // (Bc, HS) this block's values
    __align__(16) __shared__ float q_tile[BR][LD];   // (Br, HS) queries of the current tile
    __align__(16) __shared__ float do_tile[BR][LD];  // (Br, HS) dO of the current tile
    __align__(16) __shared__ float pt_tile[BC][BR];  // (Bc, Br) P transposed
    __align__(16) __shared__ float dst_tile[BC][BR]; // (Bc, Br) dS transposed
    __shared__ float lse_tile[BR], delta_tile[BR];
    static_assert(sizeof(k_tile) + sizeof(v_tile) + sizeof(q_tile) + sizeof(do_tile) + sizeof(pt_tile) +
                      sizeof(dst_tile) + sizeof(lse_tile) + sizeof(delta_tile) ==
                  Tiles::dkv_shared_bytes);

    (void)B;  // the grid's y covers B * NH
    const int HS = C / NH, C3 = 3 * C, HS4 = (HS + 3) / 4 * 4;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int j0 = blockIdx.x * BC;  // first key tile (the most queries) first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float tau = attention_tau(HS);
    const size_t head = (size_t)b * T * C3 + (size_t)h * HS;
    const float* q = qkv + head;  // (T, HS), row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dy = dout + (size_t)b * T * C + (size_t)h * HS;  // (T, HS), row stride C
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;
    const float* delta_bh = delta + ((size_t)b * NH + h) * T;

    attention_load_tile<BC, LD>(k_tile, k, C3, j0, T, HS, HS4);
    attention_load_tile<BC, LD>(v_tile, v, C3, j0, T, HS, HS4);

    const int score_i = threadIdx.x % BR;  // score step: query of the tile
    const int score_g = threadIdx.x / BR;  // score step: keys score_g + GROUPS e
    const int key0 = warp * KPW;           // accumulation: this warp's keys of the tile

    float dk[KPW][SLOTS], dv[KPW][SLOTS];
    for (int jj = 0; jj < KPW; jj++) {
        for (int s = 0; s < SLOTS; s++) dk[jj][s] = dv[jj][s] = 0.0f;
    }

    for (int i0 = j0 / BR * BR; i0 < T; i0 += BR) {  // every query tile holding an i >= j0
        __syncthreads();  // done with the previous tiles (and K, V are written)
        attention_load_tile<BR, LD>(q_tile, q, C3, i0, T, HS, HS4);
        attention_load_tile<BR, LD>(do_tile, dy, C, i0, T, HS, HS4);
        attention_load_row_stats<BR>(lse_tile, delta_tile, lse_bh, delta_bh, i0, T);
        __syncthreads();

        // P and dS for query i0 + score_i and KEYS_PER_THREAD keys
        float qk[KEYS_PER_THREAD], dp[KEYS_PER_THREAD];
        for (int e = 0; e < KEYS_PER_THREAD; e++) qk[e] = dp[e] = 0.0f;
        for (int c = 0; c < HS4; c += 4) {
            const float4 q4 = attention_load4(&q_tile[score_i][c]);
            const float4 do4 = attention_load4(&do_tile[score_i][c]);
            for (int e = 0; e < KEYS_PER_THREAD; e++) {
                const int jl = score_g + GROUPS * e;
                qk[e] += attention_dot4(q4, attention_load4(&k_tile[jl][c]));
                dp[e] += attention_dot4(do4, attention_load4(&v_tile[jl][c]));
            }
        }
        const int i = i0 + score_i;
        for (int e = 0; e < KEYS_PER_THREAD; e++) {
            const int jl = score_g + GROUPS * e;
            const int j = j0 + jl;
            const float p = (i < T && j <= i) ? expf(tau * qk[e] - lse_tile[score_i]) : 0.0f;
            pt_tile[jl][score_i] = p;
            dst_tile[jl][score_i] = p * (dp[e] - delta_tile[score_i]);
        }
        __syncthreads();

        // dV_j += sum_i P_ij dO_i, dK_j += sum_i dS_ij q_i (tau applied at the end), lane = channel
        for (int ii = 0; ii < BR; ii += 4) {
            float do_c[4][SLOTS], q_c[4][SLOTS];
            for (int x = 0; x < 4; x++) {
                for (int s = 0; s < SLOTS; s++) {
                    const int c = lane + 32 * s;
                    do_c[x][s] = c < HS ? do_tile[ii + x][c] : 0.0f;
                    q_c[x][s] = c < HS ? q_tile[ii + x][c] : 0.0f;
                }
            }
            for (int jj = 0; jj < KPW; jj++) {
                const float4 p4 = attention_load4(&pt_tile[key0 + jj][ii]);
                const float4 ds4 = attention_load4(&dst_tile[key0 + jj][ii]);
                for (int s = 0; s < SLOTS; s++) {
                    dv[jj][s] += p4.x * do_c[0][s] + p4.y * do_c[1][s] + p4.z * do_c[2][s] + p4.w * do_c[3][s];
                    dk[jj][s] += ds4.x * q_c[0][s] + ds4.y * q_c[1][s] + ds4.z * q_c[2][s] + ds4.w * q_c[3][s];
                }
            }
        }
    }

    for (int jj = 0; jj < KPW; jj++) {
        const int j = j0 + key0 + jj;
        if (j >= T) break;
        float* dk_out = dqkv + head + (size_t)j * C3 + C;
        float* dv_out = dk_out + C;
        for (int s = 0; s < SLOTS; s++) {
            const int c = lane + 32 * s;
            if (c < HS) {
                dk_out[c] += tau * dk[jj][s];
                dv_out[c] += dv[jj][s];
            }
        }
    }
}

// Backward, dQ. grid (ceil(T / Br), B * NH), block kAttentionTiledThreads.
template <class Tiles>
__global__ void __launch_bounds__(Tiles::threads)
    attention_backward_dq_tiled_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                       const float* delta, int B, int T, int C, int NH) {
    constexpr int BR = Tiles::backward_rows, BC = Tiles::backward_keys, LD = Tiles::ld, SLOTS = Tiles::slots;
    constexpr int GROUPS = Tiles::dq_groups;                   // score step: thread -> (key, query group)
    constexpr int ROWS_PER_THREAD = Tiles::dq_rows_per_thread;  // score step: queries of a thread
    constexpr int QPW = Tiles::dq_rows_per_warp;               // accumulation: queries per warp
    __align__(16) __shared__ float q_tile[BR][LD];   // (Br, HS) this block's queries
    __align__(16) __shared__ float do_tile[BR][LD];  // (Br, HS) their dO
    __align__(16) __shared__ float k_tile[BC][LD];   // (Bc, HS) keys of the current tile
    __align__(16) __shared__ float v_tile[BC][LD];   // (Bc, HS) values of the current tile
    __align__(16) __shared__ float ds_tile[BR][BC];  // (Br, Bc) dS
    __shared__ float lse_tile[BR], delta_tile[BR];
    static_assert(sizeof(q_tile) + sizeof(do_tile) + sizeof(k_tile) + sizeof(v_tile) + sizeof(ds_tile) +
                      sizeof(lse_tile) + sizeof(delta_tile) ==
                  Tiles::dq_shared_bytes);

    (void)B;  // the grid's y covers B * NH
    const int HS = C / NH, C3 = 3 * C, HS4 = (HS + 3) / 4 * 4;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BR;  // last query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float tau = attention_tau(HS);
    const size_t head = (size_t)b * T * C3 + (size_t)h * HS;
    const float* q = qkv + head;  // (T, HS), row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dy = dout + (size_t)b * T * C + (size_t)h * HS;  // (T, HS), row stride C

    attention_load_tile<BR, LD>(q_tile, q, C3, i0, T, HS, HS4);
    attention_load_tile<BR, LD>(do_tile, dy, C, i0, T, HS, HS4);
    attention_load_row_stats<BR>(lse_tile, delta_tile, lse + ((size_t)b * NH + h) * T,
                                 delta + ((size_t)b * NH + h) * T, i0, T);

    const int score_j = threadIdx.x % BC;  // score step: key of the tile
    const int score_g = threadIdx.x / BC;  // score step: queries score_g + GROUPS e
    const int row0 = warp * QPW;           // accumulation: this warp's queries of the tile

    float dq[QPW][SLOTS];
    for (int r = 0; r < QPW; r++) {
        for (int s = 0; s < SLOTS; s++) dq[r][s] = 0.0f;
    }

    const int i_last = min(i0 + BR, T) - 1;
    for (int j0 = 0; j0 <= i_last; j0 += BC) {
        __syncthreads();  // done with the previous tiles (and Q, dO, lse, Delta are written)
        attention_load_tile<BC, LD>(k_tile, k, C3, j0, T, HS, HS4);
        attention_load_tile<BC, LD>(v_tile, v, C3, j0, T, HS, HS4);
        __syncthreads();

        // dS for key j0 + score_j and ROWS_PER_THREAD queries
        float qk[ROWS_PER_THREAD], dp[ROWS_PER_THREAD];
        for (int e = 0; e < ROWS_PER_THREAD; e++) qk[e] = dp[e] = 0.0f;
        for (int c = 0; c < HS4; c += 4) {
            const float4 k4 = attention_load4(&k_tile[score_j][c]);
            const float4 v4 = attention_load4(&v_tile[score_j][c]);
            for (int e = 0; e < ROWS_PER_THREAD; e++) {
                const int il = score_g + GROUPS * e;
                qk[e] += attention_dot4(attention_load4(&q_tile[il][c]), k4);
                dp[e] += attention_dot4(attention_load4(&do_tile[il][c]), v4);
            }
        }
        const int j = j0 + score_j;
        for (int e = 0; e < ROWS_PER_THREAD; e++) {
            const int il = score_g + GROUPS * e;
            const int i = i0 + il;
            const float p = (i < T && j <= i) ? expf(tau * qk[e] - lse_tile[il]) : 0.0f;
            ds_tile[il][score_j] = p * (dp[e] - delta_tile[il]);
        }
        __syncthreads();

        // dQ_i += sum_j dS_ij k_j (tau applied at the end), lane = channel
        for (int jj = 0; jj < BC; jj += 4) {
            float k_c[4][SLOTS];
            for (int x = 0; x < 4; x++) {
                for (int s = 0; s < SLOTS; s++) {
                    const int c = lane + 32 * s;
                    k_c[x][s] = c < HS ? k_tile[jj + x][c] : 0.0f;
                }
            }
            for (int r = 0; r < QPW; r++) {
                const float4 ds4 = attention_load4(&ds_tile[row0 + r][jj]);
                for (int s = 0; s < SLOTS; s++)
                    dq[r][s] += ds4.x * k_c[0][s] + ds4.y * k_c[1][s] + ds4.z * k_c[2][s] + ds4.w * k_c[3][s];
            }
        }
    }

    for (int r = 0; r < QPW; r++) {
        const int i = i0 + row0 + r;
        if (i >= T) break;
        float* dq_out = dqkv + head + (size_t)i * C3;
        for (int s = 0; s < SLOTS; s++) {
            const int c = lane + 32 * s;
            if (c < HS) dq_out[c] += tau * dq[r][s];
        }
    }
}

// ---- tiled host launchers -------------------------------------------------------

template <class Tiles>
void attention_forward_tiled(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    const dim3 grid(ceil_div(T, Tiles::forward_rows), B * NH);
    launch(attention_forward_tiled_kernel<Tiles>, grid, Tiles::threads, 0, nullptr, out, lse, qkv, B, T, C, NH);
}

template <class Tiles>
void attention_backward_tiled(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta,
                              int B, int T, int C, int NH) {
    const dim3 dkv_grid(ceil_div(T, Tiles::backward_keys), B * NH);
    launch(attention_backward_dkv_tiled_kernel<Tiles>, dkv_grid, Tiles::threads, 0, nullptr, dqkv, dout, qkv, lse,
           delta, B, T, C, NH);
    const dim3 dq_grid(ceil_div(T, Tiles::backward_rows), B * NH);
    launch(attention_backward_dq_tiled_kernel<Tiles>, dq_grid, Tiles::threads, 0, nullptr, dqkv, dout, qkv, lse,
           delta, B, T, C, NH);
}

// Tiled forward for HS <= kAttentionTiledMaxHeadSize, the reference beyond.
// The tiled kernels put b*NH + h on the grid's y axis, which holds at most 65535.
constexpr int kAttentionMaxGridY = 65535;

inline void attention_forward_fp32(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    if (B * NH * T == 0) return;
    const int HS = C / NH;
    if (B * NH > kAttentionMaxGridY) {
        attention_forward_reference(out, lse, qkv, B, T, C, NH);
    } else if (HS <= AttentionTiles<64>::max_hs) {
        attention_forward_tiled<AttentionTiles<64>>(out, lse, qkv, B, T, C, NH);
    } else if (HS <= AttentionTiles<128>::max_hs) {
        attention_forward_tiled<AttentionTiles<128>>(out, lse, qkv, B, T, C, NH);
    } else {
        attention_forward_reference(out, lse, qkv, B, T, C, NH);
    }
}

// Tiled backward for HS <= kAttentionTiledMaxHeadSize, the reference beyond. Accumulates (+=) into dqkv.
inline void attention_backward_fp32(float* dqkv, const float* dout, const float* qkv, const float* out,
                                    const float* lse, int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    if (rows == 0) return;
    const int HS = C / NH;
    if (HS > kAttentionTiledMaxHeadSize || B * NH > kAttentionMaxGridY) {
        attention_backward_reference(dqkv, dout, qkv, out, lse, B, T, C, NH);
        return;
    }
    const float* delta = attention_backward_delta(dout, out, B, T, C, NH);
    if (HS <= AttentionTiles<64>::max_hs) {
        attention_backward_tiled<AttentionTiles<64>>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
    } else {
        attention_backward_tiled<AttentionTiles<128>>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
    }
}

}  // namespace knngpt::cuda
