// kernels/cuda/score_tiles.cuh — every causal score of a tile of queries, computed
// once, for the kernels that need whole rows of scores: the exact top-k search
// (topk_index.cuh) and the exact-row sampled gradient (sampled_grad.cuh). For batch b,
// head h, query i and key j <= i:
//   dot(i, j) = attention_dot(q_i, k_j) (kernels/common/attention_score.h):
//               acc = fmaf(q_d, k_jd, acc) over d = 0..HS-1 in order
// so every score equals the CPU's bit for bit (the same fma chain in the same
// order). Shapes: qkv (B, T, 3C) as in attention.cuh, head h of q at channel
// h * HS, of k at C + h * HS. Scores go to row buffers in global scratch.
// Design: a block of 8 warps owns a tile of 32 queries and stages the query tile and
// key tiles of 64 in shared memory, so each key value read serves 4 queries and each
// (broadcast) query value 2 keys; the grids are persistent, longest tiles first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace knngpt::cuda {

constexpr int kScoreTileThreads = 256;  // 8 warps
constexpr int kScoreTileWarps = kScoreTileThreads / 32;
constexpr int kScoreBlocksPerSm = 2;
constexpr int kScoreTileQueries = 32;                                     // queries of a block's tile
constexpr int kScoreQueriesPerThread = kScoreTileQueries / kScoreTileWarps;  // 4: w, w + 8, w + 16, w + 24
constexpr int kScoreTileKeys = 64;                                        // keys of a staged key tile
constexpr int kScoreKeysPerThread = kScoreTileKeys / 32;                  // 2: lane, lane + 32

// The floats between key rows of the staged key tile. Scalar reads (HS not fixed):
// an odd stride, so lane l's dimension d, at l * stride + d, falls in bank (l * stride +
// d) % 32, distinct over 32 lanes. float4 reads (HS % 4 == 0): a multiple of 4 whose
// quarter (float4s a row) is odd, so the 8 lanes of a quarter warp start in 8
// distinct groups of 4 banks.
__host__ __device__ constexpr int score_key_stride(int HS, bool vectorised) {
    return vectorised ? 4 * ((HS / 4) % 2 == 1 ? HS / 4 : HS / 4 + 1) : (HS % 2 == 1 ? HS : HS + 1);
}

// Shared memory of the query and key tiles, in floats.
__host__ __device__ constexpr size_t score_tile_floats(int HS, bool vectorised) {
    return (size_t)kScoreTileQueries * HS + (size_t)kScoreTileKeys * score_key_stride(HS, vectorised);
}

// rows x HS floats of qkv (row r at src + r * C3) into shared memory at dst + r * stride,
// rows >= valid as zeros; coalesced along HS, float4 at a time when vectorised.
template <bool kVectorised>
__device__ __forceinline__ void score_load_tile(float* dst, int stride, const float* src, int C3, int rows, int valid,
                                                int HS) {
    if constexpr (kVectorised) {
        const int per_row = HS / 4;
        for (int e = threadIdx.x; e < rows * per_row; e += kScoreTileThreads) {
            const int r = e / per_row, d = 4 * (e % per_row);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < valid) v = *reinterpret_cast<const float4*>(src + (size_t)r * C3 + d);
            *reinterpret_cast<float4*>(dst + r * stride + d) = v;
        }
    } else {
        for (int e = threadIdx.x; e < rows * HS; e += kScoreTileThreads) {
            const int r = e / HS, d = e % HS;
            dst[r * stride + d] = r < valid ? src[(size_t)r * C3 + d] : 0.0f;
        }
    }
}

// The query tile a persistent block takes as its item-th: longest rows first (the
// heads' last tiles, then the ones before).
struct ScoreTileItem {
    int b, h, bh;
    int i0;       // first query of the tile
    int queries;  // valid queries i0 .. i0 + queries - 1
    int n_tile;   // keys 0 .. n_tile - 1 serve the tile
};
__device__ __forceinline__ ScoreTileItem score_tile_item(int item, int B, int T, int NH) {
    const int tiles_per_head = ceil_div(T, kScoreTileQueries);
    ScoreTileItem it;
    it.bh = item % (B * NH);
    const int tile = tiles_per_head - 1 - item / (B * NH);
    it.b = it.bh / NH;
    it.h = it.bh % NH;
    it.i0 = tile * kScoreTileQueries;
    it.queries = min(kScoreTileQueries, T - it.i0);
    it.n_tile = it.i0 + it.queries;
    return it;
}

// A block of kScoreTileThreads = 256 threads (8 warps) owns a query tile of
// kScoreTileQueries = 32 queries of one (b, h). The query tile (32, HS) is loaded
// into shared memory once; key tiles of kScoreTileKeys = 64 keys (64, HS) follow, up
// to the tile's last query. Both loads are coalesced along HS (float4 when the head
// size is fixed, a multiple of 4, and qkv 16-byte aligned). Key rows sit at a padded
// stride (score_key_stride) so that 32 lanes reading one dimension of 32 keys (or one
// float4 of each, a quarter warp at a time) hit distinct banks. Thread (warp w,
// lane l) computes the 4 x 2 dots of queries w + 8r (r < 4) against keys l and l + 32
// of the key tile: a key value read from shared memory serves 4 queries and a
// (broadcast) query value 2 keys. Each dot goes to store(q_local, j, dot), with
// consecutive lanes on consecutive keys, so a store into a row buffer is coalesced.
//
// Every dot of the tile's queries against keys 0 .. n_tile - 1, each once, to
// store(q_local, j, dot) (for q_local = every row of the tile, valid or zero-padded,
// and j < n_tile). head: qkv at (b, 0, h * HS); q_tile (32, HS) and k_tile (64,
// score_key_stride) in shared memory; kHS > 0 fixes HS = kHS (float4 loads),
// kHS = 0 takes HS at run time. All threads call it; it ends after a barrier, so
// the stores are visible to the whole block when it returns.
template <int kHS, class Store>
__device__ void score_query_tile(float* q_tile, float* k_tile, const float* head, int C, int HS, int i0, int queries,
                                 int n_tile, Store store) {
    constexpr bool kVectorised = kHS > 0;
    if constexpr (kHS > 0) HS = kHS;
    const int C3 = 3 * C, lane_id = threadIdx.x % 32, warp_id = threadIdx.x / 32;
    const int q_stride = HS, k_stride = score_key_stride(HS, kVectorised);
    score_load_tile<kVectorised>(q_tile, q_stride, head + (size_t)i0 * C3, C3, kScoreTileQueries, queries, HS);
    for (int j0 = 0; j0 < n_tile; j0 += kScoreTileKeys) {
        __syncthreads();  // the previous key tile is read (and, first, the caller's use of the last tile's rows)
        score_load_tile<kVectorised>(k_tile, k_stride, head + C + (size_t)j0 * C3, C3, kScoreTileKeys,
                                     min(kScoreTileKeys, n_tile - j0), HS);
        __syncthreads();
        float acc[kScoreQueriesPerThread][kScoreKeysPerThread] = {};
        if constexpr (kVectorised) {
            for (int d = 0; d < HS; d += 4) {
                float4 kv[kScoreKeysPerThread];
                for (int c = 0; c < kScoreKeysPerThread; c++)
                    kv[c] = *reinterpret_cast<const float4*>(k_tile + (lane_id + 32 * c) * k_stride + d);
                for (int r = 0; r < kScoreQueriesPerThread; r++) {
                    const float4 qv =
                        *reinterpret_cast<const float4*>(q_tile + (warp_id + kScoreTileWarps * r) * q_stride + d);
                    for (int c = 0; c < kScoreKeysPerThread; c++) {  // attention_dot's chain, d ascending
                        acc[r][c] = fmaf(qv.x, kv[c].x, acc[r][c]);
                        acc[r][c] = fmaf(qv.y, kv[c].y, acc[r][c]);
                        acc[r][c] = fmaf(qv.z, kv[c].z, acc[r][c]);
                        acc[r][c] = fmaf(qv.w, kv[c].w, acc[r][c]);
                    }
                }
            }
        } else {
            for (int d = 0; d < HS; d++) {
                float kv[kScoreKeysPerThread];
                for (int c = 0; c < kScoreKeysPerThread; c++) kv[c] = k_tile[(lane_id + 32 * c) * k_stride + d];
                for (int r = 0; r < kScoreQueriesPerThread; r++) {
                    const float qd = q_tile[(warp_id + kScoreTileWarps * r) * q_stride + d];
                    for (int c = 0; c < kScoreKeysPerThread; c++) acc[r][c] = fmaf(qd, kv[c], acc[r][c]);
                }
            }
        }
        for (int r = 0; r < kScoreQueriesPerThread; r++)
            for (int c = 0; c < kScoreKeysPerThread; c++) {
                const int j = j0 + lane_id + 32 * c;
                if (j < n_tile) store(warp_id + kScoreTileWarps * r, j, acc[r][c]);
            }
    }
    __syncthreads();  // the rows are written (global memory, visible to the block after the barrier)
}

// ---- host side ------------------------------------------------------------------

// The row buffers are global scratch, one slice of 32 rows per resident block: the
// grids are persistent (kScoreBlocksPerSm blocks a SM), each block walking the query
// tiles blockIdx.x, + gridDim.x, ... of a longest-first order (score_tile_item).
// Size: 2 x SMs x 32 x round_up(T, 4) x 4 bytes, 33.8 KB x T with 132 SMs (35 MB at
// T = 1K, 554 MB at T = 16K); one buffer serves both kernels (they run one after the
// other on a stream).
// The row buffers, kept across calls (bytes; grown on demand).
inline void* score_rows_scratch(size_t bytes) {
    static DeviceScratch scratch;
    return scratch.get(bytes);
}

// Resident blocks of the persistent grids: kScoreBlocksPerSm per SM. A device that
// reports no SMs (the emulator) gets 3, so that blocks walk several tiles there too.
inline int score_resident_blocks() {
    static const int blocks = [] {
        int device = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        return prop.multiProcessorCount > 0 ? kScoreBlocksPerSm * prop.multiProcessorCount : 3;
    }();
    return blocks;
}

// Floats between rows of a row buffer: T rounded up to 4, so rows start 16-byte aligned.
inline int score_row_stride(int T) { return ceil_div(T, 4) * 4; }

}  // namespace knngpt::cuda
