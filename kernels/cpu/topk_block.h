// kernels/cpu/topk_block.h — the exact causal top-k with blocks of similar keys pruned by
// a ball bound (ALGORITHMS.md §6; tie rule of §2.1).
//
//   result  the same lists as causal_topk_brute, bit for bit (same score, same ranking)
//   bound   block c with centroid c_c and radius r_c = max_j ||k_j - c_c||:
//           q . k_j <= q . c_c + ||q|| r_c for each of its keys
//   prune   query i never needs a block whose bound is below its final k-th best score
//           (an equal bound is visited: an equal score with a smaller index would win)
//
// Shapes as in topk_brute.h. Per (b, h) the keys are partitioned into blocks of at most
// block_size similar keys, whatever their positions (topk_block_partition); per block:
//   keys      its key positions, ascending; blocks are ordered by their first (smallest)
//             key, so the blocks holding a key j <= i are a prefix
//   centroid  c_c (fp32, the mean computed in double then rounded)
//   reach     R'_c = r_c + eps (||c_c|| + r_c), r_c rounded up, eps = (4 HS + 16) 2^-24
//   panel     its keys in panel chunks of 8 in the block's order (the last chunk zero-padded;
//             one zero chunk after the last block), so its keys j <= i are a run of chunks.
// A query's bound is fl(q . c_c) + qn R'_c with qn >= ||q||, computed in fp32. The margin
// makes it rigorous: the computed score is within ~HS u ||q|| ||k_j|| of q . k_j
// (sequential fma, u = 2^-24), fl(q . c_c) within ~HS u ||q|| ||c_c|| of q . c_c (any
// order), the final multiply-add within ~3u qn (||c_c|| + R'_c); with ||k_j|| <= ||c_c|| + r_c
// the sum is below 4 (HS + 4) u qn (||c_c|| + r_c). So every computed score of the block is
// <= its computed bound, and a block whose bound is below the k-th best so far holds no key
// that can enter.
//
// The partition: a recursive 2-means bisection. One split of a set of n keys:
//   seeds    a = the key farthest from the set's mean, b = the key farthest from a (the
//            first such key in the set's current order on ties);
//   Lloyd    up to kTopkBisectIters rounds: key x goes to side a iff
//            p(x) = x . (c_a - c_b) - (||c_a||^2 - ||c_b||^2) / 2 > 0 (nearer to c_a), then
//            c_a, c_b become the means of their sides; stop when no key moves;
//   balance  when n > block_size each side keeps at least min(n / 2, max(1, block_size / 4))
//            keys: if one is smaller, side a becomes the keys with the largest p (ties to the
//            earlier key in the set's order), so a large set cannot shed single keys.
// A set of more than block_size keys is always split. A set of 2..block_size keys is split
// (balance off) only if both sides have radii <= kTopkTightSplit times its own (radius = max
// distance to the mean): it held two groups whose common block would be visited by the
// queries of both. Otherwise it is a block. About (2 kTopkBisectIters + 3) n HS
// multiply-adds per split: O(T HS log(T / block_size)) per head when splits are balanced,
// at worst O(T^2 HS / block_size), the order of the search's own bounds. fp32 in a fixed
// order: the partition is a deterministic function of the keys; exactness never depends on it.
//
// The search, per (b, h) and query block (rows i0..i1-1):
//   bounds   one sgemm: q_i . c_c for every row and every block holding a key <= i1 - 1;
//   phase 1  per row: first the best bounds, one block at a time (one vectorised pass over
//            the bounds each), until the row holds k keys; one branch-free pass keeps the
//            blocks whose bound reaches that k-th best, and the later passes run over those
//            few. Then kTopkPhase1Rounds - 1 rounds: drop the blocks whose bound is below the
//            k-th best so far, then score the g best remaining (g covers about 4k keys,
//            doubling each round) in one pass over their chunks: most of the row's final
//            top k (its own cluster's blocks come first). On trained keys, where a row
//            needs a few percent of the blocks, the passes over all of them were most of
//            the search;
//   phase 2  per block, largest margin (bound - k-th best) first: the rows whose bound for it
//            is still >= their k-th best, four rows at a time against its chunks, so a block's
//            keys are loaded once for the whole query block.
// A block a row skips had a bound below the row's k-th best at some point, hence below its
// final k-th best: the exact top k whatever the visiting order. O(T^2 HS / block_size) for
// the bounds plus the visited blocks' scores. How much it prunes depends on the data: see
// README.md, `bench_attention`. Rows and blocks go in a fixed order, so results and
// statistics are deterministic.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

constexpr int kTopkBisectIters = 6;
constexpr float kTopkTightSplit = 0.85f;
constexpr int kTopkPhase1Rounds = 3;

inline float topk_round_up(double x) {
    const float f = (float)x;
    return (double)f >= x ? f : std::nextafter(f, INFINITY);
}

// the sum over d < n of term(d) in fp32, in a fixed order: eight partial sums over the
// groups of eight (vectorisable), the tail, then the partial sums. Clustering only.
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

// max ||x_r - mean||^2 over n rows (fp32, fixed order); mean is scratch of HS floats
inline float topk_radius2(const float* rows, int n, int HS, float* mean) {
    topk_mean(mean, rows, n, HS);
    float r2 = 0.0f;
    for (int r = 0; r < n; r++) r2 = std::max(r2, topk_dist2_fast(rows + (size_t)r * HS, mean, HS));
    return r2;
}

// Splits rows [lo, hi) of x (rows of HS floats, key positions alongside in pos) in two
// by 2-means (see above) and reorders them: one side at [lo, mid), the other at
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

// The blocks of one head: block c holds the key positions keys[block_start[c] ..
// block_start[c+1]), ascending, every block at most block_size keys, blocks ordered
// by their first key. keys is a permutation of 0..T-1. Key j is k_head[j * key_stride ..].
// The approximate cluster index (topk_cluster.h) passes tight_split = false (a set of at most
// block_size keys is a block) and fewer Lloyd rounds (iters).
inline void topk_block_partition(std::vector<int>& block_start, std::vector<int>& keys, const float* k_head,
                                 size_t key_stride, int T, int HS, int block_size, bool tight_split = true,
                                 int iters = kTopkBisectIters) {
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
            const float r2 = tight_split && hi - lo >= 2 ? radius2(lo, hi) : 0.0f;
            if (!(r2 > 0.0f)) {
                leaves.push_back({lo, hi});
                continue;
            }
            mid = topk_bisect(x.data(), pos.data(), lo, hi, HS, 1, scratch.data(), p, side, order, iters);
            if (std::max(radius2(lo, mid), radius2(mid, hi)) > kTopkTightSplit * kTopkTightSplit * r2) {
                leaves.push_back({lo, hi});
                continue;
            }
        } else {
            const int min_side = std::max(1, std::min((hi - lo) / 2, block_size / 4));
            mid = topk_bisect(x.data(), pos.data(), lo, hi, HS, min_side, scratch.data(), p, side, order, iters);
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
                                  int block_size, bool tight_split = true, int iters = kTopkBisectIters) {
    topk_block_partition(head.block_start, head.keys, k_head, key_stride, T, HS, block_size, tight_split, iters);
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
        topk_pack_chunks(head.panel.data() + (size_t)head.chunk_start[c] * HS * kTopkLanes, u1 - u0, HS,
                         [&](int u) { return k_head + (size_t)head.keys[u0 + u] * key_stride; });
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
    const int num_qblocks = topk_num_query_blocks(T);
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
        // each row's blocks left after phase 1 (row r's at row_left[r * max_blocks ..])
        std::vector<int> row_left((size_t)QB * max_blocks), row_nleft((size_t)QB);
        std::vector<char> visited((size_t)max_blocks, 0);  // the first round's blocks of one row
        std::vector<float> avail((size_t)max_blocks);      // a row's bounds, its first round's at -inf
        std::vector<int> kept_blocks((size_t)max_blocks);
        std::vector<int> taken_list((size_t)max_blocks);
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
                    const auto [i0, i1, i_search] = topk_query_rows(idx, b, h, qblk, T, NH, k);
                    const TopkBlockHead& head = heads[(size_t)b * NH + h];
                    const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
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
                        blocks_total += nvis;
                        int nan_bounds = 0;
                        #pragma omp simd reduction(+ : nan_bounds)
                        for (int c = 0; c < nvis; c++) {
                            bound[c] += q_norm * head.reach[c];
                            avail[c] = bound[c];
                            nan_bounds += bound[c] != bound[c];
                        }
                        TopkSelector& selector = selectors[r];
                        selector.clear();
                        // the candidates not yet visited: cand[first, last). Only the first round
                        // touches all nvis blocks: it takes the best bound, one pass each, until the
                        // row holds k keys, and one branch-free pass then keeps the blocks that reach
                        // the k-th best it leaves, so the later rounds and phase 2 run over those few
                        int first = 0, last = 0, taken = 0;
                        while (taken < nvis && !selector.full()) {
                            // larger bound first, ties to the smaller block: the largest bound left in
                            // one vectorised pass, then its first block; a scan by that rule where bounds
                            // are NaN or all left are -inf
                            int best = -1;
                            if (nan_bounds == 0) {
                                float top = -INFINITY;
                                #pragma omp simd reduction(max : top)
                                for (int c = 0; c < nvis; c++) top = avail[c] > top ? avail[c] : top;
                                if (top > -INFINITY)
                                    for (best = 0; avail[best] != top; best++) {}
                            }
                            if (best < 0)
                                for (int c = 0; c < nvis; c++)
                                    if (!visited[c] && (best < 0 || bound[c] > bound[best])) best = c;
                            const int n = topk_causal_count(head, best, i);
                            topk_score_chunks(scores.data(), q, head.panel.data(), head.chunk_start[best],
                                              head.chunk_start[best] + topk_num_chunks(n), HS);
                            selector.offer_list(scores.data(), head.keys.data() + head.block_start[best], n);
                            scores_computed += n;
                            visited[best] = 1;
                            avail[best] = -INFINITY;
                            taken_list[taken++] = best;
                        }
                        blocks_visited += taken;
                        {
                            const float kth = selector.full() ? selector.lowest().score : -INFINITY;
                            int n_kept = 0;
                            for (int c = 0; c < nvis; c++) {
                                kept_blocks[n_kept] = c;
                                n_kept += !visited[c] && bound[c] >= kth;
                            }
                            for (int u = 0; u < n_kept; u++) cand[last++] = {bound[kept_blocks[u]], kept_blocks[u]};
                        }
                        for (int u = 0; u < taken; u++) {
                            bound[taken_list[u]] = -INFINITY;
                            visited[taken_list[u]] = 0;
                        }
                        int round = 1, g = 2 * first_round;
                        for (; round < kTopkPhase1Rounds && first < last; round++, g *= 2) {
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
                        // (blocks dropped before had bounds below an earlier, lower k-th best)
                        const float kth = selector.full() ? selector.lowest().score : -INFINITY;
                        int* left = row_left.data() + (size_t)r * max_blocks;
                        int n_left = 0;
                        for (int u = first; u < last; u++) {
                            const int c = cand[u].second;
                            if (bound[c] != -INFINITY && bound[c] >= kth) {
                                left[n_left++] = c;
                                pair_start[c + 1]++;
                                margin[c] = std::max(margin[c], bound[c] - kth);
                            }
                        }
                        row_nleft[r] = n_left;
                    }

                    // phase 2, per key block: the rows that still need it, four at a time
                    for (int c = 0; c < visible; c++) pair_start[c + 1] += pair_start[c];
                    for (int r = 0; r < rows; r++) {
                        const int* left = row_left.data() + (size_t)r * max_blocks;
                        for (int u = 0; u < row_nleft[r]; u++) pair_rows[pair_start[left[u]]++] = r;
                    }
                    topk_rewind_bucket_starts(pair_start.data(), visible);
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
                            const float* q[4];
                            for (int s = 0; s < 4; s++) q[s] = q_head + (size_t)(i_search + group[std::min(s, ng - 1)]) * C3;
                            topk_interleave_queries(q4.data(), q, HS);
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

}  // namespace knngpt::cpu
