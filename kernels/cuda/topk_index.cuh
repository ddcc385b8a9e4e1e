// kernels/cuda/topk_index.cuh — exact causal top-k key search, fp32; twin of
// causal_topk_brute in kernels/cpu/topk_brute.h: the same lists, bit for bit.
// For batch b, head h and query i, with causal keys j = 0..i:
//   score(i, j) = attention_dot(q_i, k_j) (kernels/common/attention_score.h): acc = fmaf(q_d, k_jd, acc)
//   S_i         = the k keys ranked highest by (score desc, j asc)
// Row i of idx holds S_i sorted by ascending key index; rows with i + 1 <= k hold
// 0..i, then -1. Shapes: qkv (B, T, 3C) as in attention.cuh, HS = C / NH <=
// kTopkMaxHeadSize; idx (B, NH, T, k). Device pointers. Any k >= 1, any T; inputs
// must be finite (as for the CPU twin).
//
// Design: a block owns a query tile of kTopkTileQueries = 32 queries of one (b, h)
// and works in two phases.
//   score   the query tile (32, HS) is loaded once into shared memory; key tiles of
//           kTopkTileKeys = 64 keys (64, HS) follow, up to the tile's last query.
//           Both loads are coalesced along HS (float4 when HS % 4 == 0). Key rows
//           sit at a padded stride (topk_key_stride) so that 32 lanes reading one
//           dimension of 32 keys (or one float4 of each, a quarter warp at a time)
//           hit distinct banks. Thread (warp w, lane l) computes the 4 x 2 scores of
//           queries w + 8r (r < 4) against keys l and l + 32 of the tile, each the
//           sequential fma chain over d = 0..HS-1 (attention_dot's, so equal to the
//           CPU's bit for bit); a key value read from shared memory serves 4 queries
//           and a (broadcast) query value 2 keys. Each score is computed once and
//           written, as an order key (topk_order_key), into the query's row of a
//           row buffer.
//   select  warp w then selects rows w, w + 8, w + 16, w + 24 of the tile from the
//           buffer: a radix select of the k-th best order key (four passes of an
//           8-bit histogram in shared memory, most significant byte first; `thr` is
//           the k-th best key, `take` how many keys equal to thr belong to S_i), then
//           an emit pass in chunks of 32 consecutive indices keeps the keys above thr
//           and the first `take` equal to thr (ties to the smaller index) and writes
//           them in index order with a warp ballot.
// The row buffer is global scratch, one slice per resident block: the grid is
// persistent (2 blocks per SM), each block walking the query tiles blockIdx.x,
// + gridDim.x, .. of a longest-first order (the last tiles of each head, the longest
// rows, first). Its budget: 2 x SMs x 32 x round_up(T, 4) x 4 bytes = 33.8 KB x T on
// an H200 (132 SMs): 35 MB at T = 1K (about L2's 50 MB), 554 MB at T = 16K. Rows of
// 32 x T x 4 bytes do not fit shared memory past T ~ 600 at two blocks per SM, hence
// global memory for every T (one code path).
//
// Templates: causal_topk_brute_kernel<HS> for HS = 8, 16, 32, 64, 128, 256 (fixed
// trip counts, float4 loads); <0> takes any HS <= 256 at run time with scalar loads
// (odd head sizes, or a qkv pointer not 16-byte aligned).
//
// Budget (sm_90, __launch_bounds__(256, 2): two blocks of 256 threads per SM, so at
// most 128 registers a thread). Shared memory, dynamic: query tile 32 x HS, key tile
// 64 x stride, histograms 8 x 256 words: 33.0 KB at HS 64 (8 + 17 + 8), 57.0 KB at
// HS 128, 105.0 KB at HS 256 (two blocks fit the 228 KB of an SM). `nvcc -Xptxas -v` (CUDA 13, sm_90):
// registers a thread 117 / 106 / 128 / 124 / 124 / 126 for HS 8 / 16 / 32 / 64 / 128 /
// 256, 94 for <0>; no spills, no stack, no static shared memory (the fixed head sizes
// unroll their loops and use up to the 128 the bounds allow).
//
// Cost at T = 16K, HS 64, per (b, h), on an H200 (~4.8 TB/s HBM, ~60 TFLOP/s fp32):
//   scores     T (T + 1) / 2 = 134M, 2 HS flops each: 17.2 GFLOP -> 0.29 ms at peak;
//              shared memory per warp per 4 dimensions: 2 float4 key reads (1 KB)
//              and 4 broadcast query reads for 32 fma, so ~60-70% of peak: ~0.45 ms
//   keys       each tile reads keys 0..i: 512 tiles x 8K keys x 256 B = 1.1 GB from
//              L2 (a head's keys, 4 MB, stay in L2); 4 MB of keys and queries from HBM
//   row buffer one 4-byte write and five reads (4 radix passes, 1 emit) per score:
//              3.2 GB -> 0.67 ms from HBM (554 MB of slices exceed L2 at this T)
//   total      0.7-1.1 ms per (b, h) (the memory-bound selection of some blocks
//              overlaps the compute-bound scoring of others): 8-13 ms for NH = 12.
//   For comparison, the exact forward at this shape is 4 HS T^2 / 2 x NH = 412 GFLOP:
//   ~1.4-2.7 ms on bf16 tensor cores at 150-300 TFLOP/s. The row buffer passes are
//   the larger half of the cost; building the first histogram while scoring and
//   compacting the candidates of the threshold's bucket would cut them to ~2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

constexpr int kTopkThreads = 256;  // 8 warps
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkBlocksPerSm = 2;
constexpr int kTopkTileQueries = 32;                                // queries of a block's tile
constexpr int kTopkQueriesPerThread = kTopkTileQueries / kTopkWarps;  // 4: w, w + 8, w + 16, w + 24
constexpr int kTopkTileKeys = 64;                                   // keys of a staged key tile
constexpr int kTopkKeysPerThread = kTopkTileKeys / 32;              // 2: lane, lane + 32
constexpr int kTopkRadixBins = 256;                                 // 8 bits per pass, 4 passes

// The floats between key rows of the staged key tile. Scalar reads (HS not fixed):
// an odd stride, so lane l's dimension d, at l * stride + d, falls in bank (l * stride +
// d) % 32, distinct over 32 lanes. float4 reads (HS % 4 == 0): a multiple of 4 whose
// quarter (float4s a row) is odd, so the 8 lanes of a quarter warp start in 8
// distinct groups of 4 banks.
__host__ __device__ constexpr int topk_key_stride(int HS, bool vectorised) {
    return vectorised ? 4 * ((HS / 4) % 2 == 1 ? HS / 4 : HS / 4 + 1) : (HS % 2 == 1 ? HS : HS + 1);
}

// Dynamic shared memory of a block: the query tile, the key tile, the histograms.
inline size_t topk_shared_bytes(int HS, bool vectorised) {
    return sizeof(float) * ((size_t)kTopkTileQueries * HS + (size_t)kTopkTileKeys * topk_key_stride(HS, vectorised)) +
           sizeof(unsigned) * kTopkWarps * kTopkRadixBins;
}

// ---- CUDA kernels -------------------------------------------------------------

// A score as an unsigned key with the same order: for x >= 0 set the sign bit,
// for x < 0 flip every bit. -0 is made +0 first, so equal scores give equal keys.
__device__ __forceinline__ unsigned topk_order_key(float score) {
    if (score == 0.0f) score = 0.0f;
    const unsigned bits = __float_as_uint(score);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// rows x HS floats of qkv (row r at src + r * C3) into shared memory at dst + r * stride,
// rows >= valid as zeros; coalesced along HS, float4 at a time when vectorised.
template <bool kVectorised>
__device__ __forceinline__ void topk_load_tile(float* dst, int stride, const float* src, int C3, int rows, int valid,
                                               int HS) {
    if constexpr (kVectorised) {
        const int per_row = HS / 4;
        for (int e = threadIdx.x; e < rows * per_row; e += kTopkThreads) {
            const int r = e / per_row, d = 4 * (e % per_row);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < valid) v = *reinterpret_cast<const float4*>(src + (size_t)r * C3 + d);
            *reinterpret_cast<float4*>(dst + r * stride + d) = v;
        }
    } else {
        for (int e = threadIdx.x; e < rows * HS; e += kTopkThreads) {
            const int r = e / HS, d = e % HS;
            dst[r * stride + d] = r < valid ? src[(size_t)r * C3 + d] : 0.0f;
        }
    }
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
// rows: the row buffer, gridDim.x slices of kTopkTileQueries x row_stride order keys.
template <int kHS>
__global__ void __launch_bounds__(kTopkThreads, kTopkBlocksPerSm)
    causal_topk_brute_kernel(int* idx, unsigned* rows, const float* qkv, int B, int T, int C, int NH, int k,
                             int row_stride) {
    constexpr bool kVectorised = kHS > 0;
    static_assert(kHS % 4 == 0, "fixed head sizes are multiples of 4");
    const int HS = kHS > 0 ? kHS : C / NH;
    const int C3 = 3 * C;
    const int lane_id = threadIdx.x % 32;
    const int warp_id = threadIdx.x / 32;
    const int q_stride = HS;
    const int k_stride = topk_key_stride(HS, kVectorised);
    KNNGPT_DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                                    // (32, HS)
    float* k_tile = q_tile + kTopkTileQueries * q_stride;      // (64, k_stride)
    unsigned* hist_all = reinterpret_cast<unsigned*>(k_tile + kTopkTileKeys * k_stride);  // (8, 256)
    unsigned* hist = hist_all + warp_id * kTopkRadixBins;
    unsigned* block_rows = rows + (size_t)blockIdx.x * kTopkTileQueries * row_stride;

    const int tiles_per_head = ceil_div(T, kTopkTileQueries);
    const int items = B * NH * tiles_per_head;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        // longest first: the heads' last tiles, then the ones before
        const int bh = item % (B * NH);
        const int tile = tiles_per_head - 1 - item / (B * NH);
        const int b = bh / NH, h = bh % NH;
        const int i0 = tile * kTopkTileQueries;
        const int queries = min(kTopkTileQueries, T - i0);  // valid queries i0 .. i0 + queries - 1
        const int n_tile = i0 + queries;                     // keys 0 .. n_tile - 1 serve the tile
        const float* head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
        int* idx_tile = idx + ((size_t)bh * T + i0) * k;

        // ---- score: every score of the tile once, into the row buffer
        if (n_tile > k) {  // else every row of the tile holds all its keys
            topk_load_tile<kVectorised>(q_tile, q_stride, head + (size_t)i0 * C3, C3, kTopkTileQueries, queries, HS);
            for (int j0 = 0; j0 < n_tile; j0 += kTopkTileKeys) {
                __syncthreads();  // the previous key tile is read (and, first, the previous item's rows)
                topk_load_tile<kVectorised>(k_tile, k_stride, head + C + (size_t)j0 * C3, C3, kTopkTileKeys,
                                            min(kTopkTileKeys, n_tile - j0), HS);
                __syncthreads();
                float acc[kTopkQueriesPerThread][kTopkKeysPerThread] = {};
                if constexpr (kVectorised) {
                    for (int d = 0; d < HS; d += 4) {
                        float4 kv[kTopkKeysPerThread];
                        for (int c = 0; c < kTopkKeysPerThread; c++)
                            kv[c] = *reinterpret_cast<const float4*>(k_tile + (lane_id + 32 * c) * k_stride + d);
                        for (int r = 0; r < kTopkQueriesPerThread; r++) {
                            const float4 qv =
                                *reinterpret_cast<const float4*>(q_tile + (warp_id + kTopkWarps * r) * q_stride + d);
                            for (int c = 0; c < kTopkKeysPerThread; c++) {  // attention_dot's chain, d ascending
                                acc[r][c] = fmaf(qv.x, kv[c].x, acc[r][c]);
                                acc[r][c] = fmaf(qv.y, kv[c].y, acc[r][c]);
                                acc[r][c] = fmaf(qv.z, kv[c].z, acc[r][c]);
                                acc[r][c] = fmaf(qv.w, kv[c].w, acc[r][c]);
                            }
                        }
                    }
                } else {
                    for (int d = 0; d < HS; d++) {
                        float kv[kTopkKeysPerThread];
                        for (int c = 0; c < kTopkKeysPerThread; c++) kv[c] = k_tile[(lane_id + 32 * c) * k_stride + d];
                        for (int r = 0; r < kTopkQueriesPerThread; r++) {
                            const float qd = q_tile[(warp_id + kTopkWarps * r) * q_stride + d];
                            for (int c = 0; c < kTopkKeysPerThread; c++) acc[r][c] = fmaf(qd, kv[c], acc[r][c]);
                        }
                    }
                }
                // consecutive lanes, consecutive keys: coalesced writes
                for (int r = 0; r < kTopkQueriesPerThread; r++)
                    for (int c = 0; c < kTopkKeysPerThread; c++) {
                        const int j = j0 + lane_id + 32 * c;
                        if (j < n_tile)
                            block_rows[(size_t)(warp_id + kTopkWarps * r) * row_stride + j] =
                                topk_order_key(acc[r][c]);
                    }
            }
            __syncthreads();  // the rows are written (global memory, visible to the block after the barrier)
        }

        // ---- select: warp w takes rows w, w + 8, w + 16, w + 24
        for (int r = 0; r < kTopkQueriesPerThread; r++) {
            const int q_local = warp_id + kTopkWarps * r;
            if (q_local >= queries) break;
            const int n = i0 + q_local + 1;  // causal keys 0..i
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

// The row buffer, kept across calls.
inline unsigned* topk_rows_scratch(size_t count) {
    static DeviceScratch scratch;
    return static_cast<unsigned*>(scratch.get(count * sizeof(unsigned)));
}

// Resident blocks of the persistent grid: kTopkBlocksPerSm per SM. A device that
// reports no SMs (the emulator) gets 3, so that blocks walk several tiles there too.
inline int topk_resident_blocks() {
    static const int blocks = [] {
        int device = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        return prop.multiProcessorCount > 0 ? kTopkBlocksPerSm * prop.multiProcessorCount : 3;
    }();
    return blocks;
}

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
    const int items = B * NH * ceil_div(T, kTopkTileQueries);
    const int blocks = items < topk_resident_blocks() ? items : topk_resident_blocks();
    const int row_stride = ceil_div(T, 4) * 4;
    unsigned* rows = topk_rows_scratch((size_t)blocks * kTopkTileQueries * row_stride);
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
