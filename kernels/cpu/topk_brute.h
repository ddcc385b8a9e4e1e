// kernels/cpu/topk_brute.h — the exact causal top-k by brute force (ALGORITHMS.md §6;
// tie rule of §2.1).
//
//   S_i = the k keys j in {0, .., i} ranked highest by (attention_dot(q_i, k_j) desc, j asc)
//
// Shapes: qkv (B, T, 3C) as in attention.h (q = channels [0, C), k = [C, 2C), head h at
// h*HS.., HS = C / NH); idx (B, NH, T, k) as in topk_select.h. O(T^2 HS) per head, never
// a T x T buffer; nothing is saved for a backward. CUDA twin: causal_topk_brute in
// kernels/cuda/topk_index.cuh, the same lists bit for bit.
//
// causal_topk_brute_reference is the definition, literally: every causal score with
// attention_dot (the key panels of topk_panel.h), a selector per row. The design decision
// is causal_topk_brute_fast<Pass>, the same lists at sgemm speed: a first pass gives fast
// scores f_ij with |f_ij - s_ij| <= Delta_i against the exact s_ij = attention_dot(q_i, k_j)
// (sgemm, TopkSgemmPass; or int8, topk_int8.h); only the keys with f_ij >= f_k - 2 Delta_i,
// f_k the row's k-th largest f, are rescored with attention_dot, and S_i is their top k.
// The k keys of largest f all have s >= f_k - Delta, so every key of S_i does too, and its
// f >= s - Delta >= f_k - 2 Delta: S_i is among the candidates (§6, `brute`). A row whose
// norms could overflow fp32 rescores every key. causal_topk_brute runs the sgemm pass, or
// the reference where OpenBLAS has only SSE kernels (topk_brute_sgemm_pays).
//
// Assumed: OpenBLAS's sgemm computes each entry as an fp32 sum of fp32 products or fmas
// (none of its kernels uses a lower precision), and the process keeps IEEE gradual
// underflow for inputs (no denormals-are-zero; flushed results are covered).
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <strings.h>
#include <functional>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define KNNGPT_TOPK_KEEP_AVX512 1
#else
#define KNNGPT_TOPK_KEEP_AVX512 0
#endif

#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_select.h"

// OpenBLAS names the kernels it chose; weak, so that another BLAS links too (topk_brute_sgemm_pays)
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace knngpt::cpu {

// The reference: every causal score with attention_dot, a selector per row.
inline void causal_topk_brute_reference(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                                        TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int chunks = topk_num_chunks(T);
    const size_t panel_size = (size_t)chunks * HS * kTopkLanes;
    const size_t ld_scores = (size_t)chunks * kTopkLanes;
    std::vector<float> panels((size_t)B * NH * panel_size);
    topk_pack_keys(panels.data(), qkv, B, T, C, NH);
    const int num_blocks = topk_num_query_blocks(T);
    long long scores_computed = 0;
    #pragma omp parallel reduction(+ : scores_computed)
    {
        // per-thread scratch: the block's scores, (block, keys)
        std::vector<float> scores((size_t)kTopkQueryBlock * ld_scores);
        std::vector<float> q4((size_t)4 * HS);  // four queries, interleaved
        TopkSelector selector(k);
        #pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int blk = 0; blk < num_blocks; blk++) {
                    const auto [i0, i1, i_search] = topk_query_rows(idx, b, h, blk, T, NH, k);
                    const float* panel = panels.data() + ((size_t)b * NH + h) * panel_size;
                    const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                    // scores of rows i_search..i1-1 against the chunks each row needs
                    int first = i_search;  // four rows first, ..first + 3
                    for (; first + 4 <= i1; first += 4) {
                        const float* q[4];
                        for (int r = 0; r < 4; r++) q[r] = q_head + (size_t)(first + r) * C3;
                        topk_interleave_queries(q4.data(), q, HS);
                        topk_score_chunks_4q(scores.data() + (size_t)(first - i0) * ld_scores, ld_scores, q4.data(),
                                             panel, topk_num_chunks(first + 4), HS);
                    }
                    for (; first < i1; first++)
                        topk_score_chunks(scores.data() + (size_t)(first - i0) * ld_scores, q_head + first * C3, panel,
                                          0, topk_num_chunks(first + 1), HS);
                    // select each row over its causal keys j <= i
                    for (int i = i_search; i < i1; i++) {
                        const float* row = scores.data() + (size_t)(i - i0) * ld_scores;
                        selector.clear();
                        selector.offer_range(row, i + 1, 0);
                        selector.write_sorted(idx + topk_idx_row(b, h, i, T, NH, k));
                        scores_computed += i + 1;
                    }
                }
            }
        }
    }
    if (stats) stats->scores_computed += scores_computed;
}

// ----------------------------------------------------------------------------
// the sgemm search and its rounding bound

// an upper bound on ||x||_2: squares of floats are exact in double and cannot over- or
// underflow there; the factor covers the HS - 1 double additions and the sqrt
inline double topk_norm_up(const float* x, int HS) {
    double sum = 0.0;
    for (int d = 0; d < HS; d++) sum += (double)x[d] * x[d];
    return std::sqrt(sum) * (1.0 + (HS + 2) * 0x1p-52);
}

// the largest float <= x
inline float topk_round_down(double x) {
    const float f = (float)x;
    return (double)f <= x ? f : std::nextafter(f, -INFINITY);
}

// Delta for a row with ||q|| <= qn and every causal ||k_j|| <= kn, and whether the row may
// use the fast scores at all. The sgemm score f and attention_dot's s are both fp32 sums of
// the HS products, each within gamma_HS sum_d |q_d k_d| <= gamma_HS qn kn of the real dot
// (any order, with or without fma; gamma_n = n u / (1 - n u), u = 2^-24; Cauchy-Schwarz).
// So the bound is 2 gamma_HS qn kn (both dots' rounding) plus, where products or partial
// sums are subnormal, at most 2^-126 of absolute error per operation (even with results
// flushed to zero), below 4 HS 2^-126 for the two dots once carried through the later
// operations: 2^-100 covers it with room to spare for HS <= 2^20. The double arithmetic
// here and in topk_brute_threshold rounds a few times by at most 2^-53 relative, below 2^-51 qn kn in all (|f_k| <= qn kn (1 + gamma_HS)); the
// 2^-20 of slack adds at least 2^-43 qn kn to Delta, which covers it. A row whose qn kn
// could overflow fp32 in either sum, or is not finite, rescores all keys (fast_ok false).
struct TopkBruteMargin {
    double delta;
    bool fast_ok;
};
inline TopkBruteMargin topk_brute_margin(double qn, double kn, int HS) {
    const double nu = HS * 0x1p-24;
    const double gamma = nu / (1.0 - nu);
    const double qk = qn * kn;
    const bool fast_ok = qk * (1.0 + gamma) * 4.0 < (double)FLT_MAX;  // false for inf and NaN too
    return {2.0 * gamma * qk * (1.0 + 0x1p-20) + 0x1p-100, fast_ok};
}

// the candidate threshold: an fp32 value <= f_k - 2 Delta, so that f >= t is an exact test
inline float topk_brute_threshold(float kth_fast, double delta) {
    return topk_round_down((double)kth_fast - 2.0 * delta);
}

constexpr int kTopkBruteQueryBlock = 128;  // queries per work item of the fast search
constexpr int kTopkKeyTile = 512;          // keys per sgemm: a (128, 512) tile of scores stays in L2

// An int32 ordered as the floats are (-0 just below +0): the bits, the magnitude bits
// flipped for negatives. topk_order_float inverts it.
inline int32_t topk_order_key(float x) {
    int32_t i;
    std::memcpy(&i, &x, sizeof i);
    return i < 0 ? i ^ 0x7fffffff : i;
}
inline float topk_order_float(int32_t key) {
    const int32_t i = key < 0 ? key ^ 0x7fffffff : key;
    float x;
    std::memcpy(&x, &i, sizeof x);
    return x;
}

// The k-th largest of key[0..n) (1 <= k <= n): the largest v with at least k keys >= v,
// by bisection over the int32 range, each step a vectorised count of all n (no
// data-dependent branches). With max_steps >= 0, stops after that many steps and returns
// lo: a lower bound of it (a prune before the last; kmv's budget). The exact k-th of a
// short list costs less by topk_kth_largest_select: 20 to 32 steps here.
inline int32_t topk_kth_largest_key(const int32_t* key, int n, int k, int max_steps = -1) {
    int32_t lo = key[0], hi = key[0];
    for (int u = 1; u < n; u++) {
        lo = std::min(lo, key[u]);
        hi = std::max(hi, key[u]);
    }
    for (int step = 0; lo < hi && step != max_steps; step++) {  // invariant: at least k keys >= lo, fewer than k keys > hi
        const int32_t mid = (int32_t)(lo + ((int64_t)hi - lo + 1) / 2);
        int count = 0;
#if KNNGPT_TOPK_KEEP_AVX512
        // 16 keys a compare into a mask, counted by popcount (no horizontal sum of a vector)
        const __m512i m = _mm512_set1_epi32(mid);
        int u = 0;
        for (; u + 16 <= n; u += 16)
            count += __builtin_popcount((unsigned)_mm512_cmpge_epi32_mask(_mm512_loadu_si512(key + u), m));
        if (u < n) {
            const __mmask16 valid = (__mmask16)((1u << (n - u)) - 1);
            count += __builtin_popcount((unsigned)_mm512_mask_cmpge_epi32_mask(valid, _mm512_maskz_loadu_epi32(valid, key + u), m));
        }
#else
        #pragma omp simd reduction(+ : count)
        for (int u = 0; u < n; u++) count += key[u] >= mid;
#endif
        if (count >= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The k-th largest of key[0..n) (1 <= k <= n), exactly: topk_kth_largest_key's answer
// (the largest v with at least k keys >= v) by a quickselect. Each round takes the median
// of three keys as pivot and splits the keys still in play in one pass, those above it to
// `above` and those below to `below` (vectorised: a compare and a compress per 16 keys;
// scratch of n + 16 each), then keeps the side that holds the k-th, or returns the pivot.
// About 2n keys read in all and one unpredictable branch a round, against the 20 to 32
// passes over all n of the bisection (which stays the cheaper one for the 8 steps of a
// prune before the last).
// Each round drops at least the pivot, so it ends.
inline int32_t topk_kth_largest_select(const int32_t* key, int n, int k, int32_t* above, int32_t* below) {
    const int32_t* in = key;  // the keys in play; a round's writes to a buffer never pass its reads
    for (;;) {
        const int32_t a = in[0], b = in[n / 2], c = in[n - 1];
        const int32_t pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
        int n_above = 0, n_below = 0;
#if KNNGPT_TOPK_KEEP_AVX512
        const __m512i p = _mm512_set1_epi32(pivot);
        for (int u = 0; u < n; u += 16) {
            const __mmask16 valid = n - u >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - u)) - 1);
            const __m512i x = _mm512_maskz_loadu_epi32(valid, in + u);
            const __mmask16 gt = _mm512_mask_cmpgt_epi32_mask(valid, x, p), lt = _mm512_mask_cmplt_epi32_mask(valid, x, p);
            const int count_gt = __builtin_popcount((unsigned)gt), count_lt = __builtin_popcount((unsigned)lt);
            _mm512_mask_storeu_epi32(above + n_above, (__mmask16)((1u << count_gt) - 1), _mm512_maskz_compress_epi32(gt, x));
            _mm512_mask_storeu_epi32(below + n_below, (__mmask16)((1u << count_lt) - 1), _mm512_maskz_compress_epi32(lt, x));
            n_above += count_gt;
            n_below += count_lt;
        }
#else
        for (int u = 0; u < n; u++) {  // branch-free: every key written to both, kept by its counts
            const int32_t x = in[u];
            above[n_above] = x;
            n_above += x > pivot;
            below[n_below] = x;
            n_below += x < pivot;
        }
#endif
        if (k <= n_above) {
            in = above;
            n = n_above;
        } else if (k <= n - n_below) {
            return pivot;
        } else {
            k -= n - n_below;
            in = below;
            n = n_below;
        }
    }
}

// One row of the fast search. kept_key[0..n_kept) holds, in ascending key order, every key
// whose fast score reached t at its time, kept_order[u] its score's topk_order_key (-0 as +0,
// so that the integer order is the float order, equal scores included); t =
// topk_brute_threshold(kth, delta), kth the k-th largest score among the kept keys at the
// last prune (-inf before). A prune before the last may take a lower bound of that k-th
// (kTopkPruneSteps of bisection): any lower t keeps every key the final t keeps. kth never
// exceeds the final f_k and only rises, so does t: the keys with f >= the final t are all
// kept. A prune (when n_kept reaches cap) recomputes kth and t and drops the keys below t;
// cap is then at least twice what is left, so rows with many ties prune rarely too.
constexpr int kTopkKeepExtra = 64;  // kept grows by at least this between prunes
constexpr int kTopkKeepGroup = 32;  // keys per vectorised test against t
constexpr int kTopkPruneSteps = 8;  // bisection steps of a prune before the last

struct TopkBruteRow {
    std::vector<int32_t> kept_order;  // the kept scores' order keys
    std::vector<int> kept_key;        // the kept keys; after finish, the candidates
    std::vector<int32_t> select_above, select_below;  // topk_kth_largest_select's scratch
    int k = 1, n_kept = 0, cap = 0;
    float kth = -INFINITY, t = -INFINITY;
    double delta = 0.0;
    bool fast_ok = false;
    explicit TopkBruteRow(int k_) : k(k_) {}

    void start(const TopkBruteMargin& m) {
        n_kept = 0;
        set_cap(k + kTopkKeepExtra);
        kth = t = -INFINITY;
        delta = m.delta;
        fast_ok = m.fast_ok;
    }
    void set_cap(int c) {
        cap = c;
        // room for a group's appends past cap, and for a whole 16-lane store after those
        if (kept_key.size() < (size_t)cap + kTopkKeepGroup + 16) {
            kept_key.resize((size_t)cap + kTopkKeepGroup + 16);
            kept_order.resize((size_t)cap + kTopkKeepGroup + 16);
            select_above.resize((size_t)cap + kTopkKeepGroup + 16);
            select_below.resize((size_t)cap + kTopkKeepGroup + 16);
        }
    }
    // kth = the k-th largest kept score (n_kept >= k; a lower bound of it after max_steps
    // >= 0 bisection steps), t from it, the keys below t dropped
    void prune(int max_steps = kTopkPruneSteps) {
        const int32_t kth_order =
            max_steps < 0 ? topk_kth_largest_select(kept_order.data(), n_kept, k, select_above.data(), select_below.data())
                          : topk_kth_largest_key(kept_order.data(), n_kept, k, max_steps);
        kth = topk_order_float(kth_order);
        t = topk_brute_threshold(kth, delta);
        const int32_t t_order = topk_order_key(t + 0.0f);
        int m = 0;
#if KNNGPT_TOPK_KEEP_AVX512
        // 16 at a time: the kept lanes compressed to the front of a register and stored at m
        // (m <= u: a store never reaches lanes not yet read)
        const __m512i tv = _mm512_set1_epi32(t_order);
        for (int u = 0; u < n_kept; u += 16) {
            const __mmask16 valid = n_kept - u >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n_kept - u)) - 1);
            const __m512i order = _mm512_maskz_loadu_epi32(valid, kept_order.data() + u);
            const __m512i key = _mm512_maskz_loadu_epi32(valid, kept_key.data() + u);
            const __mmask16 keep = _mm512_mask_cmpge_epi32_mask(valid, order, tv);
            _mm512_mask_storeu_epi32(kept_order.data() + m, (__mmask16)((1u << __builtin_popcount(keep)) - 1),
                                     _mm512_maskz_compress_epi32(keep, order));
            _mm512_mask_storeu_epi32(kept_key.data() + m, (__mmask16)((1u << __builtin_popcount(keep)) - 1),
                                     _mm512_maskz_compress_epi32(keep, key));
            m += __builtin_popcount(keep);
        }
#else
        for (int u = 0; u < n_kept; u++) {
            kept_order[m] = kept_order[u];
            kept_key[m] = kept_key[u];
            m += kept_order[u] >= t_order;
        }
#endif
        n_kept = m;
        set_cap(std::max(k + kTopkKeepExtra, 2 * n_kept));
    }
    // fast scores f[0..n) of keys first_key, first_key + 1, ..: groups of kTopkKeepGroup,
    // each appended (below) and followed by a prune if kept is full. When t changes makes
    // no difference to the final candidates (the keys with f >= the final t), only to the
    // time taken.
    void offer(const float* f, int n, int first_key) {
        for (int s = 0; s < n; s += kTopkKeepGroup) {
            append_group(f + s, std::min(kTopkKeepGroup, n - s), first_key + s);
            if (n_kept >= cap) prune();
        }
    }
#if KNNGPT_TOPK_KEEP_AVX512
    // the keys of f[0..g) (g <= kTopkKeepGroup) with f >= t onto kept, 16 at a time
    void append_group(const float* f, int g, int first_key) {
        for (int s = 0; s < g; s += 16) {
            const __mmask16 valid = g - s >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (g - s)) - 1);
            append16(_mm512_maskz_loadu_ps(valid, f + s), valid, first_key + s);
        }
    }
    // the lanes of v (keys first_key + lane) in `valid` with v >= t onto kept: a mask compare
    // and the kept lanes compressed to the front of a register stored whole (the lanes past
    // them are overwritten by later appends), without branches; room for 16 past n_kept
    void append16(__m512 v, __mmask16 valid, int first_key) {
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
        v = _mm512_add_ps(v, _mm512_setzero_ps());  // -0 as +0
        const __mmask16 keep = _mm512_mask_cmp_ps_mask(valid, v, _mm512_set1_ps(t), _CMP_GE_OQ);
        // topk_order_key, lane by lane (the zero-masked shift: GCC 12 warns, wrongly, about the
        // plain one's undefined source)
        const __m512i bits = _mm512_castps_si512(v);
        const __m512i order = _mm512_xor_si512(bits, _mm512_and_si512(_mm512_maskz_srai_epi32((__mmask16)0xffff, bits, 31), magnitude));
        const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(first_key));
        _mm512_storeu_si512(kept_order.data() + n_kept, _mm512_maskz_compress_epi32(keep, order));
        _mm512_storeu_si512(kept_key.data() + n_kept, _mm512_maskz_compress_epi32(keep, key));
        n_kept += __builtin_popcount((unsigned)keep);
    }
#else
    // the same without AVX-512: a vectorised count first (most groups have no key reaching
    // t); in a group that has some, a branch-free append of each eight that has some
    void append_group(const float* f, int g, int first_key) {
        const float tt = t;
        int reaching = 0;
        #pragma omp simd reduction(+ : reaching)
        for (int l = 0; l < g; l++) reaching += f[l] >= tt;
        if (!reaching) return;
        for (int s8 = 0; s8 < g; s8 += kTopkLanes) {
            const int g8 = std::min(kTopkLanes, g - s8);
            int reaching8 = 0;
            for (int l = 0; l < g8; l++) reaching8 += f[s8 + l] >= tt;
            if (reaching8) append(f + s8, g8, first_key + s8, tt);
        }
    }
    // the keys of f[0..g) with f >= tt onto kept, branch-free
    void append(const float* f, int g, int first_key, float tt) {
        int m = n_kept;
        for (int l = 0; l < g; l++) {
            kept_order[m] = topk_order_key(f[l] + 0.0f);
            kept_key[m] = first_key + l;
            m += f[l] >= tt;
        }
        n_kept = m;
    }
#endif
    // the final t: kept_key[0..n_kept) then holds exactly the candidates (the row has > k
    // keys, all offered)
    void finish() { prune(-1); }
};

// The top k (k < n) of finite scores[0..n) of keys[0..n), given in ascending key order, by
// (score desc, key asc), written in ascending key order to dst: the k-th largest score v
// by topk_kth_largest_select over the order keys (order: scratch of 3 (n + 16)), then one
// pass in key order keeping the keys above v and, of those equal to v, the first ones
// (ties to the smaller key). TopkSelector's answer for finite scores (-0 ties with +0
// there too), without a heap or a sort.
inline void topk_select_in_key_order(int* dst, const float* scores, const int* keys, int n, int k, int32_t* order) {
    int above = 0;
    for (int u = 0; u < n; u++) order[u] = topk_order_key(scores[u] + 0.0f);
    const int32_t v = topk_kth_largest_select(order, n, k, order + n + 16, order + 2 * (n + 16));
    for (int u = 0; u < n; u++) above += order[u] > v;
    int ties = k - above, m = 0;  // keys equal to v still to take
    for (int u = 0; u < n && m < k; u++) {
        const bool take = order[u] > v || (order[u] == v && ties > 0);
        ties -= order[u] == v && take;
        if (take) dst[m++] = keys[u];
    }
}

// The same selection for keys in any order, from their scores' order keys (-0 given as
// +0): keys[0..n) distinct, 1 <= k < n, the top k by (order desc, key asc) written in
// ascending key order to dst. The keys tied at the k-th largest go in tie_keys (n + 16
// ints) and only those are sorted; scratch: 2 (n + 16) ints.
inline void topk_select_any_order(int* dst, const int32_t* order, const int* keys, int n, int k, int* tie_keys,
                                  int32_t* scratch) {
    const int32_t v = topk_kth_largest_select(order, n, k, scratch, scratch + n + 16);
    int m = 0, ties = 0;
    for (int u = 0; u < n; u++) {
        dst[m] = keys[u];
        m += order[u] > v;
        tie_keys[ties] = keys[u];
        ties += order[u] == v;
    }
    std::sort(tie_keys, tie_keys + ties);
    std::copy(tie_keys, tie_keys + (k - m), dst + m);
    std::sort(dst, dst + k);
}

// Rows r0..i1 - 1 offer their fast scores of keys j0 .. min(i + 1, j1) - 1, row i's at
// fast + (i - r0) ld, to their states (row i's at state[i - r0]; rows whose bound does not
// apply keep nothing).
inline void topk_offer_tile(TopkBruteRow* state, const float* fast, int ld, int r0, int i1, int j0, int j1) {
    for (int i = r0; i < i1; i++) {
        TopkBruteRow& row = state[i - r0];
        if (row.fast_ok) row.offer(fast + (size_t)(i - r0) * ld, std::min(i + 1, j1) - j0, j0);
    }
}

// The fast search (see the header comment) with a first pass `Pass`: sgemm here
// (TopkSgemmPass), int8 in topk_int8.h; the same lists as causal_topk_brute_reference.
// Per query block, the fast scores come tile by tile (kTopkKeyTile keys), each tile consumed
// by the rows while it is in cache; every row keeps the keys reaching its threshold of the
// moment (TopkBruteRow), and at the end rescores those that reach its final threshold.
//
// A pass is constructed once per call from (qkv, B, T, C, NH, keys, kn_max, pass_args...)
// (keys: each head's keys, contiguous (T, HS); kn_max[j]: the largest topk_norm_up(k_j')
// over j' <= j)
// and provides, per thread, `typename Pass::Rows rows(pass)` with
//   rows.begin(b, h, i_search, i1)        the block's rows (e.g. quantise their queries)
//   rows.margin(i)                        Delta_i of row i in the pass's units, and fast_ok
//   rows.tile(fast, ld, r0, i1, j0, j1)   fast[(i - r0) ld + (j - j0)] for r0 <= i < i1,
//                                         j0 <= j < min(i + 1, j1) (more may be written,
//                                         within the row's ld)
//   rows.tile_and_offer(state, fast, ld, r0, i1, j0, j1)
//                                         those scores offered to the rows' states (state[i - r0]):
//                                         tile then topk_offer_tile, or fused
// where a fast score f_ij and attention_dot(q_i, k_j) / c_i (c_i > 0 per row) lie within
// Delta_i of each other for every causal j.
template <class Pass, class... PassArgs>
inline void causal_topk_brute_fast(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                                   TopkStats* stats = nullptr, PassArgs... pass_args) {
    topk_check_shapes(B, T, C, NH, k);
    const int HS = C / NH;
    topk_check(HS <= (1 << 20), "the head size must be <= 2^20");
    const size_t C3 = 3 * (size_t)C;
    // per head: its keys, contiguous (T, HS), and kn_max[j] = the largest topk_norm_up(k_j')
    // over keys j' <= j (a NaN sticks)
    std::vector<float> keys((size_t)B * NH * T * HS);
    std::vector<double> kn_max((size_t)B * NH * T);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float* k_src = qkv + (size_t)b * T * C3 + C + (size_t)h * HS;
            float* k_dst = keys.data() + ((size_t)b * NH + h) * T * HS;
            double* m = kn_max.data() + ((size_t)b * NH + h) * T;
            double run = 0.0;
            for (int j = 0; j < T; j++) {
                std::copy(k_src + (size_t)j * C3, k_src + (size_t)j * C3 + HS, k_dst + (size_t)j * HS);
                const double n = topk_norm_up(k_src + (size_t)j * C3, HS);
                if (!(n <= run) && !std::isnan(run)) run = n;
                m[j] = run;
            }
        }
    const Pass pass(qkv, B, T, C, NH, keys.data(), kn_max.data(), pass_args...);
    const int QB = kTopkBruteQueryBlock;
    const int num_blocks = (T + QB - 1) / QB;
    long long scores_computed = 0, scores_rescored = 0;
    #pragma omp parallel reduction(+ : scores_computed, scores_rescored)
    {
        // per-thread scratch: the pass's rows; a tile of fast scores (block, tile); the rows'
        // states; a row's candidates' exact scores
        typename Pass::Rows rows(pass);
        std::vector<float> fast((size_t)QB * kTopkKeyTile);
        std::vector<TopkBruteRow> state((size_t)QB, TopkBruteRow(k));
        std::vector<int> all_keys;
        std::vector<float> cand_scores;
        std::vector<int32_t> cand_order;
        TopkSelector selector(k);
        #pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int blk = 0; blk < num_blocks; blk++) {
                    // rows [i0, i1), the last block first (it sees the most keys); rows i < k take all keys
                    const int i0 = (num_blocks - 1 - blk) * QB, i1 = std::min(i0 + QB, T);
                    const int i_search = std::max(i0, std::min(k, i1));
                    for (int i = i0; i < i_search; i++) topk_write_all_keys(idx + topk_idx_row(b, h, i, T, NH, k), i, k);
                    if (i_search == i1) continue;
                    const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                    const float* k_head = keys.data() + ((size_t)b * NH + h) * T * HS;
                    rows.begin(b, h, i_search, i1);
                    for (int i = i_search; i < i1; i++) state[i - i_search].start(rows.margin(i));
                    // key tiles [j0, j1) against the rows that see some of them, i >= j0
                    for (int j0 = 0; j0 < i1; j0 += kTopkKeyTile) {
                        const int j1 = std::min(j0 + kTopkKeyTile, i1), r0 = std::max(i_search, j0);
                        rows.tile_and_offer(state.data() + (r0 - i_search), fast.data(), kTopkKeyTile, r0, i1, j0, j1);
                    }
                    // the candidates: the kept keys, or every key where the bound does not apply
                    auto candidates = [&](int i, const int*& list) {
                        TopkBruteRow& row = state[i - i_search];
                        if (row.fast_ok) {
                            list = row.kept_key.data();
                            return row.n_kept;
                        }
                        all_keys.resize((size_t)i + 1);
                        for (int j = 0; j <= i; j++) all_keys[j] = j;
                        list = all_keys.data();
                        return i + 1;
                    };
                    for (int i = i_search; i < i1; i++)
                        if (state[i - i_search].fast_ok) state[i - i_search].finish();
                    for (int i = i_search; i < i1; i++) {
                        // the next row's candidate keys are scattered over the head: fetch them early
                        if (i + 1 < i1 && state[i + 1 - i_search].fast_ok) {
                            const TopkBruteRow& next = state[i + 1 - i_search];
                            for (int u = 0; u < next.n_kept; u++)
                                for (int d = 0; d < HS; d += 16) __builtin_prefetch(k_head + (size_t)next.kept_key[u] * HS + d);
                        }
                        const int* cand = nullptr;
                        const int n = candidates(i, cand);
                        // the candidates' exact scores, 32 chains side by side (attention_dot's
                        // bits: attention_scores with tau = 1), then the top k of them
                        cand_scores.resize((size_t)n);
                        for (int u0 = 0; u0 < n; u0 += 32) {
                            const float* ptrs[32];
                            const int count = std::min(32, n - u0);
                            for (int u = 0; u < count; u++) ptrs[u] = k_head + (size_t)cand[u0 + u] * HS;
                            attention_scores<32>(cand_scores.data() + u0, q_head + (size_t)i * C3, ptrs, count, HS, 1.0f);
                        }
                        int* dst = idx + topk_idx_row(b, h, i, T, NH, k);
                        if (state[i - i_search].fast_ok) {  // finite scores, ascending keys
                            cand_order.resize(3 * ((size_t)n + 16));
                            topk_select_in_key_order(dst, cand_scores.data(), cand, n, k, cand_order.data());
                        } else {  // the reference's selector, whatever the scores
                            selector.clear();
                            selector.offer_list(cand_scores.data(), cand, n);
                            selector.write_sorted(dst);
                        }
                        scores_computed += i + 1;
                        scores_rescored += n;
                    }
                }
            }
        }
    }
    if (stats) {
        stats->scores_computed += scores_computed;
        stats->scores_rescored += scores_rescored;
    }
}

// The sgemm first pass: f_ij = q_i . k_j by cblas_sgemm (c_i = 1), Delta_i from
// topk_brute_margin (both dots' fp32 rounding).
struct TopkSgemmPass {
    const float* qkv;
    const float* keys;
    const double* kn_max;
    int T, C, NH, HS;
    TopkSgemmPass(const float* qkv_, int, int T_, int C_, int NH_, const float* keys_, const double* kn_max_)
        : qkv(qkv_), keys(keys_), kn_max(kn_max_), T(T_), C(C_), NH(NH_), HS(C_ / NH_) {}
    struct Rows {
        const TopkSgemmPass& p;
        const float* q_head = nullptr;
        const float* k_head = nullptr;
        const double* kn = nullptr;
        explicit Rows(const TopkSgemmPass& pass) : p(pass) {}
        void begin(int b, int h, int, int) {
            q_head = p.qkv + (size_t)b * p.T * 3 * p.C + (size_t)h * p.HS;
            k_head = p.keys + ((size_t)b * p.NH + h) * p.T * p.HS;
            kn = p.kn_max + ((size_t)b * p.NH + h) * p.T;
        }
        TopkBruteMargin margin(int i) const {
            return topk_brute_margin(topk_norm_up(q_head + (size_t)i * 3 * p.C, p.HS), kn[i], p.HS);
        }
        void tile(float* fast, int ld, int r0, int i1, int j0, int j1) const {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - r0, j1 - j0, p.HS, 1.0f,
                        q_head + (size_t)r0 * 3 * p.C, 3 * p.C, k_head + (size_t)j0 * p.HS, p.HS, 0.0f, fast, ld);
        }
        void tile_and_offer(TopkBruteRow* state, float* fast, int ld, int r0, int i1, int j0, int j1) const {
            tile(fast, ld, r0, i1, j0, j1);
            topk_offer_tile(state, fast, ld, r0, i1, j0, j1);
        }
    };
};

// The sgemm search: the same lists as causal_topk_brute_reference.
inline void causal_topk_brute_sgemm(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                                    TopkStats* stats = nullptr) {
    causal_topk_brute_fast<TopkSgemmPass>(idx, qkv, B, T, C, NH, k, stats);
}

// Whether the sgemm search pays here: not where OpenBLAS runs one of its SSE-only kernel
// sets (Prescott, what its DYNAMIC_ARCH build picks on a CPU it does not recognise, and
// older ones), whose sgemm is slower than the 8-lane AVX/FMA panels of the reference. Any
// other BLAS, or OpenBLAS with AVX2 or AVX-512 kernels: yes. OPENBLAS_CORETYPE changes it.
inline bool topk_brute_sgemm_pays() {
    static const bool pays = [] {
        if (!openblas_get_corename) return true;  // not OpenBLAS
        const char* core = openblas_get_corename();
        if (!core) return true;
        static const char* const sse_only[] = {"prescott", "core2",   "penryn",  "dunnington", "nehalem", "atom",
                                               "opteron",  "opteron_sse3", "barcelona", "bobcat", "nano",
                                               "katmai",   "coppermine",   "northwood", "banias", "athlon"};
        for (const char* name : sse_only)
            if (strcasecmp(core, name) == 0) return false;
        return true;
    }();
    return pays;
}

// The exact causal top-k: the sgemm search where it pays, else the reference (the same
// lists either way; only TopkStats::scores_rescored, which the reference leaves at 0, differs)
inline void causal_topk_brute(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                              TopkStats* stats = nullptr) {
    if (topk_brute_sgemm_pays())
        causal_topk_brute_sgemm(idx, qkv, B, T, C, NH, k, stats);
    else
        causal_topk_brute_reference(idx, qkv, B, T, C, NH, k, stats);
}

}  // namespace knngpt::cpu
