// kernels/cuda/attention_bf16.cuh — exact causal multi-head attention on tensor
// cores: bf16 operands, fp32 accumulation (nvcuda::wmma 16x16x16 tiles). Same
// shapes, layout and semantics as attention_forward / attention_backward of
// kernels/cuda/attention.cuh, for head sizes HS = 16, 32, ..., 128
// (kAttentionBf16HeadSizeStep, kAttentionBf16MaxHeadSize: head_size.cuh).
//
// Math, for batch b, head h, query i and key j <= i, tau = 1/sqrt(HS):
//   s_ij = tau q_i . k_j,  lse_i = log sum_{j<=i} exp(s_ij),  P_ij = exp(s_ij - lse_i)
//   o_i = sum_{j<=i} P_ij v_j
//   backward, given dO:  Delta_i = dO_i . o_i,  dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - Delta_i)
//   dQ_i += tau sum_j dS_ij k_j,  dK_j += tau sum_i dS_ij q_i,  dV_j += sum_i P_ij dO_i
//
// Shapes (device pointers, all fp32 in memory): qkv/dqkv (B, T, 3C) with q, k, v
// the channel ranges [0, C), [C, 2C), [2C, 3C); head h owns channels
// h*HS .. h*HS+HS-1 of each. out/dout (B, T, C), lse (B, NH, T), natural log.
// The backward recomputes P from lse and accumulates (+=) into dqkv.
// Preconditions: HS = C / NH a multiple of 16 and at most 128 (checked on the
// host: one line on stderr, exit(1)); T is arbitrary (tiles are padded with
// zero rows and the padding is masked).
//
// Design (FlashAttention-2 style). 128 threads = 4 warps per block, one block
// per (tile, b*NH + h) = (blockIdx.x, blockIdx.y); every warp owns 16 rows of
// the block's 64-row tile, so all the 16 x 16 x 16 products of a warp stay on
// its own rows. Kernels are templated on HS (8 instantiations), so fragment
// arrays have compile-time sizes and live in registers. Tiles are in dynamic
// shared memory (above 48 KB for the larger head sizes, hence
// cudaFuncSetAttribute); bf16 rows are padded by 8 elements and fp32 rows by 4,
// which keeps every wmma pointer 32-byte aligned and spreads rows over banks.
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
// operand carries a relative error <= 2^-9 (u = 2^-9 ~ 1.95e-3), so
//   s_ij errs by d_ij <= 2u tau sum_c |q_ic k_jc| (about 2u times the
//   score scale), which moves lse_i by <= max_j d_ij and P_ij by a relative
//   <= ~2 max_j d_ij;
//   o_i = sum_j P_ij v_j then errs by <= ~(2 max_j d_ij + 2u) max|v|, the
//   rounding of P and of v adding u each;
//   the gradients are sums of such products with one or two more rounded
//   operands (dO, dS) and a cancellation in dP - Delta.
// With O(1) inputs and scores of a few units this is a few u relative to the
// largest entry. The tests use 1e-2 (~5u) against the fp32 CPU twin, and see
// 2.5e-3 .. 4.5e-3 for out, lse, dq, dk, dv. They also check the structure
// sharply: the lse equals (to 1e-5) the fp32 lse of bf16-rounded q, k; the
// output differs from the fp32 attention of bf16-rounded q, k, v by at most
// u max|v| (the only remaining error, the rounding of P >= 0, is a relative
// error <= u in each term of a convex combination of the v_j); and dV differs
// from the fp32 dV of bf16-rounded q, k, v, dO (same lse) by at most
// u max|dO| max_j sum_i P_ij, for the same reason.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"

namespace knngpt::cuda {

constexpr int kAttentionBf16Warps = 4;
constexpr int kAttentionBf16Threads = 32 * kAttentionBf16Warps;
constexpr int kAttentionBf16Rows = 16 * kAttentionBf16Warps;  // rows (queries or keys) of a block's tile
constexpr int kAttentionBf16Cols = 64;                        // the other side of a tile (keys or queries)

// Row strides (elements) in shared memory. Multiples of 8 (bf16) and 4 (fp32)
// as wmma requires; 16 rows of each are a multiple of 32 bytes.
template <int HS>
struct AttentionBf16Layout {
    static_assert(HS % kAttentionBf16HeadSizeStep == 0 && HS >= kAttentionBf16HeadSizeStep &&
                      HS <= kAttentionBf16MaxHeadSize,
                  "head size");
    static constexpr int LDH = HS + 8;                      // bf16 (rows, HS) tiles
    static constexpr int LDS = kAttentionBf16Cols + 4;      // fp32 (rows, 64) score tiles
    static constexpr int LDP = kAttentionBf16Cols + 8;      // bf16 (rows, 64) P / dS tiles
    static constexpr int LDO = HS + 4;                      // fp32 (rows, HS) output tile
    static constexpr size_t head_tile = (size_t)kAttentionBf16Rows * LDH * 2;  // bytes, 64 x HS bf16
    static constexpr size_t score_tile = (size_t)kAttentionBf16Rows * LDS * 4;
    static constexpr size_t p_tile = (size_t)kAttentionBf16Rows * LDP * 2;
    static constexpr size_t out_tile = (size_t)kAttentionBf16Rows * LDO * 4;
    // forward: Q, K, V, S, P, O
    static constexpr size_t forward_bytes = 3 * head_tile + score_tile + p_tile + out_tile;
    // backward (either kernel): 4 head tiles, 2 score tiles, 2 P tiles, lse and Delta
    static constexpr size_t backward_bytes =
        4 * head_tile + 2 * score_tile + 2 * p_tile + 2 * (size_t)kAttentionBf16Cols * 4;
};

// Copies rows row0 .. row0+ROWS-1 of one head's (T, HS) slice of src (row
// stride src_stride) into the bf16 tile (ROWS, LD), rounding to nearest even;
// zeros for rows >= T. All threads take part; the caller synchronises.
template <int HS, int ROWS, int LD>
__device__ void attention_bf16_load_tile(__nv_bfloat16* tile, const float* src, int src_stride, int row0, int T) {
    for (int idx = threadIdx.x; idx < ROWS * HS; idx += blockDim.x) {
        const int r = idx / HS, c = idx % HS;
        const int t = row0 + r;
        tile[r * LD + c] = __float2bfloat16((t < T) ? src[(size_t)t * src_stride + c] : 0.0f);
    }
}

// ---- forward ----------------------------------------------------------------------

// grid (ceil(T / 64), B * NH), block kAttentionBf16Threads, dynamic shared
// memory AttentionBf16Layout<HS>::forward_bytes.
template <int HS>
__global__ void __launch_bounds__(kAttentionBf16Threads)
    attention_forward_bf16_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH) {
    using namespace nvcuda;
    using L = AttentionBf16Layout<HS>;
    constexpr int BR = kAttentionBf16Rows, BC = kAttentionBf16Cols;
    constexpr int NF = HS / 16;  // 16-channel slices of the head
    KNNGPT_DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(smem);                   // (64, HS)
    __nv_bfloat16* k_tile = reinterpret_cast<__nv_bfloat16*>(smem + L::head_tile);     // (64, HS)
    __nv_bfloat16* v_tile = reinterpret_cast<__nv_bfloat16*>(smem + 2 * L::head_tile); // (64, HS)
    float* s_tile = reinterpret_cast<float*>(smem + 3 * L::head_tile);                 // (64, 64) scores
    __nv_bfloat16* p_tile = reinterpret_cast<__nv_bfloat16*>(smem + 3 * L::head_tile + L::score_tile);
    float* o_tile = reinterpret_cast<float*>(smem + 3 * L::head_tile + L::score_tile + L::p_tile);  // (64, HS)

    const int C3 = 3 * C;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BR;  // last (longest) query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = 16 * warp;  // this warp's rows of the tile
    const float tau = rsqrtf((float)HS);
    const float* q = qkv + (size_t)b * T * C3 + (size_t)h * HS;  // (T, HS), row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* s_w = s_tile + row0 * L::LDS;
    __nv_bfloat16* p_w = p_tile + row0 * L::LDP;
    float* o_w = o_tile + row0 * L::LDO;

    attention_bf16_load_tile<HS, BR, L::LDH>(q_tile, q, C3, i0, T);
    for (int idx = lane; idx < 16 * HS; idx += 32) o_w[(idx / HS) * L::LDO + idx % HS] = 0.0f;

    // running max and sum of the warp's row r, kept by lane r (r < 16) and
    // passed to the other lanes by shuffles
    float m_own = -INFINITY, l_own = 0.0f;

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bt;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> bn;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;

    const int i_last = min(i0 + BR, T) - 1;
    for (int j0 = 0; j0 <= i_last; j0 += BC) {
        __syncthreads();  // everyone is done with the previous K, V (and Q is written)
        attention_bf16_load_tile<HS, BC, L::LDH>(k_tile, k, C3, j0, T);
        attention_bf16_load_tile<HS, BC, L::LDH>(v_tile, v, C3, j0, T);
        __syncthreads();

        // S_w = Q_w K^T, (16, 64): K read as a col_major (HS, 64) matrix
        for (int jn = 0; jn < BC / 16; jn++) {
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < NF; kk++) {
                wmma::load_matrix_sync(a, q_tile + row0 * L::LDH + 16 * kk, L::LDH);
                wmma::load_matrix_sync(bt, k_tile + (16 * jn) * L::LDH + 16 * kk, L::LDH);
                wmma::mma_sync(acc, a, bt, acc);
            }
            wmma::store_matrix_sync(s_w + 16 * jn, acc, L::LDS, wmma::mem_row_major);
        }
        __syncwarp();  // S_w complete before the lanes read it

        // online softmax, one row at a time: lane holds keys lane and lane + 32
        for (int r = 0; r < 16; r++) {
            const int i = i0 + row0 + r;
            float s[2];
            float tile_max = -INFINITY;
            for (int e = 0; e < 2; e++) {
                const int jl = lane + 32 * e, j = j0 + jl;
                s[e] = (j <= i && j < T) ? tau * s_w[r * L::LDS + jl] : -INFINITY;
                tile_max = fmaxf(tile_max, s[e]);
            }
            // the first tile holds key 0 <= i, so m is finite from then on
            const float m_old = __shfl_sync(0xFFFFFFFFu, m_own, r);
            const float l_old = __shfl_sync(0xFFFFFFFFu, l_own, r);
            const float m_new = fmaxf(m_old, warp_reduce_max(tile_max));
            const float alpha = expf(m_old - m_new);
            float sum = 0.0f;
            for (int e = 0; e < 2; e++) {
                const float p = expf(s[e] - m_new);  // 0 for masked keys
                sum += p;
                p_w[r * L::LDP + lane + 32 * e] = __float2bfloat16(p);
            }
            const float l_new = alpha * l_old + warp_reduce_sum(sum);
            if (lane == r) {
                m_own = m_new;
                l_own = l_new;
            }
            for (int c = lane; c < HS; c += 32) o_w[r * L::LDO + c] *= alpha;
        }
        __syncwarp();  // P_w and the rescaled O_w complete before the wmma loads

        // O_w += P_w V, (16, HS): accumulator through shared memory
        for (int n = 0; n < NF; n++) {
            wmma::load_matrix_sync(acc, o_w + 16 * n, L::LDO, wmma::mem_row_major);
            for (int kk = 0; kk < BC / 16; kk++) {
                wmma::load_matrix_sync(a, p_w + 16 * kk, L::LDP);
                wmma::load_matrix_sync(bn, v_tile + (16 * kk) * L::LDH + 16 * n, L::LDH);
                wmma::mma_sync(acc, a, bn, acc);
            }
            wmma::store_matrix_sync(o_w + 16 * n, acc, L::LDO, wmma::mem_row_major);
        }
        __syncwarp();  // O_w stored before the lanes rescale it
    }

    for (int r = 0; r < 16; r++) {
        const int i = i0 + row0 + r;
        if (i >= T) break;  // padding rows are never written (the whole warp leaves together)
        const float m_r = __shfl_sync(0xFFFFFFFFu, m_own, r), l_r = __shfl_sync(0xFFFFFFFFu, l_own, r);
        float* y = out + ((size_t)b * T + i) * C + (size_t)h * HS;
        const float inv_l = 1.0f / l_r;
        for (int c = lane; c < HS; c += 32) y[c] = o_w[r * L::LDO + c] * inv_l;
        if (lane == 0) lse[((size_t)b * NH + h) * T + i] = m_r + logf(l_r);
    }
}

// ---- backward -----------------------------------------------------------------------

// Writes the 16 x 16 accumulator tile acc, times scale, added to dst (row
// stride ld) for rows row0 .. of at most rows_left valid rows, through the
// warp's fp32 staging tile (16 x 16, row stride ldst).
template <typename Acc>
__device__ void attention_bf16_add_tile(float* dst, size_t ld, int rows_left, const Acc& acc, float scale,
                                        float* staging, int ldst) {
    const int lane = threadIdx.x % 32;
    __syncwarp();  // earlier reads of the staging tile are done
    nvcuda::wmma::store_matrix_sync(staging, acc, ldst, nvcuda::wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < 256; idx += 32) {
        const int r = idx / 16, c = idx % 16;
        if (r < rows_left) dst[(size_t)r * ld + c] += scale * staging[r * ldst + c];
    }
}

// dK, dV. grid (ceil(T / 64), B * NH), block kAttentionBf16Threads, dynamic
// shared memory AttentionBf16Layout<HS>::backward_bytes.
template <int HS>
__global__ void __launch_bounds__(kAttentionBf16Threads)
    attention_backward_dkv_bf16_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                       const float* delta, int T, int C, int NH) {
    using namespace nvcuda;
    using L = AttentionBf16Layout<HS>;
    constexpr int BK = kAttentionBf16Rows, BQ = kAttentionBf16Cols;  // keys of the block, queries of a tile
    constexpr int NF = HS / 16;
    KNNGPT_DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* k_tile = reinterpret_cast<__nv_bfloat16*>(smem);                    // (64 keys, HS)
    __nv_bfloat16* v_tile = reinterpret_cast<__nv_bfloat16*>(smem + L::head_tile);
    __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(smem + 2 * L::head_tile);  // (64 queries, HS)
    __nv_bfloat16* do_tile = reinterpret_cast<__nv_bfloat16*>(smem + 3 * L::head_tile);
    float* st_tile = reinterpret_cast<float*>(smem + 4 * L::head_tile);                 // (64 keys, 64 queries)
    float* dpt_tile = reinterpret_cast<float*>(smem + 4 * L::head_tile + L::score_tile);
    __nv_bfloat16* pt_tile = reinterpret_cast<__nv_bfloat16*>(smem + 4 * L::head_tile + 2 * L::score_tile);
    __nv_bfloat16* dst_tile = reinterpret_cast<__nv_bfloat16*>(smem + 4 * L::head_tile + 2 * L::score_tile + L::p_tile);
    float* lse_tile = reinterpret_cast<float*>(smem + 4 * L::head_tile + 2 * L::score_tile + 2 * L::p_tile);
    float* delta_tile = lse_tile + BQ;

    const int C3 = 3 * C;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int j0 = blockIdx.x * BK;  // the first key tile (the most queries) first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int key0 = 16 * warp;  // this warp's keys of the tile
    const float tau = rsqrtf((float)HS);
    const size_t head = (size_t)b * T * C3 + (size_t)h * HS;
    const float* q = qkv + head;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dy = dout + (size_t)b * T * C + (size_t)h * HS;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;
    const float* delta_bh = delta + ((size_t)b * NH + h) * T;
    float* st_w = st_tile + key0 * L::LDS;
    float* dpt_w = dpt_tile + key0 * L::LDS;
    __nv_bfloat16* pt_w = pt_tile + key0 * L::LDP;
    __nv_bfloat16* dst_w = dst_tile + key0 * L::LDP;

    attention_bf16_load_tile<HS, BK, L::LDH>(k_tile, k, C3, j0, T);
    attention_bf16_load_tile<HS, BK, L::LDH>(v_tile, v, C3, j0, T);

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bt;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> bn;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc, dk[NF], dv[NF];
    for (int n = 0; n < NF; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }

    for (int i0 = j0 / BQ * BQ; i0 < T; i0 += BQ) {  // every query tile holding an i >= j0
        __syncthreads();  // done with the previous Q, dO, lse, Delta (and K, V are written)
        attention_bf16_load_tile<HS, BQ, L::LDH>(q_tile, q, C3, i0, T);
        attention_bf16_load_tile<HS, BQ, L::LDH>(do_tile, dy, C, i0, T);
        for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
            const int t = i0 + r;
            lse_tile[r] = t < T ? lse_bh[t] : 0.0f;
            delta_tile[r] = t < T ? delta_bh[t] : 0.0f;
        }
        __syncthreads();

        // S^T = K_w Q^T and dP^T = V_w dO^T, (16 keys, 64 queries)
        for (int in = 0; in < BQ / 16; in++) {
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < NF; kk++) {
                wmma::load_matrix_sync(a, k_tile + key0 * L::LDH + 16 * kk, L::LDH);
                wmma::load_matrix_sync(bt, q_tile + (16 * in) * L::LDH + 16 * kk, L::LDH);
                wmma::mma_sync(acc, a, bt, acc);
            }
            wmma::store_matrix_sync(st_w + 16 * in, acc, L::LDS, wmma::mem_row_major);
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < NF; kk++) {
                wmma::load_matrix_sync(a, v_tile + key0 * L::LDH + 16 * kk, L::LDH);
                wmma::load_matrix_sync(bt, do_tile + (16 * in) * L::LDH + 16 * kk, L::LDH);
                wmma::mma_sync(acc, a, bt, acc);
            }
            wmma::store_matrix_sync(dpt_w + 16 * in, acc, L::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        // P^T and dS^T in fp32, rounded to bf16 as GEMM operands; lane = query
        for (int r = 0; r < 16; r++) {
            const int j = j0 + key0 + r;
            for (int e = 0; e < 2; e++) {
                const int il = lane + 32 * e, i = i0 + il;
                const float p = (i < T && j <= i) ? expf(tau * st_w[r * L::LDS + il] - lse_tile[il]) : 0.0f;
                pt_w[r * L::LDP + il] = __float2bfloat16(p);
                dst_w[r * L::LDP + il] = __float2bfloat16(p * (dpt_w[r * L::LDS + il] - delta_tile[il]));
            }
        }
        __syncwarp();

        // dV_w += P^T dO, dK_w += dS^T Q, (16 keys, HS)
        for (int n = 0; n < NF; n++) {
            for (int kk = 0; kk < BQ / 16; kk++) {
                wmma::load_matrix_sync(a, pt_w + 16 * kk, L::LDP);
                wmma::load_matrix_sync(bn, do_tile + (16 * kk) * L::LDH + 16 * n, L::LDH);
                wmma::mma_sync(dv[n], a, bn, dv[n]);
                wmma::load_matrix_sync(a, dst_w + 16 * kk, L::LDP);
                wmma::load_matrix_sync(bn, q_tile + (16 * kk) * L::LDH + 16 * n, L::LDH);
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
            attention_bf16_add_tile(dk_out + 16 * n, C3, rows_left, dk[n], tau, st_w, L::LDS);
            attention_bf16_add_tile(dv_out + 16 * n, C3, rows_left, dv[n], 1.0f, st_w, L::LDS);
        }
    }
}

// dQ. grid (ceil(T / 64), B * NH), block kAttentionBf16Threads, dynamic shared
// memory AttentionBf16Layout<HS>::backward_bytes.
template <int HS>
__global__ void __launch_bounds__(kAttentionBf16Threads)
    attention_backward_dq_bf16_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                      const float* delta, int T, int C, int NH) {
    using namespace nvcuda;
    using L = AttentionBf16Layout<HS>;
    constexpr int BR = kAttentionBf16Rows, BC = kAttentionBf16Cols;
    constexpr int NF = HS / 16;
    KNNGPT_DYNAMIC_SHARED(unsigned char, smem);
    __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(smem);                    // (64 queries, HS)
    __nv_bfloat16* do_tile = reinterpret_cast<__nv_bfloat16*>(smem + L::head_tile);
    __nv_bfloat16* k_tile = reinterpret_cast<__nv_bfloat16*>(smem + 2 * L::head_tile);  // (64 keys, HS)
    __nv_bfloat16* v_tile = reinterpret_cast<__nv_bfloat16*>(smem + 3 * L::head_tile);
    float* s_tile = reinterpret_cast<float*>(smem + 4 * L::head_tile);                  // (64 queries, 64 keys)
    float* dp_tile = reinterpret_cast<float*>(smem + 4 * L::head_tile + L::score_tile);
    __nv_bfloat16* ds_tile = reinterpret_cast<__nv_bfloat16*>(smem + 4 * L::head_tile + 2 * L::score_tile);
    float* lse_tile = reinterpret_cast<float*>(smem + 4 * L::head_tile + 2 * L::score_tile + 2 * L::p_tile);
    float* delta_tile = lse_tile + BR;

    const int C3 = 3 * C;
    const int b = blockIdx.y / NH, h = blockIdx.y % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * BR;  // last (longest) query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = 16 * warp;
    const float tau = rsqrtf((float)HS);
    const size_t head = (size_t)b * T * C3 + (size_t)h * HS;
    const float* q = qkv + head;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* dy = dout + (size_t)b * T * C + (size_t)h * HS;
    float* s_w = s_tile + row0 * L::LDS;
    float* dp_w = dp_tile + row0 * L::LDS;
    __nv_bfloat16* ds_w = ds_tile + row0 * L::LDP;

    attention_bf16_load_tile<HS, BR, L::LDH>(q_tile, q, C3, i0, T);
    attention_bf16_load_tile<HS, BR, L::LDH>(do_tile, dy, C, i0, T);
    for (int r = threadIdx.x; r < BR; r += blockDim.x) {
        const int t = i0 + r;
        lse_tile[r] = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
        delta_tile[r] = t < T ? delta[((size_t)b * NH + h) * T + t] : 0.0f;
    }

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bt;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> bn;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc, dq[NF];
    for (int n = 0; n < NF; n++) wmma::fill_fragment(dq[n], 0.0f);

    const int i_last = min(i0 + BR, T) - 1;
    for (int j0 = 0; j0 <= i_last; j0 += BC) {
        __syncthreads();  // done with the previous K, V (and Q, dO, lse, Delta are written)
        attention_bf16_load_tile<HS, BC, L::LDH>(k_tile, k, C3, j0, T);
        attention_bf16_load_tile<HS, BC, L::LDH>(v_tile, v, C3, j0, T);
        __syncthreads();

        // S = Q_w K^T (as in the forward) and dP = dO_w V^T, (16, 64)
        for (int jn = 0; jn < BC / 16; jn++) {
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < NF; kk++) {
                wmma::load_matrix_sync(a, q_tile + row0 * L::LDH + 16 * kk, L::LDH);
                wmma::load_matrix_sync(bt, k_tile + (16 * jn) * L::LDH + 16 * kk, L::LDH);
                wmma::mma_sync(acc, a, bt, acc);
            }
            wmma::store_matrix_sync(s_w + 16 * jn, acc, L::LDS, wmma::mem_row_major);
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < NF; kk++) {
                wmma::load_matrix_sync(a, do_tile + row0 * L::LDH + 16 * kk, L::LDH);
                wmma::load_matrix_sync(bt, v_tile + (16 * jn) * L::LDH + 16 * kk, L::LDH);
                wmma::mma_sync(acc, a, bt, acc);
            }
            wmma::store_matrix_sync(dp_w + 16 * jn, acc, L::LDS, wmma::mem_row_major);
        }
        __syncwarp();

        // dS in fp32, rounded to bf16; lane = key
        for (int r = 0; r < 16; r++) {
            const int il = row0 + r, i = i0 + il;
            for (int e = 0; e < 2; e++) {
                const int jl = lane + 32 * e, j = j0 + jl;
                const float p = (i < T && j <= i) ? expf(tau * s_w[r * L::LDS + jl] - lse_tile[il]) : 0.0f;
                ds_w[r * L::LDP + jl] = __float2bfloat16(p * (dp_w[r * L::LDS + jl] - delta_tile[il]));
            }
        }
        __syncwarp();

        // dQ_w += dS K, (16, HS)
        for (int n = 0; n < NF; n++) {
            for (int kk = 0; kk < BC / 16; kk++) {
                wmma::load_matrix_sync(a, ds_w + 16 * kk, L::LDP);
                wmma::load_matrix_sync(bn, k_tile + (16 * kk) * L::LDH + 16 * n, L::LDH);
                wmma::mma_sync(dq[n], a, bn, dq[n]);
            }
        }
    }

    const int rows_left = T - (i0 + row0);
    float* dq_out = dqkv + head + (size_t)(i0 + row0) * C3;
    if (rows_left > 0) {  // whole warps take this branch together; no block barrier inside
        for (int n = 0; n < NF; n++) attention_bf16_add_tile(dq_out + 16 * n, C3, rows_left, dq[n], tau, s_w, L::LDS);
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

// Raises the kernel's dynamic shared memory limit once per kernel, where the
// tile needs more than the default 48 KB.
template <typename Kernel>
void attention_bf16_allow_shared(Kernel kernel, size_t bytes, bool& done) {
    if (done) return;
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    done = true;
}

template <int HS>
void attention_forward_bf16_hs(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    static bool shared_set = false;
    const size_t bytes = AttentionBf16Layout<HS>::forward_bytes;
    attention_bf16_allow_shared(attention_forward_bf16_kernel<HS>, bytes, shared_set);
    const dim3 grid(ceil_div(T, kAttentionBf16Rows), B * NH);
    launch(attention_forward_bf16_kernel<HS>, grid, kAttentionBf16Threads, bytes, nullptr, out, lse, qkv, T, C, NH);
}

template <int HS>
void attention_backward_bf16_hs(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                const float* delta, int B, int T, int C, int NH) {
    static bool dkv_shared_set = false, dq_shared_set = false;
    const size_t bytes = AttentionBf16Layout<HS>::backward_bytes;
    attention_bf16_allow_shared(attention_backward_dkv_bf16_kernel<HS>, bytes, dkv_shared_set);
    attention_bf16_allow_shared(attention_backward_dq_bf16_kernel<HS>, bytes, dq_shared_set);
    const dim3 grid(ceil_div(T, kAttentionBf16Rows), B * NH);
    launch(attention_backward_dkv_bf16_kernel<HS>, grid, kAttentionBf16Threads, bytes, nullptr, dqkv, dout, qkv, lse,
           delta, T, C, NH);
    launch(attention_backward_dq_bf16_kernel<HS>, grid, kAttentionBf16Threads, bytes, nullptr, dqkv, dout, qkv, lse,
           delta, T, C, NH);
}

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C). HS as attention_bf16_check takes it,
// B * NH <= 65535 (the grid's y).
inline void attention_forward_bf16(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    if (B * NH * T == 0) return;
    attention_bf16_check(C, NH, "attention_forward_bf16");
    switch (C / NH) {
        case 16: attention_forward_bf16_hs<16>(out, lse, qkv, B, T, C, NH); break;
        case 32: attention_forward_bf16_hs<32>(out, lse, qkv, B, T, C, NH); break;
        case 48: attention_forward_bf16_hs<48>(out, lse, qkv, B, T, C, NH); break;
        case 64: attention_forward_bf16_hs<64>(out, lse, qkv, B, T, C, NH); break;
        case 80: attention_forward_bf16_hs<80>(out, lse, qkv, B, T, C, NH); break;
        case 96: attention_forward_bf16_hs<96>(out, lse, qkv, B, T, C, NH); break;
        case 112: attention_forward_bf16_hs<112>(out, lse, qkv, B, T, C, NH); break;
        default: attention_forward_bf16_hs<128>(out, lse, qkv, B, T, C, NH); break;
    }
}

// dqkv += the gradient of the attention, given dout, the forward's out and lse.
// Delta lives in the scratch of attention_delta_scratch (attention.cuh).
inline void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                                    const float* lse, int B, int T, int C, int NH) {
    const int rows = B * NH * T;
    if (rows == 0) return;
    attention_bf16_check(C, NH, "attention_backward_bf16");
    float* delta = attention_delta_scratch((size_t)rows);
    launch(attention_backward_delta_kernel, ceil_div(rows, kAttentionThreads / 32), kAttentionThreads, 0, nullptr,
           delta, dout, out, B, T, C, NH);
    switch (C / NH) {
        case 16: attention_backward_bf16_hs<16>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        case 32: attention_backward_bf16_hs<32>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        case 48: attention_backward_bf16_hs<48>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        case 64: attention_backward_bf16_hs<64>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        case 80: attention_backward_bf16_hs<80>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        case 96: attention_backward_bf16_hs<96>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        case 112: attention_backward_bf16_hs<112>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
        default: attention_backward_bf16_hs<128>(dqkv, dout, qkv, lse, delta, B, T, C, NH); break;
    }
}

}  // namespace knngpt::cuda
