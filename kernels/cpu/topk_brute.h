// kernels/cpu/topk_brute.h — the exact causal top-k by brute force (ALGORITHMS.md §6;
// tie rule of §2.1).
//
//   S_i = the k keys j in {0, .., i} ranked highest by (attention_dot(q_i, k_j) desc, j asc)
//
// Shapes: qkv (B, T, 3C) as in attention.h (q = channels [0, C), k = [C, 2C), head h at
// h*HS.., HS = C / NH); idx (B, NH, T, k) as in topk_select.h. Per (b, h) and block of
// kTopkQueryBlock queries, the block's scores against keys 0..(its last query) go into a
// per-thread (block, T) scratch (never a T x T buffer), four queries at a time over the
// key panel (topk_panel.h); then a selector per row. O(T^2 HS) per head.
//
// This is the definition the other indexes are held to: block equals it bit for bit, and
// the CUDA kernel (kernels/cuda/topk_index.cuh) gives the same lists.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/topk_panel.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

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

}  // namespace knngpt::cpu
