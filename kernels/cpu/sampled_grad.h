// kernels/cpu/sampled_grad.h — randomised estimators of the gradients of EXACT causal
// attention, `--attn-grad sampled` (ALGORITHMS.md §5); twin of kernels/cuda/sampled_grad.cuh
// (the same samples, walk starts and terms).
//
// Row-wise, fixed work (default; §5.1, §5.2): for every (b, h, i) draw s samples
// J_1..J_s ~ P_i (row i of the causal softmax) and, with Delta_i = dO_i . O_i taken from
// the given out (not from the samples), add
//   dV_{J_t} += dO_i / s
//   dQ_i     += tau/s sum_t (dO_i . v_{J_t} - Delta_i) k_{J_t}
//   dK_{J_t} += tau/s (dO_i . v_{J_t} - Delta_i) q_i
// Each term is unbiased for the exact gradient when out is exact attention's output;
// after an approximate forward, Delta_i shifts the dQ and dK means (§5.2).
// Signed-start dV (§5.1), per column x = dO[:, c] of one (b, h): N = T s walks, each
// starting at i ~ |x_i| / ||x||_1 and stepping to J ~ P_i, est[J] += sign(x_i) ||x||_1 / N.
// The walks from row i take that row's samples J_{i,0}, J_{i,1}, ... in order (shared with
// dQ, dK and the other columns): each column is unbiased, the columns' errors correlated.
// Sources of J ~ P_i, both exact in law (§5.3): ExactRow recomputes the row (fp32 scores,
// fp64 weights by sampler_exp, inverse CDF); LazyGumbel runs lazy_gumbel_sample on the
// row's top-k list (gumbel_attention.h). Draws (kernels/common/draws.h, §9.3), at the
// row's site with batch0 + b the global batch row: ExactRow sample m is
// DRAW_GRADIENT_SAMPLE index m, LazyGumbel sample number 2m + 1, and the walk starts of a
// column take DRAW_GRADIENT_SAMPLE indices from kWalkStartDrawIndex at the head's site.
//
// Shapes: qkv/dqkv (B, T, 3C) as in attention.h; dout, out (B, T, C); topk_idx
// (B, NH, T, k) top-k lists (ascending, -1 padded; nullptr allowed for ExactRow).
// Saves nothing; accumulates (+=) into dqkv.
// Design: one thread owns a (b, h) and sums its dK and dV in fp64 in a fixed order before
// adding them, so the result does not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/attention_params.h"
#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"
#include "kernels/common/sampler_exp.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gumbel_attention.h"
#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/vector_math.h"

namespace knngpt {
// The exp of the exact-row weights. Called unqualified from knngpt::cpu, so that a test
// may declare knngpt::cpu::row_weight_exp before this header to stand in for another
// device's exp (test_draw_margin).
inline double row_weight_exp(double x) { return sampler_exp(x); }
}  // namespace knngpt

namespace knngpt::cpu {

using knngpt::GradSampleSource;

// std::upper_bound(a, a + n, x) - a for ascending a[0..n), n >= 1, without a branch
// on the data: each halving step is a conditional move, so the ~log2 n comparisons of
// a pick, random in u, cost no mispredicted branches.
inline int upper_bound_branchless(const double* a, int n, double x) {
    const double* base = a;
    while (n > 1) {
        const int half = n / 2;
        base = base[half] <= x ? base + half : base;
        n -= half;
    }
    return (int)(base - a) + (*base <= x ? 1 : 0);
}

// Inverse-CDF pick from ascending cumulative weights cdf[0..n): the first l with
// cdf[l] > u cdf[n-1]. margin (tests): the target against the two sums around it,
// whose terms may each carry a relative error `term_error` (1 for sums of weights
// computed with exp, whose additions can then round differently, up to n ulps;
// 0 for exact terms).
inline int sampled_grad_pick(const double* cdf, int n, double u, DrawMargin* margin = nullptr,
                             double term_error = 1.0) {
    const double target = u * cdf[n - 1];
    const int l = upper_bound_branchless(cdf, n, target);
    if (margin) {
        const double amplification = 1.0 + term_error * n;
        if (l < n) margin->compare(cdf[l], target, 0.0, amplification);
        if (l > 0) margin->compare(cdf[l - 1], target, 0.0, amplification);
    }
    return l < n ? l : n - 1;
}

// Signed-start dV's walk starts of one (b, h): for each column c of d_o (row i at
// i * row_stride, T rows), the N = T s walk starts counted per row into
// walk_counts[c * T + i], and the walk weight ||x||_1 / N into walk_weight[c].
// cdf: scratch of T doubles.
inline void sampled_grad_walk_starts(int* walk_counts, double* walk_weight, const float* d_o, size_t row_stride, int T,
                                     int HS, int samples, const DrawSite& head_site, double* cdf,
                                     DrawMargin* margin = nullptr) {
    const long long walks = (long long)T * samples;
    std::fill(walk_counts, walk_counts + (size_t)HS * T, 0);
    for (int c = 0; c < HS; c++) {
        double l1 = 0.0;
        for (int i = 0; i < T; i++) {
            l1 += std::fabs((double)d_o[(size_t)i * row_stride + c]);
            cdf[i] = l1;
        }
        walk_weight[c] = l1 / (double)walks;
        if (l1 == 0.0) continue;  // column of zeros: no walks, dV column 0
        for (long long n = 0; n < walks; n++) {
            Philox4 w = philox_draw(head_site, DRAW_GRADIENT_SAMPLE, walk_start_draw_index(c, walks, n));
            // the terms |x_i| are exact, so the sums are the same on every device
            walk_counts[(size_t)c * T + sampled_grad_pick(cdf, T, uniform_open01_f64(w.x[0], w.x[1]), margin, 0.0)]++;
        }
    }
}

// The exact-row sampler's cumulative weights of query i: cdf[l] = sum_{j<=l}
// exp(s_ij - max_j s_ij), fp64, in key order, s_ij = attention_score (n_i keys), exp =
// sampler_exp (kernels/common/sampler_exp.h, through row_weight_exp), which the CUDA
// twin shares.
// With `row_dots`, the row's attention_dot values are given (the backward scores four
// rows per pass over the head's 8-lane key panel: the same chains, topk_panel.h), and
// s_ij = tau * row_dots[j], so the same cdf.
inline void sampled_grad_exact_row_cdf(double* cdf, const float* q_i, const float* keys, int stride, int HS,
                                       float tau, int n_i, const float* row_dots = nullptr) {
    double row_max = -INFINITY;
    if (row_dots) {
        // the row's largest score in eight running maxima (one would be a chain of
        // dependent max instructions as long as the row); the same value in any order
        float lane_max[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (int j0 = 0; j0 < n_i; j0 += 8)
            for (int l = 0; l < std::min(8, n_i - j0); l++) {
                const float x = tau * row_dots[j0 + l];
                cdf[j0 + l] = x;
                lane_max[l] = std::max(lane_max[l], x);
            }
        for (int l = 0; l < 8; l++) row_max = std::max(row_max, (double)lane_max[l]);
    }
    constexpr int W = 8;  // keys scored side by side (attention_scores: attention_score's chains)
    for (int j0 = 0; j0 < (row_dots ? 0 : n_i); j0 += W) {
        const int count = std::min(W, n_i - j0);
        const float* key_ptrs[W] = {};
        for (int w = 0; w < count; w++) key_ptrs[w] = keys + (size_t)(j0 + w) * stride;
        float s[W];
        attention_scores<W>(s, q_i, key_ptrs, count, HS, tau);
        for (int w = 0; w < count; w++) {
            cdf[j0 + w] = s[w];
            row_max = std::max(row_max, cdf[j0 + w]);
        }
    }
    for (int j = 0; j < n_i; j++) cdf[j] = row_weight_exp(cdf[j] - row_max);  // vectorised
    double running = 0.0;  // in key order, as the CUDA twin sums them
    for (int j = 0; j < n_i; j++) cdf[j] = running += cdf[j];
}

// Draws backward samples m = 0..count-1 of query i of one (b, h) into J[0..count).
// row_dots: as sampled_grad_exact_row_cdf's (ExactRow; optional).
// cdf: scratch of max(n_i, k) doubles: the cumulative weights (ExactRow), or the row's
// head summary, computed once for all its samples (LazyGumbel: lazy_gumbel_head_prepare). Returns exceeders and fallbacks in the counters;
// margin (tests): the draws' margins (kernels/common/draws.h).
inline void sampled_grad_row_samples(int* J, int count, GradSampleSource source, const float* q_i,
                                     const float* keys, int stride, int HS, float tau, int n_i, const int* topk,
                                     int k, const DrawSite& site, double* cdf, long long* exceeders,
                                     long long* fallbacks, DrawMargin* margin = nullptr,
                                     const float* row_dots = nullptr) {
    if (count <= 0) return;
    if (source == GradSampleSource::ExactRow) {
        sampled_grad_exact_row_cdf(cdf, q_i, keys, stride, HS, tau, n_i, row_dots);
        for (int m = 0; m < count; m++) {
            Philox4 w = philox_draw(site, DRAW_GRADIENT_SAMPLE, (uint32_t)m);
            J[m] = sampled_grad_pick(cdf, n_i, uniform_open01_f64(w.x[0], w.x[1]), margin);
        }
    } else {
        lazy_gumbel_check_row(topk, k, n_i);
        LazyGumbelHead head;  // the row's head summary, its cumulative weights in cdf[0, k)
        lazy_gumbel_head_prepare(&head, cdf, q_i, keys, stride, HS, tau, topk, k);
        const int max_exceeders = lazy_gumbel_default_max_exceeders(n_i - head.count, head.count);
        for (int m = 0; m < count; m++) {
            int x = 0;
            bool fell_back = false;
            J[m] = lazy_gumbel_sample(q_i, keys, stride, HS, tau, n_i, topk, k, site,
                                      sampled_grad_sample_number((uint32_t)m), max_exceeders, &x, &fell_back, margin,
                                      &head, true);
            *exceeders += x;
            *fallbacks += fell_back ? 1 : 0;
        }
    }
}

inline void sampled_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                       const int* topk_idx, int k, int B, int T, int C, int NH, int samples,
                                       GradSampleSource source, bool signed_start_dv, uint64_t seed,
                                       uint32_t step, int layer, int batch0, GumbelStats* stats = nullptr) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = attention_tau(HS);
    const int s = samples;
    const char* where = "kernels/cpu/sampled_grad.h: ";
    if (s < 1) throw std::invalid_argument(std::string(where) + "samples = " + std::to_string(s) + ", expected >= 1");
    if (source == GradSampleSource::LazyGumbel && (!topk_idx || k < 1))
        throw std::invalid_argument(std::string(where) + "topk_idx with k >= 1 expected for the LazyGumbel source");
    if (!sampled_grad_draws_fit(T, HS, s, signed_start_dv, source == GradSampleSource::LazyGumbel))
        throw std::invalid_argument(std::string(where) + "samples = " + std::to_string(s) + " at T = " +
                                    std::to_string(T) + " overflows the 28-bit draw index, expected fewer");
    if (batch0 < 0 || !draw_rows_fit((long long)batch0 + B, T))
        throw std::invalid_argument(std::string(where) + "need batch0 >= 0 and (batch0 + B) * T <= 2^32 draw rows");

    long long total_samples = 0, total_exceeders = 0, total_fallbacks = 0;
    double smallest_margin = INFINITY;
    #pragma omp parallel reduction(+:total_samples, total_exceeders, total_fallbacks) reduction(min:smallest_margin)
    {
        DrawMargin margin;  // this thread's draws (walk starts too), when stats are asked for
        DrawMargin* const margin_or_null = stats ? &margin : nullptr;
        std::vector<double> dk_head((size_t)T * HS), dv_head((size_t)T * HS), dq_row(HS);  // fp64 sums
        std::vector<double> q_row(HS), d_o_row(HS);
        std::vector<double> cdf(std::max(T, k));
        // ExactRow: the head's keys as 8-lane panels, packed once per (b, h), and the scores of
        // four rows at a time, (4, ld_dots): one pass over the panel serves the four (the
        // panel of a long row is larger than the L2 cache), each lane attention_dot's chain
        std::vector<float> panel, dots, q4((size_t)4 * HS);
        const size_t ld_dots = (size_t)topk_num_chunks(T) * kTopkLanes;
        if (source == GradSampleSource::ExactRow) {
            panel.resize((size_t)topk_num_chunks(T) * HS * kTopkLanes);
            dots.resize(4 * ld_dots);
        }
        std::vector<int> J;
        std::vector<int> walk_counts;         // (HS, T): walks of column c starting at row i
        std::vector<double> walk_weight(HS);  // ||x||_1 / N per column
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                const float* keys = qkv + at.k;
                const float* values = qkv + at.v;
                const float* d_o = dout + (size_t)b * T * C + (size_t)h * HS;  // row i at i*C
                const float* o = out + (size_t)b * T * C + (size_t)h * HS;
                std::fill(dk_head.begin(), dk_head.end(), 0.0);
                std::fill(dv_head.begin(), dv_head.end(), 0.0);
                if (!panel.empty()) topk_pack_head_keys(panel.data(), keys, C3, T, HS);

                // signed-start dV: the walk starts of every column, counted per row
                if (signed_start_dv) {
                    walk_counts.resize((size_t)HS * T);
                    sampled_grad_walk_starts(walk_counts.data(), walk_weight.data(), d_o, C, T, HS, s,
                                             head_draw_site(seed, step, layer, NH, h, batch0 + b, T), cdf.data(),
                                             margin_or_null);
                }

                for (int i = 0; i < T; i++) {
                    const int n_i = i + 1;
                    const float* q_i = qkv + at.q + (size_t)i * C3;
                    const float* d_o_i = d_o + (size_t)i * C;
                    const float* o_i = o + (size_t)i * C;
                    const int* topk = topk_idx ? topk_idx + (((size_t)b * NH + h) * T + i) * k : nullptr;
                    const DrawSite site = row_draw_site(seed, step, layer, NH, h, batch0 + b, T, i);
                    // samples J_{i,0..count-1}: s for dQ/dK (and dV), more if a column's walks need them
                    int count = s;
                    if (signed_start_dv)
                        for (int c = 0; c < HS; c++) count = std::max(count, walk_counts[(size_t)c * T + i]);
                    J.resize(count);
                    if (!panel.empty() && i % 4 == 0) {  // rows i..i+3 (the last row repeated past T)
                        const float* q_rows[4];
                        for (int r = 0; r < 4; r++) q_rows[r] = qkv + at.q + (size_t)std::min(i + r, T - 1) * C3;
                        topk_interleave_queries(q4.data(), q_rows, HS);
                        topk_score_chunks_4q(dots.data(), ld_dots, q4.data(), panel.data(),
                                             topk_num_chunks(std::min(i + 4, T)), HS);
                    }
                    sampled_grad_row_samples(J.data(), count, source, q_i, keys, C3, HS, tau, n_i, topk, k, site,
                                             cdf.data(), &total_exceeders, &total_fallbacks, margin_or_null,
                                             panel.empty() ? nullptr : dots.data() + (size_t)(i % 4) * ld_dots);
                    total_samples += count;

                    // Delta_i = dO_i . O_i from the given out
                    const double delta = dot_f64_lanes(d_o_i, o_i, HS);
                    // the row's q_i and dO_i / s in double, converted once for all its samples
                    for (int c = 0; c < HS; c++) {
                        q_row[c] = q_i[c];
                        d_o_row[c] = (double)d_o_i[c] / s;
                    }
                    // dQ_i and dK_J from the first s samples
                    std::fill(dq_row.begin(), dq_row.end(), 0.0);
                    for (int t = 0; t < s; t++) {
                        const float* k_J = keys + (size_t)J[t] * C3;
                        const float* v_J = values + (size_t)J[t] * C3;
                        const double dp = dot_f64_lanes(d_o_i, v_J, HS);  // dO_i . v_J
                        const double coef = (double)tau * (dp - delta) / s;
                        double* dk_J = dk_head.data() + (size_t)J[t] * HS;
                        for (int c = 0; c < HS; c++) {
                            dq_row[c] += coef * k_J[c];
                            dk_J[c] += coef * q_row[c];
                        }
                    }
                    float* dq_i = dqkv + at.q + (size_t)i * C3;
                    for (int c = 0; c < HS; c++) dq_i[c] += (float)dq_row[c];
                    // dV: row-wise, or the signed-start walks that began at row i
                    if (!signed_start_dv) {
                        for (int t = 0; t < s; t++) {
                            double* dv_J = dv_head.data() + (size_t)J[t] * HS;
                            for (int c = 0; c < HS; c++) dv_J[c] += d_o_row[c];
                        }
                    } else {
                        for (int c = 0; c < HS; c++) {
                            const double x_ic = d_o_i[c];
                            const double add = x_ic > 0 ? walk_weight[c] : -walk_weight[c];
                            const int n_walks = walk_counts[(size_t)c * T + i];
                            for (int m = 0; m < n_walks; m++) dv_head[(size_t)J[m] * HS + c] += add;
                        }
                    }
                }
                // dK, dV of the head into dqkv
                for (int j = 0; j < T; j++) {
                    float* dk_j = dqkv + at.k + (size_t)j * C3;
                    float* dv_j = dqkv + at.v + (size_t)j * C3;
                    for (int c = 0; c < HS; c++) {
                        dk_j[c] += (float)dk_head[(size_t)j * HS + c];
                        dv_j[c] += (float)dv_head[(size_t)j * HS + c];
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
