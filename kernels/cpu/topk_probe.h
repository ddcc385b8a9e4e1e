// kernels/cpu/topk_probe.h — the probe helpers of the ivf index (topk_ivf.h,
// ALGORITHMS.md §6.4; tie rule of §2.1): clusters popped in centroid-score order, and a
// row's scored keys that may still be among its k best.
//
//   order   topk_first_largest / topk_pop_best: the clusters in the order (score desc,
//           cluster asc), one at a time, from their scores' order keys
//   keys    TopkScoredKeys: the keys a row scores are appended, branch-free, when their
//           score reaches the k-th best of the kept keys at the last settle (-inf before
//           there are k); settle() takes that k-th best by quickselect and drops the keys
//           below it; write() gives the k best by (score desc, key asc) in ascending key
//           order (every kept key when there are at most k). A key dropped was below k
//           kept ones, so the result is the top k of every key offered.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/topk_brute.h"

namespace knngpt::cpu {

// The first u with v[u] the largest of v[0..n), n >= 1: two vectorised passes (0 where
// the largest is a NaN).
template <class V>
inline int topk_first_largest(const V* v, int n) {
    V best = v[0];
    #pragma omp simd reduction(max : best)
    for (int u = 0; u < n; u++) best = v[u] > best ? v[u] : best;
    int at = n;
    #pragma omp simd reduction(min : at)
    for (int u = 0; u < n; u++) at = v[u] == best ? std::min(at, u) : at;
    return at < n ? at : 0;
}

// The first u with key[u] the largest of key[0..n), which becomes INT32_MIN (taken); -1
// when every key is INT32_MIN. With topk_order_key's keys: the clusters in the order
// (score desc, cluster asc), one at a time.
inline int topk_pop_best(int32_t* key, int n) {
    const int u = topk_first_largest(key, n);
    if (key[u] == INT32_MIN) return -1;
    key[u] = INT32_MIN;
    return u;
}

// One row's scored keys that may still enter its top k (see above). capacity: at least the
// number of keys one row offers in all (a settle keeps every key tied with the k-th, so
// more than k can stay); append checks it.
struct TopkScoredKeys {
    int k, n = 0;
    int32_t kth_order = INT32_MIN;  // the k-th best kept at the last settle, as an order key
    std::vector<int32_t> order, scratch;
    std::vector<int> key, tie_keys;
    int capacity;
    TopkScoredKeys(int k_, int capacity_)
        : k(k_), order((size_t)capacity_ + 16), scratch(2 * ((size_t)capacity_ + 16)), key((size_t)capacity_ + 16),
          tie_keys((size_t)capacity_ + 16), capacity(capacity_) {}

    void clear() {
        n = 0;
        kth_order = INT32_MIN;
    }
    // the k-th best at the last settle (-inf before there were k)
    float kth() const { return kth_order == INT32_MIN ? -INFINITY : topk_order_float(kth_order); }
    // keys[u] (or first_key + u where keys is null) with scores s[u], u < count
    void append(const float* s, const int* keys, int first_key, int count) {
        topk_check(n + count <= capacity, "TopkScoredKeys: more keys offered than its capacity");
#if KNNGPT_TOPK_KEEP_AVX512
        // 16 at a time: a mask compare, the kept lanes compressed to the front of a register
        // and stored whole (room for 16 past n); most groups keep none once there is a k-th
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), kth_v = _mm512_set1_epi32(kth_order);
        for (int u = 0; u < count; u += 16) {
            const __mmask16 valid = count - u >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (count - u)) - 1);
            // topk_order_key lane by lane, -0 as +0 (the zero-masked shift: GCC 12 warns, wrongly,
            // about the plain one's undefined source)
            const __m512i bits = _mm512_castps_si512(_mm512_add_ps(_mm512_maskz_loadu_ps(valid, s + u), _mm512_setzero_ps()));
            const __m512i o = _mm512_xor_si512(bits, _mm512_and_si512(_mm512_maskz_srai_epi32((__mmask16)0xffff, bits, 31), magnitude));
            const __mmask16 keep = _mm512_mask_cmpge_epi32_mask(valid, o, kth_v);
            if (!keep) continue;
            const __m512i kv = keys ? _mm512_maskz_loadu_epi32(valid, keys + u) : _mm512_add_epi32(lane, _mm512_set1_epi32(first_key + u));
            _mm512_storeu_si512(order.data() + n, _mm512_maskz_compress_epi32(keep, o));
            _mm512_storeu_si512(key.data() + n, _mm512_maskz_compress_epi32(keep, kv));
            n += __builtin_popcount((unsigned)keep);
        }
#else
        for (int u = 0; u < count; u++) {
            const int32_t o = topk_order_key(s[u] + 0.0f);
            order[n] = o;
            key[n] = keys ? keys[u] : first_key + u;
            n += o >= kth_order;
        }
#endif
    }
    void settle() {
        if (n < k) return;
        kth_order = topk_kth_largest_select(order.data(), n, k, scratch.data(), scratch.data() + n + 16);
        int m = 0;
#if KNNGPT_TOPK_KEEP_AVX512
        // 16 at a time, the kept lanes compressed to the front (m <= u: no store reaches
        // lanes not yet read)
        const __m512i kth_v = _mm512_set1_epi32(kth_order);
        for (int u = 0; u < n; u += 16) {
            const __mmask16 valid = n - u >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - u)) - 1);
            const __m512i o = _mm512_maskz_loadu_epi32(valid, order.data() + u);
            const __m512i kv = _mm512_maskz_loadu_epi32(valid, key.data() + u);
            const __mmask16 keep = _mm512_mask_cmpge_epi32_mask(valid, o, kth_v);
            const __mmask16 front = (__mmask16)((1u << __builtin_popcount((unsigned)keep)) - 1);
            _mm512_mask_storeu_epi32(order.data() + m, front, _mm512_maskz_compress_epi32(keep, o));
            _mm512_mask_storeu_epi32(key.data() + m, front, _mm512_maskz_compress_epi32(keep, kv));
            m += __builtin_popcount((unsigned)keep);
        }
#else
        for (int u = 0; u < n; u++) {
            order[m] = order[u];
            key[m] = key[u];
            m += order[u] >= kth_order;
        }
#endif
        n = m;
    }
    // the top k (or all kept, when at most k), ascending, into out
    void write(int* out) {
        if (n <= k) {
            std::copy(key.data(), key.data() + n, out);
            std::sort(out, out + n);
        } else {
            topk_select_any_order(out, order.data(), key.data(), n, k, tie_keys.data(), scratch.data());
        }
    }
};

}  // namespace knngpt::cpu
