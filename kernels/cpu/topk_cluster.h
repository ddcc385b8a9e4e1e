// kernels/cpu/topk_cluster.h — the approximate causal top-k of clustered causal blocks
// probed in centroid order under a budget of scored keys (ALGORITHMS.md §6.1; tie
// rule of §2.1).
//
//   own     the keys of the query's own base block, j in [m * base, i] with m = i / base,
//           are always scored exactly (they are not in any complete block yet)
//   prefix  keys [0, m * base) are covered by the dyadic blocks of m: for each set bit l of
//           m, from the highest, the aligned block of 2^l base keys that follows the ones
//           before it (so at most log2(m) + 1 blocks, all complete: nothing after i)
//   blocks  each dyadic block's keys are partitioned by topk_block_partition (2-means
//           bisection, clusters of at most cluster_size similar keys) into clusters with a
//           centroid c and a reach R' (topk_block.h: q . k_j <= fl(q . c) + ||q|| R')
//   probe   the query scores every centroid of its blocks (one sgemm per query block and
//           dyadic block), then scores whole clusters in decreasing order of q . c (ties to
//           the earlier cluster), while fewer than `budget` prefix keys have been scored;
//           clusters whose bound fl(q . c) + qn R' is below the current k-th best are dropped
//           (they cannot hold a key that enters), and when every remaining cluster is
//           dropped the row is exact
//   S_i     the k best of the scored keys by (attention_dot desc, j asc); every causal key
//           of a row with i + 1 <= k, as the other indexes.
//
// The selection for query i depends only on q_i and keys 0..i (each dyadic block is
// complete before i, and its clusters are a function of its own keys), so the index is
// causal as the model needs; it does not depend on T or on the batch. With budget >= T
// every cluster is probed and the lists equal brute force bit for bit (the same
// attention_dot through the same 8-lane panels, the same ranking). The cost per query is
// the own block (<= base keys), the centroids of its prefix (about i / cluster_size, in
// one sgemm per query block) and about `budget` scored keys; the build clusters each key
// in O(log(T / base)) dyadic blocks. Deterministic: fixed orders everywhere, one thread
// per (b, h, query block), results and statistics independent of the thread count.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cpu/topk_block.h"
#include "kernels/cpu/topk_brute.h"
#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_probe.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

struct TopkClusterParams {
    int base = 256;         // own-block size in keys; a multiple of kTopkQueryBlock
    int cluster_size = 32;  // at most this many keys per cluster
    int budget = -1;        // prefix keys scored per query; < 0: max(budget_min, budget_per_k * k)
    int budget_min = 256;
    int budget_per_k = 8;
    bool tight_split = false;  // topk_block_partition's: split small sets of two groups further
    int iters = kTopkBisectIters;  // Lloyd rounds per bisection
};

inline int topk_cluster_budget(const TopkClusterParams& p, int k) {
    return p.budget >= 0 ? p.budget : std::max(p.budget_min, p.budget_per_k * k);
}

// the dyadic blocks of one (b, h): level l, index t (even) covers keys
// [t 2^l base, (t + 1) 2^l base); only those some query uses are built
struct TopkClusterHead {
    std::vector<TopkBlockHead> blocks;  // keys hold absolute positions
    std::vector<int> level_first;       // blocks of level l: level_first[l] + t / 2
};

// appends to `out` the dyadic blocks (level, start in keys) of prefix [0, m * base)
inline int topk_cluster_prefix_blocks(std::pair<int, int>* out, int m, int base) {
    int n = 0, start = 0;
    for (int l = 30; l >= 0; l--)
        if ((m >> l) & 1) {
            out[n++] = {l, start};
            start += base << l;
        }
    return n;
}

inline const TopkBlockHead& topk_cluster_block(const TopkClusterHead& head, int level, int start, int base) {
    return head.blocks[(size_t)head.level_first[level] + (start / (base << level)) / 2];
}

inline void causal_topk_cluster(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                                const TopkClusterParams& p = TopkClusterParams(), TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    topk_check(p.base >= kTopkQueryBlock && p.base % kTopkQueryBlock == 0,
               "TopkClusterParams.base must be a positive multiple of 64");
    topk_check(p.cluster_size >= 1, "TopkClusterParams.cluster_size must be >= 1");
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int budget = topk_cluster_budget(p, k);
    const int chunks = topk_num_chunks(T);
    const size_t panel_size = (size_t)chunks * HS * kTopkLanes;
    std::vector<float> panels((size_t)B * NH * panel_size);
    topk_pack_keys(panels.data(), qkv, B, T, C, NH);
    std::vector<TopkClusterHead> heads((size_t)B * NH);
    // the build's work items: (b, h, level, block), the largest first
    struct Item {
        int bh, l, t;
    };
    const int m_max = (T - 1) / p.base;
    std::vector<Item> items;
    for (int l = 30; l >= 0; l--)
        if ((1 << l) <= m_max)
            for (int bh = 0; bh < B * NH; bh++)
                for (int t = 0; (t + 1) << l <= m_max; t += 2) items.push_back({bh, l, t});
    for (TopkClusterHead& head : heads) {
        head.level_first.clear();
        int n = 0;
        for (int l = 0; (1 << l) <= m_max; l++) {
            head.level_first.push_back(n);
            for (int t = 0; (t + 1) << l <= m_max; t += 2) n++;
        }
        head.blocks.resize(n);
    }
    #pragma omp parallel for schedule(dynamic)
    for (size_t u = 0; u < items.size(); u++) {
        const auto [bh, l, t] = items[u];
        TopkBlockHead& blk = heads[bh].blocks[(size_t)heads[bh].level_first[l] + t / 2];
        const int start = (t << l) * p.base, n = p.base << l;
        const float* k_head = qkv + (size_t)(bh / NH) * T * C3 + C + (size_t)(bh % NH) * HS;
        topk_block_head_build(blk, k_head + (size_t)start * C3, C3, n, HS, p.cluster_size, p.tight_split, p.iters);
        for (int& j : blk.keys) j += start;
        for (int& j : blk.first_key) j += start;
    }
    int max_clusters = 0, max_cluster_chunks = 1;
    for (const TopkClusterHead& head : heads) {
        for (const TopkBlockHead& blk : head.blocks)
            for (int c = 0; c < blk.num_blocks; c++)
                max_cluster_chunks = std::max(max_cluster_chunks, blk.chunk_start[c + 1] - blk.chunk_start[c]);
        // the most clusters a query sees: sum over its dyadic blocks
        for (int m = 1; m <= m_max; m++) {
            std::pair<int, int> pb[32];
            const int nb = topk_cluster_prefix_blocks(pb, m, p.base);
            int total = 0;
            for (int u = 0; u < nb; u++) total += topk_cluster_block(head, pb[u].first, pb[u].second, p.base).num_blocks;
            max_clusters = std::max(max_clusters, total);
        }
    }
    const int QB = kTopkQueryBlock;
    const int num_qblocks = topk_num_query_blocks(T);
    long long scores_computed = 0, blocks_visited = 0, blocks_total = 0;
    #pragma omp parallel reduction(+ : scores_computed, blocks_visited, blocks_total)
    {
        std::vector<float> cscore((size_t)QB * std::max(max_clusters, 1));  // (rows, clusters): q . c
        std::vector<float> reach((size_t)std::max(max_clusters, 1));
        std::vector<std::pair<const TopkBlockHead*, int>> cluster_of((size_t)std::max(max_clusters, 1));
        float top_score[kTopkClusterRound];
        int top_cluster[kTopkClusterRound];
        std::vector<const float*> chunk_ptr((size_t)kTopkClusterRound * max_cluster_chunks);
        std::vector<float> scores((size_t)std::max(p.base, kTopkClusterRound * max_cluster_chunks * kTopkLanes) + kTopkLanes);
        TopkScoredKeys cand(k, T);  // the row's scored keys that may still enter
        #pragma omp for collapse(3) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                for (int qblk = 0; qblk < num_qblocks; qblk++) {
                    const auto [i0, i1, i_search] = topk_query_rows(idx, b, h, qblk, T, NH, k);
                    if (i_search == i1) continue;
                    const TopkClusterHead& head = heads[(size_t)b * NH + h];
                    const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                    const float* panel = panels.data() + ((size_t)b * NH + h) * panel_size;
                    const int rows = i1 - i_search;
                    const int m = i0 / p.base, own0 = m * p.base;  // every row of the block has this m
                    // the centroids of the prefix's dyadic blocks: q . c in one sgemm per block
                    std::pair<int, int> pb[32];
                    const int nb = topk_cluster_prefix_blocks(pb, m, p.base);
                    int nc = 0;
                    for (int u = 0; u < nb; u++) {
                        const TopkBlockHead& blk = topk_cluster_block(head, pb[u].first, pb[u].second, p.base);
                        if (blk.num_blocks == 0) continue;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, blk.num_blocks, HS, 1.0f,
                                    q_head + (size_t)i_search * C3, (int)C3, blk.centroids.data(), HS, 0.0f,
                                    cscore.data() + nc, max_clusters);
                        for (int c = 0; c < blk.num_blocks; c++) {
                            reach[nc + c] = blk.reach[c];
                            cluster_of[nc + c] = {&blk, c};
                        }
                        nc += blk.num_blocks;
                    }
                    for (int r = 0; r < rows; r++) {
                        const int i = i_search + r;
                        const float* q = q_head + (size_t)i * C3;
                        int* out = idx + topk_idx_row(b, h, i, T, NH, k);
                        cand.clear();
                        // the own block's keys own0..i, exactly: last, when the clusters' best keys
                        // are in by then, so that most own keys fail the k-th best test
                        auto score_own = [&]() {
                            topk_score_chunks(scores.data(), q, panel, own0 / kTopkLanes, topk_num_chunks(i + 1), HS);
                            cand.append(scores.data(), nullptr, own0, i + 1 - own0);
                            scores_computed += i + 1 - own0;
                        };
                        if (nc == 0) {
                            score_own();
                            cand.write(out);
                            continue;
                        }
                        double q_norm2 = 0.0;
                        for (int d = 0; d < HS; d++) q_norm2 += (double)q[d] * q[d];
                        const float q_norm = topk_round_up(std::sqrt(q_norm2) * (1.0 + 1e-12));
                        const float* cs = cscore.data() + (size_t)r * max_clusters;
                        blocks_total += nc;
                        // rounds: one pass over the centroids collects the next G clusters in
                        // centroid order (below the previous round's last) whose bound reaches
                        // the k-th best, then they are scored in that order until the budget is spent
                        // (at least k keys in all: a short own block leaves more to the clusters)
                        const int row_budget = std::max(budget, k - (i + 1 - own0));
                        float after_score = INFINITY;
                        int after_cluster = -1, spent = 0;
                        while (spent < row_budget) {
                            const float kth = cand.kth();
                            const int n_top = topk_next_clusters(top_score, top_cluster, kTopkClusterRound, cs, nc, after_score,
                                                                 after_cluster,
                                                                 [&](int c) { return !(cs[c] + q_norm * reach[c] < kth); });
                            if (n_top == 0) break;  // every cluster left is below the k-th best: exact
                            // the round's clusters up to the budget, scored in one pass over their chunks
                            int n_probe = 0, n_chunks = 0;
                            for (; n_probe < n_top && spent < row_budget; n_probe++) {
                                const auto [blk, c] = cluster_of[top_cluster[n_probe]];
                                for (int ch = blk->chunk_start[c]; ch < blk->chunk_start[c + 1]; ch++)
                                    chunk_ptr[n_chunks++] = blk->panel.data() + (size_t)ch * HS * kTopkLanes;
                                spent += blk->block_start[c + 1] - blk->block_start[c];
                            }
                            topk_score_chunk_ptrs(scores.data(), q, chunk_ptr.data(), n_chunks, HS);
                            const float* s = scores.data();
                            for (int u = 0; u < n_probe; u++) {
                                const auto [blk, c] = cluster_of[top_cluster[u]];
                                const int n = blk->block_start[c + 1] - blk->block_start[c];
                                cand.append(s, blk->keys.data() + blk->block_start[c], 0, n);
                                s += (size_t)topk_num_chunks(n) * kTopkLanes;
                            }
                            cand.settle();
                            blocks_visited += n_probe;
                            if (n_probe < n_top) break;  // the budget is spent
                            if (n_top < kTopkClusterRound) break;  // no cluster left
                            after_score = top_score[n_top - 1];
                            after_cluster = top_cluster[n_top - 1];
                        }
                        scores_computed += spent;
                        score_own();
                        cand.write(out);
                    }
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
