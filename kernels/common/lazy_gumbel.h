// kernels/common/lazy_gumbel.h — lazy Gumbel sampling from a causal softmax row
// (ALGORITHMS.md §4; the exceeder cap §9.2): the one sampler of both backends.
// kernels/cpu/gumbel_attention.h (the `gumbel` forward, and cpu::lazy_gumbel_sample,
// which checks its arguments and calls the core below), kernels/cpu/sampled_grad.h
// and the CUDA kernels (kernels/cuda/gumbel_attention.cuh, sampled_grad.cuh) all call
// this code, so for the same row and draw site every backend picks the same key.
//
//   s_ij = tau q_i . k_j,  P_ij = exp(s_ij) / sum_{l<=i} exp(s_il),  J ~ P_i exactly:
//   the Gumbel-max argmax of the row, with one located Gumbel for the whole top-k head
//   S_i and a Gumbel only for the tail keys that can beat the head's maximum (the
//   exceeders, reached by geometric skips). The steps are above lazy_gumbel_sample_core.
//
// Design: everything here is KNNGPT_HD (__host__ __device__ under nvcc) and uses only
// what compiles in both: <cmath>'s exp, expm1, log1p, log and floor (a few per row or
// sample) and sampler_log.h's logarithms (every Gumbel, skip and truncated Gumbel); no
// allocation, no output, no abort. The argument checks live in the host wrapper.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"
#include "kernels/common/hd.h"
#include "kernels/common/sampler_log.h"

namespace knngpt {

// The default exceeder cap for a row with `tail` tail keys and `head` top-k keys. The
// exceeder count is about |R_i| Y / k with Y ~ Exp(1) (§4.3: e^{-(M - log Z_S)} is
// Exp(1)), so a cap of 8 ceil(|R_i|/k) + 8 is passed with probability about e^{-8};
// a fallback costs O(n_i), so the expected fallback cost, about e^{-8} n_i, stays far
// below the n_i / k of the walk.
KNNGPT_HD int lazy_gumbel_default_max_exceeders(int tail, int head) {
    if (head < 1) head = 1;
    return 8 * ((tail + head - 1) / head) + 8;
}

// Exceeders scored side by side by the tail walk (attention_scores).
constexpr int kLazyGumbelScoreBatch = 16;

// Draw indices (philox.h: index < 2^28 per purpose). At site {seed, step,
// layer*NH + h, b*T + i}, sample number `sample_index` owns the block of
//   D(n_i) = ceil(n_i / 2) Philox calls per purpose, starting at sample_index * D(n_i);
// each call gives two fp64 uniforms (words 0,1 and 2,3), so draw d of a purpose is
// call sample_index * D + d/2, pair d % 2:
//   DRAW_HEAD_GUMBEL       d = 0: the head maximum's Gumbel G_0; d = 1: the uniform that
//                          picks the head slot
//   DRAW_GEOMETRIC_SKIP    d = walk step (at most |R_i| + 1 <= n_i steps; drawn 8 at a
//                          time, so up to 7 draws past the walk's end are computed and
//                          never used, some in the next sample's block)
//   DRAW_TRUNCATED_GUMBEL  d = tail position (truncated Gumbel for walk exceeders,
//                          full Gumbel for positions swept after a fallback; a row
//                          with an empty head set uses it for its plain Gumbel-max)
// So a row supports 2^28 / D(n_i) sample numbers (2^19 at n_i = 1024). Sample numbers
// are split between users by parity (draws.h): the `gumbel` forward uses even numbers
// 2u, the sampled backward (sampled_grad.h) odd numbers 2m + 1, so the backward draws fresh
// samples (§9.1).
//
// Fp64 uniform number d of `purpose` for the sample whose block starts at call `base`.
KNNGPT_HD double lazy_gumbel_uniform(const DrawSite& site, uint32_t purpose, uint32_t base, int d) {
    Philox4 w = philox_draw(site, purpose, base + (uint32_t)(d >> 1));
    return (d & 1) ? uniform_open01_f64(w.x[2], w.x[3]) : uniform_open01_f64(w.x[0], w.x[1]);
}

// The head of a row (step 1), the same for all its samples: the valid top-k slots
// (they come first, then -1), s_max and s_min of their scores s_j, and the cumulative
// weights cdf[h] = sum_{slots <= h} exp(s_j - s_max), fp64 in slot order. Built by
// lazy_gumbel_head_prepare, once per row, by callers that draw several samples of it;
// with no buffer (cdf null) the sampler recomputes the scores and the same sums while it
// picks, so both ways give the same sample.
struct LazyGumbelHead {
    int count = 0;                 // valid slots
    double s_max = -(double)INFINITY, s_min = (double)INFINITY;
    double mass = 0.0;             // cdf[count - 1]: Z_S e^{-s_max}
    const double* cdf = nullptr;   // (count) or null
};

// Fills `head` for the top-k slots of a row; cdf: a buffer of k doubles that it fills
// (first with the scores, then, in place, with their cumulative weights) and keeps a
// pointer to, or null (then `head` holds no array and the scores are computed twice).
KNNGPT_HD void lazy_gumbel_head_prepare(LazyGumbelHead* head, double* cdf, const float* q_i, const float* keys,
                                        int stride, int HS, float tau, const int* topk, int k) {
    LazyGumbelHead h;
    while (h.count < k && topk[h.count] >= 0) h.count++;
    // the scores: with a buffer, kLazyGumbelScoreBatch side by side (attention_scores: the
    // same chains, their fma latencies overlapped; one chain at a time is ~HS * 4 cycles)
    for (int slot0 = 0; slot0 < h.count; slot0 += (cdf ? kLazyGumbelScoreBatch : 1)) {
        float s32[kLazyGumbelScoreBatch];
        int count = 1;
        if (cdf) {
            count = h.count - slot0 < kLazyGumbelScoreBatch ? h.count - slot0 : kLazyGumbelScoreBatch;
            const float* key_ptrs[kLazyGumbelScoreBatch];
            for (int w = 0; w < count; w++) key_ptrs[w] = keys + (size_t)topk[slot0 + w] * stride;
            attention_scores<kLazyGumbelScoreBatch>(s32, q_i, key_ptrs, count, HS, tau);
        } else {
            s32[0] = attention_score(q_i, keys + (size_t)topk[slot0] * stride, HS, tau);
        }
        for (int w = 0; w < count; w++) {
            const double s = s32[w];
            if (cdf) cdf[slot0 + w] = s;
            h.s_max = s > h.s_max ? s : h.s_max;
            h.s_min = s < h.s_min ? s : h.s_min;
        }
    }
    double running = 0.0;
    for (int slot = 0; slot < h.count; slot++) {
        const double s = cdf ? cdf[slot] : attention_score(q_i, keys + (size_t)topk[slot] * stride, HS, tau);
        running += exp(s - h.s_max);
        if (cdf) cdf[slot] = running;
    }
    h.mass = running;
    h.cdf = cdf;
    *head = h;
}

// The head slot of a sample: the first whose cumulative weight exceeds target (the
// last if none: rounding), by bisection over cdf or by the same running sums.
KNNGPT_HD int lazy_gumbel_head_pick(const LazyGumbelHead& head, double target, const float* q_i, const float* keys,
                                    int stride, int HS, float tau, const int* topk, DrawMargin* margin) {
    int slot = head.count - 1;
    double below = 0.0, above = head.mass;  // cumulative weights around the pick
    if (head.cdf) {
        int lo = 0, hi = head.count;  // the first slot with cdf > target lies in [lo, hi]
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (head.cdf[mid] > target) hi = mid; else lo = mid + 1;
        }
        if (lo < head.count) slot = lo, above = head.cdf[lo];
        if (slot > 0) below = head.cdf[slot - 1];
    } else {
        double running = 0.0;
        for (int h = 0; h < head.count; h++) {
            const double next = running + exp(attention_score(q_i, keys + (size_t)topk[h] * stride, HS, tau) -
                                              head.s_max);
            if (next > target || h == head.count - 1) { slot = h, below = running, above = next; break; }
            running = next;
        }
    }
    if (margin) {  // sums of exp terms: up to count ulps apart on another device
        const double amplification = 1.0 + head.count;
        margin->compare(above, target, 0.0, amplification);
        if (slot > 0) margin->compare(below, target, 0.0, amplification);
    }
    return slot;
}

// Walk steps whose skip logarithms are drawn together: log u of steps step0 ..
// step0 + 7 (step0 a multiple of 8) from 4 Philox calls, side by side (a vector loop
// on the CPU); a walk that ends earlier leaves the rest unused.
constexpr int kLazyGumbelSkipBatch = 8;
KNNGPT_HD void lazy_gumbel_skip_logs(double* logs, const DrawSite& site, uint32_t base, int step0) {
    double u[kLazyGumbelSkipBatch];
    for (int c = 0; c < kLazyGumbelSkipBatch / 2; c++) {
        const Philox4 w = philox_draw(site, DRAW_GEOMETRIC_SKIP, base + (uint32_t)(step0 / 2 + c));
        u[2 * c] = uniform_open01_f64(w.x[0], w.x[1]);  // lazy_gumbel_uniform's pairs
        u[2 * c + 1] = uniform_open01_f64(w.x[2], w.x[3]);
    }
    for (int l = 0; l < kLazyGumbelSkipBatch; l++) logs[l] = sampler_log(u[l]);
}

// Maps increasing tail positions to keys of C_i \ S_i (ascending), skipping the sorted
// head keys with a cursor: key = pos + (number of head keys <= key).
struct LazyGumbelTailCursor {
    const int* head_keys;
    int head_count;
    int passed = 0;  // head keys below the current key
    KNNGPT_HD int key(int pos) {
        while (passed < head_count && head_keys[passed] <= pos + passed) passed++;
        return pos + passed;
    }
};

// Attention as an expectation (§1): for query i with keys C_i = {0..i},
//   s_ij = tau q_i . k_j,   P_ij = exp(s_ij) / sum_{l<=i} exp(s_il),   O_i = E_{J~P_i}[v_J].
//
// Lazy Gumbel sample J ~ P_i, given the top-k set S_i (§4.2):
//   1. head: M = max_{j in S_i} (s_ij + G_j) and J = argmax, drawn without a Gumbel per
//      slot: the maximum of Gumbels located at s_ij is a Gumbel located at
//      log Z_S = log sum_{j in S_i} e^{s_ij}, and the argmax is independent of it with
//      law softmax over S_i (§4.3), so  M = log Z_S + G_0  and  J = the first slot whose
//      cumulative weight sum_{slots <= h} e^{s_ij - s_max} exceeds u Z_S e^{-s_max}:
//      one Philox call (two uniforms) per sample, and the row's head summary
//      (LazyGumbelHead: s_max, s_min and the cumulative weights) computed once
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
// correlated with a tail key winning.) The caller may count fallbacks.
//
// Device arithmetic: the per-draw logarithms are sampler_log.h's, the same bits on every
// device; the few <cmath> calls (exp, expm1, log1p, log of B, p and the head mass) are
// CUDA's natively (within an ulp or two of glibc's), so a native pick can differ from
// the CPU's only when two candidates tie within such an ulp, or a skip lands within one
// of an integer.
//
// One lazy Gumbel sample of row i (n_i = i + 1 keys): returns J in [0, n_i).
//   q_i          the query (HS floats); key j at keys + j * stride
//   topk         the row's k top-k slots: ascending distinct keys below n_i, then -1
//                (unchecked here: cpu::lazy_gumbel_sample checks them)
//   sample_index < lazy_gumbel_sample_capacity(n_i) (unchecked here)
//   exceeders, fell_back   if not null: the exceeders evaluated, and whether the cap hit
//   margin       if not null: every comparison that decided the sample (draws.h)
//   head         if not null: the row's head summary (lazy_gumbel_head_prepare), built once
//                by a caller that draws several samples of the row (the same values, so the
//                same samples); else each sample summarises its head itself
KNNGPT_HD int lazy_gumbel_sample_core(const float* q_i, const float* keys, int stride, int HS, float tau, int n_i,
                                      const int* topk, int k, const DrawSite& site, uint32_t sample_index,
                                      int max_exceeders, int* exceeders, bool* fell_back,
                                      DrawMargin* margin = nullptr, const LazyGumbelHead* head = nullptr) {
    const uint32_t base = sample_index * lazy_gumbel_calls_per_sample(n_i);
    const double inf = (double)INFINITY;

    // 1. head: M = log Z_S + G_0, and the slot picked by softmax over S_i
    LazyGumbelHead own_head;
    if (!head) {
        lazy_gumbel_head_prepare(&own_head, nullptr, q_i, keys, stride, HS, tau, topk, k);
        head = &own_head;
    }
    double M = -inf, M_magnitude = 0.0;  // M and the magnitudes of its terms (margins)
    const double s_min = head->s_min;
    int best = -1;
    if (head->count > 0) {
        const Philox4 w = philox_draw(site, DRAW_HEAD_GUMBEL, base);
        const double g0 = sampler_gumbel(uniform_open01_f64(w.x[0], w.x[1]));
        const double log_mass = log(head->mass);
        M = head->s_max + log_mass + g0;
        M_magnitude = fabs(head->s_max) + fabs(log_mass) + fabs(g0);
        const double target = uniform_open01_f64(w.x[2], w.x[3]) * head->mass;
        best = topk[lazy_gumbel_head_pick(*head, target, q_i, keys, stride, HS, tau, topk, margin)];
    }
    const int head_count = head->count;
    const int tail = n_i - head_count;
    int x = 0;  // exceeders: tail keys whose Gumbel exceeds B
    bool fallback = false;

    if (tail > 0 && head_count == 0) {
        // no head set: a plain Gumbel-max over the whole row (tail position = key)
        for (int j = 0; j < n_i; j++) {
            const double g = sampler_gumbel(lazy_gumbel_uniform(site, DRAW_TRUNCATED_GUMBEL, base, j));
            const double s = attention_score(q_i, keys + (size_t)j * stride, HS, tau);
            if (margin) margin->compare(s + g, M, fmax(fabs(s) + fabs(g), M_magnitude));
            if (s + g > M) { M = s + g; M_magnitude = fabs(s) + fabs(g); best = j; }
        }
    } else if (tail > 0) {
        // 2. threshold and exceedance probability, in fp64
        const double B = M - s_min;
        const double e_minus_B = exp(-B);
        const double p = -expm1(-e_minus_B);
        const double log_no_exceed = log1p(-p);  // log(1 - p) < 0 (-0 when p = 0: no exceeders)
        const double trunc_scale = expm1(-e_minus_B);  // in [-1, 0)
        // margins: log(1 - p) magnifies p's error by 1 / (1 - p) = e^(e^-B)
        const double skip_amplification = margin ? exp(e_minus_B) : 1.0;
        LazyGumbelTailCursor cursor{topk, head_count};
        // 3.-4. geometric-skip walk: each visited position is one exceeder. Where the walk
        // goes depends on the draws only, never on the scores, so the exceeders are
        // collected kLazyGumbelScoreBatch at a time, scored side by side
        // (attention_scores), then compared in walk order: the same samples as one by one.
        int pending_key[kLazyGumbelScoreBatch];
        const float* pending_ptr[kLazyGumbelScoreBatch];
        int pending_pos[kLazyGumbelScoreBatch];  // tail positions (their truncated Gumbels' draws)
        int pending = 0;
        auto compare_pending = [&]() {
            if (pending == 0) return;
            // the truncated Gumbels side by side (unused lanes take the middle of x's range: unread)
            double x_t[kLazyGumbelScoreBatch], E[kLazyGumbelScoreBatch], g[kLazyGumbelScoreBatch];
            for (int e = 0; e < pending; e++)  // x = u expm1(-e^-B); E = -log1p(x) is Exp(1) below e^-B
                x_t[e] = lazy_gumbel_uniform(site, DRAW_TRUNCATED_GUMBEL, base, pending_pos[e]) * trunc_scale;
            for (int e = pending; e < kLazyGumbelScoreBatch; e++) x_t[e] = 0.5 * trunc_scale;
            for (int e = 0; e < kLazyGumbelScoreBatch; e++) E[e] = -sampler_log1p(x_t[e]);
            for (int e = 0; e < kLazyGumbelScoreBatch; e++) g[e] = -sampler_log(E[e]);  // Gumbel truncated to (B, inf)
            // scored after the draws: the prefetched key rows have had that long to arrive
            float s32[kLazyGumbelScoreBatch];
            attention_scores<kLazyGumbelScoreBatch>(s32, q_i, pending_ptr, pending, HS, tau);
            for (int e = 0; e < pending; e++) {
                const double s = s32[e];
                if (margin) {
                    // log1p(x) near x = -1 magnifies x's error by |x| / (1 + x), then -log by 1 / E
                    const double amplification = fmax(1.0, fabs(x_t[e]) / ((1.0 + x_t[e]) * E[e]));
                    margin->compare(s + g[e], M, fmax(fabs(s) + fabs(g[e]), M_magnitude), amplification);
                }
                if (s + g[e] > M) { M = s + g[e]; M_magnitude = fabs(s) + fabs(g[e]); best = pending_key[e]; }
            }
            pending = 0;
        };
        long long pos = -1;
        double skip_logs[kLazyGumbelSkipBatch];  // log u of walk steps step - step % batch ..
        for (int step = 0;; step++) {
            const int lane = step % kLazyGumbelSkipBatch;
            if (lane == 0) lazy_gumbel_skip_logs(skip_logs, site, base, step);
            const double quotient = skip_logs[lane] / log_no_exceed;  // +inf when p = 0
            const double skip = floor(quotient);
            // the walk goes on while quotient < tail - pos - 1 (an integer), and floor picks the position
            if (margin && quotient < (double)(tail - pos)) margin->floor_of(quotient, skip_amplification);
            if (!((double)pos + 1.0 + skip < (double)tail)) break;
            pos += 1 + (long long)skip;
            x++;
            const int j = cursor.key((int)pos);
            pending_key[pending] = j;
            pending_ptr[pending] = keys + (size_t)j * stride;
            attention_prefetch_key(pending_ptr[pending], HS);
            pending_pos[pending] = (int)pos;
            if (++pending == kLazyGumbelScoreBatch) compare_pending();
            if (x > max_exceeders) {
                compare_pending();
                // cap hit: finish the row densely with full Gumbels (exact: "Exceeder cap" above)
                fallback = true;
                for (int rest = (int)pos + 1; rest < tail; rest++) {
                    const double gr = sampler_gumbel(lazy_gumbel_uniform(site, DRAW_TRUNCATED_GUMBEL, base, rest));
                    if (margin) margin->compare(gr, B, fabs(gr) + M_magnitude + fabs(s_min));
                    if (gr <= B) continue;  // s + g <= s_min + B = M: cannot win
                    x++;
                    const int jr = cursor.key(rest);
                    const double sr = attention_score(q_i, keys + (size_t)jr * stride, HS, tau);
                    if (margin) margin->compare(sr + gr, M, fmax(fabs(sr) + fabs(gr), M_magnitude));
                    if (sr + gr > M) { M = sr + gr; M_magnitude = fabs(sr) + fabs(gr); best = jr; }
                }
                break;
            }
        }
        compare_pending();
    }
    if (exceeders) *exceeders = x;
    if (fell_back) *fell_back = fallback;
    return best;
}

}  // namespace knngpt
