// kernels/cpu/topk_heavy.h — the approximate causal top-k whose candidates are the keys
// the previous queries selected and the most recent keys (ALGORITHMS.md §6.3; tie rule
// of §2.1). Per (b, h), the queries go in blocks of 64 (kTopkQueryBlock), i0 = 0, 64, ..:
//
//   candidates  of block i0..i1-1: the keys in the lists of rows i0 - prev_queries .. i0 - 1
//               (already written), every key of [i0 - R, i1), R = max(recent, k), and in
//               every probe_every-th block the best probe_width k causal keys of its first
//               row by brute force (a way back for older keys when the queries change)
//   S_i         the k best causal candidates (j <= i) by (attention_dot desc, j asc)
//
// Shapes as in topk_brute.h; nothing is saved for a backward. No CUDA twin: a head's
// blocks run in order, each reading the lists before it (one thread per (b, h), so results
// and statistics do not depend on the thread count). The design decision: no build and no
// bound, only the assumption that nearby queries share their top keys, as on a trained
// model's attention (where it holds and where not, and the cost: §6.3). The index is
// causal and independent of T and of the batch; with R >= T it is brute force bit for bit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/topk_brute.h"
#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

struct TopkHeavyParams {
    int prev_queries = 256;  // the lists of this many queries before the block are candidates
    int recent = 64;         // and the keys i0 - recent .. i1 - 1 (at least k of them)
    int probe_every = 4;     // and, every probe_every-th block (0: none), the exact top
    int probe_width = 4;     // probe_width k keys of its first row (whose list is their top k)
};

inline void causal_topk_heavy(int* idx, const float* qkv, int B, int T, int C, int NH, int k,
                              const TopkHeavyParams& p = TopkHeavyParams(), TopkStats* stats = nullptr) {
    topk_check_shapes(B, T, C, NH, k);
    topk_check(p.prev_queries >= 0 && p.recent >= 0 && p.probe_every >= 0 && p.probe_width >= 1,
               "TopkHeavyParams: prev_queries, recent and probe_every must be >= 0, probe_width >= 1");
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const int QB = kTopkQueryBlock, recent = std::max(p.recent, k);
    long long scores_computed = 0;
    #pragma omp parallel reduction(+ : scores_computed)
    {
        std::vector<int> last_block((size_t)T), cand((size_t)T + 16);  // the block that last took key j
        std::vector<float> panel((size_t)(topk_num_chunks(T) + 1) * HS * kTopkLanes), scores(4 * ((size_t)T + 16));
        std::vector<float> q4((size_t)4 * HS);
        std::vector<int32_t> order(3 * ((size_t)T + 16));
        std::vector<float> head_panel((size_t)(topk_num_chunks(T) + 1) * HS * kTopkLanes);  // keys 0..i1-1 so far
        std::vector<int> key_order((size_t)T), probe_keys((size_t)T);  // key_order: 0, 1, .., T - 1
        std::vector<float> probe_scores((size_t)T + 16);
        for (int j = 0; j < T; j++) key_order[j] = j;
        #pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q_head = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                const float* k_head = q_head + C;
                std::fill(last_block.begin(), last_block.end(), -1);
                for (int i0 = 0, blk = 0; i0 < T; i0 += QB, blk++) {
                    const int i1 = std::min(T, i0 + QB), r0 = std::max(0, i0 - recent);
                    topk_pack_chunks(head_panel.data() + (size_t)(i0 / kTopkLanes) * HS * kTopkLanes, i1 - i0, HS,
                                     [&](int u) { return k_head + (size_t)(i0 + u) * C3; });
                    // the probe: row i0's exact top probe_width k over every causal key, and its list
                    // their top k
                    const bool probe = p.probe_every > 0 && blk % p.probe_every == 0 && i0 + 1 > k;
                    int n_probe = 0;
                    if (probe) {
                        topk_score_chunks(scores.data(), q_head + (size_t)i0 * C3, head_panel.data(), 0,
                                          topk_num_chunks(i0 + 1), HS);
                        scores_computed += i0 + 1;
                        n_probe = (int)std::min<long long>(i0 + 1, (long long)p.probe_width * k);
                        if (n_probe < i0 + 1)
                            topk_select_in_key_order(probe_keys.data(), scores.data(), key_order.data(), i0 + 1, n_probe,
                                                     order.data());
                        else
                            std::copy(key_order.begin(), key_order.begin() + n_probe, probe_keys.begin());
                        int* out = idx + topk_idx_row(b, h, i0, T, NH, k);
                        if (n_probe == k) {
                            std::copy(probe_keys.begin(), probe_keys.begin() + k, out);
                        } else {
                            for (int u = 0; u < n_probe; u++) probe_scores[u] = scores[probe_keys[u]];
                            topk_select_in_key_order(out, probe_scores.data(), probe_keys.data(), n_probe, k, order.data());
                        }
                    }
                    // the keys before r0 that the probe and the previous queries selected, ascending,
                    // then r0..i1-1
                    int n = 0;
                    for (int u = 0; u < n_probe; u++) {
                        const int j = probe_keys[u];
                        if (j < r0 && last_block[j] != blk) {
                            last_block[j] = blk;
                            cand[n++] = j;
                        }
                    }
                    for (int i = std::max(0, i0 - p.prev_queries); i < i0; i++) {
                        const int* row = idx + topk_idx_row(b, h, i, T, NH, k);
                        for (int s = 0; s < k; s++) {
                            const int j = row[s];
                            if (j >= 0 && j < r0 && last_block[j] != blk) {
                                last_block[j] = blk;
                                cand[n++] = j;
                            }
                        }
                    }
                    std::sort(cand.begin(), cand.begin() + n);
                    for (int j = r0; j < i1; j++) cand[n++] = j;
                    topk_pack_chunks(panel.data(), n, HS, [&](int u) { return k_head + (size_t)cand[u] * C3; });
                    // the rows that search, four at a time through one pass over the panel (the
                    // fourth row's causal candidates: the earlier rows' scores past theirs unused)
                    int rows[kTopkQueryBlock], n_rows = 0;
                    for (int i = i0; i < i1; i++) {
                        if (i + 1 <= k)
                            topk_write_all_keys(idx + topk_idx_row(b, h, i, T, NH, k), i, k);
                        else if (!(i == i0 && probe))
                            rows[n_rows++] = i;
                    }
                    for (int g = 0; g < n_rows; g += 4) {
                        const float* q[4];
                        int n_causal[4];  // candidates j <= i: a prefix, as they ascend
                        for (int r = 0; r < 4; r++) {
                            const int i = rows[std::min(g + r, n_rows - 1)];
                            q[r] = q_head + (size_t)i * C3;
                            n_causal[r] = (int)(std::upper_bound(cand.begin(), cand.begin() + n, i) - cand.begin());
                        }
                        topk_interleave_queries(q4.data(), q, HS);
                        const size_t ld = (size_t)topk_num_chunks(n) * kTopkLanes;
                        topk_score_chunks_4q(scores.data(), ld, q4.data(), panel.data(), topk_num_chunks(n_causal[3]), HS);
                        for (int r = 0; r < 4 && g + r < n_rows; r++) {
                            // every key of r0..i is a candidate and i + 1 - r0 >= min(i + 1, recent + 1) > k
                            topk_select_in_key_order(idx + topk_idx_row(b, h, rows[g + r], T, NH, k), scores.data() + r * ld,
                                                     cand.data(), n_causal[r], k, order.data());
                            scores_computed += n_causal[r];
                        }
                    }
                }
            }
        }
    }
    if (stats) stats->scores_computed += scores_computed;
}

}  // namespace knngpt::cpu
