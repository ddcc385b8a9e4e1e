// kernels/cuda/attention_bf16.cuh — exact causal multi-head attention on tensor
// cores: the math, shapes, saved lse and += of attention_forward_fp32 /
// attention_backward_fp32 (kernels/cuda/attention.cuh, twin of kernels/cpu/attention.h),
// with bf16 operands and fp32 accumulation and softmax (nvcuda::wmma 16x16x16).
// HS = C / NH a multiple of kAttentionBf16HeadSizeStep up to
// kAttentionBf16MaxHeadSize (head_size.cuh, checked on the host); any T.
// The trainer does not run these kernels: they are the tested reference of the
// register-level kernels of attention_mma.cuh, which share their roundings.
// Design: the FlashAttention-2 tiling of attention.cuh with 64 x 64 tiles, each
// warp owning 16 rows of its block's tile so that all its wmma products stay on
// its own rows; kernels instantiated per HS (AttentionBf16Tiles<HS>), so the
// fragment arrays have compile-time sizes and live in registers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"

namespace knngpt::cuda {

// Kernels. 128 threads = 4 warps per block, one block per (tile, b*NH + h) =
// (blockIdx.x, blockIdx.y). Tiles are in dynamic shared memory (above 48 KB for
// the larger head sizes, hence cudaFuncSetAttribute); bf16 rows are padded by 8
// elements and fp32 rows by 4, which keeps every wmma pointer 32-byte aligned and
// spreads rows over banks.
//   forward   a block owns 64 queries; Q (64, HS) is loaded once; it walks key
//             tiles of 64 up to its last query, loading K, V (64, HS). Warp w:
//               S_w = Q_w K^T (16 x 64) by wmma, stored to shared fp32;
//               online softmax per row in fp32 (lane = key, warp reductions):
//                 m' = max(m, max_j s_j), alpha = e^(m - m'),
//                 l' = alpha l + sum_j e^(s_j - m'), P_j = e^(s_j - m') as bf16;
//               O_w (16, HS) kept in shared fp32: each row scaled by its alpha
//               by the lanes, then O_w += P_w V by wmma with the accumulator
//               loaded from and stored back to shared memory.
//             The per-row rescale is why O lives in shared memory: a fragment's
//             element-to-row map is opaque, so only uniform operations on
//             fragments are portable. At the end out = O / l, lse = m + log l.
//   backward  three kernels, no atomics, deterministic:
//             1. Delta_i = dO_i . O_i in fp32 (the kernel of attention.cuh);
//             2. dK, dV: a block owns 64 keys (warp w 16 of them, K_w, V_w), walks
//                the query tiles of 64 that reach them; per tile warp w forms
//                S^T = K_w Q^T and dP^T = V_w dO^T (16 x 64) by wmma, then P^T
//                and dS^T in fp32 and rounds them to bf16, then
//                dV_w += P^T dO and dK_w += dS^T Q with accumulator fragments
//                kept in registers across the whole walk (no rescale needed);
//             3. dQ: a block owns 64 queries, walks the key tiles of 64 up to the
//                causal limit: S = Q_w K^T, dP = dO_w V^T, dS, dQ_w += dS K.
//             Results leave the accumulators through a per-warp fp32 staging
//             tile and are added (times tau for dQ, dK) to dqkv by the lanes.
//
// Numerics and error model. The kernels round Q, K, V, dO to bf16 (round to
// nearest even) when loading tiles, and P, dS where they are GEMM operands;
// every product of two bf16 numbers is exact in fp32 and every sum is fp32.
// The forward and the backward form S from the SAME bf16 q, k with the same
// fp32 sums, so the backward's P = exp(S - lse) is the forward's P (to fp32
// rounding): the softmax statistics m, l, lse come from the fp32 scores and
// the fp32 e^(s - m); P is rounded only as the operand of P V. Each rounded
// operand carries a relative error <= 2^-8 (u = 2^-8 ~ 3.9e-3: 8 significant
// bits, half a unit in the last place), so
//   s_ij errs by d_ij <= 2u tau sum_c |q_ic k_jc| (about 2u times the
//   score scale), which moves lse_i by <= max_j d_ij and P_ij by a relative
//   <= ~2 max_j d_ij;
//   o_i = sum_j P_ij v_j then errs by <= ~(2 max_j d_ij + 2u) max|v|, the
//   rounding of P and of v adding u each;
//   the gradients are sums of such products with one or two more rounded
//   operands (dO, dS) and a cancellation in dP - Delta.
// With O(1) inputs and scores of a few units this is a few u relative to the
// largest entry. The tests use 1e-2 (~2.6u) against the fp32 CPU twin, and
// see 2.5e-3 .. 4.5e-3 (0.6u .. 1.2u) for out, lse, dq, dk, dv. They also
// check the structure sharply: the lse equals (to 1e-5) the fp32 lse of bf16-rounded q, k; the
// output differs from the fp32 attention of bf16-rounded q, k, v by at most
// u max|v| (the only remaining error, the rounding of P >= 0, is a relative
// error <= u in each term of a convex combination of the v_j); and dV differs
// from the fp32 dV of bf16-rounded q, k, v, dO (same lse) by at most
// u max|dO| max_j sum_i P_ij, for the same reason.

constexpr int kAttentionBf16Warps = 4;

// Every tile dimension, row stride and shared-memory offset of the kernels for
// head size HS; the kernels take one of these as their template parameter.
template <int HS>
struct AttentionBf16Tiles {
    static_assert(HS % kAttentionBf16HeadSizeStep == 0 && HS >= kAttentionBf16HeadSizeStep &&
                      HS <= kAttentionBf16MaxHeadSize,
                  "head size");
    static constexpr int hs = HS;
    static constexpr int warps = kAttentionBf16Warps;
    static constexpr int threads = 32 * warps;
    static constexpr int frag = 16;                 // the wmma tile: 16 x 16 x 16 products
    static constexpr int warp_rows = frag;          // rows of the block's tile a warp owns
    static constexpr int rows = warp_rows * warps;  // the block's own tile: 64 queries (keys for dK, dV)
    static constexpr int cols = 64;                 // the tile it walks: 64 keys (queries for dK, dV)
    static constexpr int cols_per_lane = cols / 32; // softmax step: lane holds columns lane + 32 e
    static constexpr int hs_frags = HS / frag;      // 16-channel slices of the head
    static constexpr int col_frags = cols / frag;
    static_assert(HS % frag == 0 && cols % 32 == 0 && warp_rows <= 32, "tile shape");
    static_assert(rows == cols, "one size for every (64, HS) tile and the lse and Delta tiles");

    // Row strides (elements) in shared memory. Multiples of 8 (bf16) and 4
    // (fp32) as wmma requires; 16 rows of each are a multiple of 32 bytes.
    static constexpr int ldh = HS + 8;    // bf16 (rows, HS) tiles
    static constexpr int lds = cols + 4;  // fp32 (rows, cols) score tiles
    static constexpr int ldp = cols + 8;  // bf16 (rows, cols) P / dS tiles
    static constexpr int ldo = HS + 4;    // fp32 (rows, HS) output tile
    static constexpr size_t head_tile = (size_t)rows * ldh * 2;  // bytes
    static constexpr size_t score_tile = (size_t)rows * lds * 4;
    static constexpr size_t p_tile = (size_t)rows * ldp * 2;
    static constexpr size_t out_tile = (size_t)rows * ldo * 4;

    // forward: Q, K, V, S, P, O
    static constexpr size_t forward_s = 3 * head_tile;
    static constexpr size_t forward_p = forward_s + score_tile;
    static constexpr size_t forward_o = forward_p + p_tile;
    static constexpr size_t forward_bytes = forward_o + out_tile;
    // backward (either kernel): 4 head tiles, 2 score tiles, 2 P tiles, lse and Delta
    static constexpr size_t backward_score = 4 * head_tile;
    static constexpr size_t backward_p = backward_score + 2 * score_tile;
    static constexpr size_t backward_stats = backward_p + 2 * p_tile;
    static constexpr size_t backward_bytes = backward_stats + 2 * (size_t)cols * 4;

    // the operands: A row-major, B^T (a row-major tile read as col_major) and B, fp32 accumulators
    template <typename Use, typename Layout>
    using Frag = nvcuda::wmma::fragment<Use, frag, frag, frag, __nv_bfloat16, Layout>;
    using FragA = Frag<nvcuda::wmma::matrix_a, nvcuda::wmma::row_major>;
    using FragBt = Frag<nvcuda::wmma::matrix_b, nvcuda::wmma::col_major>;
    using FragB = Frag<nvcuda::wmma::matrix_b, nvcuda::wmma::row_major>;
    using FragAcc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, frag, frag, frag, float>;
};

// The array of type T at byte offset `at` of the block's dynamic shared memory.
template <typename T>
__device__ __forceinline__ T* attention_bf16_smem(unsigned char* smem, size_t at) {
    return reinterpret_cast<T*>(smem + at);
}

// Copies rows row0 .. row0+ROWS-1 of one head's (T, HS) slice of src (row
// stride src_stride) into the bf16 tile (ROWS, Tile::ldh), rounding to nearest
// even; zeros for rows >= T. All threads take part; the caller synchronises.
// Each thread moves 4 consecutive channels (HS is a multiple of 16): one 16-byte
// load where src and its stride keep float4 alignment (always for the model's
// activations, whose row strides 3C and C are multiples of 4: then one warp reads
// 512 contiguous bytes), else four scalar loads. Either way the same values land.
template <class Tile, int ROWS>
__device__ void attention_bf16_load_tile(__nv_bfloat16* tile, const float* src, int src_stride, int row0, int T) {
    constexpr int HS = Tile::hs, QUADS = HS / 4;
    const bool vector_loads = reinterpret_cast<uintptr_t>(src) % 16 == 0 && src_stride % 4 == 0;
    for (int idx = threadIdx.x; idx < ROWS * QUADS; idx += blockDim.x) {
        const int r = idx / QUADS, c = 4 * (idx % QUADS);
        const int t = row0 + r;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < T) {
            const float* from = src + (size_t)t * src_stride + c;
            x = vector_loads ? *reinterpret_cast<const float4*>(from) : make_float4(from[0], from[1], from[2], from[3]);
        }
        __nv_bfloat16* to = tile + r * Tile::ldh + c;
        to[0] = __float2bfloat16(x.x);
        to[1] = __float2bfloat16(x.y);
        to[2] = __float2bfloat16(x.z);
        to[3] = __float2bfloat16(x.w);
    }
}

// dst (16 x 16 fp32, row stride Tile::lds) = A B^T over the head's channels,
// for A and B two (16, HS) row slices of bf16 tiles (row stride Tile::ldh).
template <class Tile>
__device__ __forceinline__ void attention_bf16_store_abt(float* dst, const __nv_bfloat16* a_rows,
                                                         const __nv_bfloat16* b_rows, typename Tile::FragA& a,
                                                         typename Tile::FragBt& bt, typename Tile::FragAcc& acc) {
    using namespace nvcuda;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < Tile::hs_frags; kk++) {
        wmma::load_matrix_sync(a, a_rows + Tile::frag * kk, Tile::ldh);
        wmma::load_matrix_sync(bt, b_rows + Tile::frag * kk, Tile::ldh);
        wmma::mma_sync(acc, a, bt, acc);
    }
    wmma::store_matrix_sync(dst, acc, Tile::lds, wmma::mem_row_major);
}

// ---- forward ----------------------------------------------------------------------

// grid (ceil(T / Tile::rows), B * NH), block Tile::threads, dynamic shared
// memory Tile::forward_bytes.
template <class Tile>
__global__ void __launch_bounds__(Tile::threads)
    attention_forward_bf16_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH) {
    using namespace nvcuda;
    constexpr int HS = Tile::hs, BR = Tile::rows, BC = Tile::cols, F = Tile::frag;
    constexpr int NF = Tile::hs_frags, WR = Tile::warp_rows, LANE_COLS = Tile::cols_per_lane;
    KNNGPT_DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* q_tile = attention_bf16_smem<__nv_bfloat16>(smem, 0);                   // (64, HS)
    __nv_bfloat16* k_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::head_tile);     // (64, HS)
    __nv_bfloat16* v_tile = attention_bf16_smem<__nv_bfloat16>(smem, 2 * Tile::head_tile); // (64, HS)
    float* s_tile = attention_bf16_smem<float>(smem, Tile::forward_s);                     // (64, 64) scores
    __nv_bfloat16* p_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::forward_p);
    float* o_tile = attention_bf16_smem<float>(smem, Tile::forward_o);  // (64, HS)

    const int C3 = 3 * C;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BR;  // last (longest) query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = WR * warp;  // this warp's rows of the tile
    const float tau = attention_tau(HS);
    const float* q = qkv + (size_t)b * T * C3 + (size_t)h * HS;  // (T, HS), row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* s_w = s_tile + row0 * Tile::lds;
    __nv_bfloat16* p_w = p_tile + row0 * Tile::ldp;
    float* o_w = o_tile + row0 * Tile::ldo;

    attention_bf16_load_tile<Tile, BR>(q_tile, q, C3, i0, T);
    for (int idx = lane; idx < WR * HS; idx += 32) o_w[(idx / HS) * Tile::ldo + idx % HS] = 0.0f;

    // running max and sum of the warp's row r, kept by lane r (r < 16) and
    // passed to the other lanes by shuffles
    float m_own = -INFINITY, l_own = 0.0f;

    typename Tile::FragA a;
    typename Tile::FragBt bt;
    typename Tile::FragB bn;
    typename Tile::FragAcc acc;

    const int i_last = min(i0 + BR, T) - 1;
    for (int j0 = 0; j0 <= i_last; j0 += BC) {
        __syncthreads();  // everyone is done with the previous K, V (and Q is written)
        attention_bf16_load_tile<Tile, BC>(k_tile, k, C3, j0, T);
        attention_bf16_load_tile<Tile, BC>(v_tile, v, C3, j0, T);
        __syncthreads();

        // S_w = Q_w K^T, (16, 64): K read as a col_major (HS, 64) matrix
        for (int jn = 0; jn < Tile::col_frags; jn++)
            attention_bf16_store_abt<Tile>(s_w + F * jn, q_tile + row0 * Tile::ldh, k_tile + (F * jn) * Tile::ldh, a,
                                           bt, acc);
        __syncwarp();  // S_w complete before the lanes read it

        // online softmax, one row at a time: lane holds keys lane and lane + 32
        for (int r = 0; r < WR; r++) {
            const int i = i0 + row0 + r;
            float s[LANE_COLS];
            float tile_max = -INFINITY;
            for (int e = 0; e < LANE_COLS; e++) {
                const int jl = lane + 32 * e, j = j0 + jl;
                s[e] = (j <= i && j < T) ? tau * s_w[r * Tile::lds + jl] : -INFINITY;
                tile_max = fmaxf(tile_max, s[e]);
            }
            // the first tile holds key 0 <= i, so m is finite from then on
            const float m_old = __shfl_sync(0xFFFFFFFFu, m_own, r);
            const float l_old = __shfl_sync(0xFFFFFFFFu, l_own, r);
            const float m_new = fmaxf(m_old, warp_reduce_max(tile_max));
            const float alpha = expf(m_old - m_new);
            float sum = 0.0f;
            for (int e = 0; e < LANE_COLS; e++) {
                const float p = expf(s[e] - m_new);  // 0 for masked keys
                sum += p;
                p_w[r * Tile::ldp + lane + 32 * e] = __float2bfloat16(p);
            }
            const float l_new = alpha * l_old + warp_reduce_sum(sum);
            if (lane == r) {
                m_own = m_new;
                l_own = l_new;
            }
            for (int c = lane; c < HS; c += 32) o_w[r * Tile::ldo + c] *= alpha;
        }
        __syncwarp();  // P_w and the rescaled O_w complete before the wmma loads

        // O_w += P_w V, (16, HS): accumulator through shared memory
        for (int n = 0; n < NF; n++) {
            wmma::load_matrix_sync(acc, o_w + F * n, Tile::ldo, wmma::mem_row_major);
            for (int kk = 0; kk < Tile::col_frags; kk++) {
                wmma::load_matrix_sync(a, p_w + F * kk, Tile::ldp);
                wmma::load_matrix_sync(bn, v_tile + (F * kk) * Tile::ldh + F * n, Tile::ldh);
                wmma::mma_sync(acc, a, bn, acc);
            }
            wmma::store_matrix_sync(o_w + F * n, acc, Tile::ldo, wmma::mem_row_major);
        }
        __syncwarp();  // O_w stored before the lanes rescale it
    }

    for (int r = 0; r < WR; r++) {
        const int i = i0 + row0 + r;
        if (i >= T) break;  // padding rows are never written (the whole warp leaves together)
        const float m_r = __shfl_sync(0xFFFFFFFFu, m_own, r), l_r = __shfl_sync(0xFFFFFFFFu, l_own, r);
        float* y = out + ((size_t)b * T + i) * C + (size_t)h * HS;
        const float inv_l = 1.0f / l_r;
        for (int c = lane; c < HS; c += 32) y[c] = o_w[r * Tile::ldo + c] * inv_l;
        if (lane == 0) lse[((size_t)b * NH + h) * T + i] = m_r + logf(l_r);
    }
}

// ---- backward -----------------------------------------------------------------------

// Writes the 16 x 16 accumulator tile acc, times scale, added to dst (row
// stride ld) for rows row0 .. of at most rows_left valid rows, through the
// warp's fp32 staging tile (16 x 16, row stride Tile::lds).
template <class Tile>
__device__ void attention_bf16_add_tile(float* dst, size_t ld, int rows_left, const typename Tile::FragAcc& acc,
                                        float scale, float* staging) {
    constexpr int F = Tile::frag;
    const int lane = threadIdx.x % 32;
    __syncwarp();  // earlier reads of the staging tile are done
    nvcuda::wmma::store_matrix_sync(staging, acc, Tile::lds, nvcuda::wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < F * F; idx += 32) {
        const int r = idx / F, c = idx % F;
        if (r < rows_left) dst[(size_t)r * ld + c] += scale * staging[r * Tile::lds + c];
    }
}

// dK, dV. grid (ceil(T / Tile::rows), B * NH), block Tile::threads, dynamic
// shared memory Tile::backward_bytes.
template <class Tile>
__global__ void __launch_bounds__(Tile::threads)
    attention_backward_dkv_bf16_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                       const float* delta, int T, int C, int NH) {
    using namespace nvcuda;
    constexpr int HS = Tile::hs, F = Tile::frag, NF = Tile::hs_frags, WR = Tile::warp_rows;
    constexpr int BK = Tile::rows, BQ = Tile::cols;  // keys of the block, queries of a tile
    KNNGPT_DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* k_tile = attention_bf16_smem<__nv_bfloat16>(smem, 0);                    // (64 keys, HS)
    __nv_bfloat16* v_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::head_tile);
    __nv_bfloat16* q_tile = attention_bf16_smem<__nv_bfloat16>(smem, 2 * Tile::head_tile);  // (64 queries, HS)
    __nv_bfloat16* do_tile = attention_bf16_smem<__nv_bfloat16>(smem, 3 * Tile::head_tile);
    float* st_tile = attention_bf16_smem<float>(smem, Tile::backward_score);  // (64 keys, 64 queries)
    float* dpt_tile = attention_bf16_smem<float>(smem, Tile::backward_score + Tile::score_tile);
    __nv_bfloat16* pt_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::backward_p);
    __nv_bfloat16* dst_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::backward_p + Tile::p_tile);
    float* lse_tile = attention_bf16_smem<float>(smem, Tile::backward_stats);
    float* delta_tile = lse_tile + BQ;

    const int C3 = 3 * C;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int j0 = blockIdx.x * BK;  // the first key tile (the most queries) first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key0 = WR * warp;  // this warp's keys of the tile
    const float tau = attention_tau(HS);
    const size_t head = (size_t)b * T * C3 + (size_t)h * HS;
    const float* q = qkv + head;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dy = dout + (size_t)b * T * C + (size_t)h * HS;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;
    const float* delta_bh = delta + ((size_t)b * NH + h) * T;
    float* st_w = st_tile + key0 * Tile::lds;
    float* dpt_w = dpt_tile + key0 * Tile::lds;
    __nv_bfloat16* pt_w = pt_tile + key0 * Tile::ldp;
    __nv_bfloat16* dst_w = dst_tile + key0 * Tile::ldp;

    attention_bf16_load_tile<Tile, BK>(k_tile, k, C3, j0, T);
    attention_bf16_load_tile<Tile, BK>(v_tile, v, C3, j0, T);

    typename Tile::FragA a;
    typename Tile::FragBt bt;
    typename Tile::FragB bn;
    typename Tile::FragAcc acc, dk[NF], dv[NF];
    for (int n = 0; n < NF; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }

    for (int i0 = j0 / BQ * BQ; i0 < T; i0 += BQ) {  // every query tile holding an i >= j0
        __syncthreads();  // done with the previous Q, dO, lse, Delta (and K, V are written)
        attention_bf16_load_tile<Tile, BQ>(q_tile, q, C3, i0, T);
        attention_bf16_load_tile<Tile, BQ>(do_tile, dy, C, i0, T);
        attention_load_row_stats<BQ>(lse_tile, delta_tile, lse_bh, delta_bh, i0, T);
        __syncthreads();

        // S^T = K_w Q^T and dP^T = V_w dO^T, (16 keys, 64 queries)
        for (int in = 0; in < Tile::col_frags; in++) {
            attention_bf16_store_abt<Tile>(st_w + F * in, k_tile + key0 * Tile::ldh, q_tile + (F * in) * Tile::ldh,
                                           a, bt, acc);
            attention_bf16_store_abt<Tile>(dpt_w + F * in, v_tile + key0 * Tile::ldh, do_tile + (F * in) * Tile::ldh,
                                           a, bt, acc);
        }
        __syncwarp();

        // P^T and dS^T in fp32, rounded to bf16 as GEMM operands; lane = query
        for (int r = 0; r < WR; r++) {
            const int j = j0 + key0 + r;
            for (int e = 0; e < Tile::cols_per_lane; e++) {
                const int il = lane + 32 * e, i = i0 + il;
                const float p = (i < T && j <= i) ? expf(tau * st_w[r * Tile::lds + il] - lse_tile[il]) : 0.0f;
                pt_w[r * Tile::ldp + il] = __float2bfloat16(p);
                dst_w[r * Tile::ldp + il] = __float2bfloat16(p * (dpt_w[r * Tile::lds + il] - delta_tile[il]));
            }
        }
        __syncwarp();

        // dV_w += P^T dO, dK_w += dS^T Q, (16 keys, HS)
        for (int n = 0; n < NF; n++) {
            for (int kk = 0; kk < Tile::col_frags; kk++) {
                wmma::load_matrix_sync(a, pt_w + F * kk, Tile::ldp);
                wmma::load_matrix_sync(bn, do_tile + (F * kk) * Tile::ldh + F * n, Tile::ldh);
                wmma::mma_sync(dv[n], a, bn, dv[n]);
                wmma::load_matrix_sync(a, dst_w + F * kk, Tile::ldp);
                wmma::load_matrix_sync(bn, q_tile + (F * kk) * Tile::ldh + F * n, Tile::ldh);
                wmma::mma_sync(dk[n], a, bn, dk[n]);
            }
        }
    }

    // += into dqkv through the warp's rows of the score tile as staging
    const int rows_left = T - (j0 + key0);
    float* dk_out = dqkv + head + (size_t)(j0 + key0) * C3 + C;
    float* dv_out = dk_out + C;
    if (rows_left > 0) {  // whole warps take this branch together; no block barrier inside
        for (int n = 0; n < NF; n++) {
            attention_bf16_add_tile<Tile>(dk_out + F * n, C3, rows_left, dk[n], tau, st_w);
            attention_bf16_add_tile<Tile>(dv_out + F * n, C3, rows_left, dv[n], 1.0f, st_w);
        }
    }
}

// dQ. grid (ceil(T / Tile::rows), B * NH), block Tile::threads, dynamic shared
// memory Tile::backward_bytes.
template <class Tile>
__global__ void __launch_bounds__(Tile::threads)
    attention_backward_dq_bf16_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                      const float* delta, int T, int C, int NH) {
    using namespace nvcuda;
    constexpr int HS = Tile::hs, BR = Tile::rows, BC = Tile::cols, F = Tile::frag;
    constexpr int NF = Tile::hs_frags, WR = Tile::warp_rows;
    KNNGPT_DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* q_tile = attention_bf16_smem<__nv_bfloat16>(smem, 0);                    // (64 queries, HS)
    __nv_bfloat16* do_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::head_tile);
    __nv_bfloat16* k_tile = attention_bf16_smem<__nv_bfloat16>(smem, 2 * Tile::head_tile);  // (64 keys, HS)
    __nv_bfloat16* v_tile = attention_bf16_smem<__nv_bfloat16>(smem, 3 * Tile::head_tile);
    float* s_tile = attention_bf16_smem<float>(smem, Tile::backward_score);  // (64 queries, 64 keys)
    float* dp_tile = attention_bf16_smem<float>(smem, Tile::backward_score + Tile::score_tile);
    __nv_bfloat16* ds_tile = attention_bf16_smem<__nv_bfloat16>(smem, Tile::backward_p);
    float* lse_tile = attention_bf16_smem<float>(smem, Tile::backward_stats);
    float* delta_tile = lse_tile + BR;

    const int C3 = 3 * C;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BR;  // last (longest) query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = WR * warp;
    const float tau = attention_tau(HS);
    const size_t head = (size_t)b * T * C3 + (size_t)h * HS;
    const float* q = qkv + head;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dy = dout + (size_t)b * T * C + (size_t)h * HS;
    float* s_w = s_tile + row0 * Tile::lds;
    float* dp_w = dp_tile + row0 * Tile::lds;
    __nv_bfloat16* ds_w = ds_tile + row0 * Tile::ldp;

    attention_bf16_load_tile<Tile, BR>(q_tile, q, C3, i0, T);
    attention_bf16_load_tile<Tile, BR>(do_tile, dy, C, i0, T);
    attention_load_row_stats<BR>(lse_tile, delta_tile, lse + ((size_t)b * NH + h) * T, delta + ((size_t)b * NH + h) * T,
                                 i0, T);

    typename Tile::FragA a;
    typename Tile::FragBt bt;
    typename Tile::FragB bn;
    typename Tile::FragAcc acc, dq[NF];
    for (int n = 0; n < NF; n++) wmma::fill_fragment(dq[n], 0.0f);

    const int i_last = min(i0 + BR, T) - 1;
    for (int j0 = 0; j0 <= i_last; j0 += BC) {
        __syncthreads();  // done with the previous K, V (and Q, dO, lse, Delta are written)
        attention_bf16_load_tile<Tile, BC>(k_tile, k, C3, j0, T);
        attention_bf16_load_tile<Tile, BC>(v_tile, v, C3, j0, T);
        __syncthreads();

        // S = Q_w K^T (as in the forward) and dP = dO_w V^T, (16, 64)
        for (int jn = 0; jn < Tile::col_frags; jn++) {
            attention_bf16_store_abt<Tile>(s_w + F * jn, q_tile + row0 * Tile::ldh, k_tile + (F * jn) * Tile::ldh, a,
                                           bt, acc);
            attention_bf16_store_abt<Tile>(dp_w + F * jn, do_tile + row0 * Tile::ldh, v_tile + (F * jn) * Tile::ldh,
                                           a, bt, acc);
        }
        __syncwarp();

        // dS in fp32, rounded to bf16; lane = key
        for (int r = 0; r < WR; r++) {
            const int il = row0 + r, i = i0 + il;
            for (int e = 0; e < Tile::cols_per_lane; e++) {
                const int jl = lane + 32 * e, j = j0 + jl;
                const float p = (i < T && j <= i) ? expf(tau * s_w[r * Tile::lds + jl] - lse_tile[il]) : 0.0f;
                ds_w[r * Tile::ldp + jl] = __float2bfloat16(p * (dp_w[r * Tile::lds + jl] - delta_tile[il]));
            }
        }
        __syncwarp();

        // dQ_w += dS K, (16, HS)
        for (int n = 0; n < NF; n++) {
            for (int kk = 0; kk < Tile::col_frags; kk++) {
                wmma::load_matrix_sync(a, ds_w + F * kk, Tile::ldp);
                wmma::load_matrix_sync(bn, k_tile + (F * kk) * Tile::ldh + F * n, Tile::ldh);
                wmma::mma_sync(dq[n], a, bn, dq[n]);
            }
        }
    }

    const int rows_left = T - (i0 + row0);
    float* dq_out = dqkv + head + (size_t)(i0 + row0) * C3;
    if (rows_left > 0) {  // whole warps take this branch together; no block barrier inside
        for (int n = 0; n < NF; n++) attention_bf16_add_tile<Tile>(dq_out + F * n, C3, rows_left, dq[n], tau, s_w);
    }
}

// ---- host launchers ---------------------------------------------------------------------

inline void attention_bf16_check(int C, int NH, const char* what) {
    const int HS = C / NH;
    if (HS % kAttentionBf16HeadSizeStep != 0 || HS < kAttentionBf16HeadSizeStep || HS > kAttentionBf16MaxHeadSize) {
        std::fprintf(stderr, "%s: head size %d must be a multiple of %d in [%d, %d]\n", what, HS,
                     kAttentionBf16HeadSizeStep, kAttentionBf16HeadSizeStep, kAttentionBf16MaxHeadSize);
        std::exit(1);
    }
}

// Calls f(AttentionBf16Tiles<HS>{}) for the instantiation of head size hs
// (checked by attention_bf16_check: a multiple of the step, at most the max).
template <int HS = kAttentionBf16HeadSizeStep, typename F>
void attention_bf16_dispatch(int hs, F&& f) {
    if constexpr (HS < kAttentionBf16MaxHeadSize) {
        if (hs != HS) return attention_bf16_dispatch<HS + kAttentionBf16HeadSizeStep>(hs, f);
    }
    f(AttentionBf16Tiles<HS>{});
}

// Raises the kernel's dynamic shared memory limit once per kernel, where the
// tile needs more than the default 48 KB.
template <typename Kernel>
void attention_bf16_allow_shared(Kernel kernel, size_t bytes, bool& done) {
    if (done) return;
    if (bytes > kDefaultSharedBytes)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    done = true;
}

template <class Tile>
void attention_forward_bf16_tiled(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    static bool shared_set = false;
    attention_bf16_allow_shared(attention_forward_bf16_kernel<Tile>, Tile::forward_bytes, shared_set);
    const dim3 grid(ceil_div(T, Tile::rows), B * NH);
    launch(attention_forward_bf16_kernel<Tile>, grid, Tile::threads, Tile::forward_bytes, nullptr, out, lse, qkv, T, C,
           NH);
}

template <class Tile>
void attention_backward_bf16_tiled(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                   const float* delta, int B, int T, int C, int NH) {
    static bool dkv_shared_set = false, dq_shared_set = false;
    constexpr size_t bytes = Tile::backward_bytes;
    attention_bf16_allow_shared(attention_backward_dkv_bf16_kernel<Tile>, bytes, dkv_shared_set);
    attention_bf16_allow_shared(attention_backward_dq_bf16_kernel<Tile>, bytes, dq_shared_set);
    const dim3 grid(ceil_div(T, Tile::rows), B * NH);
    launch(attention_backward_dkv_bf16_kernel<Tile>, grid, Tile::threads, bytes, nullptr, dqkv, dout, qkv, lse, delta,
           T, C, NH);
    launch(attention_backward_dq_bf16_kernel<Tile>, grid, Tile::threads, bytes, nullptr, dqkv, dout, qkv, lse, delta, T,
           C, NH);
}

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C). HS as attention_bf16_check takes it,
// B * NH <= 65535 (the grid's y).
inline void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    if (B * NH * T == 0) return;
    attention_bf16_check(C, NH, "attention_forward_bf16");
    attention_bf16_dispatch(C / NH, [&](auto tile) {
        attention_forward_bf16_tiled<decltype(tile)>(out, lse, qkv, B, T, C, NH);
    });
}

// dqkv += the gradient of the attention, given dout, the forward's out and lse.
// Delta lives in the scratch of attention_delta_scratch (attention.cuh).
inline void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                                    const float* lse, int B, int T, int C, int NH) {
    if (B * NH * T == 0) return;
    attention_bf16_check(C, NH, "attention_backward_bf16");
    const float* delta = attention_backward_delta(dout, out, B, T, C, NH);
    attention_bf16_dispatch(C / NH, [&](auto tile) {
        attention_backward_bf16_tiled<decltype(tile)>(dqkv, dout, qkv, lse, delta, B, T, C, NH);
    });
}

}  // namespace knngpt::cuda
