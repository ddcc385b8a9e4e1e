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
// into dqkv; saves nothing. Design: one warp per row, the longest rows first, after
// (signed-start dV only) a walk-start kernel with one warp per column of dO; dK and
// dV by float atomicAdd (so not bit-reproducible), dQ reproducible.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/attention_params.h"
#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"
#include "kernels/common/lazy_gumbel.h"
#include "kernels/cuda/common.cuh"
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
//               cdf_l = sum_{j<=l} exp(s_ij - max_j s_ij)          fp64, summed in j order
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
// ExactRow:
//   pass 1  lanes take keys j = lane, lane + 32, ...; each lane computes whole scores
//           (the sequential chain above); the fp64 row max is a warp max (exact in any
//           order).
//   pass 2  the fp64 total: per group of 32 keys each lane computes its key's weight
//           exp(s_ij - max), and every lane adds the 32 weights, broadcast by shuffles,
//           in j order, so every lane holds the CPU's running sum exactly.
//   pass 3  for each chunk of 32 samples, lane L draws sample m0 + L and walks the
//           running sum again (the same operations in the same order, so the same
//           values) until it first exceeds its target u_m total; the walk stops once
//           every sample of the chunk is placed.
//   No score or weight is stored: passes 2 and 3 recompute them. Cost per row:
//   O((2 + ceil(s/32)) n_i HS / 32) per lane for the samples.
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
// order. Natively the fp64 exp and log are CUDA's (within an ulp or two of glibc's), so
// a pick can differ only when a target lies within an ulp or so of a cumulative sum, or
// two Gumbel-perturbed scores nearly tie; under the emulator every pick is the CPU's.
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

// ---- device helpers -----------------------------------------------------------

// The unnormalised weight exp(s_ij - row_max) of key j, in fp64.
__device__ __forceinline__ double sampled_grad_weight(const float* q, const float* k, int HS, float tau,
                                                      double row_max) {
    return exp((double)attention_score(q, k, HS, tau) - row_max);
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

// One warp per row (b, h, i). walk_counts, walk_weight: the walk-start kernel's output
// for signed-start dV, or nullptr for row-wise dV.
__global__ void sampled_grad_kernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                                    const int* topk_idx, int k, int B, int T, int C, int NH, int samples,
                                    GradSampleSource source, float tau, uint64_t seed, uint32_t step, int layer,
                                    int batch0, const int* walk_counts, const double* walk_weight) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const WarpRow row = warp_row(qkv, warp_index, T, C, NH, /*longest_first=*/true);
    const int i = row.t, h = row.h, b = row.b, n_i = i + 1;
    const int HS = row.HS, C3 = row.C3;
    const size_t head = row.head, row_offset = row.out;
    const float *q = row.q, *keys = row.keys, *values = row.values;  // key and value j at j * C3
    const DrawSite site = row_draw_site(seed, step, layer, NH, h, batch0 + b, T, i);
    const bool lazy = source == GradSampleSource::LazyGumbel;

    double row_max = -INFINITY, total = 0.0;  // ExactRow
    const int* topk = nullptr;                // LazyGumbel: the row's top-k list and exceeder cap
    int max_exceeders = 0;
    if (!lazy) {
        // pass 1: the row max of the scores
        for (int j = lane_id; j < n_i; j += 32)
            row_max = fmax(row_max, (double)attention_score(q, keys + (size_t)j * C3, HS, tau));
        row_max = warp_reduce_max(row_max);

        // pass 2: total = the running sum of the weights in j order, held by every lane
        for (int j0 = 0; j0 < n_i; j0 += 32) {
            const int j = j0 + lane_id;
            const double w = j < n_i ? sampled_grad_weight(q, keys + (size_t)j * C3, HS, tau, row_max) : 0.0;
            const int count = min(32, n_i - j0);
            for (int t = 0; t < count; t++) total += __shfl_sync(0xFFFFFFFFu, w, t);
        }
    } else {
        topk = topk_idx + (((size_t)b * NH + h) * T + i) * k;
        int head_count = 0;
        while (head_count < k && topk[head_count] >= 0) head_count++;
        max_exceeders = lazy_gumbel_default_max_exceeders(n_i - head_count, head_count);
    }

    // the row's channels: lane owns c = lane + 32 s; Delta_i = dO_i . O_i
    float q_reg[kWarpRowSlots], dy_reg[kWarpRowSlots], dv_add[kWarpRowSlots];
    double dq[kWarpRowSlots];
    double delta = 0.0;
    for (int s = 0; s < kWarpRowSlots; s++) {
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
    int walks[kWarpRowSlots];
    float walk_add[kWarpRowSlots];
    int count = samples;
    for (int s = 0; s < kWarpRowSlots; s++) {
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
        int J = 0;  // lanes without a sample count as placed
        if (lazy) {
            // lane L draws lazy Gumbel sample number 2 (m0 + L) + 1
            if (lane_id < chunk)
                J = lazy_gumbel_sample_core(q, keys, C3, HS, tau, n_i, topk, k, site,
                                            sampled_grad_sample_number((uint32_t)(m0 + lane_id)), max_exceeders, nullptr, nullptr);
        } else {
            // pass 3: lane L places sample m0 + L at the first l with cdf_l > u total
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
                const double w = j < n_i ? sampled_grad_weight(q, keys + (size_t)j * C3, HS, tau, row_max) : 0.0;
                const int count = min(32, n_i - j0);
                for (int t = 0; t < count; t++) {
                    running += __shfl_sync(0xFFFFFFFFu, w, t);
                    if (J < 0 && running > target) J = j0 + t;
                }
            }
            if (J < 0) J = n_i - 1;  // u total rounded up to the total: the last key, as on the CPU
        }

        // the terms of the chunk's samples, in sample order
        for (int t = 0; t < chunk; t++) {
            const int m = m0 + t;
            const int j = __shfl_sync(0xFFFFFFFFu, J, t);
            float* dv_j = dqkv + head + (size_t)j * C3 + 2 * C;
            if (m < samples) {  // dQ, dK (and row-wise dV) from the first s samples
                const float* k_j = keys + (size_t)j * C3;
                const float* v_j = values + (size_t)j * C3;
                double dp = 0.0;  // dO_i . v_J
                for (int s = 0; s < kWarpRowSlots; s++) {
                    const int c = lane_id + 32 * s;
                    if (c < HS) dp += (double)dy_reg[s] * v_j[c];
                }
                dp = warp_reduce_sum(dp);
                const double coef = (double)tau * (dp - delta) / samples;
                float* dk_j = dqkv + head + (size_t)j * C3 + C;
                for (int s = 0; s < kWarpRowSlots; s++) {
                    const int c = lane_id + 32 * s;
                    if (c < HS) {
                        dq[s] += coef * k_j[c];
                        atomicAdd(&dk_j[c], (float)(coef * q_reg[s]));
                        if (!signed_dv) atomicAdd(&dv_j[c], dv_add[s]);
                    }
                }
            }
            if (signed_dv) {  // walk m of column c, if row i starts that many, lands on J_m
                for (int s = 0; s < kWarpRowSlots; s++) {
                    const int c = lane_id + 32 * s;
                    if (c < HS && m < walks[s]) atomicAdd(&dv_j[c], walk_add[s]);
                }
            }
        }
    }
    float* dq_out = dqkv + head + (size_t)i * C3;
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c < HS) dq_out[c] += (float)dq[s];
    }
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
    launch(sampled_grad_kernel, ceil_div(rows, warps_per_block), kSampledGradThreads, 0, nullptr, dqkv, dout, qkv,
           out, topk_idx, k, B, T, C, NH, samples, source, tau, seed, step, layer, batch0, walk_counts, walk_weight);
}

}  // namespace knngpt::cuda
