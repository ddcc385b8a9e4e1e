// kernels/cuda/attention_mma.cuh — exact causal attention on tensor cores, the
// FlashAttention-2 way at register level (mma.sync m16n8k16, ldmatrix, cp.async:
// mma.cuh). The bf16 trainer runs these kernels (attention_exact.cuh chooses).
//   s_ij = tau q_i . k_j,  lse_i = log sum_{j<=i} e^(s_ij),  o_i = sum_{j<=i} e^(s_ij - lse_i) v_j;
//   the backward is attention.cuh's: P recomputed from lse, then dQ, dK, dV.
// Shapes: qkv/dqkv (B, T, 3C), out/dout (B, T, C), lse (B, NH, T); HS = C / NH a
// multiple of 16 up to 128, any T, B * NH <= 65535 (the grid's y), tiles within the
// device's shared memory (attention_mma_fits). The forward saves lse; the backward
// adds (+=) into dqkv. Twin: kernels/cpu/attention.h. Reference: the wmma kernels of
// attention_bf16.cuh, with the same roundings (q, k, v, dO rounded to bf16 once, P and
// dS rounded as GEMM operands, fp32 accumulation, softmax and statistics), so their
// error model holds here too.
// Design: a warp owns 16 rows and keeps its score tile S (16 x 64), P and its output
// accumulators in registers, in mma.sync's fixed layouts. The online softmax's row max
// and sum then take two shuffles among the 4 lanes of a row, the rescale of O is a
// multiply in registers, and P feeds P V from the registers that held S. (wmma's
// fragment layout is opaque, so the wmma kernels pass S, P and O through shared memory.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_score.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_bf16.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_size.cuh"
#include "kernels/cuda/mma.cuh"

namespace knngpt::cuda {

constexpr int kAttentionMmaWarps = 4;
constexpr int kAttentionMmaThreads = 32 * kAttentionMmaWarps;
constexpr int kAttentionMmaRows = 16 * kAttentionMmaWarps;  // a block's own rows: 64 queries (keys for dK, dV)
constexpr int kAttentionMmaCols = 64;                       // the tile it walks: 64 keys (queries for dK, dV)
static_assert(kAttentionMmaRows == kAttentionMmaCols, "one shape for every (64, HS) tile");

// Registers: a warp's accumulators are 4 x HS/8 floats a lane for O (forward) or dQ,
// twice that for dK and dV; at HS 128 the dK/dV kernel holds 128 of them and stays
// within the 255 that two blocks of 128 threads a SM allow (__launch_bounds__(128, 2)).
// Shared memory: 64 x (HS + 8) bf16 a tile (rows padded by 16 bytes, so the 8 rows an
// ldmatrix phase reads fall in distinct banks): 5 tiles forward (46 KB at HS 64, 87 KB
// at 128), 6 backward.
// Every dimension of the kernels for head size HS.
template <int HS>
struct AttentionMmaTiles {
    static_assert(HS % 16 == 0 && HS >= 16 && HS <= 128, "head size: a multiple of 16 up to 128");
    static constexpr int hs = HS;
    static constexpr int ld = HS + 8;         // bf16 row stride in shared memory
    static constexpr int k_steps = HS / 16;   // 16-channel steps of a product over the head
    static constexpr int hs_blocks = HS / 8;  // 8-channel blocks of an (16, HS) accumulator
    static constexpr int row_chunks = HS / 8; // 16-byte chunks of a row
    static constexpr int col_blocks = kAttentionMmaCols / 8;  // 8-column blocks of a (16, 64) score tile
    static constexpr size_t tile_elems = (size_t)kAttentionMmaRows * ld;
    static constexpr size_t forward_bytes = 5 * tile_elems * 2;  // Q, 2 x K, 2 x V
    static constexpr size_t backward_bytes = 6 * tile_elems * 2 + 4 * kAttentionMmaCols * sizeof(float);
};

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): e^x = 2^(x log2 e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// ---- prologue -------------------------------------------------------------------
// q, k, v (and dO) are copied once per call to bf16 (B, NH, T, HS) arrays, so tiles
// move by cp.async, 16 bytes a lane, with no conversion on the way.

// dst (B, NH, T, HS) bf16 = the heads of src (B, T, row stride), head h at
// channels h*HS ..; one thread per 8 channels. Aligned sources (16 bytes, and
// row strides and HS that keep it) are read as float4s, others float by float.
__global__ void attention_heads_to_bf16_kernel(bf16* dst, const float* src, int src_stride, int B, int T, int NH,
                                               int HS) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int chunks = HS / 8;
    if (idx >= (size_t)B * NH * T * chunks) return;
    const int c = (int)(idx % chunks) * 8;
    const size_t row = idx / chunks;  // (b, h, t)
    const int t = (int)(row % T);
    const int h = (int)(row / T % NH), b = (int)(row / T / NH);
    const float* from = src + ((size_t)b * T + t) * src_stride + (size_t)h * HS + c;
    float x[8];
    if (reinterpret_cast<uintptr_t>(from) % 16 == 0) {
        const float4 lo = *reinterpret_cast<const float4*>(from), hi = *reinterpret_cast<const float4*>(from + 4);
        x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
    } else {
        for (int e = 0; e < 8; e++) x[e] = from[e];
    }
    uint4 packed;
    packed.x = pack_bf16x2(x[0], x[1]);
    packed.y = pack_bf16x2(x[2], x[3]);
    packed.z = pack_bf16x2(x[4], x[5]);
    packed.w = pack_bf16x2(x[6], x[7]);
    *reinterpret_cast<uint4*>(dst + row * HS + c) = packed;
}

// ---- tiles and products ------------------------------------------------------------

// Rows row0 .. row0 + 63 of a (T, HS) bf16 head into the shared tile (64, ld)
// by cp.async, zeros for rows >= T. The caller commits and waits.
template <class Tile>
__device__ __forceinline__ void attention_mma_load_tile(bf16* tile, const bf16* head, int row0, int T) {
    for (int idx = threadIdx.x; idx < kAttentionMmaRows * Tile::row_chunks; idx += blockDim.x) {
        const int r = idx / Tile::row_chunks, c = (idx % Tile::row_chunks) * 8;
        const bool valid = row0 + r < T;
        cp_async_16(tile + r * Tile::ld + c, head + (size_t)(valid ? row0 + r : 0) * Tile::hs + c, valid);
    }
}

// The A fragment of rows row0 .. row0 + 15, channels 16 ks .. 16 ks + 15 of a
// shared tile (ldmatrix: matrix m = lane / 8 covers rows (m & 1) * 8 + .., channels (m >> 1) * 8 + ..).
template <class Tile>
__device__ __forceinline__ void attention_mma_load_a(uint32_t (&a)[4], const bf16* tile, int row0, int ks) {
    const int lane = threadIdx.x % 32, m = lane / 8;
    ldmatrix_x4(a, tile + (row0 + (m & 1) * 8 + lane % 8) * Tile::ld + 16 * ks + (m >> 1) * 8);
}

// acc (16 x 64, as 8 blocks of 8 columns) = A (16 rows of tile a from row a0)
// times B^T (64 rows of tile b), over the head's channels: S = Q K^T and the like.
// B^T's fragments come straight from b's rows (ldmatrix: m = lane / 8 covers rows
// (m >> 1) * 8 + .., channels (m & 1) * 8 + ..), two 8-column blocks at a time.
// One 16-channel step ks of that product, for the A fragment a of the step.
template <class Tile, int COL_BLOCKS>
__device__ __forceinline__ void attention_mma_abt_step(float (&acc)[COL_BLOCKS][4], const uint32_t (&a)[4],
                                                       const bf16* b_tile, int b0, int ks) {
    const int lane = threadIdx.x % 32, m = lane / 8;
    for (int np = 0; np < COL_BLOCKS / 2; np++) {
        uint32_t bt[4];
        ldmatrix_x4(bt, b_tile + (b0 + 16 * np + (m >> 1) * 8 + lane % 8) * Tile::ld + 16 * ks + (m & 1) * 8);
        const uint32_t b_lo[2] = {bt[0], bt[1]}, b_hi[2] = {bt[2], bt[3]};
        mma_bf16_16816(acc[2 * np], a, b_lo, acc[2 * np]);
        mma_bf16_16816(acc[2 * np + 1], a, b_hi, acc[2 * np + 1]);
    }
}

template <class Tile, int COL_BLOCKS>
__device__ __forceinline__ void attention_mma_abt(float (&acc)[COL_BLOCKS][4], const bf16* a_tile, int a0,
                                                  const bf16* b_tile, int b0) {
    for (int nb = 0; nb < COL_BLOCKS; nb++)
        for (int e = 0; e < 4; e++) acc[nb][e] = 0.0f;
    for (int ks = 0; ks < Tile::k_steps; ks++) {
        uint32_t a[4];
        attention_mma_load_a<Tile>(a, a_tile, a0, ks);
        attention_mma_abt_step<Tile, COL_BLOCKS>(acc, a, b_tile, b0, ks);
    }
}

// The double buffer of a walk over tiles: tile n of the walk sits in stage n & 1
// of a_tiles and b_tiles (two (64, ld) tiles each). Issues the loads of the next
// tile's rows next_row0 .. of the heads a and b into stage next_stage, when there
// is a next tile, then waits until the current tile has landed. The caller then
// synchronises the block, and must not refill a stage before the barrier that
// ends the iteration reading it.
template <class Tile>
__device__ __forceinline__ void attention_mma_next_tiles(bf16* a_tiles, const bf16* a_head, bf16* b_tiles,
                                                         const bf16* b_head, bool has_next, int next_stage,
                                                         int next_row0, int T) {
    if (has_next) {
        attention_mma_load_tile<Tile>(a_tiles + (size_t)next_stage * Tile::tile_elems, a_head, next_row0, T);
        attention_mma_load_tile<Tile>(b_tiles + (size_t)next_stage * Tile::tile_elems, b_head, next_row0, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

// acc (16 x HS) += P (16 x 16 KSTEPS, A fragments p[kk]) times rows b0 .. b0 + 16 KSTEPS - 1
// of tile b (an (rows, HS) tile read as the B operand: ldmatrix.trans, m = lane / 8
// covering rows (m & 1) * 8 + .., channels (m >> 1) * 8 + ..): O += P V and the like.
template <class Tile, int KSTEPS>
__device__ __forceinline__ void attention_mma_ab(float (&acc)[Tile::hs_blocks][4], const uint32_t (&p)[KSTEPS][4],
                                                 const bf16* b_tile, int b0) {
    const int lane = threadIdx.x % 32, m = lane / 8;
    for (int kk = 0; kk < KSTEPS; kk++) {
        for (int hp = 0; hp < Tile::hs_blocks / 2; hp++) {
            uint32_t bv[4];
            ldmatrix_x4_trans(bv, b_tile + (b0 + 16 * kk + (m & 1) * 8 + lane % 8) * Tile::ld + 16 * hp + (m >> 1) * 8);
            const uint32_t b_lo[2] = {bv[0], bv[1]}, b_hi[2] = {bv[2], bv[3]};
            mma_bf16_16816(acc[2 * hp], p[kk], b_lo, acc[2 * hp]);
            mma_bf16_16816(acc[2 * hp + 1], p[kk], b_hi, acc[2 * hp + 1]);
        }
    }
}

// The accumulator tile x (16 x 8 COL_BLOCKS) as A fragments (16 x 16 each),
// rounded to bf16: C layout of blocks 2kk, 2kk + 1 = A layout of step kk.
template <int COL_BLOCKS>
__device__ __forceinline__ void attention_mma_to_a(uint32_t (&a)[COL_BLOCKS / 2][4], const float (&x)[COL_BLOCKS][4]) {
    for (int kk = 0; kk < COL_BLOCKS / 2; kk++) {
        a[kk][0] = pack_bf16x2(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = pack_bf16x2(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = pack_bf16x2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = pack_bf16x2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

// dst[r, 8 hb + 2t + {0, 1}] += scale acc (a (16, HS) accumulator of rows row0 + g, row0 + g + 8),
// rows < T only; dst has row stride ld.
template <class Tile>
__device__ __forceinline__ void attention_mma_add_rows(float* dst, size_t ld, int row0, int T,
                                                       const float (&acc)[Tile::hs_blocks][4], float scale) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; half++) {
        const int r = row0 + g + 8 * half;
        if (r >= T) continue;
        float* row = dst + (size_t)r * ld;
        for (int hb = 0; hb < Tile::hs_blocks; hb++) {
            row[8 * hb + 2 * t] += scale * acc[hb][2 * half];
            row[8 * hb + 2 * t + 1] += scale * acc[hb][2 * half + 1];
        }
    }
}

// ---- forward ------------------------------------------------------------------------
// A block owns 64 queries (4 warps x 16) and walks the key tiles of 64 up to the
// diagonal tile (the only one that needs the causal mask), K and V double-buffered:
// tile n + 1 is in flight while tile n is used. Per tile, warp w:
//   S = Q_w K^T by mma (Q_w's fragments loaded once), scaled by tau,
//   m' = max(m, rowmax S), alpha = e^(m - m'), P = e^(S - m'),
//   l = alpha l + rowsum P (per lane, summed over the row's 4 lanes at the end),
//   O = alpha O + P V.
// At the end out = O / l, lse = m + log l. The exponentials are exp2 of scores kept
// in log2 units (S tau log2 e): one ex2 instruction each.

// grid (ceil(T / 64), B * NH), block kAttentionMmaThreads, dynamic shared memory
// Tile::forward_bytes. q, k, v: (B, NH, T, HS) bf16.
template <class Tile>
__global__ void __launch_bounds__(kAttentionMmaThreads, 2)
    attention_forward_mma_kernel(float* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int T, int C,
                                 int NH) {
    constexpr int HS = Tile::hs, NB = Tile::col_blocks, HB = Tile::hs_blocks;
    KNNGPT_DYNAMIC_SHARED(bf16, smem);
    bf16* q_tile = smem;                         // (64, ld)
    bf16* k_tiles = q_tile + Tile::tile_elems;   // 2 stages
    bf16* v_tiles = k_tiles + 2 * Tile::tile_elems;

    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kAttentionMmaRows;  // last (longest) query tile first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_w = 16 * warp;  // the warp's rows of the tile: row_w + g and row_w + g + 8 are this lane's
    const float tau_log2e = attention_tau(HS) * kLog2e;  // scores in log2 units
    const size_t head = (size_t)bh * T * HS;
    const int tiles = i0 / kAttentionMmaCols + 1;  // key tiles 0 .. the diagonal one

    attention_mma_load_tile<Tile>(q_tile, q + head, i0, T);
    attention_mma_load_tile<Tile>(k_tiles, k + head, 0, T);
    attention_mma_load_tile<Tile>(v_tiles, v + head, 0, T);
    cp_async_commit();

    uint32_t q_frag[Tile::k_steps][4];
    float o[HB][4];
    for (int hb = 0; hb < HB; hb++)
        for (int e = 0; e < 4; e++) o[hb][e] = 0.0f;
    // rows g and g + 8: the running max (the same in the row's 4 lanes; log2 units) and this lane's part of the
    // running sum
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    for (int n = 0; n < tiles; n++) {
        const int j0 = n * kAttentionMmaCols;
        attention_mma_next_tiles<Tile>(k_tiles, k + head, v_tiles, v + head, n + 1 < tiles, (n + 1) & 1,
                                       j0 + kAttentionMmaCols, T);
        __syncthreads();  // tile n (and Q) have landed for every thread
        if (n == 0)
            for (int ks = 0; ks < Tile::k_steps; ks++) attention_mma_load_a<Tile>(q_frag[ks], q_tile, row_w, ks);
        const bf16* k_tile = k_tiles + (size_t)(n & 1) * Tile::tile_elems;
        const bf16* v_tile = v_tiles + (size_t)(n & 1) * Tile::tile_elems;

        // S = Q_w K^T (16 x 64), from Q_w's fragments
        float s[NB][4];
        for (int nb = 0; nb < NB; nb++)
            for (int e = 0; e < 4; e++) s[nb][e] = 0.0f;
        for (int ks = 0; ks < Tile::k_steps; ks++) attention_mma_abt_step<Tile, NB>(s, q_frag[ks], k_tile, 0, ks);

        // scores, the causal mask on the diagonal tile, and the rows' tile maxima
        const bool diagonal = j0 == i0;
        float tile_max[2] = {-INFINITY, -INFINITY};
        for (int nb = 0; nb < NB; nb++)
            for (int e = 0; e < 4; e++) {
                const int half = e / 2, j = j0 + 8 * nb + 2 * t + (e & 1), i = i0 + row_w + g + 8 * half;
                const float x = diagonal && j > i ? -INFINITY : tau_log2e * s[nb][e];
                s[nb][e] = x;
                tile_max[half] = fmaxf(tile_max[half], x);
            }
        float alpha[2];
        for (int half = 0; half < 2; half++) {
            float mx = tile_max[half];
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
            // every row sees key i0 <= i of the first tile, so the max is finite from tile 0 on
            const float m_new = fmaxf(m_run[half], mx);
            alpha[half] = exp2f(m_run[half] - m_new);
            m_run[half] = m_new;
            l_run[half] *= alpha[half];
        }
        // P = e^(S - m') = 2^(the log2-unit difference), its row sums, and P as bf16 A fragments
        for (int nb = 0; nb < NB; nb++)
            for (int e = 0; e < 4; e++) {
                const int half = e / 2;
                const float p = exp2f(s[nb][e] - m_run[half]);  // 0 where masked
                s[nb][e] = p;
                l_run[half] += p;
            }
        uint32_t p_frag[NB / 2][4];
        attention_mma_to_a<NB>(p_frag, s);
        for (int hb = 0; hb < HB; hb++) {
            o[hb][0] *= alpha[0];
            o[hb][1] *= alpha[0];
            o[hb][2] *= alpha[1];
            o[hb][3] *= alpha[1];
        }
        // O_w += P V
        attention_mma_ab<Tile, NB / 2>(o, p_frag, v_tile, 0);
        __syncthreads();  // every warp is done with this stage before tile n + 2 overwrites it
    }

    for (int half = 0; half < 2; half++) {
        float l = l_run[half];
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 1);
        l += __shfl_xor_sync(0xFFFFFFFFu, l, 2);
        const int i = i0 + row_w + g + 8 * half;
        if (i >= T) continue;  // padding rows are never written
        float* y = out + ((size_t)b * T + i) * C + (size_t)h * HS;
        const float inv_l = 1.0f / l;
        for (int hb = 0; hb < HB; hb++) {
            y[8 * hb + 2 * t] = o[hb][2 * half] * inv_l;
            y[8 * hb + 2 * t + 1] = o[hb][2 * half + 1] * inv_l;
        }
        if (t == 0) lse[(size_t)bh * T + i] = m_run[half] * kLn2 + logf(l);
    }
}

// ---- backward -----------------------------------------------------------------------
// Delta_i = dO_i . O_i (attention.cuh's kernel), then two kernels, no atomics:
//   dQ      a block owns 64 queries and walks the key tiles to the diagonal:
//           S = Q_w K^T, dP = dO_w V^T, P = e^(tau S - lse), dS = P (dP - Delta),
//           dQ_w += dS K;
//   dK, dV  a block owns 64 keys (warp w 16 of them) and walks the query tiles from
//           the diagonal on, 32 queries at a time: S^T = K_w Q^T, dP^T = V_w dO^T,
//           P^T and dS^T as above, dV_w += P^T dO, dK_w += dS^T Q.
// dQ and dK are scaled by tau when added to dqkv.

// dQ. grid (ceil(T / 64), B * NH), block kAttentionMmaThreads, dynamic shared
// memory Tile::backward_bytes. q, k, v, dy: (B, NH, T, HS) bf16.
template <class Tile>
__global__ void __launch_bounds__(kAttentionMmaThreads, 2)
    attention_backward_dq_mma_kernel(float* dqkv, const bf16* q, const bf16* k, const bf16* v, const bf16* dy,
                                     const float* lse, const float* delta, int T, int C, int NH) {
    constexpr int HS = Tile::hs, NB = Tile::col_blocks, HB = Tile::hs_blocks;
    KNNGPT_DYNAMIC_SHARED(bf16, smem);
    bf16* q_tile = smem;
    bf16* dy_tile = q_tile + Tile::tile_elems;
    bf16* k_tiles = dy_tile + Tile::tile_elems;  // 2 stages
    bf16* v_tiles = k_tiles + 2 * Tile::tile_elems;

    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kAttentionMmaRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row_w = 16 * warp;
    const float tau = attention_tau(HS), tau_log2e = tau * kLog2e;
    const size_t head = (size_t)bh * T * HS;
    const int tiles = i0 / kAttentionMmaCols + 1;

    attention_mma_load_tile<Tile>(q_tile, q + head, i0, T);
    attention_mma_load_tile<Tile>(dy_tile, dy + head, i0, T);
    attention_mma_load_tile<Tile>(k_tiles, k + head, 0, T);
    attention_mma_load_tile<Tile>(v_tiles, v + head, 0, T);
    cp_async_commit();
    // rows g and g + 8 (0 for padding rows, which are never written); lse in log2 units
    float lse_row[2], delta_row[2];
    for (int half = 0; half < 2; half++) {
        const int i = i0 + row_w + g + 8 * half;
        lse_row[half] = i < T ? lse[(size_t)bh * T + i] * kLog2e : 0.0f;
        delta_row[half] = i < T ? delta[(size_t)bh * T + i] : 0.0f;
    }
    float dq[HB][4];
    for (int hb = 0; hb < HB; hb++)
        for (int e = 0; e < 4; e++) dq[hb][e] = 0.0f;

    for (int n = 0; n < tiles; n++) {
        const int j0 = n * kAttentionMmaCols;
        attention_mma_next_tiles<Tile>(k_tiles, k + head, v_tiles, v + head, n + 1 < tiles, (n + 1) & 1,
                                       j0 + kAttentionMmaCols, T);
        __syncthreads();
        const bf16* k_tile = k_tiles + (size_t)(n & 1) * Tile::tile_elems;
        const bf16* v_tile = v_tiles + (size_t)(n & 1) * Tile::tile_elems;

        // S = Q_w K^T, dP = dO_w V^T (16 x 64)
        float s[NB][4], dp[NB][4];
        attention_mma_abt<Tile, NB>(s, q_tile, row_w, k_tile, 0);
        attention_mma_abt<Tile, NB>(dp, dy_tile, row_w, v_tile, 0);
        // dS = P (dP - Delta), P = e^(tau S - lse) = 2^((tau S - lse) log2 e), 0 above the diagonal
        const bool diagonal = j0 == i0;
        for (int nb = 0; nb < NB; nb++)
            for (int e = 0; e < 4; e++) {
                const int half = e / 2, j = j0 + 8 * nb + 2 * t + (e & 1), i = i0 + row_w + g + 8 * half;
                const float p = diagonal && j > i ? 0.0f : exp2f(fmaf(tau_log2e, s[nb][e], -lse_row[half]));
                dp[nb][e] = p * (dp[nb][e] - delta_row[half]);
            }
        uint32_t ds_frag[NB / 2][4];
        attention_mma_to_a<NB>(ds_frag, dp);
        // dQ_w += dS K
        attention_mma_ab<Tile, NB / 2>(dq, ds_frag, k_tile, 0);
        __syncthreads();
    }
    attention_mma_add_rows<Tile>(dqkv + (size_t)b * T * 3 * C + (size_t)h * HS, 3 * (size_t)C, i0 + row_w, T, dq, tau);
}

// dK, dV. grid (ceil(T / 64), B * NH), block kAttentionMmaThreads, dynamic
// shared memory Tile::backward_bytes.
template <class Tile>
__global__ void __launch_bounds__(kAttentionMmaThreads, 2)
    attention_backward_dkv_mma_kernel(float* dqkv, const bf16* q, const bf16* k, const bf16* v, const bf16* dy,
                                      const float* lse, const float* delta, int T, int C, int NH) {
    constexpr int HS = Tile::hs, HB = Tile::hs_blocks;
    constexpr int HALF = kAttentionMmaCols / 2, HALF_BLOCKS = HALF / 8;  // queries handled at once: 32
    KNNGPT_DYNAMIC_SHARED(bf16, smem);
    bf16* k_tile = smem;  // (64 keys, ld)
    bf16* v_tile = k_tile + Tile::tile_elems;
    bf16* q_tiles = v_tile + Tile::tile_elems;  // 2 stages of (64 queries, ld)
    bf16* dy_tiles = q_tiles + 2 * Tile::tile_elems;
    float* stats = reinterpret_cast<float*>(dy_tiles + 2 * Tile::tile_elems);  // [stage][lse 64 | delta 64]

    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int j0 = blockIdx.x * kAttentionMmaRows;  // the first key tile (the most queries) first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int key_w = 16 * warp;
    const float tau = attention_tau(HS), tau_log2e = tau * kLog2e;
    const size_t head = (size_t)bh * T * HS;
    const float* lse_bh = lse + (size_t)bh * T;
    const float* delta_bh = delta + (size_t)bh * T;
    const int first = j0 / kAttentionMmaCols, tiles = (T - 1) / kAttentionMmaCols + 1;  // query tiles first .. end

    attention_mma_load_tile<Tile>(k_tile, k + head, j0, T);
    attention_mma_load_tile<Tile>(v_tile, v + head, j0, T);
    attention_mma_load_tile<Tile>(q_tiles, q + head, j0, T);
    attention_mma_load_tile<Tile>(dy_tiles, dy + head, j0, T);
    cp_async_commit();
    attention_load_row_stats<kAttentionMmaCols>(stats, stats + kAttentionMmaCols, lse_bh, delta_bh, j0, T);
    float dk[HB][4], dv[HB][4];
    for (int hb = 0; hb < HB; hb++)
        for (int e = 0; e < 4; e++) dk[hb][e] = dv[hb][e] = 0.0f;

    for (int n = first; n < tiles; n++) {
        const int i0 = n * kAttentionMmaCols, stage = (n - first) & 1;
        if (n + 1 < tiles) {  // the next tile's lse and Delta, plain loads into the other stage
            float* next_stats = stats + (stage ^ 1) * 2 * kAttentionMmaCols;
            attention_load_row_stats<kAttentionMmaCols>(next_stats, next_stats + kAttentionMmaCols, lse_bh, delta_bh,
                                                        i0 + kAttentionMmaCols, T);
        }
        attention_mma_next_tiles<Tile>(q_tiles, q + head, dy_tiles, dy + head, n + 1 < tiles, stage ^ 1,
                                       i0 + kAttentionMmaCols, T);
        __syncthreads();
        const bf16* q_tile = q_tiles + stage * Tile::tile_elems;
        const bf16* dy_tile = dy_tiles + stage * Tile::tile_elems;
        const float* lse_tile = stats + stage * 2 * kAttentionMmaCols;
        const float* delta_tile = lse_tile + kAttentionMmaCols;

        for (int q0 = 0; q0 < kAttentionMmaCols; q0 += HALF) {
            // S^T = K_w Q^T, dP^T = V_w dO^T (16 keys x 32 queries)
            float st[HALF_BLOCKS][4], dpt[HALF_BLOCKS][4];
            attention_mma_abt<Tile, HALF_BLOCKS>(st, k_tile, key_w, q_tile, q0);
            attention_mma_abt<Tile, HALF_BLOCKS>(dpt, v_tile, key_w, dy_tile, q0);
            // P^T = e^(tau S^T - lse), 0 where the query precedes the key or is past T; dS^T = P^T (dP^T - Delta)
            for (int nb = 0; nb < HALF_BLOCKS; nb++)
                for (int e = 0; e < 4; e++) {
                    const int il = q0 + 8 * nb + 2 * t + (e & 1), i = i0 + il, j = j0 + key_w + g + 8 * (e / 2);
                    const float p = i < T && j <= i ? exp2f(fmaf(tau_log2e, st[nb][e], -lse_tile[il] * kLog2e)) : 0.0f;
                    st[nb][e] = p;
                    dpt[nb][e] = p * (dpt[nb][e] - delta_tile[il]);
                }
            uint32_t p_frag[HALF_BLOCKS / 2][4], ds_frag[HALF_BLOCKS / 2][4];
            attention_mma_to_a<HALF_BLOCKS>(p_frag, st);
            attention_mma_to_a<HALF_BLOCKS>(ds_frag, dpt);
            // dV_w += P^T dO, dK_w += dS^T Q over these 32 queries
            attention_mma_ab<Tile, HALF_BLOCKS / 2>(dv, p_frag, dy_tile, q0);
            attention_mma_ab<Tile, HALF_BLOCKS / 2>(dk, ds_frag, q_tile, q0);
        }
        __syncthreads();
    }
    float* dk_out = dqkv + (size_t)b * T * 3 * C + C + (size_t)h * HS;
    attention_mma_add_rows<Tile>(dk_out, 3 * (size_t)C, j0 + key_w, T, dk, tau);
    attention_mma_add_rows<Tile>(dk_out + C, 3 * (size_t)C, j0 + key_w, T, dv, 1.0f);
}

// ---- host launchers ---------------------------------------------------------------------

// The bf16 copies of the heads: q, k, v (and dO for the backward), each (B, NH, T, HS).
inline bf16* attention_mma_scratch(size_t elements) {
    static DeviceScratch scratch;
    return static_cast<bf16*>(scratch.get(elements * sizeof(bf16)));
}

inline void attention_heads_to_bf16(bf16* dst, const float* src, int src_stride, int B, int T, int NH, int HS) {
    const size_t threads = (size_t)B * NH * T * (HS / 8);
    launch(attention_heads_to_bf16_kernel, (unsigned)ceil_div(threads, (size_t)256), 256, 0, nullptr, dst, src,
           src_stride, B, T, NH, HS);
}

// Calls f(AttentionMmaTiles<HS>{}) for the instantiation of head size hs (checked by attention_bf16_check).
template <int HS = 16, typename F>
void attention_mma_dispatch(int hs, F&& f) {
    if constexpr (HS < 128) {
        if (hs != HS) return attention_mma_dispatch<HS + 16>(hs, f);
    }
    f(AttentionMmaTiles<HS>{});
}

// The dynamic shared memory a block may opt into on this device, read once (a
// test may lower it: attention_mma_shared_limit_override). The emulator has no limit.
inline size_t& attention_mma_shared_limit_override() {
    static size_t bytes = 0;  // 0: the device's
    return bytes;
}
inline size_t attention_mma_shared_limit() {
    if (attention_mma_shared_limit_override() != 0) return attention_mma_shared_limit_override();
#if defined(KNNGPT_CUDA_EMU)
    return SIZE_MAX;
#else
    static const size_t limit = [] {
        int device = 0, bytes = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        return (size_t)bytes;
    }();
    return limit;
#endif
}

// Whether the kernels of head size hs (a multiple of 16 up to 128) fit this device's
// shared memory: the backward at HS 128 needs 103 KB, more than the 99 KB of an
// sm_86 or sm_89 GPU (an RTX 3090, L4, L40S), where training takes the fp32 kernels.
inline bool attention_mma_fits(int hs) {
    size_t need = 0;
    attention_mma_dispatch(hs, [&](auto tile) { need = decltype(tile)::backward_bytes; });
    return need <= attention_mma_shared_limit();
}

// B * NH must fit the grid's y (65535), the shared memory the device's (attention_mma_fits).
inline void attention_mma_check(int B, int C, int NH, const char* what) {
    attention_bf16_check(C, NH, what);
    if (B * NH > kAttentionMaxGridY || !attention_mma_fits(C / NH)) {
        std::fprintf(stderr, "%s: B * NH = %d must be at most %d and head size %d must fit the device's %zu bytes of "
                             "shared memory a block\n", what, B * NH, kAttentionMaxGridY, C / NH,
                     attention_mma_shared_limit());
        std::exit(1);
    }
}

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C).
inline void attention_forward_mma(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    if (B * NH * T == 0) return;
    attention_mma_check(B, C, NH, "attention_forward_mma");
    const int HS = C / NH;
    const size_t n = (size_t)B * T * C;
    bf16* q = attention_mma_scratch(3 * n);
    bf16* k = q + n;
    bf16* v = k + n;
    attention_heads_to_bf16(q, qkv, 3 * C, B, T, NH, HS);
    attention_heads_to_bf16(k, qkv + C, 3 * C, B, T, NH, HS);
    attention_heads_to_bf16(v, qkv + 2 * C, 3 * C, B, T, NH, HS);
    attention_mma_dispatch(HS, [&](auto tile) {
        using Tile = decltype(tile);
        static bool shared_set = false;
        attention_bf16_allow_shared(attention_forward_mma_kernel<Tile>, Tile::forward_bytes, shared_set);
        const dim3 grid(ceil_div(T, kAttentionMmaRows), B * NH);
        launch(attention_forward_mma_kernel<Tile>, grid, kAttentionMmaThreads, Tile::forward_bytes, nullptr, out, lse,
               q, k, v, T, C, NH);
    });
}

// dqkv += the gradient of the attention, given dout and the forward's out and lse.
inline void attention_backward_mma(float* dqkv, const float* dout, const float* qkv, const float* out,
                                   const float* lse, int B, int T, int C, int NH) {
    if (B * NH * T == 0) return;
    attention_mma_check(B, C, NH, "attention_backward_mma");
    const int HS = C / NH;
    const float* delta = attention_backward_delta(dout, out, B, T, C, NH);
    const size_t n = (size_t)B * T * C;
    bf16* q = attention_mma_scratch(4 * n);
    bf16* k = q + n;
    bf16* v = k + n;
    bf16* dy = v + n;
    attention_heads_to_bf16(q, qkv, 3 * C, B, T, NH, HS);
    attention_heads_to_bf16(k, qkv + C, 3 * C, B, T, NH, HS);
    attention_heads_to_bf16(v, qkv + 2 * C, 3 * C, B, T, NH, HS);
    attention_heads_to_bf16(dy, dout, C, B, T, NH, HS);
    attention_mma_dispatch(HS, [&](auto tile) {
        using Tile = decltype(tile);
        static bool dq_shared_set = false, dkv_shared_set = false;
        attention_bf16_allow_shared(attention_backward_dq_mma_kernel<Tile>, Tile::backward_bytes, dq_shared_set);
        attention_bf16_allow_shared(attention_backward_dkv_mma_kernel<Tile>, Tile::backward_bytes, dkv_shared_set);
        const dim3 grid(ceil_div(T, kAttentionMmaRows), B * NH);
        launch(attention_backward_dkv_mma_kernel<Tile>, grid, kAttentionMmaThreads, Tile::backward_bytes, nullptr, dqkv,
               q, k, v, dy, lse, delta, T, C, NH);
        launch(attention_backward_dq_mma_kernel<Tile>, grid, kAttentionMmaThreads, Tile::backward_bytes, nullptr, dqkv,
               q, k, v, dy, lse, delta, T, C, NH);
    });
}

}  // namespace knngpt::cuda
