// kernels/cuda/gumbel_attention.cuh — the median-of-means lazy Gumbel attention
// estimator, `--attn gumbel` (ALGORITHMS.md §4.4); twin of cpu::gumbel_attention_forward
// (kernels/cpu/gumbel_attention.h): the same samples from the same sampler
// (lazy_gumbel_sample_core, kernels/common/lazy_gumbel.h) and the same fp32 sums in
// the same order, so the same outputs up to the device's fp64 log/exp (bit for bit
// under the emulator). For row (b, h, i), r = groups, t = samples_per_group:
//   J_n = lazy Gumbel sample number 2n (n < r t) on the row's top-k list S_i,
//   mean_g = (sum_{u<t} v_{J_{g t + u}}) / t,  O_i[c] = median_{g<r} mean_g[c].
// Shapes: qkv (B, T, 3C); topk_idx (B, NH, T, k) ascending, -1 padded; out (B, T, C).
// HS <= kWarpRowMaxHeadSize, groups <= kGumbelMaxGroups, 2 r t <=
// lazy_gumbel_sample_capacity(T). Nothing is saved for the backward (train with
// --attn-grad sampled). Design: one warp per row, the longest rows first.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/common/lazy_gumbel.h"
#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/warp_row.cuh"

namespace knngpt::cuda {

constexpr int kGumbelThreads = 256;  // 8 warps, one row each
constexpr int kGumbelMaxGroups = 16;

// ---- CUDA kernel --------------------------------------------------------------

// One warp per row (b, h, i) (warp_row.cuh), the longest rows first. J_n is drawn
// at site {seed, step, layer*NH + h, (batch0 + b)*T + i} with the cap
// lazy_gumbel_default_max_exceeders(n_i - |S_i|, |S_i|), n_i = i + 1 (even sample
// numbers: the sampled backward uses the odd ones).
//   samples  the r t samples of the row in chunks of 32: lane L draws sample n0 + L
//            with the shared sampler (each lane on its own; samples are independent,
//            so the lanes' walks diverge freely and never synchronise inside).
//   means    lanes own channels c = lane + 32 s; for each sample of the chunk, in
//            sample order, J is broadcast by __shfl_sync and every lane adds v_J[c] to
//            its running group sum; at the end of a group the sum / t is stored as
//            mean_g (registers and local memory: kGumbelMaxGroups x kWarpRowSlots).
//   median   per channel, each lane sorts the r group means (insertion sort) and
//            writes the median (the mean of the two middle values for even r).
// No exceeder / fallback statistics (the CPU twin's GumbelStats) are collected.

__global__ void gumbel_attention_forward_kernel(float* out, const float* qkv, const int* topk_idx, int B, int T,
                                                int C, int NH, int k, int groups, int samples_per_group, float tau,
                                                uint64_t seed, uint32_t step, int layer, int batch0) {
    const int lane_id = threadIdx.x % 32;
    const int warp_index = warp_row_index();
    if (warp_index >= B * NH * T) return;  // whole warps leave together
    const WarpRow row = warp_row(qkv, warp_index, T, C, NH, /*longest_first=*/true);
    const int i = row.t, h = row.h, b = row.b, n_i = i + 1;
    const int HS = row.HS, C3 = row.C3;
    const int* topk = topk_idx + (((size_t)b * NH + h) * T + i) * k;
    const DrawSite site = row_draw_site(seed, step, layer, NH, h, batch0 + b, T, i);
    int head = 0;
    while (head < k && topk[head] >= 0) head++;
    const int max_exceeders = lazy_gumbel_default_max_exceeders(n_i - head, head);

    const int r = groups, t = samples_per_group;
    const int total = r * t;
    float sum[kWarpRowSlots];
    float means[kGumbelMaxGroups][kWarpRowSlots];
    for (int s = 0; s < kWarpRowSlots; s++) sum[s] = 0.0f;
    for (int n0 = 0; n0 < total; n0 += 32) {
        const int chunk = min(32, total - n0);
        // lane L draws sample n0 + L (sample number 2 (n0 + L))
        int J = 0;
        if (lane_id < chunk)
            J = lazy_gumbel_sample_core(row.q, row.keys, C3, HS, tau, n_i, topk, k, site,
                                        gumbel_forward_sample_number((uint32_t)(n0 + lane_id)), max_exceeders, nullptr,
                                        nullptr);
        // add the chunk's values in sample order; close a group after its t-th sample
        for (int u = 0; u < chunk; u++) {
            const int j = __shfl_sync(0xFFFFFFFFu, J, u);
            const float* v_j = row.values + (size_t)j * C3;
            for (int s = 0; s < kWarpRowSlots; s++) {
                const int c = lane_id + 32 * s;
                if (c < HS) sum[s] += v_j[c];
            }
            const int n = n0 + u;
            if ((n + 1) % t == 0) {
                const int g = n / t;
                for (int s = 0; s < kWarpRowSlots; s++) {
                    means[g][s] = sum[s] / (float)t;
                    sum[s] = 0.0f;
                }
            }
        }
    }

    // the coordinate-wise median of the group means
    float* o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
    for (int s = 0; s < kWarpRowSlots; s++) {
        const int c = lane_id + 32 * s;
        if (c >= HS) break;
        float column[kGumbelMaxGroups];
        for (int g = 0; g < r; g++) {
            const float x = means[g][s];
            int at = g;
            while (at > 0 && column[at - 1] > x) {
                column[at] = column[at - 1];
                at--;
            }
            column[at] = x;
        }
        o[c] = (r % 2) ? column[r / 2] : 0.5f * (column[r / 2 - 1] + column[r / 2]);
    }
}

// ---- host launcher ------------------------------------------------------------

inline void gumbel_attention_forward(float* out, const float* qkv, const int* topk_idx, int B, int T, int C, int NH,
                                     int k, int groups, int samples_per_group, uint64_t seed, uint32_t step,
                                     int layer, int batch0) {
    if (groups < 1 || groups > kGumbelMaxGroups || samples_per_group < 1) {
        std::fprintf(stderr, "gumbel_attention_forward: need 1 <= groups <= %d and samples_per_group >= 1 in the "
                             "CUDA build (got %d and %d)\n", kGumbelMaxGroups, groups, samples_per_group);
        std::exit(1);
    }
    // forward sample u of a row is sample number 2u: the last row bounds them all
    if (2ull * (uint64_t)groups * (uint64_t)samples_per_group > lazy_gumbel_sample_capacity(T)) {
        std::fprintf(stderr, "gumbel_attention_forward: groups * samples_per_group = %lld, expected <= %llu at T = %d\n",
                     (long long)groups * samples_per_group,
                     (unsigned long long)(lazy_gumbel_sample_capacity(T) / 2), T);
        std::exit(1);
    }
    if (NH < 1 || C % NH != 0 || C / NH > kWarpRowMaxHeadSize || k < 1) {
        std::fprintf(stderr, "gumbel_attention_forward: need C %% NH == 0, head size <= %d and k >= 1 "
                             "(got C=%d NH=%d k=%d)\n", kWarpRowMaxHeadSize, C, NH, k);
        std::exit(1);
    }
    if (batch0 < 0 || !draw_rows_fit((long long)batch0 + B, T)) {
        std::fprintf(stderr, "gumbel_attention_forward: need batch0 >= 0 and (batch0 + B) * T <= 2^32 draw rows (got "
                             "batch0=%d B=%d T=%d)\n", batch0, B, T);
        std::exit(1);
    }
    const int rows = B * NH * T;
    if (rows == 0) return;
    const float tau = attention_tau(C / NH);
    const int rows_per_block = kGumbelThreads / 32;
    launch(gumbel_attention_forward_kernel, ceil_div(rows, rows_per_block), kGumbelThreads, 0, nullptr, out, qkv,
           topk_idx, B, T, C, NH, k, groups, samples_per_group, tau, seed, step, layer, batch0);
}

}  // namespace knngpt::cuda
