// kernels/cpu/topk_index.h — causal top-k key search, the index of kNN attention
// (ALGORITHMS.md §6; tie rule of §2.1; batched layout of §9.2).
//
//   For batch b, head h and query i, with causal keys C_i = {0, .., i}:
//     score(i, j) = q_i . k_j                           (unscaled: 1/sqrt(HS) keeps the order)
//     S_i         = the k keys j in C_i ranked highest by (score desc, j asc)
//   so ties go to the smaller key index. Rows with n_i = i + 1 <= k take all of C_i.
//
// Shapes: qkv (B, T, 3C) as in attention.h (q = channels [0, C), k = [C, 2C), head h
// at h*HS.., HS = C / NH). Output idx (B, NH, T, k): row i holds S_i sorted by
// ascending key index; rows with i + 1 <= k hold 0..i, then -1. Nothing is saved
// for a backward: the index is a discrete choice, the attention kernels differentiate
// through the chosen keys.
//
// The score every index uses (and the one that makes `block` equal `brute` bit for
// bit, and the CPU equal the CUDA kernels): attention_dot of
// kernels/common/attention_score.h, a sequential fp32 fused multiply-add over the
// channels, acc = 0; for d = 0..HS-1: acc = fmaf(q_d, k_jd, acc), in every build.
// The kernels compute it for 8 keys at once, one key per vector lane, which repeats
// exactly the same operations per key.
//
// Three indices:
//   brute  exact. Per (b, h) and block of kTopkQueryBlock queries, the block's scores
//          against keys 0..(last query) go into a per-thread (block, T) scratch (never
//          a T x T buffer), then a size-k heap keyed by (score desc, index asc) selects
//          each row. O(T^2 HS) per head.
//   block  exact, the same result as brute. Keys of a (b, h) are partitioned into
//          blocks of at most block_size SIMILAR keys (recursive 2-means bisection,
//          topk_block_partition), whatever their positions; block c has centroid c_c
//          and radius r_c = max_j ||k_j - c_c||, so q . k_j <= q . c_c + ||q|| r_c for
//          each of its keys. Query i bounds every block holding a key j <= i (blocks
//          are ordered by their smallest key, so these are a prefix), scores only
//          those keys of a visited block, and never needs a block whose bound is below
//          its final k-th best score (an equal bound is visited: an equal score with a
//          smaller index would win). The bound is made rigorous for fp32 by inflating
//          the radius by a rounding margin (see the block section). The bounds q . c_c
//          of a query block are one sgemm; visits go in rounds by decreasing bound,
//          then per key block for all rows of the query block that still need it.
//          O(T HS log T) for the partition, O(T^2 HS / block_size) for the bounds,
//          plus the visited blocks' scores. The ball bound prunes blocks of other
//          clusters, never blocks of the query's own cluster (there its ||q|| r term
//          exceeds the spread of the top scores); with consecutive positions as blocks,
//          interleaved clusters put many clusters in every block and nothing was pruned.
//          The ball bound is weak when the within-cluster noise is large in many
//          dimensions: with keys = centre (norm 3) + 0.3 N(0, I) in 64 dimensions, r is
//          about 2.6-2.9 whatever the partition, ||q|| r about 10-11, as large as the
//          k-th best score (about 10.7 at T = 16384), so even blocks that are exact
//          clusters leave about 70% of the blocks to visit there.
//   lsh    approximate (SimHash on MIPS-padded vectors, §6). Per table t, num_bits
//          random hyperplanes a in R^(HS+1); key code bit = [a . (k_j, sqrt(R^2 - ||k_j||^2)) >= 0],
//          query code bit = [a . (q_i, 0) >= 0], R = max_j ||k_j|| over the whole (b, h).
//          Candidates = keys j <= i sharing the query's bucket in any table, ranked by
//          the exact score. If fewer than n = min(k, i+1) candidates turn up, the row is
//          filled with the most recent keys i, i-1, .. not already candidates, so every
//          row has exactly n distinct keys. With num_bits = 0 every key is a candidate
//          and lsh equals brute.
//          Randomness (§9.3): hyperplane entry (t, m, d) (bit m, coordinate d in 0..HS)
//          is a standard Gaussian from philox_draw(site, DRAW_HASH, m * (HS+1) + d),
//          site = {seed, step, layer * NH + h, t}: the batch_query slot of the counter
//          carries the table, since one set of hyperplanes serves every batch row and
//          query of a head. Box-Muller on the draw's four words:
//          g = sqrt(-2 log u0) cos(2 pi u1), u0 from words 0,1 and u1 from words 2,3,
//          computed in double and stored as fp32; the projections a . x are fp32 sums.
//          Candidates are scored through the key panel (the chunks of 8 keys holding
//          them), with the same score as brute.
//
// Statistics (TopkStats, accumulated with +=, only over rows with i + 1 > k, which
// are the rows that search): scores_computed = query-key scores evaluated (brute: i+1
// per row; block: the keys j <= i of visited blocks; lsh: candidates);
// blocks_total = blocks holding a key j <= i, blocks_visited = those whose keys j <= i
// were scored, summed over rows (block index only).
//
// Inputs must be finite (a NaN score has no place in the ranking). OpenMP runs over
// (b, h) x query blocks (lsh: over (b, h)); every row is computed by one thread in
// a fixed order, so results and statistics are deterministic.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <utility>
#include <vector>

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/common/attention_params.h"
#include "kernels/common/attention_score.h"
#include "kernels/common/draws.h"

namespace knngpt::cpu {

using knngpt::TopkIndex;
using knngpt::LshParams;

struct TopkStats {
    long long scores_computed = 0;
    long long blocks_visited = 0;
    long long blocks_total = 0;
};

constexpr int kTopkLanes = 8;        // keys per panel chunk: one vector of fp32 scores
constexpr int kTopkQueryBlock = 64;  // queries per OpenMP work item

inline void topk_check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "kernels/cpu/topk_index.h: %s\n", what);
        std::abort();
    }
}

// ----------------------------------------------------------------------------
// Key panels: the keys of one (b, h) transposed in chunks of kTopkLanes keys,
// (chunks, HS, kTopkLanes), zero beyond key T-1, so a chunk's 8 scores are 8
// independent fma chains over contiguous loads. All heads: (B, NH, chunks, HS, 8).

inline int topk_num_chunks(int T) { return (T + kTopkLanes - 1) / kTopkLanes; }

inline size_t topk_idx_row(int b, int h, int i, int T, int NH, int k) {
    return (((size_t)b * NH + h) * T + i) * (size_t)k;
}

// one head: panel (chunks, HS, 8) from the keys k_head[j * key_stride + d], j < T
inline void topk_pack_head_keys(float* panel, const float* k_head, size_t key_stride, int T, int HS) {
    const int chunks = topk_num_chunks(T);
    for (int c = 0; c < chunks; c++) {
        float* chunk = panel + (size_t)c * HS * kTopkLanes;
        for (int l = 0; l < kTopkLanes; l++) {
            const int j = c * kTopkLanes + l;
            const float* key = k_head + (size_t)j * key_stride;
            for (int d = 0; d < HS; d++) chunk[d * kTopkLanes + l] = j < T ? key[d] : 0.0f;
        }
    }
}

// every head: panels (B, NH, chunks, HS, 8)
inline void topk_pack_keys(float* panels, const float* qkv, int B, int T, int C, int NH) {
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const size_t head_size = (size_t)topk_num_chunks(T) * HS * kTopkLanes;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            topk_pack_head_keys(panels + ((size_t)b * NH + h) * head_size, qkv + (size_t)b * T * C3 + C + (size_t)h * HS,
                                C3, T, HS);
}

// Eight fp32 lanes, one key each; a lane's fma is exactly attention_dot's fmaf. AVX2/FMA
// intrinsics where available (g++ does not reliably vectorise the lane loops),
// otherwise plain per-lane loops: the same operations, the same results.
#if defined(__AVX__) && defined(__FMA__)
using TopkLaneVec = __m256;
inline TopkLaneVec topk_lanes_zero() { return _mm256_setzero_ps(); }
inline TopkLaneVec topk_lanes_load(const float* p) { return _mm256_loadu_ps(p); }
inline void topk_lanes_store(float* p, TopkLaneVec v) { _mm256_storeu_ps(p, v); }
inline TopkLaneVec topk_lanes_fma(float a, TopkLaneVec b, TopkLaneVec acc) {
    return _mm256_fmadd_ps(_mm256_set1_ps(a), b, acc);
}
#else
struct TopkLaneVec {
    float x[kTopkLanes];
};
inline TopkLaneVec topk_lanes_zero() { return TopkLaneVec{}; }
inline TopkLaneVec topk_lanes_load(const float* p) {
    TopkLaneVec v;
    for (int l = 0; l < kTopkLanes; l++) v.x[l] = p[l];
    return v;
}
inline void topk_lanes_store(float* p, TopkLaneVec v) {
    for (int l = 0; l < kTopkLanes; l++) p[l] = v.x[l];
}
inline TopkLaneVec topk_lanes_fma(float a, TopkLaneVec b, TopkLaneVec acc) {
    for (int l = 0; l < kTopkLanes; l++) acc.x[l] = std::fma(a, b.x[l], acc.x[l]);
    return acc;
}
#endif

// scores of one query q against chunks [c0, c1) of a panel: out[(c - c0) * 8 + l]
inline void topk_score_chunks(float* out, const float* q, const float* panel, int c0, int c1, int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    int c = c0;
    // eight chunks (64 keys) at a time: eight independent chains keep both fma ports busy
    for (; c + 8 <= c1; c += 8) {
        const float* k0 = panel + (size_t)c * chunk_size;
        TopkLaneVec acc[8];
        for (int u = 0; u < 8; u++) acc[u] = topk_lanes_zero();
        for (int d = 0; d < HS; d++) {
            const float qd = q[d];
            const float* kd = k0 + d * kTopkLanes;
            for (int u = 0; u < 8; u++) acc[u] = topk_lanes_fma(qd, topk_lanes_load(kd + u * chunk_size), acc[u]);
        }
        for (int u = 0; u < 8; u++) topk_lanes_store(out + (size_t)(c - c0 + u) * kTopkLanes, acc[u]);
    }
    // then four: four chains
    for (; c + 4 <= c1; c += 4) {
        const float* k0 = panel + (size_t)c * chunk_size;
        TopkLaneVec a0 = topk_lanes_zero(), a1 = topk_lanes_zero(), a2 = topk_lanes_zero(), a3 = topk_lanes_zero();
        for (int d = 0; d < HS; d++) {
            const float qd = q[d];
            const float* kd = k0 + d * kTopkLanes;
            a0 = topk_lanes_fma(qd, topk_lanes_load(kd), a0);
            a1 = topk_lanes_fma(qd, topk_lanes_load(kd + chunk_size), a1);
            a2 = topk_lanes_fma(qd, topk_lanes_load(kd + 2 * chunk_size), a2);
            a3 = topk_lanes_fma(qd, topk_lanes_load(kd + 3 * chunk_size), a3);
        }
        float* o = out + (size_t)(c - c0) * kTopkLanes;
        topk_lanes_store(o, a0);
        topk_lanes_store(o + kTopkLanes, a1);
        topk_lanes_store(o + 2 * kTopkLanes, a2);
        topk_lanes_store(o + 3 * kTopkLanes, a3);
    }
    for (; c < c1; c++) {
        const float* k0 = panel + (size_t)c * chunk_size;
        TopkLaneVec a0 = topk_lanes_zero();
        for (int d = 0; d < HS; d++) a0 = topk_lanes_fma(q[d], topk_lanes_load(k0 + d * kTopkLanes), a0);
        topk_lanes_store(out + (size_t)(c - c0) * kTopkLanes, a0);
    }
}

// scores of four queries against chunks [0, c1): row r at out + r * ld_out. q4 holds
// the queries interleaved, q4[d * 4 + r] = q_r[d] (one pointer keeps the loop in registers).
inline void topk_score_chunks_4q(float* out, size_t ld_out, const float* q4, const float* panel, int c1, int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    int c = 0;
    // two chunks x four queries: eight independent chains
    for (; c + 2 <= c1; c += 2) {
        const float* k0 = panel + (size_t)c * chunk_size;
        TopkLaneVec a00 = topk_lanes_zero(), a10 = topk_lanes_zero(), a20 = topk_lanes_zero(), a30 = topk_lanes_zero();
        TopkLaneVec a01 = topk_lanes_zero(), a11 = topk_lanes_zero(), a21 = topk_lanes_zero(), a31 = topk_lanes_zero();
        for (int d = 0; d < HS; d++) {
            const float* qd = q4 + 4 * d;
            const TopkLaneVec x0 = topk_lanes_load(k0 + d * kTopkLanes);
            const TopkLaneVec x1 = topk_lanes_load(k0 + chunk_size + d * kTopkLanes);
            a00 = topk_lanes_fma(qd[0], x0, a00);
            a10 = topk_lanes_fma(qd[1], x0, a10);
            a20 = topk_lanes_fma(qd[2], x0, a20);
            a30 = topk_lanes_fma(qd[3], x0, a30);
            a01 = topk_lanes_fma(qd[0], x1, a01);
            a11 = topk_lanes_fma(qd[1], x1, a11);
            a21 = topk_lanes_fma(qd[2], x1, a21);
            a31 = topk_lanes_fma(qd[3], x1, a31);
        }
        const size_t o = (size_t)c * kTopkLanes;
        topk_lanes_store(out + o, a00);
        topk_lanes_store(out + ld_out + o, a10);
        topk_lanes_store(out + 2 * ld_out + o, a20);
        topk_lanes_store(out + 3 * ld_out + o, a30);
        topk_lanes_store(out + o + kTopkLanes, a01);
        topk_lanes_store(out + ld_out + o + kTopkLanes, a11);
        topk_lanes_store(out + 2 * ld_out + o + kTopkLanes, a21);
        topk_lanes_store(out + 3 * ld_out + o + kTopkLanes, a31);
    }
    if (c < c1) {  // an odd last chunk, one query at a time
        for (int r = 0; r < 4; r++) {
            const float* k0 = panel + (size_t)c * chunk_size;
            TopkLaneVec a0 = topk_lanes_zero();
            for (int d = 0; d < HS; d++) a0 = topk_lanes_fma(q4[4 * d + r], topk_lanes_load(k0 + d * kTopkLanes), a0);
            topk_lanes_store(out + r * ld_out + (size_t)c * kTopkLanes, a0);
        }
    }
}

// scores of one query against a list of chunks of a panel: out[u * 8 + l] for chunk
// chunk_ids[u], eight chunks at a time (independent chains), then one at a time
inline void topk_score_chunk_list(float* out, const float* q, const float* panel, const int* chunk_ids, int n,
                                  int HS) {
    const size_t chunk_size = (size_t)HS * kTopkLanes;
    int u = 0;
    for (; u + 8 <= n; u += 8) {
        const float* k[8];
        TopkLaneVec acc[8];
        for (int v = 0; v < 8; v++) {
            k[v] = panel + (size_t)chunk_ids[u + v] * chunk_size;
            acc[v] = topk_lanes_zero();
        }
        for (int d = 0; d < HS; d++) {
            const float qd = q[d];
            for (int v = 0; v < 8; v++) acc[v] = topk_lanes_fma(qd, topk_lanes_load(k[v] + d * kTopkLanes), acc[v]);
        }
        for (int v = 0; v < 8; v++) topk_lanes_store(out + (size_t)(u + v) * kTopkLanes, acc[v]);
    }
    for (; u < n; u++) topk_score_chunks(out + (size_t)u * kTopkLanes, q, panel, chunk_ids[u], chunk_ids[u] + 1, HS);
}

// ----------------------------------------------------------------------------
// Selection: the k best (score desc, key asc) of the keys offered, in any order.

struct TopkCandidate {
    float score;
    int key;
};

// a ranks above b: a larger score, ties to the smaller key index (§2.1)
inline bool topk_ranks_above(const TopkCandidate& a, const TopkCandidate& b) {
    return a.score > b.score || (a.score == b.score && a.key < b.key);
}

// A size-k heap whose root is the lowest-ranked of the current best k.
class TopkSelector {
public:
    explicit TopkSelector(int k) : k_(k), size_(0), heap_((size_t)k) {}
    void clear() { size_ = 0; }
    int size() const { return size_; }
    bool full() const { return size_ == k_; }
    // the current k-th best (valid when full())
    const TopkCandidate& lowest() const { return heap_[0]; }
    // whether a key with this score could enter (a cheap filter before offer)
    bool may_enter(float score) const { return size_ < k_ || score >= heap_[0].score; }

    void offer(float score, int key) {
        const TopkCandidate cand{score, key};
        if (size_ < k_) {  // sift up from the new leaf
            int pos = size_++;
            while (pos > 0) {
                const int parent = (pos - 1) / 2;
                if (!topk_ranks_above(heap_[parent], cand)) break;
                heap_[pos] = heap_[parent];
                pos = parent;
            }
            heap_[pos] = cand;
            return;
        }
        if (!topk_ranks_above(cand, heap_[0])) return;
        // replace the root and sift down
        int pos = 0;
        for (;;) {
            int child = 2 * pos + 1;
            if (child >= k_) break;
            if (child + 1 < k_ && topk_ranks_above(heap_[child], heap_[child + 1])) child++;
            if (!topk_ranks_above(cand, heap_[child])) break;
            heap_[pos] = heap_[child];
            pos = child;
        }
        heap_[pos] = cand;
    }

    // offer keys first_key, first_key + 1, .. with scores[0..n): one comparison per
    // key once the heap is full (a key must score >= the k-th best to enter)
    void offer_range(const float* scores, int n, int first_key) {
        offer_each(scores, n, [first_key](int s) { return first_key + s; });
    }
    // the same for keys[0..n) with scores[0..n)
    void offer_list(const float* scores, const int* keys, int n) {
        offer_each(scores, n, [keys](int s) { return keys[s]; });
    }

    // the selected keys in ascending order into dst[0..size()); returns size()
    int write_sorted(int* dst) const {
        for (int s = 0; s < size_; s++) dst[s] = heap_[s].key;
        std::sort(dst, dst + size_);
        return size_;
    }

private:
    template <class KeyOf>
    void offer_each(const float* scores, int n, KeyOf key_of) {
        int s = 0;
        for (; s < n && !full(); s++) offer(scores[s], key_of(s));
        if (s == n) return;
        float kth = heap_[0].score;
        // eight at a time: most groups have no key reaching the k-th best
        for (; s + kTopkLanes <= n; s += kTopkLanes) {
            int reaching = 0;
            for (int l = 0; l < kTopkLanes; l++) reaching |= scores[s + l] >= kth;
            if (!reaching) continue;
            for (int l = 0; l < kTopkLanes; l++) {
                if (scores[s + l] >= kth) {
                    offer(scores[s + l], key_of(s + l));
                    kth = heap_[0].score;
                }
            }
        }
        for (; s < n; s++) {
            if (scores[s] >= kth) {
                offer(scores[s], key_of(s));
                kth = heap_[0].score;
            }
        }
    }

    int k_, size_;
    std::vector<TopkCandidate> heap_;
};

// a row with i + 1 <= k keys: all of them, then -1
inline void topk_write_all_keys(int* row, int i, int k) {
    for (int s = 0; s < k; s++) row[s] = s <= i ? s : -1;
}

inline void topk_check_shapes(int B, int T, int C, int NH, int k) {
    topk_check(B >= 1 && T >= 1 && NH >= 1, "B, T and NH must be >= 1");
    topk_check(C % NH == 0, "C must be a multiple of NH");
    topk_check(k >= 1, "k must be >= 1");
}

// ----------------------------------------------------------------------------
// brute

inline void causal_topk_brute(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                              TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int chunks = topk_num_chunks(T);
    const size_t panel_size = (size_t)chunks * HS * kTopkLanes;
    const size_t ld_scores = (size_t)chunks * kTopkLanes;
    std::vector<float> panels((size_t)B * NH * panel_size);
    topk_pack_keys(panels.data(), qkv, B, T, C, NH);
    const int num_blocks = (T + kTopkQueryBlock - 1) / kTopkQueryBlock;
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
                    // the last blocks see the most keys: hand them out first
                    const int i0 = (num_blocks - 1 - blk) * kTopkQueryBlock;
                    const int i1 = std::min(i0 + kTopkQueryBlock, T);
                    const float* panel = panels.data() + ((size_t)b * NH + h) * panel_size;
                    const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                    // rows i < k take every key; searching starts at i_search
                    const int i_search = std::max(i0, std::min(k, i1));
                    for (int i = i0; i < i_search; i++) topk_write_all_keys(idx + topk_idx_row(b, h, i, T, NH, k), i, k);
                    // scores of rows i_search..i1-1 against the chunks each row needs
                    int first = i_search;  // four rows first, ..first + 3
                    for (; first + 4 <= i1; first += 4) {
                        for (int r = 0; r < 4; r++)
                            for (int d = 0; d < HS; d++) q4[4 * d + r] = q_head[(size_t)(first + r) * C3 + d];
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
// block

// Per (b, h): the partition of the keys into blocks of similar keys, and per block
//   keys     its key positions, ascending; blocks are ordered by their first (smallest) key
//   centroid c_c  (fp32, the mean computed in double then rounded)
//   reach    R'_c = r_c + eps (||c_c|| + r_c),  r_c = max_j ||k_j - c_c|| (rounded up)
//   panel    its keys in panel chunks of 8 in the block's order (the last chunk
//            zero-padded; one zero chunk after the last block), so the keys j <= i of
//            a block, a prefix of its list, are a run of chunks.
// A query's bound is fl(q . c_c) + qn R'_c with qn >= ||q||, computed in fp32.
// Why the margin eps = (4 HS + 16) 2^-24 makes it rigorous: the computed score
// differs from q . k_j by at most ~HS u ||q|| ||k_j|| (sequential fma, u = 2^-24),
// fl(q . c_c) from q . c_c by at most ~HS u ||q|| ||c_c|| (any summation order), the
// final multiply-add by ~3u qn (||c_c|| + R'_c); with ||k_j|| <= ||c_c|| + r_c the
// sum is below 4 (HS + 4) u qn (||c_c|| + r_c). So every computed score of the block
// (of its keys j <= i in particular) is <= the computed bound, and a block whose
// bound is below the k-th best so far holds no key that can enter.
//
// The partition (topk_block_partition) is a recursive 2-means bisection. One split
// of a set of n keys:
//   seeds   a = the key farthest from the set's mean, b = the key farthest from a
//           (the first such key in the set's current order on ties);
//   Lloyd   up to kTopkBisectIters rounds: key x goes to side a iff
//           p(x) = x . (c_a - c_b) - (||c_a||^2 - ||c_b||^2) / 2 > 0 (nearer to c_a),
//           then c_a, c_b become the means of their sides; stop when no key moves;
//   balance when n > block_size, each side keeps at least min(n / 2, max(1,
//           block_size / 4)) keys: if one is smaller, side a becomes the keys with
//           the largest p (ties to the earlier key in the set's order), so the
//           recursion cannot peel off single keys from a large set.
// A set of more than block_size keys is always split. A set of 2..block_size keys is
// split (balance rule off) only if both sides have radii <= kTopkTightSplit times
// its own (radius = max distance to the mean): it held two groups, e.g. parts of two
// clusters, whose common block would have a large radius and be visited by the
// queries of both. Otherwise it is a block.
// Work: about (2 kTopkBisectIters + 3) n HS multiply-adds per split, so
// O(T HS log(T / block_size)) per head when splits are balanced; the balance rule
// caps the worst case at O(T^2 HS / block_size), the order of the search's own
// bound computations, and the tight splits add at most O(T block_size HS). fp32
// arithmetic in a fixed order: the partition is a deterministic function of the
// keys. The exactness of the search never depends on it.
//
// The search, per (b, h) and query block (rows i0..i1-1):
//   bounds  one sgemm: q_i . c_c for every row and every block holding a key <= i1-1;
//   phase 1 per row, kTopkPhase1Rounds rounds: drop the blocks whose bound is below
//           the row's k-th best so far, then score the g best remaining (g covers
//           about 2k keys, doubling each round) in one pass over their chunks. This
//           finds most of the row's final top k (its own cluster's blocks come first);
//   phase 2 per block, in order: the rows whose bound for it is >= their k-th best so
//           far (checked again when its turn comes), four rows at a time against its
//           chunks, so a block's keys are loaded once for the whole query block.
// A block a row skips has a bound below the row's k-th best at some point, hence
// below its final k-th best: the result is the exact top k whatever the visiting
// order. Rows and blocks go in a fixed order, so results and statistics are
// deterministic.
constexpr int kTopkBisectIters = 6;
constexpr float kTopkTightSplit = 0.85f;
constexpr int kTopkPhase1Rounds = 3;

inline float topk_round_up(double x) {
    const float f = (float)x;
    return (double)f >= x ? f : std::nextafter(f, INFINITY);
}

// a . b in fp32 with eight partial sums (vectorisable, fixed order); clustering only
inline float topk_dot_fast(const float* a, const float* b, int n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[d + l] * b[d + l];
    float s = 0.0f;
    for (; d < n; d++) s += a[d] * b[d];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

// ||a - b||^2 in the same way
inline float topk_dist2_fast(const float* a, const float* b, int n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += (a[d + l] - b[d + l]) * (a[d + l] - b[d + l]);
    float s = 0.0f;
    for (; d < n; d++) s += (a[d] - b[d]) * (a[d] - b[d]);
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

// max ||x_r - mean||^2 over n rows (fp32, fixed order); mean is scratch of HS floats
inline float topk_radius2(const float* rows, int n, int HS, float* mean) {
    std::fill(mean, mean + HS, 0.0f);
    for (int r = 0; r < n; r++)
        for (int d = 0; d < HS; d++) mean[d] += rows[(size_t)r * HS + d];
    for (int d = 0; d < HS; d++) mean[d] /= (float)n;
    float r2 = 0.0f;
    for (int r = 0; r < n; r++) r2 = std::max(r2, topk_dist2_fast(rows + (size_t)r * HS, mean, HS));
    return r2;
}

// Splits rows [lo, hi) of x (rows of HS floats, key positions alongside in pos) in two
// by 2-means (see above) and reorders them: one side at [lo, mid), the other at
// [mid, hi). Returns mid. scratch_rows holds >= hi - lo rows; the vectors are resized.
inline int topk_bisect(float* x, int* pos, int lo, int hi, int HS, int min_side, float* scratch_rows,
                       std::vector<float>& p, std::vector<char>& side, std::vector<int>& order) {
    const int n = hi - lo;
    float* rows = x + (size_t)lo * HS;
    std::vector<float> ca(HS), cb(HS), w(HS);
    p.resize(n);
    side.assign(n, 2);  // 2: not assigned yet
    // seeds: a farthest from the mean, b farthest from a
    std::fill(ca.begin(), ca.end(), 0.0f);
    for (int r = 0; r < n; r++)
        for (int d = 0; d < HS; d++) ca[d] += rows[(size_t)r * HS + d];
    for (int d = 0; d < HS; d++) ca[d] /= (float)n;
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
    for (int it = 0; it < kTopkBisectIters; it++) {
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
        if (!moved || na == 0 || na == n || it + 1 == kTopkBisectIters) break;
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

// The blocks of one head: block c holds the key positions keys[block_start[c] ..
// block_start[c+1]), ascending, every block at most block_size keys, blocks ordered
// by their first key. keys is a permutation of 0..T-1. Key j is k_head[j * key_stride ..].
inline void topk_block_partition(std::vector<int>& block_start, std::vector<int>& keys, const float* k_head,
                                 size_t key_stride, int T, int HS, int block_size) {
    topk_check(block_size >= 1, "block_size must be >= 1");
    std::vector<float> x((size_t)T * HS), scratch((size_t)T * HS), p;
    std::vector<int> pos((size_t)T), order;
    std::vector<char> side;
    for (int j = 0; j < T; j++) {
        pos[j] = j;
        std::copy(k_head + (size_t)j * key_stride, k_head + (size_t)j * key_stride + HS, x.begin() + (size_t)j * HS);
    }
    // split ranges until each has at most block_size keys (an explicit stack, a fixed order)
    std::vector<std::pair<int, int>> pending{{0, T}}, leaves;
    std::vector<float> mean(HS);
    auto radius2 = [&](int lo, int hi) { return topk_radius2(x.data() + (size_t)lo * HS, hi - lo, HS, mean.data()); };
    while (!pending.empty()) {
        const auto [lo, hi] = pending.back();
        pending.pop_back();
        int mid;
        if (hi - lo <= block_size) {
            // small enough; still split when both halves are clearly tighter (two groups)
            const float r2 = hi - lo >= 2 ? radius2(lo, hi) : 0.0f;
            if (!(r2 > 0.0f)) {
                leaves.push_back({lo, hi});
                continue;
            }
            mid = topk_bisect(x.data(), pos.data(), lo, hi, HS, 1, scratch.data(), p, side, order);
            if (std::max(radius2(lo, mid), radius2(mid, hi)) > kTopkTightSplit * kTopkTightSplit * r2) {
                leaves.push_back({lo, hi});
                continue;
            }
        } else {
            const int min_side = std::max(1, std::min((hi - lo) / 2, block_size / 4));
            mid = topk_bisect(x.data(), pos.data(), lo, hi, HS, min_side, scratch.data(), p, side, order);
        }
        pending.push_back({mid, hi});
        pending.push_back({lo, mid});
    }
    for (const auto& [lo, hi] : leaves) std::sort(pos.begin() + lo, pos.begin() + hi);
    std::sort(leaves.begin(), leaves.end(), [&](const std::pair<int, int>& u, const std::pair<int, int>& v) {
        return pos[u.first] < pos[v.first];
    });
    block_start.assign(1, 0);
    keys.clear();
    keys.reserve(T);
    for (const auto& [lo, hi] : leaves) {
        keys.insert(keys.end(), pos.begin() + lo, pos.begin() + hi);
        block_start.push_back((int)keys.size());
    }
}

// One head's block index (see above).
struct TopkBlockHead {
    int num_blocks = 0;
    std::vector<int> block_start;  // (num_blocks + 1)
    std::vector<int> keys;         // (T): block c's keys at [block_start[c], block_start[c+1]), ascending
    std::vector<int> first_key;    // (num_blocks): keys[block_start[c]], ascending in c
    std::vector<int> chunk_start;  // (num_blocks + 1): block c's panel chunks
    std::vector<float> panel;      // (chunk_start[num_blocks], HS, 8)
    std::vector<float> centroids;  // (num_blocks, HS)
    std::vector<float> reach;      // (num_blocks)
};

inline void topk_block_head_build(TopkBlockHead& head, const float* k_head, size_t key_stride, int T, int HS,
                                  int block_size) {
    topk_block_partition(head.block_start, head.keys, k_head, key_stride, T, HS, block_size);
    const int nb = (int)head.block_start.size() - 1;
    head.num_blocks = nb;
    head.first_key.resize(nb);
    head.chunk_start.assign(nb + 1, 0);
    for (int c = 0; c < nb; c++) {
        head.first_key[c] = head.keys[head.block_start[c]];
        head.chunk_start[c + 1] = head.chunk_start[c] + topk_num_chunks(head.block_start[c + 1] - head.block_start[c]);
    }
    // one zero chunk past the end: a block's chunks can always be scored in pairs
    head.panel.assign((size_t)(head.chunk_start[nb] + 1) * HS * kTopkLanes, 0.0f);
    head.centroids.assign((size_t)nb * HS, 0.0f);
    head.reach.assign(nb, 0.0f);
    const double eps = (4.0 * HS + 16.0) * std::ldexp(1.0, -24);
    std::vector<double> mean(HS);
    for (int c = 0; c < nb; c++) {
        const int u0 = head.block_start[c], u1 = head.block_start[c + 1];
        // panel: key u of the block in chunk chunk_start[c] + u / 8, lane u % 8
        for (int u = u0; u < u1; u++) {
            const float* key = k_head + (size_t)head.keys[u] * key_stride;
            float* chunk = head.panel.data() + (size_t)(head.chunk_start[c] + (u - u0) / kTopkLanes) * HS * kTopkLanes;
            for (int d = 0; d < HS; d++) chunk[d * kTopkLanes + (u - u0) % kTopkLanes] = key[d];
        }
        float* centroid = head.centroids.data() + (size_t)c * HS;
        std::fill(mean.begin(), mean.end(), 0.0);
        for (int u = u0; u < u1; u++)
            for (int d = 0; d < HS; d++) mean[d] += k_head[(size_t)head.keys[u] * key_stride + d];
        double centroid_norm2 = 0.0;
        for (int d = 0; d < HS; d++) {
            centroid[d] = (float)(mean[d] / (u1 - u0));
            centroid_norm2 += (double)centroid[d] * centroid[d];
        }
        // radius around the fp32 centroid the bound uses
        double radius2 = 0.0;
        for (int u = u0; u < u1; u++) {
            const float* key = k_head + (size_t)head.keys[u] * key_stride;
            double dist2 = 0.0;
            for (int d = 0; d < HS; d++) {
                const double diff = (double)key[d] - centroid[d];
                dist2 += diff * diff;
            }
            radius2 = std::max(radius2, dist2);
        }
        const double radius = std::sqrt(radius2) * (1.0 + 1e-12);
        head.reach[c] = topk_round_up(radius + eps * (std::sqrt(centroid_norm2) + radius));
    }
}

// larger bound first, ties to the smaller block
inline bool topk_bound_before(const std::pair<float, int>& x, const std::pair<float, int>& y) {
    return x.first > y.first || (x.first == y.first && x.second < y.second);
}

// moves the best (by topk_bound_before) mid - first entries of cand[first, last) to cand[first, mid)
inline void topk_front_best(std::pair<float, int>* cand, int first, int mid, int last) {
    if (mid >= last) return;
    if (mid - first <= 4) {  // a few: repeated scans beat a selection
        for (int u = first; u < mid; u++) {
            int best = u;
            for (int v = u + 1; v < last; v++)
                if (topk_bound_before(cand[v], cand[best])) best = v;
            std::swap(cand[u], cand[best]);
        }
    } else {
        std::nth_element(cand + first, cand + mid, cand + last, topk_bound_before);
    }
}

// the number of keys j <= i of a block (a prefix of its ascending list)
inline int topk_causal_count(const TopkBlockHead& head, int c, int i) {
    const int* keys = head.keys.data() + head.block_start[c];
    return (int)(std::upper_bound(keys, head.keys.data() + head.block_start[c + 1], i) - keys);
}

inline void causal_topk_block(int* idx, const float* qkv, int B, int T, int C, int NH, int k, int block_size = 64,
                              TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    topk_check(block_size >= 1, "block_size must be >= 1");
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    std::vector<TopkBlockHead> heads((size_t)B * NH);
    #pragma omp parallel for schedule(dynamic)
    for (int bh = 0; bh < B * NH; bh++)
        topk_block_head_build(heads[bh], qkv + (size_t)(bh / NH) * T * C3 + C + (size_t)(bh % NH) * HS, C3, T, HS,
                              block_size);
    int max_blocks = 0, max_chunks = 0;
    for (const TopkBlockHead& head : heads) {
        max_blocks = std::max(max_blocks, head.num_blocks);
        max_chunks = std::max(max_chunks, head.chunk_start[head.num_blocks]);
    }
    const int QB = kTopkQueryBlock;
    const int num_qblocks = (T + QB - 1) / QB;
    // phase 2 scores a block's chunks in pairs: at most block_pairs chunks, rows ld apart
    const int block_pairs = (topk_num_chunks(std::min(block_size, T)) + 1) / 2 * 2;
    const size_t ld = (size_t)block_pairs * kTopkLanes;
    // blocks in a row's first round: about 2k keys
    const int first_round = std::max(1, (2 * k + block_size - 1) / block_size);
    long long scores_computed = 0, blocks_visited = 0, blocks_total = 0;
    #pragma omp parallel reduction(+ : scores_computed, blocks_visited, blocks_total)
    {
        std::vector<float> bounds((size_t)QB * max_blocks);           // (query block, key blocks)
        std::vector<std::pair<float, int>> cand((size_t)max_blocks);  // (bound, key block) of one row
        std::vector<int> round_chunks((size_t)max_chunks), round_count((size_t)max_blocks);
        std::vector<float> scores((size_t)std::max((size_t)max_chunks * kTopkLanes, 4 * ld));
        std::vector<TopkSelector> selectors((size_t)QB, TopkSelector(k));
        std::vector<int> row_nvis((size_t)QB);
        // phase 2: per key block, the rows that need it (pair_rows[pair_start[c] ..]),
        // and the blocks in visiting order (largest margin bound - k-th best first)
        std::vector<int> pair_start((size_t)max_blocks + 1), pair_rows((size_t)QB * max_blocks);
        std::vector<int> block_order((size_t)max_blocks);
        std::vector<float> margin((size_t)max_blocks);
        std::vector<float> q4((size_t)4 * HS);  // four queries interleaved, q4[4 d + s]
        #pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int qblk = 0; qblk < num_qblocks; qblk++) {
                    const int i0 = (num_qblocks - 1 - qblk) * QB;
                    const int i1 = std::min(i0 + QB, T);
                    const TopkBlockHead& head = heads[(size_t)b * NH + h];
                    const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                    const int i_search = std::max(i0, std::min(k, i1));
                    for (int i = i0; i < i_search; i++) topk_write_all_keys(idx + topk_idx_row(b, h, i, T, NH, k), i, k);
                    if (i_search == i1) continue;
                    // q . c for the searching rows and every block holding a key <= i1 - 1
                    // (blocks are ordered by first key: these are a prefix)
                    const int rows = i1 - i_search;
                    const int visible = (int)(std::upper_bound(head.first_key.begin(), head.first_key.end(), i1 - 1) -
                                              head.first_key.begin());
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, visible, HS, 1.0f,
                                q_head + (size_t)i_search * C3, (int)C3, head.centroids.data(), HS, 0.0f,
                                bounds.data(), visible);
                    std::fill(pair_start.begin(), pair_start.begin() + visible + 1, 0);
                    std::fill(margin.begin(), margin.begin() + visible, -INFINITY);

                    // phase 1, per row: the bounds, then the first rounds
                    for (int r = 0; r < rows; r++) {
                        const int i = i_search + r;
                        const float* q = q_head + (size_t)i * C3;
                        float* bound = bounds.data() + (size_t)r * visible;  // -inf once visited
                        double q_norm2 = 0.0;
                        for (int d = 0; d < HS; d++) q_norm2 += (double)q[d] * q[d];
                        const float q_norm = topk_round_up(std::sqrt(q_norm2) * (1.0 + 1e-12));
                        // blocks holding a key j <= i
                        const int nvis =
                            (int)(std::upper_bound(head.first_key.begin(), head.first_key.begin() + visible, i) -
                                  head.first_key.begin());
                        row_nvis[r] = nvis;
                        blocks_total += nvis;
                        for (int c = 0; c < nvis; c++) {
                            bound[c] += q_norm * head.reach[c];
                            cand[c] = {bound[c], c};
                        }
                        TopkSelector& selector = selectors[r];
                        selector.clear();
                        int first = 0, last = nvis;  // candidates not yet visited: cand[first, last)
                        for (int round = 0, g = first_round; round < kTopkPhase1Rounds && first < last;
                             round++, g *= 2) {
                            if (selector.full()) {  // drop the bounds below the k-th best
                                const float kth = selector.lowest().score;
                                int kept = first;
                                for (int u = first; u < last; u++)
                                    if (cand[u].first >= kth) cand[kept++] = cand[u];
                                last = kept;
                                if (first == last) break;
                            }
                            const int round_end = std::min(first + g, last);
                            topk_front_best(cand.data(), first, round_end, last);
                            // the round's blocks: their keys j <= i in one pass over their chunks
                            int n_chunks = 0;
                            for (int u = first; u < round_end; u++) {
                                const int c = cand[u].second;
                                round_count[u - first] = topk_causal_count(head, c, i);
                                for (int ch = 0; ch < topk_num_chunks(round_count[u - first]); ch++)
                                    round_chunks[n_chunks++] = head.chunk_start[c] + ch;
                            }
                            topk_score_chunk_list(scores.data(), q, head.panel.data(), round_chunks.data(), n_chunks,
                                                  HS);
                            const float* s = scores.data();
                            for (int u = first; u < round_end; u++) {
                                const int c = cand[u].second, n = round_count[u - first];
                                selector.offer_list(s, head.keys.data() + head.block_start[c], n);
                                s += (size_t)topk_num_chunks(n) * kTopkLanes;
                                scores_computed += n;
                                bound[c] = -INFINITY;
                            }
                            blocks_visited += round_end - first;
                            first = round_end;
                        }
                        // left for phase 2: the unvisited blocks with bound >= the k-th best so far
                        const float kth = selector.full() ? selector.lowest().score : -INFINITY;
                        for (int c = 0; c < nvis; c++) {
                            if (bound[c] != -INFINITY && bound[c] >= kth) {
                                pair_start[c + 1]++;
                                margin[c] = std::max(margin[c], bound[c] - kth);
                            }
                        }
                    }

                    // phase 2, per key block: the rows that still need it, four at a time
                    for (int c = 0; c < visible; c++) pair_start[c + 1] += pair_start[c];
                    for (int r = 0; r < rows; r++) {
                        const float* bound = bounds.data() + (size_t)r * visible;
                        const float kth = selectors[r].full() ? selectors[r].lowest().score : -INFINITY;
                        for (int c = 0; c < row_nvis[r]; c++)
                            if (bound[c] != -INFINITY && bound[c] >= kth) pair_rows[pair_start[c]++] = r;
                    }
                    for (int c = visible; c > 0; c--) pair_start[c] = pair_start[c - 1];  // back to the starts
                    pair_start[0] = 0;
                    int n_needed = 0;
                    for (int c = 0; c < visible; c++)
                        if (pair_start[c + 1] > pair_start[c]) block_order[n_needed++] = c;
                    std::sort(block_order.begin(), block_order.begin() + n_needed, [&](int x, int y) {
                        return margin[x] > margin[y] || (margin[x] == margin[y] && x < y);
                    });
                    for (int u = 0; u < n_needed; u++) {
                        const int c = block_order[u];
                        const int* keys = head.keys.data() + head.block_start[c];
                        const float* panel = head.panel.data() + (size_t)head.chunk_start[c] * HS * kTopkLanes;
                        int group[4], ng = 0;
                        for (int p = pair_start[c]; p <= pair_start[c + 1]; p++) {
                            if (p < pair_start[c + 1]) {
                                const int r = pair_rows[p];
                                // still needed? the row's k-th best may have risen since
                                const float bound = bounds[(size_t)r * visible + c];
                                if (selectors[r].full() && bound < selectors[r].lowest().score) continue;
                                group[ng++] = r;
                                if (ng < 4) continue;
                            }
                            if (ng == 0) continue;
                            // rows ascend, so the last one sees the most keys; a short group
                            // repeats its last row
                            const int n_max = topk_causal_count(head, c, i_search + group[ng - 1]);
                            const int nch = (topk_num_chunks(n_max) + 1) / 2 * 2;
                            for (int s = 0; s < 4; s++) {
                                const float* q = q_head + (size_t)(i_search + group[std::min(s, ng - 1)]) * C3;
                                for (int d = 0; d < HS; d++) q4[4 * d + s] = q[d];
                            }
                            topk_score_chunks_4q(scores.data(), ld, q4.data(), panel, nch, HS);
                            for (int s = 0; s < ng; s++) {
                                const int n = topk_causal_count(head, c, i_search + group[s]);
                                selectors[group[s]].offer_list(scores.data() + s * ld, keys, n);
                                scores_computed += n;
                            }
                            blocks_visited += ng;
                            ng = 0;
                        }
                    }
                    for (int r = 0; r < rows; r++)
                        selectors[r].write_sorted(idx + topk_idx_row(b, h, i_search + r, T, NH, k));
                }
            }
        }
    }
    if (stats) {
        stats->scores_computed += scores_computed;
        stats->blocks_visited += blocks_visited;
        stats->blocks_total += blocks_total;
    }
}

// ----------------------------------------------------------------------------
// lsh

// hyperplanes of every table for head h, standard Gaussian entries, stored transposed:
// planes[d * M + t * num_bits + m] for coordinate d in 0..HS, M = num_tables * num_bits
inline void lsh_hyperplanes(float* planes, const LshParams& p, int NH, int h, int HS) {
    const int M = p.num_tables * p.num_bits;
    const double two_pi = 6.283185307179586;
    for (int t = 0; t < p.num_tables; t++) {
        const DrawSite site = lsh_table_draw_site(p.seed, p.step, p.layer, NH, h, t);
        for (int m = 0; m < p.num_bits; m++) {
            for (int d = 0; d <= HS; d++) {
                const Philox4 w = philox_draw(site, DRAW_HASH, (uint32_t)(m * (HS + 1) + d));
                const double u0 = uniform_open01_f64(w.x[0], w.x[1]);
                const double u1 = uniform_open01_f64(w.x[2], w.x[3]);
                planes[(size_t)d * M + t * p.num_bits + m] =
                    (float)(std::sqrt(-2.0 * std::log(u0)) * std::cos(two_pi * u1));
            }
        }
    }
}

// the SimHash codes of x = (v, pad) in every table: code[t] bit m = [a_tm . x >= 0].
// proj is scratch of M floats.
inline void lsh_codes(uint32_t* code, float* proj, const float* planes, const LshParams& p, const float* v, float pad,
                      int HS) {
    const int M = p.num_tables * p.num_bits;
    for (int u = 0; u < M; u++) proj[u] = planes[(size_t)HS * M + u] * pad;
    for (int d = 0; d < HS; d++) {
        const float vd = v[d];
        const float* a = planes + (size_t)d * M;
        for (int u = 0; u < M; u++) proj[u] += vd * a[u];
    }
    for (int t = 0; t < p.num_tables; t++) {
        uint32_t c = 0;
        for (int m = 0; m < p.num_bits; m++) c |= (uint32_t)(proj[t * p.num_bits + m] >= 0.0f) << m;
        code[t] = c;
    }
}

inline void causal_topk_lsh(int* idx, const float* qkv, int B, int T, int C, int NH, int k, const LshParams& p,
                            TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    topk_check(p.num_bits >= 0 && p.num_bits <= 16, "LshParams.num_bits must be in 0..16");
    topk_check(p.num_tables >= 1, "LshParams.num_tables must be >= 1");
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int L = p.num_tables;
    const int num_buckets = 1 << p.num_bits;
    // the hyperplanes depend on the head, not on the batch row: draw them once per head
    const size_t planes_size = (size_t)(HS + 1) * L * p.num_bits;
    std::vector<float> head_planes((size_t)NH * planes_size);
    #pragma omp parallel for schedule(static)
    for (int h = 0; h < NH; h++) lsh_hyperplanes(head_planes.data() + (size_t)h * planes_size, p, NH, h, HS);
    long long scores_computed = 0;
    #pragma omp parallel reduction(+ : scores_computed)
    {
        std::vector<float> proj((size_t)L * p.num_bits + 1);
        std::vector<uint32_t> key_code((size_t)L * T);  // (T, L)
        std::vector<uint32_t> query_code((size_t)L);
        std::vector<int> bucket_start((size_t)L * (num_buckets + 1));  // per table: bucket b holds
        std::vector<int> bucket_keys((size_t)L * T);                    // keys [start[b], start[b+1]), ascending
        std::vector<float> panel((size_t)topk_num_chunks(T) * HS * kTopkLanes);
        std::vector<int> seen((size_t)T);                         // seen[j] == i: j is a candidate of row i
        std::vector<int> chunk_seen((size_t)topk_num_chunks(T));  // the same for the chunks holding them
        std::vector<int> chunk_list((size_t)topk_num_chunks(T));
        std::vector<float> chunk_scores((size_t)topk_num_chunks(T) * kTopkLanes);
        std::vector<int> row((size_t)k);
        TopkSelector selector(k);
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                const float* k_head = q_head + C;
                topk_pack_head_keys(panel.data(), k_head, C3, T, HS);
                // R = max ||k_j|| over the head; padded keys (k_j, sqrt(R^2 - ||k_j||^2)) all have norm R
                std::vector<double> key_norm2((size_t)T);
                double R2 = 0.0;
                for (int j = 0; j < T; j++) {
                    double n2 = 0.0;
                    for (int d = 0; d < HS; d++) n2 += (double)k_head[j * C3 + d] * k_head[j * C3 + d];
                    key_norm2[j] = n2;
                    R2 = std::max(R2, n2);
                }
                // hash the keys, then bucket them per table (a counting sort keeps j ascending)
                const float* planes = head_planes.data() + (size_t)h * planes_size;
                for (int j = 0; j < T; j++) {
                    const float pad = (float)std::sqrt(std::max(R2 - key_norm2[j], 0.0));
                    lsh_codes(key_code.data() + (size_t)j * L, proj.data(), planes, p, k_head + j * C3, pad, HS);
                }
                for (int t = 0; t < L; t++) {
                    int* start = bucket_start.data() + (size_t)t * (num_buckets + 1);
                    int* keys_t = bucket_keys.data() + (size_t)t * T;
                    std::fill(start, start + num_buckets + 1, 0);
                    for (int j = 0; j < T; j++) start[key_code[(size_t)j * L + t] + 1]++;
                    for (int u = 0; u < num_buckets; u++) start[u + 1] += start[u];
                    for (int j = 0; j < T; j++) keys_t[start[key_code[(size_t)j * L + t]]++] = j;
                    // the fill advanced start[u] to the end of bucket u: shift back
                    for (int u = num_buckets; u > 0; u--) start[u] = start[u - 1];
                    start[0] = 0;
                }
                std::fill(seen.begin(), seen.end(), -1);
                std::fill(chunk_seen.begin(), chunk_seen.end(), -1);
                for (int i = 0; i < T; i++) {
                    int* out = idx + topk_idx_row(b, h, i, T, NH, k);
                    if (i + 1 <= k) {
                        topk_write_all_keys(out, i, k);
                        continue;
                    }
                    const float* q = q_head + (size_t)i * C3;
                    // candidates: causal keys in the query's bucket of any table (seen[j] == i marks them)
                    int n_cand = 0, n_chunks = 0;
                    lsh_codes(query_code.data(), proj.data(), planes, p, q, 0.0f, HS);
                    for (int t = 0; t < L; t++) {
                        const uint32_t code = query_code[t];
                        const int* start = bucket_start.data() + (size_t)t * (num_buckets + 1);
                        const int* first = bucket_keys.data() + (size_t)t * T + start[code];
                        const int* last = bucket_keys.data() + (size_t)t * T + start[code + 1];
                        last = std::upper_bound(first, last, i);
                        for (const int* j = first; j < last; j++) {
                            if (seen[*j] == i) continue;
                            seen[*j] = i;
                            n_cand++;
                            const int c = *j / kTopkLanes;
                            if (chunk_seen[c] != i) {
                                chunk_seen[c] = i;
                                chunk_list[n_chunks++] = c;
                            }
                        }
                    }
                    // rank the candidates by exact score: score the panel chunks holding
                    // them (eight keys per vector) and offer the candidate lanes
                    topk_score_chunk_list(chunk_scores.data(), q, panel.data(), chunk_list.data(), n_chunks, HS);
                    scores_computed += n_cand;
                    selector.clear();
                    for (int u = 0; u < n_chunks; u++) {
                        for (int l = 0; l < kTopkLanes; l++) {
                            const int j = chunk_list[u] * kTopkLanes + l;
                            const float score = chunk_scores[(size_t)u * kTopkLanes + l];
                            if (selector.may_enter(score) && j <= i && seen[j] == i) selector.offer(score, j);
                        }
                    }
                    int n = selector.write_sorted(row.data());
                    // too few candidates: fill with the most recent keys not already candidates
                    for (int j = i; n < k && j >= 0; j--)
                        if (seen[j] != i) row[n++] = j;
                    std::sort(row.begin(), row.begin() + n);
                    std::copy(row.begin(), row.begin() + n, out);
                }
            }
        }
    }
    if (stats) stats->scores_computed += scores_computed;
}

// ----------------------------------------------------------------------------
// dispatch (the block index with its default block size)

inline void causal_topk(int* idx, const float* qkv, int B, int T, int C, int NH, int k, TopkIndex index,
                        const LshParams& p, TopkStats* stats = nullptr) {
    switch (index) {
        case TopkIndex::Brute: causal_topk_brute(idx, qkv, B, T, C, NH, k, stats); break;
        case TopkIndex::Block: causal_topk_block(idx, qkv, B, T, C, NH, k, 64, stats); break;
        case TopkIndex::Lsh: causal_topk_lsh(idx, qkv, B, T, C, NH, k, p, stats); break;
    }
}

}  // namespace knngpt::cpu
