// kernels/cpu/gumbel_attention.h — mode `gumbel` (ALGORITHMS.md §4): the median-of-means
// attention estimator on lazy Gumbel samples from each causal softmax row; twin of
// kernels/cuda/gumbel_attention.cuh (the same samples and the same fp32 sums in order).
//
//   For row (b, h, i), r = groups, t = samples_per_group (§4.4):
//     J_n    = lazy Gumbel sample number 2n (n < r t) on the row's top-k list S_i (§4.2)
//     mean_g = (1/t) sum_{u<t} v_{J_{g t + u}}
//     O^_i[c] = median_{g<r} mean_g[c]   (the mean of the two middle values for even r)
//
// Shapes: qkv (B, T, 3C) as in attention.h; topk_idx (B, NH, T, k), ascending key
// indices per row, -1 padded (rows with n_i <= k hold keys 0..i); out (B, T, C), head
// h at channels h*HS... Nothing is saved for backward: the estimator is discrete
// (§4.5); train it with sampled gradients (sampled_grad.h).
// Design: the sampler itself (lazy Gumbel, the exceeder cap of §9.2, the draw indices of
// §9.3) is kernels/common/lazy_gumbel.h, shared with the CUDA kernels; this file adds the
// host argument checks (cpu::lazy_gumbel_sample), the fallback counters and the estimator.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/lazy_gumbel.h"
#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"
#include "kernels/cpu/attention.h"

namespace knngpt::cpu {

// What the lazy Gumbel draws of a call did (tests ask for it): how many samples,
// exceeders and fallbacks, and the smallest margin of any draw (draws.h), which
// collecting costs a little: only calls with stats measure it.
struct GumbelStats {
    long long samples = 0, exceeders = 0, fallbacks = 0;
    DrawMargin margin;
};

// The shared sampler's helpers, also under knngpt::cpu (callers and tests name them so).
using knngpt::lazy_gumbel_calls_per_sample;
using knngpt::lazy_gumbel_default_max_exceeders;
using knngpt::lazy_gumbel_sample_capacity;
using knngpt::lazy_gumbel_uniform;
using knngpt::LazyGumbelHead;
using knngpt::lazy_gumbel_head_prepare;
using knngpt::LazyGumbelTailCursor;

// The checks lazy_gumbel_sample makes before it samples; on a violation one line to stderr
// and abort(). The row's: its top-k slots ascending distinct keys below n_i (the tail
// cursor relies on this), O(k), so the samplers make it once per row.
inline void lazy_gumbel_check_row(const int* topk, int k, int n_i) {
    for (int head = 0; head < k && topk[head] >= 0; head++) {
        const int j = topk[head];
        if (j >= n_i || (head > 0 && j <= topk[head - 1])) {
            std::fprintf(stderr, "kernels/cpu/gumbel_attention.h: top-k slot %d holds key %d, expected ascending "
                         "distinct keys below n_i = %d\n", head, j, n_i);
            std::abort();
        }
    }
}

// The sample's: sample_index in range.
inline void lazy_gumbel_check_sample_index(uint32_t sample_index, int n_i) {
    if ((uint64_t)sample_index >= lazy_gumbel_sample_capacity(n_i)) {
        std::fprintf(stderr, "kernels/cpu/gumbel_attention.h: sample_index %u out of range for a row of %d keys "
                     "(expected < %llu)\n", sample_index, n_i, (unsigned long long)lazy_gumbel_sample_capacity(n_i));
        std::abort();
    }
}

// lazy_gumbel_sample_core (lazy_gumbel.h) after both checks. `row_checked`: the caller has
// made lazy_gumbel_check_row for this row already (it draws several samples of it).
inline int lazy_gumbel_sample(const float* q_i, const float* keys, int stride, int HS, float tau, int n_i,
                              const int* topk, int k, const DrawSite& site, uint32_t sample_index,
                              int max_exceeders, int* exceeders, bool* fell_back, DrawMargin* margin = nullptr,
                              const LazyGumbelHead* head = nullptr, bool row_checked = false) {
    lazy_gumbel_check_sample_index(sample_index, n_i);
    if (!row_checked) lazy_gumbel_check_row(topk, k, n_i);
    return lazy_gumbel_sample_core(q_i, keys, stride, HS, tau, n_i, topk, k, site, sample_index, max_exceeders,
                                   exceeders, fell_back, margin, head);
}

inline void gumbel_attention_forward(float* out, const float* qkv, const int* topk_idx, int B, int T, int C, int NH,
                                     int k, int groups, int samples_per_group, uint64_t seed, uint32_t step,
                                     int layer, int batch0, GumbelStats* stats = nullptr) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    const int r = groups, t = samples_per_group;
    if (r < 1 || t < 1)
        throw std::invalid_argument("kernels/cpu/gumbel_attention.h: groups and samples_per_group must be >= 1");
    if (batch0 < 0 || !draw_rows_fit((long long)batch0 + B, T))
        throw std::invalid_argument("kernels/cpu/gumbel_attention.h: need batch0 >= 0 and (batch0 + B) * T <= 2^32 "
                                    "draw rows");
    // forward sample u of a row is sample number 2u (even): the last row bounds them all
    if (2ull * (uint64_t)r * (uint64_t)t > lazy_gumbel_sample_capacity(T))
        throw std::invalid_argument("kernels/cpu/gumbel_attention.h: groups * samples_per_group = " +
                                    std::to_string((long long)r * t) + " expected <= " +
                                    std::to_string(lazy_gumbel_sample_capacity(T) / 2) + " at T = " +
                                    std::to_string(T));
    long long total_samples = 0, total_exceeders = 0, total_fallbacks = 0;
    double smallest_margin = INFINITY;
    #pragma omp parallel reduction(+:total_samples, total_exceeders, total_fallbacks) reduction(min:smallest_margin)
    {
        DrawMargin margin;  // this thread's draws, when stats are asked for
        DrawMargin* const margin_or_null = stats ? &margin : nullptr;
        std::vector<float> group_means((size_t)r * HS);  // (r, HS)
        std::vector<float> column(r);
        std::vector<double> head_cdf(k);  // the row's head, shared by its samples
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                const float* keys = qkv + at.k;
                const float* values = qkv + at.v;
                for (int i = 0; i < T; i++) {
                    const float* q_i = qkv + at.q + (size_t)i * C3;
                    const int* topk = topk_idx + (((size_t)b * NH + h) * T + i) * k;
                    const int n_i = i + 1;
                    const DrawSite site = row_draw_site(seed, step, layer, NH, h, batch0 + b, T, i);
                    lazy_gumbel_check_row(topk, k, n_i);
                    LazyGumbelHead head;
                    lazy_gumbel_head_prepare(&head, head_cdf.data(), q_i, keys, C3, HS, tau, topk, k);
                    const int max_exceeders = lazy_gumbel_default_max_exceeders(n_i - head.count, head.count);
                    // r group means of t samples of v_J
                    for (int g = 0; g < r; g++) {
                        float* mean = group_means.data() + (size_t)g * HS;
                        for (int c = 0; c < HS; c++) mean[c] = 0.0f;
                        for (int u = 0; u < t; u++) {
                            int x = 0;
                            bool fell_back = false;
                            const int J = lazy_gumbel_sample(q_i, keys, C3, HS, tau, n_i, topk, k, site,
                                                             gumbel_forward_sample_number((uint32_t)(g * t + u)),
                                                             max_exceeders, &x, &fell_back, margin_or_null,
                                                             &head, true);
                            const float* v_J = values + (size_t)J * C3;
                            for (int c = 0; c < HS; c++) mean[c] += v_J[c];
                            total_exceeders += x;
                            total_fallbacks += fell_back ? 1 : 0;
                        }
                        for (int c = 0; c < HS; c++) mean[c] /= (float)t;
                    }
                    total_samples += (long long)r * t;
                    // coordinate-wise median of the group means
                    float* o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
                    for (int c = 0; c < HS; c++) {
                        for (int g = 0; g < r; g++) column[g] = group_means[(size_t)g * HS + c];
                        std::sort(column.begin(), column.end());
                        o[c] = (r % 2) ? column[r / 2] : 0.5f * (column[r / 2 - 1] + column[r / 2]);
                    }
                }
            }
        }
        smallest_margin = std::fmin(smallest_margin, margin.smallest);
    }
    if (stats) {
        stats->samples += total_samples;
        stats->exceeders += total_exceeders;
        stats->fallbacks += total_fallbacks;
        stats->margin.smallest = std::fmin(stats->margin.smallest, smallest_margin);
    }
}

}  // namespace knngpt::cpu
