// kernels/cuda/sampled_grad.cuh — sampled gradients of EXACT causal attention,
// `--attn-grad sampled`, with row-wise or signed-start dV (`--attn-grad-dv signed`);
// twin of cpu::sampled_attention_backward (kernels/cpu/sampled_grad.h, ALGORITHMS.md
// §5) for both sample sources: the same samples, walk starts and terms. For row
// (b, h, i), samples J_m ~ P_i (m < s, from the exact row or by lazy Gumbel on the
// top-k list) and Delta_i = dO_i . O_i (fp64, from the given out):
//   coef = tau (dO_i . v_J - Delta_i) / s,  dQ_i += coef k_J,  dK_J += coef q_i,  dV_J += dO_i / s
// (signed-start dV replaces the last term by the CPU's walks down each column of dO).
// Shapes: qkv/dqkv (B, T, 3C); dout, out (B, T, C); topk_idx (B, NH, T, k) ascending,
// -1 padded (LazyGumbel only); HS <= kWarpRowMaxHeadSize. Device pointers. Adds (+=)
// into dqkv; saves nothing. Design: ExactRow scores tiles of 32 rows once into a row
// buffer (score_tiles.cuh), then one warp per row; LazyGumbel one warp per row, the
// longest rows first; before either (signed-start dV only) a walk-start kernel with one
// warp per column of dO; dK and dV by float atomicAdd (so not bit-reproducible), dQ
// reproducible.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/common/attention_params.h"
#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"
#include "kernels/common/sampler_exp.h"
#include "kernels/common/lazy_gumbel.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/score_tiles.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

using knngpt::GradSampleSource;

constexpr int kSampledGradThreads = 256;  // 8 warps, one row each

// ---- samples and terms, as the CPU twin computes them ------------------------
// For every row (b, h, i), with n_i = i + 1 keys, backward sample m (0 <= m < s) is
// J_m ~ P_i (the causal softmax row), from one of two sources at site
// {seed, step, layer*NH + h, (batch0 + b)*T + i}, batch0 the global batch row of local
// row 0 (kernels/common/draws.h):
//   ExactRow    s_ij = attention_score (kernels/common/attention_score.h): the fma
//                                         chain acc = fma(q_c, k_jc, acc) over
//                                         c = 0..HS-1 in order, then tau * acc
//               cdf_l = sum_{j<=l} exp(s_ij - max_j s_ij)          fp64, summed in j order,
//                                         exp = sampler_exp (kernels/common/sampler_exp.h)
//               u_m = uniform_open01_f64 of Philox draw DRAW_GRADIENT_SAMPLE index m;
//               J_m = the first l with cdf_l > u_m cdf_{n_i-1} (n_i - 1 if none)
//   LazyGumbel  J_m = lazy Gumbel sample number 2m + 1 (odd: the `gumbel` forward uses
//               the even numbers) on the row's top-k list, drawn by the shared sampler
//               lazy_gumbel_sample_core (kernels/common/lazy_gumbel.h) with the cap
//               lazy_gumbel_default_max_exceeders(n_i - |S_i|, |S_i|), as on the CPU
// Then Delta_i = dO_i . O_i (fp64, from the given out), and for each sample J = J_m:
//     coef = tau (dO_i . v_J - Delta_i) / s
//     dQ_i += coef k_J,   dK_J += coef q_i,   dV_J += dO_i / s   (row-wise dV)
// Each term is unbiased for the exact gradient when out is exact attention's output;
// after an approximate forward, Delta_i = dO_i . O^_i shifts the dQ, dK means (§5.2).
//
// Signed-start dV replaces dV_J += dO_i / s. Per column c of dO in (b, h), x_i = dO_ic:
//   cdf_i = |x_0| + ... + |x_i|            fp64, summed in i order; l1 = cdf_{T-1}
//   N = T s walks of weight l1 / N (none if l1 == 0); walk n starts at row
//   i_n = the first i with cdf_i > u_n l1 (T - 1 if none), u_n = uniform_open01_f64 of
//   DRAW_GRADIENT_SAMPLE index 2^27 + c N + n at the site
//   {seed, step, layer*NH + h, (batch0 + b)*T} (query 0 of (b, h)); W_ic = the walks of column c that start at row i.
// Row i then draws count_i = max(s, max_c W_ic) samples J_0, J_1, ... (the row-wise
// sequence, longer), uses J_0..J_{s-1} for dQ and dK as above, and for every column c
// adds (x_ic > 0 ? l1 / N : -l1 / N) to dV_{J_m, c} for m < W_ic.

// ---- design --------------------------------------------------------------------
// One warp per row (b, h, i), the longest rows scheduled first, after (for
// signed-start dV only) a walk-start kernel.
// Walk starts: one warp per column (b, h, c). Every lane adds the column's |x_i| in i
//   order (broadcast by shuffles, as pass 2 below), so the running sums are the CPU's
//   exactly; they go to a global fp64 scratch cdf (B, NH, HS, T). The lanes then draw
//   walks n = lane, lane + 32, ..., find each start by binary search for the upper
//   bound (the CPU's std::upper_bound: the same index on a nondecreasing array) and
//   count it by integer atomicAdd into walk_counts (B, NH, T, HS), zeroed per call; the
//   weight l1 / N goes to a (B, NH, HS) scratch. The counts are exact, so every row gets
//   the CPU's W_ic. The scratch is one buffer grown on demand and kept for the process.
//   Cost per column: O(T) for the sums, O(N log T / 32) per lane for the starts.
// ExactRow: a persistent grid of blocks of 8 warps, each block walking tiles of 32
//   queries of one (b, h), longest first. Per tile:
//   scores  every s_ij = tau dot(i, j) of the tile once (score_query_tile: query and key
//           tiles in shared memory, coalesced loads at a padded stride, 4 x 2 scores a
//           thread, attention_dot's chain, so attention_score's value), into the
//           block's slice of a row buffer in global memory.
//   pass 1  warp w takes rows w, w + 8, w + 16, w + 24; the fp64 row max of the
//           buffered scores is a warp max (exact in any order).
//   pass 2  the fp64 total: per group of 32 keys each lane computes its key's weight
//           exp(s_ij - max), and every lane adds the 32 weights, broadcast by shuffles,
//           in j order, so every lane holds the CPU's running sum exactly.
//   pass 3  for each chunk of 32 samples, lane L draws sample m0 + L and walks the
//           running sum again (the same operations in the same order, so the same
//           values) until it first exceeds its target u_m total; the walk stops once
//           every sample of the chunk is placed.
//   The weights are recomputed from the buffer in pass 3, not stored (fp64 rows would
//   double the buffer). Instances: HS 8, 16, 32, 64, 128 (float4 loads, HS / 32 channel
//   slots a lane) and a run-time one (any HS, scalar loads, for other head sizes or a
//   qkv not 16-byte aligned); __launch_bounds__(256, 2). Per score the buffer takes
//   one write and about 2.5 reads (passes 1, 2, and 3 until the chunk is placed); the
//   serial fp64 running sums of passes 2 and 3 (every lane adds all the weights in
//   order), kept serial so that every sample is the CPU's, bound the kernel's time.
// LazyGumbel: for each chunk of 32 samples, lane L draws sample m0 + L with the shared
//   sampler, on its own (the lanes' walks diverge and never synchronise inside).
// Terms (both sources), O(s HS / 32) per lane: lanes stride over the head's channels
//   (warp_row.cuh): for each sample, dO_i . v_J by a warp sum; dQ_i collects in
//   fp64 registers and is added once; dK_J and dV_J go to dqkv by float atomicAdd, since
//   any row may sample any key. The order of those additions varies from run to run, so
//   dK and dV are not bit-reproducible, and they differ from the CPU's fp64 per-head sums
//   by rounding only; dQ is reproducible.
// Signed-start dV: the row's count_i is a warp max of the lanes' W_ic; the chunk loop
//   draws count_i samples (any number: chunks of 32, each sample on its own), the dQ/dK
//   terms skip samples m >= s, and the lane owning channel c adds the float-rounded
//   signed weight to dV_{J_m, c} by atomicAdd for m < W_ic. E[W_ic] = s |x_ic| / mean_i
//   |x_ic|, so count_i is a few times s on typical dO, but can reach N (a column whose
//   only nonzero entry is in row i); the row's sampling cost grows with count_i. The
//   draw-index limits are the CPU's, checked on the host.
// Exactness of the samples: the scores (an explicit fma chain), the max, the running
// sums, the targets and the lazy Gumbel walk are the CPU's operations in the CPU's
// order. The exact-row weights' exp is sampler_exp, IEEE operations only, so natively
// too every exact-row pick is the CPU's. Lazy Gumbel's exp, log and log1p (its head's
// weights and mass) are CUDA's natively (within an ulp or two of glibc's), so there a
// pick can differ only when a target lies within an ulp or so of a cumulative sum of the
// head, or two Gumbel-perturbed scores nearly tie; under the emulator every pick is the
// CPU's.
// The walk starts use only additions, a product and comparisons, so they are the CPU's
// natively too.

// The signed-start dV's scratch: the running sums cdf (B, NH, HS, T) in fp64, the walk
// weights (B, NH, HS) in fp64 and the walk counts (B, NH, T, HS), in one DeviceScratch.
struct SampledGradWalkScratch {
    double* cdf;
    double* walk_weight;
    int* walk_counts;
};
inline SampledGradWalkScratch sampled_grad_walk_scratch(size_t columns, int T) {
    static DeviceScratch scratch;
    const size_t cdf_bytes = columns * T * sizeof(double);
    const size_t weight_bytes = columns * sizeof(double);
    char* buffer = static_cast<char*>(scratch.get(cdf_bytes + weight_bytes + columns * T * sizeof(int)));
    return SampledGradWalkScratch{reinterpret_cast<double*>(buffer), reinterpret_cast<double*>(buffer + cdf_bytes),
                                  reinterpret_cast<int*>(buffer + cdf_bytes + weight_bytes)};
}

// ---- CUDA kernels -------------------------------------------------------------

// One warp per column (b, h, c) of dO (x_i = dO[b, i, h*HS + c]): the running sums of
// |x_i| into cdf (the CPU's sequential fp64 sums: every lane adds a group's 32 values in
// i order), the walk weight ||x||_1 / N, and the N = T s walk starts, each lane drawing
// walks n = lane, lane + 32, ... and counting its start row into walk_counts (zeroed by
// the caller). cdf: (B, NH, HS, T); walk_counts: (B, NH, T, HS) (a row's counts side by
// side for the row kernel); walk_weight: (B, NH, HS).
__global__ void sampled_grad_walk_start_kernel(double* cdf, int* walk_counts, double* walk_weight, const float* dout,
                                               int B, int T, int C, int NH, int samples, uint64_t seed, uint32_t step,
                                               int layer, int batch0) {
    const int lane_id = threadIdx.x % 32;
    const int HS = C / NH;
    const int column = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b * NH + h) * HS + c
    if (column >= B * NH * HS) return;  // whole warps leave together
    const int c = column % HS;
    const int h = (column / HS) % NH;
    const int b = column / (HS * NH);
    const float* x = dout + (size_t)b * T * C + (size_t)h * HS + c;  // x_i at i * C
    double* column_cdf = cdf + (size_t)column * T;
    int* counts = walk_counts + ((size_t)b * NH + h) * T * HS + c;  // row i at i * HS

    // cdf_i = |x_0| + ... + |x_i|, summed in i order by every lane; lane L stores row i0 + L
    double l1 = 0.0;
    for (int i0 = 0; i0 < T; i0 += 32) {
        const int i = i0 + lane_id;
        const double a = i < T ? fabs((double)x[(size_t)i * C]) : 0.0;
        const int count = min(32, T - i0);
        double mine = 0.0;
        for (int t = 0; t < count; t++) {
            l1 += __shfl_sync(0xFFFFFFFFu, a, t);
            if (t == lane_id) mine = l1;
        }
        if (i < T) column_cdf[i] = mine;
    }
    __syncwarp();  // the column's cdf, written by all lanes, is read by all lanes below

    const long long walks = (long long)T * samples;
    if (lane_id == 0) walk_weight[column] = l1 / (double)walks;
    if (l1 == 0.0) return;  // a column of zeros has no walks (every lane holds the same l1)
    // walk n starts at the first row i with cdf_i > u_n l1 (T - 1 if none), as sampled_grad_pick
    const DrawSite site = head_draw_site(seed, step, layer, NH, h, batch0 + b, T);
    for (long long n = lane_id; n < walks; n += 32) {
        const Philox4 draw = philox_draw(site, DRAW_GRADIENT_SAMPLE, walk_start_draw_index(c, walks, n));
        const double target = uniform_open01_f64(draw.x[0], draw.x[1]) * l1;
        int lo = 0, hi = T;  // upper bound: the first i with cdf_i > target
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (column_cdf[mid] > target) hi = mid;
            else lo = mid + 1;
        }
        atomicAdd(&counts[(size_t)(lo < T ? lo : T - 1) * HS], 1);
    }
}

// The terms of row (b, h, i) of `row`, for the samples pick(m0, chunk) draws: lane L <
// chunk gets sample m0 + L's key J (lanes past the chunk get any valid key). Delta_i,
// dQ_i in fp64 registers, dK_J and dV_J by atomicAdd, as the header says. kSlots:
// channel slots a lane (HS <= 32 kSlots). walk_counts, walk_weight: the walk-start
// kernel's output for signed-start dV, or nullptr for row-wise dV.
template <int kSlots, class Pick>
__device__ void sampled_grad_row_terms(float* dqkv, const float* dout, const float* out, const WarpRow& row, int T,
                                       int C, int NH, int samples, float tau, const int* walk_counts,
                                       const double* walk_weight, Pick&& pick) {
    const int lane_id = threadIdx.x % 32;
    const int i = row.t, h = row.h, b = row.b, HS = row.HS, C3 = row.C3;
    const size_t head = row.head, row_offset = row.out;
    const float *q = row.q, *keys = row.keys, *values = row.values;  // key and value j at j * C3

    // the row's channels: lane owns c = lane + 32 s; Delta_i = dO_i . O_i
    float q_reg[kSlots], dy_reg[kSlots], dv_add[kSlots];
    double dq[kSlots];
    double delta = 0.0;
    for (int s = 0; s < kSlots; s++) {
        const int c = lane_id + 32 * s;
        q_reg[s] = c < HS ? q[c] : 0.0f;
        dy_reg[s] = c < HS ? dout[row_offset + c] : 0.0f;
        if (c < HS) delta += (double)dy_reg[s] * out[row_offset + c];
        dv_add[s] = (float)((double)dy_reg[s] / samples);  // dO_i / s
        dq[s] = 0.0;
    }
    delta = warp_reduce_sum(delta);

    // signed-start dV: the walks of each of the lane's columns that start at row i, and
    // the signed weight each adds; the row draws count = max(s, most walks of a column)
    const bool signed_dv = walk_counts != nullptr;
    int walks[kSlots];
    float walk_add[kSlots];
    int count = samples;
    for (int s = 0; s < kSlots; s++) {
        const int c = lane_id + 32 * s;
        walks[s] = 0;
        walk_add[s] = 0.0f;
        if (signed_dv && c < HS) {
            const size_t bh = (size_t)b * NH + h;
            walks[s] = walk_counts[(bh * T + i) * HS + c];
            const double weight = walk_weight[bh * HS + c];
            walk_add[s] = (float)(dy_reg[s] > 0.0f ? weight : -weight);
            count = max(count, walks[s]);
        }
    }
    count = warp_reduce_max(count);

    for (int m0 = 0; m0 < count; m0 += 32) {
        const int chunk = min(32, count - m0);
        const int J = pick(m0, chunk);
        // the terms of the chunk's samples, in sample order
        for (int t = 0; t < chunk; t++) {
            const int m = m0 + t;
            const int j = __shfl_sync(0xFFFFFFFFu, J, t);
            float* dv_j = dqkv + head + (size_t)j * C3 + 2 * C;
            if (m < samples) {  // dQ, dK (and row-wise dV) from the first s samples
                const float* k_j = keys + (size_t)j * C3;
                const float* v_j = values + (size_t)j * C3;
                double dp = 0.0;  // dO_i . v_J
                for (int s = 0; s < kSlots; s++) {
                    const int c = lane_id + 32 * s;
                    if (c < HS) dp += (double)dy_reg[s] * v_j[c];
                }
                dp = warp_reduce_sum(dp);
                const double coef = (double)tau * (dp - delta) / samples;
                float* dk_j = dqkv + head + (size_t)j * C3 + C;
                for (int s = 0; s < kSlots; s++) {
                    const int c = lane_id + 32 * s;
                    if (c < HS) {
                        dq[s] += coef * k_j[c];
                        atomicAdd(&dk_j[c], (float)(coef * q_reg[s]));
                        if (!signed_dv) atomicAdd(&dv_j[c], dv_add[s]);
                    }
                }
            }
            if (signed_dv) {  // walk m of column c, if row i starts that many, lands on J_m
                for (int s = 0; s < kSlots; s++) {
                    const int c = lane_id + 32 * s;
                    if (c < HS && m < walks[s]) atomicAdd(&dv_j[c], walk_add[s]);
                }
            }
        }
    }
    float* dq_out = dqkv + head + (size_t)i * C3;
    for (int s = 0; s < kSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) dq_out[c] += (float)dq[s];
    }
}

// LazyGumbel: one warp per row (b, h, i), the longest rows first.
__global__ void sampled_grad_lazy_gumbel_kernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                                                const int* topk_idx, int k, int B, int T, int C, int NH, int samples,
                                                float tau, uint64_t seed, uint32_t step, int layer, int batch0,
                                                const int* walk_counts, const double* walk_weight) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const WarpRow row = warp_row(qkv, warp_index, T, C, NH, /*longest_first=*/true);
    const int i = row.t, n_i = i + 1;
    const DrawSite site = row_draw_site(seed, step, layer, NH, row.h, batch0 + row.b, T, i);
    const int* topk = topk_idx + (((size_t)row.b * NH + row.h) * T + i) * k;
    int head_count = 0;
    while (head_count < k && topk[head_count] >= 0) head_count++;
    const int max_exceeders = lazy_gumbel_default_max_exceeders(n_i - head_count, head_count);
    sampled_grad_row_terms<kWarpRowSlots>(
        dqkv, dout, out, row, T, C, NH, samples, tau, walk_counts, walk_weight, [&](int m0, int chunk) {
            // lane L draws lazy Gumbel sample number 2 (m0 + L) + 1
            int J = 0;  // lanes without a sample count as placed
            if (lane_id < chunk)
                J = lazy_gumbel_sample_core(row.q, row.keys, row.C3, row.HS, tau, n_i, topk, k, site,
                                            sampled_grad_sample_number((uint32_t)(m0 + lane_id)), max_exceeders,
                                            nullptr, nullptr);
            return J;
        });
}

// ExactRow: a persistent grid of blocks, each walking query tiles of 32 rows of one
// (b, h) longest first (score_tiles.cuh); the tile's scores s_ij = tau dot(i, j) go to
// the block's slice of the row buffer `rows` (row stride row_stride floats), then warp
// w takes rows w, w + 8, w + 16, w + 24 of the tile: the row max and the fp64 total
// from the buffer (passes 1 and 2), the samples by walking the running sum again
// (pass 3), and the terms. kHS > 0 fixes HS (float4 tile loads, kHS / 32 slots);
// kHS = 0 takes HS <= kWarpRowMaxHeadSize at run time.
template <int kHS>
__global__ void __launch_bounds__(kScoreTileThreads, kScoreBlocksPerSm)
    sampled_grad_exact_row_kernel(float* dqkv, float* rows, const float* dout, const float* qkv, const float* out,
                                  int B, int T, int C, int NH, int samples, float tau, uint64_t seed, uint32_t step,
                                  int layer, int batch0, const int* walk_counts, const double* walk_weight,
                                  int row_stride) {
    static_assert(kHS % 4 == 0, "fixed head sizes are multiples of 4");
    constexpr int kSlots = kHS > 0 ? (kHS + 31) / 32 : kWarpRowSlots;
    const int HS = kHS > 0 ? kHS : C / NH;
    const int lane_id = threadIdx.x % 32, warp_id = threadIdx.x / 32;
    KNNGPT_DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                           // (32, HS)
    float* k_tile = q_tile + kScoreTileQueries * HS;  // (64, score_key_stride)
    float* block_rows = rows + (size_t)blockIdx.x * kScoreTileQueries * row_stride;

    const int items = B * NH * ceil_div(T, kScoreTileQueries);
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const ScoreTileItem it = score_tile_item(item, B, T, NH);
        const float* head = qkv + (size_t)it.b * T * 3 * C + (size_t)it.h * HS;
        score_query_tile<kHS>(q_tile, k_tile, head, C, HS, it.i0, it.queries, it.n_tile,
                              [&](int q_local, int j, float dot) {
                                  block_rows[(size_t)q_local * row_stride + j] = tau * dot;  // attention_score
                              });
        for (int r = 0; r < kScoreQueriesPerThread; r++) {
            const int q_local = warp_id + kScoreTileWarps * r;
            if (q_local >= it.queries) break;
            const int i = it.i0 + q_local, n_i = i + 1;
            const float* scores = block_rows + (size_t)q_local * row_stride;
            const WarpRow row = warp_row_at(qkv, it.b, it.h, i, T, C, NH);
            const DrawSite site = row_draw_site(seed, step, layer, NH, it.h, batch0 + it.b, T, i);
            // pass 1: the row max of the scores
            double row_max = -INFINITY;
            for (int j = lane_id; j < n_i; j += 32) row_max = fmax(row_max, (double)scores[j]);
            row_max = warp_reduce_max(row_max);
            // pass 2: total = the running sum of the weights in j order, held by every lane
            double total = 0.0;
            for (int j0 = 0; j0 < n_i; j0 += 32) {
                const int j = j0 + lane_id;
                const double w = j < n_i ? sampler_exp((double)scores[j] - row_max) : 0.0;
                const int count = min(32, n_i - j0);
                for (int t = 0; t < count; t++) total += __shfl_sync(0xFFFFFFFFu, w, t);
            }
            sampled_grad_row_terms<kSlots>(
                dqkv, dout, out, row, T, C, NH, samples, tau, walk_counts, walk_weight, [&](int m0, int chunk) {
                    // pass 3: lane L places sample m0 + L at the first l with cdf_l > u total
                    int J = 0;  // lanes without a sample count as placed
                    double target = 0.0;
                    if (lane_id < chunk) {
                        const Philox4 draw = philox_draw(site, DRAW_GRADIENT_SAMPLE, (uint32_t)(m0 + lane_id));
                        target = uniform_open01_f64(draw.x[0], draw.x[1]) * total;
                        J = -1;
                    }
                    double running = 0.0;
                    for (int j0 = 0; j0 < n_i; j0 += 32) {
                        if (__all_sync(0xFFFFFFFFu, J >= 0)) break;  // every sample of the chunk placed
                        const int j = j0 + lane_id;
                        const double w = j < n_i ? sampler_exp((double)scores[j] - row_max) : 0.0;
                        const int count = min(32, n_i - j0);
                        for (int t = 0; t < count; t++) {
                            running += __shfl_sync(0xFFFFFFFFu, w, t);
                            if (J < 0 && running > target) J = j0 + t;
                        }
                    }
                    if (J < 0) J = n_i - 1;  // u total rounded up to the total: the last key, as on the CPU
                    return J;
                });
        }
        __syncthreads();  // every warp is done with the rows before the next item's scores
    }
}

template <int kHS>
void sampled_grad_exact_row_launch(float* dqkv, const float* dout, const float* qkv, const float* out, int B, int T,
                                   int C, int NH, int samples, float tau, uint64_t seed, uint32_t step, int layer,
                                   int batch0, const int* walk_counts, const double* walk_weight) {
    const int HS = C / NH;
    const size_t shared_bytes = sizeof(float) * score_tile_floats(HS, kHS > 0);
    static size_t allowed = kDefaultSharedBytes;
    if (shared_bytes > allowed) {
        CUDA_CHECK(cudaFuncSetAttribute(sampled_grad_exact_row_kernel<kHS>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes));
        allowed = shared_bytes;
    }
    const int items = B * NH * ceil_div(T, kScoreTileQueries);
    const int blocks = items < score_resident_blocks() ? items : score_resident_blocks();
    const int row_stride = score_row_stride(T);
    float* rows = static_cast<float*>(score_rows_scratch((size_t)blocks * kScoreTileQueries * row_stride * sizeof(float)));
    launch(sampled_grad_exact_row_kernel<kHS>, blocks, kScoreTileThreads, shared_bytes, nullptr, dqkv, rows, dout, qkv,
           out, B, T, C, NH, samples, tau, seed, step, layer, batch0, walk_counts, walk_weight, row_stride);
}

// ---- host launcher ------------------------------------------------------------

// Errors (a one-line message and exit(1)): samples < 1 or past the draw-index capacity
// (sampled_grad_draws_fit, kernels/common/draws.h, as the CPU twin requires), head size
// past kWarpRowMaxHeadSize, LazyGumbel without top-k lists. No exceeder/fallback
// statistics (the CPU twin's GumbelStats) are collected.
// topk_idx and k are only used by the LazyGumbel source.
inline void sampled_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                       const int* topk_idx, int k, int B, int T, int C, int NH, int samples,
                                       GradSampleSource source, bool signed_start_dv, uint64_t seed, uint32_t step,
                                       int layer, int batch0) {
    if (samples < 1) {
        std::fprintf(stderr, "sampled_attention_backward: need samples >= 1, got %d\n", samples);
        std::exit(1);
    }
    if (NH < 1 || C % NH != 0 || C / NH > kWarpRowMaxHeadSize) {
        std::fprintf(stderr, "sampled_attention_backward: need C %% NH == 0 and head size <= %d (got C=%d NH=%d)\n",
                     kWarpRowMaxHeadSize, C, NH);
        std::exit(1);
    }
    if (source == GradSampleSource::LazyGumbel) {
        if (!topk_idx || k < 1) {
            std::fprintf(stderr, "sampled_attention_backward: the lazy-gumbel source needs top-k lists with k >= 1\n");
            std::exit(1);
        }
    }
    const int HS = C / NH;
    if (!sampled_grad_draws_fit(T, HS, samples, signed_start_dv, source == GradSampleSource::LazyGumbel)) {
        std::fprintf(stderr, "sampled_attention_backward: %ssamples = %d at T = %d overflows the 28-bit draw index, "
                             "expected fewer\n", signed_start_dv ? "signed-start dV with " : "", samples, T);
        std::exit(1);
    }
    if (batch0 < 0 || !draw_rows_fit((long long)batch0 + B, T)) {
        std::fprintf(stderr, "sampled_attention_backward: need batch0 >= 0 and (batch0 + B) * T <= 2^32 draw rows (got "
                             "batch0=%d B=%d T=%d)\n", batch0, B, T);
        std::exit(1);
    }
    const int rows = B * NH * T;
    if (rows == 0) return;
    const float tau = attention_tau(HS);
    const int warps_per_block = kSampledGradThreads / 32;
    const int* walk_counts = nullptr;
    const double* walk_weight = nullptr;
    if (signed_start_dv) {
        const int columns = B * NH * HS;
        const SampledGradWalkScratch scratch = sampled_grad_walk_scratch((size_t)columns, T);
        CUDA_CHECK(cudaMemset(scratch.walk_counts, 0, (size_t)columns * T * sizeof(int)));
        launch(sampled_grad_walk_start_kernel, ceil_div(columns, warps_per_block), kSampledGradThreads, 0, nullptr,
               scratch.cdf, scratch.walk_counts, scratch.walk_weight, dout, B, T, C, NH, samples, seed, step, layer,
               batch0);
        walk_counts = scratch.walk_counts;
        walk_weight = scratch.walk_weight;
    }
    if (source == GradSampleSource::LazyGumbel) {
        launch(sampled_grad_lazy_gumbel_kernel, ceil_div(rows, warps_per_block), kSampledGradThreads, 0, nullptr, dqkv,
               dout, qkv, out, topk_idx, k, B, T, C, NH, samples, tau, seed, step, layer, batch0, walk_counts,
               walk_weight);
        return;
    }
    // the fixed head sizes load float4s: they need qkv 16-byte aligned
    const bool aligned = reinterpret_cast<uintptr_t>(qkv) % 16 == 0;
    auto exact_row = [&](auto hs) {
        sampled_grad_exact_row_launch<decltype(hs)::value>(dqkv, dout, qkv, out, B, T, C, NH, samples, tau, seed, step,
                                                           layer, batch0, walk_counts, walk_weight);
    };
    switch (aligned ? HS : 0) {
        case 8: return exact_row(std::integral_constant<int, 8>{});
        case 16: return exact_row(std::integral_constant<int, 16>{});
        case 32: return exact_row(std::integral_constant<int, 32>{});
        case 64: return exact_row(std::integral_constant<int, 64>{});
        case 128: return exact_row(std::integral_constant<int, 128>{});
        default: return exact_row(std::integral_constant<int, 0>{});
    }
}

}  // namespace knngpt::cuda
