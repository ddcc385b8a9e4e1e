// kernels/cpu/topk_index.h — causal top-k key search, the index of kNN attention
// (ALGORITHMS.md §6; tie rule of §2.1; batched layout of §9.2).
//
//   For batch b, head h and query i, with causal keys C_i = {0, .., i}:
//     score(i, j) = attention_dot(q_i, k_j, HS)       (unscaled: 1/sqrt(HS) keeps the order)
//     S_i         = the k keys j in C_i ranked highest by (score desc, j asc)
//   so ties go to the smaller key index. Rows with n_i = i + 1 <= k take all of C_i.
//
// Shapes: qkv (B, T, 3C) as in attention.h (q = channels [0, C), k = [C, 2C), head h
// at h*HS.., HS = C / NH). Output idx (B, NH, T, k): row i holds S_i sorted by
// ascending key index; rows with i + 1 <= k hold 0..i, then -1. Nothing is saved
// for a backward: the index is a discrete choice, the attention kernels differentiate
// through the chosen keys.
//
// The indexes, one header each, all scoring with attention_dot through the 8-lane key
// panels of topk_panel.h and selecting with topk_select.h:
//   brute  topk_brute.h  exact, O(T^2 HS) per head, never a T x T buffer
//   block  topk_block.h  exact, the same lists as brute bit for bit: blocks of similar keys
//                        pruned by a centroid + radius bound
//   lsh    topk_lsh.h    approximate: SimHash buckets on MIPS-padded vectors, candidates
//                        ranked by the exact score; with num_bits = 0 equal to brute
//   cluster topk_cluster.h approximate: causal dyadic blocks of keys clustered by 2-means
//                        bisection; a query scores its own block exactly and the best
//                        clusters by centroid score up to a budget of keys; with a budget
//                        >= T equal to brute
//   int8   topk_int8.h   exact, the same lists as brute bit for bit: brute's search with an
//                        int8 first pass (integer dot products of quantised q and k) and a
//                        quantisation bound instead of sgemm and its rounding bound
//   heavy  topk_heavy.h  approximate: per block of 64 queries, the keys the previous 256
//                        queries selected and the 64 most recent, ranked by the exact score;
//                        with every key recent equal to brute
//   ivf    topk_ivf.h    approximate: about sqrt(i) clusters of the keys, cut at epochs
//                        1024, 2048, .. from the keys before them; a query scores whole
//                        clusters in centroid order up to a budget of keys, then its own
//                        block; with a budget >= T equal to brute
// causal_topk runs the one TopkIndex names (block with blocks of 64 keys, cluster, heavy and
// ivf with their Params defaults) and adds its
// statistics to *stats (TopkStats, topk_select.h). Inputs must be finite (a NaN score has
// no place in the ranking). Every row is computed by one thread in a fixed order, so
// results and statistics do not depend on the thread count.
#pragma once

#include "kernels/common/attention_params.h"
#include "kernels/common/attention_score.h"
#include "kernels/cpu/topk_block.h"
#include "kernels/cpu/topk_brute.h"
#include "kernels/cpu/topk_cluster.h"
#include "kernels/cpu/topk_heavy.h"
#include "kernels/cpu/topk_int8.h"
#include "kernels/cpu/topk_ivf.h"
#include "kernels/cpu/topk_lsh.h"
#include "kernels/cpu/topk_select.h"

namespace knngpt::cpu {

using knngpt::TopkIndex;

// the index that `index` names; block with its default block size, 64
inline void causal_topk(int* idx, const float* qkv, int B, int T, int C, int NH, int k, TopkIndex index,
                        const LshParams& p, TopkStats* stats = nullptr) {
    switch (index) {
        case TopkIndex::Brute: causal_topk_brute(idx, qkv, B, T, C, NH, k, stats); break;
        case TopkIndex::Block: causal_topk_block(idx, qkv, B, T, C, NH, k, 64, stats); break;
        case TopkIndex::Lsh: causal_topk_lsh(idx, qkv, B, T, C, NH, k, p, stats); break;
        case TopkIndex::Cluster: causal_topk_cluster(idx, qkv, B, T, C, NH, k, TopkClusterParams(), stats); break;
        case TopkIndex::Int8: causal_topk_int8(idx, qkv, B, T, C, NH, k, stats); break;
        case TopkIndex::Heavy: causal_topk_heavy(idx, qkv, B, T, C, NH, k, TopkHeavyParams(), stats); break;
        case TopkIndex::Ivf: causal_topk_ivf(idx, qkv, B, T, C, NH, k, TopkIvfParams(), stats); break;
    }
}

}  // namespace knngpt::cpu
