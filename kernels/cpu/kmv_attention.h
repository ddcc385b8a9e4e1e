// kernels/cpu/kmv_attention.h — mode kmv (ALGORITHMS.md §7): per-query key lists after
// [P2]'s kernel matrix-vector product under assumption A. The heavy kernel entries of each
// row, found by LSH, are kept exactly; the light remainder is estimated by m uniform
// samples. sparse_attention.h computes the forward and its backward from the lists (the
// exact gradient of the computed heavy + sampled-light sum, samples held fixed; §9.1).
//
// Kernel (§7.3), per (b, h), in log space, with s_ij = q_i . k_j / sqrt(D), D = HS, and the
// causal radius R_i^2 = max_{j <= i} |k_j|^2 (so that row i depends on keys j <= i only):
//   log K_ij = s_ij - (|q_i|^2 + R_i^2) / (2 sqrt(D))  <= 0,
// a per-row shift of s_ij, which cancels in the row's softmax.
// Heavy set H_i (§7.4), among the keys j <= i that LSH proposes for row i, n_i = i + 1:
//   KmvThreshold::Absolute ([P2], our reading): log K_ij >= -alpha log n_i;
//   KmvThreshold::Relative (ours): s_ij >= max over the row's candidates of s - alpha log n_i.
// Every proposal is checked exactly, so LSH decides which heavy keys are found, never
// which light keys are let in. The LSH (E2LSH on padded vectors, its bucket width, the
// width levels, the tables read causally) is §7.4's "as implemented".
// Light part: a uniform m-subset of L_i = {0..i} \ H_i (Floyd's algorithm), each sample
// with logw = log(|L_i| / m) (Horvitz-Thompson), so Z^_i and N^_i stay unbiased.
//
// Lists: idx and logw (B, NH, T, K), K = max_keys, m = min(light_samples, K).
//   n_i <= K: keys 0..i in slots [0, n_i) with logw 0, -1 after (the row is exact).
//   n_i >  K: the heavy keys, ascending, with logw 0 (if more than K - m, the K - m
//             with the largest kernel values, ties to the smaller j); then m light
//             samples, ascending, with logw log(|L_i| / m) > 0; then -1 with logw 0.
//             m = 0 drops the light part (the row is then heavy keys only, biased).
// Draws (kernels/common/draws.h), for local batch row b at global row p.batch0 + b: a
// head's hash functions at its query 0's site, purpose DRAW_HASH, index f (D + 2) + c
// (c <= D: coordinate c of a_f by Box-Muller; c = D + 1: the offset b_f); row i's light
// samples at the row's site, purpose DRAW_LIGHT_SAMPLE, index t, word 0.
//
// No CUDA twin: kmv runs on the CPU only. Nothing is saved beyond the lists.
// Design: the draws are pure functions of their site and H_i a function of the hash draws
// and the data, so the lists depend neither on the thread count (OpenMP over (b, h)) nor
// on the scoring path (KmvScoring), and the light part is unbiased.
// measure_assumption_a and measure_kmv_heavy (§7.7) are diagnostics for the tools.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

#include "kernels/common/attention_params.h"
#include "kernels/common/draws.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/topk_brute.h"
#include "kernels/cpu/vector_math.h"

namespace knngpt::cpu {

using knngpt::KmvParams;
using knngpt::KmvThreshold;

// Counts over the rows with n_i > max_keys (exact rows are not counted).
struct KmvStats {
    long long heavy = 0;          // heavy keys kept in the lists
    long long light_samples = 0;  // light samples placed
    long long rows = 0;           // rows estimated (heavy + light)
    long long candidates = 0;     // distinct causal LSH candidates, each checked against the threshold
    long long exact_checks = 0;   // of them, those whose log K_ij was taken in double (KmvScoring)
    long long table_builds = 0;   // (re)builds of the hash tables, over the heads (one per growth of R_i)
    long long level_sum = 0;      // the width levels the rows read, summed (0 with one level)
};

// ĉ of assumption A on the kernel matrix (§7.3), on the same with each row's causal
// radius R_i (as kmv's threshold sees it), and on the raw attention A (§7.7).
struct AssumptionA {
    double c_kernel, c_raw, c_causal_radius;
};

inline void kmv_check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "kernels/cpu/kmv_attention.h: %s\n", what);
        std::abort();
    }
}

// p(c): collision probability of one E2LSH function with Gaussian projections
// for a pair at distance r, c = w / r (Datar et al. 2004).
inline double kmv_e2lsh_collision_probability(double c) {
    if (c <= 0.0) return 0.0;
    const double pi = 3.14159265358979323846;
    const double tail = 0.5 * std::erfc(c / std::sqrt(2.0));  // Phi(-c)
    return 1.0 - 2.0 * tail - 2.0 / (std::sqrt(2.0 * pi) * c) * (1.0 - std::exp(-0.5 * c * c));
}

// The bucket width w for head size HS and sequence length T: a pair at the
// heavy radius r_h = D^(1/4) sqrt(2 alpha log T) collides in one table with
// probability 1 / num_tables (per function p* = num_tables^(-1/num_bits),
// clamped to [0.05, 0.95]; r_h at least D^(1/4) / sqrt(2)).
inline double kmv_bucket_width(int HS, int T, const KmvParams& p) {
    const double sigma = std::pow((double)HS, 0.25);
    const double alpha_log_n = (double)p.heavy_alpha * std::log((double)(T > 2 ? T : 2));
    const double heavy_radius = sigma * std::sqrt(2.0 * std::max(alpha_log_n, 0.25));
    double target = std::pow((double)p.num_tables, -1.0 / p.num_bits);
    target = std::min(std::max(target, 0.05), 0.95);
    // p(c) increases from 0 to 1: bisect for p(c) = target
    double lo = 1e-3, hi = 1e3;
    for (int it = 0; it < 200; it++) {
        const double mid = 0.5 * (lo + hi);
        if (kmv_e2lsh_collision_probability(mid) < target) lo = mid; else hi = mid;
    }
    return 0.5 * (lo + hi) * heavy_radius;
}

// The num_tables * num_bits hash functions of one head, on padded vectors in R^{HS+1},
// at `levels` bucket widths: level l has width w 2^l and offsets b_f 2^l (the same
// directions and uniform draws; scaling by 2^l is exact), so level 0 is [P2]'s family.
struct KmvHashFamily {
    int dim = 0;  // HS + 1
    int num_tables = 0, num_bits = 0, levels = 1;
    double width = 0.0;             // w, level 0's width
    std::vector<double> direction;  // (num_tables * num_bits, dim), a_f
    std::vector<double> offset;     // (levels, num_tables * num_bits), b_f 2^l in [0, w 2^l)
    double level_width(int level) const { return std::ldexp(width, level); }
    const double* level_offset(int level) const {
        return offset.data() + (size_t)level * num_tables * num_bits;
    }
};

inline KmvHashFamily kmv_draw_hash_family(const DrawSite& site, int HS, int T, const KmvParams& p) {
    KmvHashFamily family;
    family.dim = HS + 1;
    family.num_tables = p.num_tables;
    family.num_bits = p.num_bits;
    family.levels = p.width_levels;
    family.width = kmv_bucket_width(HS, T, p);
    const int num_functions = p.num_tables * p.num_bits;
    family.direction.resize((size_t)num_functions * family.dim);
    family.offset.resize((size_t)family.levels * num_functions);
    const double two_pi = 6.28318530717958647692;
    for (int f = 0; f < num_functions; f++) {
        const uint32_t base = (uint32_t)f * (uint32_t)(family.dim + 1);
        for (int c = 0; c < family.dim; c++) {
            const Philox4 d = philox_draw(site, DRAW_HASH, base + (uint32_t)c);
            const double u1 = uniform_open01_f64(d.x[0], d.x[1]), u2 = uniform_open01_f64(d.x[2], d.x[3]);
            family.direction[(size_t)f * family.dim + c] = std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
        }
        const Philox4 d = philox_draw(site, DRAW_HASH, base + (uint32_t)family.dim);
        family.offset[f] = family.width * uniform_open01_f64(d.x[0], d.x[1]);
        for (int level = 1; level < family.levels; level++)
            family.offset[(size_t)level * num_functions + f] = std::ldexp(family.offset[f], level);
    }
    return family;
}

// One table's bucket id from its num_bits hash values (a 64-bit mix; two
// different tuples sharing an id only add candidates, which are checked exactly).
inline uint64_t kmv_bucket_id(const double* projections, const double* offsets, int num_bits, double width) {
    uint64_t id = 0x243F6A8885A308D3ull;
    for (int bit = 0; bit < num_bits; bit++) {
        const int64_t cell = (int64_t)std::floor((projections[bit] + offsets[bit]) / width);
        id ^= (uint64_t)cell + 0x9E3779B97F4A7C15ull + (id << 6) + (id >> 2);
        id *= 0xBF58476D1CE4E5B9ull;
        id ^= id >> 31;
    }
    return id;
}

inline double kmv_dot(const float* a, const float* b, int n) {
    double sum = 0.0;
    for (int c = 0; c < n; c++) sum += (double)a[c] * (double)b[c];
    return sum;
}

// One table's buckets over the keys of a segment of rows that share R_i: every key
// j < segment_end, grouped by bucket, ascending j within a bucket (a counting sort),
// behind an open-addressing map from bucket id to the bucket's range. A query reads
// its bucket's keys while j <= i: contiguous reads, and the keys after i are never
// touched.
struct KmvBucketIndex {
    int capacity_mask = 0;
    std::vector<uint64_t> id;    // per slot: the bucket id
    std::vector<int> bucket_of;  // per slot: the bucket's number, -1 for an empty slot
    std::vector<int> start;      // (buckets + 1): bucket b's keys are keys[start[b] .. start[b + 1])
    std::vector<int> keys;       // (segment_end)
    std::vector<int> key_bucket, fill;

    int slot_of(uint64_t bucket) const {  // its slot, or the empty slot where it would go
        int s = (int)(bucket & (uint64_t)capacity_mask);
        while (bucket_of[s] >= 0 && id[s] != bucket) s = (s + 1) & capacity_mask;
        return s;
    }
    // key_ids[j]: the bucket id of key j, for j < n
    void build(const uint64_t* key_ids, int n) {
        int capacity = 16;
        while (capacity < 2 * n) capacity *= 2;
        capacity_mask = capacity - 1;
        id.resize(capacity);
        bucket_of.assign(capacity, -1);
        key_bucket.resize(n);
        start.assign(1, 0);
        for (int j = 0; j < n; j++) {
            const int s = slot_of(key_ids[j]);
            if (bucket_of[s] < 0) {
                id[s] = key_ids[j];
                bucket_of[s] = (int)start.size() - 1;
                start.push_back(0);
            }
            key_bucket[j] = bucket_of[s];
            start[key_bucket[j] + 1]++;
        }
        for (size_t b = 1; b < start.size(); b++) start[b] += start[b - 1];
        fill.assign(start.begin(), start.end() - 1);
        keys.resize(n);
        for (int j = 0; j < n; j++) keys[fill[key_bucket[j]]++] = j;
    }
    // the bucket's keys as [first, last), or an empty range
    std::pair<const int*, const int*> range(uint64_t bucket) const {
        const int b = bucket_of[slot_of(bucket)];
        if (b < 0) return {nullptr, nullptr};
        return {keys.data() + start[b], keys.data() + start[b + 1]};
    }
};

// FindHeavy's candidate stage for one head. q and k point at row 0 of the
// head's query and key channels, rows `stride` floats apart. key_norm2[j] =
// |k_j|^2 and prefix_radius2[i] = R_i^2. For each query i in [first_row, T)
// calls visit(i, candidates, count, level): the distinct keys j <= i that share a
// bucket with q'_i in some table of one width level (in table order, then ascending
// j): the narrowest level with at least min_candidates of them, else the widest
// (with one level, level 0's candidates whatever their count). The tables are built
// once per segment of rows with the same R_i (once per (b, h) unless the prefix
// maximum of |k_j| grows), over the keys up to the segment's end, padded with
// that R; query i reads only the keys j <= i of its buckets. Returns the number
// of segments (builds).
template <class Visit>
inline int kmv_lsh_candidates(const float* q, const float* k, int stride, int T, int HS, const double* key_norm2,
                              const double* prefix_radius2, const KmvHashFamily& family, int first_row,
                              int min_candidates, Visit&& visit) {
    if (first_row >= T) return 0;
    const int L = family.num_tables, nb = family.num_bits, F = L * nb, dim = family.dim;
    const int levels = family.levels, LL = levels * L;  // tables over all levels, level-major
    // a_f[:HS] . x for every key and every queried row; the sum over c runs in
    // ascending c for each f, written with f innermost so that it vectorises
    std::vector<double> direction_t((size_t)HS * F);  // (HS, F)
    for (int f = 0; f < F; f++)
        for (int c = 0; c < HS; c++) direction_t[(size_t)c * F + f] = family.direction[(size_t)f * dim + c];
    std::vector<double> key_proj((size_t)T * F), query_proj((size_t)T * F);
    auto project = [&](double* out, const float* x) {
        for (int f = 0; f < F; f++) out[f] = 0.0;
        for (int c = 0; c < HS; c++) {
            const double xc = (double)x[c];
            const double* a = direction_t.data() + (size_t)c * F;
            for (int f = 0; f < F; f++) out[f] += a[f] * xc;
        }
    };
    for (int j = 0; j < T; j++) {
        project(key_proj.data() + (size_t)j * F, k + (size_t)j * stride);
        if (j >= first_row) project(query_proj.data() + (size_t)j * F, q + (size_t)j * stride);
    }
    std::vector<double> padded(F);
    std::vector<KmvBucketIndex> tables(LL);
    std::vector<uint64_t> key_ids((size_t)LL * T);  // (levels * L, T)
    std::vector<int64_t> seen_by(T, -1);  // seen_by[j] = the last (query, level) pass that listed j
    int64_t pass = 0;
    std::vector<int> candidates(T + 1);
    int builds = 0;
    for (int segment = first_row; segment < T;) {
        // rows [segment, end) share R_i, and every key j < end has |k_j| <= R_i
        int end = segment + 1;
        while (end < T && prefix_radius2[end] == prefix_radius2[segment]) end++;
        const double radius2 = prefix_radius2[segment];
        for (int j = 0; j < end; j++) {  // keys padded with sqrt(R^2 - |k_j|^2)
            const double pad = std::sqrt(std::max(radius2 - key_norm2[j], 0.0));
            for (int f = 0; f < F; f++)
                padded[f] = key_proj[(size_t)j * F + f] + family.direction[(size_t)f * dim + HS] * pad;
            for (int level = 0; level < levels; level++)
                for (int t = 0; t < L; t++)
                    key_ids[(size_t)(level * L + t) * T + j] =
                        kmv_bucket_id(padded.data() + (size_t)t * nb, family.level_offset(level) + (size_t)t * nb,
                                      nb, family.level_width(level));
        }
        for (int t = 0; t < LL; t++) tables[t].build(key_ids.data() + (size_t)t * T, end);
        builds++;
        for (int i = segment; i < end; i++) {
            // q' = [q, 0]: the padded coordinate adds nothing
            int count = 0, level = 0;
            for (;; level++) {
                count = 0;  // written without a branch on seen_by: about half the keys repeat
                pass++;
                for (int t = 0; t < L; t++) {
                    const uint64_t id =
                        kmv_bucket_id(query_proj.data() + (size_t)i * F + (size_t)t * nb,
                                      family.level_offset(level) + (size_t)t * nb, nb, family.level_width(level));
                    const auto [first, last] = tables[level * L + t].range(id);
                    for (const int* key = first; key != last && *key <= i; key++) {
                        const int j = *key;
                        candidates[count] = j;
                        count += seen_by[j] != pass;
                        seen_by[j] = pass;
                    }
                }
                if (count >= min_candidates || level + 1 == levels) break;
            }
            visit(i, (const int*)candidates.data(), count, level);
        }
        segment = end;
    }
    return builds;
}

// The m light keys of one row: a uniform m-subset of L = {0..i} \ heavy by
// Floyd's algorithm (m < light_count), written ascending to `keys`. `heavy`
// is sorted ascending; `chosen` is scratch of capacity m; `member` a bitmap of at
// least light_count bits, all clear, which is left clear. A draw already chosen
// is replaced by `top`, which exceeds every earlier member, so the set is Floyd's
// whatever the order kept; it is sorted once at the end.
inline void kmv_sample_light_keys(int* keys, uint32_t* chosen, uint64_t* member, const DrawSite& site, int m,
                                  uint32_t light_count, const int* heavy, int num_heavy) {
    for (int t = 0; t < m; t++) {
        const uint32_t top = light_count - (uint32_t)m + (uint32_t)t;
        const uint32_t u = uniform_below(philox_draw(site, DRAW_LIGHT_SAMPLE, (uint32_t)t).x[0], top + 1);
        const uint32_t pick = (member[u >> 6] >> (u & 63)) & 1u ? top : u;
        member[pick >> 6] |= 1ull << (pick & 63);
        chosen[t] = pick;
    }
    std::sort(chosen, chosen + m);
    for (int t = 0; t < m; t++) member[chosen[t] >> 6] = 0;
    // position p -> the p-th light key: skip heavy keys r with heavy[r] <= p + r
    int r = 0;
    for (int t = 0; t < m; t++) {
        const int p = (int)chosen[t];
        while (r < num_heavy && heavy[r] <= p + r) r++;
        keys[t] = p + r;
    }
}

// How kmv_select_keys scores the LSH candidates. Both give the same lists; the argument
// is §7.4's bullet on the double dot.
//   Reference: log K_ij of every candidate in double (dot_f64_lanes), then the
//              threshold and the budget, literally as §7.4 states them.
//   Fast:      an fp32 score f_ij of every candidate first, within Delta_i of the double
//              dot (topk_brute_margin), so log K_ij lies in [lo_j, hi_j], its formula at
//              f -+ Delta. The double dot is taken only where hi_j >= X, X the larger of a
//              lower bound of the row's threshold and lo at a lower bound of the
//              budget-th largest f (-inf when the candidates fit the budget, +inf when the
//              budget is 0). Below X a key fails the threshold or has budget keys strictly
//              above it, so the checked keys hold the heavy set and the row's largest
//              candidate. f comes from one cblas_sgemm per block of kKmvRowBlock rows where
//              the candidates cover a quarter of the block's causal scores or more (with
//              the rounding assumptions of causal_topk_brute_sgemm), else from an fp32 dot
//              per candidate.
enum class KmvScoring { Fast, Reference };

// Width levels: a row reads the narrowest level with at least this many times the heavy
// budget in candidates (the budget's largest are then picked from a pool twice its size)
constexpr int kKmvLevelFill = 2;

constexpr int kKmvRowBlock = 64;  // rows per block of the fast scoring; a row's scores (4T bytes) stay in L2

// an fp32 dot as 16 interleaved partial sums (any order is within the bound; this one vectorises)
inline float kmv_dot_f32(const float* a, const float* b, int n) {
    float lane[16] = {};
    int c = 0;
    for (; c + 16 <= n; c += 16)
        for (int l = 0; l < 16; l++) lane[l] += a[c + l] * b[c + l];
    for (; c < n; c++) lane[c % 16] += a[c] * b[c];
    float sum = 0.0f;
    for (int l = 0; l < 16; l++) sum += lane[l];
    return sum;
}

// f_b: a lower bound of the k-th largest of x[0..n) (1 <= k <= n), kKmvBudgetSteps steps
// of topk_kth_largest_key's bisection on the order keys. A closer bound saves double
// dots; each step costs a pass over the row.
constexpr int kKmvBudgetSteps = 16;
inline float kmv_kth_largest_lower_bound(const float* x, int n, int k, std::vector<int32_t>& order) {
    order.resize(n);
    for (int u = 0; u < n; u++) order[u] = topk_order_key(x[u] + 0.0f);
    return topk_order_float(topk_kth_largest_key(order.data(), n, k, kKmvBudgetSteps));
}

inline void kmv_select_keys(int* idx, float* logw, const float* qkv, int B, int T, int C, int NH, int max_keys,
                            const KmvParams& p, KmvStats* stats = nullptr,
                            KmvScoring scoring = KmvScoring::Fast) {
    kmv_check(NH > 0 && C % NH == 0, "C must be a multiple of NH");
    kmv_check(max_keys >= 1, "max_keys must be >= 1");
    kmv_check(p.num_tables >= 1 && p.num_bits >= 1, "num_tables and num_bits must be >= 1");
    kmv_check(kmv_width_levels_ok(p.width_levels), "width_levels must be in 1..8");
    kmv_check(p.light_samples >= 0, "light_samples must be >= 0");
    kmv_check(T <= (1 << 28) && (long long)p.num_tables * p.num_bits * (C / NH + 2) < (1ll << 28),
              "num_tables * num_bits * (HS + 2) must stay below 2^28 Philox draws");
    kmv_check(p.batch0 >= 0 && draw_rows_fit((long long)p.batch0 + B, T),
              "need batch0 >= 0 and (batch0 + B) * T <= 2^32 draw rows");
    const int HS = C / NH;
    const int C3 = 3 * C;
    const int K = max_keys;
    const int m = std::min(p.light_samples, K);
    const int heavy_budget = K - m;
    const double sqrt_d = std::sqrt((double)HS);
    const double tau = 1.0 / sqrt_d;
    const bool use_sgemm = topk_brute_sgemm_pays();
    long long total_heavy = 0, total_light = 0, total_rows = 0, total_candidates = 0, total_builds = 0;
    long long total_exact = 0, total_levels = 0;
    #pragma omp parallel reduction(+ : total_heavy, total_light, total_rows, total_candidates, total_builds, total_exact, \
                                       total_levels)
    {
        std::vector<double> key_norm2(T), query_norm2(T), prefix_radius2(T);
        std::vector<double> query_norm_up(T), prefix_key_norm_up(T);  // ||q_i||, max_{j<=i} ||k_j|| (upper bounds)
        std::vector<std::pair<double, int>> heavy;  // (log K_ij, j)
        std::vector<int> heavy_keys(K), light_keys(K);
        std::vector<uint32_t> chosen(K);
        std::vector<uint64_t> light_member((size_t)T / 64 + 1, 0);  // kmv_sample_light_keys' bitmap
        std::vector<int> block_candidates, block_start, exact_candidates;  // the fast scoring's block of rows
        std::vector<float> block_scores, row_scores;
        std::vector<int32_t> row_order;
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
                const float* q = qkv + at.q;
                const float* k = qkv + at.k;
                int* idx_bh = idx + ((size_t)b * NH + h) * T * K;
                float* logw_bh = logw + ((size_t)b * NH + h) * T * K;

                // rows whose causal prefix fits the list: all keys, exact
                for (int i = 0; i < T && i < K; i++) {
                    for (int t = 0; t < K; t++) {
                        idx_bh[(size_t)i * K + t] = t <= i ? t : -1;
                        logw_bh[(size_t)i * K + t] = 0.0f;
                    }
                }
                if (T <= K) continue;

                // norms and the causal radius R_i^2 = max_{j <= i} |k_j|^2
                double radius2 = 0.0, key_norm_up = 0.0;
                for (int j = 0; j < T; j++) {
                    key_norm2[j] = kmv_dot(k + (size_t)j * C3, k + (size_t)j * C3, HS);
                    query_norm2[j] = kmv_dot(q + (size_t)j * C3, q + (size_t)j * C3, HS);
                    radius2 = std::max(radius2, key_norm2[j]);
                    prefix_radius2[j] = radius2;
                    const double kn = topk_norm_up(k + (size_t)j * C3, HS);
                    key_norm_up = std::isfinite(kn) ? std::max(key_norm_up, kn) : INFINITY;  // inf: exact checks
                    prefix_key_norm_up[j] = key_norm_up;
                    query_norm_up[j] = topk_norm_up(q + (size_t)j * C3, HS);
                }
                const DrawSite hash_site = head_draw_site(p.seed, p.step, p.layer, NH, h, p.batch0 + b, T);
                const KmvHashFamily family = kmv_draw_hash_family(hash_site, HS, T, p);

                // row i's list from the candidates cand[0..n) whose log K_ij are taken exactly,
                // of the row's n_candidates: threshold, budget (§7.4), light samples
                auto finish_row = [&](int i, const int* cand, int n, int n_candidates) {
                    total_rows++;
                    total_candidates += n_candidates;
                    total_exact += n;
                    const double alpha_log_n = (double)p.heavy_alpha * std::log((double)(i + 1));
                    const double row_offset = (query_norm2[i] + prefix_radius2[i]) / (2.0 * sqrt_d);
                    const float* q_i = q + (size_t)i * C3;
                    heavy.clear();
                    double largest = -HUGE_VAL;
                    for (int u = 0; u < n; u++) {
                        const int j = cand[u];
                        const double log_kernel = tau * dot_f64_lanes(q_i, k + (size_t)j * C3, HS) - row_offset;
                        heavy.emplace_back(log_kernel, j);
                        largest = std::max(largest, log_kernel);
                    }
                    const double log_threshold =
                        p.threshold == KmvThreshold::Relative ? largest - alpha_log_n : -alpha_log_n;
                    heavy.erase(std::remove_if(heavy.begin(), heavy.end(),
                                               [&](const std::pair<double, int>& e) { return e.first < log_threshold; }),
                                heavy.end());
                    // over budget: keep the largest kernel values (ties: smaller j), a total order
                    if ((int)heavy.size() > heavy_budget) {
                        std::nth_element(heavy.begin(), heavy.begin() + heavy_budget, heavy.end(),
                                         [](const std::pair<double, int>& x, const std::pair<double, int>& y) {
                                             return x.first != y.first ? x.first > y.first : x.second < y.second;
                                         });
                        heavy.resize(heavy_budget);
                    }
                    const int num_heavy = (int)heavy.size();
                    for (int r = 0; r < num_heavy; r++) heavy_keys[r] = heavy[r].second;
                    std::sort(heavy_keys.begin(), heavy_keys.begin() + num_heavy);

                    int* idx_row = idx_bh + (size_t)i * K;
                    float* logw_row = logw_bh + (size_t)i * K;
                    for (int r = 0; r < num_heavy; r++) {
                        idx_row[r] = heavy_keys[r];
                        logw_row[r] = 0.0f;
                    }
                    const uint32_t light_count = (uint32_t)(i + 1 - num_heavy);  // > m
                    if (m > 0) {
                        const DrawSite row_site = row_draw_site(p.seed, p.step, p.layer, NH, h, p.batch0 + b, T, i);
                        kmv_sample_light_keys(light_keys.data(), chosen.data(), light_member.data(), row_site, m,
                                              light_count, heavy_keys.data(), num_heavy);
                        const float light_logw = (float)std::log((double)light_count / (double)m);
                        for (int t = 0; t < m; t++) {
                            idx_row[num_heavy + t] = light_keys[t];
                            logw_row[num_heavy + t] = light_logw;
                        }
                    }
                    for (int t = num_heavy + m; t < K; t++) {
                        idx_row[t] = -1;
                        logw_row[t] = 0.0f;
                    }
                    total_heavy += num_heavy;
                    total_light += m;
                };

                // the fast scoring of row i: f of its n candidates in f_row, then the double
                // dot for those with hi_j >= X only (KmvScoring above)
                auto finish_row_fast = [&](int i, const int* cand, const float* f_row, int n) {
                    const TopkBruteMargin margin = topk_brute_margin(query_norm_up[i], prefix_key_norm_up[i], HS);
                    if (!margin.fast_ok || n == 0) {
                        finish_row(i, cand, n, n);
                        return;
                    }
                    const double delta = margin.delta;
                    const double row_offset = (query_norm2[i] + prefix_radius2[i]) / (2.0 * sqrt_d);
                    auto log_kernel_at = [&](double dot) { return tau * dot - row_offset; };
                    double cut;  // X
                    if (p.threshold == KmvThreshold::Relative) {
                        float f_max = f_row[0];
                        for (int u = 1; u < n; u++) f_max = std::max(f_max, f_row[u]);
                        cut = log_kernel_at((double)f_max - delta) - (double)p.heavy_alpha * std::log((double)(i + 1));
                    } else {
                        cut = -(double)p.heavy_alpha * std::log((double)(i + 1));
                    }
                    if (heavy_budget == 0) {
                        cut = HUGE_VAL;  // no key is heavy
                    } else if (n > heavy_budget) {
                        const float f_budget = kmv_kth_largest_lower_bound(f_row, n, heavy_budget, row_order);
                        cut = std::max(cut, log_kernel_at((double)f_budget - delta));
                    }
                    exact_candidates.clear();
                    for (int u = 0; u < n; u++)
                        if (log_kernel_at((double)f_row[u] + delta) >= cut) exact_candidates.push_back(cand[u]);
                    finish_row(i, exact_candidates.data(), (int)exact_candidates.size(), n);
                };

                // a block of rows [r0, r1) whose candidates are in block_candidates
                auto finish_block = [&](int r0, int r1) {
                    const long long total = (long long)block_candidates.size();
                    const long long causal = ((long long)r1 * (r1 + 1) - (long long)r0 * (r0 + 1)) / 2;
                    const bool dense = use_sgemm && 4 * total >= causal;
                    if (dense) {  // (r1 - r0, r1) scores: row i - r0 against keys 0..r1-1
                        block_scores.resize((size_t)(r1 - r0) * r1);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, HS, 1.0f, q + (size_t)r0 * C3,
                                    C3, k, C3, 0.0f, block_scores.data(), r1);
                    }
                    for (int i = r0; i < r1; i++) {
                        const int* cand = block_candidates.data() + block_start[i - r0];
                        const int n = block_start[i - r0 + 1] - block_start[i - r0];
                        row_scores.resize(n);
                        if (dense) {
                            const float* s_row = block_scores.data() + (size_t)(i - r0) * r1;
                            for (int u = 0; u < n; u++) row_scores[u] = s_row[cand[u]];
                        } else {
                            const float* q_i = q + (size_t)i * C3;
                            for (int u = 0; u < n; u++) row_scores[u] = kmv_dot_f32(q_i, k + (size_t)cand[u] * C3, HS);
                        }
                        finish_row_fast(i, cand, row_scores.data(), n);
                    }
                    block_candidates.clear();
                    block_start.assign(1, 0);
                };

                block_candidates.clear();
                block_start.assign(1, 0);
                int block_r0 = K;
                auto visit = [&](int i, const int* candidates, int count, int level) {
                    total_levels += level;
                    if (scoring == KmvScoring::Reference) {
                        finish_row(i, candidates, count, count);
                        return;
                    }
                    if (block_start.size() == 1) block_r0 = i;
                    block_candidates.insert(block_candidates.end(), candidates, candidates + count);
                    block_start.push_back((int)block_candidates.size());
                    if (i + 1 - block_r0 == kKmvRowBlock || i == T - 1) finish_block(block_r0, i + 1);
                };
                total_builds += kmv_lsh_candidates(q, k, C3, T, HS, key_norm2.data(), prefix_radius2.data(),
                                                   family, K, std::max(kKmvLevelFill * heavy_budget, 1), visit);
            }
        }
    }
    if (stats) {
        stats->heavy += total_heavy;
        stats->light_samples += total_light;
        stats->rows += total_rows;
        stats->candidates += total_candidates;
        stats->table_builds += total_builds;
        stats->exact_checks += total_exact;
        stats->level_sum += total_levels;
    }
}

// (sum of all but the n largest) / (sum of the n largest) of exp(log_values),
// relative to the largest value. Reorders log_values.
inline double kmv_tail_to_top_ratio(std::vector<double>& log_values, size_t n) {
    if (log_values.empty() || n == 0) return 0.0;
    if (n > log_values.size()) n = log_values.size();
    std::nth_element(log_values.begin(), log_values.begin() + (n - 1), log_values.end(), std::greater<double>());
    const double largest = *std::max_element(log_values.begin(), log_values.begin() + n);
    double top = 0.0, rest = 0.0;
    for (size_t e = 0; e < n; e++) top += std::exp(log_values[e] - largest);
    for (size_t e = n; e < log_values.size(); e++) rest += std::exp(log_values[e] - largest);
    return rest / top;
}

// ĉ = (sum of all entries - sum of the T largest) / (sum of the T largest), ranked over
// the T (T + 1) / 2 causal entries of one (b, h) together (masked entries left out), each
// sum relative to the largest entry, in double (§7.7): on the §7.3 kernel matrix (R over
// all T keys), with each row's causal radius R_i instead, and on the raw exp(s_ij).
// O(T^2 D) with a T (T + 1) / 2 buffer.
inline AssumptionA measure_assumption_a(const float* qkv, int b, int h, int T, int C, int NH) {
    kmv_check(NH > 0 && C % NH == 0, "C must be a multiple of NH");
    const int HS = C / NH;
    const int C3 = 3 * C;
    const double sqrt_d = std::sqrt((double)HS);
    const double tau = 1.0 / sqrt_d;
    const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
    const float* q = qkv + at.q;
    const float* k = qkv + at.k;
    double radius2 = 0.0;  // R^2 = max_j |k_j|^2 over all T keys (§7.3)
    for (int j = 0; j < T; j++) radius2 = std::max(radius2, kmv_dot(k + (size_t)j * C3, k + (size_t)j * C3, HS));
    std::vector<double> log_kernel, log_raw, log_causal;
    log_kernel.reserve((size_t)T * (T + 1) / 2);
    log_raw.reserve((size_t)T * (T + 1) / 2);
    log_causal.reserve((size_t)T * (T + 1) / 2);
    double prefix_radius2 = 0.0;  // R_i^2 = max_{j <= i} |k_j|^2
    for (int i = 0; i < T; i++) {
        const float* q_i = q + (size_t)i * C3;
        prefix_radius2 = std::max(prefix_radius2, kmv_dot(k + (size_t)i * C3, k + (size_t)i * C3, HS));
        const double query_norm2 = kmv_dot(q_i, q_i, HS);
        const double row_offset = (query_norm2 + radius2) / (2.0 * sqrt_d);
        const double causal_offset = (query_norm2 + prefix_radius2) / (2.0 * sqrt_d);
        for (int j = 0; j <= i; j++) {
            const double s = tau * kmv_dot(q_i, k + (size_t)j * C3, HS);
            log_raw.push_back(s);
            log_kernel.push_back(s - row_offset);
            log_causal.push_back(s - causal_offset);
        }
    }
    return {kmv_tail_to_top_ratio(log_kernel, (size_t)T), kmv_tail_to_top_ratio(log_raw, (size_t)T),
            kmv_tail_to_top_ratio(log_causal, (size_t)T)};
}

// Sums over the rows of one head with n_i > K (measure_kmv_heavy); divide by rows.
struct KmvHeavyTally {
    double rows = 0;
    double heavy_abs = 0, heavy_rel = 0;        // heavy keys among all causal keys, per threshold
    double fraction_abs = 0, fraction_rel = 0;  // the same over n_i
    double empty_abs = 0, empty_rel = 0;        // rows without a heavy key
    double mass_abs = 0, mass_rel = 0;          // their softmax mass
    double list_heavy_abs = 0, list_heavy_rel = 0;  // heavy slots of kmv's lists
    double list_mass_abs = 0, list_mass_rel = 0;    // their softmax mass
    double candidates_abs = 0, candidates_rel = 0;  // LSH candidates per row, the layer's mean per head
    void add(const KmvHeavyTally& o) {
        rows += o.rows, heavy_abs += o.heavy_abs, heavy_rel += o.heavy_rel;
        fraction_abs += o.fraction_abs, fraction_rel += o.fraction_rel;
        empty_abs += o.empty_abs, empty_rel += o.empty_rel, mass_abs += o.mass_abs, mass_rel += o.mass_rel;
        list_heavy_abs += o.list_heavy_abs, list_heavy_rel += o.list_heavy_rel;
        list_mass_abs += o.list_mass_abs, list_mass_rel += o.list_mass_rel;
        candidates_abs += o.candidates_abs, candidates_rel += o.candidates_rel;
    }
};

// One layer's qkv (B, T, 3C): adds each head's tally of its B rows to tally[h]
// (NH entries). Over the rows kmv estimates (n_i > K), with the exact softmax of each row
// in double: the keys among ALL causal keys that pass each threshold (absolute: log K_ij >=
// -alpha log n_i; relative: s_ij >= max_{j' <= i} s_ij' - alpha log n_i), their count and
// softmax mass, and the heavy slots of kmv's own lists with their mass and the LSH
// candidates checked. kmv's lists are drawn as the forward would draw them with p (its
// seed, step, layer, batch0, alpha, light samples; the threshold is set here).
// O(T^2 D) per (b, h).
inline void measure_kmv_heavy(KmvHeavyTally* tally, const float* qkv, int B, int T, int C, int NH, int K,
                              const KmvParams& p) {
    kmv_check(NH > 0 && C % NH == 0, "C must be a multiple of NH");
    if (T <= K) return;  // no row is estimated
    const int HS = C / NH, C3 = 3 * C;
    const double sqrt_d = std::sqrt((double)HS);
    std::vector<int> idx((size_t)B * NH * T * K), heavy_slot[2];
    std::vector<float> logw(idx.size());
    KmvStats stats[2];
    for (int mode = 0; mode < 2; mode++) {
        KmvParams pm = p;
        pm.threshold = mode == 0 ? KmvThreshold::Absolute : KmvThreshold::Relative;
        kmv_select_keys(idx.data(), logw.data(), qkv, B, T, C, NH, K, pm, &stats[mode]);
        heavy_slot[mode].assign(idx.begin(), idx.end());
        for (size_t e = 0; e < idx.size(); e++)  // heavy slots: logw 0 in an estimated row
            if (logw[e] != 0.0f) heavy_slot[mode][e] = -1;
    }
    std::vector<double> s(T), prob(T);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            KmvHeavyTally& t = tally[h];
            const AttentionHeadOffsets at = attention_head_offsets(b, h, T, C, HS);
            const float* q = qkv + at.q;
            const float* kk = qkv + at.k;
            double radius2 = 0.0;
            for (int i = 0; i < T; i++) {
                const float* q_i = q + (size_t)i * C3;
                radius2 = std::max(radius2, kmv_dot(kk + (size_t)i * C3, kk + (size_t)i * C3, HS));
                if (i + 1 <= K) continue;
                double largest = -HUGE_VAL, z = 0.0;
                for (int j = 0; j <= i; j++) {
                    s[j] = kmv_dot(q_i, kk + (size_t)j * C3, HS) / sqrt_d;
                    largest = std::max(largest, s[j]);
                }
                for (int j = 0; j <= i; j++) z += prob[j] = std::exp(s[j] - largest);
                const double alpha_log_n = (double)p.heavy_alpha * std::log((double)(i + 1));
                const double row_offset = (kmv_dot(q_i, q_i, HS) + radius2) / (2.0 * sqrt_d);
                int n_abs = 0, n_rel = 0;
                double mass_abs = 0.0, mass_rel = 0.0;
                for (int j = 0; j <= i; j++) {
                    if (s[j] - row_offset >= -alpha_log_n) n_abs++, mass_abs += prob[j] / z;
                    if (s[j] >= largest - alpha_log_n) n_rel++, mass_rel += prob[j] / z;
                }
                t.rows++;
                t.heavy_abs += n_abs, t.heavy_rel += n_rel, t.mass_abs += mass_abs, t.mass_rel += mass_rel;
                t.fraction_abs += (double)n_abs / (i + 1), t.fraction_rel += (double)n_rel / (i + 1);
                t.empty_abs += n_abs == 0, t.empty_rel += n_rel == 0;
                const size_t row = (((size_t)b * NH + h) * T + i) * K;
                for (int slot = 0; slot < K; slot++) {
                    const int ja = heavy_slot[0][row + slot], jr = heavy_slot[1][row + slot];
                    if (ja >= 0) t.list_heavy_abs++, t.list_mass_abs += prob[ja] / z;
                    if (jr >= 0) t.list_heavy_rel++, t.list_mass_rel += prob[jr] / z;
                }
            }
        }
    }
    // candidates: counted per layer, so every head gets the layer's mean
    for (int h = 0; h < NH; h++) {
        tally[h].candidates_abs += (double)stats[0].candidates / NH;
        tally[h].candidates_rel += (double)stats[1].candidates / NH;
    }
}

}  // namespace knngpt::cpu
