// kernels/cpu/topk_bisect.h — 2-means bisection of a set of keys, how the ivf index
// (topk_ivf.h, ALGORITHMS.md §6.4) cuts its clusters.
//
// One split of n keys (rows of HS floats, their positions alongside):
//   seeds    a = the key farthest from the set's mean, b = the key farthest from a (the
//            first such key in the set's current order on ties);
//   Lloyd    up to `iters` rounds: key x goes to side a iff
//            p(x) = x . (c_a - c_b) - (||c_a||^2 - ||c_b||^2) / 2 > 0 (nearer to c_a), then
//            c_a, c_b become the means of their sides; stop when no key moves;
//   balance  each side keeps at least min_side keys: if one is smaller, side a becomes the
//            min_side (or n - min_side) keys with the largest p, ties to the earlier key, so a
//            large set cannot shed single keys.
// About (2 iters + 3) n HS multiply-adds. fp32 sums in a fixed order, so a split is a
// deterministic function of the keys and their order, on every thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace knngpt::cpu {

constexpr int kTopkBisectIters = 6;  // Lloyd rounds per split

// the sum over d < n of term(d) in fp32, in a fixed order: eight partial sums over the
// groups of eight (vectorisable), the tail, then the partial sums
template <class Term>
inline float topk_sum_fast(int n, Term term) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += term(d + l);
    float s = 0.0f;
    for (; d < n; d++) s += term(d);
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

// a . b and ||a - b||^2 that way
inline float topk_dot_fast(const float* a, const float* b, int n) {
    return topk_sum_fast(n, [=](int d) { return a[d] * b[d]; });
}
inline float topk_dist2_fast(const float* a, const float* b, int n) {
    return topk_sum_fast(n, [=](int d) { return (a[d] - b[d]) * (a[d] - b[d]); });
}

// the fp32 mean of n rows of HS floats, summed in row order
inline void topk_mean(float* mean, const float* rows, int n, int HS) {
    std::fill(mean, mean + HS, 0.0f);
    for (int r = 0; r < n; r++)
        for (int d = 0; d < HS; d++) mean[d] += rows[(size_t)r * HS + d];
    for (int d = 0; d < HS; d++) mean[d] /= (float)n;
}

// Splits rows [lo, hi) of x (rows of HS floats, key positions alongside in pos) in two
// by 2-means (see the header comment) and reorders them: one side at [lo, mid), the other at
// [mid, hi). Returns mid. scratch_rows holds >= hi - lo rows; the vectors are resized.
inline int topk_bisect(float* x, int* pos, int lo, int hi, int HS, int min_side, float* scratch_rows,
                       std::vector<float>& p, std::vector<char>& side, std::vector<int>& order,
                       int iters = kTopkBisectIters) {
    const int n = hi - lo;
    float* rows = x + (size_t)lo * HS;
    std::vector<float> ca(HS), cb(HS), w(HS);
    p.resize(n);
    side.assign(n, 2);  // 2: not assigned yet
    // seeds: a farthest from the mean, b farthest from a
    topk_mean(ca.data(), rows, n, HS);
    int a = 0, b = 0;
    float best = -1.0f;
    for (int r = 0; r < n; r++) {
        const float dist2 = topk_dist2_fast(rows + (size_t)r * HS, ca.data(), HS);
        if (dist2 > best) best = dist2, a = r;
    }
    best = -1.0f;
    for (int r = 0; r < n; r++) {
        const float dist2 = topk_dist2_fast(rows + (size_t)r * HS, rows + (size_t)a * HS, HS);
        if (dist2 > best) best = dist2, b = r;
    }
    std::copy(rows + (size_t)a * HS, rows + (size_t)a * HS + HS, ca.begin());
    std::copy(rows + (size_t)b * HS, rows + (size_t)b * HS + HS, cb.begin());
    // Lloyd rounds
    int na = 0;
    for (int it = 0; it < iters; it++) {
        float norm_a = 0.0f, norm_b = 0.0f;
        for (int d = 0; d < HS; d++) {
            w[d] = ca[d] - cb[d];
            norm_a += ca[d] * ca[d];
            norm_b += cb[d] * cb[d];
        }
        const float t = 0.5f * (norm_a - norm_b);
        bool moved = false;
        na = 0;
        for (int r = 0; r < n; r++) {
            p[r] = topk_dot_fast(rows + (size_t)r * HS, w.data(), HS) - t;
            const char s = p[r] > 0.0f;
            moved |= s != side[r];
            side[r] = s;
            na += s;
        }
        if (!moved || na == 0 || na == n || it + 1 == iters) break;
        std::fill(ca.begin(), ca.end(), 0.0f);
        std::fill(cb.begin(), cb.end(), 0.0f);
        for (int r = 0; r < n; r++) {
            float* c = side[r] ? ca.data() : cb.data();
            for (int d = 0; d < HS; d++) c[d] += rows[(size_t)r * HS + d];
        }
        for (int d = 0; d < HS; d++) {
            ca[d] /= (float)na;
            cb[d] /= (float)(n - na);
        }
    }
    // balance: side a = the keys with the largest p when a side is too small
    if (na < min_side || n - na < min_side) {
        na = na < min_side ? min_side : n - min_side;
        order.resize(n);
        std::iota(order.begin(), order.end(), 0);
        std::nth_element(order.begin(), order.begin() + na, order.end(),
                         [&](int r, int s) { return p[r] > p[s] || (p[r] == p[s] && r < s); });
        std::fill(side.begin(), side.end(), 0);
        for (int u = 0; u < na; u++) side[order[u]] = 1;
    }
    // reorder, side a first, each side in its current order
    std::vector<int> pos_copy(pos + lo, pos + hi);
    std::copy(rows, rows + (size_t)n * HS, scratch_rows);
    int ia = 0, ib = na;
    for (int r = 0; r < n; r++) {
        const int to = side[r] ? ia++ : ib++;
        std::copy(scratch_rows + (size_t)r * HS, scratch_rows + (size_t)r * HS + HS, rows + (size_t)to * HS);
        pos[lo + to] = pos_copy[r];
    }
    return lo + na;
}

}  // namespace knngpt::cpu
