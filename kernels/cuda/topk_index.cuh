// kernels/cuda/topk_index.cuh — exact causal top-k key search, fp32; twin of
// causal_topk_brute in kernels/cpu/topk_brute.h: the same lists, bit for bit.
// For batch b, head h and query i, with causal keys j = 0..i:
//   score(i, j) = attention_dot(q_i, k_j) (kernels/common/attention_score.h): acc = fmaf(q_d, k_jd, acc)
//   S_i         = the k keys ranked highest by (score desc, j asc)
// Row i of idx holds S_i sorted by ascending key index; rows with i + 1 <= k hold
// 0..i, then -1. Shapes: qkv (B, T, 3C) as in attention.cuh, HS = C / NH <=
// kTopkMaxHeadSize; idx (B, NH, T, k). Device pointers. Any k >= 1, any T; inputs
// must be finite (as for the CPU twin). Nothing is saved for a backward.
//
// Design: a block owns a query tile of kScoreTileQueries = 32 queries of one (b, h)
// and works in two phases.
//   score   every score of the tile once (score_query_tile, kernels/cuda/score_tiles.cuh:
//           query and key tiles in shared memory, coalesced loads, a padded key stride,
//           4 queries x 2 keys a thread, attention_dot's fma chain), written as an order
//           key (topk_order_key) into the query's row of a row buffer.
//   select  warp w then selects rows w, w + 8, w + 16, w + 24 of the tile from the
//           buffer: a radix select of the k-th best order key (four passes of an
//           8-bit histogram in shared memory, most significant byte first; `thr` is
//           the k-th best key, `take` how many keys equal to thr belong to S_i), then
//           an emit pass in chunks of 32 consecutive indices keeps the keys above thr
//           and the first `take` equal to thr (ties to the smaller index) and writes
//           them in index order with a warp ballot.
// The one decision that matters: the scores are fp32 on CUDA cores, attention_dot's chain,
// so that the lists are the CPU's bit for bit. The row buffer (score_tiles.cuh) is global
// scratch, one slice of 32 rows per resident block of a persistent grid walking the tiles
// longest first: rows of 32 x T x 4 bytes do not fit shared memory past T ~ 600 at two
// blocks per SM, so every T takes the one global-memory path.
//
// Templates: causal_topk_brute_kernel<HS> for HS = 8, 16, 32, 64, 128, 256 (fixed
// trip counts, float4 loads); <0> takes any HS <= 256 at run time with scalar loads
// (odd head sizes, or a qkv pointer not 16-byte aligned). Dynamic shared memory per
// block: query tile 32 x HS, key tile 64 x stride, histograms 8 x 256 words
// (topk_shared_bytes), under __launch_bounds__(256, 2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"
#include "kernels/cuda/score_tiles.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

constexpr int kTopkThreads = kScoreTileThreads;
constexpr int kTopkWarps = kScoreTileWarps;
constexpr int kTopkRadixBins = 256;  // 8 bits per pass, 4 passes

// Dynamic shared memory of a block: the query and key tiles, the histograms.
inline size_t topk_shared_bytes(int HS, bool vectorised) {
    return sizeof(float) * score_tile_floats(HS, vectorised) + sizeof(unsigned) * kTopkWarps * kTopkRadixBins;
}

// ---- CUDA kernels -------------------------------------------------------------

// A score as an unsigned key with the same order: for x >= 0 set the sign bit,
// for x < 0 flip every bit. -0 is made +0 first, so equal scores give equal keys.
__device__ __forceinline__ unsigned topk_order_key(float score) {
    if (score == 0.0f) score = 0.0f;
    const unsigned bits = __float_as_uint(score);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Radix select and emit of one row (see the header): the first n order keys of `row`
// (n > k), k slots of idx_row, hist the warp's 256 bins.
__device__ void topk_select_row(int* idx_row, const unsigned* row, int n, int k, unsigned* hist, int lane_id) {
    // Invariant before each pass: the k-th best key starts with `prefix` (on the bits
    // of prefix_mask), and it is the take-th largest among the keys that start with prefix.
    unsigned prefix = 0, prefix_mask = 0, take = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int bin = lane_id; bin < kTopkRadixBins; bin += 32) hist[bin] = 0;
        __syncwarp();
        // four keys a lane at a time (rows start 16-byte aligned, a row's stride is
        // a multiple of 4, so the uint4 stays inside the row; entries >= n are skipped)
        for (int j = 4 * lane_id; j < n; j += 128) {
            const uint4 four = *reinterpret_cast<const uint4*>(row + j);
            const unsigned keys[4] = {four.x, four.y, four.z, four.w};
            for (int u = 0; u < 4; u++)
                if (j + u < n && (keys[u] & prefix_mask) == prefix) atomicAdd(&hist[(keys[u] >> shift) & 255u], 1u);
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
        const unsigned key = j < n ? row[j] : 0u;
        const bool equal = j < n && key == thr;
        const unsigned equal_mask = __ballot_sync(0xFFFFFFFFu, equal);
        const bool chosen = (j < n && key > thr) || (equal && equal_seen + __popc(equal_mask & lanes_below) < take);
        const unsigned chosen_mask = __ballot_sync(0xFFFFFFFFu, chosen);
        if (chosen) idx_row[written + __popc(chosen_mask & lanes_below)] = j;
        written += __popc(chosen_mask);
        equal_seen += __popc(equal_mask);
    }
}

// kHS > 0: HS = kHS (a multiple of 4; float4 loads); kHS = 0: HS = C / NH, scalar loads.
// rows: the row buffer, gridDim.x slices of kScoreTileQueries x row_stride order keys.
template <int kHS>
__global__ void __launch_bounds__(kTopkThreads, kScoreBlocksPerSm)
    causal_topk_brute_kernel(int* idx, unsigned* rows, const float* qkv, int B, int T, int C, int NH, int k,
                             int row_stride) {
    static_assert(kHS % 4 == 0, "fixed head sizes are multiples of 4");
    const int HS = kHS > 0 ? kHS : C / NH;
    const int lane_id = threadIdx.x % 32;
    const int warp_id = threadIdx.x / 32;
    KNNGPT_DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                                   // (32, HS)
    float* k_tile = q_tile + kScoreTileQueries * HS;          // (64, score_key_stride)
    unsigned* hist_all = reinterpret_cast<unsigned*>(shared + score_tile_floats(HS, kHS > 0));  // (8, 256)
    unsigned* hist = hist_all + warp_id * kTopkRadixBins;
    unsigned* block_rows = rows + (size_t)blockIdx.x * kScoreTileQueries * row_stride;

    const int items = B * NH * ceil_div(T, kScoreTileQueries);
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const ScoreTileItem it = score_tile_item(item, B, T, NH);
        const float* head = qkv + (size_t)it.b * T * 3 * C + (size_t)it.h * HS;
        int* idx_tile = idx + ((size_t)it.bh * T + it.i0) * k;

        // ---- score: every score of the tile once, into the row buffer
        if (it.n_tile > k)  // else every row of the tile holds all its keys
            score_query_tile<kHS>(q_tile, k_tile, head, C, HS, it.i0, it.queries, it.n_tile,
                                  [&](int q_local, int j, float dot) {
                                      block_rows[(size_t)q_local * row_stride + j] = topk_order_key(dot);
                                  });

        // ---- select: warp w takes rows w, w + 8, w + 16, w + 24
        for (int r = 0; r < kScoreQueriesPerThread; r++) {
            const int q_local = warp_id + kTopkWarps * r;
            if (q_local >= it.queries) break;
            const int n = it.i0 + q_local + 1;  // causal keys 0..i
            int* idx_row = idx_tile + (size_t)q_local * k;
            if (n <= k) {  // every key, then -1
                for (int s = lane_id; s < k; s += 32) idx_row[s] = s < n ? s : -1;
            } else {
                topk_select_row(idx_row, block_rows + (size_t)q_local * row_stride, n, k, hist, lane_id);
            }
        }
        __syncthreads();  // every warp is done with the rows before the next item's scores
    }
}

// ---- host launcher --------------------------------------------------------------

template <int kHS>
void causal_topk_brute_launch(int* idx, const float* qkv, int B, int T, int C, int NH, int k) {
    const int HS = C / NH;
    const size_t shared_bytes = topk_shared_bytes(HS, kHS > 0);
    static size_t allowed = kDefaultSharedBytes;
    if (shared_bytes > allowed) {
        CUDA_CHECK(cudaFuncSetAttribute(causal_topk_brute_kernel<kHS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
        allowed = shared_bytes;
    }
    const int items = B * NH * ceil_div(T, kScoreTileQueries);
    const int blocks = items < score_resident_blocks() ? items : score_resident_blocks();
    const int row_stride = score_row_stride(T);
    unsigned* rows = static_cast<unsigned*>(score_rows_scratch((size_t)blocks * kScoreTileQueries * row_stride * sizeof(unsigned)));
    launch(causal_topk_brute_kernel<kHS>, blocks, kTopkThreads, shared_bytes, nullptr, idx, rows, qkv, B, T, C, NH, k,
           row_stride);
}

inline void causal_topk_brute(int* idx, const float* qkv, int B, int T, int C, int NH, int k) {
    if (B < 1 || T < 1 || NH < 1 || C % NH != 0 || k < 1 || C / NH > kTopkMaxHeadSize) {
        std::fprintf(stderr,
                     "causal_topk_brute: need B, T, NH >= 1, C %% NH == 0, k >= 1 and head size <= %d "
                     "(got B=%d T=%d C=%d NH=%d k=%d)\n",
                     kTopkMaxHeadSize, B, T, C, NH, k);
        std::exit(1);
    }
    // the fixed head sizes load float4s: they need qkv 16-byte aligned
    const bool aligned = reinterpret_cast<uintptr_t>(qkv) % 16 == 0;
    switch (aligned ? C / NH : 0) {
        case 8: return causal_topk_brute_launch<8>(idx, qkv, B, T, C, NH, k);
        case 16: return causal_topk_brute_launch<16>(idx, qkv, B, T, C, NH, k);
        case 32: return causal_topk_brute_launch<32>(idx, qkv, B, T, C, NH, k);
        case 64: return causal_topk_brute_launch<64>(idx, qkv, B, T, C, NH, k);
        case 128: return causal_topk_brute_launch<128>(idx, qkv, B, T, C, NH, k);
        case 256: return causal_topk_brute_launch<256>(idx, qkv, B, T, C, NH, k);
        default: return causal_topk_brute_launch<0>(idx, qkv, B, T, C, NH, k);
    }
}

}  // namespace knngpt::cuda
