// kernels/cuda/topk_index.cuh — exact causal top-k key search, fp32; twin of
// causal_topk_brute in kernels/cpu/topk_brute.h: the same lists, bit for bit.
// For batch b, head h and query i, with causal keys j = 0..i:
//   score(i, j) = attention_dot(q_i, k_j) (kernels/common/attention_score.h): acc = fmaf(q_d, k_jd, acc)
//   S_i         = the k keys ranked highest by (score desc, j asc)
// Row i of idx holds S_i sorted by ascending key index; rows with i + 1 <= k hold
// 0..i, then -1. Shapes: qkv (B, T, 3C) as in attention.cuh, HS = C / NH <=
// kTopkMaxHeadSize; idx (B, NH, T, k). Device pointers. Any k >= 1, any T; inputs
// must be finite (as for the CPU twin).
// Design: one warp per (b, h, i), a radix select of the k-th best score, scores
// recomputed on every pass (no score buffer): a simple first version.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

constexpr int kTopkThreads = 256;  // 8 warps, one query row each
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkRadixBins = 256;  // 8 bits per pass, 4 passes

// ---- CUDA kernels -------------------------------------------------------------
// One warp per (b, h, i), the query in shared memory; lanes stride over the keys,
// each lane computing whole scores (the sequential fma chain, so the scores equal
// the CPU's bit for bit). The scores are recomputed on every pass (O(T^2 HS) per
// head, like the CPU's brute force, times 5), and a lane reads whole key rows, so
// the loads are not coalesced.
//   select  a radix select finds the k-th best score: scores map to unsigned keys
//           with the same order (topk_order_key), and four passes of an 8-bit
//           histogram (shared memory, one per warp) fix the k-th best key byte by
//           byte, most significant first. At the end `thr` is the k-th best key and
//           `take` how many keys equal to thr belong to S_i (the rest rank above).
//   emit    a last pass over the keys in chunks of 32 consecutive indices keeps
//           the keys above thr and the first `take` keys equal to thr (ties go to
//           the smaller index), and writes them in index order with a warp ballot,
//           so the row comes out sorted.
// Only __syncwarp inside a warp; warps never wait for each other.

// A score as an unsigned key with the same order: for x >= 0 set the sign bit,
// for x < 0 flip every bit. -0 is made +0 first, so equal scores give equal keys.
__device__ __forceinline__ unsigned topk_order_key(float score) {
    if (score == 0.0f) score = 0.0f;
    const unsigned bits = __float_as_uint(score);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__global__ void causal_topk_brute_kernel(int* idx, const float* qkv, int B, int T, int C, int NH, int k) {
    __shared__ float q_shared[kTopkWarps][kTopkMaxHeadSize];
    __shared__ unsigned hist_shared[kTopkWarps][kTopkRadixBins];
    const int lane_id = threadIdx.x % 32;
    const int warp_in_block = threadIdx.x / 32;
    const int warp_index = blockIdx.x * kTopkWarps + warp_in_block;
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const AttentionRow row = attention_row(warp_index, T, NH);
    const int i = row.t, h = row.h, b = row.b;
    const int HS = C / NH;
    const int C3 = 3 * C;
    const int n = i + 1;  // causal keys 0..i
    int* idx_row = idx + (size_t)warp_index * k;  // warp_index = (b * NH + h) * T + i

    if (n <= k) {  // every key, then -1
        for (int s = lane_id; s < k; s += 32) idx_row[s] = s < n ? s : -1;
        return;
    }

    const float* head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const float* keys = head + C;  // key j at keys + j * C3
    float* q = q_shared[warp_in_block];
    unsigned* hist = hist_shared[warp_in_block];
    for (int d = lane_id; d < HS; d += 32) q[d] = head[(size_t)i * C3 + d];
    __syncwarp();

    // Radix select of the k-th largest order key. Invariant before each pass: the
    // k-th best key starts with `prefix` (on the bits of prefix_mask), and it is the
    // take-th largest among the keys that start with prefix.
    unsigned prefix = 0, prefix_mask = 0, take = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int bin = lane_id; bin < kTopkRadixBins; bin += 32) hist[bin] = 0;
        __syncwarp();
        for (int j = lane_id; j < n; j += 32) {
            const unsigned key = topk_order_key(attention_dot(q, keys + (size_t)j * C3, HS));
            if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncwarp();
        // Lane l owns the eight digits 255 - 8l .. 248 - 8l, high to low; an
        // inclusive scan over lanes counts the keys in digits at or above its group.
        unsigned count[8], group = 0;
        for (int s = 0; s < 8; s++) {
            count[s] = hist[255 - 8 * lane_id - s];
            group += count[s];
        }
        unsigned inclusive = group;
        for (int offset = 1; offset < 32; offset <<= 1) {
            const unsigned from_below = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
            if (lane_id >= offset) inclusive += from_below;
        }
        // the one lane whose group holds the take-th key finds its digit
        const bool owner = inclusive - group < take && take <= inclusive;
        unsigned digit = 0, above = 0;
        if (owner) {
            unsigned running = inclusive - group;
            for (int s = 0; s < 8; s++) {
                if (take <= running + count[s]) {
                    digit = 255 - 8 * lane_id - s;
                    above = running;
                    break;
                }
                running += count[s];
            }
        }
        const int owner_lane = __ffs((int)__ballot_sync(0xFFFFFFFFu, owner)) - 1;
        digit = __shfl_sync(0xFFFFFFFFu, digit, owner_lane);
        above = __shfl_sync(0xFFFFFFFFu, above, owner_lane);
        take -= above;
        prefix |= digit << shift;
        prefix_mask |= 255u << shift;
        __syncwarp();  // every lane has read hist before the next pass clears it
    }
    const unsigned thr = prefix;

    // Emit in index order: keys above thr, and the first `take` keys equal to thr.
    const unsigned lanes_below = (1u << lane_id) - 1u;
    int written = 0;
    unsigned equal_seen = 0;
    for (int base = 0; base < n; base += 32) {
        const int j = base + lane_id;
        unsigned key = 0;
        if (j < n) key = topk_order_key(attention_dot(q, keys + (size_t)j * C3, HS));
        const bool equal = j < n && key == thr;
        const unsigned equal_mask = __ballot_sync(0xFFFFFFFFu, equal);
        const bool chosen = (j < n && key > thr) || (equal && equal_seen + __popc(equal_mask & lanes_below) < take);
        const unsigned chosen_mask = __ballot_sync(0xFFFFFFFFu, chosen);
        if (chosen) idx_row[written + __popc(chosen_mask & lanes_below)] = j;
        written += __popc(chosen_mask);
        equal_seen += __popc(equal_mask);
    }
}

// ---- host launcher --------------------------------------------------------------

inline void causal_topk_brute(int* idx, const float* qkv, int B, int T, int C, int NH, int k) {
    if (B < 1 || T < 1 || NH < 1 || C % NH != 0 || k < 1 || C / NH > kTopkMaxHeadSize) {
        std::fprintf(stderr,
                     "causal_topk_brute: need B, T, NH >= 1, C %% NH == 0, k >= 1 and head size <= %d "
                     "(got B=%d T=%d C=%d NH=%d k=%d)\n",
                     kTopkMaxHeadSize, B, T, C, NH, k);
        std::exit(1);
    }
    const int rows = B * NH * T;
    launch(causal_topk_brute_kernel, ceil_div(rows, kTopkWarps), kTopkThreads, 0, nullptr, idx, qkv, B, T, C, NH,
           k);
}

}  // namespace knngpt::cuda
