// kernels/cpu/gumbel_attention.h — lazy Gumbel sampling from a causal softmax
// row, and the median-of-means attention estimator built on it (mode `gumbel`,
// ALGORITHMS.md §4; counters §9.3, the exceeder cap §9.2).
//
// Attention as an expectation (§1): for query i with keys C_i = {0..i},
//   s_ij = tau q_i . k_j,   P_ij = exp(s_ij) / sum_{l<=i} exp(s_il),   O_i = E_{J~P_i}[v_J].
//
// Lazy Gumbel sample J ~ P_i, given the top-k set S_i (§4.2):
//   1. head: G_j ~ Gumbel for j in S_i;  M = max_j (s_ij + G_j),  J = argmax
//   2. B = M - s_min,  s_min = min_{j in S_i} s_ij;  p = P(G > B) = -expm1(-e^{-B})
//   3. walk the tail positions 0..|R_i|-1 (R_i = C_i \ S_i, ascending key order) with
//      independent Geometric(p) skips, skip = floor(log u / log1p(-p)): every visited
//      position is one exceeder (a tail key whose Gumbel exceeds B). This is the
//      Binomial(|R_i|, p) subset of DISTINCT, uniformly placed tail keys, without a
//      Binomial sampler.
//   4. each exceeder j gets G_j ~ Gumbel truncated to (B, inf), in the stable form
//      E = -log1p(u expm1(-e^{-B})), G = -log E   (E = e^{-G} is Exp(1) below e^{-B});
//      if s_ij + G_j > M then M = s_ij + G_j, J = j.
//   Tail keys that are not exceeders have s_ij + G_j <= s_min + B = M and cannot win,
//   so J has the law of the full-row Gumbel-max argmax: an exact sample from P_i.
//   Expected exceeders <= |R_i| / k (§4.3). Exactness needs S_i to be a true top-k
//   (min_{S_i} s_ij >= every tail score); with an approximate index a tail key scoring
//   above s_min can be missed (§4.3 widens B for that case; not done here).
//
// Exceeder cap (§9.2): the walk evaluates at most `max_exceeders` exceeders lazily.
// When it finds one more, it evaluates that exceeder as usual and then finishes the
// row densely: every remaining tail position after it gets a full (unconditioned)
// Gumbel, i.e. an exact Gumbel-max over the rest of the row. The remaining positions
// are exactly the ones the walk had not yet decided, and a full Gumbel exceeds B with
// probability p, as a skip would have decided, so the sample stays exact. (Restarting
// a fresh full-row Gumbel-max instead would not be exact: hitting the cap is
// correlated with a tail key winning.) Fallbacks are counted.
//
// Draw indices (philox.h: index < 2^28 per purpose). At site {seed, step,
// layer*NH + h, b*T + i}, sample number `sample_index` owns the block of
//   D(n_i) = ceil(n_i / 2) Philox calls per purpose, starting at sample_index * D(n_i);
// each call gives two fp64 uniforms (words 0,1 and 2,3), so draw d of a purpose is
// call sample_index * D + d/2, pair d % 2:
//   DRAW_HEAD_GUMBEL       d = head slot (0..k-1)
//   DRAW_GEOMETRIC_SKIP    d = walk step (at most |R_i| + 1 <= n_i steps)
//   DRAW_TRUNCATED_GUMBEL  d = tail position (truncated Gumbel for walk exceeders,
//                          full Gumbel for positions swept after a fallback; a row
//                          with an empty head set uses it for its plain Gumbel-max)
// So a row supports 2^28 / D(n_i) sample numbers (2^19 at n_i = 1024). Sample numbers
// are split between users by parity: the `gumbel` forward uses even numbers 2u, the
// sampled backward (sampled_grad.h) odd numbers 2m + 1, so the backward draws fresh
// samples (§9.1).
//
// Median of means (§4.4): r groups of t samples, mean_g = (1/t) sum_u v_{J_u},
// O^_i[c] = median_g mean_g[c] (the mean of the two middle values for even r).
//
// Shapes: qkv (B, T, 3C) as in attention.h; topk_idx (B, NH, T, k), ascending key
// indices per row, -1 padded (rows with n_i <= k hold keys 0..i); out (B, T, C), head
// h at channels h*HS... Nothing is saved for backward: the estimator is discrete
// (§4.5); train it with sampled gradients (sampled_grad.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/common/fma_dot.h"
#include "kernels/common/philox.h"
#include "kernels/cpu/attention.h"

namespace knngpt::cpu {

struct GumbelStats {
    long long samples = 0, exceeders = 0, fallbacks = 0;
};

// Philox calls per purpose reserved for one sample of a row with n_i keys.
inline uint32_t lazy_gumbel_calls_per_sample(int n_i) { return (uint32_t)(n_i + 1) / 2; }

// How many sample numbers a row with n_i keys supports: 2^28 / ceil(n_i / 2).
inline uint64_t lazy_gumbel_sample_capacity(int n_i) {
    return (1ull << 28) / (uint64_t)lazy_gumbel_calls_per_sample(n_i < 1 ? 1 : n_i);
}

// The default exceeder cap for a row with `tail` tail keys and `head` top-k keys. The
// exceeder count is about |R_i| Y / k with Y ~ Exp(1) (§4.3: e^{-(M - log Z_S)} is
// Exp(1)), so a cap of 8 ceil(|R_i|/k) + 8 is passed with probability about e^{-8};
// a fallback costs O(n_i), so the expected fallback cost, about e^{-8} n_i, stays far
// below the n_i / k of the walk.
inline int lazy_gumbel_default_max_exceeders(int tail, int head) {
    if (head < 1) head = 1;
    return 8 * ((tail + head - 1) / head) + 8;
}

// s_ij = tau q_i . k_j with the dot product of fma_dot.h, so the CUDA sampler
// (kernels/cuda/sampled_grad.cuh) computes the same score bit for bit.
inline float lazy_gumbel_score(const float* q_i, const float* k_j, int HS, float tau) {
    return tau * fma_dot(q_i, k_j, HS);
}

// Fp64 uniform number d of `purpose` for the sample whose block starts at call `base`.
inline double lazy_gumbel_uniform(const DrawSite& site, uint32_t purpose, uint32_t base, int d) {
    Philox4 w = philox_draw(site, purpose, base + (uint32_t)(d >> 1));
    return (d & 1) ? uniform_open01_f64(w.x[2], w.x[3]) : uniform_open01_f64(w.x[0], w.x[1]);
}

// Maps increasing tail positions to keys of C_i \ S_i (ascending), skipping the sorted
// head keys with a cursor: key = pos + (number of head keys <= key).
struct LazyGumbelTailCursor {
    const int* head_keys;
    int head_count;
    int passed = 0;  // head keys below the current key
    int key(int pos) {
        while (passed < head_count && head_keys[passed] <= pos + passed) passed++;
        return pos + passed;
    }
};

inline int lazy_gumbel_sample(const float* q_i, const float* keys, int stride, int HS, float tau, int n_i,
                              const int* topk, int k, const DrawSite& site, uint32_t sample_index,
                              int max_exceeders, int* exceeders, bool* fell_back) {
    if ((uint64_t)sample_index >= lazy_gumbel_sample_capacity(n_i)) {
        std::fprintf(stderr, "kernels/cpu/gumbel_attention.h: sample_index %u out of range for a row of %d keys "
                     "(expected < %llu)\n", sample_index, n_i, (unsigned long long)lazy_gumbel_sample_capacity(n_i));
        std::abort();
    }
    const uint32_t base = sample_index * lazy_gumbel_calls_per_sample(n_i);
    const double inf = std::numeric_limits<double>::infinity();
    auto key_row = [&](int j) { return keys + (size_t)j * stride; };

    // 1. head: Gumbel-max over the top-k slots (valid slots come first, then -1)
    int head = 0;
    double M = -inf, s_min = inf;
    int best = -1;
    for (; head < k && topk[head] >= 0; head++) {
        const int j = topk[head];
        if (j >= n_i || (head > 0 && j <= topk[head - 1])) {  // the tail cursor relies on this
            std::fprintf(stderr, "kernels/cpu/gumbel_attention.h: top-k slot %d holds key %d, expected ascending "
                         "distinct keys below n_i = %d\n", head, j, n_i);
            std::abort();
        }
        const double s = lazy_gumbel_score(q_i, key_row(j), HS, tau);
        const double g = -std::log(-std::log(lazy_gumbel_uniform(site, DRAW_HEAD_GUMBEL, base, head)));
        if (s + g > M) { M = s + g; best = j; }
        s_min = std::min(s_min, s);
    }
    const int tail = n_i - head;
    int x = 0;  // exceeders: tail keys whose Gumbel exceeds B
    bool fallback = false;

    if (tail > 0 && head == 0) {
        // no head set: a plain Gumbel-max over the whole row (tail position = key)
        for (int j = 0; j < n_i; j++) {
            const double g = -std::log(-std::log(lazy_gumbel_uniform(site, DRAW_TRUNCATED_GUMBEL, base, j)));
            const double s = lazy_gumbel_score(q_i, key_row(j), HS, tau);
            if (s + g > M) { M = s + g; best = j; }
        }
    } else if (tail > 0) {
        // 2. threshold and exceedance probability, in fp64
        const double B = M - s_min;
        const double e_minus_B = std::exp(-B);
        const double p = -std::expm1(-e_minus_B);
        const double log_no_exceed = std::log1p(-p);  // log(1 - p) < 0 (-0 when p = 0: no exceeders)
        const double trunc_scale = std::expm1(-e_minus_B);  // in [-1, 0)
        LazyGumbelTailCursor cursor{topk, head};
        // 3.-4. geometric-skip walk: each visited position is one exceeder
        long long pos = -1;
        for (int step = 0;; step++) {
            const double u = lazy_gumbel_uniform(site, DRAW_GEOMETRIC_SKIP, base, step);
            const double skip = std::floor(std::log(u) / log_no_exceed);  // +inf when p = 0
            if (!((double)pos + 1.0 + skip < (double)tail)) break;
            pos += 1 + (long long)skip;
            x++;
            const int j = cursor.key((int)pos);
            const double ut = lazy_gumbel_uniform(site, DRAW_TRUNCATED_GUMBEL, base, (int)pos);
            const double g = -std::log(-std::log1p(ut * trunc_scale));  // Gumbel truncated to (B, inf)
            const double s = lazy_gumbel_score(q_i, key_row(j), HS, tau);
            if (s + g > M) { M = s + g; best = j; }
            if (x > max_exceeders) {
                // cap hit: finish the row densely with full Gumbels (exact, see the header)
                fallback = true;
                for (int rest = (int)pos + 1; rest < tail; rest++) {
                    const double gr =
                        -std::log(-std::log(lazy_gumbel_uniform(site, DRAW_TRUNCATED_GUMBEL, base, rest)));
                    if (gr <= B) continue;  // s + g <= s_min + B = M: cannot win
                    x++;
                    const int jr = cursor.key(rest);
                    const double sr = lazy_gumbel_score(q_i, key_row(jr), HS, tau);
                    if (sr + gr > M) { M = sr + gr; best = jr; }
                }
                break;
            }
        }
    }
    if (exceeders) *exceeders = x;
    if (fell_back) *fell_back = fallback;
    return best;
}

inline void gumbel_attention_forward(float* out, const float* qkv, const int* topk_idx, int B, int T, int C, int NH,
                                     int k, int groups, int samples_per_group, uint64_t seed, uint32_t step,
                                     int layer, GumbelStats* stats = nullptr) {
    const int HS = C / NH;
    const int C3 = 3 * C;
    const float tau = 1.0f / std::sqrt((float)HS);
    const int r = groups, t = samples_per_group;
    if (r < 1 || t < 1)
        throw std::invalid_argument("kernels/cpu/gumbel_attention.h: groups and samples_per_group must be >= 1");
    // forward sample u of a row is sample number 2u (even): the last row bounds them all
    if (2ull * (uint64_t)r * (uint64_t)t > lazy_gumbel_sample_capacity(T))
        throw std::invalid_argument("kernels/cpu/gumbel_attention.h: groups * samples_per_group = " +
                                    std::to_string((long long)r * t) + " expected <= " +
                                    std::to_string(lazy_gumbel_sample_capacity(T) / 2) + " at T = " +
                                    std::to_string(T));
    long long total_samples = 0, total_exceeders = 0, total_fallbacks = 0;
    #pragma omp parallel reduction(+:total_samples, total_exceeders, total_fallbacks)
    {
        std::vector<float> group_means((size_t)r * HS);  // (r, HS)
        std::vector<float> column(r);
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
                    const DrawSite site{seed, step, (uint32_t)(layer * NH + h), (uint32_t)(b * T + i)};
                    int head = 0;
                    while (head < k && topk[head] >= 0) head++;
                    const int max_exceeders = lazy_gumbel_default_max_exceeders(n_i - head, head);
                    // r group means of t samples of v_J
                    for (int g = 0; g < r; g++) {
                        float* mean = group_means.data() + (size_t)g * HS;
                        for (int c = 0; c < HS; c++) mean[c] = 0.0f;
                        for (int u = 0; u < t; u++) {
                            int x = 0;
                            bool fell_back = false;
                            const int J = lazy_gumbel_sample(q_i, keys, C3, HS, tau, n_i, topk, k, site,
                                                             2u * (uint32_t)(g * t + u), max_exceeders, &x,
                                                             &fell_back);
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
    }
    if (stats) {
        stats->samples += total_samples;
        stats->exceeders += total_exceeders;
        stats->fallbacks += total_fallbacks;
    }
}

}  // namespace knngpt::cpu
